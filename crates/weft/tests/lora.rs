//! LoRA adapters on the real models.
//!
//! - llama.cpp's reference: `shared/reference/gen_lora.py` (run here with pinned `gguf` and
//!   `numpy` in a virtualenv under `target/`, checked against the reference's SHA-256) writes a
//!   rank-8 SmolLM2 adapter; with it weft follows `lora.json` (llama-server's greedy run with
//!   the adapter) as it follows `greedy.json` without one.
//! - Synthetic adapters written with weft's GGUF writer and as PEFT directories: both forms give
//!   bit-identical logits; scale 0 is the base model, bit for bit.
//! - Mixed batches, the engine's stack and `zo_seed` keep every row's result exactly what it is
//!   alone.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use weft::gguf::{GgmlType, GgufWriter, Value};
use weft::{block_on, Adapter, Engine, EngineConfig, Sampler};

const REFERENCE_SHA256: &str = "62cee2e327a39558c4c017db385468d505dbcc084caa51714866c8b54b7a85d8";

fn engine(model: &str) -> Engine {
    common::engine(model, 4096)
}

fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lora");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The reference adapter `gen_lora.py OUT 8 1234`, made once per machine.
fn reference_adapter() -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let out = scratch().join("reference_r8_s1234.gguf");
    let sha = |p: &Path| {
        std::fs::read(p)
            .map(|b| {
                Sha256::digest(b)
                    .iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<String>()
            })
            .unwrap_or_default()
    };
    if sha(&out) == REFERENCE_SHA256 {
        return out;
    }
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lora-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv")
            .success();
        assert!(ok, "cannot create {}", venv.display());
    }
    let ok = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "gguf==0.19.0", "numpy==2.4.6"])
        .status()
        .expect("pip")
        .success();
    assert!(ok, "pip install gguf numpy failed");
    let script = common::reference_dir().join("gen_lora.py");
    let ok = Command::new(&python)
        .arg(&script)
        .arg(&out)
        .args(["8", "1234"])
        .status()
        .expect("gen_lora.py")
        .success();
    assert!(ok, "gen_lora.py failed");
    assert_eq!(
        sha(&out),
        REFERENCE_SHA256,
        "gen_lora.py wrote another adapter"
    );
    out
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = max + sum.ln() as f32;
    logits.iter().map(|&l| l - lse).collect()
}

fn argmax(v: &[f32]) -> u32 {
    weft::sampling::argmax(v)
}

/// The logits after the prompt and after each fed token (teacher forcing), or after our own
/// argmax when `feed` is `None`.
fn steps(
    engine: &Engine,
    adapter: Option<&Adapter>,
    prompt: &[u32],
    feed: Option<&[u32]>,
    n: usize,
) -> Vec<Vec<f32>> {
    let mut ctx = engine.context();
    ctx.fill_tokens(prompt).unwrap();
    let mut out = Vec::new();
    for s in 0..n {
        let mut fwd = ctx.forward();
        if let Some(a) = adapter {
            fwd.adapter(a, 1.0);
        }
        let last = fwd.len() - 1;
        let h = fwd.probe(last, weft::Logits);
        let o = block_on(fwd.execute()).unwrap();
        let logits = o.logits(h).unwrap().to_vec();
        let next = feed.map_or_else(|| argmax(&logits), |f| f[s]);
        ctx.fill_tokens(&[next]).unwrap();
        out.push(logits);
    }
    out
}

