//! `weft.Forward`: the pass builder. Python records the builder calls; `execute()` / `run()`
//! takes the context, replays them on a Rust `Forward` and runs it. Handles read the
//! `ForwardOutput`, whose arrays are NumPy arrays made from the pass's own buffers.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::context::{Lease, Slot};
use crate::errors::{to_py, StalePass};
use crate::probes::{attach, ProbeKind, Value};
use crate::sampling::{Probe, Sampler};

/// Every pass builder (and generation) gets its own id, so a handle cannot read another
/// pass's output.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A new pass (or generation) id.
pub fn new_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The floats of a NumPy array of any shape (row-major), or of a list of lists of them.
pub fn floats(rows: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    if rows.hasattr("ravel")? {
        return rows
            .call_method0("ravel")?
            .call_method0("tolist")?
            .extract();
    }
    Ok(rows.extract::<Vec<Vec<f32>>>()?.concat())
}

/// `n` input vectors, row-major: a NumPy array of shape `(n, width)` (or of shape `(width,)`
/// for one vector), or a list of `n` equally long lists. Any other shape is an
/// `InputEmbeds` error, not silently reflowed rows.
pub fn vectors(rows: &Bound<'_, PyAny>, n: usize) -> PyResult<Vec<f32>> {
    let bad = |reason: String| to_py(weft::Error::InputEmbeds { reason });
    if rows.hasattr("shape")? {
        let shape: Vec<usize> = rows.getattr("shape")?.extract()?;
        let fits = match shape[..] {
            [r, _] => r == n,
            [_] => n == 1,
            _ => false,
        };
        if !fits {
            return Err(bad(format!(
                "rows must have shape ({n}, n_embd), one vector per token; got {shape:?}"
            )));
        }
        return floats(rows);
    }
    let list: Vec<Vec<f32>> = rows.extract()?;
    let width = list.first().map_or(0, Vec::len);
    if list.len() != n || list.iter().any(|r| r.len() != width) {
        return Err(bad(format!(
            "rows must be {n} lists of n_embd numbers, one per token; got {} lists of lengths \
             {:?}",
            list.len(),
            list.iter().map(Vec::len).collect::<Vec<_>>()
        )));
    }
    Ok(list.concat())
}

/// One recorded builder call.
enum Op {
    Input(Vec<u32>),
    InputAt(Vec<u32>, Vec<u32>),
    AttentionMask(Vec<Vec<bool>>),
    Mask(Vec<u32>),
    LogitBias(Vec<(u32, f32)>),
    Horizon(usize),
    /// Indices, sampler, and a list of allowed ids per index.
    Sample(Vec<usize>, weft::Sampler, Option<Vec<Vec<u32>>>),
    Probe(usize, ProbeKind),
    Adapter(weft::Adapter, f32),
    ZoSeed(u64, f32),
    InputEmbeds(Vec<u32>, Vec<f32>, Vec<u32>),
    AttentionBias(Vec<Vec<f32>>),
}

/// Reads the tokens a sampler chose (`out[h]`: one id per index, `out.token(h)`: the first).
#[pyclass(frozen, module = "weft")]
pub struct SampleHandle {
    pass: u64,
    index: usize,
}

/// Reads a probe's value (`out[h]`).
#[pyclass(frozen, module = "weft")]
pub struct ProbeHandle {
    pass: u64,
    index: usize,
}

impl ProbeHandle {
    /// The handle of probe `index` of pass (or generation) `pass`.
    pub fn new(pass: u64, index: usize) -> ProbeHandle {
        ProbeHandle { pass, index }
    }
}

#[pymethods]
impl ProbeHandle {
    /// `weft.ProbeHandle[float]` in annotations, as the stubs write it.
    #[classmethod]
    fn __class_getitem__<'py>(
        cls: &Bound<'py, pyo3::types::PyType>,
        item: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let alias = cls.py().import("types")?.getattr("GenericAlias")?;
        alias.call1((cls, item))
    }
}

