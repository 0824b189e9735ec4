//! Session snapshots on the real models: a generation split by a snapshot and resumed on a
//! new engine gives exactly the tokens of one uninterrupted generation (greedy, seeded
//! sampling, a JSON-schema constraint mid-flight); another model's snapshot is refused; damaged
//! snapshots give typed errors and leave the KV pool as it was.

use crate::common;

use common::engine;

use sha2::{Digest, Sha256};
use weft::{block_on, Engine, EngineConfig, Error, Sampler, Schema};

const PROMPT: &str = "Write a short story about a weaver who finds a thread of light:";

fn engine_with_pool(model: &str, kv_tokens: usize) -> Engine {
    common::engine_with(
        model,
        EngineConfig {
            n_threads: 2,
            kv_tokens,
            prefix_cache: false,
            ..EngineConfig::default()
        },
    )
}

/// How one generation is set up: sampler, seed and an optional schema.
#[derive(Clone)]
struct Setup {
    sampler: Sampler,
    seed: u64,
    schema: Option<Schema>,
}

fn setups() -> Vec<Setup> {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "threads": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["title", "threads"],
    });
    vec![
        Setup {
            sampler: Sampler::Argmax,
            seed: 0,
            schema: None,
        },
        Setup {
            sampler: Sampler::TopP {
                p: 0.95,
                temperature: 0.9,
            },
            seed: 1234,
            schema: None,
        },
        Setup {
            sampler: Sampler::Temperature { temperature: 0.8 },
            seed: 7,
            schema: Some(Schema::JsonSchema(schema)),
        },
    ]
}

fn generator<'c>(ctx: &'c mut weft::Context, s: &Setup, max: usize) -> weft::Generator<'c> {
    let gen = ctx.generate(s.sampler.clone()).max_tokens(max).ignore_eos();
    match &s.schema {
        Some(schema) => gen.constrain_with(schema.clone()),
        None => gen,
    }
}

fn start(engine: &Engine, s: &Setup) -> weft::Context {
    let mut ctx = engine.context();
    ctx.set_seed(s.seed);
    ctx.fill(PROMPT).expect("fill");
    ctx
}

/// Tokens of one whole generation (fewer when a constraint completes first).
const TOTAL: usize = 40;

/// Up to `TOTAL` tokens in one go.
fn uninterrupted(engine: &Engine, s: &Setup) -> Vec<u32> {
    let mut ctx = start(engine, s);
    block_on(generator(&mut ctx, s, TOTAL).collect_tokens()).expect("generate")
}

/// `at` tokens on `first`, a snapshot of the generator in flight, a new engine, resume, the
/// rest.
fn split_generator(first: &Engine, model: &str, s: &Setup, at: usize) -> Vec<u32> {
    let bytes = {
        let mut ctx = start(first, s);
        let mut gen = generator(&mut ctx, s, TOTAL);
        for _ in 0..at {
            let step = gen
                .next()
                .expect("step")
                .expect("not done after fewer tokens than the reference");
            block_on(step.execute()).expect("execute");
        }
        assert_eq!(gen.tokens_generated(), at);
        gen.snapshot().expect("snapshot")
    };
    let engine = engine(model, 4096);
    let mut ctx = engine.resume(&bytes).expect("resume");
    let gen = ctx.resume_generator().expect("saved generator");
    block_on(gen.collect_tokens()).expect("generate after resume")
}

/// `at` tokens by one generator on `first`, a snapshot of the context, a new engine, the rest
/// by a new generator.
fn split_context(first: &Engine, model: &str, s: &Setup, at: usize) -> Vec<u32> {
    let (mut head, bytes) = {
        let mut ctx = start(first, s);
        let head = block_on(generator(&mut ctx, s, at).collect_tokens()).expect("generate");
        let mut file = Vec::new();
        ctx.snapshot_to(&mut file).expect("snapshot");
        (head, file)
    };
    let engine = engine(model, 4096);
    let mut ctx = engine.resume_from(bytes.as_slice()).expect("resume");
    assert!(matches!(ctx.resume_generator(), Err(Error::Config(_))));
    let rest = block_on(generator(&mut ctx, s, TOTAL - at).collect_tokens()).expect("generate");
    head.extend(rest);
    head
}

