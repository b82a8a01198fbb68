//! Unit tests of the KV index: edits of every shape, lookups against naive models.

use super::*;

fn matches(ix: &KvIndex, hashes: &[u64]) -> Vec<(WorkerId, usize)> {
    let mut out = Vec::new();
    ix.match_prefix(hashes, &mut out);
    out.sort();
    out
}

#[test]
fn stores_are_idempotent_and_counted() {
    let mut ix = KvIndex::new(7);
    let a = WorkerId(0);
    assert_eq!(ix.apply_stored(a, &[1, 2, 3]), 3);
    assert_eq!(ix.apply_stored(a, &[1, 2, 3, 4]), 1);
    assert_eq!(Some(ix.blocks_of(a)), Some(4));
    assert_eq!(ix.pairs(), 4);
}

#[test]
fn leading_blocks_per_worker_stop_at_gaps() {
    let mut ix = KvIndex::new(1);
    let a = WorkerId(0);
    let b = WorkerId(1);
    let c = WorkerId(2);
    ix.apply_stored(a, &[10, 11, 12, 13]);
    ix.apply_stored(b, &[10, 11]);
    ix.apply_stored(c, &[10, 12, 13]); // gap at 11
    assert_eq!(
        matches(&ix, &[10, 11, 12, 13, 14]),
        vec![(a, 4), (b, 2), (c, 1)]
    );
    assert_eq!(matches(&ix, &[11, 12]), vec![(a, 2), (b, 1)]);
    assert!(matches(&ix, &[99, 10]).is_empty());
    assert!(matches(&ix, &[]).is_empty());
    assert_eq!(ix.matched_blocks(c, &[10, 11, 12]), 1);
}

#[test]
fn many_holders_use_sets_and_shrink_back() {
    let mut ix = KvIndex::new(3);
    let ws: Vec<WorkerId> = (0..5).map(|i| WorkerId(i as u32)).collect();
    for &w in &ws {
        ix.apply_stored(w, &[1, 2]);
    }
    assert_eq!(
        matches(&ix, &[1, 2]),
        ws.iter().map(|&w| (w, 2)).collect::<Vec<_>>()
    );
    for &w in &ws[..4] {
        assert_eq!(ix.apply_removed(w, &[2]), 1);
    }
    assert_eq!(ix.apply_removed(ws[0], &[2]), 0);
    let got = matches(&ix, &[1, 2]);
    assert_eq!(
        got,
        vec![(ws[0], 1), (ws[1], 1), (ws[2], 1), (ws[3], 1), (ws[4], 2)]
    );
    // a set slot freed by shrinking is reused
    for &w in &ws {
        ix.apply_stored(w, &[3]);
    }
    assert_eq!(ix.pairs(), 5 + 1 + 5);
}

#[test]
fn clear_snapshot_and_remove_worker() {
    let mut ix = KvIndex::new(0);
    let a = WorkerId(0);
    let b = WorkerId(1);
    let c = WorkerId(2);
    ix.apply_stored(a, &[1, 2, 3]);
    ix.apply_stored(b, &[1, 2]);
    ix.apply_stored(c, &[1]);
    ix.clear(a);
    assert_eq!(matches(&ix, &[1, 2, 3]), vec![(b, 2), (c, 1)]);
    assert_eq!(ix.distinct_blocks(), 2);
    ix.apply_snapshot(b, &[7, 8]);
    assert_eq!(ix.blocks_of(b), 2);
    assert_eq!(matches(&ix, &[1, 2]), vec![(c, 1)]);
    assert_eq!(matches(&ix, &[7, 8]), vec![(b, 2)]);
    ix.clear(b);
    assert!(matches(&ix, &[7]).is_empty());
    assert_eq!(ix.pairs(), 1);
    assert_eq!(ix.blocks_of(b), 0);
    assert_eq!(ix.apply_stored(b, &[7]), 1, "a cleared id can be reused");
}

#[test]
fn unknown_workers_are_harmless() {
    let mut ix = KvIndex::new(0);
    assert_eq!(ix.apply_removed(WorkerId(3), &[1]), 0);
    ix.clear(WorkerId(3));
    assert_eq!(ix.blocks_of(WorkerId(3)), 0);
    ix.apply_snapshot(WorkerId(3), &[1]);
    ix.clear(WorkerId(3));
    assert_eq!(ix.distinct_blocks(), 0);
}