/// One pass over a context: inputs at positions, masks, samplers and probes at any index.
/// Nothing runs until `execute()` (awaitable) or `run()` (blocking). The methods that record a
/// setting return the pass, so calls chain: `ctx.forward().input(ids).probe(0, Entropy())`.
#[pyclass(module = "weft")]
pub struct Forward {
    slot: Slot,
    /// The context's run and pending token counts when the builder was made: its indices
    /// count from them, so a context changed since (filled, generated on) refuses the pass.
    base: (usize, usize),
    id: u64,
    ops: Vec<Op>,
    len: usize,
    samples: usize,
    probes: usize,
    spent: bool,
}

impl Forward {
    pub fn new(slot: Slot, ran: usize, pending: usize) -> Forward {
        Forward {
            slot,
            base: (ran, pending),
            id: new_id(),
            ops: Vec::new(),
            len: pending,
            samples: 0,
            probes: 0,
            spent: false,
        }
    }

    fn push(&mut self, op: Op) -> PyResult<()> {
        if self.spent {
            return Err(PyRuntimeError::new_err("this pass has already run"));
        }
        self.ops.push(op);
        Ok(())
    }

    /// Takes the context and the recorded calls: the pass, ready to run without the GIL.
    fn prepare(&mut self) -> PyResult<Prepared> {
        if self.spent {
            return Err(PyRuntimeError::new_err("this pass has already run"));
        }
        let mut lease = Lease::take(&self.slot)?;
        let now = (lease.ctx().len(), lease.ctx().pending().len());
        if now != self.base {
            // What Rust's borrow of the context rules out: the pass's indices would point
            // at other tokens than the ones they were written for.
            return Err(StalePass::new_err(format!(
                "the context changed after forward() made this pass ({} run + {} pending \
                 tokens then, {} + {} now): make the pass again",
                self.base.0, self.base.1, now.0, now.1
            )));
        }
        self.spent = true;
        Ok(Prepared {
            lease,
            ops: std::mem::take(&mut self.ops),
            id: self.id,
        })
    }
}

/// What a pass returns before it becomes a Python object.
struct Outputs {
    id: u64,
    tokens: Vec<Vec<u32>>,
    probes: Vec<Value>,
}

struct Prepared {
    lease: Lease,
    ops: Vec<Op>,
    id: u64,
}

impl Prepared {
    async fn run(mut self) -> weft::Result<Outputs> {
        let ctx = self.lease.ctx();
        let vocab = ctx.engine().info().vocab_size;
        let engine = ctx.engine().clone();
        let mut f = ctx.forward();
        let (mut samples, mut probes) = (Vec::new(), Vec::new());
        for op in self.ops {
            match op {
                Op::Input(t) => {
                    f.input(&t);
                }
                Op::InputAt(t, p) => {
                    f.input_at(&t, &p);
                }
                Op::AttentionMask(rows) => {
                    f.attention_mask(rows.iter().map(|r| weft::Brle::from_bools(r)).collect());
                }
                Op::Mask(ids) => {
                    // An id past the vocabulary is the caller's mistake, not a token to leave
                    // out (the pass would then say that nothing is allowed).
                    engine.check_ids(ids.iter().copied())?;
                    f.mask(weft::Brle::only(vocab, &ids));
                }
                Op::LogitBias(b) => {
                    // As `generate(logit_bias=...)` says it: an id past the vocabulary.
                    engine.check_ids(b.iter().map(|&(id, _)| id))?;
                    f.logit_bias(&b);
                }
                Op::Horizon(n) => {
                    f.horizon(n);
                }
                Op::Adapter(a, scale) => {
                    f.adapter(&a, scale);
                }
                Op::ZoSeed(seed, sigma) => {
                    f.zo_seed(seed, sigma);
                }
                Op::InputEmbeds(ids, rows, positions) => {
                    f.input_embeds_as(&ids, &rows, &positions);
                }
                Op::AttentionBias(rows) => {
                    f.attention_bias(rows);
                }
                Op::Sample(i, s, None) => samples.push(f.sample(&i, s)),
                Op::Sample(i, s, Some(sets)) => {
                    engine.check_ids(sets.iter().flatten().copied())?;
                    let masks = sets
                        .iter()
                        .map(|ids| {
                            let mut m = weft::TokenMask::none(vocab);
                            ids.iter().for_each(|&id| m.allow(id));
                            m
                        })
                        .collect();
                    samples.push(f.sample_with_masks(&i, s, masks))
                }
                Op::Probe(i, kind) => probes.push(attach!(kind, |p| f.probe(i, p))),
            }
        }
        let out = f.execute().await?;
        let tokens = samples.into_iter().map(|h| out.get(h).to_vec()).collect();
        let probes = probes.iter().map(|p| p.read(&out)).collect();
        Ok(Outputs {
            id: self.id,
            tokens,
            probes,
        })
    }
}

