//! The sampling options shared by `weft run` and `weft chat`: `--temp`, `--seed`, `--top-k`,
//! `--top-p`, `--min-p`, the penalties (`--repeat-penalty`, `--presence-penalty`,
//! `--frequency-penalty` over `--repeat-last-n` tokens) and `--logit-bias`, spelled and read as
//! llama.cpp's. Every filter, penalty and bias defaults to off, so the default is plain
//! sampling at temperature 0.8. A negative value given as its own argument (`--temp -1`)
//! reaches the range checks, which say what is wrong, instead of being taken for an option.

use weft::{Penalties, Sampler};

/// How the next token is chosen.
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArg {
    /// Sampling temperature (≥ 0); 0 picks the most likely token every step.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Random seed, 0 or more; -1 (or none) draws one from the clock, as llama.cpp's. Unused
    /// when sampling is greedy (`--temp 0`).
    #[arg(long, value_parser = parse_seed, allow_negative_numbers = true)]
    pub seed: Option<Seed>,
    /// Sample among the K most likely tokens only (0 or less: off, as llama.cpp's).
    #[arg(
        long,
        value_name = "K",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub top_k: i64,
    /// Sample among the smallest set of most likely tokens whose probability reaches P
    /// (1: off). Probabilities here and for --min-p are at the temperature (as Hugging Face
    /// and vLLM; llama.cpp applies --temp after these two filters).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub top_p: f32,
    /// Drop the tokens whose probability is below P times the most likely token's (0: off).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub min_p: f32,
    /// Penalize the tokens among the last --repeat-last-n as llama.cpp's `--repeat-penalty`
    /// does (above 1 repeats less; 1: off).
    #[arg(
        long,
        value_name = "PENALTY",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    /// Subtract P from the logit of every token among the last --repeat-last-n (0: off).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Subtract P from a token's logit for each time it is among the last --repeat-last-n
    /// (0: off).
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// How many of the last tokens (the prompt's included) the penalties look at; 0 turns
    /// them off and -1 takes the whole context, as llama.cpp's.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    /// Add BIAS to a token's logit, as llama.cpp's `-l`: `ID+BIAS`, `ID-BIAS`, or `ID-inf` to
    /// never pick that token (`weft tokenize` gives the ids). Repeatable.
    #[arg(short = 'l', long, value_name = "ID(+|-)BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
}

impl SamplingArg {
    /// Whether sampling is greedy: no random number is drawn, the seed plays no part.
    pub fn is_greedy(&self) -> bool {
        self.temp == 0.0
    }

    /// The sampler these options ask for, checked by the library (the ranges the server
    /// checks too; a negative temperature is an error, not greedy). The filters run in
    /// llama.cpp's order: top-k, top-p, min-p. Checked before the model is loaded: with
    /// top-k off, `k` is `usize::MAX`, which keeps every token of any vocabulary.
    pub fn sampler(&self) -> anyhow::Result<Sampler> {
        let vocab = usize::MAX;
        Sampler::from_params(
            self.temp,
            usize::try_from(self.top_k).ok().filter(|&k| k > 0),
            (self.top_p != 1.0).then_some(self.top_p),
            (self.min_p != 0.0).then_some(self.min_p),
            vocab,
        )
        .map_err(|e| {
            use weft::sampling::SamplerError as E;
            let flag = match e {
                E::Temperature { .. } => " (--temp)",
                E::TopP { .. } => " (--top-p)",
                E::MinP { .. } => " (--min-p)",
                E::TopK => " (--top-k)",
                _ => "",
            };
            anyhow::anyhow!("{e}{flag}")
        })
    }

