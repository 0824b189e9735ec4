//! Both models against llama.cpp's greedy runs in `shared/reference/greedy.json`: the whole
//! prompt in one batch, then one token per step.
//!
//! How close is close: llama.cpp itself, at the reference's commit on this machine (through
//! `llama-cpp-python` 0.3.36, 2 threads, f16 KV), does not reproduce that file to the 0.05 its
//! README hopes for. Over the top-5 logits of all 32 teacher-forced steps it is off by mean
//! 0.16 / max 0.88 (SmolLM2) and mean 0.24 / max 1.91 (Gemma 3) with flash attention, and its
//! flash and non-flash paths differ from each other by as much; its argmax departs from the
//! reference's token wherever the reference's top-2 margin is small (up to 0.46). So the bars
//! here are the ones the independent implementation itself clears, with 1.5× headroom:
//! - the prompt tokenizes to the reference's ids;
//! - greedy ids (run freely, our own tokens fed back) equal the reference's, or fork from them
//!   only at a step whose reference margin is below [`AMBIGUOUS`];
//! - with the reference's tokens fed back (teacher forcing), our argmax equals the reference's
//!   token at every step whose margin is at least [`AMBIGUOUS`], and the top-5 logits stay
//!   within the mean and max bounds below.

use crate::common;

use std::sync::{Arc, Mutex};

use weft_core::checkpoint::WeightType;
use weft_core::gguf::GgufFile;
use weft_core::runner::{BatchEntry, ModelRunner, RunnerConfig};
use weft_core::sampling::argmax;
use weft_core::tokenizer::Tokenizer;

/// A top-1/top-2 logit margin below which llama.cpp's own variants disagree on the argmax.
const AMBIGUOUS: f32 = 0.5;

