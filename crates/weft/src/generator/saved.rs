//! Saving a generator in flight inside a context snapshot, and taking it up again.
//!
//! What is saved is the generator's configuration and progress, as JSON inside the snapshot:
//! the sampler, the stop rules, penalties and bias, the tokens generated so far, how much text
//! was streamed, the schemas of its constraints (recompiled on resume and brought to the same
//! state by replaying the generated tokens) and whether it used the built-in speculator. The
//! sampler's random state lives in the context and is saved with it.

use serde_json::{json, Value};
use weft_core::sampling::{Penalties, Sampler};

use super::{Generator, StopReason};
use crate::constraint::Schema;
use crate::context::Context;
use crate::error::{Error, Result};

impl Generator<'_> {
    /// A snapshot of the context (see [`Context::snapshot`]) that also holds this generator's
    /// state, so that [`Context::resume_generator`] on the resumed context continues the
    /// generation exactly: the same tokens as if it had never stopped, constraints included.
    ///
    /// Constraints must come from [`Generator::constrain_with`] (a [`Schema`]); a custom
    /// [`Constraint`](crate::Constraint) or [`Speculator`](crate::Speculator), or LoRA
    /// adapters named on the generator, cannot be saved and give [`Error::Config`]. Per-step probes are not saved: add them again. A generator
    /// that has stopped saves just its context.
    ///
    /// ```no_run
    /// use weft::{Engine, Sampler, Schema};
    /// # fn main() -> weft::Result<()> {
    /// let engine = Engine::load("smollm2-135m")?;
    /// let mut ctx = engine.context();
    /// ctx.fill("A JSON list of three colours:")?;
    /// let mut gen = ctx.generate(Sampler::Argmax).constrain_with(Schema::AnyJson).max_tokens(40);
    /// for _ in 0..10 {
    ///     if let Some(step) = gen.next()? {
    ///         weft::block_on(step.execute())?;
    ///     }
    /// }
    /// let bytes = gen.snapshot()?;
    ///
    /// let mut resumed = engine.resume(&bytes)?;
    /// let json = weft::block_on(resumed.resume_generator()?.collect_text())?;
    /// # Ok(()) }
    /// ```
    pub fn snapshot(&mut self) -> Result<Vec<u8>> {
        self.undo_dropped_step()?;
        // A schema that failed to compile is not among the saved ones: saving would resume
        // the generation unconstrained. Its error comes now, as the first step's would.
        if let Some(e) = self.config_error.take() {
            self.stopped = Some(StopReason::Error);
            return Err(e);
        }
        if self.stopped.is_some() {
            return self.ctx.snapshot();
        }
        if self.custom_constraint {
            return Err(Error::Config(
                "snapshot: a custom constraint cannot be saved (only a schema's can: JSON \
                 schema, regex or grammar)"
                    .into(),
            ));
        }
        if !self.adapters.stack.is_empty() || self.adapters.zo.is_some() {
            return Err(Error::Config(
                "snapshot: a generator with LoRA adapters cannot be saved (adapters are not part of \
                 a snapshot)"
                    .into(),
            ));
        }
        if self.speculator.is_some() && !self.builtin_speculator {
            return Err(Error::Config(
                "snapshot: a custom speculator cannot be saved".into(),
            ));
        }
        let state = json!({
            "sampler": sampler_json(&self.sampler),
            "max_tokens": self.stop.max_tokens,
            "min_tokens": self.stop.min_tokens,
            "ignore_eos": self.stop.ignore_eos,
            "stops": sorted(self.stop.stop_tokens.iter().copied()),
            "stop_sequences": self.stop.stop_sequences,
            "stop_strings": self.stop.stop_strings.as_slice(),
            "penalties": self.penalties.as_ref().map(|p| json!({
                "repetition": p.repetition,
                "presence": p.presence,
                "frequency": p.frequency,
                "last_n": p.last_n,
            })),
            // JSON has no infinity: `-inf` (a banned id) is written as the string "-inf".
            "bias": self.bias.iter().map(|&(t, b)| match b.is_finite() {
                true => json!([t, b]),
                false => json!([t, b.to_string()]),
            }).collect::<Vec<_>>(),
            "generated": self.generated,
            "streamed": self.streamed,
            "schemas": self.schemas.iter().map(schema_json).collect::<Vec<_>>(),
            "speculation": self.builtin_speculator || self.system_speculation,
            "draft_len": self.draft_len,
            "drafted": self.drafted,
            "draft_accepted": self.draft_accepted,
        });
        let input = self.next_input.clone();
        self.ctx.snapshot_with(Some(state.to_string()), &input)
    }
}

