//! The KV index through its public API, on the shapes its run layout must get right: runs
//! splitting where holder sets diverge, removals from the middle, tail evictions, one chain
//! held by many workers to different depths, snapshots and clears; and random chained
//! traffic checked against per-worker hash sets.

use std::collections::HashSet;

use kvroute_router::routing::{KvIndex, WorkerId};

/// splitmix64: distinct synthetic block hashes.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn chain(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| mix(seed * 1_000_003 + i)).collect()
}

fn matches(ix: &KvIndex, q: &[u64]) -> Vec<(WorkerId, usize)> {
    let mut out = Vec::new();
    ix.match_prefix(q, &mut out);
    out.sort();
    out
}

fn workers(n: usize) -> Vec<WorkerId> {
    (0..n).map(|i| WorkerId(i as u32)).collect()
}

#[test]
fn a_holder_set_diverging_mid_run() {
    let mut ix = KvIndex::new(3);
    let w = workers(3);
    let c = chain(1, 96);
    for b in c.chunks(16) {
        ix.apply_stored(w[0], b);
    }
    ix.apply_stored(w[1], &c[30..50]); // not a prefix: a gap before 30
    ix.apply_stored(w[2], &c[..70]);
    assert_eq!(matches(&ix, &c), vec![(w[0], 96), (w[2], 70)]);
    assert_eq!(
        matches(&ix, &c[30..]),
        vec![(w[0], 66), (w[1], 20), (w[2], 40)]
    );
    ix.apply_stored(w[1], &c[..30]);
    assert_eq!(matches(&ix, &c), vec![(w[0], 96), (w[1], 50), (w[2], 70)]);
    assert_eq!(ix.pairs(), 96 + 50 + 70);
}

#[test]
fn removing_from_the_middle_and_evicting_the_tail() {
    let mut ix = KvIndex::new(3);
    let w = workers(2);
    let c = chain(2, 64);
    ix.apply_stored(w[0], &c);
    ix.apply_stored(w[1], &c[..32]);
    assert_eq!(ix.apply_removed(w[0], &[c[10]]), 1);
    assert_eq!(matches(&ix, &c), vec![(w[0], 10), (w[1], 32)]);
    assert_eq!(matches(&ix, &c[11..]), vec![(w[0], 53), (w[1], 21)]);
    for h in c[32..].iter().rev() {
        assert_eq!(ix.apply_removed(w[0], &[*h]), 1);
    }
    assert_eq!(ix.distinct_blocks(), 32);
    assert_eq!(matches(&ix, &c[11..]), vec![(w[0], 21), (w[1], 21)]);
    assert_eq!(ix.blocks_of(w[0]), 31);
    // stored again after eviction
    ix.apply_stored(w[0], &c[32..40]);
    assert_eq!(matches(&ix, &c[11..]), vec![(w[0], 29), (w[1], 21)]);
}

#[test]
fn one_chain_many_workers_many_depths() {
    let mut ix = KvIndex::new(3);
    let w = workers(300);
    let c = chain(3, 512);
    for (i, &id) in w.iter().enumerate() {
        let depth = (i * 37) % 513;
        for b in c[..depth].chunks(16) {
            ix.apply_stored(id, b);
        }
        ix.apply_stored(id, &chain(10_000 + i as u64, 40));
    }
    let want: Vec<(WorkerId, usize)> = w
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, (i * 37) % 513))
        .filter(|&(_, d)| d > 0)
        .collect();
    for _ in 0..2 {
        assert_eq!(matches(&ix, &c), want);
    }
    // a worker evicts most of its chain; another extends its own
    let (a, b) = (w[13], w[14]);
    let depth_of = |i: usize| (i * 37) % 513;
    for h in c[5..depth_of(13)].iter().rev() {
        ix.apply_removed(a, &[*h]);
    }
    ix.apply_stored(b, &c);
    let got = matches(&ix, &c);
    assert!(got.contains(&(a, 5)) && got.contains(&(b, 512)), "{got:?}");
    assert_eq!(got.len(), want.len());
}

#[test]
fn snapshots_clear_and_worker_removal() {
    let mut ix = KvIndex::new(3);
    let w = workers(3);
    let c = chain(4, 40);
    for &id in &w {
        ix.apply_stored(id, &c);
    }
    let mut snap: Vec<u64> = c[..25].to_vec();
    snap.reverse();
    ix.apply_snapshot(w[1], &snap);
    assert_eq!(ix.blocks_of(w[1]), 25);
    assert_eq!(matches(&ix, &c), vec![(w[0], 40), (w[1], 25), (w[2], 40)]);
    ix.clear(w[0]);
    ix.clear(w[2]);
    assert_eq!(matches(&ix, &c), vec![(w[1], 25)]);
    assert_eq!((ix.pairs(), ix.distinct_blocks()), (25, 25));
    ix.apply_snapshot(w[1], &[]);
    assert!(matches(&ix, &c).is_empty());
    assert_eq!((ix.pairs(), ix.distinct_blocks()), (0, 0));
}

/// Random chained traffic (shared system prefixes, batches following chains, leaf-first and
/// random removals, clears, snapshots) against per-worker hash sets.
#[test]
fn random_chained_traffic_matches_hash_sets() {
    let mut state = 0x1dea_u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n.max(1)
    };
    let prompts: Vec<Vec<u64>> = (0..16u64)
        .map(|i| {
            let mut v = chain(500 + i % 2, 12);
            v.extend(chain(600 + i, 8 + (i as usize * 5) % 30));
            v
        })
        .collect();
    let mut ix = KvIndex::new(11);
    let w = workers(24);
    let mut model: Vec<HashSet<u64>> = vec![HashSet::new(); w.len()];
    for step in 0..2_000 {
        let k = next(w.len() as u64) as usize;
        let p = &prompts[next(prompts.len() as u64) as usize];
        match next(10) {
            0..=4 => {
                let to = next(p.len() as u64 + 1) as usize;
                for b in p[..to].chunks(1 + next(16) as usize) {
                    ix.apply_stored(w[k], b);
                    model[k].extend(b);
                }
            }
            5..=6 => {
                for &h in p.iter().rev().take(next(10) as usize) {
                    ix.apply_removed(w[k], &[h]);
                    model[k].remove(&h);
                }
            }
            7 => {
                let h = p[next(p.len() as u64) as usize];
                ix.apply_removed(w[k], &[h]);
                model[k].remove(&h);
            }
            8 => {
                ix.clear(w[k]);
                model[k].clear();
            }
            _ => {
                let blocks: Vec<u64> = p.iter().rev().take(next(20) as usize).copied().collect();
                ix.apply_snapshot(w[k], &blocks);
                model[k] = blocks.into_iter().collect();
            }
        }
        let q = &prompts[next(prompts.len() as u64) as usize];
        let depth = |s: &HashSet<u64>| q.iter().take_while(|h| s.contains(h)).count();
        let want: Vec<(WorkerId, usize)> = w
            .iter()
            .zip(&model)
            .map(|(&id, s)| (id, depth(s)))
            .filter(|&(_, d)| d > 0)
            .collect();
        assert_eq!(matches(&ix, q), want, "step {step}");
        let pairs: usize = model.iter().map(HashSet::len).sum();
        assert_eq!(ix.pairs(), pairs as u64, "step {step}");
        for (&id, s) in w.iter().zip(&model) {
            assert_eq!(ix.blocks_of(id), s.len() as u64);
        }
    }
}