/// Compares greedy runs with `adapter` against llama.cpp's `cases` (prompt, greedy ids, top-5
/// log-probabilities per step) as `greedy_reference.rs` does without adapters: free-running
/// ids equal until a near-tie, teacher-forced argmax equal where the margin is clear, top-5
/// log-probabilities within `(mean, max)`. Returns how many cases the adapter changed from the
/// base model's greedy ids.
fn compare(
    engine: &Engine,
    adapter: &Adapter,
    cases: &[&serde_json::Value],
    tol: (f32, f32),
) -> usize {
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let (mut worst, mut total, mut n, mut changed) = (0f32, 0f64, 0usize, 0);
    let mut report = Vec::new();
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let prompt_ids = engine.tokenizer().encode(prompt, true, true);
        let greedy = ids(&case["greedy_ids"]);
        let top5: Vec<Vec<(u32, f32)>> = case["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s["top5"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
                    .collect()
            })
            .collect();
        let margin = |s: usize| top5[s][0].1 - top5[s][1].1;
        let free = steps(engine, Some(adapter), &prompt_ids, None, greedy.len());
        let ours: Vec<u32> = free.iter().map(|l| argmax(l)).collect();
        if let Some(s) = (0..greedy.len()).find(|&s| ours[s] != greedy[s]) {
            if margin(s) >= 0.5 {
                report.push(format!(
                    "{prompt:?}: greedy forks at step {s} (margin {})",
                    margin(s)
                ));
            }
        }
        let base = steps(engine, None, &prompt_ids, None, greedy.len());
        let base_ids: Vec<u32> = base.iter().map(|l| argmax(l)).collect();
        changed += usize::from(base_ids != greedy);
        let forced = steps(
            engine,
            Some(adapter),
            &prompt_ids,
            Some(&greedy),
            greedy.len(),
        );
        for (s, logits) in forced.iter().enumerate() {
            let lp = log_softmax(logits);
            if margin(s) >= 0.5 && argmax(logits) != greedy[s] {
                report.push(format!(
                    "{prompt:?} step {s}: argmax differs (margin {})",
                    margin(s)
                ));
            }
            for &(id, want) in &top5[s] {
                let d = (lp[id as usize] - want).abs();
                worst = worst.max(d);
                total += f64::from(d);
                n += 1;
            }
        }
    }
    let mean = (total / n as f64) as f32;
    eprintln!(
        "{}: top-5 log-probs vs llama.cpp: mean |diff| {mean:.4}, max {worst:.4} over {n}",
        adapter.name()
    );
    if mean > tol.0 || worst > tol.1 {
        report.push(format!(
            "log-probs off by mean {mean}, max {worst} (bounds {tol:?})"
        ));
    }
    assert!(
        report.is_empty(),
        "{}: {}",
        adapter.name(),
        report.join("\n")
    );
    changed
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The bounds of the base model's check (`greedy_reference.rs`), which llama.cpp's own
/// variants need: SmolLM2, Gemma 3.
const SMOLLM2_TOL: (f32, f32) = (0.24, 1.3);
const GEMMA3_TOL: (f32, f32) = (0.36, 2.9);

#[test]
fn follows_llama_cpp_with_the_reference_adapter() {
    let engine = engine("smollm2-135m");
    let adapter = engine.load_adapter(&reference_adapter()).unwrap();
    assert_eq!(adapter.rank(), 8);
    let reference = json(&common::reference_dir().join("lora.json"));
    let cases: Vec<&serde_json::Value> = reference["cases"].as_array().unwrap().iter().collect();
    assert!(cases.len() >= 3);
    let changed = compare(&engine, &adapter, &cases, SMOLLM2_TOL);
    assert!(changed > 0, "the adapter changed no greedy continuation");
}

/// A batch of rollouts where each request names its own adapter (RLHF: the policy's LoRA
/// beside the base model) gives each rollout what a generator with that adapter gives alone,
/// and the reference adapter changes at least one greedy continuation.
#[test]
fn rollouts_run_each_requests_own_adapter() {
    use weft::rollout::{generate_batch, RolloutRequest};
    let engine = engine("smollm2-135m");
    let adapter = engine.load_adapter(&reference_adapter()).unwrap();
    let reference = json(&common::reference_dir().join("lora.json"));
    let prompts: Vec<&str> = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["prompt"].as_str().unwrap())
        .collect();
    let request = |p: &str, with: bool| RolloutRequest {
        max_tokens: 16,
        adapters: if with {
            vec![(adapter.clone(), 1.0)]
        } else {
            Vec::new()
        },
        ..RolloutRequest::new(p, Sampler::Argmax)
    };
    let reqs: Vec<RolloutRequest> = prompts
        .iter()
        .flat_map(|p| [request(p, true), request(p, false)])
        .collect();
    let out = block_on(generate_batch(&engine, &reqs)).unwrap();
    let mut changed = 0;
    for (pair, p) in out.chunks(2).zip(&prompts) {
        let alone = |with: bool| {
            let mut ctx = engine.context();
            ctx.fill(p).unwrap();
            let g = ctx.generate(Sampler::Argmax).max_tokens(16);
            let g = if with { g.adapter(&adapter, 1.0) } else { g };
            block_on(g.collect_tokens()).unwrap()
        };
        assert_eq!(pair[0].tokens, alone(true), "{p:?} with the adapter");
        assert_eq!(pair[1].tokens, alone(false), "{p:?} without");
        changed += usize::from(pair[0].tokens != pair[1].tokens);
    }
    assert!(changed > 0, "the adapter changed no rollout");
}

