//! SGLang router's approximate radix tree (sglang-router 0.3.2, `src/policies/tree.rs`),
//! re-implemented over token ids: one tree shared by every worker ("tenant"), each node
//! remembering which tenants routed a prompt through it and when; per-tenant sizes; LRU
//! eviction of leaves by size.
//!
//! ```text
//! insert(prompt, w)   at decision time: the routed prompt joins w's part of the tree
//! prefix_match(p)     longest prefix any tenant routed, and one tenant owning its end
//! evict_by_size(max)  every tenant above max loses its least recently used leaves
//! ```
//!
//! Upstream stores characters (the request text) and counts sizes in characters; this tree
//! stores token ids, the unit the simulator and the router have. Access times are a logical
//! clock, as upstream's (a global counter, one tick per insert or match).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::super::workers::WorkerId;

const ROOT: usize = 0;

#[derive(Clone, Debug, Default)]
struct Node {
    /// The edge's tokens (empty for the root).
    tokens: Vec<u32>,
    /// First token of each child's edge -> child.
    children: HashMap<u32, usize>,
    parent: usize,
    /// Tenants that routed through this node and their last access tick.
    tenants: Vec<(WorkerId, u64)>,
    /// The tenant a match ending here reports while it still holds the node (upstream's
    /// `last_tenant` cache: the node's first tenant, in practice).
    owner: Option<WorkerId>,
}

impl Node {
    fn has(&self, t: WorkerId) -> bool {
        self.tenants.iter().any(|(w, _)| *w == t)
    }

    fn touch(&mut self, t: WorkerId, tick: u64) {
        match self.tenants.iter_mut().find(|(w, _)| *w == t) {
            Some(e) => e.1 = tick,
            None => self.tenants.push((t, tick)),
        }
    }
}

/// A multi-tenant approximate radix tree of the prompts a router sent to each worker.
#[derive(Clone, Debug)]
pub struct ApproxTree {
    nodes: Vec<Node>,
    free: Vec<usize>,
    /// Tokens each tenant owns in the tree (upstream: `tenant_char_count`).
    size: HashMap<WorkerId, usize>,
    tick: u64,
}

impl Default for ApproxTree {
    fn default() -> Self {
        Self::new()
    }
}

