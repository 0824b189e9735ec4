//! Attention over the paged KV cache, for every query of a batch at once.
//!
//! Each (query, KV head) pair walks its sequence's pages in *chunks* of [`chunk_pages`] pages.
//! A chunk is scored with an online softmax of its own (flash-attention style: a running max,
//! sum and weighted value sum per head), and the chunks' states are merged left to right.
//! Because the chunking is fixed by the sequence alone, a query's output has the same bits
//! whether one thread walks all its chunks (a prefill or a batch: many pairs, enough work for
//! every thread) or each chunk is its own work item merged afterwards (one decode over a long
//! context: the flash-decoding split, so both threads stream the KV once between them instead
//! of one thread per KV head).
//!
//! In a prefill a work item takes a tile of consecutive queries of one sequence (as many as
//! fit [`attn::MAX_GROUP`] rows with their heads), so each value row of a page they all see is
//! widened once for all of them; a decode-like batch prefetches each next page, which the
//! hardware prefetchers do not bring in early enough on their own (a page of one head is a few
//! KiB; the next one follows it in memory only when the sequence got consecutive pages, and
//! without the hints SmolLM2's decode attention at depth 4,096 took 15–50% longer even then,
//! Gemma 3's twice as long). The score kernel hints the next page's keys in, line by line as it
//! reads the current page's, and the weighted sum the next page's values spread over its rows:
//! hints all through the arithmetic (a burst of a whole page at once filled the core's miss
//! buffers and stalled the arithmetic it was meant to overlap, and hints issued by one kernel
//! alone left the memory idle while the other one ran).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::layers::SharedOut;
use super::{BatchToken, SlotMask};
use crate::kernels::attention as attn;
use crate::kv::{KvCache, SeqView, PAGE_SIZE};
use crate::threadpool::{Claim, ThreadPool};

/// Largest head dimension attention supports.
pub const MAX_HEAD_DIM: usize = 512;

/// Pages per chunk of one softmax state in a full-attention layer: 512 keys. Long enough that
/// a split decode's items and their merges cost little (256 keys made SmolLM2's decode at
/// depth 4,096 3–5% slower), short enough that such a decode splits into 8 items per KV head
/// to share between threads.
pub const CHUNK_PAGES: usize = 16;

/// Pages per chunk in a layer that sees `view`: [`CHUNK_PAGES`], or at most half the window
/// of a sliding-window layer, so the window's keys span at least two chunks and a decode
/// shares them between threads (Gemma 3's 512-key window in one or two 512-key chunks left
/// one thread idle or with a sliver: 3–4% of its decode at depth 4,096). Fixed by the layer
/// alone, so a query's bits still do not depend on its batch.
pub fn chunk_pages(view: &SeqView<'_>) -> usize {
    view.window
        .map_or(CHUNK_PAGES, |w| (w / (2 * PAGE_SIZE)).clamp(1, CHUNK_PAGES))
}

const G: usize = attn::MAX_GROUP;

thread_local! {
    /// Each thread's query rows and softmax states of [`attention`], kept between calls.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Tiles of queries one prefill work item takes: it walks the chunks in order, each for all of
/// its tiles while the chunk's keys and values stay in the core's cache.
const BLOCK_TILES: usize = 8;

/// The online-softmax state of up to [`G`] heads over some keys: each head's running max of
/// the scores, the sum of `exp(score - max)`, and the value rows weighted by those (`acc`,
/// `gh × head_dim`).
struct State<'a> {
    max: [f32; G],
    sum: [f32; G],
    acc: &'a mut [f32],
}

impl State<'_> {
    fn reset(&mut self) {
        self.max = [f32::NEG_INFINITY; G];
        self.sum = [0.0; G];
        self.acc.fill(0.0);
    }

    /// Folds the state of the keys that follow into this one. A head that saw no key in
    /// `next` is left alone (merging two empty states would compute `exp(-inf + inf)`).
    fn merge(&mut self, next: &State<'_>, gh: usize, d: usize) {
        for j in 0..gh {
            if next.max[j] == f32::NEG_INFINITY {
                continue;
            }
            let m = self.max[j].max(next.max[j]);
            let (c, cn) = ((self.max[j] - m).exp(), (next.max[j] - m).exp());
            self.sum[j] = self.sum[j] * c + next.sum[j] * cn;
            let (a, b) = (
                &mut self.acc[j * d..(j + 1) * d],
                &next.acc[j * d..(j + 1) * d],
            );
            for (a, &b) in a.iter_mut().zip(b) {
                *a = *a * c + b * cn;
            }
            self.max[j] = m;
        }
    }
}