/// Random stores, removals, clears and snapshots over `active` workers (of `total`
/// registered), checking every lookup and count against per-worker hash sets.
fn random_against_naive(seed: u64, total: usize, active: &[usize], steps: u64) {
    use std::collections::HashSet;
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut ix = KvIndex::new(seed ^ 11);
    let all: Vec<WorkerId> = (0..total).map(|i| WorkerId(i as u32)).collect();
    let ws: Vec<WorkerId> = active.iter().map(|&i| all[i]).collect();
    let mut naive: Vec<HashSet<u64>> = vec![HashSet::new(); ws.len()];
    let chain: Vec<u64> = (100..140).collect();
    for step in 0..steps {
        let w = next(ws.len() as u64) as usize;
        match next(10) {
            0..=4 => {
                // store a prefix of the chain, sometimes starting mid-chain (a gap)
                let from = if next(4) == 0 { next(20) as usize } else { 0 };
                let to = from + next(20) as usize;
                ix.apply_stored(ws[w], &chain[from..to]);
                naive[w].extend(&chain[from..to]);
            }
            5..=7 => {
                let h = chain[next(40) as usize];
                ix.apply_removed(ws[w], &[h]);
                naive[w].remove(&h);
            }
            8 => {
                if next(8) == 0 {
                    ix.clear(ws[w]);
                    naive[w].clear();
                }
            }
            _ => {
                let blocks: Vec<u64> = (0..next(5)).map(|_| chain[next(40) as usize]).collect();
                ix.apply_snapshot(ws[w], &blocks);
                naive[w] = blocks.into_iter().collect();
            }
        }
        let start = next(3) as usize;
        let query = &chain[start..];
        let depth = |set: &HashSet<u64>| query.iter().take_while(|h| set.contains(h)).count();
        let mut want: Vec<(WorkerId, usize)> = ws
            .iter()
            .zip(&naive)
            .map(|(&w, set)| (w, depth(set)))
            .filter(|&(_, n)| n > 0)
            .collect();
        want.sort();
        ix.check_invariants();
        assert_eq!(matches(&ix, query), want, "step {step}");
        let probe = next(ws.len() as u64) as usize;
        assert_eq!(ix.matched_blocks(ws[probe], query), depth(&naive[probe]));
        let pairs: usize = naive.iter().map(HashSet::len).sum();
        assert_eq!(ix.pairs(), pairs as u64);
    }
}

#[test]
fn random_operations_match_a_naive_model() {
    // few workers: every set of 3+ is a bitset
    random_against_naive(0x5eed, 7, &[0, 1, 2, 3, 4, 5, 6], 3_000);
}

#[test]
fn random_operations_match_a_naive_model_with_sparse_ids() {
    // high, sparse ids: sets start as sorted lists and switch to bitsets past 8 members
    let active: Vec<usize> = (0..24).map(|i| i * 11 + 3).collect();
    random_against_naive(0xfeed, 300, &active, 3_000);
}

#[test]
fn random_operations_match_a_naive_model_many_workers() {
    // wide bitsets (several words) narrowing word by word
    let active: Vec<usize> = (0..90).collect();
    random_against_naive(0xbeef, 90, &active, 2_000);
}

/// A chain of `n` block hashes, distinct per `seed` (sharing nothing with other seeds).
fn ch(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| fold(seed * 1_000_003 + i + 1))
        .collect()
}

#[test]
fn a_chain_stored_in_batches_is_one_run() {
    let mut ix = KvIndex::new(5);
    let a = WorkerId(0);
    let c = ch(1, 200);
    for b in c.chunks(16) {
        ix.apply_stored(a, b);
    }
    assert_eq!(ix.run_count(), 1);
    assert_eq!(matches(&ix, &c), vec![(a, 200)]);
    ix.check_invariants();
}