fn shared_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ApproxTree {
    /// An empty tree.
    pub fn new() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            size: HashMap::new(),
            tick: 0,
        }
    }

    fn next_tick(&mut self) -> u64 {
        let t = self.tick;
        self.tick += 1;
        t
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Tokens `tenant` owns in the tree.
    pub fn tenant_size(&self, tenant: WorkerId) -> usize {
        self.size.get(&tenant).copied().unwrap_or(0)
    }

    /// Nodes in use (the root included).
    pub fn nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Adds `tokens` to `tenant`'s part of the tree.
    pub fn insert(&mut self, tokens: &[u32], tenant: WorkerId) {
        if !self.nodes[ROOT].has(tenant) {
            self.nodes[ROOT].tenants.push((tenant, 0));
        }
        self.size.entry(tenant).or_insert(0);
        let mut rest = tokens;
        let mut prev = ROOT;
        while let Some(&first) = rest.first() {
            let Some(&child) = self.nodes[prev].children.get(&first) else {
                let tick = self.next_tick();
                let leaf = self.alloc(Node {
                    tokens: rest.to_vec(),
                    children: HashMap::new(),
                    parent: prev,
                    tenants: vec![(tenant, tick)],
                    owner: Some(tenant),
                });
                self.nodes[prev].children.insert(first, leaf);
                *self.size.entry(tenant).or_insert(0) += rest.len();
                return;
            };
            let edge_len = self.nodes[child].tokens.len();
            let shared = shared_len(rest, &self.nodes[child].tokens);
            let next = if shared < edge_len {
                // Split: a new node takes the shared part and the child's tenants.
                let head: Vec<u32> = self.nodes[child].tokens[..shared].to_vec();
                let tail: Vec<u32> = self.nodes[child].tokens[shared..].to_vec();
                let tail_first = tail[0];
                let mid = self.alloc(Node {
                    tokens: head,
                    children: HashMap::from([(tail_first, child)]),
                    parent: prev,
                    tenants: self.nodes[child].tenants.clone(),
                    owner: self.nodes[child].owner,
                });
                self.nodes[child].tokens = tail;
                self.nodes[child].parent = mid;
                self.nodes[prev].children.insert(first, mid);
                if !self.nodes[mid].has(tenant) {
                    *self.size.entry(tenant).or_insert(0) += shared;
                    self.nodes[mid].tenants.push((tenant, 0));
                }
                mid
            } else {
                if !self.nodes[child].has(tenant) {
                    *self.size.entry(tenant).or_insert(0) += edge_len;
                    self.nodes[child].tenants.push((tenant, 0));
                }
                child
            };
            prev = next;
            rest = &rest[shared..];
        }
        let tick = self.next_tick();
        self.nodes[prev].touch(tenant, tick);
    }

    /// The longest prefix of `tokens` any tenant routed (tokens matched, a partly matched
    /// last edge included, as upstream counts) and the tenant its last node reports.
    pub fn prefix_match(&mut self, tokens: &[u32]) -> (Option<WorkerId>, usize) {
        let mut rest = tokens;
        let mut matched = 0;
        let mut curr = ROOT;
        while let Some(&first) = rest.first() {
            let Some(&child) = self.nodes[curr].children.get(&first) else {
                break;
            };
            let edge = &self.nodes[child].tokens;
            let shared = shared_len(rest, edge);
            matched += shared;
            curr = child;
            if shared < edge.len() {
                break;
            }
            rest = &rest[shared..];
        }
        let node = &mut self.nodes[curr];
        let tenant = match node.owner {
            Some(o) if node.has(o) => Some(o),
            _ => {
                let t = node.tenants.first().map(|(w, _)| *w);
                node.owner = t;
                t
            }
        };
        // Upstream refreshes the access time on one match in eight.
        let tick = self.next_tick();
        if tick & 0x7 == 0
            && let Some(t) = tenant
        {
            self.nodes[curr].touch(t, tick);
        }
        (tenant, matched)
    }

    fn is_leaf_of(&self, node: usize, t: WorkerId) -> bool {
        self.nodes[node].has(t)
            && !self.nodes[node]
                .children
                .values()
                .any(|&c| self.nodes[c].has(t))
    }

    /// Evicts least recently used leaves of every tenant owning more than `max_size`
    /// tokens until it is within it (upstream's periodic `evict_tenant_by_size`).
    pub fn evict_by_size(&mut self, max_size: usize) {
        if self.size.values().all(|&s| s <= max_size) {
            return;
        }
        let mut heap = BinaryHeap::new();
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            stack.extend(self.nodes[n].children.values().copied());
            for &(t, tick) in &self.nodes[n].tenants {
                if self.is_leaf_of(n, t) {
                    heap.push(Reverse((tick, n, t.0)));
                }
            }
        }
        while let Some(Reverse((_, n, t))) = heap.pop() {
            let t = WorkerId(t);
            if self.tenant_size(t) <= max_size || !self.is_leaf_of(n, t) {
                continue;
            }
            let len = self.nodes[n].tokens.len();
            if let Some(s) = self.size.get_mut(&t) {
                *s = s.saturating_sub(len);
            }
            self.nodes[n].tenants.retain(|(w, _)| *w != t);
            let parent = self.nodes[n].parent;
            if n != ROOT && self.nodes[n].children.is_empty() && self.nodes[n].tenants.is_empty() {
                if let Some(&first) = self.nodes[n].tokens.first() {
                    self.nodes[parent].children.remove(&first);
                }
                self.nodes[n] = Node::default();
                self.free.push(n);
            }
            if n != ROOT
                && let Some(&(_, tick)) = self.nodes[parent].tenants.iter().find(|(w, _)| *w == t)
                && self.is_leaf_of(parent, t)
            {
                heap.push(Reverse((tick, parent, t.0)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: WorkerId = WorkerId(0);
    const B: WorkerId = WorkerId(1);

    #[test]
    fn match_reports_the_tenant_that_routed_the_prefix() {
        let mut t = ApproxTree::new();
        t.insert(&[1, 2, 3, 4], A);
        t.insert(&[1, 2, 9], B);
        assert_eq!(t.prefix_match(&[1, 2, 3, 4, 5]), (Some(A), 4));
        assert_eq!(t.prefix_match(&[1, 2, 9, 9]), (Some(B), 3));
        // A partly matched edge counts and names its owner.
        assert_eq!(t.prefix_match(&[1, 2, 3, 7]).1, 3);
        // The shared node [1, 2] belongs to both; A created it.
        assert_eq!(t.prefix_match(&[1, 2]), (Some(A), 2));
        assert_eq!(t.tenant_size(A), 4);
        assert_eq!(t.tenant_size(B), 3);
        assert_eq!(t.prefix_match(&[5]).1, 0);
    }

    #[test]
    fn eviction_trims_the_oldest_leaves_of_tenants_over_the_size() {
        let mut t = ApproxTree::new();
        t.insert(&[1; 10], A);
        t.insert(&[2; 10], A);
        t.insert(&[3; 10], A);
        t.insert(&[4; 5], B);
        t.evict_by_size(20);
        assert_eq!(t.tenant_size(A), 20);
        assert_eq!(t.tenant_size(B), 5);
        assert_eq!(t.prefix_match(&[1; 10]).1, 0, "oldest leaf gone");
        assert_eq!(t.prefix_match(&[3; 10]), (Some(A), 10));
        t.evict_by_size(0);
        assert_eq!(t.tenant_size(A), 0);
        assert_eq!(t.nodes(), 1, "only the root is left");
    }
}
