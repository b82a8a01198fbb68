//! The KV index (compiled in directly, `#[path]`: it depends only on serde) driven by
//! arbitrary operation sequences and checked after every operation against per-worker hash
//! sets: leading-prefix matches, per-worker depth, pair and block counts.
//!
//! Input bytes are read as operations over 6 workers and 4 chains that share prefixes (so
//! runs are shared, split, extended and truncated): `cargo +nightly fuzz run index_ops`.
#![no_main]

#[path = "../../src/routing/index.rs"]
#[allow(dead_code)]
mod index;

/// The worker ids the index keys its blocks by.
#[path = "../../src/routing/workers.rs"]
#[allow(dead_code)]
mod workers;

/// Per-GPU status, which the worker table (`workers`) carries.
#[path = "../../src/routing/gpu.rs"]
#[allow(dead_code)]
mod gpu;

use std::collections::HashSet;

use index::KvIndex;
use workers::WorkerId;
use libfuzzer_sys::fuzz_target;

const WORKERS: usize = 6;

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Chain `c`: 12 blocks shared by chains of the same parity, then 28 of its own.
fn chains() -> Vec<Vec<u64>> {
    (0..4u64)
        .map(|c| {
            (0..40u64)
                .map(|i| {
                    if i < 12 {
                        mix(c % 2 * 100 + i)
                    } else {
                        mix(1_000 * (c + 1) + i)
                    }
                })
                .collect()
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let chains = chains();
    let mut ix = KvIndex::new(u64::from(data.first().copied().unwrap_or(0)));
    let ws: Vec<WorkerId> = (0..WORKERS)
        .map(|i| WorkerId(i as u32))
        .collect();
    let mut model: Vec<HashSet<u64>> = vec![HashSet::new(); WORKERS];
    let mut out = Vec::new();
    for op in data.chunks_exact(4) {
        let w = op[0] as usize % WORKERS;
        let c = &chains[(op[0] as usize / WORKERS) % chains.len()];
        let from = op[2] as usize % c.len();
        let to = (from + op[3] as usize % 24).min(c.len());
        match op[1] % 8 {
            0..=2 => {
                // a store event, in batches of 1..8 following the chain
                let batch = 1 + (op[1] as usize >> 3) % 8;
                for b in c[from..to].chunks(batch) {
                    ix.apply_stored(ws[w], b);
                    model[w].extend(b);
                }
            }
            3 => {
                // leaf-first eviction
                for &h in c[from..to].iter().rev() {
                    ix.apply_removed(ws[w], &[h]);
                    model[w].remove(&h);
                }
            }
            4 => {
                ix.apply_removed(ws[w], &c[from..to]);
                for h in &c[from..to] {
                    model[w].remove(h);
                }
            }
            5 => {
                ix.clear(ws[w]);
                model[w].clear();
            }
            6 => {
                // a snapshot, its blocks reversed
                let blocks: Vec<u64> = c[from..to].iter().rev().copied().collect();
                ix.apply_snapshot(ws[w], &blocks);
                model[w] = blocks.into_iter().collect();
            }
            _ => {
                // the worker is retired and its id handed to a new one
                ix.clear(ws[w]);
                model[w].clear();
            }
        }
        for q in &chains {
            let q = &q[op[3] as usize % 3..];
            let depth = |s: &HashSet<u64>| q.iter().take_while(|h| s.contains(h)).count();
            let want: Vec<(WorkerId, usize)> = ws
                .iter()
                .zip(&model)
                .map(|(&id, s)| (id, depth(s)))
                .filter(|&(_, d)| d > 0)
                .collect();
            ix.match_prefix(q, &mut out);
            out.sort();
            assert_eq!(out, want);
            for (&id, s) in ws.iter().zip(&model) {
                assert_eq!(ix.matched_blocks(id, q), depth(s));
            }
        }
        let pairs: usize = model.iter().map(HashSet::len).sum();
        assert_eq!(ix.pairs(), pairs as u64);
        for (&id, s) in ws.iter().zip(&model) {
            assert_eq!(ix.blocks_of(id), s.len() as u64);
        }
    }
});
