//! The forward primitive: a model, its KV cache, a thread pool and reusable buffers.
//!
//! [`ModelRunner::forward`] takes a batch of tokens from any number of sequences at arbitrary
//! positions (a prefill is many tokens of one sequence, a decode step one token of each of many)
//! and returns logits only for the tokens that ask for them. Large batches run in micro-batches
//! of at most `max_ubatch` tokens (chunked prefill); KV slots are appended micro-batch by
//! micro-batch, and on any error every sequence is rewound to where it was, so a failed call
//! leaks no page and leaves no half-written state.

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kv::{KvCache, KvLayout, KvType, PageUsage, SeqId, SeqState};
use crate::lora::AdapterSet;
use crate::models::{self, BatchToken, LayerPager, Model, ModelInfo, SlotMask, Workspace};
use crate::threadpool::ThreadPool;

/// One token of a [`ModelRunner::forward`] batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    pub token: u32,
    pub pos: u32,
    pub seq: SeqId,
    /// Return logits for this token.
    pub logits: bool,
    /// Return its final-norm hidden state (see [`ModelRunner::last_hidden`]).
    pub hidden: bool,
    /// Index of this token's attention mask in the masks given to
    /// [`ModelRunner::forward_masked`] (`None`: causal).
    pub mask: Option<u32>,
    /// Index of this token's input vector in [`BatchInputs::embeds`], which the model reads
    /// instead of `token`'s embedding (`None`: the token's).
    pub embed: Option<u32>,
}

impl BatchEntry {
    /// The entries for `tokens` of `seq` at consecutive positions from `start`, asking for
    /// logits on every token (`all_logits`) or only on the last one (a prompt).
    pub fn run_of(tokens: &[u32], seq: SeqId, start: usize, all_logits: bool) -> Vec<BatchEntry> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchEntry {
                token,
                pos: (start + i) as u32,
                seq,
                logits: all_logits || i + 1 == tokens.len(),
                mask: None,
                hidden: false,
                embed: None,
            })
            .collect()
    }
}

/// What a batch carries beside its entries, all of it optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchInputs<'a> {
    /// The attention masks entries refer to (see [`ModelRunner::forward_masked`]).
    pub masks: &'a [SlotMask],
    /// Adapters per sequence (see [`ModelRunner::forward_with`]).
    pub adapters: &'a [(SeqId, AdapterSet)],
    /// Input vectors entries refer to ([`BatchEntry::embed`]), `n_embd` values each: what the
    /// model's first block reads (see [`Model::input_embeddings`]).
    pub embeds: &'a [f32],
}

/// How a [`ModelRunner`] is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Threads for the forward pass, counting the caller (default: available cores).
    pub n_threads: usize,
    /// KV cache capacity in tokens, over all sequences (default 16384).
    pub kv_tokens: usize,
    /// Longest sequence allowed (default: the model's training context, at most `kv_tokens`).
    /// When given, the KV cache holds at least this many tokens, and it may exceed the
    /// training context (as llama.cpp's `-c` may; the model's output may degrade there).
    pub n_ctx: Option<usize>,
    /// Tokens per model call; longer batches are split (default 512).
    pub max_ubatch: usize,
    /// Keep full KV pages of plain causal sequences for later sequences that start with the
    /// same tokens (see [`KvCache::attach_prefix`]; default off here, on in the engine).
    pub prefix_cache: bool,
    /// Keep at most the pager's number of transformer blocks resident, loading the others
    /// when a pass reaches them (default `None`: all resident). See [`LayerPager`].
    pub layer_pager: Option<Arc<LayerPager>>,
    /// How the KV cache stores keys and values (default f16; Q8_0 halves its memory).
    pub kv_type: KvType,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            // Every core, as far as a pool goes (a machine with more runs on the first 256).
            n_threads: std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(crate::threadpool::MAX_THREADS),
            kv_tokens: 16384,
            n_ctx: None,
            max_ubatch: 512,
            prefix_cache: false,
            layer_pager: None,
            kv_type: KvType::F16,
        }
    }
}

/// A loaded model ready to run batches.
pub struct ModelRunner {
    model: Box<dyn Model>,
    kv: KvCache,
    pool: ThreadPool,
    ws: Workspace,
    logits: Vec<f32>,
    /// Rows of `logits` the last forward filled.
    last_rows: usize,
    /// Final-norm hidden states of the last forward's `hidden` entries.
    hidden: Vec<f32>,
    last_hidden_rows: usize,
    batch: Vec<BatchToken>,
    n_ctx: usize,
    max_ubatch: usize,
}