/// An attention mask's rows: booleans, or 0/1 integers as Hugging Face's masks hold them (a
/// NumPy array of either).
fn mask_rows(rows: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<bool>>> {
    let rows = crate::rollout::listed(rows)?;
    let ints: Vec<Vec<i64>> = rows.extract().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(
            "an attention mask is rows of booleans or of 0/1 integers",
        )
    })?;
    ints.into_iter()
        .map(|row| {
            row.into_iter()
                .map(|v| match v {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "an attention mask holds 0 and 1 (or booleans), not {v}"
                    ))),
                })
                .collect()
        })
        .collect()
}

#[pymethods]
impl Forward {
    /// Appends input tokens at the next positions.
    fn input(mut slf: PyRefMut<'_, Self>, ids: Vec<u32>) -> PyResult<PyRefMut<'_, Self>> {
        let n = ids.len();
        slf.push(Op::Input(ids))?;
        slf.len += n;
        Ok(slf)
    }

    /// Appends input tokens at explicit positions (one per token).
    fn input_at(
        mut slf: PyRefMut<'_, Self>,
        ids: Vec<u32>,
        positions: Vec<u32>,
    ) -> PyResult<PyRefMut<'_, Self>> {
        let n = ids.len();
        slf.push(Op::InputAt(ids, positions))?;
        slf.len += n;
        Ok(slf)
    }