impl Context {
    /// The generator saved by [`Generator::snapshot`] in the snapshot this context was
    /// resumed from, with its sampler, stop rules, constraints and progress: it continues as
    /// if it had never stopped (`tokens()` and the collectors include what it generated
    /// before the snapshot). Builder methods still apply (e.g. a new `max_tokens`).
    /// [`Error::Config`] when the snapshot held no generator in flight.
    pub fn resume_generator(&mut self) -> Result<Generator<'_>> {
        let json = self.take_saved_generator().ok_or_else(|| {
            Error::Config(
                "this context holds no saved generator: it was not resumed from a generator's \
                 snapshot, or its generator was already taken up"
                    .into(),
            )
        })?;
        let bad = |what: &str| Error::SnapshotCorrupt {
            reason: format!("saved generator: {what}"),
        };
        let v: Value = serde_json::from_str(&json).map_err(|e| bad(&e.to_string()))?;
        let sampler = parse_sampler(&v["sampler"]).ok_or_else(|| bad("sampler"))?;
        let usize_of = |k: &str| {
            v[k].as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| bad(k))
        };
        let ids = |x: &Value| -> Option<Vec<u32>> {
            x.as_array()?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect()
        };
        let vocab_size = self.engine().info().vocab_size;
        let generated = ids(&v["generated"]).ok_or_else(|| bad("generated"))?;
        if generated.iter().any(|&t| t as usize >= vocab_size) {
            return Err(bad("generated tokens outside the vocabulary"));
        }
        let stops = ids(&v["stops"]).ok_or_else(|| bad("stops"))?;
        let stop_sequences = v["stop_sequences"]
            .as_array()
            .and_then(|a| a.iter().map(ids).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("stop_sequences"))?;
        let stop_strings: Vec<String> =
            serde_json::from_value(v["stop_strings"].clone()).map_err(|_| bad("stop_strings"))?;
        let bias = v["bias"]
            .as_array()
            .and_then(|a| a.iter().map(bias_entry).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("bias"))?;
        let penalties = match &v["penalties"] {
            Value::Null => None,
            p => Some(Penalties {
                repetition: p["repetition"].as_f64().ok_or_else(|| bad("penalties"))? as f32,
                presence: p["presence"].as_f64().ok_or_else(|| bad("penalties"))? as f32,
                frequency: p["frequency"].as_f64().ok_or_else(|| bad("penalties"))? as f32,
                last_n: p["last_n"]
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad("penalties"))?,
            }),
        };
        let schemas = v["schemas"]
            .as_array()
            .and_then(|a| a.iter().map(parse_schema).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("schemas"))?;
        let (max_tokens, min_tokens) = (usize_of("max_tokens")?, usize_of("min_tokens")?);
        let (streamed, draft_len) = (usize_of("streamed")?, usize_of("draft_len")?);
        let (drafted, draft_accepted) = (usize_of("drafted")?, usize_of("draft_accepted")?);
        let ignore_eos = v["ignore_eos"].as_bool().ok_or_else(|| bad("ignore_eos"))?;
        let speculation = v["speculation"]
            .as_bool()
            .ok_or_else(|| bad("speculation"))?;

        let mut gen = Generator::new(self, sampler)
            .max_tokens(max_tokens)
            .min_tokens(min_tokens)
            .stop(&stops)
            .logit_bias(&bias)
            .draft_len(draft_len);
        if ignore_eos {
            gen = gen.ignore_eos();
        }
        for s in &stop_sequences {
            gen = gen.stop_sequence(s);
        }
        for s in &stop_strings {
            gen = gen.stop_string(s);
        }
        if let Some(p) = penalties {
            gen = gen.penalties(p);
        }
        for s in schemas {
            gen = gen.constrain_with(s);
        }
        if speculation {
            gen = gen.system_speculation();
        }
        for &t in &generated {
            gen.push_text(t);
        }
        gen.generated = generated;
        if !gen.text.is_char_boundary(streamed.min(gen.text.len())) {
            return Err(bad(
                "the streamed length falls inside a character of the text",
            ));
        }
        gen.streamed = streamed.min(gen.text.len());
        gen.drafted = drafted;
        gen.draft_accepted = draft_accepted;
        Ok(gen)
    }
}

fn sorted(ids: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = ids.collect();
    v.sort_unstable();
    v
}

