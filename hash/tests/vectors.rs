//! Test vectors of hash/SPEC.md. Another implementation of the spec must reproduce these.
//! They were cross-checked with an independent implementation (Python's `xxhash` package
//! following SPEC.md; see hash/SPEC.md "Reproducing the vectors").

use kvroute_hash::{ExtraKey, block_hash, chain, encode_extra, root_hash};

const QWEN_BLOCK: [u32; 16] = [
    151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838, 374,
];

#[test]
fn roots() {
    assert_eq!(root_hash("Qwen/Qwen3-32B", None), 7770013301073698641);
    assert_eq!(
        root_hash("Qwen/Qwen3-32B", Some("sql-adapter")),
        17472058095966356115
    );
    assert_eq!(root_hash("", None), 13847201536796006868);
    // No LoRA and an empty LoRA name are the same adapter.
    assert_eq!(
        root_hash("Qwen/Qwen3-32B", Some("")),
        root_hash("Qwen/Qwen3-32B", None)
    );
}

#[test]
fn chain_of_two_blocks() {
    let root = root_hash("Qwen/Qwen3-32B", None);
    let tokens: Vec<u32> = (1..=32).collect();
    assert_eq!(
        chain(root, &tokens, 16, &[]),
        vec![1383950059289516083, 9796478666352816998]
    );
    assert_eq!(block_hash(root, &QWEN_BLOCK, &[]), 9784793283274092817);
}

#[test]
fn extra_keys() {
    let root = root_hash("Qwen/Qwen3-32B", None);
    let salt = encode_extra(&[ExtraKey::CacheSalt("tenant-a".into())]);
    assert_eq!(
        salt,
        [
            1, 8, 0, 0, 0, b't', b'e', b'n', b'a', b'n', b't', b'-', b'a'
        ]
    );
    let tokens: Vec<u32> = (1..=32).collect();
    assert_eq!(
        chain(root, &tokens, 16, &salt),
        vec![14311921605482524301, 16272671973880954821]
    );
    let mm = encode_extra(&[ExtraKey::Multimodal {
        id: "img-0".into(),
        offset: 3,
    }]);
    assert_eq!(block_hash(root, &QWEN_BLOCK, &mm), 17223325254714775897);
}

#[test]
fn large_block_takes_the_streaming_path() {
    let tokens: Vec<u32> = (0..512).collect();
    assert_eq!(block_hash(0, &tokens, &[]), 17967412412300589106);
}
