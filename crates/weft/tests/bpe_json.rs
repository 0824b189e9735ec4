//! BPE `tokenizer.json` files against Hugging Face `tokenizers`: SmolLM2's byte-level BPE (as
//! transformers converts it, and with the Digits + ByteLevel pre-tokenizer of HuggingFaceTB's
//! own file) and Gemma 3's SentencePiece-style BPE with byte fallback.
//!
//! The files are not committed (Gemma's is 33 MB): on first use this test makes them from the
//! models' GGUF files with transformers' GGUF conversion (`scripts/bpe_tokenize_reference.py`)
//! in the suites' virtualenv under the target directory (`target/py-venv`, pinned: the sha256s
//! depend on its packages, `weft_testkit::HF_PACKAGES`), into
//! `target/bpe-tokenizers/`, and checks their sha256 against the fixture
//! (`tests/fixtures/bpe_tokenize.json`, HF's ids for every case). Later runs reuse them.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use sha2::{Digest, Sha256};
use weft::tokenizer::PreTokenizer;
use weft::{block_on, Engine, EngineConfig, Sampler, Tokenizer};
use weft_testkit::{python, run, target_dir, workspace_root};

const NAMES: [&str; 3] = ["smollm2-135m", "smollm2-135m-digits", "gemma3-270m"];

fn fixture() -> &'static Value {
    static FIXTURE: OnceLock<Value> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bpe_tokenize.json");
        let text = std::fs::read_to_string(&path).expect("bpe_tokenize.json");
        serde_json::from_str(&text).expect("fixture JSON")
    })
}

fn sha256(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(format!("{:x}", Sha256::digest(&bytes)))
}

/// The path of tokenizer.json `name`, made first if missing or not the fixture's file.
fn tokenizer_path(name: &str) -> PathBuf {
    static MAKE: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MAKE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir().join("bpe-tokenizers");
    let path_of = |n: &str| dir.join(format!("{n}.tokenizer.json"));
    let want = |n: &str| fixture()["models"][n]["sha256"].as_str().expect("sha256");
    if NAMES
        .iter()
        .any(|n| sha256(&path_of(n)).as_deref() != Some(want(n)))
    {
        let (smollm2, gemma3) = (
            common::model_path("smollm2-135m"),
            common::model_path("gemma3-270m"),
        );
        run(
            Command::new(python())
                .arg(workspace_root().join("scripts/bpe_tokenize_reference.py"))
                .arg("make")
                .args([&smollm2, &gemma3, &dir])
                .env("PYTHONDONTWRITEBYTECODE", "1"),
            "scripts/bpe_tokenize_reference.py make",
        );
        for n in NAMES {
            let got = sha256(&path_of(n));
            assert_eq!(
                got.as_deref(),
                Some(want(n)),
                "{n}: the tokenizer.json made here is not the one the fixture was made from"
            );
        }
    }
    path_of(name)
}

fn json_text(name: &str) -> String {
    std::fs::read_to_string(tokenizer_path(name)).expect("read tokenizer.json")
}

fn json_tokenizer(name: &str) -> &'static Tokenizer {
    static CACHE: Mutex<Vec<(String, &'static Tokenizer)>> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, t)) = cache.iter().find(|(n, _)| n == name) {
        return t;
    }
    let tok = Tokenizer::from_json(&json_text(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let tok: &'static Tokenizer = Box::leak(Box::new(tok));
    cache.push((name.to_string(), tok));
    tok
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn cases(name: &str) -> &'static [Value] {
    fixture()["models"][name]["cases"]
        .as_array()
        .expect("cases")
}

/// The ids around the first difference of `a` and `b`.
fn diff_window<'a>(a: &'a [u32], b: &'a [u32]) -> (&'a [u32], &'a [u32]) {
    let first = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let from = first.saturating_sub(3);
    (
        &a[from..a.len().min(first + 8)],
        &b[from..b.len().min(first + 8)],
    )
}

