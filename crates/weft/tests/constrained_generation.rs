//! Constrained generation through the Generator on the real model: JSON Schema, regex and
//! grammar constraints hold on sampled outputs, constraints compose, a terminal constraint
//! stops generation, bad schemas fail before any pass, and speculation keeps working.

use crate::common;

use futures_util::future::join_all;
use weft::{block_on, Constraint, Engine, Error, Sampler, Schema, StopReason, TokenMask};

fn engine() -> Engine {
    common::engine("smollm2-135m", 32768)
}

fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}
        },
        "required": ["name", "age", "color", "tags"],
        "additionalProperties": false
    })
}

/// Sampled generations (temperature 1) for seeds `seeds`, run concurrently.
fn sample_many(
    engine: &Engine,
    prompt: &str,
    schemas: &[Schema],
    seeds: std::ops::Range<u64>,
    max: usize,
) -> Vec<(String, Option<StopReason>)> {
    let mut ctxs: Vec<_> = seeds
        .map(|s| {
            let mut c = engine.context();
            c.set_seed(s);
            c.fill(prompt).expect("fill");
            c
        })
        .collect();
    block_on(join_all(ctxs.iter_mut().map(|c| async move {
        let mut g = c
            .generate(Sampler::Temperature { temperature: 1.0 })
            .max_tokens(max);
        for s in schemas {
            g = g.constrain_with(s.clone());
        }
        while let Some(step) = g.next()? {
            step.execute().await?;
        }
        let text = c_text(&g);
        Ok::<_, Error>((text, g.stop_reason().cloned()))
    })))
    .into_iter()
    .map(|r| r.expect("generation"))
    .collect()
}

fn c_text(g: &weft::Generator<'_>) -> String {
    g.text().to_string()
}

#[test]
fn two_hundred_sampled_generations_validate_against_the_schema() {
    let engine = engine();
    let schema = person_schema();
    let validator = jsonschema::validator_for(&schema).expect("schema");
    let prompt = "Describe a person as JSON with name, age, favourite color and tags:\n";
    let mut n = 0;
    for round in 0..4u64 {
        for (text, stop) in sample_many(
            &engine,
            prompt,
            &[Schema::JsonSchema(schema.clone())],
            round * 50..round * 50 + 50,
            160,
        ) {
            let value: serde_json::Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("not JSON ({e}), stop {stop:?}: {text:?}"));
            assert!(
                validator.is_valid(&value),
                "invalid under the schema: {text}"
            );
            n += 1;
        }
    }
    assert_eq!(n, 200);
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

#[test]
fn regex_and_grammar_constraints_hold_on_sampled_outputs() {
    let engine = engine();
    let re = regex::Regex::new(r"^[A-Z][a-z]{2,8} [0-9]{3}$").expect("regex");
    for (text, stop) in sample_many(
        &engine,
        "A name and a number:",
        &[Schema::Regex(r"[A-Z][a-z]{2,8} [0-9]{3}".into())],
        0..16,
        40,
    ) {
        assert!(re.is_match(&text), "{text:?} does not match");
        // Three digits end the language: the constraint itself stops generation.
        assert_eq!(stop, Some(StopReason::Constraint), "{text:?}");
    }
    let lark = r#"start: answer "." 
answer: "yes" | "no" | "maybe""#;
    for (text, _) in sample_many(
        &engine,
        "Is the sky blue? Answer:",
        &[Schema::Lark(lark.into())],
        0..16,
        20,
    ) {
        assert!(
            ["yes.", "no.", "maybe."].contains(&text.as_str()),
            "{text:?}"
        );
    }
    let gbnf = "root ::= \"a\"+ \"b\"";
    for (text, _) in sample_many(&engine, "Letters:", &[Schema::Gbnf(gbnf.into())], 0..8, 20) {
        assert!(
            text.ends_with('b')
                && text[..text.len() - 1].chars().all(|c| c == 'a')
                && text.len() >= 2,
            "{text:?}"
        );
    }
}

/// A user-written constraint: no token whose text contains the letter `a`.
struct NoLetterA {
    banned: TokenMask,
}

impl NoLetterA {
    fn new(engine: &Engine) -> NoLetterA {
        let vocab = engine.info().vocab_size;
        let mut banned = TokenMask::all(vocab);
        for id in 0..vocab as u32 {
            let text = engine
                .tokenizer()
                .token_to_piece(id, false)
                .unwrap_or_default();
            if text.contains('a') {
                banned.forbid(id);
            }
        }
        NoLetterA { banned }
    }
}

impl Constraint for NoLetterA {
    fn allowed(&mut self, _accepted: &[u32], _vocab_size: usize) -> weft::Result<TokenMask> {
        Ok(self.banned.clone())
    }
    fn is_terminal(&mut self, _accepted: &[u32]) -> weft::Result<bool> {
        Ok(false)
    }
}

