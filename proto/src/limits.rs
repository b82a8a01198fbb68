//! How large an Ingest message may be, and the splitting that keeps every report within it.
//! The router refuses a larger message (`RESOURCE_EXHAUSTED`, before buffering it); the
//! sidecar's encoder cuts snapshots and deltas so that it never sends one.
//!
//! ```text
//! resident set (any size) --snapshot_chunks(max_blocks)--> SnapshotChunk[first .. last]
//! queued ops (any size) ----split_delta(max_blocks)--------> Delta, Delta, ...
//!                                      every message <= MAX_MESSAGE_BYTES / 2 (see below)
//! ```
//!
//! Budget: a block costs 8 bytes in a snapshot chunk (packed `fixed64`) and at most 14 in a
//! delta (one op per block: op tag, length, kind, blocks tag, length, 8 bytes). A report of
//! [`MAX_BLOCKS_PER_MESSAGE`] blocks is therefore at most 1.75 MiB plus its identity and
//! framing (well under 1 KiB for Kubernetes-sized names), half the 4 MiB cap: the other half
//! is margin for identities and future fields.

use crate::v1::{Delta, DeltaOp, SnapshotChunk, WorkerIdentity, delta_op};

/// Largest Ingest message (one `WorkerReport`) the router decodes: 4 MiB.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Most blocks one report may carry (a snapshot chunk, or the blocks of a delta's ops with
/// each `CLEARED` op counted as one block): 128 Ki, at most half of [`MAX_MESSAGE_BYTES`]
/// encoded.
pub const MAX_BLOCKS_PER_MESSAGE: usize = 128 << 10;

