//! The paged KV cache: a fixed pool of blocks, reference counts for blocks in use, a map from
//! block hash to cached block, and an LRU queue of free blocks (like vLLM's
//! `FreeKVCacheBlockQueue`): freed cached blocks join the tail, freed blocks without a hash
//! (partial blocks) join the head since they hold nothing reusable, allocation takes the head
//! and evicts whatever hash that block still held, and a cache hit on a free block takes it out
//! of the queue. The head-for-hashless rule is what the real vLLM capture shows
//! (testdata/vllm-capture: D1 evicts A2, B2, A1 after four partial blocks).

use std::collections::HashMap;

/// Index of a block in the pool.
pub(crate) type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Block {
    ref_cnt: u32,
    /// The hash this block is cached under (only full blocks have one).
    hash: Option<u64>,
    prev: u32,
    next: u32,
    in_free_queue: bool,
}

/// The block pool. All operations are O(1) per block.
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    cached: HashMap<u64, BlockId>,
    head: u32,
    tail: u32,
    num_free: usize,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: usize) -> Self {
        let n = num_blocks as u32;
        let blocks = (0..n)
            .map(|i| Block {
                ref_cnt: 0,
                hash: None,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == n { NIL } else { i + 1 },
                in_free_queue: true,
            })
            .collect();
        Self {
            blocks,
            cached: HashMap::new(),
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            num_free: num_blocks,
        }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks not referenced by any request (cached or empty).
    pub(crate) fn num_free(&self) -> usize {
        self.num_free
    }

    /// Number of distinct cached block hashes.
    pub(crate) fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Whether the block is unreferenced (in the free queue).
    /// The hashes of every cached block, in no particular order.
    pub(crate) fn cached_hashes(&self) -> Vec<u64> {
        self.cached.keys().copied().collect()
    }

    pub(crate) fn is_free(&self, id: BlockId) -> bool {
        self.blocks[id as usize].ref_cnt == 0
    }

    pub(crate) fn lookup(&self, hash: u64) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Takes a reference on a cached block (a prefix-cache hit).
    pub(crate) fn touch(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if b.ref_cnt == 0 {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_cnt += 1;
    }

    /// Allocates a fresh block from the head of the free queue; pushes the hash it evicted.
    pub(crate) fn allocate(&mut self, evicted: &mut Vec<u64>) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        let b = &mut self.blocks[id as usize];
        b.ref_cnt = 1;
        if let Some(h) = b.hash.take() {
            if self.cached.get(&h) == Some(&id) {
                self.cached.remove(&h);
            }
            evicted.push(h);
        }
        Some(id)
    }

    /// Drops one reference; a block reaching zero joins the tail of the free queue, or the
    /// head when it caches nothing.
    pub(crate) fn release(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        debug_assert!(b.ref_cnt > 0);
        b.ref_cnt = b.ref_cnt.saturating_sub(1);
        if b.ref_cnt == 0 {
            if b.hash.is_some() {
                self.push_tail(id);
            } else {
                self.push_head(id);
            }
        }
    }

    /// Marks a full block as cached under `hash`. Returns false (and caches nothing) when another
    /// block already holds that hash: two requests prefilled the same prefix concurrently.
    pub(crate) fn cache(&mut self, id: BlockId, hash: u64) -> bool {
        if self.cached.contains_key(&hash) {
            return false;
        }
        self.cached.insert(hash, id);
        self.blocks[id as usize].hash = Some(hash);
        true
    }

    /// Forgets every cached hash. Only valid when no block is referenced.
    pub(crate) fn clear_cache(&mut self) {
        self.cached.clear();
        for b in &mut self.blocks {
            b.hash = None;
        }
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            debug_assert!(b.in_free_queue);
            (b.prev, b.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.in_free_queue = false;
        self.num_free -= 1;
    }

    fn push_head(&mut self, id: BlockId) {
        let head = self.head;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = NIL;
            b.next = head;
            b.in_free_queue = true;
        }
        if head == NIL {
            self.tail = id;
        } else {
            self.blocks[head as usize].prev = id;
        }
        self.head = id;
        self.num_free += 1;
    }

    fn push_tail(&mut self, id: BlockId) {
        let tail = self.tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NIL;
            b.in_free_queue = true;
        }
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_are_evicted_in_lru_order() {
        let mut pool = BlockPool::new(3);
        let mut ev = Vec::new();
        let ids: Vec<_> = (0..3).map(|_| pool.allocate(&mut ev).unwrap()).collect();
        assert!(pool.allocate(&mut ev).is_none());
        for (i, &id) in ids.iter().enumerate() {
            assert!(pool.cache(id, 100 + i as u64));
        }
        // Free in order 2, 0, 1: eviction must follow that order.
        pool.release(ids[2]);
        pool.release(ids[0]);
        pool.release(ids[1]);
        assert_eq!(pool.num_free(), 3);
        // A hit on block 0 pulls it out of the queue.
        let hit = pool.lookup(100).unwrap();
        pool.touch(hit);
        pool.allocate(&mut ev).unwrap();
        pool.allocate(&mut ev).unwrap();
        assert_eq!(ev, vec![102, 101]);
        assert!(pool.allocate(&mut ev).is_none());
        assert_eq!(pool.lookup(100), Some(hit));
    }

    #[test]
    fn blocks_without_a_hash_are_reused_first() {
        let mut pool = BlockPool::new(3);
        let mut ev = Vec::new();
        let a = pool.allocate(&mut ev).unwrap();
        let b = pool.allocate(&mut ev).unwrap();
        pool.cache(a, 1);
        pool.release(a);
        pool.release(b); // partial block: goes to the head
        assert_eq!(pool.allocate(&mut ev), Some(b));
        assert!(ev.is_empty());
    }
}