#[test]
fn a_custom_constraint_composes_with_a_schema() {
    let engine = engine();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 10}},
        "required": ["word"], "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&schema).expect("schema");
    for seed in 0..8 {
        let mut ctx = engine.context();
        ctx.set_seed(seed);
        ctx.fill("A random English word as JSON:").expect("fill");
        let text = block_on(
            ctx.generate(Sampler::Temperature { temperature: 1.0 })
                .max_tokens(40)
                .constrain(NoLetterA::new(&engine))
                .constrain_with(Schema::JsonSchema(schema.clone()))
                .collect_text(),
        )
        .expect("generate");
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert!(validator.is_valid(&value), "{text}");
        assert!(
            !text.contains('a'),
            "the custom constraint was ignored: {text}"
        );
    }
}

#[derive(Debug, serde::Deserialize, schemars::JsonSchema, PartialEq)]
struct City {
    name: String,
    population: u32,
    coastal: bool,
}

#[test]
fn collect_json_derives_the_schema_and_parses() {
    let engine = engine();
    let mut ctx = engine.context();
    ctx.fill("City: Paris\nJSON: {\"name\": \"Paris\", \"population\": 2100000, \"coastal\": false}\nCity: Tokyo\nJSON: ")
        .expect("fill");
    let city: City = block_on(
        ctx.generate(Sampler::Argmax)
            .max_tokens(64)
            .collect_json::<City>(),
    )
    .expect("collect_json");
    assert_eq!(city.name, "Tokyo");
}

#[test]
fn bad_schemas_fail_before_any_pass_and_leak_nothing() {
    let engine = engine();
    let before = engine.metrics();
    for schema in [
        Schema::JsonSchema(serde_json::json!({"type": 12})),
        Schema::Regex("(".into()),
        Schema::Lark("start: (".into()),
        Schema::Gbnf("root ::= undefined-rule".into()),
    ] {
        let mut ctx = engine.context();
        ctx.fill("Hello").expect("fill");
        let mut g = ctx.generate(Sampler::Argmax).constrain_with(schema.clone());
        let err = g
            .next()
            .err()
            .unwrap_or_else(|| panic!("{schema:?} was accepted"));
        assert!(matches!(err, Error::Grammar { .. }), "{schema:?}: {err}");
        println!("{err}");
    }
    // Schemas that compile but that no text matches say so, in a line.
    for schema in [
        Schema::JsonSchema(serde_json::json!({"$ref": "#"})),
        Schema::Regex(r"[^\s\S]".into()),
        Schema::Lark("start: x\nx: x \"a\"\n".into()),
        Schema::Gbnf("root ::= root".into()),
    ] {
        let mut ctx = engine.context();
        ctx.fill("Hello").expect("fill");
        let mut g = ctx.generate(Sampler::Argmax).constrain_with(schema.clone());
        let err = g.next().err().expect("no text matches it").to_string();
        assert!(
            err.contains("no text matches it") && !err.contains('\n'),
            "{schema:?}: {err}"
        );
    }
    let after = engine.metrics();
    assert_eq!(after.passes, before.passes, "a pass was submitted");
    assert_eq!(after.kv_pages_used, 0);
}

#[test]
fn speculation_under_a_constraint_gives_the_same_greedy_output() {
    let engine = engine();
    let schema = Schema::JsonSchema(person_schema());
    let prompt = "Person: {\"name\": \"Ann\", \"age\": 31, \"color\": \"red\", \"tags\": [\"a\"]}\nSame person as JSON:\n";
    let run = |speculate: bool| {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        let g = ctx
            .generate(Sampler::Argmax)
            .max_tokens(80)
            .constrain_with(schema.clone());
        let mut g = if speculate { g.system_speculation() } else { g };
        while let Some(step) = g.next().expect("next") {
            block_on(step.execute()).expect("step");
        }
        (g.tokens().to_vec(), g.speculation_stats())
    };
    let (plain, _) = run(false);
    let (fast, (drafted, accepted)) = run(true);
    println!("drafted {drafted}, accepted {accepted}");
    assert_eq!(fast, plain);
    assert!(accepted > 0, "no draft accepted under the constraint");
}

