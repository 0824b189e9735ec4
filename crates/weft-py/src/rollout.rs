//! `weft.generate_batch`: batched rollouts (seed 003), as `weft::rollout` runs them.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::driver::reason_name;
use crate::engine::Engine;
use crate::errors::{ConfigError, IntoPyResult};
use crate::sampling::Sampler;

/// One generated sequence of a batch.
#[pyclass(frozen, get_all, module = "weft")]
pub struct Rollout {
    /// The prompt's token ids.
    prompt_tokens: Vec<u32>,
    /// The generated ids (a stop token excluded, a stop sequence included).
    tokens: Vec<u32>,
    /// The generated text.
    text: String,
    /// Why it stopped ("max_tokens", "stop_token", …).
    stop_reason: Option<String>,
    /// Prompt + generated ids + the stop token that ended it, if one did.
    sequence: Vec<u32>,
}

#[pymethods]
impl Rollout {
    /// A rollout from its fields (what unpickling calls).
    #[new]
    #[pyo3(signature = (prompt_tokens, tokens, text, stop_reason, sequence))]
    fn new(
        prompt_tokens: Vec<u32>,
        tokens: Vec<u32>,
        text: String,
        stop_reason: Option<String>,
        sequence: Vec<u32>,
    ) -> Rollout {
        Rollout {
            prompt_tokens,
            tokens,
            text,
            stop_reason,
            sequence,
        }
    }

    /// Pickling (results sent to another process): the class and its fields.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (
        Bound<'py, pyo3::types::PyType>,
        (Vec<u32>, Vec<u32>, String, Option<String>, Vec<u32>),
    ) {
        let r = slf.get();
        let fields = (
            r.prompt_tokens.clone(),
            r.tokens.clone(),
            r.text.clone(),
            r.stop_reason.clone(),
            r.sequence.clone(),
        );
        (slf.get_type(), fields)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let text = pyo3::types::PyString::new(py, &self.text).repr()?;
        let reason = match &self.stop_reason {
            Some(r) => pyo3::types::PyString::new(py, r).repr()?.to_string(),
            None => "None".to_string(),
        };
        Ok(format!("weft.Rollout(text={text}, stop_reason={reason})"))
    }
}

impl From<weft::rollout::Rollout> for Rollout {
    fn from(r: weft::rollout::Rollout) -> Rollout {
        Rollout {
            sequence: r.sequence(),
            stop_reason: r.stop.as_ref().map(|s| reason_name(s).to_string()),
            prompt_tokens: r.prompt_tokens,
            tokens: r.tokens,
            text: r.text,
        }
    }
}

/// Python lists as they are; anything with `tolist()` (NumPy arrays) as its lists.
pub(crate) fn listed<'py>(v: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if v.hasattr("tolist")? {
        v.call_method0("tolist")
    } else {
        Ok(v.clone())
    }
}

