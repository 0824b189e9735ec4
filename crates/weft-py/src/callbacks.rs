//! Constraints and speculators written in Python: objects with the Rust traits' methods,
//! called (with the GIL) from the step that needs them.
//!
//! An exception they raise is kept in the generation's [`Raised`] slot: it ends the
//! generation and is raised, type and traceback intact, to the caller of that step and every
//! later call on the generation.

use std::cell::Cell;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::driver::{lock, Raised};
use crate::errors::ContextBusy;

thread_local! {
    /// Whether this thread is inside a Python constraint's or speculator's method, that is
    /// inside a step that holds its generation (and, on the blocking path, inside an executor).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as inside a callback for as long as it lives.
struct Inside(bool);

impl Inside {
    fn enter() -> Inside {
        Inside(INSIDE.with(|i| i.replace(true)))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|i| i.set(self.0));
    }
}

/// Refuses a call that would wait on weft from inside a constraint's or speculator's method:
/// its own generation is busy running the step (the call would wait for itself), and a
/// blocking wait cannot nest in the one that runs the step.
pub fn not_inside_a_callback() -> PyResult<()> {
    if INSIDE.with(Cell::get) {
        return Err(ContextBusy::new_err(
            "a constraint's or speculator's method (or generate_batch's on_partial) runs \
             inside a step of its generation: it cannot drive a generation, run a pass or wait \
             on the engine",
        ));
    }
    Ok(())
}

/// Calls `f` with the GIL, the thread marked as inside a callback.
pub(crate) fn call<T>(f: impl FnOnce(Python<'_>) -> PyResult<T>) -> PyResult<T> {
    Python::attach(|py| {
        let _inside = Inside::enter();
        f(py)
    })
}

/// `obj` to call back, once checked to have a callable `name` (`what`: what it was given as).
fn callback(obj: &Bound<'_, PyAny>, name: &str, what: &str) -> PyResult<Callback> {
    match obj.getattr(name) {
        Ok(m) if m.is_callable() => Ok(std::sync::Arc::new(obj.clone().unbind())),
        _ => Err(PyTypeError::new_err(format!(
            "{what} must have a method {name}(); got {}",
            obj.get_type().name()?
        ))),
    }
}

/// Keeps `e` for the step's caller and returns weft's stand-in error for it.
fn keep(raised: &Raised, e: PyErr, what: &str) -> weft::Error {
    let (e, message) = Python::attach(|py| {
        // As PEP 479 does for generators: a StopIteration escaping a callback would end the
        // caller's loop as if the generation had ended well.
        let stops = e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py)
            || e.is_instance_of::<pyo3::exceptions::PyStopAsyncIteration>(py);
        let e = match stops {
            true => {
                let wrapped = pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "{what} raised {}",
                    e.get_type(py)
                        .name()
                        .map_or("StopIteration".into(), |n| n.to_string())
                ));
                wrapped.set_cause(py, Some(e));
                wrapped
            }
            false => e,
        };
        let message = e.value(py).to_string();
        (e.into_value(py), message)
    });
    lock(raised).get_or_insert(e);
    weft::Error::Config(format!("{what} raised: {message}"))
}

/// A Python constraint: `allowed(accepted, vocab_size)` returns the ids allowed next (any
/// iterable of ints, or a bool mask over the vocabulary as a NumPy array or a list; None
/// allows everything),
/// and `is_terminal(accepted)` (optional) whether generation stops.
pub struct PyConstraint {
    obj: Callback,
    raised: Raised,
}

/// A Python object called back, shared with its generation (which shows it to Python's
/// garbage collector).
pub type Callback = std::sync::Arc<Py<PyAny>>;

impl PyConstraint {
    pub fn new(obj: &Bound<'_, PyAny>, raised: Raised) -> PyResult<PyConstraint> {
        // A schema where an object was meant (seed 000's `constrain=schema`): say where it goes.
        if obj.is_instance_of::<pyo3::types::PyDict>()
            || obj.is_instance_of::<pyo3::types::PyBool>()
        {
            return Err(PyTypeError::new_err(format!(
                "constrain= takes an object with a method allowed(); got {}: a JSON schema goes \
                 to json_schema= (regex= and grammar= take the other built-in constraints)",
                obj.get_type().name()?
            )));
        }
        let obj = callback(obj, "allowed", "a constraint")?;
        Ok(PyConstraint { obj, raised })
    }

    /// The object called back.
    pub fn object(&self) -> Callback {
        self.obj.clone()
    }
}

/// An answer of 0s and 1s over the whole vocabulary: meant as a mask, read as ids {0, 1}.
fn zero_one() -> PyErr {
    PyTypeError::new_err(
        "allowed() returned 0s and 1s over the whole vocabulary: return a bool mask \
         (mask.astype(bool), or a list of bools) or the allowed ids",
    )
}

