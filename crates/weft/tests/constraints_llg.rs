//! llguidance-backed constraints on the real models, driven by a manual sampling loop over the
//! Forward API: sampled outputs (temperature 1) under a JSON schema, a regular expression, a
//! Lark and a GBNF grammar always fit; rewinding the accepted tokens gives the masks of a fresh
//! constraint; bad schemas fail in `compile`; Gemma 3's 262,144-token vocabulary is timed.

use crate::common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use weft::constraint::{compile, Constraint, Schema};
use weft::{block_on, Brle, Engine, Error, Message, Sampler};

fn open(name: &str) -> Engine {
    common::engine(name, 8192)
}

/// One SmolLM2 engine shared by the tests of this file (its token trie is built once).
fn smollm() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| open("smollm2-135m"))
}

/// What one constrained generation produced.
struct Sample {
    /// Generated text, without a final stop token.
    text: String,
    /// Generated tokens, without a final stop token.
    tokens: Vec<u32>,
    /// Whether the constraint was terminal or a stop token was sampled.
    finished: bool,
    /// Time spent in each `allowed` call.
    mask_times: Vec<Duration>,
}

/// Samples at temperature 1 under `schema` for each seed, concurrently (the scheduler batches
/// the passes), `max` tokens at most.
fn sample(
    engine: &Engine,
    schema: &Schema,
    chat: &str,
    seeds: std::ops::Range<u64>,
    max: usize,
) -> Vec<Sample> {
    let vocab = engine.info().vocab_size;
    let runs = seeds.map(|seed| async move {
        let mut c = compile(engine, schema)?;
        let mut ctx = engine.context();
        ctx.set_seed(seed);
        ctx.fill_chat(&[Message::user(chat)])?;
        let (mut out, mut mask_times) = (Vec::new(), Vec::new());
        let mut finished = false;
        while out.len() < max {
            if c.is_terminal(&out)? {
                finished = true;
                break;
            }
            let t0 = Instant::now();
            let mask = c.allowed(&out, vocab)?;
            mask_times.push(t0.elapsed());
            let mut fwd = ctx.forward();
            if let Some(&last) = out.last() {
                fwd.input(&[last]);
            }
            let h = fwd.sample(&[fwd.len() - 1], Sampler::Temperature { temperature: 1.0 });
            fwd.mask(Brle::from_bools(&mask.to_bools()));
            let t = fwd.execute().await?.token(h).expect("sampled token");
            assert!(mask.is_allowed(t), "sampled token {t} outside the mask");
            out.push(t);
            if engine.is_eos(t) {
                assert!(
                    c.is_terminal(&out)?,
                    "a stop token was accepted but the constraint is not terminal"
                );
                out.pop();
                finished = true;
                break;
            }
        }
        Ok::<_, Error>(Sample {
            text: engine.detokenize(&out)?,
            tokens: out,
            finished,
            mask_times,
        })
    });
    block_on(join_all(runs))
        .into_iter()
        .map(|r| r.expect("constrained generation"))
        .collect()
}

fn report(model: &str, what: &str, samples: &[Sample]) {
    let mut t: Vec<Duration> = samples.iter().flat_map(|s| s.mask_times.clone()).collect();
    t.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pct = |p: usize| {
        t.get((t.len() * p / 100).min(t.len().saturating_sub(1)))
            .copied()
    };
    let mean = t.iter().sum::<Duration>().as_secs_f64() * 1e6 / t.len().max(1) as f64;
    println!(
        "{model} {what}: {} masks, per token mean {mean:.0} us, median {:.0} us, p90 {:.0} us, max {:.0} us",
        t.len(),
        pct(50).map_or(0.0, us),
        pct(90).map_or(0.0, us),
        t.last().copied().map_or(0.0, us),
    );
}

/// Replays the samples' tokens through fresh constraints with no model running alongside:
/// the masking cost alone.
fn report_replay(model: &str, engine: &Engine, schema: &Schema, samples: &[Sample]) {
    let vocab = engine.info().vocab_size;
    let replayed: Vec<Sample> = samples
        .iter()
        .map(|s| {
            let mut c = compile(engine, schema).expect("compile");
            let mask_times = (0..=s.tokens.len())
                .map(|k| {
                    let t0 = Instant::now();
                    c.allowed(&s.tokens[..k], vocab).expect("replay");
                    t0.elapsed()
                })
                .collect();
            Sample {
                text: String::new(),
                tokens: Vec::new(),
                finished: true,
                mask_times,
            }
        })
        .collect();
    report(model, "replayed alone", &replayed);
}

fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 16},
            "age": {"type": "integer", "minimum": 18, "maximum": 99},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3}
        },
        "required": ["name", "age", "color", "tags"],
        "additionalProperties": false
    })
}

/// Times the first compile on a fresh engine (token trie and parser factory included) and a
/// second one (the grammar only).
fn time_compile(model: &str, engine: &Engine, schema: &Schema) {
    let t0 = Instant::now();
    compile(engine, schema).expect("compile");
    let first = t0.elapsed();
    let t0 = Instant::now();
    compile(engine, schema).expect("compile");
    let again = t0.elapsed();
    println!(
        "{model} ({} tokens): first compile {first:?} (token env ~{:?}), later compiles {again:?}",
        engine.info().vocab_size,
        first.saturating_sub(again)
    );
}

fn check_json(model: &str, samples: &[Sample]) {
    let validator = jsonschema::validator_for(&person_schema()).expect("valid schema");
    for s in samples {
        assert!(s.finished, "{model}: unfinished JSON {:?}", s.text);
        let v: serde_json::Value = serde_json::from_str(&s.text)
            .unwrap_or_else(|e| panic!("{model}: {:?} is not JSON: {e}", s.text));
        assert!(
            validator.is_valid(&v),
            "{model}: {:?} does not validate",
            s.text
        );
    }
    println!("{model} sample: {}", samples[0].text);
}

#[test]
fn json_schema_holds_on_sampled_outputs() {
    let engine = open("smollm2-135m");
    let schema = Schema::JsonSchema(person_schema());
    time_compile("smollm2", &engine, &schema);
    let prompt = "Describe a person as JSON with name, age, favourite color and tags.";
    let samples = sample(&engine, &schema, prompt, 0..20, 120);
    check_json("smollm2", &samples);
    report("smollm2", "JSON schema", &samples);
    report_replay("smollm2", &engine, &schema, &samples);
}

#[test]
fn any_json_is_json() {
    let samples = sample(
        smollm(),
        &Schema::AnyJson,
        "Give me a JSON list of three fruits.",
        0..4,
        100,
    );
    for s in samples.iter().filter(|s| s.finished) {
        serde_json::from_str::<serde_json::Value>(&s.text)
            .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", s.text));
    }
}

#[test]
fn regex_holds_on_sampled_outputs() {
    let rx = "[A-Z][a-z]{2,8} [0-9]{3}";
    let full = regex::Regex::new(&format!("^(?:{rx})$")).expect("regex");
    let samples = sample(
        smollm(),
        &Schema::Regex(rx.into()),
        "Name a city and a number.",
        100..120,
        40,
    );
    for s in &samples {
        assert!(
            s.finished && full.is_match(&s.text),
            "{:?} does not match {rx}",
            s.text
        );
    }
    report("smollm2", "regex", &samples);
}

#[test]
fn lark_grammar_holds() {
    let g = r#"start: "yes" | "no" | "maybe""#;
    let samples = sample(
        smollm(),
        &Schema::Lark(g.into()),
        "Is the sky blue?",
        0..8,
        10,
    );
    for s in &samples {
        assert!(
            s.finished && ["yes", "no", "maybe"].contains(&s.text.as_str()),
            "{:?}",
            s.text
        );
    }
}