impl ModelRunner {
    /// Loads the model in `file` and sets up its cache and threads.
    pub fn new(file: Arc<GgufFile>, cfg: &RunnerConfig) -> Result<ModelRunner> {
        // Threads first: a bad count is an error before the model loads.
        let pool = ThreadPool::try_new(cfg.n_threads.max(1))?;
        let model = models::load_paged(file, cfg.layer_pager.clone())?;
        let layout = KvLayout {
            kv_type: cfg.kv_type,
            ..model.kv_layout()
        };
        // A context asked for gets the cache to hold it; its memory is mapped as it fills.
        let kv_tokens = cfg.kv_tokens.max(cfg.n_ctx.unwrap_or(0));
        let mut kv = KvCache::new(layout, kv_tokens)?;
        kv.set_prefix_cache(cfg.prefix_cache);
        let n_ctx = cfg
            .n_ctx
            .unwrap_or(model.info().n_ctx_train)
            .min(kv_tokens)
            .max(1);
        Ok(ModelRunner {
            model,
            kv,
            pool,
            ws: Workspace::default(),
            logits: Vec::new(),
            last_rows: 0,
            hidden: Vec::new(),
            last_hidden_rows: 0,
            batch: Vec::new(),
            n_ctx,
            max_ubatch: cfg.max_ubatch.max(1),
        })
    }

    /// The model's shape and vocabulary.
    pub fn info(&self) -> &ModelInfo {
        self.model.info()
    }

    /// Longest sequence allowed.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Threads used by the forward pass.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The thread pool of the forward pass (free between calls, e.g. for sampling).
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// The KV cache (sequences, page usage).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Starts an empty sequence.
    pub fn new_sequence(&mut self) -> SeqId {
        self.kv.new_sequence()
    }

    /// Starts an empty sequence under a caller-chosen id (see [`KvCache::insert_sequence`]).
    pub fn insert_sequence(&mut self, seq: SeqId) -> Result<()> {
        self.kv.insert_sequence(seq)
    }

    /// [`ModelRunner::fork`] under a caller-chosen id (see [`KvCache::fork_as`]).
    pub fn fork_as(&mut self, seq: SeqId, id: SeqId) -> Result<()> {
        self.kv.fork_as(seq, id)
    }

    /// Drops a sequence and frees its pages.
    pub fn free_sequence(&mut self, seq: SeqId) {
        self.kv.free_sequence(seq);
    }

