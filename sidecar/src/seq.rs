//! Sequence-number bookkeeping for vLLM's KV-event stream: gaps, restarts, replay overlap.
//!
//! ```text
//! live seq == expected      -> Apply
//! live seq  > expected      -> Gap { from: expected }   (replay [expected, seq) first)
//! live seq  < expected      -> Restart                  (vLLM restarted: seq went back)
//!                              Duplicate                (already applied from a replay)
//! ```
//!
//! Pure code: the ZMQ adapter calls these methods and performs the replay and resyncs.

/// What to do with a live message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// Next in order: apply it.
    Apply,
    /// Messages `[from, seq)` are missing: replay them before this one.
    Gap {
        /// The first sequence number missing (the next one expected).
        from: u64,
    },
    /// The sequence went backwards: the publisher restarted. The tracker has forgotten the
    /// old stream; reset the state, then call [`SeqTracker::on_live`] again with the same seq.
    Restart,
    /// Already applied from a replay: drop it.
    Duplicate,
}

/// What to do with a replayed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Next in order: apply it.
    Apply,
    /// Seen already.
    Duplicate,
    /// The replay buffer no longer holds `expected..got`: the state must be rebuilt; the
    /// tracker continues from `got`, which should be applied after the reset.
    Lost {
        /// The first sequence number missing.
        expected: u64,
        /// The replayed message's sequence number.
        got: u64,
    },
}

/// Tracks the next expected sequence number of one publisher.
#[derive(Debug, Default, Clone)]
pub struct SeqTracker {
    expected: Option<u64>,
    /// Live seqs in `[lo, hi)` were applied from a replay and are duplicates when they arrive.
    replayed: Option<(u64, u64)>,
}

impl SeqTracker {
    /// A tracker that has seen no message yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Next sequence number expected, if any message was seen.
    pub fn expected(&self) -> Option<u64> {
        self.expected
    }

    /// Classifies live message `seq` and, when it is applied, advances past it.
    pub fn on_live(&mut self, seq: u64) -> Live {
        if let Some((lo, hi)) = self.replayed {
            if (lo..hi).contains(&seq) {
                return Live::Duplicate;
            }
            self.replayed = None;
        }
        match self.expected {
            // First message: anything before it (from seq 0) was missed.
            None if seq == 0 => self.advance(seq),
            None => Live::Gap { from: 0 },
            Some(e) if seq == e => self.advance(seq),
            Some(e) if seq > e => Live::Gap { from: e },
            Some(_) => {
                self.expected = None;
                Live::Restart
            }
        }
    }

    fn advance(&mut self, seq: u64) -> Live {
        self.expected = Some(seq.saturating_add(1));
        Live::Apply
    }

    /// Classifies replayed message `seq`; the tracker continues after it unless it is a duplicate.
    pub fn on_replayed(&mut self, seq: u64) -> Replayed {
        let e = self.expected.unwrap_or(0);
        if seq < e {
            return Replayed::Duplicate;
        }
        self.expected = Some(seq.saturating_add(1));
        if seq == e {
            Replayed::Apply
        } else {
            Replayed::Lost {
                expected: e,
                got: seq,
            }
        }
    }

    /// Ends a replay triggered by live message `trigger`. Returns false when the replay did
    /// not reach `trigger` (the buffer is gone or the replay failed): the caller must resync
    /// and then call [`SeqTracker::resync_at`].
    pub fn finish_replay(&mut self, trigger: u64) -> bool {
        let e = self.expected.unwrap_or(0);
        if e > trigger {
            self.replayed = Some((trigger, e));
        }
        e >= trigger
    }

    /// Forgets the past and accepts `seq` as the next message (after a resync).
    pub fn resync_at(&mut self, seq: u64) {
        self.expected = Some(seq);
        self.replayed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_restart() {
        let mut t = SeqTracker::new();
        assert_eq!(t.on_live(0), Live::Apply);
        assert_eq!(t.on_live(1), Live::Apply);
        assert_eq!(t.on_live(4), Live::Gap { from: 2 });
        assert_eq!(t.on_replayed(2), Replayed::Apply);
        assert_eq!(t.on_replayed(3), Replayed::Apply);
        assert_eq!(t.on_replayed(4), Replayed::Apply);
        assert_eq!(t.on_replayed(5), Replayed::Apply);
        assert!(t.finish_replay(4));
        assert_eq!(t.on_live(4), Live::Duplicate);
        assert_eq!(t.on_live(5), Live::Duplicate);
        assert_eq!(t.on_live(6), Live::Apply);
        assert_eq!(t.on_live(0), Live::Restart);
        assert_eq!(t.on_live(0), Live::Apply);
    }

    #[test]
    fn late_join_replays_from_zero() {
        let mut t = SeqTracker::new();
        assert_eq!(t.on_live(3), Live::Gap { from: 0 });
        assert_eq!(t.on_replayed(0), Replayed::Apply);
    }

    #[test]
    fn lost_batches_and_short_replay() {
        let mut t = SeqTracker::new();
        assert_eq!(t.on_live(0), Live::Apply);
        assert_eq!(t.on_live(9), Live::Gap { from: 1 });
        assert_eq!(t.on_replayed(0), Replayed::Duplicate);
        assert_eq!(
            t.on_replayed(5),
            Replayed::Lost {
                expected: 1,
                got: 5
            }
        );
        assert_eq!(t.on_replayed(6), Replayed::Apply);
        assert!(!t.finish_replay(9));
        t.resync_at(9);
        assert_eq!(t.on_live(9), Live::Apply);
    }
}