    /// The penalties asked for, if any (checked, whether or not `--repeat-last-n 0` turns
    /// them off).
    pub fn penalties(&self) -> anyhow::Result<Option<Penalties>> {
        let last_n = match self.repeat_last_n {
            -1 => 0,
            n => usize::try_from(n).map_err(|_| {
                anyhow::anyhow!(
                    "--repeat-last-n {n}: a count of tokens, 0 (penalties off) or -1 (the whole context)"
                )
            })?,
        };
        let p = Penalties {
            repetition: self.repeat_penalty,
            presence: self.presence_penalty,
            frequency: self.frequency_penalty,
            // The library's 0 is the whole context, llama.cpp's -1.
            last_n,
        };
        p.validate().map_err(|e| {
            use weft::sampling::SamplerError as E;
            let flag = match e {
                E::Penalty {
                    name: "presence", ..
                } => "--presence-penalty",
                E::Penalty {
                    name: "frequency", ..
                } => "--frequency-penalty",
                _ => "--repeat-penalty",
            };
            anyhow::anyhow!("{e} ({flag})")
        })?;
        Ok((!p.is_off() && self.repeat_last_n != 0).then_some(p))
    }

    /// `--logit-bias`, its ids checked against the model's vocabulary.
    pub fn logit_bias(&self, engine: &weft::Engine) -> anyhow::Result<Vec<(u32, f32)>> {
        weft::sampling::validate_logit_bias(&self.logit_bias, engine.tokenizer().vocab_size())
            .map_err(|e| anyhow::anyhow!("{e} (--logit-bias)"))?;
        Ok(self.logit_bias.clone())
    }

    /// `--seed`, or one from the clock.
    pub fn seed(&self) -> u64 {
        self.seed.and_then(|s| s.0).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
    }
}

/// `--seed`: a seed, or (`-1`) one to draw from the clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seed(pub Option<u64>);

fn parse_seed(s: &str) -> Result<Seed, String> {
    match s.trim() {
        "-1" => Ok(Seed(None)),
        v => v.parse().map(|n| Seed(Some(n))).map_err(|_| {
            format!(
                "a seed is a whole number from 0 to {}, or -1 for one from the clock",
                u64::MAX
            )
        }),
    }
}

/// `--logit-bias`: `ID+BIAS`, `ID-BIAS` or `ID-inf`, as llama.cpp reads them.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let s = s.trim();
    let split = s.find(['+', '-']).ok_or_else(|| {
        format!("{s:?}: a logit bias is a token id, then + or - and the bias: 15043+1, 15043-inf")
    })?;
    let (id, bias) = s.split_at(split);
    let id = match id {
        "" => {
            return Err(format!(
                "{s:?}: a logit bias begins with a token id, 0 or more"
            ))
        }
        id => id
            .parse()
            .map_err(|_| format!("{s:?}: {id:?} is not a token id"))?,
    };
    // -inf only as written: a number too large for f32 (`1-1e40`) is refused, not a ban.
    let never = ["-inf", "-infinity"].contains(&bias.to_ascii_lowercase().as_str());
    match bias.parse::<f32>() {
        Ok(b) if b.is_finite() || never => Ok((id, b)),
        _ => Err(format!(
            "{s:?}: a bias is a finite number, or -inf to never pick the token"
        )),
    }
}