fn round_trip_on(model: &str) {
    let reference = engine(model, 4096);
    for (i, s) in setups().into_iter().enumerate() {
        let whole = uninterrupted(&reference, &s);
        // Snapshot halfway through: 20 of 40 tokens, or fewer when the schema's JSON closes
        // early (where it closes depends on the sampled tokens, so on the kernels' last bits).
        let at = whole.len() / 2;
        assert!(
            at >= 4,
            "{model}, setup {i}: reference stopped after {} tokens",
            whole.len()
        );
        assert_eq!(
            split_generator(&reference, model, &s, at),
            whole,
            "{model}, setup {i}: generator split after {at}"
        );
        if s.schema.is_none() {
            assert_eq!(whole.len(), TOTAL, "{model}, setup {i}: ignore_eos");
            assert_eq!(
                split_context(&reference, model, &s, at),
                whole,
                "{model}, setup {i}: context split"
            );
        } else {
            let text = reference.detokenize(&whole).unwrap();
            assert!(
                text.starts_with('{'),
                "{model}: constrained output {text:?}"
            );
        }
    }
}

#[test]
fn snapshot_round_trip_smollm2() {
    round_trip_on("smollm2-135m");
}

#[test]
fn snapshot_round_trip_gemma3() {
    round_trip_on("gemma3-270m");
}

/// A Gemma 3 context past two sliding windows (its local layers' first pages released)
/// resumes with the same logits.
#[test]
fn snapshot_past_the_sliding_window_gemma3() {
    let engine = engine("gemma3-270m", 4096);
    let mut ctx = engine.context();
    let text = PROMPT.repeat(90);
    ctx.fill(&text).unwrap();
    assert!(ctx.pending().len() > 1100, "{} tokens", ctx.pending().len());
    block_on(ctx.flush_logits()).unwrap();
    let bytes = ctx.snapshot().unwrap();
    let mut resumed = engine.resume(&bytes).unwrap();
    for c in [&mut ctx, &mut resumed] {
        c.fill(" The end.").unwrap();
    }
    let a = block_on(ctx.flush_logits()).unwrap();
    let b = block_on(resumed.flush_logits()).unwrap();
    assert!(a == b, "logits differ after resume");
}

/// Rewound after its window released pages, as far back as `truncate` allows: a Gemma 3
/// context generates from there, and its snapshot resumes with the same logits (the
/// generation failed, its last token's re-run refused one key short, and the snapshot was
/// refused as missing a page the window no longer reads).
#[test]
fn a_gemma3_context_rewound_to_its_window_generates_and_resumes() {
    let engine = engine("gemma3-270m", 4096);
    let mut ctx = engine.context();
    ctx.fill(&PROMPT.repeat(120)).unwrap();
    let len = ctx.pending().len();
    assert!(len > 1500, "{len} tokens");
    block_on(ctx.flush_logits()).unwrap();
    // The smallest length the window lets it keep.
    let n = (1..len)
        .find(|&n| {
            let mut f = ctx.fork().unwrap();
            f.truncate(n).is_ok()
        })
        .unwrap();
    assert!(n > 400, "nothing was released: {n}");
    let mut rewound = ctx.fork().unwrap();
    rewound.truncate(n).unwrap();
    let mut fresh = engine.context();
    fresh.fill_tokens(&ctx.tokens()[..n]).unwrap();
    let greedy = |c: &mut weft::Context| {
        block_on(c.generate(Sampler::Argmax).max_tokens(3).collect_tokens()).unwrap()
    };
    let mut again = rewound.fork().unwrap();
    assert_eq!(greedy(&mut again), greedy(&mut fresh));

    let mut resumed = engine.resume(&rewound.snapshot().unwrap()).unwrap();
    for c in [&mut rewound, &mut resumed] {
        c.fill(" The end.").unwrap();
    }
    let a = block_on(rewound.flush_logits()).unwrap();
    let b = block_on(resumed.flush_logits()).unwrap();
    assert!(a == b, "logits differ after resume");
}