/// Stepping by hand under a constraint: the step's `allowed` set is the constraint's, the
/// masked argmax of the Logits probe is what the automatic loop picks, and `accept` refuses
/// a token outside the set (taking nothing).
#[test]
fn manual_steps_see_the_constraint_and_accept_refuses_what_it_forbids() {
    let engine = engine();
    let schema = Schema::JsonSchema(person_schema());
    let prompt = "A person as JSON:\n";
    let auto = {
        let mut ctx = engine.context();
        ctx.fill(prompt).expect("fill");
        let g = ctx
            .generate(Sampler::Argmax)
            .max_tokens(60)
            .constrain_with(schema.clone());
        block_on(g.collect_tokens()).expect("generate")
    };
    let mut ctx = engine.context();
    ctx.fill(prompt).expect("fill");
    let mut g = ctx
        .generate(Sampler::Argmax)
        .max_tokens(60)
        .constrain_with(schema);
    let mut refused = 0;
    while let Some(mut step) = g.next().expect("next") {
        step.clear_sampler();
        let h = step.probe(0, weft::Logits);
        let out = block_on(step.execute()).expect("step");
        let allowed = out.allowed.clone().expect("a constrained step has a set");
        let logits = out.logits(h).expect("logits");
        let best = (0..logits.len() as u32)
            .filter(|&id| allowed.is_allowed(id))
            .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]))
            .expect("an allowed token");
        // The unconstrained argmax, when the constraint forbids it, is refused.
        let free = weft::sampling::argmax(logits);
        if !allowed.is_allowed(free) {
            let before = g.tokens_generated();
            let r = g.accept(&[free]);
            assert!(
                matches!(r, Err(Error::TokenNotAllowed { id }) if id == free),
                "{r:?}"
            );
            assert_eq!(g.tokens_generated(), before);
            refused += 1;
        }
        g.accept(&[best]).expect("an allowed token");
    }
    assert!(refused > 0, "the constraint never overrode the model");
    assert_eq!(
        g.tokens(),
        auto,
        "manual masked argmax against the automatic loop"
    );
    assert_eq!(g.stop_reason(), Some(&StopReason::Constraint));
    let text = engine.tokenizer().decode(g.tokens()).expect("decode");
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert!(jsonschema::is_valid(&person_schema(), &json), "{text}");
}

#[test]
fn a_stop_string_completed_with_the_constraint_still_cuts_the_text() {
    let engine = engine();
    let run = |stop: Option<&str>, max: usize| {
        let mut ctx = engine.context();
        ctx.fill("Say abc:").expect("fill");
        let mut g = ctx
            .generate(Sampler::Argmax)
            .max_tokens(max)
            .constrain_with(Schema::Regex("abc".into()));
        if let Some(s) = stop {
            g = g.stop_string(s);
        }
        while let Some(step) = g.next().expect("next") {
            block_on(step.execute()).expect("step");
        }
        (g.text().to_string(), g.stop_reason().cloned())
    };
    let (whole, reason) = run(None, 20);
    assert_eq!(
        (whole.as_str(), reason),
        ("abc", Some(StopReason::Constraint))
    );
    // "c" completes both the language and the stop string: the stop string is never shown.
    assert_eq!(
        run(Some("c"), 20),
        ("ab".to_string(), Some(StopReason::StopString("c".into())))
    );
    // Running out of tokens on the token that completes the language is the language's end.
    let mut ctx = engine.context();
    ctx.fill("Say abc:").expect("fill");
    let g = ctx
        .generate(Sampler::Argmax)
        .max_tokens(20)
        .constrain_with(Schema::Regex("abc".into()));
    let ids = block_on(g.collect_tokens()).expect("generate");
    assert_eq!(
        run(None, ids.len()).1,
        Some(StopReason::Constraint),
        "{ids:?}"
    );
}

/// Greedy output for "Say yes:" under the GBNF `grammar` with `min_tokens` 5 (and drafts
/// of `draft` every step, if given): its text, why it stopped, its tokens.
fn say_yes(
    engine: &Engine,
    grammar: &str,
    draft: Option<Vec<u32>>,
) -> (String, Option<StopReason>, Vec<u32>) {
    let mut ctx = engine.context();
    ctx.fill("Say yes:").expect("fill");
    let g = ctx
        .generate(Sampler::Argmax)
        .max_tokens(10)
        .min_tokens(5)
        .constrain_with(Schema::Gbnf(grammar.into()));
    let mut g = match draft {
        Some(d) => g.speculator(Always(d)),
        None => g,
    };
    while let Some(step) = g.next().expect("next") {
        block_on(step.execute()).expect("step");
    }
    (
        g.text().to_string(),
        g.stop_reason().cloned(),
        g.tokens().to_vec(),
    )
}

#[test]
fn min_tokens_gives_way_to_a_constraint_that_allows_only_a_stop_token() {
    // The grammar's language ends with the end of turn after "yes": min_tokens cannot ban
    // that token without leaving nothing to sample (the step failed with NothingAllowed).
    let engine = engine();
    let yes = engine.tokenizer().encode("yes", false, false);
    // Also with a drafter that always guesses "yes": the position after its draft allows only
    // the end of turn, which the step's bias bans (the step failed with NothingAllowed).
    for draft in [None, Some(yes)] {
        let (text, stop, _) = say_yes(&engine, r#"root ::= "yes" <|im_end|>"#, draft);
        assert_eq!(text, "yes");
        assert!(matches!(stop, Some(StopReason::StopToken(_))), "{stop:?}");
    }
    // Where the constraint allows more than the stop ids, the ban holds.
    let (_, _, ids) = say_yes(&engine, r#"root ::= "yes" (<|im_end|> | "!"+)"#, None);
    assert!(ids.len() >= 5, "{ids:?}");
    assert_eq!(engine.metrics().kv_pages_used, 0);
}

/// A speculator that drafts the same tokens every step.
struct Always(Vec<u32>);

impl weft::Speculator for Always {
    fn draft(&mut self, _tokens: &[u32], max: usize) -> Vec<u32> {
        self.0.iter().copied().take(max).collect()
    }
}