/// Splits a snapshot into chunks of at most `max_blocks` blocks (itself at most
/// [`MAX_BLOCKS_PER_MESSAGE`]): at least one chunk, even when empty; the first carries the
/// identity and `first`, the last `last`.
pub fn snapshot_chunks(
    identity: WorkerIdentity,
    blocks: &[u64],
    max_blocks: usize,
) -> Vec<SnapshotChunk> {
    let max_blocks = max_blocks.clamp(1, MAX_BLOCKS_PER_MESSAGE);
    let mut chunks: Vec<SnapshotChunk> = blocks
        .chunks(max_blocks)
        .map(|c| SnapshotChunk {
            identity: None,
            first: false,
            last: false,
            blocks: c.to_vec(),
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(SnapshotChunk::default());
    }
    if let Some(first) = chunks.first_mut() {
        first.first = true;
        first.identity = Some(identity);
    }
    if let Some(last) = chunks.last_mut() {
        last.last = true;
    }
    chunks
}

/// Splits a delta into deltas of at most `max_blocks` blocks each (itself at most
/// [`MAX_BLOCKS_PER_MESSAGE`]; a `CLEARED` op counts as one), keeping the ops in order: an op
/// longer than the rest of a message is cut, its tail opening the next message. Applying
/// the parts in order is applying the whole. An empty delta stays one (empty) delta.
pub fn split_delta(delta: Delta, max_blocks: usize) -> Vec<Delta> {
    let max_blocks = max_blocks.clamp(1, MAX_BLOCKS_PER_MESSAGE);
    let mut out = vec![Delta::default()];
    let mut room = max_blocks;
    for op in delta.ops {
        let cleared = op.kind == delta_op::Kind::Cleared as i32;
        let mut blocks = op.blocks.as_slice();
        loop {
            if room == 0 {
                out.push(Delta::default());
                room = max_blocks;
            }
            let take = blocks.len().min(room);
            let (head, tail) = blocks.split_at(take);
            let Some(current) = out.last_mut() else {
                break;
            };
            current.ops.push(DeltaOp {
                kind: op.kind,
                blocks: head.to_vec(),
            });
            room -= take.max(usize::from(cleared || blocks.is_empty()));
            blocks = tail;
            if blocks.is_empty() {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{WorkerReport, worker_report};
    use prost::Message as _;

    fn long_identity() -> WorkerIdentity {
        // Kubernetes names are at most 253 characters.
        let name = "n".repeat(253);
        WorkerIdentity {
            worker_id: format!("{name}/{name}"),
            pod: name.clone(),
            namespace: name.clone(),
            address: format!("{name}:65535"),
            model: name.clone(),
            block_size: u32::MAX,
            epoch: u64::MAX,
            worker_set: name,
        }
    }

    fn encoded(body: worker_report::Body) -> usize {
        WorkerReport {
            seq: u64::MAX,
            body: Some(body),
        }
        .encoded_len()
    }

    #[test]
    fn a_full_snapshot_chunk_is_within_half_the_cap() {
        let blocks: Vec<u64> = (0..MAX_BLOCKS_PER_MESSAGE as u64 + 5)
            .map(|i| u64::MAX - i)
            .collect();
        // A caller asking for more than the cap gets the cap.
        let chunks = snapshot_chunks(long_identity(), &blocks, usize::MAX);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].blocks.len(), MAX_BLOCKS_PER_MESSAGE);
        let n = encoded(worker_report::Body::Snapshot(chunks[0].clone()));
        assert!(n <= MAX_MESSAGE_BYTES / 2, "{n} bytes");
    }

    #[test]
    fn chunks_are_bounded_and_flagged() {
        let blocks: Vec<u64> = (0..10).collect();
        let c = snapshot_chunks(WorkerIdentity::default(), &blocks, 4);
        assert_eq!(
            c.iter().map(|c| c.blocks.len()).collect::<Vec<_>>(),
            vec![4, 4, 2]
        );
        assert!(c[0].first && c[0].identity.is_some() && !c[0].last && c[2].last && !c[2].first);
        let empty = snapshot_chunks(WorkerIdentity::default(), &[], 4);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].first && empty[0].last);
    }

    fn op(kind: delta_op::Kind, blocks: Vec<u64>) -> DeltaOp {
        DeltaOp {
            kind: kind as i32,
            blocks,
        }
    }

    /// The ops of `parts` with neighbours of the same kind merged back.
    fn merged(parts: &[Delta]) -> Vec<DeltaOp> {
        let mut out: Vec<DeltaOp> = Vec::new();
        for o in parts.iter().flat_map(|d| d.ops.iter()) {
            match out.last_mut() {
                Some(l) if l.kind == o.kind && o.kind != delta_op::Kind::Cleared as i32 => {
                    l.blocks.extend_from_slice(&o.blocks)
                }
                _ => out.push(o.clone()),
            }
        }
        out
    }

    #[test]
    fn split_deltas_keep_the_ops_in_order_and_bounded() {
        use delta_op::Kind::{Cleared, Removed, Stored};
        let whole = Delta {
            ops: vec![
                op(Stored, (0..7).collect()),
                op(Cleared, vec![]),
                op(Removed, (7..9).collect()),
                op(Stored, (9..20).collect()),
            ],
        };
        let parts = split_delta(whole.clone(), 4);
        for p in &parts {
            let weight: usize = p.ops.iter().map(|o| o.blocks.len().max(1)).sum();
            assert!(weight <= 4, "{p:?}");
        }
        assert_eq!(merged(&parts), whole.ops);
        assert_eq!(split_delta(Delta::default(), 4), vec![Delta::default()]);
    }

    #[test]
    fn a_worst_case_delta_is_within_half_the_cap() {
        // One op per block, alternating kinds so that nothing merges: the most framing.
        let ops = (0..MAX_BLOCKS_PER_MESSAGE as u64 * 2)
            .map(|i| {
                let kind = if i % 2 == 0 {
                    delta_op::Kind::Stored
                } else {
                    delta_op::Kind::Removed
                };
                op(kind, vec![u64::MAX - i])
            })
            .collect();
        let parts = split_delta(Delta { ops }, usize::MAX);
        assert_eq!(parts.len(), 2);
        for p in parts {
            let n = encoded(worker_report::Body::Delta(p));
            assert!(n <= MAX_MESSAGE_BYTES / 2, "{n} bytes");
        }
    }
}