/// Synthetic adapters (ranks 8 and 64, every attention and MLP projection) on both models
/// against llama.cpp with the same files: `tests/fixtures/lora_synthetic.json`, made by
/// `scripts/lora_reference.py` from the adapters this file writes (their SHA-256 is checked).
fn follows_llama_cpp_with_synthetic_adapters(model: &str, tol: (f32, f32)) {
    let engine = engine(model);
    let fixture =
        json(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora_synthetic.json"));
    let all: Vec<&serde_json::Value> = fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["model"] == model)
        .collect();
    let mut adapters: Vec<&str> = all.iter().map(|c| c["adapter"].as_str().unwrap()).collect();
    adapters.dedup();
    assert!(!adapters.is_empty(), "no {model} cases in the fixture");
    for name in adapters {
        let rank: usize = name
            .trim_end_matches(".gguf")
            .rsplit("-r")
            .next()
            .and_then(|r| r.parse().ok())
            .unwrap();
        let path = scratch().join(format!("parity-{name}"));
        synthetic(model, rank, 7 + rank as u64).write_gguf(&path);
        let cases: Vec<&serde_json::Value> = all
            .iter()
            .copied()
            .filter(|c| c["adapter"] == name)
            .collect();
        let sha: String = Sha256::digest(std::fs::read(&path).unwrap())
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect();
        assert_eq!(
            cases[0]["adapter_sha256"].as_str(),
            Some(sha.as_str()),
            "{name}: another adapter than the fixture's"
        );
        let adapter = engine.load_adapter(&path).unwrap();
        let changed = compare(&engine, &adapter, &cases, tol);
        assert!(changed > 0, "{name} changed no greedy continuation");
    }
}

#[test]
fn follows_llama_cpp_with_synthetic_adapters_smollm2() {
    follows_llama_cpp_with_synthetic_adapters("smollm2-135m", SMOLLM2_TOL);
}

#[test]
fn follows_llama_cpp_with_synthetic_adapters_gemma3() {
    follows_llama_cpp_with_synthetic_adapters("gemma3-270m", GEMMA3_TOL);
}

