//! The generation loop over [`Forward`]: sample, accept, check the stop rules, repeat.

use std::sync::PoisonError;

use weft_core::sampling::{Penalties, Sampler};
use weft_core::tokenizer::Utf8Buffer;

mod options;
mod saved;
mod step;
mod stop;

pub use step::{Step, StepOutput};
pub use stop::{StopRules, StopStrings};

use crate::adapter::PassAdapters;
use crate::constraint::{Constraint, Schema, TokenMask};
use crate::context::{AbandonSlot, Context, Mark};
use crate::error::{Error, Result};
use crate::probe::ProbeKind;
use crate::speculate::{NgramSpeculator, Speculator};

/// Why a generator stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    MaxTokens,
    /// The model emitted a stop token (default end-of-turn set or [`Generator::stop`]).
    StopToken(u32),
    /// The output ended with a stop sequence of token ids.
    StopSequence(Vec<u32>),
    /// The output text contains a stop string.
    StopString(String),
    /// A constraint reached its terminal state.
    Constraint,
    /// A builder option was invalid (the error was returned by `next`).
    Error,
    /// The caller ended it early with [`Generator::end`].
    Ended,
    /// The context is full: the next token would not fit in the engine's `n_ctx` (it is left
    /// pending, as a stop rule leaves the last token).
    ContextFull,
}

/// A multi-step generation loop over a [`Context`].
///
/// Each step runs one [`Forward`](crate::Forward) pass (the prompt on the first step, then the last accepted
/// token), samples a token at its last position and checks the stop rules: `max_tokens`, the
/// model's end-of-turn set plus [`Generator::stop`], stop sequences of ids, stop strings.
/// Drain it with a collector, or drive it with [`Generator::next`] to see or replace each
/// step. When it stops, the last accepted token (not run yet) is left in the context's pending
/// buffer, so the context holds the whole conversation. To leave a loop early and keep that
/// token too, call [`Generator::end`]: a generator dropped before it stops drops it.
///
/// ```no_run
/// use weft::{Engine, Sampler};
/// # fn main() -> weft::Result<()> {
/// let engine = Engine::load("smollm2-135m")?;
/// let mut ctx = engine.context();
/// ctx.fill("Once upon a time")?;
/// let text = weft::block_on(
///     ctx.generate(Sampler::TopP { p: 0.95, temperature: 0.7 })
///         .max_tokens(32)
///         .stop_string("\n\n")
///         .collect_text(),
/// )?;
/// println!("{text}");
/// # Ok(()) }
/// ```
pub struct Generator<'c> {
    ctx: &'c mut Context,
    sampler: Sampler,
    stop: StopRules,
    /// The model's end-of-turn set.
    eos: Vec<u32>,
    /// The caller's horizon hint (`None`: the passes left before `max_tokens`).
    horizon: Option<usize>,
    penalties: Option<Penalties>,
    bias: Vec<(u32, f32)>,
    each_step: Vec<(usize, ProbeKind)>,
    generated: Vec<u32>,
    /// Accepted tokens not run yet: the next step's input.
    next_input: Vec<u32>,
    /// Text of `generated` decoded so far, and how much of it was streamed.
    text: String,
    bytes: Utf8Buffer,
    streamed: usize,
    stopped: Option<StopReason>,
    constraints: Vec<Box<dyn Constraint>>,
    /// The schemas behind the compiled constraints (a snapshot saves these) and whether a
    /// constraint of the caller's own type was added (it cannot be saved).
    schemas: Vec<Schema>,
    custom_constraint: bool,
    speculator: Option<Box<dyn Speculator>>,
    /// The speculator is the built-in n-gram drafter (a snapshot can name it).
    builtin_speculator: bool,
    system_speculation: bool,
    draft_len: usize,
    /// Speculative tokens drafted and kept so far.
    drafted: usize,
    draft_accepted: usize,
    /// A builder option that failed (returned by the first `next`, before any pass).
    config_error: Option<Error>,
    /// Where the step in flight started: if its future is dropped, the next step goes back
    /// there.
    restart: Option<Restart>,
    /// The adapters every step runs with (none named: the engine's stack).
    adapters: PassAdapters,
    _forget: ForgetOnDrop,
}