/// Generates for every prompt at once (one scheduler, shared model calls) and returns the
/// rollouts in order — or, with `padded=True`, `(ids, attention_mask)` as `[batch,
/// total_len]` NumPy arrays in ColossalAI's layout: prompts left-padded to the longest, then
/// the generated ids (EOS kept), right-padded with `pad_token_id`.
///
/// `prompts`: strings (tokenized as `Context.fill` does, with the BOS the model asks for), or
/// lists of token ids (run as given: no BOS added); with `attention_mask`, a padded
/// `[batch, len]` id matrix whose padding (mask 0) is dropped, and whose width `padded=True`
/// keeps (the generated ids start at column `len`). Request `i` is seeded with a hash of
/// `seed` and `i`: the same seed gives the same rollouts, and batches of neighbouring seeds
/// (`seed=step`) share none. `sampler` defaults to the engine's (`Engine(sampler=...)`,
/// greedy unless set). `pad_token_id` defaults to the model's first end-of-generation token
/// (`engine.stop_tokens[0]`: SmolLM2's `<|im_end|>`, Gemma 3's `<eos>`).
///
/// `stop`, `min_tokens`, `ignore_eos`, `logit_bias`, the penalties and `adapters` apply to
/// every rollout as `Context.generate` takes them.
///
/// `max_tokens=None`: no limit but the context (and `max_length`); `seed=None` (the
/// default): a random base seed, as `Context.generate` draws one.
///
/// `every` > 0 with `on_partial` streams (seed 003's `generate_streaming`): after every
/// `every` tokens of the unfinished rollouts, `on_partial` gets the list of every `Rollout` so
/// far (`stop_reason` None). It runs on the batch's thread and cannot call weft; an exception
/// it raises is raised here once the batch has run (later calls are skipped).
///
/// A Ctrl-C stops the batch at once (`KeyboardInterrupt`); its contexts give their pages back.
#[pyfunction]
#[pyo3(signature = (
    engine, prompts, sampler = None, *, max_tokens = 128, max_length = None,
    stop_sequences = None, seed = None, attention_mask = None, padded = false, pad_token_id = None,
    every = 0, on_partial = None, stop = None, min_tokens = 0, ignore_eos = false,
    logit_bias = None, repeat_penalty = None, presence_penalty = None,
    frequency_penalty = None, penalty_last_n = None, adapters = None
))]
#[allow(clippy::too_many_arguments)]
pub fn generate_batch<'py>(
    py: Python<'py>,
    engine: PyRef<'py, Engine>,
    prompts: &Bound<'py, PyAny>,
    sampler: Option<PyRef<'py, Sampler>>,
    max_tokens: Option<usize>,
    max_length: Option<usize>,
    stop_sequences: Option<Vec<Vec<u32>>>,
    seed: Option<u64>,
    attention_mask: Option<&Bound<'py, PyAny>>,
    padded: bool,
    pad_token_id: Option<u32>,
    every: usize,
    on_partial: Option<Py<PyAny>>,
    stop: Option<&Bound<'py, PyAny>>,
    min_tokens: Option<usize>,
    ignore_eos: bool,
    logit_bias: Option<&Bound<'py, PyAny>>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    penalty_last_n: Option<usize>,
    adapters: Option<Vec<(PyRef<'py, crate::adapter::Adapter>, f32)>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (stop_strings, stop_ids) = crate::context::stop_arg(stop)?;
    let penalties = crate::context::penalties_arg(
        repeat_penalty,
        presence_penalty,
        frequency_penalty,
        penalty_last_n,
    )?;
    let logit_bias = logit_bias
        .map(crate::context::bias_arg)
        .transpose()?
        .unwrap_or_default();
    // None, as in `Context.generate`: no limit but the context (and `max_length`), no
    // minimum, and a seed of its own (drawn here) rather than none.
    let max_tokens = max_tokens.unwrap_or(usize::MAX);
    let min_tokens = min_tokens.unwrap_or(0);
    let seed = seed.unwrap_or_else(crate::engine::random_seed);
    // A callback that cannot be called fails now, not once the whole batch has run.
    if let Some(f) = &on_partial {
        if !f.bind(py).is_callable() {
            return Err(PyTypeError::new_err(
                "on_partial must be callable (it is given the partial rollouts)",
            ));
        }
    }
    let adapters: Vec<(weft::Adapter, f32)> = adapters
        .unwrap_or_default()
        .into_iter()
        .map(|(a, s)| (a.inner.clone(), s))
        .collect();
    use weft::rollout::{Prompt, RolloutRequest};
    // None: the engine's own sampler (`Engine(sampler=...)`), as `Context.generate` takes it.
    let sampler = sampler.map_or_else(
        || engine.inner.config().generation.sampler.clone(),
        |s| s.inner.clone(),
    );
    let mut requests: Vec<RolloutRequest> = match attention_mask {
        Some(mask) => {
            let ids: Vec<Vec<u32>> = listed(prompts)?.extract()?;
            let mask: Vec<Vec<u8>> = listed(mask)?.extract()?;
            RolloutRequest::from_padded(&ids, &mask, sampler).py()?
        }
        None => {
            // A lone string would be read as a list of one-character prompts.
            let list: Vec<Bound<'py, PyAny>> = match prompts.is_instance_of::<PyString>() {
                true => Err(PyTypeError::new_err(
                    "prompts must be a list (of strings or of token-id lists), not one string",
                )),
                false => prompts.extract().map_err(|_| {
                    PyTypeError::new_err("prompts must be a list of strings or of token-id lists")
                }),
            }?;
            let mut requests = Vec::with_capacity(list.len());
            for p in list {
                let prompt = match p.extract::<String>() {
                    Ok(text) => Prompt::Text(text),
                    Err(_) => Prompt::Tokens(listed(&p)?.extract()?),
                };
                requests.push(RolloutRequest::new(prompt, sampler.clone()));
            }
            requests
        }
    };
    for (i, r) in requests.iter_mut().enumerate() {
        r.max_tokens = max_tokens;
        r.max_length = max_length;
        r.stop_sequences = stop_sequences.clone().unwrap_or_default();
        r.stop_strings = stop_strings.clone();
        r.stop_ids = stop_ids.clone();
        r.min_tokens = min_tokens;
        r.ignore_eos = ignore_eos;
        r.logit_bias = logit_bias.clone();
        r.penalties = penalties.clone();
        r.adapters = adapters.clone();
        r.seed = row_seed(seed, i);
    }
    let inner = engine.inner.clone();
    let every = if on_partial.is_some() { every } else { 0 };
    if on_partial.is_some() && every == 0 {
        return Err(ConfigError::new_err(
            "on_partial needs every > 0 (how many tokens between two calls)",
        ));
    }
    // The callback's exception, raised once the batch has stopped.
    let failed: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);
    let stream = weft::rollout::generate_batch_streaming(&inner, &requests, every, |partial| {
        let mut failed = failed.lock().unwrap_or_else(|e| e.into_inner());
        let Some(callback) = on_partial.as_ref().filter(|_| failed.is_none()) else {
            return;
        };
        let called = crate::callbacks::call(|py| {
            let list: Vec<Rollout> = partial.iter().cloned().map(Rollout::from).collect();
            match callback.call1(py, (list,)) {
                // A Ctrl-C that landed in the callback is made pending again, so that the
                // wait stops the batch now rather than raising once it has run to its end.
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) => {
                    // SAFETY: `PyErr_SetInterrupt` only sets the interpreter's signal flag.
                    unsafe { pyo3::ffi::PyErr_SetInterrupt() };
                    Ok(())
                }
                other => other.map(drop),
            }
        });
        *failed = called.err();
    });
    let rollouts = crate::wait_interruptible(py, stream)?;
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let rollouts = rollouts.py()?;
    if padded {
        let pad = match pad_token_id {
            Some(p) => p,
            None => *engine.inner.stop_tokens().first().ok_or_else(|| {
                ConfigError::new_err("the model names no EOS token: pass pad_token_id")
            })?,
        };
        // A padded input keeps its width: generated ids start at column `input_ids.shape[1]`.
        let width = requests.iter().filter_map(|r| r.padded_width).max();
        let b = weft::rollout::padded_left_prompts(&rollouts, width, pad);
        let shape = [b.batch, b.total_len];
        let ids = PyArray1::from_vec(py, b.ids).reshape(shape)?;
        let mask = PyArray1::from_vec(py, b.attention_mask).reshape(shape)?;
        return Ok((ids, mask).into_pyobject(py)?.into_any());
    }
    let list = rollouts.into_iter().map(Rollout::from).collect::<Vec<_>>();
    Ok(list.into_pyobject(py)?.into_any())
}

/// The seed of request `i` of a batch seeded with `base`: SplitMix64 of the base, plus `i`.
/// Batches of neighbouring base seeds land far apart, so no two share a row's stream (with
/// `base + i`, seed 101's row 0 was seed 100's row 1).
fn row_seed(base: u64, i: usize) -> u64 {
    weft::sampling::rng::splitmix64(base).wrapping_add(i as u64)
}
