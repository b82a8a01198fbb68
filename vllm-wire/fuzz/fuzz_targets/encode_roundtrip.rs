//! Structured arbitrary batches -> encode -> decode -> equal, for every event kind and every
//! optional field present or absent. Event values follow the documented invariants of the
//! type: an `Unknown` name is never a known type name, and `RawExtraKey::Other` holds one
//! complete msgpack value that is neither a string nor a `(string, int)` pair.
//!
//! `cargo +nightly fuzz run encode_roundtrip`
#![no_main]

use kvroute_vllm_wire::{
    BlockRemoved, BlockStored, EventBatch, KvEvent, RawExtraKey, decode_batch,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn opt<T>(
    u: &mut Unstructured<'_>,
    f: impl FnOnce(&mut Unstructured<'_>) -> Result<T>,
) -> Result<Option<T>> {
    Ok(if u.arbitrary()? { Some(f(u)?) } else { None })
}

fn string(u: &mut Unstructured<'_>) -> Result<String> {
    u.arbitrary()
}

/// Raw msgpack values of kinds the decoder keeps as `Other`: bin, int, float, bool, nil, and
/// arrays of those (never a string or a (string, int) pair).
fn other_value(u: &mut Unstructured<'_>, out: &mut Vec<u8>, depth: u32) -> Result<()> {
    match u.int_in_range(0..=6)? {
        0 => {
            let b: Vec<u8> = u.arbitrary()?;
            let b = &b[..b.len().min(255)];
            out.extend_from_slice(&[0xc4, b.len() as u8]);
            out.extend_from_slice(b);
        }
        1 => {
            out.push(0xd3);
            out.extend_from_slice(&u.arbitrary::<i64>()?.to_be_bytes());
        }
        2 => {
            out.push(0xcb);
            out.extend_from_slice(&u.arbitrary::<f64>()?.to_be_bytes());
        }
        3 => out.push(if u.arbitrary()? { 0xc3 } else { 0xc2 }),
        4 => out.push(0xc0),
        5 => out.push(u.int_in_range(0..=0x7f)?),
        _ if depth < 4 => {
            // An array whose first element is not a string, so never a (string, int) pair.
            let n = u.int_in_range(1..=4)?;
            out.push(0x90 | n);
            out.push(u.int_in_range(0..=0x7f)?);
            for _ in 1..n {
                other_value(u, out, depth + 1)?;
            }
        }
        _ => out.push(0xc0),
    }
    Ok(())
}

fn extra_key(u: &mut Unstructured<'_>) -> Result<RawExtraKey> {
    Ok(match u.int_in_range(0..=2)? {
        0 => RawExtraKey::Str(string(u)?),
        1 => RawExtraKey::Multimodal {
            id: string(u)?,
            offset: u.arbitrary()?,
        },
        _ => {
            let mut raw = Vec::new();
            other_value(u, &mut raw, 0)?;
            RawExtraKey::Other(raw)
        }
    })
}

fn event(u: &mut Unstructured<'_>) -> Result<KvEvent> {
    Ok(match u.int_in_range(0..=3)? {
        0 => {
            let n_blocks = u.int_in_range(0..=8)?;
            let extra_keys = (0..u.int_in_range(0..=n_blocks)?)
                .map(|_| {
                    (0..u.int_in_range(0..=3)?)
                        .map(|_| extra_key(u))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            KvEvent::Stored(BlockStored {
                block_hashes: (0..n_blocks)
                    .map(|_| u.arbitrary())
                    .collect::<Result<_>>()?,
                parent: u.arbitrary()?,
                token_ids: u.arbitrary()?,
                block_size: u.arbitrary()?,
                lora_id: u.arbitrary()?,
                medium: opt(u, string)?,
                lora_name: opt(u, string)?,
                extra_keys,
                group_idx: u.arbitrary()?,
                kv_cache_spec_kind: opt(u, string)?,
            })
        }
        1 => KvEvent::Removed(BlockRemoved {
            block_hashes: u.arbitrary()?,
            medium: opt(u, string)?,
            group_idx: u.arbitrary()?,
        }),
        2 => KvEvent::Cleared,
        _ => {
            let name = string(u)?;
            match name.as_str() {
                "BlockStored" | "BlockRemoved" | "AllBlocksCleared" => KvEvent::Cleared,
                _ => KvEvent::Unknown(name),
            }
        }
    })
}

fn batch(u: &mut Unstructured<'_>) -> Result<EventBatch> {
    Ok(EventBatch {
        ts: u.arbitrary()?,
        events: (0..u.int_in_range(0..=16)?)
            .map(|_| event(u))
            .collect::<Result<_>>()?,
        dp_rank: u.arbitrary()?,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = batch(&mut Unstructured::new(data)) else {
        return;
    };
    let bytes = batch.encode();
    let back = match decode_batch(&bytes) {
        Ok(b) => b,
        Err(e) => panic!("encoded batch does not decode: {e}\n{batch:?}"),
    };
    assert_eq!(back.ts.to_bits(), batch.ts.to_bits());
    assert_eq!(back.dp_rank, batch.dp_rank);
    assert_eq!(back.events, batch.events);
});