/// What one work item needs to know about its query.
struct Query<'a> {
    token: BatchToken,
    mask: Option<&'a SlotMask>,
    view: SeqView<'a>,
    /// Its scaled query vectors, `gh × head_dim`.
    q: &'a [f32],
    /// Prefetch each next page: its sequence's keys are read by this query alone (decode),
    /// so they come from memory, not from a cache a neighbouring query just filled.
    prefetch: bool,
}

/// Per-thread buffers for the keys of one page: the visible slots, and each head's scores of
/// them (then its softmax weights) in a row of its own, `PAGE_SIZE` apart.
struct PageScratch {
    rows: [u32; PAGE_SIZE],
    scores: [f32; PAGE_SIZE * G],
}

/// Turns rows `0..n_rows` of `scores` (the first `n` of each: the slots `rows` lists) into
/// softmax weights for the state rows from `st_row`: scaled, plus the float mask's bias of
/// each listed slot, then one online-softmax step per row (rescaling what the row accumulated
/// when its max grows) — as [`attn::page_step`] does for a whole page without a bias.
#[allow(clippy::too_many_arguments)]
fn softmax_rows(
    ps: &mut PageScratch,
    n_rows: usize,
    n: usize,
    scale: f32,
    bias: Option<(&[f32], usize)>,
    st: &mut State<'_>,
    st_row: usize,
    head_dim: usize,
) {
    for j in 0..n_rows {
        let sc = &mut ps.scores[j * PAGE_SIZE..j * PAGE_SIZE + n];
        // The scale is applied by the softmax step, unless a bias must come after it.
        let mut scale = scale;
        if let Some((b, first)) = bias {
            for (x, &r) in sc.iter_mut().zip(&ps.rows[..n]) {
                *x = *x * scale + b.get(first + r as usize).copied().unwrap_or(0.0);
            }
            scale = 1.0;
        }
        let r = st_row + j;
        let slots = Some(&ps.rows[..n]);
        let c = attn::softmax_page(sc, slots, scale, &mut st.max[r], &mut st.sum[r]);
        if c != 1.0 {
            st.acc[r * head_dim..(r + 1) * head_dim]
                .iter_mut()
                .for_each(|a| *a *= c);
        }
    }
}

