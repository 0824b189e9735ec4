//! `weft.Step` and `weft.StepOutput`: one step of a generation driven by hand, as the Rust
//! API's `Generator::next` / `Step::execute` / `Generator::accept`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::driver::{Cmd, Item, Stepped};
use crate::forward::{new_id, ForwardOutput, ProbeHandle};
use crate::generation::WeakHandle;
use crate::probes::ProbeKind;
use crate::sampling::Probe;

/// The next step of a generation (from `Generation.next_step()`): add probes, drop the
/// automatic sampler if you choose the token yourself, then `run()` it or
/// `await step.execute()`. A step runs once.
#[pyclass(module = "weft")]
pub struct Step {
    /// Weak: a step left over from a loop does not keep the generation (and its context).
    gen: WeakHandle,
    /// How often the generation had moved on when this step was made: run after another
    /// move, it is stale.
    made_at: u64,
    id: u64,
    auto: bool,
    probes: Vec<(usize, ProbeKind)>,
    spent: bool,
}

impl Step {
    pub fn new(gen: WeakHandle, made_at: u64) -> Step {
        Step {
            gen,
            made_at,
            id: new_id(),
            auto: true,
            probes: Vec::new(),
            spent: false,
        }
    }

    /// The request that runs the step.
    fn request(&self) -> PyResult<Cmd> {
        if self.spent {
            return Err(PyRuntimeError::new_err("this step has already run"));
        }
        Ok(Cmd::Step {
            auto: self.auto,
            probes: self.probes.clone(),
            made_at: self.made_at,
        })
    }
}

/// The step's output made Python objects.
fn output(py: Python<'_>, gen: u64, id: u64, answer: Option<Item>) -> PyResult<StepOutput> {
    let Some(Item::Stepped(s)) = answer else {
        return Err(crate::errors::to_py(weft::Error::Config(
            "the generation has stopped: there is no next step".into(),
        )));
    };
    let Stepped {
        token,
        accepted,
        values,
        each_step,
        allowed,
    } = s;
    let output = ForwardOutput::new(py, id, Vec::new(), values, Some((gen, each_step)))?;
    Ok(StepOutput {
        token,
        accepted,
        output: Py::new(py, output)?,
        allowed,
    })
}

#[pymethods]
impl Step {
    /// Runs the step without its automatic sampler: no token is chosen; pick one from a probe
    /// and hand it to `Generation.accept`. (No speculative draft on such a step.) The
    /// constraint's allowed set is the output's `allowed`; penalties, logit bias and the
    /// `min_tokens` ban are the automatic sampler's, and the caller's to apply.
    fn clear_sampler(&mut self) -> PyResult<()> {
        if self.spent {
            return Err(PyRuntimeError::new_err("this step has already run"));
        }
        self.auto = false;
        Ok(())
    }

    /// Adds a probe for this step only (`index` 0: the position the step samples from).
    fn probe(&mut self, index: usize, probe: PyRef<'_, Probe>) -> PyResult<ProbeHandle> {
        if self.spent {
            return Err(PyRuntimeError::new_err("this step has already run"));
        }
        self.probes.push((index, probe.kind.clone()));
        Ok(ProbeHandle::new(self.id, self.probes.len() - 1))
    }

    /// Runs the step, blocking (the GIL is released meanwhile). With the sampler on, the
    /// token it chose is taken by the generation.
    fn run(&mut self, py: Python<'_>) -> PyResult<StepOutput> {
        let gen = self.gen.upgrade()?;
        let answer = gen.request_blocking(py, self.request()?)?;
        // Run: it cannot run again (a step that failed can be run again).
        self.spent = true;
        output(py, gen.id, self.id, answer)
    }

    /// `await step.execute()`: `run()` without blocking the event loop.
    fn execute<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let gen = self.gen.upgrade()?;
        let cmd = self.request()?;
        // Started: whatever its outcome, it does not run again.
        self.spent = true;
        let id = self.id;
        let turn = gen.turn(py)?;
        crate::awaitable(py, async move {
            let answer = gen.request_in_turn(turn, cmd).await?;
            Python::attach(|py| Py::new(py, output(py, gen.id, id, answer)?))
        })
    }
}

/// What a step returned: the tokens it took, and its probes (`out[handle]`, for this step's
/// handles and the generation's every-step ones).
#[pyclass(frozen, module = "weft")]
pub struct StepOutput {
    token: Option<u32>,
    accepted: Vec<u32>,
    output: Py<ForwardOutput>,
    allowed: Option<weft::TokenMask>,
}

#[pymethods]
impl StepOutput {
    /// The token the sampler chose (None after `clear_sampler()`); with speculative
    /// decoding, the last of the tokens the step took.
    #[getter]
    fn token(&self) -> Option<u32> {
        self.token
    }

    /// Every token the step took (one, or more with speculative decoding), a stop token that
    /// ended the generation included.
    #[getter]
    fn accepted(&self) -> Vec<u32> {
        self.accepted.clone()
    }

    /// The token ids the generation's constraint allows at the sampled position (None
    /// without a constraint): what to choose from after `clear_sampler()`, since probes
    /// report the unconstrained distribution; `Generation.accept` raises
    /// `weft.TokenNotAllowed` for any other.
    #[getter]
    fn allowed(&self) -> Option<Vec<u32>> {
        let m = self.allowed.as_ref()?;
        Some((0..m.len() as u32).filter(|&id| m.is_allowed(id)).collect())
    }

    /// A probe's value (as `ForwardOutput[handle]`).
    fn __getitem__(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.output.bind(py).get().get_item(py, handle)
    }

    fn __repr__(&self) -> String {
        format!(
            "weft.StepOutput(token={}, accepted={:?})",
            self.token.map_or("None".into(), |t| t.to_string()),
            self.accepted
        )
    }
}

/// Adds the step classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Step>()?;
    m.add_class::<StepOutput>()?;
    Ok(())
}