/// Tells the scheduler, when the generator goes away, not to wait for the passes its last
/// step announced. A field rather than `Drop` on the generator, so the generator's borrow of
/// its context still ends at its last use.
struct ForgetOnDrop {
    shared: std::sync::Arc<crate::scheduler::Shared>,
    seq: weft_core::kv::SeqId,
}

impl Drop for ForgetOnDrop {
    fn drop(&mut self) {
        self.shared.forget(self.seq);
    }
}

/// The state a step starts from: the context's, and the generator's next input. Dropped with
/// them still in it (the step's future and then the generator were dropped while its pass
/// was in flight), it leaves them to the context, whose next operation goes back there.
struct Restart {
    state: Option<(Mark, Vec<u32>)>,
    slot: AbandonSlot,
}

impl Restart {
    fn new(ctx: &Context, input: Vec<u32>) -> Restart {
        Restart {
            state: Some((ctx.mark(), input)),
            slot: ctx.abandon_slot(),
        }
    }

    /// The state, taken: dropping the restart then leaves nothing.
    fn take(&mut self) -> Option<(Mark, Vec<u32>)> {
        self.state.take()
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(state);
        }
    }
}

/// Default longest draft of speculative decoding.
const DEFAULT_DRAFT: usize = 6;

impl<'c> Generator<'c> {
    pub(crate) fn new(ctx: &'c mut Context, sampler: Sampler) -> Generator<'c> {
        let eos = ctx.engine().stop_tokens().to_vec();
        let stop = ctx.engine().config().generation.stop.clone();
        let forget = ForgetOnDrop {
            shared: ctx.engine().inner.shared.clone(),
            seq: ctx.seq(),
        };
        Generator {
            ctx,
            sampler,
            stop,
            eos,
            horizon: None,
            penalties: None,
            bias: Vec::new(),
            each_step: Vec::new(),
            generated: Vec::new(),
            next_input: Vec::new(),
            text: String::new(),
            bytes: Utf8Buffer::default(),
            streamed: 0,
            stopped: None,
            constraints: Vec::new(),
            schemas: Vec::new(),
            custom_constraint: false,
            speculator: None,
            builtin_speculator: false,
            system_speculation: false,
            draft_len: DEFAULT_DRAFT,
            drafted: 0,
            draft_accepted: 0,
            config_error: None,
            restart: None,
            adapters: PassAdapters::default(),
            _forget: forget,
        }
    }

    /// The logit bias of the next step: the caller's, plus `-inf` on every stop id while
    /// fewer than `min_tokens` were generated — unless the constraints' `mask` allows
    /// nothing else (then `None`: the step bans nothing).
    fn step_bias(&self, mask: Option<&TokenMask>) -> Option<Vec<(u32, f32)>> {
        let mut bias = self.bias.clone();
        let banned = self.stop.banned(self.generated.len(), &self.eos);
        if mask.is_some_and(|m| allows_only(m, &banned)) {
            return None;
        }
        bias.extend(banned.into_iter().map(|t| (t, f32::NEG_INFINITY)));
        Some(bias)
    }

    /// Gives the context's KV pages back to the pool (see [`crate::Context::evict`]); the next
    /// step recomputes everything, so the output goes on exactly as if nothing happened. A
    /// server does this to a request whose step failed because the KV pool is full.
    pub fn evict(&mut self) -> Result<()> {
        self.undo_dropped_step()?;
        self.ctx.evict()
    }

    /// If the last step's future was dropped before it finished, undoes what it ran.
    fn undo_dropped_step(&mut self) -> Result<()> {
        if let Some((mark, input)) = self.restart.take().and_then(|mut r| r.take()) {
            self.ctx.rewind_to(mark)?;
            self.next_input = input;
        }
        Ok(())
    }

    /// The context this generator runs on. The last token accepted waits in the generator
    /// until the next step runs it, so the context lacks it while the generation goes on: to
    /// branch from here, [`Generator::fork_context`].
    pub fn context(&self) -> &Context {
        self.ctx
    }

    /// A fork of the context with everything generated so far, the tokens accepted but not
    /// run yet included (pending in the fork): branching a generation where it stands
    /// (best-of-n, tree search), its KV pages shared until either side writes them. A step
    /// whose future was dropped is undone first.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("Three ideas for a story:")?;
    /// let mut gen = ctx.generate(weft::Sampler::Argmax).max_tokens(32);
    /// for _ in 0..4 {
    ///     if let Some(step) = gen.next()? {
    ///         weft::block_on(step.execute())?;
    ///     }
    /// }
    /// let mut branch = gen.fork_context()?;
    /// let other = weft::block_on(
    ///     branch
    ///         .generate(weft::Sampler::TopP { p: 0.9, temperature: 1.0 })
    ///         .max_tokens(28)
    ///         .collect_text(),
    /// )?;
    /// # Ok(()) }
    /// ```
    pub fn fork_context(&mut self) -> Result<Context> {
        self.undo_dropped_step()?;
        let mut fork = self.ctx.fork()?;
        fork.push_pending(&self.next_input);
        Ok(fork)
    }

    /// Stops here, as a stop rule would ([`StopReason::Ended`]): the tokens accepted but not
    /// run yet (the last one streamed) go to the context's pending buffer, so the context
    /// holds everything generated so far; a step whose future was dropped is undone first.
    /// Does nothing once stopped.
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("Once upon a time")?;
    /// let mut gen = ctx.generate(weft::Sampler::Argmax);
    /// let mut text = String::new();
    /// while let Some(delta) = weft::block_on(gen.next_text())? {
    ///     text.push_str(&delta);
    ///     if text.len() > 12 {
    ///         gen.end()?;
    ///         break;
    ///     }
    /// }
    /// // The last token streamed waits in the pending buffer, run by the next pass.
    /// assert!(!ctx.pending().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn end(&mut self) -> Result<()> {
        self.undo_dropped_step()?;
        if self.stopped.is_none() {
            self.finish(StopReason::Ended);
        }
        Ok(())
    }