/// Scores the keys of pages `pages` of KV head `kvh` for a tile of consecutive queries of one
/// sequence (`gh` heads each; their query rows `qs`, `tile.len() × gh × head_dim`) and
/// accumulates their values into `st` (which starts empty, one row per query head), page by
/// page with an online softmax. A page every query of the tile sees whole is scored for all
/// of them in one kernel call, each key and value widened once for all their rows; other
/// pages are scored query by query. A row's bits are the same either way.
///
/// A decode-like tile prefetches each next page as it reads the current one; on the chunk's
/// last page it prefetches the page `then` names instead (the page the thread reads next).
#[allow(clippy::too_many_arguments)]
fn attend_chunk<'k>(
    tile: &[Query<'_>],
    qs: &[f32],
    kvh: usize,
    gh: usize,
    head_dim: usize,
    scale: f32,
    pages: std::ops::Range<usize>,
    then: &mut dyn FnMut() -> Option<(&'k [u8], &'k [u8])>,
    ps: &mut PageScratch,
    st: &mut State<'_>,
) {
    let view = &tile[0].view;
    let last = pages.end.saturating_sub(1);
    let kv_type = view.kv_type;
    let n_slots = view.positions.len();
    // Whether a key at position `p` is inside the layer's window around position `pos`.
    let in_window = |pos: u32, p: u32| {
        view.window
            .is_none_or(|w| (i64::from(pos) - i64::from(p)).unsigned_abs() < w as u64)
    };
    let row = gh * head_dim;
    for page in pages {
        let Some((keys, values)) = view.page(page, kvh) else {
            continue; // released sliding-window page: nothing visible there
        };
        // The next page's keys and values (a decode: the hardware prefetchers cannot see that
        // page coming): the score kernel hints the next keys in as it reads this page's, and
        // the weighted sum the next values, so the hints run all through the arithmetic (see
        // `attn::attend`).
        let next = match tile[0].prefetch {
            false => None,
            true if page == last => then(),
            true => view.page(page + 1, kvh),
        };
        let (next_keys, next_values): (&[u8], &[u8]) = next.unwrap_or((&[], &[]));
        let first = page * PAGE_SIZE;
        let in_page = PAGE_SIZE.min(n_slots - first);
        let slots = &view.positions[first..first + in_page];
        // No mask, and every key causal and inside the window (the common case): the page's
        // scores in one kernel call, without a check per key. Every key is at or before `pos`
        // when the latest is, and then inside the window when the earliest is: the page's
        // extremes, found once (a vector reduction) rather than a branchy walk over its
        // positions for every query: SmolLM2's decode at depth 4,096 1.5% faster (alternated
        // in 16-step blocks within runs, 4 runs in each order), Gemma 3's 0.7%.
        let (lo, hi) = (slots.iter().min(), slots.iter().max());
        let whole = |qr: &Query<'_>| {
            let pos = qr.token.pos;
            match (lo, hi) {
                (Some(&lo), Some(&hi)) => qr.mask.is_none() && hi <= pos && in_window(pos, lo),
                _ => qr.mask.is_none(),
            }
        };
        if tile.len() > 1 && tile.iter().all(whole) {
            // The page step for all rows at once (each line of keys and row of values widened
            // once for every head of every query).
            let n_rows = tile.len() * gh;
            attn::page_step(
                kv_type,
                &qs[..n_rows * head_dim],
                keys,
                values,
                in_page,
                scale,
                &mut st.max[..n_rows],
                &mut st.sum[..n_rows],
                &mut st.acc[..n_rows * head_dim],
                next_keys,
                next_values,
            );
            continue;
        }
        for (t, qr) in tile.iter().enumerate() {
            let q = &qs[t * row..(t + 1) * row];
            // The first query of the tile prefetches the next page.
            let (next_keys, next_values) = if t == 0 {
                (next_keys, next_values)
            } else {
                (&[][..], &[][..])
            };
            if whole(qr) {
                let rows = t * gh..(t + 1) * gh;
                attn::page_step(
                    kv_type,
                    q,
                    keys,
                    values,
                    in_page,
                    scale,
                    &mut st.max[rows.clone()],
                    &mut st.sum[rows],
                    &mut st.acc[t * row..(t + 1) * row],
                    next_keys,
                    next_values,
                );
                continue;
            }
            // The visible slots: those the mask (causal, or the token's own) and the layer's
            // window let through.
            let mut n = 0;
            for (s, &p) in slots.iter().enumerate() {
                let allowed = match qr.mask {
                    None => p <= qr.token.pos,
                    Some(m) => m.allows(first + s),
                };
                if allowed && in_window(qr.token.pos, p) {
                    ps.rows[n] = s as u32;
                    n += 1;
                }
            }
            if n == 0 {
                continue;
            }
            // The page's scores up to its last visible slot in one call (a key's score does
            // not depend on the others), the visible slots' then moved to the front — slots
            // ascend, so each score moves down or stays, in place, front to back.
            let upto = ps.rows[n - 1] as usize + 1;
            attn::dots(
                kv_type,
                q,
                keys,
                upto,
                gh,
                &mut ps.scores,
                PAGE_SIZE,
                next_keys,
            );
            for sc in ps.scores.chunks_exact_mut(PAGE_SIZE).take(gh) {
                for (i, &r) in ps.rows[..n].iter().enumerate() {
                    sc[i] = sc[r as usize];
                }
            }
            let bias = qr.mask.and_then(SlotMask::bias).map(|b| (b, first));
            softmax_rows(ps, gh, n, scale, bias, st, t * gh, head_dim);
            let acc = &mut st.acc[t * row..(t + 1) * row];
            let (rows, w) = (&ps.rows[..n], &ps.scores);
            attn::attend(
                kv_type,
                acc,
                head_dim,
                w,
                PAGE_SIZE,
                values,
                rows,
                next_values,
            );
        }
    }
}