fn sampler_json(s: &Sampler) -> Value {
    match *s {
        Sampler::Argmax => json!({"kind": "argmax"}),
        Sampler::Temperature { temperature } => {
            json!({"kind": "temperature", "temperature": temperature})
        }
        Sampler::TopK { k, temperature } => {
            json!({"kind": "top_k", "k": k, "temperature": temperature})
        }
        Sampler::TopP { p, temperature } => {
            json!({"kind": "top_p", "p": p, "temperature": temperature})
        }
        Sampler::MinP { p, temperature } => {
            json!({"kind": "min_p", "p": p, "temperature": temperature})
        }
        Sampler::TopKTopP { k, p, temperature } => {
            json!({"kind": "top_k_top_p", "k": k, "p": p, "temperature": temperature})
        }
        Sampler::Chain {
            k,
            p,
            min_p,
            temperature,
        } => json!({"kind": "chain", "k": k, "p": p, "min_p": min_p, "temperature": temperature}),
    }
}

fn parse_sampler(v: &Value) -> Option<Sampler> {
    // f32 → JSON (f64) → f32 is exact, so the sampler is bit-for-bit the saved one.
    let f = |k: &str| v[k].as_f64().map(|x| x as f32);
    let k = || v["k"].as_u64().and_then(|k| usize::try_from(k).ok());
    Some(match v["kind"].as_str()? {
        "argmax" => Sampler::Argmax,
        "temperature" => Sampler::Temperature {
            temperature: f("temperature")?,
        },
        "top_k" => Sampler::TopK {
            k: k()?,
            temperature: f("temperature")?,
        },
        "top_p" => Sampler::TopP {
            p: f("p")?,
            temperature: f("temperature")?,
        },
        "min_p" => Sampler::MinP {
            p: f("p")?,
            temperature: f("temperature")?,
        },
        "top_k_top_p" => Sampler::TopKTopP {
            k: k()?,
            p: f("p")?,
            temperature: f("temperature")?,
        },
        "chain" => Sampler::Chain {
            k: k()?,
            p: f("p")?,
            min_p: f("min_p")?,
            temperature: f("temperature")?,
        },
        _ => return None,
    })
}

fn schema_json(s: &Schema) -> Value {
    match s {
        Schema::JsonSchema(v) => json!({"json_schema": v}),
        Schema::AnyJson => json!({"any_json": true}),
        Schema::Regex(r) => json!({"regex": r}),
        Schema::Lark(g) => json!({"lark": g}),
        Schema::Gbnf(g) => json!({"gbnf": g}),
    }
}

fn parse_schema(v: &Value) -> Option<Schema> {
    let o = v.as_object()?;
    let (k, x) = o.iter().next()?;
    Some(match k.as_str() {
        "json_schema" => Schema::JsonSchema(x.clone()),
        "any_json" => Schema::AnyJson,
        "regex" => Schema::Regex(x.as_str()?.to_string()),
        "lark" => Schema::Lark(x.as_str()?.to_string()),
        "gbnf" => Schema::Gbnf(x.as_str()?.to_string()),
        _ => return None,
    })
}

/// One `[id, bias]` entry of a saved bias: the bias a number, or a string such as "-inf".
fn bias_entry(e: &Value) -> Option<(u32, f32)> {
    let id = u32::try_from(e.get(0)?.as_u64()?).ok()?;
    let b = match e.get(1)? {
        Value::String(s) => s.parse::<f32>().ok()?,
        n => n.as_f64()? as f32,
    };
    Some((id, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplers_and_schemas_round_trip_through_json() {
        let samplers = [
            Sampler::Argmax,
            Sampler::Temperature { temperature: 0.7 },
            Sampler::TopK {
                k: 40,
                temperature: 0.3,
            },
            Sampler::TopP {
                p: 0.95,
                temperature: 0.1,
            },
            Sampler::MinP {
                p: 0.05,
                temperature: 1.3,
            },
            Sampler::TopKTopP {
                k: 7,
                p: 0.9,
                temperature: 0.8,
            },
            Sampler::Chain {
                k: 50,
                p: 0.9,
                min_p: 0.1,
                temperature: 0.6,
            },
        ];
        for s in samplers {
            let text = sampler_json(&s).to_string();
            let back = parse_sampler(&serde_json::from_str(&text).unwrap());
            assert_eq!(back, Some(s));
        }
        let schemas = [
            Schema::JsonSchema(json!({"type": "object"})),
            Schema::AnyJson,
            Schema::Regex("[a-z]+".into()),
            Schema::Lark("start: \"x\"".into()),
            Schema::Gbnf("root ::= \"x\"".into()),
        ];
        for s in schemas {
            assert_eq!(parse_schema(&schema_json(&s)), Some(s));
        }
    }
}