/// Deterministic standard-normal numbers (xorshift64* and Box–Muller).
struct Normal(u64);
impl Normal {
    fn next(&mut self) -> f32 {
        let mut u = || {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let (a, b) = (u(), u());
        ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
    }
}

/// A synthetic adapter: per layer and projection, `A` (`rank × in`) and `B` (`out × rank`),
/// row-major, in the GGUF orientation.
struct Synthetic {
    arch: String,
    alpha: f32,
    rank: usize,
    /// (layer, gguf name, hf name, in, out, A, B)
    pairs: Vec<Pair>,
}

type Pair = (
    usize,
    &'static str,
    &'static str,
    usize,
    usize,
    Vec<f32>,
    Vec<f32>,
);

const PROJS: [(&str, &str); 7] = [
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

fn synthetic(model: &str, rank: usize, seed: u64) -> Synthetic {
    let file = common::open_model(model);
    let arch = file.architecture().unwrap().to_string();
    let n_layers = file.get_u64(&format!("{arch}.block_count")).unwrap() as usize;
    let mut rng = Normal(seed | 1);
    let mut pairs = Vec::new();
    for l in 0..n_layers {
        for (g, hf) in PROJS {
            let info = file.tensor(&format!("blk.{l}.{g}.weight")).unwrap();
            let (n_in, n_out) = (info.shape[0] as usize, info.shape[1] as usize);
            let a: Vec<f32> = (0..rank * n_in)
                .map(|_| rng.next() / (n_in as f32).sqrt())
                .collect();
            let b: Vec<f32> = (0..n_out * rank)
                .map(|_| rng.next() * 0.08 / (rank as f32).sqrt())
                .collect();
            pairs.push((l, g, hf, n_in, n_out, a, b));
        }
    }
    Synthetic {
        arch,
        alpha: 16.0,
        rank,
        pairs,
    }
}

/// A GGUF writer with the metadata of a LoRA adapter for `arch` (llama.cpp's form).
fn adapter_writer(arch: &str) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String(arch.into()));
    w.metadata("general.type", Value::String("adapter".into()));
    w.metadata("adapter.type", Value::String("lora".into()));
    w
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Synthetic {
    fn write_gguf(&self, path: &Path) {
        let mut w = adapter_writer(&self.arch);
        w.metadata("adapter.lora.alpha", Value::F32(self.alpha));
        for (l, g, _, n_in, n_out, a, b) in &self.pairs {
            let r = self.rank as u64;
            w.tensor(
                &format!("blk.{l}.{g}.weight.lora_a"),
                GgmlType::F32,
                &[*n_in as u64, r],
                f32_bytes(a),
            );
            w.tensor(
                &format!("blk.{l}.{g}.weight.lora_b"),
                GgmlType::F32,
                &[r, *n_out as u64],
                f32_bytes(b),
            );
        }
        // Tests run in parallel threads and may write the same file: write a private copy and
        // rename it into place, so a reader never sees a half-written file.
        let tmp = path.with_extension(format!("tmp-{:?}", std::thread::current().id()));
        std::fs::write(&tmp, w.to_bytes()).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    /// The same adapter as Hugging Face stores it: for llama, the rows of q/k `B` in HF's
    /// rotary order (the inverse of the converter's permutation).
    fn write_peft(&self, dir: &Path, n_head: usize, n_head_kv: usize) {
        std::fs::create_dir_all(dir).unwrap();
        let config = serde_json::json!({
            "peft_type": "LORA", "r": self.rank, "lora_alpha": self.alpha,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            "bias": "none", "use_dora": false, "use_rslora": false, "fan_in_fan_out": false,
        });
        std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (l, g, hf, n_in, n_out, a, b) in &self.pairs {
            let prefix = format!("base_model.model.model.layers.{l}.{hf}");
            let mut b = b.clone();
            if self.arch == "llama" && (*g == "attn_q" || *g == "attn_k") {
                let heads = if *g == "attn_q" { n_head } else { n_head_kv };
                b = unpermute_rows(&b, *n_out, self.rank, heads);
            }
            tensors.push((
                format!("{prefix}.lora_A.weight"),
                vec![self.rank, *n_in],
                f32_bytes(a),
            ));
            tensors.push((
                format!("{prefix}.lora_B.weight"),
                vec![*n_out, self.rank],
                f32_bytes(&b),
            ));
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(n, shape, data)| {
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    shape.clone(),
                    data,
                )
                .unwrap();
                (n.clone(), view)
            })
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(dir.join("adapter_model.safetensors"), bytes).unwrap();
    }
}

/// HF row order from the GGUF one: row `h·d + s·d/2 + j` takes GGUF row `h·d + 2j + s`.
fn unpermute_rows(w: &[f32], n_out: usize, cols: usize, heads: usize) -> Vec<f32> {
    let d = n_out / heads;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for j in 0..d / 2 {
            for s in 0..2 {
                let (hf, gg) = (h * d + s * (d / 2) + j, h * d + 2 * j + s);
                out[hf * cols..(hf + 1) * cols].copy_from_slice(&w[gg * cols..(gg + 1) * cols]);
            }
        }
    }
    out
}

/// Logits after a prompt with `adapters` (adapter, scale) on the pass.
fn logits_with(engine: &Engine, adapters: &[(&Adapter, f32)], zo: Option<(u64, f32)>) -> Vec<f32> {
    let mut ctx = engine.context();
    ctx.fill("The weaver threads the loom and").unwrap();
    let mut fwd = ctx.forward();
    for (a, s) in adapters {
        fwd.adapter(a, *s);
    }
    if let Some((seed, sigma)) = zo {
        fwd.zo_seed(seed, sigma);
    }
    let last = fwd.len() - 1;
    let h = fwd.probe(last, weft::Logits);
    let out = block_on(fwd.execute()).unwrap();
    out.logits(h).unwrap().to_vec()
}

fn gguf_and_peft_agree_on(model: &str) {
    let engine = engine(model);
    let info = common::open_model(model);
    let arch = info.architecture().unwrap().to_string();
    let heads = |k: &str| info.get_u64(&format!("{arch}.attention.{k}")).unwrap() as usize;
    let base = logits_with(&engine, &[], None);
    for rank in [8, 64] {
        let syn = synthetic(model, rank, 7 + rank as u64);
        let dir = scratch().join(format!("{model}-r{rank}"));
        let gguf = dir.with_extension("gguf");
        syn.write_gguf(&gguf);
        syn.write_peft(&dir, heads("head_count"), heads("head_count_kv"));
        let a = engine.load_adapter(&gguf).unwrap();
        let b = engine.load_adapter(&dir).unwrap();
        let la = logits_with(&engine, &[(&a, 1.0)], None);
        let lb = logits_with(&engine, &[(&b, 1.0)], None);
        assert!(la == lb, "{model} rank {rank}: GGUF and PEFT forms differ");
        assert!(
            la != base,
            "{model} rank {rank}: the adapter changed nothing"
        );
        assert!(
            logits_with(&engine, &[(&a, 0.0)], None) == base,
            "scale 0 is not the base model"
        );
    }
}

