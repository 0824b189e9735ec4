//! The options of a [`Generator`], set before its first step: constraints, speculation,
//! adapters, budgets, stop rules, penalties, biases and per-step probes.

use weft_core::sampling::Penalties;

use super::{Generator, StopRules};
use crate::adapter::Adapter;
use crate::constraint::{self, Constraint, Schema};
use crate::probe::{Probe, ProbeHandle};
use crate::speculate::Speculator;

impl<'c> Generator<'c> {
    /// Constrains the output: only tokens `c` allows are sampled, and generation stops when
    /// `c` is terminal. Several constraints AND their masks.
    pub fn constrain(mut self, c: impl Constraint + 'static) -> Self {
        self.constraints.push(Box::new(c));
        self.custom_constraint = true;
        self
    }

    /// Constrains the output to `schema` (JSON Schema, any JSON, regex, Lark or GBNF grammar),
    /// compiled with llguidance. An invalid schema is returned as an error by the first step,
    /// before any pass runs.
    pub fn constrain_with(mut self, schema: Schema) -> Self {
        match constraint::compile(self.ctx.engine(), &schema) {
            Ok(c) => {
                self.constraints.push(Box::new(c));
                self.schemas.push(schema);
            }
            Err(e) => {
                self.config_error.get_or_insert(e);
            }
        }
        self
    }

    /// Drafts with a custom speculator (see [`Speculator`]). Exclusive with
    /// [`Generator::system_speculation`].
    pub fn speculator(mut self, s: impl Speculator + 'static) -> Self {
        self.speculator = Some(Box::new(s));
        self
    }

    /// Drafts with the built-in n-gram (prompt-lookup) drafter. Greedy output is unchanged;
    /// sampled output keeps the target distribution.
    pub fn system_speculation(mut self) -> Self {
        self.system_speculation = true;
        self
    }

    /// Longest draft per step (default 6). On a sliding-window model a draft is also kept
    /// within the smallest window, so that rejecting all of it never needs keys the cache has
    /// given back.
    pub fn draft_len(mut self, n: usize) -> Self {
        self.draft_len = n;
        self
    }

    /// Speculative tokens drafted and accepted so far.
    pub fn speculation_stats(&self) -> (usize, usize) {
        (self.drafted, self.draft_accepted)
    }

    /// Runs every step with `adapter` scaled by `scale` (call again to stack several; see
    /// [`Forward::adapter`](crate::Forward::adapter)). Without one, steps use the engine's
    /// stack.
    pub fn adapter(mut self, adapter: &Adapter, scale: f32) -> Self {
        self.adapters.stack.push((adapter.clone(), scale));
        self
    }

    /// Runs every step with the adapters' weights perturbed by `sigma · ε(seed)` (see
    /// [`Forward::zo_seed`](crate::Forward::zo_seed)).
    pub fn zo_seed(mut self, seed: u64, sigma: f32) -> Self {
        self.adapters.zo = Some(weft_core::lora::ZoSeed { seed, sigma });
        self
    }

    /// Stop after `n` tokens (default: the engine's, 256 unless
    /// [`EngineConfig::generation`](crate::EngineConfig::generation) says otherwise).
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.stop.max_tokens = n;
        self
    }

    /// Do not stop on the model's end-of-turn set (EOS and end-of-turn markers): generate
    /// until `max_tokens` or another stop rule. Those tokens are then ordinary output. With
    /// `max_tokens(n)` and no other rule, exactly `n` tokens come out (seed 002's
    /// `generate(n)`, Hugging Face's `min_new_tokens = max_new_tokens`).
    ///
    /// ```no_run
    /// # fn main() -> weft::Result<()> {
    /// let engine = weft::Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("Count: one, two,")?;
    /// let gen = ctx.generate(weft::Sampler::Argmax).max_tokens(40).ignore_eos();
    /// let ids = weft::block_on(gen.collect_tokens())?;
    /// assert_eq!(ids.len(), 40);
    /// # Ok(()) }
    /// ```
    pub fn ignore_eos(mut self) -> Self {
        self.stop.ignore_eos = true;
        self
    }

    /// Generate at least `n` tokens: until then the stop ids (end-of-turn set and
    /// [`Generator::stop`]) cannot be sampled — unless a constraint allows nothing but a stop
    /// id (its language ends there), as it also ends a generation it completes. Stop strings
    /// and sequences still apply.
    pub fn min_tokens(mut self, n: usize) -> Self {
        self.stop.min_tokens = n;
        self
    }

    /// Replaces every stop rule (`max_tokens`, `min_tokens`, `ignore_eos`, stop ids,
    /// sequences and strings) with `rules`.
    pub fn stop_rules(mut self, rules: StopRules) -> Self {
        self.stop = rules;
        self
    }

    /// The stop rules in effect.
    pub fn rules(&self) -> &StopRules {
        &self.stop
    }

    /// Tells the scheduler how many more passes to expect after each step (default: the
    /// steps left before `max_tokens`). The scheduler waits briefly (at most
    /// [`EngineConfig::batch_wait`](crate::EngineConfig::batch_wait)) for contexts that
    /// announced more passes, so that concurrent generations share model calls; a
    /// generation that will likely stop early (a short answer under a large `max_tokens`)
    /// can say 0 and never be waited for.
    pub fn horizon(mut self, n: usize) -> Self {
        self.horizon = Some(n);
        self
    }

    /// Also stop on these ids (added to the model's end-of-turn set, which stays).
    pub fn stop(mut self, ids: &[u32]) -> Self {
        self.stop = self.stop.stop_tokens(ids);
        self
    }

    /// Stop when the output ends with this sequence of ids (kept in the output).
    pub fn stop_sequence(mut self, ids: &[u32]) -> Self {
        self.stop = self.stop.stop_sequence(ids);
        self
    }

    /// Stop when the output text contains `s`; text collectors cut the text before it.
    pub fn stop_string(mut self, s: &str) -> Self {
        self.stop = self.stop.stop_string(s);
        self
    }

    /// Repetition / presence / frequency penalties over the context's tokens.
    pub fn penalties(mut self, p: Penalties) -> Self {
        self.penalties = Some(p);
        self
    }

    /// Adds a bias to the logits of the listed ids at every step.
    pub fn logit_bias(mut self, bias: &[(u32, f32)]) -> Self {
        self.bias.extend_from_slice(bias);
        self
    }

    /// Attaches `probe` to every step; read it from each [`StepOutput`](super::StepOutput) with the handle.
    /// `index` 0 is the position the step samples from.
    pub fn probe_each_step<P: Probe>(&mut self, index: usize, probe: P) -> ProbeHandle<P> {
        self.each_step.push((index, probe.kind()));
        ProbeHandle::new(self.each_step.len() - 1)
    }
}