struct Tolerance {
    /// Bound on the mean |logit - reference| over all top-5 entries of all steps.
    mean: f32,
    /// Bound on the largest |logit - reference|.
    max: f32,
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn top5(step: &serde_json::Value) -> Vec<(u32, f32)> {
    step["top5"]
        .as_array()
        .expect("top5")
        .iter()
        .map(|p| {
            (
                p[0].as_u64().expect("id") as u32,
                p[1].as_f64().expect("logit") as f32,
            )
        })
        .collect()
}

/// Runs `prompt` then one step per token of `feed` (or of our own argmax when `feed` is None),
/// returning the logits of every step.
fn run(r: &mut ModelRunner, prompt: &[u32], feed: Option<&[u32]>, steps: usize) -> Vec<Vec<f32>> {
    let seq = r.new_sequence();
    let mut batch = BatchEntry::run_of(prompt, seq, 0, false);
    let mut out = Vec::with_capacity(steps);
    for step in 0..steps {
        let logits = r.forward(&batch).expect("forward").to_vec();
        let next = feed.map_or_else(|| argmax(&logits), |f| f[step]);
        out.push(logits);
        batch = vec![BatchEntry {
            token: next,
            pos: (prompt.len() + step) as u32,
            seq,
            logits: true,
            mask: None,
            hidden: false,
            embed: None,
        }];
    }
    r.free_sequence(seq);
    out
}

fn check(model: &str, key: &str, tol: Tolerance) {
    check_file(common::open_model(model), key, tol);
}

/// The model's Hugging Face checkpoint folder (made from its GGUF file by transformers'
/// conversion, weights in `dtype`), converted back by weft as it loads, its matrices in
/// `weights`.
fn from_checkpoint(model: &str, dtype: &str, weights: WeightType) -> GgufFile {
    static MAKE: Mutex<()> = Mutex::new(());
    let dir = {
        let _one_at_a_time = MAKE.lock().unwrap_or_else(|e| e.into_inner());
        weft_testkit::hf_checkpoint(&common::model_file(model), model, dtype)
    };
    let bytes = weft_core::checkpoint::convert(&dir, weights).expect("convert the checkpoint");
    GgufFile::from_bytes(bytes).expect("the converted GGUF")
}

fn check_file(file: GgufFile, key: &str, tol: Tolerance) {
    let file = Arc::new(file);
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let mut runner = ModelRunner::new(file, &RunnerConfig::default()).expect("load model");
    let reference = common::reference_json("greedy.json");
    let cases: Vec<_> = reference["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["model"] == key)
        .collect();
    assert!(cases.len() >= 3, "reference lost its {key} cases");
    let mut report = Vec::new();
    let (mut worst, mut total, mut n) = (0f32, 0f64, 0usize);
    for case in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let prompt_ids = ids(&case["prompt_ids"]);
        assert_eq!(
            tok.encode(prompt, true, true),
            prompt_ids,
            "{key}: tokenization of {prompt:?}"
        );
        let greedy = ids(&case["greedy_ids"]);
        let steps: Vec<Vec<(u32, f32)>> = case["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(top5)
            .collect();
        let margin = |s: usize| steps[s][0].1 - steps[s][1].1;
        // Free-running greedy: the same ids as llama.cpp, and if the texts fork at all, they
        // fork on a near-tie of the reference's own logits.
        let free = run(&mut runner, &prompt_ids, None, steps.len());
        let ours: Vec<u32> = free.iter().map(|l| argmax(l)).collect();
        let fork = (0..steps.len()).find(|&s| ours[s] != greedy[s]);
        match fork {
            Some(s) if margin(s) >= AMBIGUOUS => report.push(format!(
                "{key} {prompt:?}: greedy forks at step {s} (margin {}): ours {ours:?}, llama.cpp {greedy:?}",
                margin(s)
            )),
            _ => eprintln!("{key} {prompt:?}: greedy ids equal llama.cpp's for {} of {} steps", fork.unwrap_or(steps.len()), steps.len()),
        }
        // Teacher forcing over all steps.
        let forced = run(&mut runner, &prompt_ids, Some(&greedy), steps.len());
        for (s, logits) in forced.iter().enumerate() {
            let got = argmax(logits);
            if margin(s) >= AMBIGUOUS && got != greedy[s] {
                report.push(format!(
                    "{key} {prompt:?} step {s}: argmax {got}, llama.cpp {} (margin {})",
                    greedy[s],
                    margin(s)
                ));
            }
            for &(id, want) in &steps[s] {
                let d = (logits[id as usize] - want).abs();
                worst = worst.max(d);
                total += f64::from(d);
                n += 1;
            }
        }
    }
    let mean = (total / n as f64) as f32;
    eprintln!("{key}: top-5 logits vs llama.cpp: mean |diff| {mean:.4}, max {worst:.4} over {n}");
    if mean > tol.mean || worst > tol.max {
        report.push(format!(
            "{key}: logits off by mean {mean} (bound {}), max {worst} (bound {})",
            tol.mean, tol.max
        ));
    }
    assert!(
        runner.kv_usage().iter().all(|u| u.free == u.total),
        "KV pages leaked"
    );
    assert!(
        report.is_empty(),
        "{} mismatches:\n{}",
        report.len(),
        report.join("\n")
    );
}

#[test]
fn smollm2_greedy_matches_llama_cpp() {
    check(
        "smollm2-135m",
        "smollm2",
        Tolerance {
            mean: 0.24,
            max: 1.3,
        },
    );
}

#[test]
fn gemma3_greedy_matches_llama_cpp() {
    check(
        "gemma3-270m",
        "gemma3",
        Tolerance {
            mean: 0.36,
            max: 2.9,
        },
    );
}

// The same models from Hugging Face checkpoints (safetensors, `config.json`,
// `tokenizer.json`): transformers turns each GGUF file back into the checkpoint it would load
// (dequantized; Llama's Q/K rows and Gemma's norms as Hugging Face stores them), and weft
// converts that as it loads. The reference is still llama.cpp's run of the GGUF file.
// - Kept in f32, the weights are the GGUF's own values: the GGUF's bars apply as they are,
//   and the prompts must tokenize to llama.cpp's ids through the `tokenizer.json`.
// - Quantized to Q8_0 (the default), they are the GGUF's values rounded once more: greedy and
//   argmax rules as strict, and the logits within "a few tenths on average" (the reference's
//   README) where Q8_0 moves them past llama.cpp's own spread (SmolLM2: mean 0.175 with f32
//   weights, 0.254 with Q8_0, measured on the Xeon 207); Gemma stays inside the GGUF's bars.
// SmolLM2's checkpoint is written in f32 and Gemma's in f16, so both readings are exercised.

/// The GGUF file widened to F32 (`checkpoint::widen`): the same weights with `f32`
/// activations, which llama.cpp rounds to 8 bits; as close to its logits as the checkpoint
/// in f32 (the same situation), so the GGUF's bars.
#[test]
fn smollm2_widened_to_f32_matches_llama_cpp() {
    let file = common::open_model("smollm2-135m");
    let wide = weft_core::checkpoint::widen(&file, WeightType::F32)
        .expect("widen")
        .expect("a new file");
    check_file(
        GgufFile::from_bytes(wide).expect("the widened GGUF"),
        "smollm2",
        Tolerance {
            mean: 0.24,
            max: 1.3,
        },
    );
}

#[test]
fn smollm2_from_safetensors_f32_matches_llama_cpp() {
    check_file(
        from_checkpoint("smollm2-135m", "f32", WeightType::F32),
        "smollm2",
        Tolerance {
            mean: 0.24,
            max: 1.3,
        },
    );
}

#[test]
fn smollm2_from_safetensors_q8_0_matches_llama_cpp() {
    check_file(
        from_checkpoint("smollm2-135m", "f32", WeightType::Q8_0),
        "smollm2",
        Tolerance {
            mean: 0.3,
            max: 1.3,
        },
    );
}

#[test]
fn gemma3_from_safetensors_q8_0_matches_llama_cpp() {
    check_file(
        from_checkpoint("gemma3-270m", "f16", WeightType::Q8_0),
        "gemma3",
        Tolerance {
            mean: 0.36,
            max: 2.9,
        },
    );
}