#[test]
fn a_run_splits_where_a_holder_set_diverges() {
    let mut ix = KvIndex::new(5);
    let a = WorkerId(0);
    let b = WorkerId(1);
    let c = ch(1, 100);
    ix.apply_stored(a, &c);
    // b holds blocks 40..60 only: not a prefix of the run, which splits around them
    ix.apply_stored(b, &c[40..60]);
    ix.check_invariants();
    assert_eq!(
        ix.run_count(),
        2,
        "cut at 40; b's blocks are a prefix of the tail"
    );
    assert_eq!(matches(&ix, &c), vec![(a, 100)]);
    assert_eq!(matches(&ix, &c[40..]), vec![(a, 60), (b, 20)]);
    assert_eq!(ix.matched_blocks(b, &c[40..]), 20);
    // b fills the gap from the start: its holding of the first run becomes a prefix
    ix.apply_stored(b, &c[..40]);
    ix.check_invariants();
    assert_eq!(matches(&ix, &c), vec![(a, 100), (b, 60)]);
}

#[test]
fn removal_from_the_middle_of_a_run() {
    let mut ix = KvIndex::new(5);
    let a = WorkerId(0);
    let b = WorkerId(1);
    let c = ch(2, 64);
    ix.apply_stored(a, &c);
    ix.apply_stored(b, &c);
    assert_eq!(ix.apply_removed(a, &[c[20]]), 1);
    ix.check_invariants();
    assert_eq!(matches(&ix, &c), vec![(a, 20), (b, 64)]);
    assert_eq!(matches(&ix, &c[21..]), vec![(a, 43), (b, 43)]);
    assert_eq!(ix.distinct_blocks(), 64, "b still holds the block");
    assert_eq!(ix.apply_removed(b, &[c[20]]), 1);
    ix.check_invariants();
    assert_eq!(ix.distinct_blocks(), 63);
    assert_eq!(matches(&ix, &c), vec![(a, 20), (b, 20)]);
    assert_eq!(ix.apply_removed(b, &[c[20]]), 0, "already gone");
}

#[test]
fn evicting_a_runs_tail_drops_its_blocks() {
    let mut ix = KvIndex::new(5);
    let a = WorkerId(0);
    let b = WorkerId(1);
    let c = ch(3, 50);
    ix.apply_stored(a, &c);
    ix.apply_stored(b, &c[..10]);
    for h in c[10..].iter().rev() {
        assert_eq!(ix.apply_removed(a, &[*h]), 1);
        ix.check_invariants();
    }
    assert_eq!(ix.distinct_blocks(), 10);
    assert_eq!(matches(&ix, &c), vec![(a, 10), (b, 10)]);
    // the worker's next blocks extend the run again
    ix.apply_stored(a, &c[10..20]);
    ix.check_invariants();
    assert_eq!(matches(&ix, &c), vec![(a, 20), (b, 10)]);
    for &h in c.iter().rev() {
        ix.apply_removed(a, &[h]);
        ix.apply_removed(b, &[h]);
    }
    ix.check_invariants();
    assert_eq!(
        (ix.distinct_blocks(), ix.pairs(), ix.run_count()),
        (0, 0, 0)
    );
}

#[test]
fn a_chain_shared_by_many_workers_at_different_depths() {
    let mut ix = KvIndex::new(5);
    let c = ch(4, 300);
    let ws: Vec<WorkerId> = (0..120).map(|i| WorkerId(i as u32)).collect();
    for (i, &w) in ws.iter().enumerate() {
        let depth = (i * 37) % 301;
        for b in c[..depth].chunks(16) {
            ix.apply_stored(w, b);
        }
        // unrelated blocks after the chain, as a busy worker stores them
        ix.apply_stored(w, &ch(1_000 + i as u64, 20));
    }
    ix.check_invariants();
    let want: Vec<(WorkerId, usize)> = ws
        .iter()
        .enumerate()
        .map(|(i, &w)| (w, (i * 37) % 301))
        .filter(|&(_, d)| d > 0)
        .collect();
    // twice: the second lookup uses the by-end summaries built by the first
    assert_eq!(matches(&ix, &c), want);
    assert_eq!(matches(&ix, &c), want);
    for (i, &w) in ws.iter().enumerate() {
        assert_eq!(ix.matched_blocks(w, &c), (i * 37) % 301);
    }
    // a shorter query and one starting mid-chain
    let short: Vec<(WorkerId, usize)> = want.iter().map(|&(w, d)| (w, d.min(100))).collect();
    assert_eq!(matches(&ix, &c[..100]), short);
    let mid: Vec<(WorkerId, usize)> = want
        .iter()
        .filter(|&&(_, d)| d > 150)
        .map(|&(w, d)| (w, d - 150))
        .collect();
    assert_eq!(matches(&ix, &c[150..]), mid);
}