/// `-n`: a count of tokens, or -1 (or -2) for no limit but the end of the text or of the
/// context, as llama.cpp reads them (weft never shifts the context, so the two agree).
pub fn parse_n_predict(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1 | -2) => Ok(usize::MAX),
        Ok(n) if n >= 0 => usize::try_from(n).map_err(|e| e.to_string()),
        Ok(n) => Err(format!(
            "{n} is not a count of tokens (-1 means no limit, as in llama.cpp)"
        )),
        Err(e) => Err(format!("{s:?} is not a number: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(temp: f32, top_k: i64, top_p: f32, min_p: f32) -> SamplingArg {
        SamplingArg {
            temp,
            seed: None,
            top_k,
            top_p,
            min_p,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            logit_bias: Vec::new(),
        }
    }

    #[test]
    fn flags_map_to_samplers() {
        assert_eq!(args(0.0, 40, 0.9, 0.0).sampler().unwrap(), Sampler::Argmax);
        assert_eq!(
            args(0.8, 0, 1.0, 0.0).sampler().unwrap(),
            Sampler::Temperature { temperature: 0.8 }
        );
        assert_eq!(
            args(0.7, 40, 0.95, 0.05).sampler().unwrap(),
            Sampler::Chain {
                k: 40,
                p: 0.95,
                min_p: 0.05,
                temperature: 0.7
            }
        );
        assert_eq!(
            args(0.7, 0, 0.9, 0.0).sampler().unwrap(),
            Sampler::Chain {
                k: usize::MAX,
                p: 0.9,
                min_p: 0.0,
                temperature: 0.7
            }
        );
    }

    /// llama.cpp's spellings of "off" and "random": a top-k of 0 or less, a seed of -1.
    #[test]
    fn llama_cpp_off_values_are_read_as_its() {
        assert_eq!(
            args(0.8, -1, 1.0, 0.0).sampler().unwrap(),
            Sampler::Temperature { temperature: 0.8 }
        );
        assert_eq!(parse_seed("-1"), Ok(Seed(None)));
        assert_eq!(parse_seed("42"), Ok(Seed(Some(42))));
        let e = parse_seed("-2").unwrap_err();
        assert!(e.contains("-1 for one from the clock"), "{e}");
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(args(f32::NAN, 0, 1.0, 0.0).sampler().is_err());
        assert!(args(-1.0, 0, 1.0, 0.0).sampler().is_err());
        assert!(args(0.8, 0, 0.0, 0.0).sampler().is_err());
        assert!(args(0.8, 0, 1.0, 1.5).sampler().is_err());
        let mut a = args(0.8, 0, 1.0, 0.0);
        a.repeat_penalty = 0.0;
        assert!(a.penalties().is_err());
        a.repeat_penalty = 1.1;
        assert_eq!(a.penalties().unwrap().unwrap().repetition, 1.1);
        a.presence_penalty = f32::INFINITY;
        let e = a.penalties().unwrap_err().to_string();
        assert!(e.contains("--presence-penalty"), "{e}");
        a.presence_penalty = 0.0;
        a.frequency_penalty = f32::NAN;
        let e = a.penalties().unwrap_err().to_string();
        assert!(e.contains("--frequency-penalty"), "{e}");
        a.frequency_penalty = 0.0;
        a.repeat_last_n = -2;
        let e = a.penalties().unwrap_err().to_string();
        assert!(e.contains("-1 (the whole context)"), "{e}");
    }

    /// llama.cpp's `--repeat-last-n`: 0 turns the penalties off, -1 is the whole context
    /// (the library's 0); presence and frequency penalties alone are penalties too.
    #[test]
    fn penalties_read_as_llama_cpp_reads_them() {
        let mut a = args(0.8, 0, 1.0, 0.0);
        assert_eq!(a.penalties().unwrap(), None);
        a.presence_penalty = 0.5;
        a.frequency_penalty = 0.25;
        let p = a.penalties().unwrap().unwrap();
        assert_eq!((p.presence, p.frequency, p.last_n), (0.5, 0.25, 64));
        a.repeat_last_n = -1;
        assert_eq!(a.penalties().unwrap().unwrap().last_n, 0);
        a.repeat_last_n = 0;
        assert_eq!(a.penalties().unwrap(), None);
    }

    #[test]
    fn logit_biases_parse_as_llama_cpp_writes_them() {
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("15043-0.5"), Ok((15043, -0.5)));
        assert_eq!(parse_logit_bias("7-inf"), Ok((7, f32::NEG_INFINITY)));
        for bad in [
            "15043", "x+1", "1+inf", "1+nan", "+1", "1+", "1-1e40", "-5+1",
        ] {
            assert!(parse_logit_bias(bad).is_err(), "{bad}");
        }
    }
}