    /// Rewinds a sequence to its first `n` tokens.
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.kv.truncate(seq, n)
    }

    /// Rewinds a sequence to its first `n` tokens to run token `n` again (see
    /// [`KvCache::truncate_to_rerun`]).
    pub fn truncate_to_rerun(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.kv.truncate_to_rerun(seq, n)
    }

    /// Attaches cached pages holding the longest whole-page prefix of `tokens` (at most
    /// `max` tokens) to the empty sequence `seq`; returns how many tokens they hold.
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32], max: usize) -> usize {
        self.kv.attach_prefix(seq, tokens, max, 0)
    }

    /// [`ModelRunner::attach_prefix`] for a sequence that will run with `adapters`: only pages
    /// written under the same adapters match.
    pub fn attach_prefix_with(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        max: usize,
        adapters: &AdapterSet,
    ) -> usize {
        self.kv.attach_prefix(seq, tokens, max, adapters.identity())
    }

    /// Copies out the KV pages and positions of `seq` (see [`KvCache::export`]).
    pub fn export_sequence(&self, seq: SeqId) -> Result<SeqState> {
        self.kv.export(seq)
    }

    /// Fills the empty sequence `seq` with saved KV state (see [`KvCache::import`]); on error
    /// nothing is allocated.
    pub fn import_sequence(&mut self, seq: SeqId, state: &SeqState) -> Result<()> {
        self.kv.import(seq, state)
    }

    /// A copy of `seq` sharing its full pages.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        self.kv.fork(seq)
    }

    /// Page usage per KV group.
    pub fn kv_usage(&self) -> Vec<PageUsage> {
        self.kv.usage()
    }

    /// Runs `batch` and returns the logits of the entries whose `logits` flag is set, one row of
    /// `vocab_size` values each, in batch order. Every token attends causally.
    pub fn forward(&mut self, batch: &[BatchEntry]) -> Result<&[f32]> {
        self.forward_masked(batch, &[])
    }

    /// [`ModelRunner::forward`] where an entry with `mask: Some(i)` attends to the slots
    /// `masks[i]` allows. A mask covers at least the slots up to and including the token's
    /// own (the sequence's length before the batch + the token's index among its sequence's
    /// entries + 1) and at most the slots the batch fills in its sequence: it may see tokens
    /// later in the batch (bidirectional attention within a block), never a slot no token
    /// writes. A token and the later slots it sees run in one micro-batch, however long.
    pub fn forward_masked(&mut self, batch: &[BatchEntry], masks: &[SlotMask]) -> Result<&[f32]> {
        self.forward_with(batch, masks, &[])
    }

    /// [`ModelRunner::forward_masked`] where the tokens of each sequence listed in `adapters`
    /// run with its [`AdapterSet`] (LoRA adapters and their scales); other sequences run the
    /// base model. Each row's result is the same as if it ran alone.
    pub fn forward_with(
        &mut self,
        batch: &[BatchEntry],
        masks: &[SlotMask],
        adapters: &[(SeqId, AdapterSet)],
    ) -> Result<&[f32]> {
        self.forward_inputs(
            batch,
            BatchInputs {
                masks,
                adapters,
                embeds: &[],
            },
        )
    }

    /// [`ModelRunner::forward_with`] where an entry with `embed: Some(e)` starts from row `e`
    /// of `inputs.embeds` instead of its token's embedding (multimodal front ends, soft
    /// prompts). Such tokens never enter the prefix cache: their pages are not a function of
    /// token ids.
    pub fn forward_inputs(&mut self, batch: &[BatchEntry], inputs: BatchInputs) -> Result<&[f32]> {
        let BatchInputs {
            masks,
            adapters,
            embeds,
        } = inputs;
        let vocab = self.model.info().vocab_size;
        let d = self.model.info().n_embd;
        let n_embeds = embeds.len() / d.max(1);
        if embeds.len() % d.max(1) != 0 {
            return Err(Error::BadBatch {
                reason: format!("{} input values are not whole rows of {d}", embeds.len()),
            });
        }
        // Validate everything before touching the cache.
        let mut growth: HashMap<SeqId, usize> = HashMap::new();
        for e in batch {
            if e.token as usize >= vocab {
                return Err(Error::TokenOutOfRange {
                    id: e.token,
                    vocab_size: vocab,
                });
            }
            if let Some(i) = e.embed.filter(|&i| i as usize >= n_embeds) {
                return Err(Error::BadBatch {
                    reason: format!("input vector {i} of {n_embeds} does not exist"),
                });
            }
            *growth.entry(e.seq).or_default() += 1;
        }
        let mut start_len = HashMap::with_capacity(growth.len());
        for (&seq, &extra) in &growth {
            let len = self.kv.len(seq)?;
            if len + extra > self.n_ctx {
                return Err(Error::ContextOverflow {
                    len: len + extra,
                    n_ctx: self.n_ctx,
                });
            }
            start_len.insert(seq, len);
        }
        let mut seen: HashMap<SeqId, usize> = HashMap::new();
        for e in batch {
            let k = seen.entry(e.seq).or_default();
            *k += 1;
            if let Some(i) = e.mask {
                // A mask covers at least the slots up to the token's own, and at most those
                // the batch appends to its sequence (later tokens' slots: bidirectional).
                let start = start_len.get(&e.seq).copied().unwrap_or(0);
                let own = start + *k;
                let last = start + growth.get(&e.seq).copied().unwrap_or(0);
                match masks.get(i as usize) {
                    Some(m) if (own..=last).contains(&m.len()) => {}
                    Some(m) => {
                        return Err(Error::BadBatch {
                            reason: format!(
                                "attention mask {i} covers {} slots; the token is slot {} of a sequence the batch fills to {last} slots, so it must cover {own} to {last}",
                                m.len(),
                                own - 1
                            ),
                        })
                    }
                    None => {
                        return Err(Error::BadBatch {
                            reason: format!("attention mask {i} of {} does not exist", masks.len()),
                        })
                    }
                }
            }
        }
        let n_out = batch.iter().filter(|e| e.logits).count();
        if self.logits.len() < n_out * vocab {
            self.logits.resize(n_out * vocab, 0.0);
        }
        let n_hidden = batch.iter().filter(|e| e.hidden).count();
        if self.hidden.len() < n_hidden * d {
            self.hidden.resize(n_hidden * d, 0.0);
        }
        let lora_of: HashMap<SeqId, u32> = adapters
            .iter()
            .enumerate()
            .filter(|(_, (_, set))| !set.is_noop())
            .map(|(i, (seq, _))| (*seq, i as u32))
            .collect();
        let sets: Vec<AdapterSet> = adapters.iter().map(|(_, s)| s.clone()).collect();
        let ends = ubatch_ends(batch, masks, &start_len, self.max_ubatch);
        let result = self.run_ubatches(batch, &ends, masks, &lora_of, &sets, embeds, vocab);
        for (&seq, &len) in &start_len {
            if result.is_err() {
                // Nothing was released during the call, so the sequence can always go back to
                // the length it had.
                let _ = self.kv.truncate(seq, len);
            } else {
                // Record the tokens for the prefix cache: shareable when the sequence's tokens
                // were written causally at positions equal to their slots, from their ids.
                let mine = batch.iter().filter(|e| e.seq == seq);
                let tokens: Vec<u32> = mine.clone().map(|e| e.token).collect();
                let plain = mine.enumerate().all(|(k, e)| {
                    e.mask.is_none() && e.embed.is_none() && e.pos as usize == len + k
                });
                let salt = lora_of
                    .get(&seq)
                    .map_or(0, |&i| sets[i as usize].identity());
                self.kv.publish(seq, &tokens, plain, salt);
                self.kv.release_behind_window(seq);
            }
        }
        self.last_rows = 0;
        self.last_hidden_rows = 0;
        result?;
        self.last_rows = n_out;
        self.last_hidden_rows = n_hidden;
        Ok(&self.logits[..n_out * vocab])
    }

    /// The final-norm hidden states (one row of `n_embd` values per entry with `hidden` set, in
    /// batch order) of the last successful forward (empty after an error).
    pub fn last_hidden(&self) -> &[f32] {
        &self.hidden[..self.last_hidden_rows * self.model.info().n_embd]
    }

    /// The rows the model's first block reads for `ids` (see [`Model::input_embeddings`]).
    pub fn input_embeddings(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = vec![0.0; ids.len() * self.model.info().n_embd];
        self.model.input_embeddings(ids, &mut out)?;
        Ok(out)
    }

    /// The logits the last successful [`ModelRunner::forward`] returned (empty after an error).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits[..self.last_rows * self.model.info().vocab_size]
    }

    #[allow(clippy::too_many_arguments)]
    fn run_ubatches(
        &mut self,
        batch: &[BatchEntry],
        ends: &[usize],
        masks: &[SlotMask],
        lora_of: &HashMap<SeqId, u32>,
        sets: &[AdapterSet],
        embeds: &[f32],
        vocab: usize,
    ) -> Result<()> {
        let mut row = 0;
        let mut hrow = 0;
        let d = self.model.info().n_embd;
        let starts = std::iter::once(0).chain(ends.iter().copied());
        for chunk in starts.zip(ends).map(|(a, &b)| &batch[a..b]) {
            // Append this micro-batch's slots: each sequence's tokens in batch order.
            let mut per_seq: HashMap<SeqId, Vec<u32>> = HashMap::new();
            for e in chunk {
                per_seq.entry(e.seq).or_default().push(e.pos);
            }
            let mut next_slot = HashMap::with_capacity(per_seq.len());
            for (seq, positions) in &per_seq {
                next_slot.insert(*seq, self.kv.append(*seq, positions)?);
            }
            self.batch.clear();
            for e in chunk {
                let slot = next_slot
                    .get_mut(&e.seq)
                    .ok_or(Error::UnknownSequence { seq: e.seq.0 })?;
                self.batch.push(BatchToken {
                    token: e.token,
                    pos: e.pos,
                    seq: e.seq,
                    slot: *slot,
                    logits: e.logits,
                    hidden: e.hidden,
                    mask: e.mask,
                    lora: lora_of.get(&e.seq).copied(),
                    embed: e.embed,
                });
                *slot += 1;
            }
            let n_out = chunk.iter().filter(|e| e.logits).count();
            let out = &mut self.logits[row * vocab..(row + n_out) * vocab];
            let n_hid = chunk.iter().filter(|e| e.hidden).count();
            let hid = &mut self.hidden[hrow * d..(hrow + n_hid) * d];
            self.model.forward(
                &self.batch,
                masks,
                sets,
                embeds,
                &mut self.kv,
                &self.pool,
                &mut self.ws,
                out,
                hid,
            )?;
            row += n_out;
            hrow += n_hid;
        }
        Ok(())
    }
}