#[test]
fn snapshots_and_clear_replace_runs() {
    let mut ix = KvIndex::new(5);
    let ws: Vec<WorkerId> = (0..20).map(|i| WorkerId(i as u32)).collect();
    let c = ch(5, 80);
    for &w in &ws {
        ix.apply_stored(w, &c);
    }
    // a snapshot in no particular order, sharing half the chain
    let mut snap: Vec<u64> = c[..40].iter().rev().copied().collect();
    snap.extend(ch(6, 10));
    ix.apply_snapshot(ws[3], &snap);
    ix.check_invariants();
    let got = matches(&ix, &c);
    assert_eq!(got.len(), 20);
    assert!(
        got.iter()
            .all(|&(w, d)| d == if w == ws[3] { 40 } else { 80 })
    );
    assert_eq!(matches(&ix, &ch(6, 10)), vec![(ws[3], 10)]);
    for (i, &w) in ws[..19].iter().enumerate() {
        if i != 3 {
            ix.clear(w);
            ix.check_invariants();
        }
    }
    assert_eq!(matches(&ix, &c), vec![(ws[3], 40), (ws[19], 80)]);
    ix.clear(ws[19]);
    ix.check_invariants();
    assert_eq!(matches(&ix, &c), vec![(ws[3], 40)]);
    assert_eq!(ix.pairs(), 50);
}

/// vLLM-like traffic against per-worker hash sets: conversations on a few shared system
/// prompts, stored in batches that follow their chains (interleaved between requests),
/// evicted leaf first or at random, plus clears, shuffled snapshots and worker removal.
/// After every step the lookups of several prompts agree with the model and the layout's
/// invariants hold.
fn chains_against_naive(seed: u64, workers: usize, steps: usize) {
    use std::collections::HashSet;
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n.max(1)
    };
    // prompts: a system prefix (one of 3) followed by a private part
    let prefixes: Vec<Vec<u64>> = (0..3).map(|p| ch(900 + p, 8 + 8 * p as usize)).collect();
    let prompts: Vec<Vec<u64>> = (0..24u64)
        .map(|i| {
            let mut v = prefixes[(i % 3) as usize].clone();
            // chained hashes: the private part depends on the prefix it follows
            v.extend(ch(2_000 + i, 10 + (i as usize * 7) % 40));
            v
        })
        .collect();
    let mut ix = KvIndex::new(seed);
    let ws: Vec<WorkerId> = (0..workers).map(|i| WorkerId(i as u32)).collect();
    let mut naive: Vec<HashSet<u64>> = vec![HashSet::new(); workers];
    let mut out = Vec::new();
    for step in 0..steps {
        let w = next(workers as u64) as usize;
        let p = &prompts[next(prompts.len() as u64) as usize];
        match next(20) {
            0..=9 => {
                // a request's blocks, in batches from some depth, following the chain
                let from = next(p.len() as u64 / 2) as usize;
                let to = from + next((p.len() - from) as u64 + 1) as usize;
                for b in p[from..to].chunks(1 + next(16) as usize) {
                    ix.apply_stored(ws[w], b);
                    naive[w].extend(b);
                }
            }
            10..=13 => {
                // leaf-first eviction of a chain's tail
                let n = next(12) as usize;
                for &h in p.iter().rev().take(n) {
                    ix.apply_removed(ws[w], &[h]);
                    naive[w].remove(&h);
                }
            }
            14..=15 => {
                let h = p[next(p.len() as u64) as usize];
                ix.apply_removed(ws[w], &[h]);
                naive[w].remove(&h);
            }
            16 => {
                ix.clear(ws[w]);
                naive[w].clear();
            }
            17 | 18 => {
                let mut blocks: Vec<u64> = naive[w].iter().copied().collect();
                blocks.sort_unstable();
                blocks.truncate(next(blocks.len() as u64 + 1) as usize);
                blocks.extend(p.iter().take(next(p.len() as u64) as usize));
                ix.apply_snapshot(ws[w], &blocks);
                naive[w] = blocks.into_iter().collect();
            }
            _ => {
                if next(4) == 0 {
                    ix.clear(ws[w]);
                    naive[w].clear();
                }
            }
        }
        ix.check_invariants();
        for _ in 0..3 {
            let q = &prompts[next(prompts.len() as u64) as usize];
            let q = &q[next(3) as usize..];
            let depth = |set: &HashSet<u64>| q.iter().take_while(|h| set.contains(h)).count();
            let mut want: Vec<(WorkerId, usize)> = ws
                .iter()
                .zip(&naive)
                .map(|(&w, set)| (w, depth(set)))
                .filter(|&(_, n)| n > 0)
                .collect();
            want.sort();
            ix.match_prefix(q, &mut out);
            out.sort();
            assert_eq!(out, want, "step {step}");
            let probe = next(workers as u64) as usize;
            assert_eq!(ix.matched_blocks(ws[probe], q), depth(&naive[probe]));
        }
    }
}