#[test]
fn another_models_snapshot_is_refused() {
    let smol = engine("smollm2-135m", 1024);
    let gemma = engine("gemma3-270m", 1024);
    let mut ctx = smol.context();
    ctx.fill(PROMPT).unwrap();
    block_on(ctx.flush_logits()).unwrap();
    let bytes = ctx.snapshot().unwrap();
    let e = gemma.resume(&bytes).unwrap_err();
    assert!(matches!(e, Error::ModelFingerprintMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("llama") && e.to_string().contains("gemma3"),
        "{e}"
    );
    assert_ne!(smol.fingerprint(), gemma.fingerprint());
    assert_eq!(gemma.metrics().kv_pages_used, 0);
}

/// xorshift64*: the test's own deterministic random numbers.
struct Rand(u64);
impl Rand {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as usize % n.max(1)
    }
}

/// Puts a new checksum on a (modified) snapshot, as documented in the format: SHA-256 of the
/// body at bytes 24..56, body from byte 56, its length at 16..24.
fn reseal(bytes: &mut [u8]) {
    if bytes.len() < 56 {
        return;
    }
    let len = (bytes.len() - 56) as u64;
    bytes[16..24].copy_from_slice(&len.to_le_bytes());
    let digest = Sha256::digest(&bytes[56..]);
    bytes[24..56].copy_from_slice(&digest);
}

/// A generator whose schema failed to compile cannot be saved (the snapshot would resume it
/// unconstrained): the snapshot is the compile error.
#[test]
fn a_generator_with_a_failed_schema_is_not_saved() {
    let engine = engine("smollm2-135m", 2048);
    let mut ctx = engine.context();
    ctx.fill(PROMPT).unwrap();
    let mut gen = ctx
        .generate(Sampler::Argmax)
        .constrain_with(Schema::Regex("(".into()));
    let e = gen.snapshot().unwrap_err();
    assert!(matches!(e, Error::Grammar { .. }), "{e}");
    assert!(gen.is_done());
}

/// A resealed generator snapshot whose streamed length falls inside a character of the text
/// is refused when the generator is taken up, not a panic at its first delta.
#[test]
fn a_generator_snapshot_streamed_inside_a_character_is_refused() {
    let engine = engine("smollm2-135m", 2048);
    let mut ctx = engine.context();
    ctx.fill(PROMPT).unwrap();
    let mut gen = ctx.generate(Sampler::Argmax);
    let e_acute = engine.tokenize("é");
    gen.accept(&e_acute).unwrap();
    assert!(gen.text().starts_with('é'), "{:?}", gen.text());
    let bytes = gen.snapshot().unwrap();
    let needle = b"\"streamed\":0";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the saved generator's streamed length");
    let mut b = bytes.clone();
    b[at + needle.len() - 1] = b'1';
    reseal(&mut b);
    let mut resumed = engine.resume(&b).expect("the context itself is sound");
    let e = resumed.resume_generator().map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::SnapshotCorrupt { .. }), "{e}");
    // Untouched, it resumes.
    let mut resumed = engine.resume(&bytes).unwrap();
    assert_eq!(resumed.resume_generator().unwrap().text(), "é");
}

#[test]
fn damaged_snapshots_give_typed_errors_and_leak_nothing() {
    let engine = engine("smollm2-135m", 2048);
    let bytes = {
        let mut ctx = engine.context();
        ctx.fill(PROMPT).unwrap();
        ctx.fill(" Once upon a time there was a weaver").unwrap();
        ctx.fill(PROMPT).unwrap();
        block_on(ctx.flush_logits()).unwrap();
        ctx.fill(" who").unwrap();
        let bytes = ctx.snapshot().unwrap();
        assert!(
            ctx.len() > weft::kv::PAGE_SIZE,
            "two pages: more than the tiny pool"
        );
        assert!(engine.resume(&bytes).is_ok());
        bytes
    };
    assert_eq!(engine.metrics().kv_pages_used, 0);
    let mut rand = Rand(0x5EED);
    let (mut refused, mut accepted) = (0, 0);
    for i in 0..1000 {
        let mut b = bytes.clone();
        match rand.below(3) {
            0 => b.truncate(rand.below(bytes.len())),
            _ => {
                // Mostly in the header and metadata, where structure lives; some in the data.
                let span = if rand.below(4) == 0 {
                    b.len()
                } else {
                    4096.min(b.len())
                };
                for _ in 0..=rand.below(4) {
                    let at = rand.below(span);
                    b[at] ^= 1 << rand.below(8);
                }
            }
        }
        let resealed = i % 2 == 1;
        if resealed {
            reseal(&mut b);
        }
        match engine.resume(&b) {
            Err(
                Error::SnapshotCorrupt { .. }
                | Error::SnapshotVersion { .. }
                | Error::ModelFingerprintMismatch { .. }
                | Error::TokenOutOfVocab { .. }
                | Error::ContextTooLong { .. },
            ) => refused += 1,
            Err(e) => panic!("mutation {i}: unexpected error {e:?}"),
            // A resealed snapshot whose damage hit key/value data or a token is well formed.
            Ok(ctx) => {
                assert!(resealed || b == bytes, "mutation {i} accepted");
                accepted += 1;
                drop(ctx);
            }
        }
    }
    assert!(refused > 900, "{refused} refused, {accepted} accepted");
    let m = engine.metrics();
    assert_eq!(m.kv_pages_used, 0, "pages leaked");

    // A pool without room for the snapshot's pages: the KV cache's error, nothing allocated.
    let tiny = engine_with_pool("smollm2-135m", 2 * weft::kv::PAGE_SIZE);
    let mut other = tiny.context();
    other.fill(PROMPT).unwrap();
    block_on(other.flush_logits()).unwrap();
    let used = tiny.metrics().kv_pages_used;
    let e = tiny.resume(&bytes).unwrap_err();
    assert!(e.is_kv_full(), "{e}");
    assert_eq!(tiny.metrics().kv_pages_used, used);
    drop(other);
    assert_eq!(tiny.metrics().kv_pages_used, 0);
}