/// Where the micro-batches of `batch` end: every `max` tokens, except where a token's mask
/// looks ahead (attends to a slot a later token of its sequence fills). A layer writes its
/// micro-batch's keys and values before any of them attends, so such a token must share its
/// micro-batch with every slot it sees: the micro-batch ends at the last point before `max`
/// where no mask looks past it, or, when there is none, at the first one after.
fn ubatch_ends(
    batch: &[BatchEntry],
    masks: &[SlotMask],
    start_len: &HashMap<SeqId, usize>,
    max: usize,
) -> Vec<usize> {
    let n = batch.len();
    let max = max.max(1);
    if batch.iter().all(|e| e.mask.is_none()) {
        return (1..=n.div_ceil(max)).map(|i| (i * max).min(n)).collect();
    }
    let closed = closed_after(batch, masks, start_len);
    let fits = |end: usize| end == n || closed[end - 1];
    let mut ends = Vec::with_capacity(n.div_ceil(max));
    let mut start = 0;
    while start < n {
        let want = (start + max).min(n);
        let end = (start + 1..=want)
            .rev()
            .find(|&e| fits(e))
            .or_else(|| (want + 1..=n).find(|&e| fits(e)))
            .unwrap_or(n);
        ends.push(end);
        start = end;
    }
    ends
}