#[test]
fn chained_traffic_matches_a_naive_model() {
    chains_against_naive(0xc0ffee, 5, 3_000);
}

#[test]
fn chained_traffic_matches_a_naive_model_many_workers() {
    // enough holders per run for the by-end summaries and the bitset narrowing
    chains_against_naive(0xdecade, 60, 1_500);
}

#[test]
fn memory_estimate_grows_with_blocks() {
    let mut ix = KvIndex::new(0);
    let a = WorkerId(0);
    let blocks: Vec<u64> = (0..10_000).collect();
    ix.apply_stored(a, &blocks);
    let per_pair = ix.memory_bytes() as f64 / ix.pairs() as f64;
    assert!(per_pair > 16.0 && per_pair < 64.0, "{per_pair}");
}

#[test]
fn the_table_grows_4x_while_small_then_2x_then_by_half() {
    let mut ix = KvIndex::new(3);
    let mut caps = vec![];
    let w = WorkerId(0);
    // distinct blocks, one call each: every one probes the table
    for h in 1..=300_000u64 {
        ix.apply_stored(w, &[h.wrapping_mul(0x9E37_79B9_7F4A_7C15)]);
        let cap = ix.table.slots.len();
        if caps.last() != Some(&cap) {
            caps.push(cap);
            // never fuller than 80% after a store
            assert!(ix.table.len * 5 <= cap * 4, "{} in {cap}", ix.table.len);
        }
    }
    assert_eq!(
        caps,
        [16, 64, 256, 1024, 4096, 16_384, 65_536, 262_144, 1 << 20]
    );
    let grown = |n: usize| {
        Table {
            slots: vec![0; n],
            len: 0,
        }
        .grown()
    };
    assert_eq!(grown(1 << 20), 1 << 21);
    assert_eq!(grown(1 << 21), 1 << 22);
    assert_eq!(grown(1 << 22), 6 << 20);
}

#[test]
fn clearing_a_worker_visits_only_its_own_runs() {
    let mut ix = KvIndex::new(7);
    let b = WorkerId(1);
    // 2,000 other workers, one chain (one run) each.
    for i in 0..2_000u32 {
        ix.apply_stored(WorkerId(2 + i), &ch(u64::from(i), 3));
    }
    assert!(ix.run_count() >= 2_000);
    // `b` stores and clears over and over: each clear visits `b`'s one run, not the index.
    for i in 0..1_000u64 {
        ix.apply_stored(b, &[1_000_000 + i]);
        assert_eq!(ix.clear(b), 1);
    }
    // `b` shares a run with worker 7 (the start of its chain) and holds one of its own.
    ix.apply_stored(b, &ch(5, 2));
    ix.apply_stored(b, &[9_999_999]);
    ix.check_invariants();
    assert_eq!(ix.clear(b), 2);
    assert_eq!(ix.blocks_of(b), 0);
    assert_eq!(ix.blocks_of(WorkerId(7)), 3);
    ix.check_invariants();
}