#[test]
fn gguf_and_peft_forms_agree_smollm2() {
    gguf_and_peft_agree_on("smollm2-135m");
}

#[test]
fn gguf_and_peft_forms_agree_gemma3() {
    gguf_and_peft_agree_on("gemma3-270m");
}

/// Loads synthetic rank-16 adapters for `model`.
fn adapters(engine: &Engine, model: &str, n: usize) -> Vec<Adapter> {
    (0..n)
        .map(|i| {
            let path = scratch().join(format!("{model}-r16-{i}.gguf"));
            synthetic(model, 16, 100 + i as u64).write_gguf(&path);
            engine.load_adapter(&path).unwrap()
        })
        .collect()
}

#[test]
fn sixteen_adapters_in_one_batch_equal_each_alone() {
    let model = "smollm2-135m";
    let engine = engine(model);
    let ads = adapters(&engine, model, 12);
    // Contexts 0..12 with their own adapter, 12..16 with none.
    let generate = |i: usize, adapter: Option<&Adapter>| -> Vec<u32> {
        let mut ctx = engine.context();
        ctx.fill(&format!("Story {i}: once upon a time")).unwrap();
        let mut gen = ctx.generate(Sampler::Argmax).max_tokens(12).ignore_eos();
        if let Some(a) = adapter {
            gen = gen.adapter(a, 1.0);
        }
        block_on(gen.collect_tokens()).unwrap()
    };
    let run = |i: usize| generate(i, ads.get(i));
    let alone: Vec<Vec<u32>> = (0..16).map(run).collect();
    let before = engine.metrics();
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..16).map(|i| s.spawn(move || run(i))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = engine.metrics();
    assert_eq!(together, alone);
    let steps = after.steps - before.steps;
    let passes = after.passes - before.passes;
    assert!(
        passes as f64 / steps as f64 >= 8.0,
        "{passes} passes in {steps} model calls"
    );
    // The comparison above means something only if the adapters change what is generated:
    // most of them (these are weak, random rank-16 adapters; a few leave a 12-token greedy
    // continuation as it was) continue differently from the same prompt without an adapter.
    let changed = (0..ads.len())
        .filter(|&i| alone[i] != generate(i, None))
        .count();
    assert!(
        changed * 2 > ads.len(),
        "only {changed} of {} adapters change the continuation",
        ads.len()
    );
}

#[test]
fn the_engine_stack_pushes_pops_and_clears() {
    let model = "smollm2-135m";
    let engine = engine(model);
    let ads = adapters(&engine, model, 2);
    let (a, b) = (&ads[0], &ads[1]);
    let base = logits_with(&engine, &[], None);
    let only_a = logits_with(&engine, &[(a, 1.0)], None);
    let a_and_b = logits_with(&engine, &[(a, 1.0), (b, 0.5)], None);
    engine.push_lora(a, 1.0).unwrap();
    assert!(logits_with(&engine, &[], None) == only_a);
    engine.push_lora(b, 0.5).unwrap();
    assert_eq!(engine.lora_stack().len(), 2);
    assert!(logits_with(&engine, &[], None) == a_and_b);
    assert!(a_and_b != only_a);
    let (popped, scale) = engine.pop_lora().unwrap();
    assert!(popped == *b && scale == 0.5);
    assert!(logits_with(&engine, &[], None) == only_a);
    // A pass naming its own adapter ignores the stack.
    assert!(logits_with(&engine, &[(b, 0.5)], None) != only_a);
    engine.clear_loras();
    assert!(logits_with(&engine, &[], None) == base);
    // A scale that is no number is refused before the pass runs (it made every logit NaN).
    for scale in [f32::NAN, f32::INFINITY] {
        let mut ctx = engine.context();
        ctx.fill("The weaver").unwrap();
        let mut fwd = ctx.forward();
        fwd.adapter(a, scale);
        let failed = block_on(fwd.execute());
        assert!(
            matches!(&failed, Err(weft::Error::Config(m)) if m.contains("finite")),
            "{failed:?}"
        );
        // Pushed, it is refused at the push, and the stack stays as it was.
        let pushed = engine.push_lora(a, scale);
        assert!(matches!(pushed, Err(weft::Error::Config(_))), "{pushed:?}");
        assert!(engine.lora_stack().is_empty());
        assert_eq!(block_on(ctx.flush_logits()).unwrap().len(), base.len());
    }
}