/// Per token `k` of `batch`, whether no mask of the tokens up to `k` sees a slot past those
/// they append (a micro-batch may end after `k`). Out of the decode path: only masked
/// batches get here.
#[cold]
#[inline(never)]
fn closed_after(
    batch: &[BatchEntry],
    masks: &[SlotMask],
    start_len: &HashMap<SeqId, usize>,
) -> Vec<bool> {
    let mut closed = vec![true; batch.len()];
    let mut filled: HashMap<SeqId, usize> = start_len.clone();
    let mut reach: HashMap<SeqId, usize> = HashMap::new();
    let mut open: std::collections::HashSet<SeqId> = std::collections::HashSet::new();
    for (k, e) in batch.iter().enumerate() {
        let f = filled.entry(e.seq).or_default();
        *f += 1;
        let last = e
            .mask
            .and_then(|m| masks.get(m as usize))
            .and_then(SlotMask::last_visible);
        let r = reach.entry(e.seq).or_default();
        *r = (*r).max(last.unwrap_or(0));
        match *r >= *f {
            true => open.insert(e.seq),
            false => open.remove(&e.seq),
        };
        closed[k] = open.is_empty();
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, mask: Option<u32>) -> BatchEntry {
        BatchEntry {
            token: 0,
            pos: 0,
            seq: SeqId(seq),
            logits: false,
            hidden: false,
            mask,
            embed: None,
        }
    }

    /// A mask over `len` slots seeing `seen`.
    fn sees(len: usize, seen: std::ops::Range<usize>) -> SlotMask {
        SlotMask::new((0..len).map(|s| seen.contains(&s)).collect())
    }

    #[test]
    fn micro_batches_keep_a_bidirectional_block_whole() {
        let start: HashMap<SeqId, usize> = [(SeqId(0), 10), (SeqId(1), 0)].into();
        // Causal: every `max` tokens.
        let mut batch: Vec<BatchEntry> = (0..10).map(|_| entry(0, None)).collect();
        assert_eq!(ubatch_ends(&batch, &[], &start, 4), [4, 8, 10]);
        // Sequence 0's tokens 2..7 (slots 12..17) see each other: a micro-batch may end
        // before the block or after it, not inside; with a budget of 4 the block runs whole
        // in one micro-batch of 5.
        let masks = [sees(17, 12..17), sees(13, 0..13)];
        for e in &mut batch[2..7] {
            e.mask = Some(0);
        }
        assert_eq!(ubatch_ends(&batch, &masks, &start, 4), [2, 7, 10]);
        assert_eq!(ubatch_ends(&batch, &masks, &start, 3), [2, 7, 10]);
        assert_eq!(ubatch_ends(&batch, &masks, &start, 8), [8, 10]);
        assert_eq!(ubatch_ends(&batch, &masks, &start, 100), [10]);
        // Masks that see only up to their own slot cut anywhere.
        for e in &mut batch[2..7] {
            e.mask = Some(1);
        }
        assert_eq!(ubatch_ends(&batch, &masks, &start, 4), [4, 8, 10]);
        // Another sequence's tokens inside the block ride along.
        let mut mixed = vec![entry(0, Some(0)), entry(1, None), entry(0, None)];
        mixed.extend((0..3).map(|_| entry(1, None)));
        let start: HashMap<SeqId, usize> = [(SeqId(0), 0), (SeqId(1), 0)].into();
        assert_eq!(
            ubatch_ends(&mixed, &[sees(2, 0..2)], &start, 1),
            [3, 4, 5, 6]
        );
    }
}
