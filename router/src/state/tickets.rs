//! Pick API decision ids: 128 random bits (from the OS-seeded thread RNG), each bound to
//! the caller it was issued to and living exactly as long as its assignment.
//!
//! ```text
//! Picker::pick --issue(assignment, owner)--> DecisionId (32 hex chars on the wire)
//! Report*(id, caller) --check--> assignment | unknown | issued to another caller
//! release / expire / retire of the assignment --forget--> id gone
//! ```
//!
//! Random ids cannot be guessed (sequential ones could, and anyone could then report other
//! callers' requests done); binding them to the caller stops one authenticated caller from
//! ending another's. The gateway's own assignments never leave the process and get no id.

use std::collections::HashMap;
use std::fmt;

use rand::Rng;

use crate::routing::AssignmentId;

/// A decision id of the Pick API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecisionId(u128);

impl fmt::Display for DecisionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl DecisionId {
    /// Parses the wire form: exactly 32 hex digits. Anything else is no id.
    pub fn parse(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(DecisionId)
    }
}

/// Why a report's id was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketError {
    /// Never issued, or its assignment is released already.
    Unknown,
    /// Issued to another caller.
    Foreign,
}

/// The outstanding decision ids.
#[derive(Debug, Default)]
pub(super) struct Tickets {
    by_id: HashMap<DecisionId, (AssignmentId, String)>,
    by_assignment: HashMap<AssignmentId, DecisionId>,
    /// The tenant tap of an assignment made through the Pick API (dropped with its id, which
    /// releases the tenant's concurrency slot).
    taps: HashMap<AssignmentId, crate::tenant::TenantTap>,
}

impl Tickets {
    /// A fresh id for `assignment`, owned by `owner`.
    pub(super) fn issue(&mut self, assignment: AssignmentId, owner: String) -> DecisionId {
        let mut rng = rand::rng();
        let id = loop {
            let id = DecisionId(rng.random());
            // 2^-128 per outstanding id; the loop only makes a collision impossible.
            if !self.by_id.contains_key(&id) {
                break id;
            }
        };
        self.by_id.insert(id, (assignment, owner));
        self.by_assignment.insert(assignment, id);
        id
    }

    /// The assignment of `id`, if `owner` holds it.
    pub(super) fn check(&self, id: DecisionId, owner: &str) -> Result<AssignmentId, TicketError> {
        match self.by_id.get(&id) {
            None => Err(TicketError::Unknown),
            Some((_, o)) if o != owner => Err(TicketError::Foreign),
            Some((a, _)) => Ok(*a),
        }
    }

    /// The assignment ended: its id goes.
    pub(super) fn forget(&mut self, assignment: AssignmentId) {
        if let Some(id) = self.by_assignment.remove(&assignment) {
            self.by_id.remove(&id);
        }
        self.taps.remove(&assignment);
    }

    /// Keeps `tap` until the assignment's id is forgotten.
    pub(super) fn attach(&mut self, assignment: AssignmentId, tap: crate::tenant::TenantTap) {
        if self.by_assignment.contains_key(&assignment) {
            self.taps.insert(assignment, tap);
        }
    }

    /// The tenant tap of `assignment`, if it has one.
    pub(super) fn tap_mut(
        &mut self,
        assignment: AssignmentId,
    ) -> Option<&mut crate::tenant::TenantTap> {
        self.taps.get_mut(&assignment)
    }

    /// Outstanding ids.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_random_bound_and_forgotten() {
        let mut t = Tickets::default();
        let a = t.issue(AssignmentId(1), "alice".into());
        let b = t.issue(AssignmentId(2), "bob".into());
        assert_ne!(a, b);
        assert_eq!(a.to_string().len(), 32);
        assert_eq!(DecisionId::parse(&a.to_string()), Some(a));
        assert_eq!(t.check(a, "alice"), Ok(AssignmentId(1)));
        assert_eq!(t.check(a, "bob"), Err(TicketError::Foreign));
        t.forget(AssignmentId(1));
        assert_eq!(t.check(a, "alice"), Err(TicketError::Unknown));
        assert_eq!(t.len(), 1);
        // Forgetting an assignment that had no id is a no-op.
        t.forget(AssignmentId(9));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn only_32_hex_digits_parse() {
        assert_eq!(DecisionId::parse("1"), None);
        assert_eq!(DecisionId::parse(&"g".repeat(32)), None);
        assert_eq!(DecisionId::parse(&format!("+{}", "0".repeat(31))), None);
        assert_eq!(
            DecisionId::parse(&"F".repeat(32)),
            Some(DecisionId(u128::MAX))
        );
    }
}