/// Our ids equal HF's for every case (special tokens parsed and not), streaming our ids gives
/// HF's decoded text, and decoding them gives the text back (as HF does: it too turns a
/// literal `▁` into a space in Gemma's text).
fn check_against_hf(name: &str) {
    let tok = json_tokenizer(name);
    let mut failures = Vec::new();
    for case in cases(name) {
        let text = case["text"].as_str().expect("text");
        let hf_decoded = case["decoded"].as_str().expect("decoded");
        if hf_decoded != text && !(name.starts_with("gemma") && text.contains('\u{2581}')) {
            failures.push(format!(
                "HF itself does not round-trip {text:?}: {hf_decoded:?}"
            ));
        }
        for (parse, field) in [(true, "ids"), (false, "ids_no_special")] {
            let got = tok.encode(text, true, parse);
            let want = ids(&case[field]);
            if got != want {
                let (w, g) = diff_window(&want, &got);
                failures.push(format!("{field} {text:?}\n  HF   {w:?}\n  weft {g:?}"));
            }
            let back = tok.decode(&got).expect("decode");
            if back != hf_decoded {
                failures.push(format!("round trip {field} {text:?} gave {back:?}"));
            }
        }
        // HF's decode renders every token, BOS included: so does the stream decoder.
        let mut stream = tok.stream_decoder(true);
        let mut streamed = String::new();
        for id in tok.encode(text, false, true) {
            streamed.push_str(&stream.push(id).expect("push"));
        }
        streamed.push_str(&stream.finish());
        if streamed != hf_decoded {
            failures.push(format!(
                "decode {text:?}: HF {hf_decoded:?}, weft {streamed:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(cases(name).len() > 90);
}

#[test]
fn smollm2_json_matches_hf_tokenizers() {
    check_against_hf("smollm2-135m");
}

#[test]
fn smollm2_digits_json_matches_hf_tokenizers() {
    check_against_hf("smollm2-135m-digits");
}

#[test]
fn gemma3_json_matches_hf_tokenizers() {
    check_against_hf("gemma3-270m");
}

/// The tokenizer from tokenizer.json and the one from the GGUF (llama.cpp's rules) give the
/// same ids on every case, and agree on the vocabulary size and the special tokens.
///
/// Two known divergences between HF's rules and llama.cpp's are skipped:
/// - transformers' conversion gives SmolLM2 GPT-2's ByteLevel split alone, without the digit
///   split of llama.cpp's "smollm" pre-tokenizer (and of HuggingFaceTB's file); they differ on
///   non-ASCII numerals and on whitespace before digits. Cases where HF's ids for the converted
///   file and for the Digits one differ are skipped for the converted file only.
/// - Gemma's GGUF stores its space-run tokens with real spaces (`"   "`), which llama.cpp
///   matches in the raw text; transformers spells them `"▁▁▁"`, as SentencePiece does, so to HF
///   a `▁` typed in the text is a space, and to llama.cpp it is not. Texts holding `▁` are
///   skipped for Gemma.
#[test]
fn json_and_gguf_tokenizers_agree() {
    let digits_ids: Vec<&Value> = cases("smollm2-135m-digits")
        .iter()
        .map(|c| &c["ids_no_special"])
        .collect();
    for (name, model) in [
        ("smollm2-135m", "smollm2-135m"),
        ("smollm2-135m-digits", "smollm2-135m"),
        ("gemma3-270m", "gemma3-270m"),
    ] {
        let json = json_tokenizer(name);
        let gguf = Tokenizer::from_gguf(&common::open_model(model)).expect("gguf tokenizer");
        assert_eq!(json.vocab_size(), gguf.vocab_size(), "{name}");
        assert_eq!(
            json.vocab().special().add_bos,
            gguf.vocab().special().add_bos
        );
        let mut failures = Vec::new();
        let mut skipped = 0;
        for (i, case) in cases(name).iter().enumerate() {
            let text = case["text"].as_str().expect("text");
            if (name == "smollm2-135m" && &case["ids_no_special"] != digits_ids[i])
                || (name == "gemma3-270m" && text.contains('\u{2581}'))
            {
                skipped += 1;
                continue;
            }
            for parse in [true, false] {
                let (a, b) = (
                    json.encode(text, true, parse),
                    gguf.encode(text, true, parse),
                );
                if a != b {
                    failures.push(format!(
                        "{text:?} parse_special={parse}\n  json {:?}\n  gguf {:?}",
                        diff_window(&a, &b).0,
                        diff_window(&a, &b).1
                    ));
                }
            }
        }
        assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
        assert!(skipped <= 3, "{name}: {skipped} cases skipped");
    }
}

/// weft's hand-written GPT-2 and Llama 3 splitters give the words HF's regex engine gives.
#[test]
fn split_regexes_match_hf() {
    for (name, pre) in [
        ("gpt2", PreTokenizer::Gpt2),
        ("llama3", PreTokenizer::Llama3),
    ] {
        let cases = fixture()["split_regexes"][name]["cases"]
            .as_array()
            .expect("cases");
        for case in cases {
            let text = case["text"].as_str().expect("text");
            let want: Vec<&str> = case["words"]
                .as_array()
                .expect("words")
                .iter()
                .map(|w| w.as_str().expect("word"))
                .collect();
            assert_eq!(pre.split(text), want, "{name}: {text:?}");
        }
    }
}

/// SmolLM2 from bytes with its tokenizer.json generates the same greedy tokens as from its file.
#[test]
fn engine_from_bytes_with_tokenizer_json_matches_engine_open() {
    let config = EngineConfig {
        n_threads: 2,
        kv_tokens: 512,
        ..EngineConfig::default()
    };
    let path = common::model_path("smollm2-135m");
    let bytes = std::fs::read(&path).expect("read model");
    let json = json_text("smollm2-135m");
    let from_bytes = Engine::from_bytes(bytes, Some(&json), config.clone()).expect("from_bytes");
    let from_file = Engine::open(&path, config).expect("open");
    assert_eq!(
        from_bytes.stop_tokens().len(),
        from_file.stop_tokens().len()
    );
    for id in from_file.stop_tokens() {
        assert!(from_bytes.is_eos(*id), "stop token {id}");
    }
    let prompt =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let generate = |engine: &Engine| {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        let tokens = block_on(
            ctx.generate(Sampler::Argmax)
                .max_tokens(16)
                .collect_tokens(),
        )
        .expect("generate");
        (ctx.tokens().to_vec(), tokens)
    };
    let (a, b) = (generate(&from_bytes), generate(&from_file));
    assert_eq!(a, b);
    assert_eq!(
        from_bytes.detokenize(&a.1).expect("detokenize"),
        from_file.detokenize(&b.1).expect("detokenize")
    );
}

/// A tokenizer with more tokens than the model has embeddings is refused.
#[test]
fn engine_from_bytes_refuses_a_larger_vocabulary() {
    let path = common::model_path("smollm2-135m");
    let bytes = std::fs::read(&path).expect("read model");
    let json = json_text("gemma3-270m");
    let config = EngineConfig {
        n_threads: 1,
        kv_tokens: 64,
        ..EngineConfig::default()
    };
    let err = Engine::from_bytes(bytes, Some(&json), config).expect_err("262144 > 49152 tokens");
    assert!(err.to_string().contains("262144"), "{err}");
}
