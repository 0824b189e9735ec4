//! Logit transforms applied before sampling: repetition / presence / frequency penalties and
//! per-token logit bias.

use super::SamplerError;

/// Penalties on tokens already in the history, with llama.cpp's semantics (its
/// `penalties` sampler). For a token seen `c` > 0 times in the window:
///
/// - repetition `r`: a positive logit is divided by `r`, a negative (or zero) one multiplied
///   (1.0 = off, > 1 discourages repeats);
/// - then `logit -= c * frequency + presence` (OpenAI's presence / frequency penalties;
///   0 = off, negative values encourage repeats).
///
/// The window is the last `last_n` tokens of the history (0 = the whole history).
#[derive(Clone, Debug, PartialEq)]
pub struct Penalties {
    /// Repetition penalty, > 0 (1.0 = off).
    pub repetition: f32,
    /// Subtracted once from the logit of every token present in the window.
    pub presence: f32,
    /// Subtracted from the logit of every token once per occurrence in the window.
    pub frequency: f32,
    /// How many of the most recent history tokens are looked at (0 = all of them).
    pub last_n: usize,
}

impl Default for Penalties {
    /// All penalties off, with llama.cpp's default window of 64 tokens.
    fn default() -> Penalties {
        Penalties {
            repetition: 1.0,
            presence: 0.0,
            frequency: 0.0,
            last_n: 64,
        }
    }
}

impl Penalties {
    /// Whether applying these penalties changes nothing.
    pub fn is_off(&self) -> bool {
        self.repetition == 1.0 && self.presence == 0.0 && self.frequency == 0.0
    }

    /// Checks that the repetition penalty is finite and > 0 and the others are finite.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |name, expected, value| {
            Err(SamplerError::Penalty {
                name,
                expected,
                value,
            })
        };
        if !(self.repetition.is_finite() && self.repetition > 0.0) {
            return bad("repetition", "a finite number > 0", self.repetition);
        }
        for (name, value) in [("presence", self.presence), ("frequency", self.frequency)] {
            if !value.is_finite() {
                return bad(name, "finite", value);
            }
        }
        Ok(())
    }

    /// Penalizes, in place, the logits of the tokens in the window of `history`. Ids past the
    /// end of `logits` are ignored.
    pub fn apply(&self, logits: &mut [f32], history: &[u32]) {
        if self.is_off() {
            return;
        }
        let start = match self.last_n {
            0 => 0,
            n => history.len().saturating_sub(n),
        };
        // Count occurrences by sorting a copy of the window: runs of equal ids.
        let mut window = history[start..].to_vec();
        window.sort_unstable();
        for run in window.chunk_by(|a, b| a == b) {
            let Some(l) = logits.get_mut(run[0] as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= self.repetition;
            } else {
                *l *= self.repetition;
            }
            *l -= run.len() as f32 * self.frequency + self.presence;
        }
    }
}

/// Adds `bias` to the logits of the listed tokens, in place; a bias of `f32::NEG_INFINITY`
/// bans the token (its logit becomes `-inf`). Ids past the end of `logits` are ignored (see
/// [`validate_logit_bias`]); a token listed twice gets both biases.
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            // Set rather than add for a ban: +inf + -inf would be NaN.
            *l = if b == f32::NEG_INFINITY { b } else { *l + b };
        }
    }
}

/// Checks a logit bias list for a vocabulary of `vocab` tokens: every id in range, every bias
/// finite or `-inf`.
pub fn validate_logit_bias(bias: &[(u32, f32)], vocab: usize) -> Result<(), SamplerError> {
    for &(id, b) in bias {
        if id as usize >= vocab {
            return Err(SamplerError::BiasTokenOutOfRange {
                id,
                vocab_size: vocab,
            });
        }
        if !(b.is_finite() || b == f32::NEG_INFINITY) {
            return Err(SamplerError::BiasValue { id, bias: b });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_match_hand_computation() {
        // Counts in [0, 1, 0, 3]: id 0 twice, ids 1 and 3 once, id 2 never.
        let p = Penalties {
            repetition: 2.0,
            presence: 0.5,
            frequency: 0.25,
            last_n: 0,
        };
        let mut logits = [2.0, -1.0, 0.5, 3.0];
        p.apply(&mut logits, &[0, 1, 0, 3, 99]);
        // id 0: 2/2 - (2*0.25 + 0.5) = 0; id 1: -1*2 - 0.75 = -2.75; id 3: 3/2 - 0.75 = 0.75.
        assert_eq!(logits, [0.0, -2.75, 0.5, 0.75]);
        // last_n = 2 looks at [0, 3] only: id 0: 1 - 0.75 = 0.25.
        let mut logits = [2.0, -1.0, 0.5, 3.0];
        Penalties {
            last_n: 2,
            ..p.clone()
        }
        .apply(&mut logits, &[0, 1, 0, 3]);
        assert_eq!(logits, [0.25, -1.0, 0.5, 0.75]);
        // Off by default.
        let mut logits = [2.0, -1.0];
        Penalties::default().apply(&mut logits, &[0, 1, 1]);
        assert_eq!(logits, [2.0, -1.0]);
        assert!(Penalties::default().is_off());
    }

    #[test]
    fn penalties_validate() {
        assert!(Penalties::default().validate().is_ok());
        assert!(Penalties {
            presence: -1.0,
            frequency: 2.0,
            ..Default::default()
        }
        .validate()
        .is_ok());
        for bad in [
            Penalties {
                repetition: 0.0,
                ..Default::default()
            },
            Penalties {
                repetition: f32::NAN,
                ..Default::default()
            },
            Penalties {
                presence: f32::INFINITY,
                ..Default::default()
            },
            Penalties {
                frequency: f32::NAN,
                ..Default::default()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(SamplerError::Penalty { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn logit_bias_adds_and_bans() {
        let mut logits = [1.0, 2.0, f32::INFINITY, 0.0];
        let bias = [
            (0, 0.5),
            (2, f32::NEG_INFINITY),
            (3, -1.0),
            (3, -1.0),
            (7, 1.0),
        ];
        apply_logit_bias(&mut logits, &bias);
        assert_eq!(logits, [1.5, 2.0, f32::NEG_INFINITY, -2.0]);
        assert_eq!(
            validate_logit_bias(&bias, 4),
            Err(SamplerError::BiasTokenOutOfRange {
                id: 7,
                vocab_size: 4
            })
        );
        assert!(validate_logit_bias(&bias[..4], 4).is_ok());
        for b in [f32::NAN, f32::INFINITY] {
            assert!(matches!(
                validate_logit_bias(&[(1, b)], 4),
                Err(SamplerError::BiasValue { id: 1, .. })
            ));
        }
    }
}