/// An adapter is checked against the model of the engine a pass runs on, not only the one
/// that loaded it: on an engine of another model it is a typed error (it was an assertion
/// failure in the scheduler's thread, which stopped that engine for good), and on another
/// engine of the same model it works as on its own.
#[test]
fn an_adapter_from_another_engine_is_checked_against_this_model() {
    let smollm2 = engine("smollm2-135m");
    let a = &adapters(&smollm2, "smollm2-135m", 1)[0];
    let gemma = engine("gemma3-270m");
    let base = logits_with(&gemma, &[], None);
    let mut ctx = gemma.context();
    ctx.fill("The weaver").unwrap();
    let mut fwd = ctx.forward();
    fwd.adapter(a, 1.0);
    let failed = block_on(fwd.execute());
    let wrong = |e: Option<&weft::Error>| {
        matches!(e, Some(weft::Error::Core(weft_core::Error::BadAdapter { reason }))
            if reason.contains("adapter for llama models, the base model is gemma3"))
    };
    assert!(wrong(failed.as_ref().err()), "{failed:?}");
    let failed = block_on(
        ctx.generate(Sampler::Argmax)
            .adapter(a, 1.0)
            .max_tokens(2)
            .collect_text(),
    );
    assert!(wrong(failed.as_ref().err()), "{failed:?}");
    let pushed = gemma.push_lora(a, 1.0);
    assert!(wrong(pushed.as_ref().err()), "{pushed:?}");
    assert!(gemma.lora_stack().is_empty());
    assert!(logits_with(&gemma, &[], None) == base);

    let twin = engine("smollm2-135m");
    assert!(logits_with(&twin, &[(a, 1.0)], None) == logits_with(&smollm2, &[(a, 1.0)], None));
}