/// The first page of `qr`'s sequence that can hold a key it sees: on a sliding-window layer,
/// for a query without a mask, the first page with a position inside its window (the cache
/// keeps the pages of a second window behind it, for rewinds: at depth 4,096 Gemma 3's local
/// layers hold 33 pages, of which the first 16 or 17 are out of a decode's window); else the
/// first page the layer still holds (it has released the pages before that). It scans the
/// positions of the pages it passes, so it is asked for a lone decode's query only.
fn first_seen_page(qr: &Query<'_>) -> usize {
    let view = &qr.view;
    let live = view.first_live_page();
    let (Some(window), None) = (view.window, qr.mask) else {
        return live;
    };
    let pos = qr.token.pos;
    // Visible: causal (`p <= pos`) and inside the window, as `attend_chunk` decides it.
    let seen = |&p: &u32| p <= pos && u64::from(pos - p) < window as u64;
    let pages = view.positions.chunks(PAGE_SIZE);
    let n_pages = pages.len();
    pages
        .enumerate()
        .skip(live)
        .find(|(_, slots)| slots.iter().any(seen))
        .map_or(n_pages, |(i, _)| i)
}

/// Writes rows `st_row..st_row + gh` of `st` (weighted sums divided by their softmax sums) to
/// rows `first_row..first_row + gh` of `out` (`head_dim` each).
///
/// # Safety
/// Those rows of `out` must exist and be written by no other thread meanwhile.
unsafe fn finish(
    st: &State<'_>,
    st_row: usize,
    gh: usize,
    head_dim: usize,
    out: SharedOut,
    first_row: usize,
) {
    for j in 0..gh {
        let r = st_row + j;
        let inv = if st.sum[r] > 0.0 {
            1.0 / st.sum[r]
        } else {
            0.0
        };
        // SAFETY: the caller's promise.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out.0.add((first_row + j) * head_dim), head_dim)
        };
        for (d, &a) in dst
            .iter_mut()
            .zip(&st.acc[r * head_dim..(r + 1) * head_dim])
        {
            *d = a * inv;
        }
    }
}

