//! The timed runs of `weft bench`: a prefill or decode test on the bare runner, or parallel
//! decodes through the engine's scheduler, and the statistics of their repetitions.

use std::time::Instant;

use futures_util::future::join_all;
use weft::sampling::Rng;
use weft::{block_on, BatchEntry, Context, Engine, ModelRunner, Sampler};

/// One row of the table.
#[derive(Debug, Clone)]
pub(super) struct Test {
    pub(super) name: String,
    /// Prompt tokens: prefilled and timed (`ppN`), or the parallel tests' untimed prompt.
    pub(super) prompt: usize,
    /// Tokens in the context before the test (`@ dD`), not timed.
    pub(super) depth: usize,
    /// Decode steps (0: a prefill test).
    pub(super) gen: usize,
    pub(super) parallel: usize,
    /// Through the engine's scheduler rather than the bare runner.
    pub(super) api: bool,
    /// With the `--lora` adapters.
    pub(super) lora: bool,
}

/// Prompt length of the parallel tests, as in llama-batched-bench's `-npp 128`.
pub(super) const PARALLEL_PROMPT: usize = 128;

/// What the tests run on: the bare runner, and the engine for the tests through its scheduler.
pub(super) struct Bench {
    pub(super) runner: ModelRunner,
    pub(super) engine: Option<Engine>,
    pub(super) rng: Rng,
    pub(super) vocab: u32,
    /// Adapters of the `+lora` tests, and whether the current test uses them.
    pub(super) loras: Vec<weft::Adapter>,
    pub(super) with_lora: bool,
}

impl Bench {
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.rng.next_u64() % u64::from(self.vocab)) as u32)
            .collect()
    }

    /// Seconds to prefill `n` tokens after `depth` tokens already in the sequence (their
    /// prefill is not timed).
    pub(super) fn prefill(&mut self, n: usize, depth: usize) -> anyhow::Result<f64> {
        let seq = self.runner.new_sequence();
        let result = self.prefill_seq(seq, n, depth);
        self.runner.free_sequence(seq);
        result
    }

    fn prefill_seq(&mut self, seq: weft::kv::SeqId, n: usize, depth: usize) -> anyhow::Result<f64> {
        // The context before the test (the runner cuts it into micro-batches).
        if depth > 0 {
            let before = BatchEntry::run_of(&self.tokens(depth), seq, 0, false);
            self.runner.forward(&before)?;
        }
        if n == 0 {
            return Ok(0.0);
        }
        let batch = BatchEntry::run_of(&self.tokens(n), seq, depth, false);
        let t = Instant::now();
        self.runner.forward(&batch)?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Seconds for `steps` decode calls over `n_seq` sequences prefilled with `prompt` tokens.
    pub(super) fn decode(
        &mut self,
        n_seq: usize,
        prompt: usize,
        steps: usize,
    ) -> anyhow::Result<f64> {
        let seqs: Vec<_> = (0..n_seq).map(|_| self.runner.new_sequence()).collect();
        let result = self.decode_seqs(&seqs, prompt, steps);
        for &s in &seqs {
            self.runner.free_sequence(s);
        }
        result
    }

    /// Seconds for `steps` decode passes of `n_seq` contexts through the engine's scheduler.
    pub(super) fn decode_api(
        &mut self,
        n_seq: usize,
        prompt: usize,
        steps: usize,
    ) -> anyhow::Result<f64> {
        let engine = self
            .engine
            .clone()
            .ok_or_else(|| anyhow::anyhow!("no engine"))?;
        let mut ctxs: Vec<Context> = (0..n_seq).map(|_| engine.context()).collect();
        for c in &mut ctxs {
            c.fill_tokens(&self.tokens(prompt))?;
        }
        if prompt > 0 {
            for r in block_on(join_all(ctxs.iter_mut().map(|c| c.flush_logits()))) {
                r?;
            }
        }
        let mut next = self.tokens(n_seq);
        let t = Instant::now();
        for step in 0..steps {
            let horizon = steps - step - 1;
            let loras: Vec<_> = (0..n_seq).map(|i| self.lora(i).cloned()).collect();
            let passes =
                ctxs.iter_mut()
                    .zip(&next)
                    .zip(loras)
                    .map(|((c, &token), lora)| async move {
                        let mut fwd = c.forward();
                        fwd.input(&[token]).horizon(horizon);
                        if let Some(a) = &lora {
                            fwd.adapter(a, 1.0);
                        }
                        let h = fwd.sample(&[0], Sampler::Argmax);
                        let out = fwd.execute().await?;
                        Ok::<u32, weft::Error>(out.token(h).unwrap_or(token))
                    });
            next = block_on(join_all(passes))
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    fn decode_seqs(
        &mut self,
        seqs: &[weft::kv::SeqId],
        prompt: usize,
        steps: usize,
    ) -> anyhow::Result<f64> {
        if prompt > 0 {
            let mut batch = Vec::with_capacity(seqs.len() * prompt);
            for &seq in seqs {
                batch.extend(BatchEntry::run_of(&self.tokens(prompt), seq, 0, false));
            }
            self.runner.forward(&batch)?;
        }
        let adapters: Vec<(weft::kv::SeqId, weft::lora::AdapterSet)> = seqs
            .iter()
            .enumerate()
            .filter_map(|(i, &seq)| {
                let a = self.lora(i)?;
                let set = weft::lora::AdapterSet {
                    stack: vec![(a.as_core().clone(), 1.0)],
                    zo: None,
                };
                Some((seq, set))
            })
            .collect();
        let t = Instant::now();
        for step in 0..steps {
            let tokens = self.tokens(seqs.len());
            let batch: Vec<BatchEntry> = seqs
                .iter()
                .zip(tokens)
                .map(|(&seq, token)| BatchEntry {
                    token,
                    pos: (prompt + step) as u32,
                    seq,
                    logits: true,
                    mask: None,
                    hidden: false,
                    embed: None,
                })
                .collect();
            self.runner.forward_with(&batch, &[], &adapters)?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// The adapter of the `i`-th context of a `+lora` test.
    fn lora(&self, i: usize) -> Option<&weft::Adapter> {
        if !self.with_lora || self.loras.is_empty() {
            return None;
        }
        self.loras.get(i % self.loras.len())
    }
}

pub(super) fn median_and_sd(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (median, var.sqrt())
}

/// Peak resident memory of this process, from /proc (Linux), in MiB.
pub(super) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