    /// Whether the generator has stopped.
    pub fn is_done(&self) -> bool {
        self.stopped.is_some()
    }

    /// Why it stopped, once it has.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    /// Tokens accepted so far.
    pub fn tokens_generated(&self) -> usize {
        self.generated.len()
    }

    /// The accepted tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.generated
    }

    /// The next step, or `None` once stopped. Run it with [`Step::execute`]; a step whose
    /// sampler was cleared needs [`Generator::accept`] with the chosen token.
    // Not an `Iterator`: each step borrows the generator, and the name is the seeds' API.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Step<'_, 'c>>> {
        if let Some(e) = self.config_error.take() {
            self.stopped = Some(StopReason::Error);
            return Err(e);
        }
        if self.stopped.is_some() {
            return Ok(None);
        }
        self.undo_dropped_step()?;
        if self.system_speculation {
            if self.speculator.is_some() {
                self.stopped = Some(StopReason::Error);
                return Err(Error::Config(
                    "speculator and system_speculation cannot be used together".into(),
                ));
            }
            self.speculator = Some(Box::new(NgramSpeculator::default()));
            self.builtin_speculator = true;
            self.system_speculation = false;
        }
        if self.stopped.is_none() && self.generated.len() >= self.stop.max_tokens {
            self.finish(StopReason::MaxTokens);
        }
        // A generation that has filled the context stops there, keeping what it made; a
        // prompt that does not fit stays an error (`ContextTooLong`) from the pass.
        let next_len = self.held();
        if self.stopped.is_none()
            && !self.generated.is_empty()
            && next_len > self.ctx.engine().n_ctx()
        {
            self.finish(StopReason::ContextFull);
        }
        if self.stopped.is_some() {
            return Ok(None);
        }
        if self.next_input.is_empty() && self.ctx.pending().is_empty() {
            // Nothing to run: recompute the last token's logits by running it again.
            self.ctx.unrun_last()?;
        }
        Ok(Some(Step {
            gen: self,
            auto: true,
            probes: Vec::new(),
        }))
    }

    /// Registers tokens chosen outside the loop (after a step whose sampler was cleared):
    /// they count against `max_tokens`, are checked against the stop rules and are run by the
    /// next step. An id past the vocabulary is [`Error::TokenOutOfVocab`], one the
    /// generator's constraints do not allow there [`Error::TokenNotAllowed`] (the step's
    /// [`StepOutput::allowed`] is the set to choose from), and more tokens than the context
    /// has room for [`Error::ContextTooLong`]; then none of `tokens` is taken. As with sampled
    /// tokens, the last one may fall one past the context: it is kept (pending, never run) and
    /// the generation stops there ([`StopReason::ContextFull`]).
    pub fn accept(&mut self, tokens: &[u32]) -> Result<()> {
        self.ctx.engine().check_ids(tokens.iter().copied())?;
        // After a dropped step, its input goes back first: these tokens come after it.
        self.undo_dropped_step()?;
        let len = self.held() + tokens.len();
        let n_ctx = self.ctx.engine().n_ctx();
        if len > n_ctx + 1 && self.stopped.is_none() {
            return Err(Error::ContextTooLong { len, n_ctx });
        }
        if self.stopped.is_none() && !self.constraints.is_empty() {
            let vocab = self.ctx.engine().info().vocab_size;
            let mut after = self.generated.clone();
            for &id in tokens {
                let allowed = constraint_mask(&mut self.constraints, &after, vocab)?;
                if !allowed.is_some_and(|m| m.is_allowed(id)) {
                    return Err(Error::TokenNotAllowed { id });
                }
                if self.stop.is_stop_token(id, &self.eos) {
                    break;
                }
                after.push(id);
            }
        }
        self.accept_run(tokens, 0);
        Ok(())
    }

    /// Tokens the context will hold once the next step runs: run, pending and accepted.
    fn held(&self) -> usize {
        self.ctx.len() + self.ctx.pending().len() + self.next_input.len()
    }

    /// Accepts `tokens`, of which the first `in_cache` already ran (speculative drafts the
    /// model confirmed). Returns how many were taken before a stop rule ended generation.
    fn accept_run(&mut self, tokens: &[u32], in_cache: usize) -> usize {
        for (i, &t) in tokens.iter().enumerate() {
            if self.stopped.is_some() {
                return i;
            }
            if i >= in_cache {
                self.next_input.push(t);
            }
            self.generated.push(t);
            if self.stop.is_stop_token(t, &self.eos) {
                self.generated.pop();
                self.finish(StopReason::StopToken(t));
                return i + 1;
            }
            self.push_text(t);
            // A stop string or sequence the token completes ends the generation even when the
            // token also completes a constraint: the text is cut before it, as always. Running
            // out of tokens on the token that completes a constraint is the constraint's end.
            let rule = self.stop.check(&self.generated, &self.text);
            let terminal = self.constraints.iter_mut().any(|c| {
                // A constraint that cannot judge the tokens has already seen them in its
                // mask; an error here surfaces at the next step's mask.
                c.is_terminal(&self.generated).unwrap_or(false)
            });
            let reason = match rule {
                Some(StopReason::MaxTokens) | None if terminal => Some(StopReason::Constraint),
                rule => rule,
            };
            if let Some(reason) = reason {
                self.finish(reason);
                return i + 1;
            }
        }
        tokens.len()
    }

    /// Appends a token's bytes to the text, keeping an incomplete UTF-8 tail for later.
    fn push_text(&mut self, t: u32) {
        let tok = self.ctx.engine().tokenizer();
        if tok.append_piece(t, false, self.bytes.pending_mut()).is_ok() {
            self.text.push_str(&self.bytes.take_complete());
        }
    }

    fn finish(&mut self, reason: StopReason) {
        self.stopped = Some(reason);
        // A character cut off at the end (the last token began a multi-byte character) shows
        // as U+FFFD, as `detokenize` shows it, rather than vanishing from the text.
        let tail = self.bytes.finish();
        self.text.push_str(&tail);
        // Leave the last accepted token(s) in the context so it holds the whole exchange.
        let rest = std::mem::take(&mut self.next_input);
        self.ctx.push_pending(&rest);
        // The last step announced more passes: the scheduler need not wait for them.
        self.ctx.engine().inner.shared.forget(self.ctx.seq());
    }

    /// The output text, cut before a matched stop string.
    fn final_text(&self) -> &str {
        match &self.stopped {
            Some(StopReason::StopString(_)) => self
                .stop
                .stop_strings
                .find(&self.text)
                .map_or(&self.text, |(i, _)| &self.text[..i]),
            _ => &self.text,
        }
    }

    /// Runs to the end; returns the accepted token ids (stop tokens excluded).
    pub async fn collect_tokens(mut self) -> Result<Vec<u32>> {
        while let Some(step) = self.next()? {
            step.execute().await?;
        }
        Ok(std::mem::take(&mut self.generated))
    }

    /// The output text so far (cut before a matched stop string).
    pub fn text(&self) -> &str {
        self.final_text()
    }

    /// Runs to the end under a JSON Schema derived from `T` and parses the output into `T`.
    ///
    /// ```no_run
    /// #[derive(serde::Deserialize, weft::schemars::JsonSchema)]
    /// #[schemars(crate = "weft::schemars")] // or derive with your own schemars 1.x
    /// struct City { name: String, population: u32 }
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("The largest city of Japan, as JSON:")?;
    /// let city: City = weft::block_on(ctx.generate(weft::Sampler::Argmax).collect_json())?;
    /// # Ok(()) }
    /// ```
    pub async fn collect_json<T: serde::de::DeserializeOwned + schemars::JsonSchema>(
        self,
    ) -> Result<T> {
        let schema = serde_json::to_value(schemars::schema_for!(T)).map_err(|e| Error::Json {
            message: e.to_string(),
            output: String::new(),
        })?;
        let text = self
            .constrain_with(Schema::JsonSchema(schema))
            .collect_text()
            .await?;
        serde_json::from_str(&text).map_err(|e| Error::Json {
            message: e.to_string(),
            output: text,
        })
    }

    /// Runs to the end; returns the text (control tokens not rendered, cut before a stop
    /// string).
    pub async fn collect_text(mut self) -> Result<String> {
        while let Some(step) = self.next()? {
            step.execute().await?;
        }
        Ok(self.final_text().to_string())
    }

    /// Runs steps until new text is available and returns it: the stream of UTF-8-safe text
    /// deltas, `None` at the end. Text that might be the start of a stop string is held back
    /// until it is clear.
    pub async fn next_text(&mut self) -> Result<Option<String>> {
        loop {
            let delta = self.ready_text();
            if !delta.is_empty() {
                return Ok(Some(delta));
            }
            if self.is_done() {
                return Ok(None);
            }
            if let Some(step) = self.next()? {
                step.execute().await?;
            }
        }
    }

    /// The text the steps run so far added since the last call (or [`Generator::next_text`])
    /// that is ready to show: empty when there is none. Text that might still become a stop
    /// string is held back until it is clear, and dropped when it is one. For a loop that runs
    /// the steps itself and streams as [`Generator::next_text`] does:
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("Q: Name three colours.\nA:")?;
    /// let mut gen = ctx.generate(weft::Sampler::Argmax).stop_string("\nQ:");
    /// while let Some(step) = gen.next()? {
    ///     let step = weft::block_on(step.execute())?;
    ///     eprintln!("{} tokens this step", step.accepted.len());
    ///     print!("{}", gen.ready_text());
    /// }
    /// print!("{}", gen.ready_text());
    /// # Ok(()) }
    /// ```
    pub fn ready_text(&mut self) -> String {
        let visible = if self.is_done() {
            self.final_text().len()
        } else {
            self.text.len() - self.stop.stop_strings.held_back(&self.text)
        };
        if visible <= self.streamed {
            return String::new();
        }
        let delta = self.text[self.streamed..visible].to_string();
        self.streamed = visible;
        delta
    }
}

/// Whether `mask` allows some of `ids` and nothing else (`ids` may repeat).
pub(super) fn allows_only(mask: &TokenMask, ids: &[u32]) -> bool {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let allowed = ids.iter().filter(|&&t| mask.is_allowed(t)).count();
    allowed > 0 && allowed == mask.count()
}

/// The AND of every constraint's mask after `accepted` (`None` without constraints).
fn constraint_mask(
    constraints: &mut [Box<dyn Constraint>],
    accepted: &[u32],
    vocab_size: usize,
) -> Result<Option<TokenMask>> {
    let mut mask: Option<TokenMask> = None;
    for c in constraints {
        let m = c.allowed(accepted, vocab_size)?;
        match &mut mask {
            Some(acc) => acc.and_with(&m),
            None => mask = Some(m),
        }
    }
    Ok(mask)
}