/// A context on a Q8_0 KV cache snapshots its 8-bit pages as they are and resumes with the
/// same logits; an engine with an f16 cache refuses the snapshot, naming both types.
#[test]
fn q8_0_kv_snapshots_resume_and_other_kv_types_are_refused() {
    let open = |kv_type| {
        common::engine_with(
            "smollm2-135m",
            EngineConfig {
                n_threads: 2,
                kv_tokens: 1024,
                kv_type,
                ..EngineConfig::default()
            },
        )
    };
    let q8 = open(weft::KvType::Q8_0);
    let mut ctx = q8.context();
    ctx.fill(PROMPT).unwrap();
    block_on(ctx.flush_logits()).unwrap();
    let bytes = ctx.snapshot().unwrap();
    let mut resumed = q8.resume(&bytes).unwrap();
    for c in [&mut ctx, &mut resumed] {
        c.fill(" The end.").unwrap();
    }
    let a = block_on(ctx.flush_logits()).unwrap();
    let b = block_on(resumed.flush_logits()).unwrap();
    assert!(a == b, "logits differ after resume");

    let f16 = open(weft::KvType::F16);
    let e = f16.resume(&bytes).unwrap_err();
    // A sound snapshot for another setting: not reported as damaged.
    assert!(matches!(e, Error::Config(_)), "{e}");
    assert!(
        e.to_string().contains("q8_0") && e.to_string().contains("f16"),
        "{e}"
    );
    assert_eq!(f16.metrics().kv_pages_used, 0);
}

#[test]
fn a_snapshot_remembers_that_its_context_ran_under_custom_attention_masks() {
    let engine = engine_with_pool("smollm2-135m", 4096);
    let ids = engine.tokenize("Alice likes apples. Bob likes");
    // Causal, but token 1 hidden from the tokens after it.
    let masks: Vec<weft::Brle> = (0..ids.len())
        .map(|i| {
            let mut row = vec![true; i + 1];
            if i > 1 {
                row[1] = false;
            }
            weft::Brle::from_bools(&row)
        })
        .collect();
    let mut ctx = engine.context();
    let mut fwd = ctx.forward();
    fwd.input(&ids);
    fwd.attention_mask(masks);
    block_on(fwd.execute()).expect("masked pass");
    assert!(
        ctx.evict().is_err(),
        "its pages cannot be recomputed from its tokens"
    );
    let mut resumed = engine
        .resume(&ctx.snapshot().expect("snapshot"))
        .expect("resume");
    let evicted = resumed.evict();
    assert!(
        matches!(&evicted, Err(Error::Config(m)) if m.contains("custom attention")),
        "{evicted:?}"
    );
    // And it goes on as the original does.
    let want = block_on(ctx.decode(ids[0])).expect("original");
    assert_eq!(block_on(resumed.decode(ids[0])).expect("resumed"), want);
}