/// Attention of every token's queries over its sequence's keys in `layer`.
///
/// `q` holds `queries.len() × n_head × head_dim` values (already scaled as the model wants;
/// scores are multiplied by `scale`). A key at position `p` is visible to a query at position
/// `t` when `p <= t` and, on a sliding-window layer, `t - p < window` — llama.cpp's rule. A
/// query with a mask (`masks[mask]`) sees the slots its mask allows instead of `p <= t`, with
/// the mask's additive bias (if any) added to its scores.
/// Heads share KV heads in groups (GQA). Softmax is computed online (flash-attention style),
/// so no score buffer is needed whatever the context length. A query's output does not depend
/// on the rest of the batch, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn attention<'k>(
    pool: &ThreadPool,
    kv: &'k KvCache,
    layer: usize,
    queries: &[BatchToken],
    masks: &'k [SlotMask],
    q: &'k [f32],
    n_head: usize,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
) -> crate::Result<()> {
    let n_kv_head = kv.layout().n_kv_heads;
    if n_kv_head == 0
        || head_dim == 0
        || !n_head.is_multiple_of(n_kv_head)
        || head_dim > MAX_HEAD_DIM
        || q.len() < queries.len() * n_head * head_dim
        || out.len() < queries.len() * n_head * head_dim
    {
        return Err(crate::Error::BadBatch {
            reason: format!("attention over {n_head} heads of {head_dim} with {n_kv_head} KV heads does not fit its buffers"),
        });
    }
    let group = n_head / n_kv_head;
    // Decode-like batches (about one query per sequence) stream their keys from memory; in a
    // prefill the many queries of a sequence share its pages through the caches, and
    // prefetching them only costs instructions (7% of pp512 at depth 4096).
    let mut seqs: Vec<u64> = queries.iter().map(|t| t.seq.0).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let prefetch = queries.len() <= 2 * seqs.len();
    // Resolve every query's mask and view up front so workers cannot fail.
    let mut resolved = Vec::with_capacity(queries.len());
    for (i, &token) in queries.iter().enumerate() {
        let mask = match token.mask {
            None => None,
            Some(m) => Some(masks.get(m as usize).ok_or(crate::Error::BadBatch {
                reason: format!("attention mask {m} of {} does not exist", masks.len()),
            })?),
        };
        let view = kv.view(layer, token.seq)?;
        let q = &q[i * n_head * head_dim..(i + 1) * n_head * head_dim];
        resolved.push(Query {
            token,
            mask,
            view,
            q,
            prefetch,
        });
    }
    // The chunks a query walks, from the first holding a key it can see to the last: from its
    // first page still in the cache for a block of queries (they share a sequence and so its
    // page table), from `first_seen_page` for a lone decode. A chunk of keys no query sees
    // adds nothing to a state, so leaving it out keeps every bit.
    let chunks_of = |qr: &Query<'_>, lone: bool| {
        let cp = chunk_pages(&qr.view);
        let n = qr.view.positions.len().div_ceil(PAGE_SIZE * cp);
        let first = match lone {
            true => first_seen_page(qr),
            false => qr.view.first_live_page(),
        };
        (first / cp).min(n)..n
    };
    // Work units: blocks of up to `BLOCK_TILES` tiles of consecutive queries of one sequence
    // (a tile: as many queries as fit `G` rows with their heads) × KV head, walking the chunks
    // in order, each chunk for every tile of the block while its keys and values are in the
    // core's cache (a 4,096-token head does not fit L2: walked tile by tile, every tile read it
    // all from farther away) — or, when there are too few
    // (query, KV head) pairs to keep every thread busy (decode), (query, KV head, chunk)
    // triples whose states are merged once all are done. The heads sharing a KV head read
    // each key and value once between them; they are split into sub-groups only when even
    // the chunks are too few for one item per thread. Each sub-group reads its KV head's keys
    // and values again, and a short decode is bound by those reads: with SmolLM2's 3 KV heads
    // on 2 threads, 3 items (the busier thread reads 2 heads) took 30% less time than 6
    // sub-group items (each thread reads 3), at every context up to a chunk.
    let nt = pool.n_threads();
    let split = queries.len() * n_kv_head < 2 * nt;
    let tile_max = (G / group).clamp(1, 4);
    let units: Vec<(u32, u32)> = if split {
        resolved
            .iter()
            .enumerate()
            .flat_map(|(i, qr)| {
                let c = chunks_of(qr, true);
                // At least one item per query, so each gets a state to finish.
                (c.start..c.end.max(c.start + 1)).map(move |c| (i as u32, c as u32))
            })
            .collect()
    } else {
        // (first query, number of queries): blocks of up to `BLOCK_TILES` tiles.
        let block_max = (tile_max * BLOCK_TILES) as u32;
        let mut blocks: Vec<(u32, u32)> = Vec::with_capacity(queries.len());
        for (i, t) in queries.iter().enumerate() {
            match blocks.last_mut() {
                Some((a, n)) if *n < block_max && queries[*a as usize].seq == t.seq => *n += 1,
                _ => blocks.push((i as u32, 1)),
            }
        }
        blocks
    };
    let want = nt.div_ceil((units.len() * n_kv_head).max(1));
    let sub = group.div_ceil(want).clamp(1, G);
    let n_sub = group.div_ceil(sub);
    let items = units.len() * n_kv_head * n_sub;
    // A split decode's chunk states: `sub × head_dim` sums, then `G` maxima and `G` sums.
    let stride = sub * head_dim + 2 * G;
    let mut partial = vec![0f32; if split { items * stride } else { 0 }];
    let partial_out = SharedOut(partial.as_mut_ptr());
    let shared = SharedOut(out.as_mut_ptr());
    // A thread's work: the items `next` hands it, one after the other.
    let work = |next: &mut Claim<'_>| {
        let (shared, partial_out) = (&shared, &partial_out);
        // Each tile's query rows side by side and its running state; one chunk's state.
        let tile_len = G * head_dim;
        // This thread's buffers from the last call (every element is written before it is
        // read: query rows copied in, states reset), so a decode step does not allocate and
        // zero these 35 KB in each of its layers (only the small lists of items above).
        let mut bufs = SCRATCH.take();
        bufs.resize(bufs.len().max((2 * BLOCK_TILES + 1) * tile_len), 0.0);
        let (qs_all, rest) = bufs.split_at_mut(BLOCK_TILES * tile_len);
        let (acc_all, acc_chunk) = rest.split_at_mut(BLOCK_TILES * tile_len);
        let mut accs = acc_all.chunks_exact_mut(tile_len);
        let mut states: [State<'_>; BLOCK_TILES] = std::array::from_fn(|_| State {
            max: [0.0; G],
            sum: [0.0; G],
            acc: accs.next().unwrap_or_default(),
        });
        let mut ps = PageScratch {
            rows: [0; PAGE_SIZE],
            scores: [0.0; PAGE_SIZE * G],
        };
        // An item's first query, KV head, sub-group, query count and chunk (`None`: all).
        let item_at = |item: usize| {
            let (unit, rest) = (item / (n_kv_head * n_sub), item % (n_kv_head * n_sub));
            let (kvh, sg) = (rest / n_sub, rest % n_sub);
            match units[unit] {
                (qi, c) if split => (qi as usize, kvh, sg, 1, Some(c as usize)),
                (q0, nq) => (q0 as usize, kvh, sg, nq as usize, None),
            }
        };
        // The page an item reads first: what the item before it on this thread prefetches
        // as it reads its own last page (else a split decode starts every chunk from memory;
        // 1.5–3% of SmolLM2's decode at depth 4,096).
        let first_page = |item: usize| {
            let (q0, kvh, _, _, chunk) = item_at(item);
            let view = &resolved[q0].view;
            view.page(chunk.unwrap_or(0) * chunk_pages(view), kvh)
        };
        let mut claimed: Option<usize> = None;
        while let Some(item) = claimed.take().or_else(&mut *next) {
            let (q0, kvh, sg, nq, chunk) = item_at(item);
            // Claims the next item and names its first page (called on this item's last page).
            let mut claim_ahead = || {
                claimed = next();
                claimed.and_then(first_page)
            };
            let (h0, gh) = (kvh * group + sg * sub, sub.min(group - sg * sub));
            let block = &resolved[q0..q0 + nq];
            let row = gh * head_dim;
            // The block's tiles: `tile_max` queries each (the last may have fewer).
            let tiles = nq.div_ceil(tile_max);
            let tile_at = |t: usize| t * tile_max..((t + 1) * tile_max).min(nq);
            for (i, qr) in block.iter().enumerate() {
                let (t, k) = (i / tile_max, i % tile_max);
                qs_all[t * tile_len + k * row..][..row]
                    .copy_from_slice(&qr.q[h0 * head_dim..(h0 + gh) * head_dim]);
            }
            let n_pages = block[0].view.positions.len().div_ceil(PAGE_SIZE);
            let cp = chunk_pages(&block[0].view);
            let pages = |c: usize| (c * cp).min(n_pages)..((c + 1) * cp).min(n_pages);
            let walk = |t: usize,
                        c: usize,
                        then: &mut dyn FnMut() -> Option<(&'k [u8], &'k [u8])>,
                        ps: &mut PageScratch,
                        acc: &mut [f32]| {
                let tile = &block[tile_at(t)];
                let mut st = State {
                    max: [0.0; G],
                    sum: [0.0; G],
                    acc: &mut acc[..tile.len() * row],
                };
                st.reset();
                let qs = &qs_all[t * tile_len..][..tile.len() * row];
                attend_chunk(
                    tile,
                    qs,
                    kvh,
                    gh,
                    head_dim,
                    scale,
                    pages(c),
                    then,
                    ps,
                    &mut st,
                );
                (st.max, st.sum)
            };
            if let Some(c) = chunk {
                let (max, sum) = walk(0, c, &mut claim_ahead, &mut ps, acc_chunk);
                // SAFETY: see `SharedOut`; `stride` floats at `item` belong to this item alone.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(partial_out.0.add(item * stride), stride)
                };
                dst[..row].copy_from_slice(&acc_chunk[..row]);
                dst[sub * head_dim..sub * head_dim + G].copy_from_slice(&max);
                dst[sub * head_dim + G..].copy_from_slice(&sum);
                continue;
            }
            for st in &mut states[..tiles] {
                st.reset();
            }
            let chunks = chunks_of(&block[0], false);
            let n_chunks = chunks.end;
            for c in chunks {
                for (t, st) in states[..tiles].iter_mut().enumerate() {
                    // The last tile of a chunk goes on to the next chunk's first page, the
                    // last one of all to the next item's.
                    let next_chunk = (c + 1) * cp;
                    let (max, sum) = if t + 1 < tiles {
                        walk(t, c, &mut || None, &mut ps, acc_chunk)
                    } else if c + 1 < n_chunks {
                        let view = &block[0].view;
                        walk(t, c, &mut || view.page(next_chunk, kvh), &mut ps, acc_chunk)
                    } else {
                        walk(t, c, &mut claim_ahead, &mut ps, acc_chunk)
                    };
                    let n = tile_at(t).len() * gh;
                    let chunk_st = State {
                        max,
                        sum,
                        acc: &mut acc_chunk[..n * head_dim],
                    };
                    st.merge(&chunk_st, n, head_dim);
                }
            }
            for (t, st) in states[..tiles].iter().enumerate() {
                for (k, qi) in tile_at(t).enumerate() {
                    // SAFETY: rows (q0 + qi)·n_head + h0 .. + gh of `out` belong to this item
                    // alone.
                    unsafe { finish(st, k * gh, gh, head_dim, *shared, (q0 + qi) * n_head + h0) };
                }
            }
        }
        SCRATCH.set(bufs);
    };
    if split {
        // Each thread walks a contiguous share of the items, ordered KV head by KV head and
        // chunk by chunk, so its pages follow one another in memory (the cache keeps a head's
        // pages in page order) and the hardware prefetchers run on across items; a thread
        // done early takes over half of the other's share. Handed out one at a time from a
        // shared counter, the items of a SmolLM2 decode at depth 4,096 alternated between the
        // threads, and its attention took 8% longer (median of 6 alternating rounds).
        let (per, n_units) = (n_kv_head * n_sub, units.len());
        pool.run_shares(items, &|next| {
            work(&mut || next().map(|j| (j % n_units) * per + j / n_units))
        });
    } else {
        // Items are handed out by an atomic counter, last first: in a causal prefill the later
        // queries see the most keys, so the longest items start first and the short ones fill
        // in behind them (a static split gave one thread 3/4 of a 4,096-token prompt's work).
        let next = AtomicUsize::new(0);
        pool.run(&|_, _| {
            work(&mut || {
                let taken = next.fetch_add(1, Ordering::Relaxed);
                (taken < items).then(|| items - 1 - taken)
            })
        });
    }
    if split {
        // Merge each (query, KV head, sub-group)'s chunk states in chunk order, as a single
        // thread walking the chunks would have.
        let mut total = vec![0f32; sub * head_dim];
        let mut i = 0;
        while i < units.len() {
            let qi = units[i].0;
            let n_chunks = units[i..].iter().take_while(|u| u.0 == qi).count();
            for rest in 0..n_kv_head * n_sub {
                let (kvh, sg) = (rest / n_sub, rest % n_sub);
                let (h0, gh) = (kvh * group + sg * sub, sub.min(group - sg * sub));
                let mut st = State {
                    max: [0.0; G],
                    sum: [0.0; G],
                    acc: &mut total[..gh * head_dim],
                };
                st.reset();
                for c in 0..n_chunks {
                    let p = &mut partial[((i + c) * n_kv_head * n_sub + rest) * stride..][..stride];
                    let (acc, stats) = p.split_at_mut(sub * head_dim);
                    let chunk_st = State {
                        max: stats[..G].try_into().unwrap_or([0.0; G]),
                        sum: stats[G..].try_into().unwrap_or([0.0; G]),
                        acc: &mut acc[..gh * head_dim],
                    };
                    st.merge(&chunk_st, gh, head_dim);
                }
                // SAFETY: the workers are done; rows qi·n_head + h0 .. + gh exist.
                unsafe { finish(&st, 0, gh, head_dim, shared, qi as usize * n_head + h0) };
            }
            i += n_chunks;
        }
    }
    Ok(())
}
