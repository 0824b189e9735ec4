//! LoRA adapters: `Engine.load_adapter(path)` gives an `Adapter`, which a generation
//! (`adapters=[(a, scale)]`), a pass (`fwd.adapter(a, scale)`) or the engine's stack
//! (`push_lora`) applies; the base weights are never touched.

use pyo3::prelude::*;

/// A LoRA adapter loaded for one engine's model (llama.cpp's GGUF LoRA file or a PEFT
/// directory). Cheap to share between generations.
#[pyclass(frozen, module = "weft")]
pub struct Adapter {
    pub inner: weft::Adapter,
}

#[pymethods]
impl Adapter {
    /// The adapter's name (its file's).
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    fn __repr__(&self) -> String {
        format!("weft.Adapter({:?})", self.inner.name())
    }
}
