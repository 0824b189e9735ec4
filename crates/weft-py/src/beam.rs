//! Beam search (`weft.beam_search`), as the Rust `weft::beam` runs it: Hugging Face's
//! semantics, every beam of a step in one model call.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::engine::Engine;
use crate::errors::IntoPyResult;

/// One finished hypothesis: `tokens` (prompt, output, and the EOS that ended it, if any),
/// `score` (`sum_logprobs / generated_len ** length_penalty`), best first.
#[pyclass(frozen, get_all, module = "weft")]
pub struct BeamHypothesis {
    tokens: Vec<u32>,
    prompt_len: usize,
    score: f32,
    sum_logprobs: f32,
}

#[pymethods]
impl BeamHypothesis {
    /// A hypothesis from its fields (what unpickling calls).
    #[new]
    fn new(tokens: Vec<u32>, prompt_len: usize, score: f32, sum_logprobs: f32) -> PyResult<Self> {
        if prompt_len > tokens.len() {
            return Err(PyValueError::new_err(format!(
                "prompt_len {prompt_len} is past the {} tokens",
                tokens.len()
            )));
        }
        Ok(BeamHypothesis {
            tokens,
            prompt_len,
            score,
            sum_logprobs,
        })
    }

    /// Pickling (results sent to another process): the class and its fields.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (Bound<'py, pyo3::types::PyType>, (Vec<u32>, usize, f32, f32)) {
        let h = slf.get();
        let fields = (h.tokens.clone(), h.prompt_len, h.score, h.sum_logprobs);
        (slf.get_type(), fields)
    }

    /// The tokens after the prompt.
    #[getter]
    fn generated(&self) -> Vec<u32> {
        self.tokens[self.prompt_len..].to_vec()
    }

    fn __repr__(&self) -> String {
        format!(
            "weft.BeamHypothesis(score={:?}, generated={:?})",
            self.score,
            &self.tokens[self.prompt_len..]
        )
    }
}

/// Beam search from `prompt` (a string, tokenized with the model's BOS, or token ids):
/// `num_beams` beams, at most `max_new_tokens` new tokens each, the best
/// `num_return_sequences` hypotheses returned. `early_stopping` is True, False or "never"
/// (Hugging Face's); `eos_token_ids` defaults to the model's end-of-turn set;
/// `allowed_tokens` restricts every step to those ids. A Ctrl-C stops the search at once
/// (`KeyboardInterrupt`).
#[pyfunction]
#[pyo3(signature = (
    engine, prompt, num_beams = 4, *, max_new_tokens = 20, num_return_sequences = 1,
    length_penalty = 1.0, early_stopping = None, eos_token_ids = None, allowed_tokens = None
))]
#[allow(clippy::too_many_arguments)]
pub fn beam_search(
    py: Python<'_>,
    engine: &Engine,
    prompt: &Bound<'_, PyAny>,
    num_beams: usize,
    max_new_tokens: usize,
    num_return_sequences: usize,
    length_penalty: f32,
    early_stopping: Option<&Bound<'_, PyAny>>,
    eos_token_ids: Option<Vec<u32>>,
    allowed_tokens: Option<Vec<u32>>,
) -> PyResult<Vec<BeamHypothesis>> {
    use weft::beam::{BeamSearchConfig, EarlyStopping};
    let ids: Vec<u32> = match prompt.extract::<String>() {
        Ok(text) => engine.inner.tokenizer().encode(&text, true, true),
        // A list of ids or a 1-D array; an HF-style batch `[[ids]]` is named, not NumPy's
        // "only integer scalar arrays" error.
        Err(_) => prompt.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(
                "prompt must be a string or one list of token ids (a 1-D array); beam_search \
                 takes one prompt, not a batch",
            )
        })?,
    };
    let early = match early_stopping {
        None => EarlyStopping::False,
        Some(v) => match (v.extract::<bool>(), v.extract::<String>().as_deref()) {
            (Ok(true), _) => EarlyStopping::True,
            (Ok(false), _) => EarlyStopping::False,
            (_, Ok("never")) => EarlyStopping::Never,
            _ => {
                return Err(PyValueError::new_err(
                    "early_stopping must be True, False or \"never\"",
                ))
            }
        },
    };
    let mut config = BeamSearchConfig::new(num_beams)
        .max_new_tokens(max_new_tokens)
        .num_return_sequences(num_return_sequences)
        .length_penalty(length_penalty)
        .early_stopping(early);
    if let Some(eos) = eos_token_ids {
        config = config.eos_token_ids(eos);
    }
    if let Some(allowed) = allowed_tokens {
        config = config.allowed_tokens(allowed);
    }
    let search = weft::beam::beam_search(&engine.inner, &ids, &config);
    let found = crate::wait_interruptible(py, search)?.py()?;
    Ok(found
        .into_iter()
        .map(|h| BeamHypothesis {
            tokens: h.tokens,
            prompt_len: h.prompt_len,
            score: h.score,
            sum_logprobs: h.sum_logprobs,
        })
        .collect())
}