#[test]
fn gbnf_grammar_holds() {
    let schema = Schema::Gbnf(r#"root ::= "a"+ "b""#.into());
    let samples = sample(
        smollm(),
        &schema,
        "Write a few letters a, then one b.",
        0..8,
        24,
    );
    let (done, prefix) = (regex::Regex::new("^a+b$"), regex::Regex::new("^a*$"));
    let (done, prefix) = (done.expect("regex"), prefix.expect("regex"));
    for s in &samples {
        let ok = if s.finished { &done } else { &prefix };
        assert!(
            ok.is_match(&s.text),
            "{:?} (finished: {})",
            s.text,
            s.finished
        );
    }
    assert!(samples.iter().any(|s| s.finished), "no sample finished");
}

/// llama.cpp's `grammars/json.gbnf`.
const JSON_GBNF: &str = r#"
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"#;

#[test]
fn gbnf_json_grammar_gives_json() {
    let schema = Schema::Gbnf(JSON_GBNF.into());
    let prompt = "Give me a JSON object with a name and an age.";
    let samples = sample(smollm(), &schema, prompt, 0..4, 80);
    for s in samples.iter().filter(|s| s.finished) {
        serde_json::from_str::<serde_json::Value>(&s.text)
            .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", s.text));
    }
    println!(
        "json.gbnf: {:?}",
        samples
            .iter()
            .map(|s| (&s.text, s.finished))
            .collect::<Vec<_>>()
    );
    report("smollm2", "json.gbnf", &samples);
    assert!(samples.iter().any(|s| s.finished), "no sample finished");
}

#[test]
fn rewinding_gives_the_masks_of_a_fresh_constraint() {
    let engine = smollm();
    let vocab = engine.info().vocab_size;
    let schema = Schema::JsonSchema(person_schema());
    let text = r#"{"name": "Ann", "age": 31, "color": "red", "tags": ["a", "b"]}"#;
    let ids = engine.tokenize(text);
    let mut c = compile(engine, &schema).expect("compile");
    assert!(c.is_terminal(&ids).expect("fits"));
    // Back and forth, as speculative decoding rewinds: every mask equals a fresh one's.
    for k in [5, ids.len() - 1, 2, 0, ids.len() / 2] {
        let mut fresh = compile(engine, &schema).expect("compile");
        let want = fresh.allowed(&ids[..k], vocab).expect("fresh");
        assert_eq!(
            c.allowed(&ids[..k], vocab).expect("rewound"),
            want,
            "after {k} tokens"
        );
        assert!(!c.is_terminal(&ids[..k]).expect("fits"));
    }
    // A divergent tail: the accepted prefix is followed by another token.
    let other = engine.tokenize(r#"{"name": "Bo"#);
    let mut fresh = compile(engine, &schema).expect("compile");
    assert_eq!(
        c.allowed(&other, vocab).expect("diverged"),
        fresh.allowed(&other, vocab).expect("fresh")
    );
    // A complete value allows a stop token; a rejected token is an error, not a panic.
    let mut c = compile(engine, &Schema::Regex("ab?".into())).expect("compile");
    let a = engine.tokenize("a");
    let eos = engine.stop_tokens()[0];
    assert!(c.allowed(&a, vocab).expect("a").is_allowed(eos));
    assert!(!c.allowed(&[], vocab).expect("start").is_allowed(eos));
    let z = engine.tokenize("z");
    assert!(matches!(c.allowed(&z, vocab), Err(Error::Grammar { .. })));
    assert!(c
        .allowed(&[a[0], eos], vocab)
        .expect("stopped")
        .is_allowed(eos));
    assert!(c.is_terminal(&[a[0], eos]).expect("stopped"));
    // Special tokens never appear as text.
    let mask = compile(engine, &Schema::AnyJson)
        .expect("any")
        .allowed(&[], vocab)
        .expect("mask");
    assert!(!mask.is_allowed(eos));
    for id in (engine.tokenizer().vocab_size()..vocab).map(|i| i as u32) {
        assert!(!mask.is_allowed(id));
    }
}

#[test]
fn bad_schemas_fail_in_compile() {
    let engine = smollm();
    let cases = [
        (
            Schema::JsonSchema(serde_json::json!({"type": 12})),
            "JSON schema",
        ),
        (Schema::Regex("(".into()), "regular expression"),
        (Schema::Lark("start: foo".into()), "Lark grammar"),
        (Schema::Lark("start: (\"a\"".into()), "Lark grammar"),
        (Schema::Gbnf("root ::= \"a".into()), "GBNF grammar"),
        (Schema::Gbnf("root ::= missing".into()), "GBNF grammar"),
        // Counts past u32 are refused, not read as 0 (or as an open bound).
        (
            Schema::Gbnf("root ::= \"a\"{4294967296}".into()),
            "GBNF grammar",
        ),
        (
            Schema::Gbnf("root ::= \"a\"{5,99999999999}".into()),
            "GBNF grammar",
        ),
    ];
    for (schema, want) in cases {
        match compile(engine, &schema) {
            Err(Error::Grammar { kind, message }) => {
                assert_eq!(kind, want, "{schema:?}: {message}");
                println!(
                    "{schema:?} -> invalid {kind}: {}",
                    message.lines().next().unwrap_or("")
                );
            }
            Err(e) => panic!("{schema:?}: wrong error {e}"),
            Ok(_) => panic!("{schema:?} compiled"),
        }
    }
}

#[test]
fn gemma3_json_schema_and_timing() {
    let engine = open("gemma3-270m");
    let schema = Schema::JsonSchema(person_schema());
    time_compile("gemma3", &engine, &schema);
    let prompt = "Describe a person as JSON with name, age, favourite color and tags.";
    let samples = sample(&engine, &schema, prompt, 0..4, 120);
    check_json("gemma3", &samples);
    report("gemma3", "JSON schema", &samples);
    report_replay("gemma3", &engine, &schema, &samples);
}
