//! The `weft` Python package's native module (`weft._weft`): the public `weft` API wrapped
//! class for class, with no logic of its own. Every call that runs the model releases the GIL,
//! so Python threads and asyncio tasks on one engine share its scheduler's model calls.

mod context;
mod engine;
mod errors;
mod forward;
mod generation;
mod rollout;
mod sampling;

use pyo3::prelude::*;

#[pymodule]
fn _weft(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Embedder>()?;
    m.add_class::<engine::Metrics>()?;
    m.add_class::<context::Context>()?;
    m.add_class::<generation::Generation>()?;
    m.add_class::<rollout::Rollout>()?;
    m.add_function(wrap_pyfunction!(rollout::generate_batch, m)?)?;
    forward::register(m)?;
    sampling::register(m)?;
    errors::register(m)?;
    Ok(())
}