    /// One boolean row per input token (pending tokens first): which tokens of the context
    /// it attends to, replacing the causal rule. Row `i` covers at least the tokens up to
    /// itself (`len(ctx) + i + 1`) and at most every token of the pass (`len(ctx) + n`): a
    /// token may attend to later tokens of the same pass (a bidirectional block).
    fn attention_mask<'py>(
        mut slf: PyRefMut<'py, Self>,
        rows: &Bound<'py, PyAny>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        let rows = mask_rows(rows)?;
        slf.push(Op::AttentionMask(rows))?;
        Ok(slf)
    }

    /// Inputs given as vectors (`rows`: `len(positions) × n_embd` floats, e.g. a NumPy array
    /// of that shape) at `positions`, recorded in the context as `ids` (default 0) —
    /// `Engine.input_embeddings(ids)` gives the vectors that reproduce real tokens.
    #[pyo3(signature = (rows, positions, ids = None))]
    fn input_embeds<'py>(
        mut slf: PyRefMut<'py, Self>,
        rows: &Bound<'py, PyAny>,
        positions: Vec<u32>,
        ids: Option<Vec<u32>>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        let rows = vectors(rows, positions.len())?;
        let ids = ids.unwrap_or_else(|| vec![0; positions.len()]);
        let n = ids.len();
        slf.push(Op::InputEmbeds(ids, rows, positions))?;
        slf.len += n;
        Ok(slf)
    }

    /// An additive attention bias: one row per input token, as long as an attention mask's
    /// row may be (`len(ctx) + i + 1` to `len(ctx) + n`); `-inf` hides a token.
    fn attention_bias(
        mut slf: PyRefMut<'_, Self>,
        rows: Vec<Vec<f32>>,
    ) -> PyResult<PyRefMut<'_, Self>> {
        slf.push(Op::AttentionBias(rows))?;
        Ok(slf)
    }

    /// Allows only these token ids for every sampler of the pass.
    fn mask(mut slf: PyRefMut<'_, Self>, allowed: Vec<u32>) -> PyResult<PyRefMut<'_, Self>> {
        slf.push(Op::Mask(allowed))?;
        Ok(slf)
    }

    /// Adds `bias[id]` to the logits before sampling.
    fn logit_bias<'py>(
        mut slf: PyRefMut<'py, Self>,
        bias: &Bound<'py, PyAny>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        let bias = crate::context::bias_arg(bias)?;
        slf.push(Op::LogitBias(bias))?;
        Ok(slf)
    }

    /// Runs the pass with `adapter` (several add up; none named: the engine's stack).
    #[pyo3(signature = (adapter, scale = 1.0))]
    fn adapter<'py>(
        mut slf: PyRefMut<'py, Self>,
        adapter: &crate::adapter::Adapter,
        scale: f32,
    ) -> PyResult<PyRefMut<'py, Self>> {
        slf.push(Op::Adapter(adapter.inner.clone(), scale))?;
        Ok(slf)
    }

    /// Runs the pass with its adapters' weights perturbed by `sigma · ε(seed)`, a standard
    /// normal value per weight drawn from `seed` (negative `sigma`: the antithetic pair) —
    /// for evolution-strategies / zeroth-order training loops.
    fn zo_seed(mut slf: PyRefMut<'_, Self>, seed: u64, sigma: f32) -> PyResult<PyRefMut<'_, Self>> {
        slf.push(Op::ZoSeed(seed, sigma))?;
        Ok(slf)
    }

    /// Announces `n` more passes of this context (the scheduler may wait for them).
    fn horizon(mut slf: PyRefMut<'_, Self>, n: usize) -> PyResult<PyRefMut<'_, Self>> {
        slf.push(Op::Horizon(n))?;
        Ok(slf)
    }

    /// Samples a token with `sampler` after each of the input `indices`; with `masks` (one
    /// list of allowed ids per index), each position chooses within its own list (and the
    /// pass's `mask`): verifying a draft under a constraint.
    #[pyo3(signature = (indices, sampler, masks = None))]
    fn sample(
        &mut self,
        indices: Vec<usize>,
        sampler: PyRef<'_, Sampler>,
        masks: Option<Vec<Vec<u32>>>,
    ) -> PyResult<SampleHandle> {
        self.push(Op::Sample(indices, sampler.inner.clone(), masks))?;
        self.samples += 1;
        Ok(SampleHandle {
            pass: self.id,
            index: self.samples - 1,
        })
    }

    /// Reports `probe` for the next-token distribution after the input at `index`.
    fn probe(&mut self, index: usize, probe: PyRef<'_, Probe>) -> PyResult<ProbeHandle> {
        self.push(Op::Probe(index, probe.kind.clone()))?;
        self.probes += 1;
        Ok(ProbeHandle {
            pass: self.id,
            index: self.probes - 1,
        })
    }

    /// Inputs of the pass so far (the context's pending tokens included).
    fn __len__(&self) -> usize {
        self.len
    }

    /// Runs the pass (awaitable); the context is busy until it ends.
    fn execute<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pass = self.prepare()?;
        crate::awaitable(py, async move {
            let out = pass.run().await.map_err(to_py)?;
            Python::attach(|py| Py::new(py, ForwardOutput::from_outputs(py, out)?))
        })
    }

    /// Runs the pass, blocking (the GIL is released meanwhile).
    fn run(&mut self, py: Python<'_>) -> PyResult<ForwardOutput> {
        // Refused before the pass takes the context, so a refused call leaves it unspent.
        crate::callbacks::not_inside_a_callback()?;
        let pass = self.prepare()?;
        let out = crate::wait(py, pass.run())?.map_err(to_py)?;
        ForwardOutput::from_outputs(py, out)
    }
}

