//! Probes of the Rust API by kind: Python's probes are one class with a kind, Rust's are
//! distinct types with typed handles. [`attach!`] adds one to whatever takes a probe (a pass, a
//! generator step, every step of a generator) and keeps its handle as a [`RustProbe`], whose
//! value is read back owned and made a Python object.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

pub use crate::sampling::ProbeKind;

/// A probe handle of the Rust API, by probe type.
#[derive(Clone)]
pub enum RustProbe {
    Logits(weft::ProbeHandle<weft::Logits>),
    Distribution(weft::ProbeHandle<weft::Distribution>),
    Logprob(weft::ProbeHandle<weft::Logprob>),
    Logprobs(weft::ProbeHandle<weft::Logprobs>),
    Entropy(weft::ProbeHandle<weft::Entropy>),
    Hidden(weft::ProbeHandle<weft::Hidden>),
}

/// Adds the probe of `$kind` with `$add` (a closure taking the typed Rust probe and
/// returning its handle, written once and stamped for each type) → a [`RustProbe`].
macro_rules! attach {
    ($kind:expr, $add:expr) => {{
        use $crate::probes::{ProbeKind, RustProbe};
        match $kind {
            ProbeKind::Logits => RustProbe::Logits($add(weft::Logits)),
            ProbeKind::Distribution { temperature, k } => {
                RustProbe::Distribution($add(weft::Distribution { temperature, k }))
            }
            ProbeKind::Logprob(id) => RustProbe::Logprob($add(weft::Logprob(id))),
            ProbeKind::Logprobs(ids) => RustProbe::Logprobs($add(weft::Logprobs(ids))),
            ProbeKind::Entropy => RustProbe::Entropy($add(weft::Entropy)),
            ProbeKind::Hidden => RustProbe::Hidden($add(weft::Hidden)),
        }
    }};
}
pub(crate) use attach;

/// A probe's value, owned (made a Python object with the GIL, see [`Value::into_py`]).
pub enum Value {
    Floats(Vec<f32>),
    Distribution(Vec<u32>, Vec<f32>),
    Scalar(f32),
}

impl RustProbe {
    /// The probe's value in `out`, the output of the pass it was added to.
    pub fn read(&self, out: &weft::ForwardOutput) -> Value {
        match self.clone() {
            RustProbe::Logits(h) => Value::Floats(out.get(h).to_vec()),
            RustProbe::Distribution(h) => {
                let (ids, p) = out.get(h);
                Value::Distribution(ids.to_vec(), p.to_vec())
            }
            RustProbe::Logprob(h) => Value::Scalar(out.get(h)),
            RustProbe::Logprobs(h) => Value::Floats(out.get(h).to_vec()),
            RustProbe::Entropy(h) => Value::Scalar(out.get(h)),
            RustProbe::Hidden(h) => Value::Floats(out.get(h).to_vec()),
        }
    }
}

impl Value {
    /// A float32 array (Logits, Logprobs, Hidden), a float (Entropy, Logprob) or `(ids,
    /// probs)` arrays (Distribution).
    pub fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Value::Floats(v) => PyArray1::from_vec(py, v).into_any().unbind(),
            Value::Distribution(ids, p) => {
                let ids = PyArray1::from_vec(py, ids).into_any();
                let p = PyArray1::from_vec(py, p).into_any();
                PyTuple::new(py, [ids, p])?.into_any().unbind()
            }
            Value::Scalar(x) => x.into_pyobject(py)?.into_any().unbind(),
        })
    }
}
