//! Samplers and probes as Python classes: `weft.Argmax()`, `weft.TopP(0.95, temperature=0.7)`,
//! `weft.Entropy()`, … Each subclass only builds the Rust value its base class holds.

use pyo3::prelude::*;

/// How a token is chosen from the next-token distribution. Use a subclass.
#[pyclass(subclass, frozen, module = "weft")]
#[derive(Clone)]
pub struct Sampler {
    pub inner: weft::Sampler,
}

#[pymethods]
impl Sampler {
    /// The constructor call that makes it: `weft.TopP(p=0.9, temperature=0.7)`.
    fn __repr__(&self) -> String {
        use weft::Sampler as S;
        match self.inner {
            S::Argmax => "weft.Argmax()".into(),
            S::Temperature { temperature } => format!("weft.Temperature({temperature:?})"),
            S::TopK { k, temperature } => format!("weft.TopK({k}, temperature={temperature:?})"),
            S::TopP { p, temperature } => format!("weft.TopP({p:?}, temperature={temperature:?})"),
            S::MinP { p, temperature } => format!("weft.MinP({p:?}, temperature={temperature:?})"),
            S::Chain {
                k,
                p,
                min_p,
                temperature,
            } => {
                let k = if k == usize::MAX { 0 } else { k };
                format!(
                    "weft.Chain(top_k={k}, top_p={p:?}, min_p={min_p:?}, temperature={temperature:?})"
                )
            }
            ref other => format!("weft.Sampler({other:?})"),
        }
    }

    /// Samplers with the same settings are equal (`weft.Argmax() == weft.Argmax()`).
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Sampler>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    /// Equal samplers hash alike (a zero temperature and a negative zero one too).
    fn __hash__(&self) -> u64 {
        use weft::Sampler as S;
        let f = |x: f32| u64::from((x + 0.0).to_bits());
        let fields: [u64; 5] = match self.inner {
            S::Argmax => [0, 0, 0, 0, 0],
            S::Temperature { temperature } => [1, f(temperature), 0, 0, 0],
            S::TopK { k, temperature } => [2, k as u64, f(temperature), 0, 0],
            S::TopP { p, temperature } => [3, f(p), f(temperature), 0, 0],
            S::MinP { p, temperature } => [4, f(p), f(temperature), 0, 0],
            S::Chain {
                k,
                p,
                min_p,
                temperature,
            } => [5, k as u64, f(p), f(min_p), f(temperature)],
            _ => [6, 0, 0, 0, 0],
        };
        // FNV-1a's constants, a word at a time.
        fields.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
            (h ^ x).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// Pickles as its constructor call, so samplers cross to other processes.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        use weft::Sampler as S;
        let py = slf.py();
        let args = match slf.get().inner {
            S::Argmax => ().into_pyobject(py)?.into_any(),
            S::Temperature { temperature } => (temperature,).into_pyobject(py)?.into_any(),
            S::TopK { k, temperature } => (k, temperature).into_pyobject(py)?.into_any(),
            S::TopP { p, temperature } | S::MinP { p, temperature } => {
                (p, temperature).into_pyobject(py)?.into_any()
            }
            S::Chain {
                k,
                p,
                min_p,
                temperature,
            } => (k, p, min_p, temperature).into_pyobject(py)?.into_any(),
            ref other => {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "cannot pickle weft.Sampler({other:?})"
                )))
            }
        };
        Ok((slf.get_type().into_any(), args))
    }
}

/// A constructor's value, checked before the object exists.
trait Checked {
    fn checked(self) -> PyResult<Self>
    where
        Self: Sized;
}

impl Checked for weft::Sampler {
    /// The library's ranges (temperature >= 0, top-p in (0, 1], ...), so `weft.TopP(2.0)`
    /// raises `InvalidSampler` where it is written, not at the first generation.
    fn checked(self) -> PyResult<Self> {
        match self.validate(usize::MAX) {
            Ok(()) => Ok(self),
            Err(e) => Err(crate::errors::to_py(weft::Error::Sampler(e))),
        }
    }
}

impl Checked for ProbeKind {
    /// A distribution's temperature, as a pass would check it.
    fn checked(self) -> PyResult<Self> {
        match self {
            ProbeKind::Distribution { temperature, .. }
                if !(temperature.is_finite() && temperature >= 0.0) =>
            {
                Err(crate::errors::ConfigError::new_err(format!(
                    "Distribution: the temperature must be a finite number >= 0, got {temperature}"
                )))
            }
            ok => Ok(ok),
        }
    }
}

/// Declares a subclass of `$base` (Sampler or Probe): its constructor signature and the
/// `$field` value of the base it makes.
macro_rules! subclass {
    ($base:ident { $field:ident }, $name:ident, $doc:literal, ($($arg:ident: $ty:ty),*), $sig:tt, $make:expr) => {
        #[doc = $doc]
        #[pyclass(extends = $base, frozen, module = "weft")]
        pub struct $name;

        #[pymethods]
        impl $name {
            #[new]
            #[pyo3(signature = $sig)]
            fn new($($arg: $ty),*) -> PyResult<PyClassInitializer<Self>> {
                let $field = Checked::checked($make)?;
                Ok(PyClassInitializer::from($base { $field }).add_subclass($name))
            }
        }
    };
}

macro_rules! sampler {
    ($($t:tt)*) => { subclass!(Sampler { inner }, $($t)*); };
}