/// A pass's outputs, read by handle: `out[h]`.
#[pyclass(frozen, module = "weft")]
pub struct ForwardOutput {
    id: u64,
    tokens: Vec<Vec<u32>>,
    probes: Vec<Py<PyAny>>,
    /// A generator step's: the generation's id and how many of `probes` (the first) are
    /// its every-step probes.
    each_step: Option<(u64, usize)>,
}

impl ForwardOutput {
    fn from_outputs(py: Python<'_>, out: Outputs) -> PyResult<ForwardOutput> {
        ForwardOutput::new(py, out.id, out.tokens, out.probes, None)
    }

    /// The output of pass `id`: `probes` in the order they were added; with `each_step`
    /// `Some((generation, n))` the first `n` are the generation's every-step probes, read
    /// with the handles `probe_each_step` gave.
    pub fn new(
        py: Python<'_>,
        id: u64,
        tokens: Vec<Vec<u32>>,
        probes: Vec<Value>,
        each_step: Option<(u64, usize)>,
    ) -> PyResult<ForwardOutput> {
        let probes = probes
            .into_iter()
            .map(|v| v.into_py(py))
            .collect::<PyResult<_>>()?;
        Ok(ForwardOutput {
            id,
            tokens,
            probes,
            each_step,
        })
    }

    /// `out[handle]`.
    pub fn get_item(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        if let Ok(h) = handle.cast::<SampleHandle>() {
            return Ok(self
                .sampled(h.get())?
                .clone()
                .into_pyobject(py)?
                .into_any()
                .unbind());
        }
        if let Ok(h) = handle.cast::<ProbeHandle>() {
            let h = h.get();
            let (each_id, each_n) = self.each_step.unwrap_or((0, 0));
            let index = match h.pass {
                id if id == self.id => each_n + h.index,
                id if id == each_id && h.index < each_n => h.index,
                id if id == each_id => {
                    return Err(PyValueError::new_err(
                        "this every-step probe was added after this step ran",
                    ))
                }
                _ => return Err(PyValueError::new_err("this handle belongs to another pass")),
            };
            return self
                .probes
                .get(index)
                .map(|v| v.clone_ref(py))
                .ok_or_else(|| PyValueError::new_err("no such probe in this pass"));
        }
        Err(PyTypeError::new_err(
            "index a pass's (or step's) output with a handle from that pass (or step)",
        ))
    }

    fn sampled(&self, h: &SampleHandle) -> PyResult<&Vec<u32>> {
        if h.pass != self.id {
            return Err(PyValueError::new_err("this handle belongs to another pass"));
        }
        self.tokens
            .get(h.index)
            .ok_or_else(|| PyValueError::new_err("no such sampler in this pass"))
    }
}

#[pymethods]
impl ForwardOutput {
    /// The value behind a handle: a list of ids for a sampler; for probes a float32 array
    /// (Logits, Logprobs, Hidden), a float (Entropy, Logprob) or `(ids, probs)` arrays
    /// (Distribution).
    fn __getitem__(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.get_item(py, handle)
    }

    /// The first token a sampler chose.
    fn token(&self, handle: &SampleHandle) -> PyResult<u32> {
        self.sampled(handle)?
            .first()
            .copied()
            .ok_or_else(|| PyValueError::new_err("the sampler chose no token"))
    }

    /// Every token a sampler chose (one per index it was given).
    fn tokens(&self, handle: &SampleHandle) -> PyResult<Vec<u32>> {
        Ok(self.sampled(handle)?.clone())
    }
}

/// Adds the pass-builder classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Forward>()?;
    m.add_class::<ForwardOutput>()?;
    m.add_class::<SampleHandle>()?;
    m.add_class::<ProbeHandle>()?;
    Ok(())
}
