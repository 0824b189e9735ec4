//! The layer pager on the real models: with at most K blocks resident (read back from the
//! mapped file, or from a user's `PagerSource`) a model gives exactly the logits and tokens it
//! gives with every block resident; a failing source is a typed error, not a panic.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use weft::gguf::TensorInfo;
use weft::models::{LayerPager, PagerSource};
use weft::{block_on, Engine, EngineConfig, GgufFile, Sampler};

const PROMPT: &str = "The loom is one of the oldest machines people have built. A weaver \
stretches the warp threads tight on a frame and passes the weft thread over and under them.";

fn engine(model: &str, pager: Option<Arc<LayerPager>>) -> Engine {
    common::engine_with(
        model,
        EngineConfig {
            n_threads: 2,
            kv_tokens: 1024,
            layer_pager: pager,
            ..EngineConfig::default()
        },
    )
}

/// Logits after the prompt and 16 greedy tokens.
fn run(engine: &Engine) -> weft::Result<(Vec<f32>, Vec<u32>)> {
    let mut ctx = engine.context();
    ctx.fill(PROMPT)?;
    let logits = block_on(ctx.flush_logits())?;
    let gen = ctx.generate(Sampler::Argmax).max_tokens(16).ignore_eos();
    Ok((logits, block_on(gen.collect_tokens())?))
}

#[test]
fn gemma3_with_four_resident_layers_matches_all_resident() {
    let resident = run(&engine("gemma3-270m", None)).unwrap();
    let pager = Arc::new(LayerPager::new(4));
    let paged_engine = engine("gemma3-270m", Some(pager.clone()));
    let paged = run(&paged_engine).unwrap();
    assert!(paged.0 == resident.0, "logits differ with the pager");
    assert_eq!(paged.1, resident.1);
    let n_layers = paged_engine.info().n_layers as u64;
    let stats = pager.stats();
    // Loading the model loads every block once; each model call then walks them with 4
    // resident, loading at most the n - 3 beside the 3 that stay (dropping the least recently
    // used block instead would reload all n every call).
    let steps = paged_engine.metrics().steps;
    assert!(
        stats.loads <= n_layers + steps * (n_layers - 3),
        "{stats:?}, {steps} steps"
    );
    assert_eq!(stats.loads - stats.evictions, 4, "{stats:?}");
    assert!(Arc::ptr_eq(paged_engine.layer_pager().unwrap(), &pager));
}

/// Reads the blocks' tensors from its own copy of the model file, counting the reads, and
/// fails after `fail_after` reads.
struct Source {
    file: GgufFile,
    reads: AtomicUsize,
    fail_after: usize,
    short: bool,
}

impl PagerSource for Source {
    fn read(&self, info: &TensorInfo) -> weft_core::Result<Vec<u8>> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        if n >= self.fail_after {
            return Err(weft_core_error("the layer store went away"));
        }
        let data = self.file.tensor_data(info);
        let end = if self.short {
            data.len() - 1
        } else {
            data.len()
        };
        Ok(data[..end].to_vec())
    }
}

fn weft_core_error(reason: &str) -> weft_core::Error {
    weft_core::Error::BadModel {
        reason: reason.to_string(),
    }
}

fn source(fail_after: usize, short: bool) -> Arc<Source> {
    Arc::new(Source {
        file: common::open_model("smollm2-135m"),
        reads: AtomicUsize::new(0),
        fail_after,
        short,
    })
}

#[test]
fn a_custom_source_gives_the_same_tokens_and_its_failures_are_errors() {
    let resident = run(&engine("smollm2-135m", None)).unwrap();
    let src = source(usize::MAX, false);
    let pager = Arc::new(LayerPager::with_source(2, src.clone()));
    let paged = run(&engine("smollm2-135m", Some(pager))).unwrap();
    assert!(paged.0 == resident.0, "logits differ with a custom source");
    assert_eq!(paged.1, resident.1);
    assert!(src.reads.load(Ordering::Relaxed) > 30 * 9 * 10);

    // A source that returns a wrong length: refused when the model loads.
    let pager = Arc::new(LayerPager::with_source(2, source(usize::MAX, true)));
    let e = Engine::open(
        &common::model_path("smollm2-135m"),
        EngineConfig {
            layer_pager: Some(pager),
            ..EngineConfig::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("pager source returned"), "{e}");

    // A source that fails in the middle of a pass: the pass fails with its error, the
    // context's pages go back to the pool.
    let failing = source(30 * 9 + 100, false);
    let engine = engine(
        "smollm2-135m",
        Some(Arc::new(LayerPager::with_source(2, failing))),
    );
    let e = run(&engine).unwrap_err();
    assert!(e.to_string().contains("the layer store went away"), "{e}");
    assert_eq!(engine.metrics().kv_pages_used, 0);
}
