//! One long system prompt (about 1,500 tokens: an assistant's rules, as an agent's tool list or
//! a few-shot preamble would be) and sixteen different short questions, asked one after the
//! other in fresh contexts. The automatic prefix cache computes the system prompt once: every
//! later request attaches its KV pages and prefills only its own tokens, so its time to first
//! token drops by the whole prefix.
//!
//! Run: `cargo run --release -p weft --example shared_prefix [-- MODEL]`

use std::time::{Duration, Instant};

use weft::{block_on, Engine, Message, Result, Sampler};

/// What one request cost.
#[derive(Debug, Clone)]
pub struct Request {
    /// Prompt tokens, and of those the ones found in the prefix cache.
    pub prompt_tokens: usize,
    pub cached_tokens: u64,
    /// Tokens the engine actually prefilled for this request.
    pub prefilled: u64,
    /// From filling the context to the first generated token.
    pub ttft: Duration,
    /// The reply.
    pub reply: String,
}

/// A system prompt of at least `min_tokens` tokens for `engine`'s tokenizer.
pub fn system_prompt(engine: &Engine, min_tokens: usize) -> String {
    let topics = [
        "billing",
        "shipping",
        "returns",
        "warranty",
        "accounts",
        "passwords",
        "privacy",
        "orders",
        "discounts",
        "gift cards",
        "repairs",
        "installation",
        "subscriptions",
    ];
    let mut text = String::from(
        "You are the support assistant of Loomworks, a company that sells weaving looms, \
         yarn and repair parts. Follow these rules in every answer.\n",
    );
    let mut i = 0;
    while engine.tokenize(&text).len() < min_tokens {
        let topic = topics[i % topics.len()];
        i += 1;
        text.push_str(&format!(
            "Rule {i}: when a customer asks about {topic}, answer in at most two sentences, \
             name the page of the handbook that covers {topic} (page {}), and never promise \
             a date you cannot check.\n",
            10 + 3 * i
        ));
    }
    text
}

/// Asks `questions` one after the other, each in a fresh context behind the same system
/// prompt, and reports what each request cost.
pub fn run(
    engine: &Engine,
    system: &str,
    questions: &[String],
    max_tokens: usize,
) -> Result<Vec<Request>> {
    let mut out = Vec::with_capacity(questions.len());
    for q in questions {
        let before = engine.metrics();
        let t0 = Instant::now();
        let mut ctx = engine.context();
        ctx.fill_chat(&[Message::system(system), Message::user(q.clone())])?;
        let prompt_tokens = ctx.pending().len();
        let mut gen = ctx.generate(Sampler::Argmax).max_tokens(max_tokens);
        let mut ttft = None;
        while let Some(step) = gen.next()? {
            block_on(step.execute())?;
            ttft.get_or_insert_with(|| t0.elapsed());
        }
        let reply = gen.text().to_string();
        drop(ctx);
        let after = engine.metrics();
        out.push(Request {
            prompt_tokens,
            cached_tokens: after.prefix_hit_tokens - before.prefix_hit_tokens,
            prefilled: after.tokens_prefilled - before.tokens_prefilled,
            ttft: ttft.unwrap_or_else(|| t0.elapsed()),
            reply,
        });
    }
    Ok(out)
}

/// Sixteen short questions.
pub fn questions() -> Vec<String> {
    [
        "Where is my order?",
        "How do I return a loom?",
        "Is yarn covered by the warranty?",
        "Can I change my password?",
        "Do you ship abroad?",
        "What does a repair cost?",
        "How do I cancel my subscription?",
        "Can I use two discount codes?",
        "Do gift cards expire?",
        "Who can see my data?",
        "How long does shipping take?",
        "Can I install the loom myself?",
        "Why was I billed twice?",
        "Can I return used yarn?",
        "How do I delete my account?",
        "Is the warranty transferable?",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let model = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "smollm2-135m".into());
    let engine = Engine::load(&model)?;
    let system = system_prompt(&engine, 1500);
    let requests = run(&engine, &system, &questions(), 16)?;
    for (i, r) in requests.iter().enumerate() {
        println!(
            "request {:>2}: {:>4} prompt tokens, {:>4} from the cache, {:>4} prefilled, TTFT {:>7.1} ms",
            i + 1,
            r.prompt_tokens,
            r.cached_tokens,
            r.prefilled,
            r.ttft.as_secs_f64() * 1e3
        );
    }
    let mut rest: Vec<f64> = requests[1..].iter().map(|r| r.ttft.as_secs_f64()).collect();
    rest.sort_by(f64::total_cmp);
    let first = requests[0].ttft.as_secs_f64();
    let second = requests[1].ttft.as_secs_f64();
    println!(
        "{model}: TTFT 1st {:.1} ms, 2nd {:.1} ms ({:.1}x faster), median of requests 2-16 {:.1} ms",
        first * 1e3,
        second * 1e3,
        first / second,
        rest[rest.len() / 2] * 1e3
    );
    Ok(())
}
