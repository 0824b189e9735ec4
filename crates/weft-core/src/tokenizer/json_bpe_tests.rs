//! Tests of the BPE `tokenizer.json` loader on small files, against Hugging Face `tokenizers`.

use serde_json::{json, Value};

use super::super::Tokenizer;
use super::{GPT2_REGEX, LLAMA3_REGEX};
use crate::error::Error;

fn added(id: u32, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": special})
}

/// A Llama 2 style file: Metaspace, byte fallback, fused unknown token, BOS template,
/// decoder ending in Strip.
fn llama_style() -> Value {
    json!({
        "added_tokens": [added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": false},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true,
            "byte_fallback": true, "ignore_merges": false,
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5,
                      "a": 6, "b": 7, "▁a": 8, "ab": 9, "▁ab": 10, "c": 11, "<0x41>": 12},
            "merges": ["▁ a", "a b", "▁a b"]}
    })
}

/// A byte-level file with a Sequence of Digits and ByteLevel (prefix space), a lowercase
/// normalizer, `ignore_merges`, pair merges, and added tokens with lstrip/rstrip,
/// single_word and normalized set.
fn byte_level_style() -> Value {
    let mut vocab = serde_json::Map::new();
    for t in "abcdeĠ0123<>/".chars().map(String::from).chain(
        [
            "Ġa", "ab", "Ġab", "12", "Ġ1", "abc", "Ġabcde", "<mask>", "<x>",
        ]
        .map(String::from),
    ) {
        vocab.insert(t, json!(vocab.len()));
    }
    let mut mask = added(20, "<mask>", true);
    mask["lstrip"] = json!(true);
    mask["rstrip"] = json!(true);
    let mut x = added(21, "<x>", false);
    x["single_word"] = json!(true);
    let mut dd = added(22, "DD", false);
    dd["normalized"] = json!(true);
    json!({
        "added_tokens": [mask, x, dd],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": false},
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
             "use_regex": true}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": true, "vocab": vocab,
            "merges": [["Ġ", "a"], ["a", "b"], ["Ġa", "b"], ["1", "2"], ["Ġ", "1"],
                       ["ab", "c"]]}
    })
}

fn load(v: &Value) -> Tokenizer {
    Tokenizer::from_json(&v.to_string()).expect("tokenizer")
}

/// Expected ids and texts are Hugging Face tokenizers 0.23.3's for the same file (texts:
/// its decode with the leading BOS left out, other special tokens rendered, as weft's
/// `decode` does).
#[test]
fn llama_style_file_matches_the_library() {
    let tok = load(&llama_style());
    for (text, ids, decoded) in [
        ("ab ab", &[1, 10, 10][..], "ab ab"),
        ("é ab", &[1, 5, 3, 4, 10], "é ab"),
        ("xyz ab", &[1, 5, 0, 10], "<unk> ab"),
        ("ab</s>ab", &[1, 10, 2, 9], "ab</s>ab"),
        (" ab", &[1, 10], "ab"),
        ("A", &[1, 5, 12], "A"),
        ("", &[1], ""),
        ("abc", &[1, 10, 11], "abc"),
    ] {
        assert_eq!(tok.encode(text, true, true), ids, "{text:?}");
        assert_eq!(tok.decode(ids).unwrap(), decoded, "{text:?}");
    }
    // Special-token text as plain text: `</s>` is spelled out (no such pieces: unknown).
    assert_eq!(tok.encode("ab</s>", false, false), [10, 0]);
}

/// Expected ids are Hugging Face tokenizers 0.23.3's for the same file.
#[test]
fn byte_level_file_matches_the_library() {
    let tok = load(&byte_level_style());
    for (text, ids) in [
        ("ab abc", &[15, 15, 2][..]),
        ("abcde", &[19]),
        ("AB 123", &[15, 5, 5, 16, 9]),
        ("a <mask> b", &[13, 20, 5, 1]),
        ("a<x>b <x> c", &[13, 10, 11, 1, 5, 21, 5, 2]),
        ("dd", &[22]),
        ("xa", &[13]),
        ("aDDb", &[13, 22, 5, 1]),
        ("12ab", &[5, 16, 15]),
    ] {
        assert_eq!(tok.encode(text, true, true), ids, "{text:?}");
    }
    assert_eq!(tok.decode(&[15, 15, 2]).unwrap(), " ab abc");
    assert_eq!(tok.vocab_size(), 23);
}

fn error(v: &Value) -> Error {
    Tokenizer::from_json(&v.to_string()).expect_err("must be refused")
}