#[test]
fn zo_seed_perturbs_deterministically() {
    let model = "smollm2-135m";
    let engine = engine(model);
    let ads = adapters(&engine, model, 1);
    let a = &ads[0];
    let plain = logits_with(&engine, &[(a, 1.0)], None);
    let s1 = logits_with(&engine, &[(a, 1.0)], Some((1, 0.01)));
    assert!(s1 == logits_with(&engine, &[(a, 1.0)], Some((1, 0.01))));
    assert!(s1 != plain);
    let s2 = logits_with(&engine, &[(a, 1.0)], Some((2, 0.01)));
    assert!(s2 != s1);
    assert!(logits_with(&engine, &[(a, 1.0)], Some((1, 0.0))) == plain);
    // (The antithetic pair is checked where it is exact to first order: weft-core's
    // lora::apply tests. Through 30 layers, SmolLM2's huge activations on the first token
    // make even a tiny perturbation visible in the logits.)
    // A batch mixing seeds: each row equals its pass alone.
    let engine_ref = &engine;
    let together: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = [1u64, 2, 3, 1]
            .into_iter()
            .map(|seed| s.spawn(move || logits_with(engine_ref, &[(a, 1.0)], Some((seed, 0.01)))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(together[0] == s1 && together[1] == s2 && together[3] == s1);
    // zo_seed without an adapter is an error, not a silent no-op.
    let mut ctx = engine.context();
    ctx.fill("x").unwrap();
    let mut fwd = ctx.forward();
    fwd.zo_seed(1, 0.1);
    assert!(matches!(
        block_on(fwd.execute()),
        Err(weft::Error::Config(_))
    ));
}

#[test]
fn bad_adapters_are_typed_errors() {
    let smol = engine("smollm2-135m");
    // An adapter for the other model.
    let gemma_adapter = scratch().join("gemma-for-smol.gguf");
    synthetic("gemma3-270m", 4, 1).write_gguf(&gemma_adapter);
    let e = smol.load_adapter(&gemma_adapter).unwrap_err();
    assert!(
        e.to_string().contains("gemma3") && e.to_string().contains("llama"),
        "{e}"
    );
    // A truncated file.
    let good = scratch().join("smol-r4.gguf");
    synthetic("smollm2-135m", 4, 2).write_gguf(&good);
    let bytes = std::fs::read(&good).unwrap();
    let cut = scratch().join("smol-r4-cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = smol.load_adapter(&cut).unwrap_err();
    assert!(matches!(e, weft::Error::Core(_)), "{e}");
    // A rank mismatch between A and B.
    let mut syn = synthetic("smollm2-135m", 4, 3);
    let (_, _, _, _, n_out, _, b) = &mut syn.pairs[5];
    b.truncate(*n_out * 3);
    syn.rank = 4;
    let bad_rank = scratch().join("smol-rank-mismatch.gguf");
    {
        // Write B with rank 3 by hand.
        let mut w = adapter_writer("llama");
        let (l, g, _, n_in, n_out, a, b) = &syn.pairs[5];
        w.tensor(
            &format!("blk.{l}.{g}.weight.lora_a"),
            GgmlType::F32,
            &[*n_in as u64, 4],
            f32_bytes(a),
        );
        w.tensor(
            &format!("blk.{l}.{g}.weight.lora_b"),
            GgmlType::F32,
            &[3, *n_out as u64],
            f32_bytes(b),
        );
        std::fs::write(&bad_rank, w.to_bytes()).unwrap();
    }
    let e = smol.load_adapter(&bad_rank).unwrap_err();
    assert!(e.to_string().contains("invalid LoRA adapter"), "{e}");
    // A PEFT directory asking for DoRA.
    let dora = scratch().join("dora");
    synthetic("smollm2-135m", 4, 4).write_peft(&dora, 9, 3);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dora.join("adapter_config.json")).unwrap()).unwrap();
    config["use_dora"] = true.into();
    std::fs::write(dora.join("adapter_config.json"), config.to_string()).unwrap();
    let e = smol.load_adapter(&dora).unwrap_err();
    assert!(e.to_string().contains("DoRA"), "{e}");
    // An alpha no trained adapter has: it loaded and silently turned the output into noise.
    for alpha in [f32::NAN, f32::INFINITY, 1e30] {
        let mut syn = synthetic("smollm2-135m", 4, 5);
        syn.alpha = alpha;
        let path = scratch().join(format!("smol-alpha-{alpha}.gguf"));
        syn.write_gguf(&path);
        let e = smol.load_adapter(&path).unwrap_err();
        assert!(
            matches!(&e, weft::Error::Core(weft_core::Error::BadAdapter { reason })
                if reason.contains("alpha")),
            "{alpha}: {e}"
        );
    }
}

/// Edits the `adapter_config.json` of a PEFT directory.
fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("adapter_config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, config.to_string()).unwrap();
}

/// What PEFT would do with a file, or a clear refusal: values f16 cannot hold, a `lora_B`
/// without its `lora_A`, PEFT's defaults for `lora_alpha`, and config keys weft does not
/// implement.
#[test]
fn adapter_values_and_configs_are_read_as_peft_means_them() {
    let smol = engine("smollm2-135m");
    let (n_head, n_head_kv) = (9, 3);
    // A NaN, an infinity, or a value beyond f16's range in a matrix: refused, naming it.
    for (i, bad) in [f32::NAN, f32::INFINITY, 1e6].into_iter().enumerate() {
        let mut syn = synthetic("smollm2-135m", 4, 20 + i as u64);
        syn.pairs[3].5[7] = bad;
        let path = scratch().join(format!("smol-nonfinite-{i}.gguf"));
        syn.write_gguf(&path);
        let e = smol.load_adapter(&path).unwrap_err();
        assert!(e.to_string().contains("lora_A holds"), "{e}");
        let dir = scratch().join(format!("smol-nonfinite-{i}"));
        syn.write_peft(&dir, n_head, n_head_kv);
        let e = smol.load_adapter(&dir).unwrap_err();
        assert!(e.to_string().contains("f16 storage"), "{e}");
    }
    // A lora_B without its lora_A.
    let orphan = scratch().join("smol-orphan-b.gguf");
    {
        let syn = synthetic("smollm2-135m", 4, 30);
        let mut w = adapter_writer("llama");
        for (k, (l, g, _, n_in, n_out, a, b)) in syn.pairs.iter().take(2).enumerate() {
            if k == 0 {
                w.tensor(
                    &format!("blk.{l}.{g}.weight.lora_a"),
                    GgmlType::F32,
                    &[*n_in as u64, 4],
                    f32_bytes(a),
                );
            }
            w.tensor(
                &format!("blk.{l}.{g}.weight.lora_b"),
                GgmlType::F32,
                &[4, *n_out as u64],
                f32_bytes(b),
            );
        }
        std::fs::write(&orphan, w.to_bytes()).unwrap();
    }
    let e = smol.load_adapter(&orphan).unwrap_err();
    assert!(
        e.to_string().contains("has no blk.0.attn_k.weight.lora_a"),
        "{e}"
    );
    // lora_alpha: missing means PEFT's default 8; 0 means a zero delta.
    let syn = synthetic("smollm2-135m", 4, 31);
    let base = logits_with(&smol, &[], None);
    let eight = scratch().join("smol-alpha-8");
    syn.write_peft(&eight, n_head, n_head_kv);
    edit_config(&eight, |c| {
        c.insert("lora_alpha".into(), 8.into());
    });
    let missing = scratch().join("smol-alpha-missing");
    syn.write_peft(&missing, n_head, n_head_kv);
    edit_config(&missing, |c| {
        c.remove("lora_alpha");
    });
    let zero = scratch().join("smol-alpha-0");
    syn.write_peft(&zero, n_head, n_head_kv);
    edit_config(&zero, |c| {
        c.insert("lora_alpha".into(), 0.into());
    });
    let with = |dir: &Path| logits_with(&smol, &[(&smol.load_adapter(dir).unwrap(), 1.0)], None);
    let at_eight = with(&eight);
    assert!(at_eight != base);
    assert!(with(&missing) == at_eight, "a missing lora_alpha is not 8");
    assert!(with(&zero) == base, "lora_alpha 0 is not a zero delta");
    // Config keys: an empty modules_to_save is harmless; other PEFT types, layer replication
    // and a rank that is not a positive integer are refused.
    let dir = scratch().join("smol-config-keys");
    syn.write_peft(&dir, n_head, n_head_kv);
    edit_config(&dir, |c| {
        c.insert("modules_to_save".into(), serde_json::json!([]));
    });
    assert!(smol.load_adapter(&dir).is_ok());
    let refused: [(&str, serde_json::Value, &str); 3] = [
        ("peft_type", "IA3".into(), "IA3 adapter"),
        (
            "layer_replication",
            serde_json::json!([[0, 4]]),
            "layer_replication",
        ),
        ("r", 4.5.into(), "positive integer"),
    ];
    for (key, value, says) in refused {
        syn.write_peft(&dir, n_head, n_head_kv);
        edit_config(&dir, |c| {
            c.insert(key.into(), value);
        });
        let e = smol.load_adapter(&dir).unwrap_err();
        assert!(e.to_string().contains(says), "{key}: {e}");
    }
}

/// The prefix cache keys pages by the adapters that wrote them: a context with the same adapter
/// attaches them, one without (or with another) computes its own, and every output equals an
/// engine's without the cache.
#[test]
fn prefix_cache_pages_belong_to_their_adapter() {
    let model = "smollm2-135m";
    let cached = engine(model);
    let uncached = common::engine_with(
        model,
        EngineConfig {
            n_threads: 2,
            kv_tokens: 4096,
            prefix_cache: false,
            ..EngineConfig::default()
        },
    );
    let ads = adapters(&cached, model, 2);
    let path_b = scratch().join(format!("{model}-r16-1.gguf"));
    let b_uncached = uncached.load_adapter(&path_b).unwrap();
    let a_uncached = uncached
        .load_adapter(&scratch().join(format!("{model}-r16-0.gguf")))
        .unwrap();
    let prompt = "The loom is one of the oldest machines people have built. ".repeat(8);
    let run = |engine: &Engine, adapter: Option<&Adapter>| {
        let mut ctx = engine.context();
        ctx.fill(&prompt).unwrap();
        let mut fwd = ctx.forward();
        if let Some(a) = adapter {
            fwd.adapter(a, 1.0);
        }
        let last = fwd.len() - 1;
        let h = fwd.probe(last, weft::Logits);
        block_on(fwd.execute()).unwrap().logits(h).unwrap().to_vec()
    };
    let hits = |e: &Engine| e.metrics().prefix_hit_tokens;
    let with_a = run(&cached, Some(&ads[0]));
    assert_eq!(hits(&cached), 0);
    assert!(run(&cached, Some(&ads[0])) == with_a);
    let after_a = hits(&cached);
    assert!(
        after_a >= 64,
        "the same adapter attaches the pages ({after_a})"
    );
    let base = run(&cached, None);
    let with_b = run(&cached, Some(&ads[1]));
    assert_eq!(
        hits(&cached),
        after_a,
        "pages of another adapter are not attached"
    );
    assert!(base == run(&uncached, None));
    assert!(with_a == run(&uncached, Some(&a_uncached)));
    assert!(with_b == run(&uncached, Some(&b_uncached)));
}