/// The mask an `allowed()` answer describes.
fn mask_of(
    answer: &Bound<'_, PyAny>,
    vocab_size: usize,
) -> PyResult<weft::Result<weft::TokenMask>> {
    if answer.is_none() {
        return Ok(Ok(weft::TokenMask::all(vocab_size)));
    }
    let array_kind = answer
        .getattr("dtype")
        .and_then(|d| d.getattr("kind"))
        .and_then(|k| k.extract::<String>())
        .ok();
    if let Some(kind) = &array_kind {
        if answer.getattr("ndim")?.extract::<usize>()? != 1 {
            return Err(PyTypeError::new_err(
                "allowed() must return a 1-D array (ids, or a bool mask over the vocabulary)",
            ));
        }
        if (kind == "i" || kind == "u")
            && answer.len()? == vocab_size
            && answer.call_method0("max")?.extract::<i64>()? <= 1
        {
            return Err(zero_one());
        }
    }
    // A Python list over the vocabulary: bools are a mask, 0s and 1s a likely mistake.
    let list = answer.cast::<pyo3::types::PyList>().ok();
    let list_mask = match list.filter(|l| l.len() == vocab_size && vocab_size > 0) {
        Some(l) if l.get_item(0)?.is_instance_of::<pyo3::types::PyBool>() => true,
        Some(l) => {
            if l.iter().all(|x| x.extract::<u32>().is_ok_and(|v| v <= 1)) {
                return Err(zero_one());
            }
            false
        }
        None => false,
    };
    let mut mask = weft::TokenMask::none(vocab_size);
    if array_kind.as_deref() == Some("b") || list_mask {
        let bits: Vec<bool> = match list_mask {
            true => answer.extract()?,
            false => answer.call_method0("tolist")?.extract()?,
        };
        if bits.len() != vocab_size {
            return Ok(Err(weft::Error::MaskLength {
                what: "the bool array a constraint's allowed() returned",
                got: bits.len(),
                expected: vocab_size,
            }));
        }
        for (id, _) in bits.iter().enumerate().filter(|(_, &b)| b) {
            mask.allow(id as u32);
        }
        return Ok(Ok(mask));
    }
    for id in answer.try_iter()? {
        let id = id?;
        // True and False are ints to Python: as ids they would allow tokens 1 and 0.
        if id.is_instance_of::<pyo3::types::PyBool>() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "a constraint's allowed() returned bools outside a list: a mask over the \
                 vocabulary is a list (or a NumPy bool array), token ids are ints",
            ));
        }
        let id: u32 = id.extract()?;
        if id as usize >= vocab_size {
            return Ok(Err(weft::Error::TokenOutOfVocab { id, vocab_size }));
        }
        mask.allow(id);
    }
    Ok(Ok(mask))
}

impl weft::Constraint for PyConstraint {
    fn allowed(&mut self, accepted: &[u32], vocab_size: usize) -> weft::Result<weft::TokenMask> {
        call(|py| {
            let answer = self
                .obj
                .call_method1(py, "allowed", (accepted.to_vec(), vocab_size))?;
            mask_of(answer.bind(py), vocab_size)
        })
        .unwrap_or_else(|e| Err(keep(&self.raised, e, "the constraint's allowed()")))
    }

    fn is_terminal(&mut self, accepted: &[u32]) -> weft::Result<bool> {
        call(|py| {
            let obj = self.obj.bind(py);
            if !obj.hasattr("is_terminal")? {
                return Ok(false);
            }
            obj.call_method1("is_terminal", (accepted.to_vec(),))?
                .is_truthy()
        })
        .map_err(|e| keep(&self.raised, e, "the constraint's is_terminal()"))
    }
}

/// A Python speculator: `draft(tokens, max)` returns up to `max` ids likely to follow
/// `tokens` (the prompt and everything generated; None: no draft), and `accepted(drafted, accepted)`
/// (optional) hears how many of the last draft were kept.
pub struct PySpeculator {
    obj: Callback,
    raised: Raised,
}

impl PySpeculator {
    pub fn new(obj: &Bound<'_, PyAny>, raised: Raised) -> PyResult<PySpeculator> {
        let obj = callback(obj, "draft", "a speculator")?;
        Ok(PySpeculator { obj, raised })
    }

    /// The object called back.
    pub fn object(&self) -> Callback {
        self.obj.clone()
    }
}

impl weft::Speculator for PySpeculator {
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        // The trait has no error path: an exception leaves the step without a draft (so its
        // token is the sampler's, as without a speculator) and is raised after it.
        // None is no draft, as a constraint's None allows everything.
        let drafted = call(|py| {
            let d = self.obj.call_method1(py, "draft", (tokens.to_vec(), max))?;
            match d.is_none(py) {
                true => Ok(Vec::new()),
                false => d.extract::<Vec<u32>>(py),
            }
        });
        match drafted {
            Ok(mut d) => {
                d.truncate(max);
                d
            }
            Err(e) => {
                keep(&self.raised, e, "the speculator's draft()");
                Vec::new()
            }
        }
    }

    fn accepted(&mut self, drafted: usize, accepted: usize) {
        let told = call(|py| {
            let obj = self.obj.bind(py);
            if obj.hasattr("accepted")? {
                obj.call_method1("accepted", (drafted, accepted))?;
            }
            Ok(())
        });
        if let Err(e) = told {
            keep(&self.raised, e, "the speculator's accepted()");
        }
    }
}