#[test]
fn malformed_files_are_bad_tokenizers() {
    let base = llama_style();
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut edit = |what: &'static str, f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        cases.push((what, v));
    };
    edit("vocab not an object", &|v| {
        v["model"]["vocab"] = json!([1, 2])
    });
    edit("merge of unknown token", &|v| {
        v["model"]["merges"] = json!(["▁ z"])
    });
    edit("merge without space", &|v| {
        v["model"]["merges"] = json!(["ab"])
    });
    edit("merge result unknown", &|v| {
        v["model"]["merges"] = json!(["b a"])
    });
    edit("merge of three", &|v| {
        v["model"]["merges"] = json!([["a", "b", "c"]])
    });
    edit("merges not a list", &|v| {
        v["model"]["merges"] = json!({"a": 1})
    });
    edit("id out of range", &|v| {
        v["model"]["vocab"]["c"] = json!(1_000_000)
    });
    edit("negative id", &|v| v["model"]["vocab"]["c"] = json!(-1));
    edit("duplicate id", &|v| v["model"]["vocab"]["c"] = json!(6));
    edit("unk missing", &|v| {
        v["model"]["unk_token"] = json!("<nope>")
    });
    edit("added id clash", &|v| v["added_tokens"][0]["id"] = json!(6));
    edit("added without content", &|v| {
        v["added_tokens"][0] = json!({"id": 0})
    });
    edit("template without ids", &|v| {
        v["post_processor"]["special_tokens"]["<s>"]["ids"] = json!([])
    });
    edit("metaspace replacement", &|v| {
        v["pre_tokenizer"]["replacement"] = json!("ab")
    });
    edit("split behavior", &|v| {
        v["pre_tokenizer"] = json!({"type": "Split", "pattern": {"String": " "}})
    });
    edit("empty vocab", &|v| {
        v["model"]["vocab"] = json!({});
        v["model"]["merges"] = json!([]);
        v["model"]["unk_token"] = json!(null);
        v["added_tokens"] = json!([]);
        v["post_processor"] = json!(null);
    });
    for (what, v) in cases {
        assert!(
            matches!(error(&v), Error::BadTokenizer { .. }),
            "{what}: {:?}",
            error(&v)
        );
    }
    assert!(matches!(
        Tokenizer::from_json("{\"model\": "),
        Err(Error::BadTokenizer { .. })
    ));
}

#[test]
fn unsupported_components_are_refused() {
    let base = llama_style();
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut edit = |what: &'static str, f: &dyn Fn(&mut Value)| {
        let mut v = base.clone();
        f(&mut v);
        cases.push((what, v));
    };
    edit("dropout", &|v| v["model"]["dropout"] = json!(0.1));
    edit("model type", &|v| v["model"]["type"] = json!("Unigram"));
    edit("normalizer", &|v| {
        v["normalizer"] = json!({"type": "Precompiled"})
    });
    edit(
        "regex replace",
        &|v| {
            v["normalizer"] = json!({"type": "Replace", "pattern": {"Regex": " +"}, "content": " "})
        },
    );
    edit("pre_tokenizer", &|v| {
        v["pre_tokenizer"] = json!({"type": "Whitespace"})
    });
    edit("unknown regex", &|v| {
        v["pre_tokenizer"] = json!({"type": "Split", "pattern": {"Regex": "\\w+"},
                                    "behavior": "Isolated", "invert": false})
    });
    edit("known regex, other behavior", &|v| {
        v["pre_tokenizer"] = json!({"type": "Split", "pattern": {"Regex": GPT2_REGEX},
                                    "behavior": "Removed", "invert": false})
    });
    edit("no decoder", &|v| v["decoder"] = json!(null));
    edit("decoder", &|v| v["decoder"] = json!({"type": "WordPiece"}));
    edit(
        "strip before fuse",
        &|v| v["decoder"] = json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}),
    );
    edit("strip at the end", &|v| {
        v["decoder"]["decoders"][3]["stop"] = json!(1);
    });
    edit("post_processor", &|v| {
        v["post_processor"] = json!({"type": "RobertaProcessing"})
    });
    edit("added copy of a token", &|v| {
        v["added_tokens"] = json!([added(13, "ab", false)]);
    });
    for (what, v) in cases {
        assert!(
            matches!(error(&v), Error::UnsupportedTokenizer { .. }),
            "{what}: {:?}",
            error(&v)
        );
    }
}

/// The known split regexes map to weft's splitters; Llama 3's with its `ByteLevel` step.
#[test]
fn llama3_style_split_is_supported() {
    let mut v = byte_level_style();
    v["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
         "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]});
    v["normalizer"] = json!(null);
    let tok = load(&v);
    assert_eq!(tok.encode("ab abc", false, true), [14, 15, 2]);
}
