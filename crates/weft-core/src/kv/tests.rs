use super::*;

/// Two layers of one KV head of size 2: layer 0 with full attention, layer 1 with `window`
/// (other tests change the heads, their size or the KV type).
pub(crate) fn layout(window: Option<usize>) -> KvLayout {
    KvLayout {
        n_layers: 2,
        n_kv_heads: 1,
        head_dim: 2,
        groups: vec![
            GroupSpec {
                layers: vec![0],
                window: None,
            },
            GroupSpec {
                layers: vec![1],
                window,
            },
        ],
        kv_type: KvType::F16,
    }
}

/// A cache size no machine holds is an error, not an abort in an allocation.
#[test]
fn an_impossible_size_is_an_error() {
    for max_tokens in [1usize << 40, 1 << 50, usize::MAX] {
        let err = KvCache::new(layout(None), max_tokens).expect_err("too large");
        assert!(matches!(err, Error::KvTooLarge { .. }), "{err}");
    }
}

/// Value 0 of the key in `slot` of an f16 key page of the test layout (head_dim 2).
fn key0(page: &[u8], slot: usize) -> f32 {
    kernels::key_value(KvType::F16, page, 2, slot, 0)
}

fn positions(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

#[test]
fn append_truncate_free_returns_every_page() {
    let mut kv = KvCache::new(layout(None), 4 * PAGE_SIZE).unwrap();
    let s = kv.new_sequence();
    assert_eq!(kv.append(s, &positions(0..40)).unwrap(), 0);
    assert_eq!(kv.usage()[0].free, 2);
    kv.truncate(s, 10).unwrap();
    assert_eq!(kv.usage()[0].free, 3);
    assert_eq!(kv.len(s).unwrap(), 10);
    let e = kv.append(s, &positions(10..200)).unwrap_err();
    assert!(matches!(e, Error::KvCacheFull { .. }));
    assert_eq!(kv.len(s).unwrap(), 10, "a failed append changes nothing");
    kv.free_sequence(s);
    assert!(kv.usage().iter().all(|u| u.free == u.total));
}

/// Ids a caller chose (`insert_sequence`, `fork_as`) are skipped by the ones the cache hands
/// out: a new sequence took a live one's id and the old one's pages were never given back,
/// and every fork after a collision failed.
#[test]
fn ids_the_cache_hands_out_skip_the_ones_a_caller_took() {
    let mut kv = KvCache::new(layout(None), 4 * PAGE_SIZE).unwrap();
    kv.insert_sequence(SeqId(0)).unwrap();
    kv.append(SeqId(0), &positions(0..40)).unwrap();
    kv.insert_sequence(SeqId(2)).unwrap();
    let a = kv.new_sequence();
    let b = kv.fork(SeqId(0)).expect("a fork");
    let c = kv.new_sequence();
    assert_eq!([a, b, c], [SeqId(1), SeqId(3), SeqId(4)]);
    assert_eq!(kv.len(SeqId(0)).unwrap(), 40);
    for s in [SeqId(0), SeqId(2), a, b, c] {
        kv.free_sequence(s);
    }
    assert!(kv.usage().iter().all(|u| u.free == u.total));
}

#[test]
fn fork_shares_full_pages_and_copies_on_write() {
    let mut kv = KvCache::new(layout(None), 8 * PAGE_SIZE).unwrap();
    let a = kv.new_sequence();
    kv.append(a, &positions(0..40)).unwrap();
    for slot in 0..40 {
        let x = slot as f32;
        kv.write(0, a, slot, &[x, x], &[-x, -x]).unwrap();
    }
    let b = kv.fork(a).unwrap();
    // Both pages shared, nothing copied yet: 2 pages used in group 0.
    assert_eq!(kv.usage()[0].free, 6);
    // Appending nothing writes nothing: the shared partial page stays shared.
    assert_eq!(kv.append(a, &[]).unwrap(), 40);
    assert_eq!(kv.usage()[0].free, 6, "an empty append copied a page");
    let (ka, _) = kv.view(0, a).unwrap().page(1, 0).unwrap();
    let (kb, _) = kv.view(0, b).unwrap().page(1, 0).unwrap();
    assert_eq!(ka, kb);
    // Writing into the shared partial page copies it for the writer only.
    kv.append(a, &[40]).unwrap();
    kv.write(0, a, 40, &[7.0, 7.0], &[0.0, 0.0]).unwrap();
    assert_eq!(kv.usage()[0].free, 5);
    // Slot 40 is slot 8 of page 1.
    let (ka, _) = kv.view(0, a).unwrap().page(1, 0).unwrap();
    let (kb, _) = kv.view(0, b).unwrap().page(1, 0).unwrap();
    assert_eq!(key0(ka, 8), 7.0);
    assert_eq!(
        key0(kb, 8),
        0.0,
        "the fork does not see the parent's new slot"
    );
    kv.truncate(a, 40).unwrap();
    // Rewinding b into the shared page and writing there copies the page first.
    kv.truncate(b, 20).unwrap();
    kv.append(b, &[20]).unwrap();
    kv.write(0, b, 20, &[99.0, 99.0], &[0.0, 0.0]).unwrap();
    let (ka, _) = kv.view(0, a).unwrap().page(0, 0).unwrap();
    let (kb, _) = kv.view(0, b).unwrap().page(0, 0).unwrap();
    assert_eq!(key0(ka, 20), 20.0, "parent untouched");
    assert_eq!(key0(kb, 20), 99.0);
    assert_eq!(key0(kb, 19), 19.0, "copy kept the earlier slots");
    kv.free_sequence(a);
    kv.free_sequence(b);
    assert!(kv.usage().iter().all(|u| u.free == u.total));
}

#[test]
fn q8_0_pages_hold_rows_in_34_bytes_per_32_values() {
    let mut l = layout(None);
    l.kv_type = KvType::Q8_0;
    let e = KvCache::new(l.clone(), PAGE_SIZE).unwrap_err();
    assert!(matches!(e, Error::KvTypeUnfit { head_dim: 2, .. }), "{e}");
    assert!(e.to_string().contains("use f16"), "{e}");
    l.head_dim = 64;
    assert_eq!(
        l.page_bytes() * 64,
        (KvLayout {
            kv_type: KvType::F16,
            ..l.clone()
        })
        .page_bytes()
            * 34
    );
    let mut kv = KvCache::new(l, 2 * PAGE_SIZE).unwrap();
    let s = kv.new_sequence();
    kv.append(s, &positions(0..3)).unwrap();
    let k: Vec<f32> = (0..64).map(|i| i as f32 / 8.0 - 4.0).collect();
    kv.write(0, s, 2, &k, &k).unwrap();
    let (keys, _) = kv.view(0, s).unwrap().page(0, 0).unwrap();
    assert_eq!(keys.len(), PAGE_SIZE * 68);
    for (i, &x) in k.iter().enumerate() {
        let got = kernels::key_value(KvType::Q8_0, keys, 64, 2, i);
        assert!(
            (got - x).abs() <= 4.0 / 127.0 / 2.0 + 1e-3,
            "{i}: {got} vs {x}"
        );
    }
    kv.free_sequence(s);
}

#[test]
fn each_head_keeps_its_rows_through_writes_forks_and_snapshots() {
    // Two KV heads: head h's key in slot s is [100·h + s, 0], its value [-(100·h + s), 1].
    let l = KvLayout {
        n_kv_heads: 2,
        ..layout(None)
    };
    let mut kv = KvCache::new(l, 8 * PAGE_SIZE).unwrap();
    let a = kv.new_sequence();
    let n = PAGE_SIZE + 9;
    kv.append(a, &positions(0..n as u32)).unwrap();
    let kv_of = |s: usize| {
        let x = |h: usize| (100 * h + s) as f32;
        ([x(0), 0.0, x(1), 0.0], [-x(0), 1.0, -x(1), 1.0])
    };
    for slot in 0..n {
        let (k, v) = kv_of(slot);
        kv.write(0, a, slot, &k, &v).unwrap();
    }
    let check = |kv: &KvCache, seq: SeqId, n: usize| {
        let view = kv.view(0, seq).unwrap();
        for slot in 0..n {
            for h in 0..2 {
                let (keys, values) = view.page(slot / PAGE_SIZE, h).unwrap();
                let want = (100 * h + slot) as f32;
                assert_eq!(key0(keys, slot % PAGE_SIZE), want, "key {slot} {h}");
                let v = kernels::row_value(KvType::F16, values, 2 * (slot % PAGE_SIZE));
                assert_eq!(v, -want, "value {slot} {h}");
            }
        }
        assert!(view.page(0, 2).is_none(), "no third head");
    };
    check(&kv, a, n);
    // A fork writing into the shared partial page copies both heads' rows of it.
    let b = kv.fork(a).unwrap();
    kv.append(b, &[n as u32]).unwrap();
    let (k, v) = kv_of(n);
    kv.write(0, b, n, &k, &v).unwrap();
    check(&kv, a, n);
    check(&kv, b, n + 1);
    // A snapshot holds each page as head 0's rows, then head 1's; it comes back whole.
    let state = kv.export(b).unwrap();
    let head_rows = PAGE_SIZE * kv.layout().row_bytes();
    let first_key = |at: usize| {
        let b = &state.groups[0].keys[0][at..at + 2];
        half::f16::from_le_bytes([b[0], b[1]]).to_f32()
    };
    assert_eq!((first_key(0), first_key(head_rows)), (0.0, 100.0));
    let c = kv.new_sequence();
    kv.import(c, &state).unwrap();
    check(&kv, c, n + 1);
    for s in [a, b, c] {
        kv.free_sequence(s);
    }
    assert!(kv.usage().iter().all(|u| u.free == u.total));
}

#[test]
fn sliding_window_pages_are_released_and_rewinds_checked() {
    let mut kv = KvCache::new(layout(Some(PAGE_SIZE)), 16 * PAGE_SIZE).unwrap();
    let s = kv.new_sequence();
    kv.append(s, &positions(0..(6 * PAGE_SIZE) as u32)).unwrap();
    assert_eq!(
        kv.usage()[1].free,
        10,
        "nothing is released before the slots are written"
    );
    kv.release_behind_window(s);
    let usage = kv.usage();
    assert_eq!(
        usage[0].total - usage[0].free,
        6,
        "full-attention group keeps all"
    );
    // Highest position 191, horizon 191 - 64 = 127: pages 0..=2 (positions < 96) go,
    // page 3 holds position 127 and stays.
    assert_eq!(usage[1].total - usage[1].free, 3);
    // A released slot cannot be written; the error says why (not "no such sequence").
    let row = vec![0.0; 2];
    match kv.write(1, s, 0, &row, &row) {
        Err(Error::BadBatch { reason }) => assert!(reason.contains("released"), "{reason}"),
        other => panic!("writing a released slot: {other:?}"),
    }
    assert!(
        kv.write(0, s, 0, &row, &row).is_ok(),
        "full attention keeps slot 0"
    );
    // A token placed back at position 100 would see positions 69..=100, some released: an
    // error, nothing appended. At 130 it sees 99..=130, all held.
    let e = kv.append(s, &[100]).unwrap_err();
    assert!(
        matches!(e, Error::PositionBehindWindow { pos: 100, .. }),
        "{e}"
    );
    assert_eq!(kv.len(s).unwrap(), 6 * PAGE_SIZE);
    assert_eq!(kv.append(s, &[130]).unwrap(), 6 * PAGE_SIZE);
    assert!(kv.truncate(s, 5 * PAGE_SIZE).is_ok());
    let e = kv.truncate(s, 3 * PAGE_SIZE).unwrap_err();
    assert!(matches!(e, Error::RewindPastWindow { window: 32, .. }));
    // Said in the user's terms: where to, the window, what to do; no internal sequence id.
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("back to {} tokens", 3 * PAGE_SIZE))
            && msg.contains("(32 positions)")
            && msg.contains("new context")
            && !msg.contains("sequence"),
        "{msg}"
    );
    kv.free_sequence(s);
    assert!(kv.usage().iter().all(|u| u.free == u.total));
}