sampler!(
    Argmax,
    "Always the most likely token (greedy).",
    (),
    (),
    weft::Sampler::Argmax
);
sampler!(
    Temperature,
    "Plain sampling from the softmax at `temperature` (0 = greedy).",
    (temperature: f32),
    (temperature),
    weft::Sampler::Temperature { temperature }
);
sampler!(
    TopK,
    "Sampling among the `k` most likely tokens.",
    (k: usize, temperature: f32),
    (k, temperature = 1.0),
    weft::Sampler::TopK { k, temperature }
);
sampler!(
    TopP,
    "Nucleus sampling: the smallest set of most likely tokens with mass >= `p`.",
    (p: f32, temperature: f32),
    (p, temperature = 1.0),
    weft::Sampler::TopP { p, temperature }
);
sampler!(
    MinP,
    "Sampling among the tokens at least `p` times as likely as the most likely one.",
    (p: f32, temperature: f32),
    (p, temperature = 1.0),
    weft::Sampler::MinP { p, temperature }
);
sampler!(
    Chain,
    "Top-k (0: off, as `--top-k 0`), then top-p, then min-p, in llama.cpp's order, all on the probabilities at the temperature, as Hugging Face's warpers and vLLM filter (llama.cpp applies its temperature after top-p and min-p, so at a temperature other than 1 those keep other sets).",
    (top_k: usize, top_p: f32, min_p: f32, temperature: f32),
    (top_k = 40, top_p = 0.95, min_p = 0.05, temperature = 0.8),
    weft::Sampler::Chain {
        // 0 is off, as the CLI's --top-k 0: every token of any vocabulary is kept.
        k: if top_k == 0 { usize::MAX } else { top_k },
        p: top_p,
        min_p,
        temperature
    }
);

/// What a probe reports, owned (the Rust probes are distinct types).
#[derive(Clone, Debug)]
pub enum ProbeKind {
    Logits,
    Distribution { temperature: f32, k: usize },
    Logprob(u32),
    Logprobs(Vec<u32>),
    Entropy,
    Hidden,
}

/// Something a pass reports at a position besides the sampled token. Use a subclass.
#[pyclass(subclass, frozen, module = "weft")]
pub struct Probe {
    pub kind: ProbeKind,
}

#[pymethods]
impl Probe {
    /// The constructor call that makes it: `weft.Distribution(temperature=1.0, k=5)`.
    fn __repr__(&self) -> String {
        match &self.kind {
            ProbeKind::Logits => "weft.Logits()".into(),
            ProbeKind::Distribution { temperature, k } => {
                format!("weft.Distribution(temperature={temperature:?}, k={k})")
            }
            ProbeKind::Logprob(id) => format!("weft.Logprob({id})"),
            ProbeKind::Logprobs(ids) => format!("weft.Logprobs({ids:?})"),
            ProbeKind::Entropy => "weft.Entropy()".into(),
            ProbeKind::Hidden => "weft.Hidden()".into(),
        }
    }

    /// Pickles as its constructor call, so probes cross to other processes.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let py = slf.py();
        let args = match &slf.get().kind {
            ProbeKind::Logits | ProbeKind::Entropy | ProbeKind::Hidden => {
                ().into_pyobject(py)?.into_any()
            }
            ProbeKind::Distribution { temperature, k } => {
                (*temperature, *k).into_pyobject(py)?.into_any()
            }
            ProbeKind::Logprob(id) => (*id,).into_pyobject(py)?.into_any(),
            ProbeKind::Logprobs(ids) => (ids.clone(),).into_pyobject(py)?.into_any(),
        };
        Ok((slf.get_type().into_any(), args))
    }
}

macro_rules! probe {
    ($($t:tt)*) => { subclass!(Probe { kind }, $($t)*); };
}

probe!(
    Logits,
    "The raw next-token logits (a float32 array over the vocabulary).",
    (),
    (),
    ProbeKind::Logits
);
probe!(
    Distribution,
    "The softmax at `temperature` over the `k` most likely ids (k = 0: all), as (ids, probs).",
    (temperature: f32, k: usize),
    (temperature = 1.0, k = 0),
    ProbeKind::Distribution { temperature, k }
);
probe!(
    Logprob,
    "The log-probability (natural log, temperature 1) of one token id.",
    (token_id: u32),
    (token_id),
    ProbeKind::Logprob(token_id)
);
probe!(
    Logprobs,
    "The log-probabilities of several token ids, in the order given (a float32 array).",
    (token_ids: Vec<u32>),
    (token_ids),
    ProbeKind::Logprobs(token_ids)
);
probe!(
    Entropy,
    "The entropy (nats) of the next-token distribution at temperature 1.",
    (),
    (),
    ProbeKind::Entropy
);
probe!(
    Hidden,
    "The hidden state after the final norm (a float32 array of n_embd values).",
    (),
    (),
    ProbeKind::Hidden
);

/// Adds the sampler and probe classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sampler>()?;
    m.add_class::<Argmax>()?;
    m.add_class::<Temperature>()?;
    m.add_class::<TopK>()?;
    m.add_class::<TopP>()?;
    m.add_class::<MinP>()?;
    m.add_class::<Chain>()?;
    m.add_class::<Probe>()?;
    m.add_class::<Logits>()?;
    m.add_class::<Distribution>()?;
    m.add_class::<Logprob>()?;
    m.add_class::<Logprobs>()?;
    m.add_class::<Entropy>()?;
    m.add_class::<Hidden>()?;
    Ok(())
}
