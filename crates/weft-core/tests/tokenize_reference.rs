//! Tokenization matches llama.cpp exactly on every case of `shared/reference/tokenize.json`
//! and of `tests/fixtures/markup_tokenize.json` (angle-bracket markup, made by
//! `scripts/markup_tokenize_reference.py`), for both real models, with special-token parsing on
//! and off; decoding round-trips.

use crate::common;

use weft_core::tokenizer::Tokenizer;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn check_model(name: &str, key: &str) {
    check_cases(name, key, &common::reference_json("tokenize.json"));
}

fn markup_fixture() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/markup_tokenize.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// Compares `Tokenizer::encode` (model's BOS rule, special parsing on and off) with the ids of
/// every case of a reference file, and checks that decoding gives the text back.
fn check_cases(name: &str, key: &str, reference: &serde_json::Value) {
    let file = common::open_model(name);
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "reference file lost its cases");
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        for (parse_special, field) in [
            (true, format!("{key}_ids")),
            (false, format!("{key}_ids_no_special")),
        ] {
            let expected = ids(&case[field.as_str()]);
            let got = tok.encode(text, true, parse_special);
            if got != expected {
                failures.push(format!(
                    "{name} parse_special={parse_special} {text:?}\n  expected {expected:?}\n  got      {got:?}"
                ));
            }
            // Decoding renders special tokens, so parsed and unparsed ids both give the text.
            let decoded = tok.decode(&got).expect("decode");
            if decoded != text {
                failures.push(format!("{name} round trip {text:?} gave {decoded:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model("smollm2-135m", "smollm2");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model("gemma3-270m", "gemma3");
}

/// Tags such as `</s>` inside runs of other tags, Gemma's control tokens as text, and near
/// misses, against llama.cpp's ids for the same GGUF files.
#[test]
fn markup_matches_llama_cpp() {
    let fixture = markup_fixture();
    for (name, key) in common::MODELS {
        check_cases(name, key, &fixture);
    }
}

/// The tokens a generation stops on are llama.cpp's: EOS and every token on its
/// end-of-generation list of texts (`llama-vocab.cpp`, `special_eog_ids`), Gemma 3's `</s>`
/// among them (weft's shorter list let a Gemma 3 generation run on past it).
#[test]
fn end_of_generation_tokens_are_llama_cpps() {
    for (name, expected) in [
        ("smollm2-135m", &["<|endoftext|>", "<|im_end|>"][..]),
        ("gemma3-270m", &["<eos>", "<end_of_turn>", "</s>"][..]),
    ] {
        let tok = Tokenizer::from_gguf(&common::open_model(name)).expect("tokenizer");
        let mut got: Vec<&str> = tok
            .vocab()
            .eog()
            .iter()
            .map(|&id| tok.vocab().text(id).expect("an id of the vocabulary"))
            .collect();
        got.sort_unstable();
        let mut expected = expected.to_vec();
        expected.sort_unstable();
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn stream_decoder_matches_decode_and_never_splits_characters() {
    let reference = common::reference_json("tokenize.json");
    for (name, _) in common::MODELS {
        let file = common::open_model(name);
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        for case in reference["cases"].as_array().expect("cases") {
            let text = case["text"].as_str().expect("text");
            let ids = tok.encode(text, false, true);
            let mut stream = tok.stream_decoder(true);
            let mut joined = String::new();
            for &id in &ids {
                // Each delta is a String, so it is valid UTF-8 by construction; what matters
                // is that no U+FFFD appears where the whole text has none.
                joined.push_str(&stream.push(id).expect("push"));
            }
            joined.push_str(&stream.finish());
            assert_eq!(
                joined,
                tok.decode(&ids).expect("decode"),
                "{name}: {text:?}"
            );
            assert!(
                !joined.contains('\u{FFFD}'),
                "{name}: {text:?} split a character"
            );
        }
    }
}
