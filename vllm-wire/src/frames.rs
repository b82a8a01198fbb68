//! The ZMQ side of the format: which frame is which, sequence numbers, the replay end marker.
//!
//! ```text
//! live (PUB)      [topic, seq u64 BE (>= 8 bytes), payload]
//! replay request  DEALER ["", start seq u64 BE]          (from a peer without delimiter: [seq])
//! replay reply    ["", topic, seq, payload] ... end marker ["", "", ff x8, ""]
//!                 (<= 0.24: [seq, payload] ... [ff x8, ""])
//! ```
//!
//! The frame builders are generic over the frame type (`Vec<u8>`, `bytes::Bytes`, ...) so
//! that this crate needs no socket library; the ROUTER identity frame, which only the replay
//! socket sees, is the caller's.

use thiserror::Error;

use crate::decode::DecodeError;

/// Sequence number of vLLM's replay end marker (`-1` as a signed integer).
pub const END_MARKER_SEQ: u64 = u64::MAX;

/// A ZMQ message split into its parts (live PUB message or replay reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frames<'a> {
    /// The sequence number ([`END_MARKER_SEQ`] for the end of a replay).
    pub seq: u64,
    /// The msgpack payload (empty in the end marker).
    pub payload: &'a [u8],
}

impl Frames<'_> {
    /// True for the replay end marker.
    pub fn is_end_marker(&self) -> bool {
        self.seq == END_MARKER_SEQ
    }
}

/// Splits a live message `[topic, seq, payload]` or a replay reply (`["", topic, seq, payload]`,
/// older `[seq, payload]`, end marker with seq `ff x8`): the sequence number is always the
/// second-to-last frame and the payload the last one.
pub fn split_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<Frames<'_>, DecodeError> {
    let n = frames.len();
    if n < 2 {
        return Err(DecodeError::FrameCount(n));
    }
    let seq = decode_seq(frames[n - 2].as_ref())?;
    Ok(Frames {
        seq,
        payload: frames[n - 1].as_ref(),
    })
}

/// Reads a sequence frame: the first 8 bytes, big-endian (a longer frame may carry a
/// publisher id after them).
pub fn decode_seq(frame: &[u8]) -> Result<u64, DecodeError> {
    let bytes: [u8; 8] = frame
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(DecodeError::SeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// A sequence frame: 8 bytes, big-endian.
pub fn encode_seq(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

/// A live message: `[topic, seq, payload]`.
pub fn live_message<B: From<Vec<u8>>>(topic: B, seq: u64, payload: B) -> [B; 3] {
    [topic, B::from(encode_seq(seq)), payload]
}

/// One replayed batch, as vLLM >= 0.26 sends it after the ROUTER identity:
/// `["", topic, seq, payload]`.
pub fn replay_reply<B: From<Vec<u8>>>(topic: B, seq: u64, payload: B) -> [B; 4] {
    [
        B::from(Vec::new()),
        topic,
        B::from(encode_seq(seq)),
        payload,
    ]
}

/// The end of a replay, after the ROUTER identity: `["", "", ff x8, ""]`.
pub fn replay_end<B: From<Vec<u8>>>() -> [B; 4] {
    [
        B::from(Vec::new()),
        B::from(Vec::new()),
        B::from(encode_seq(END_MARKER_SEQ)),
        B::from(Vec::new()),
    ]
}

/// A replay request as a DEALER sends it: `["", start seq]`.
pub fn replay_request<B: From<Vec<u8>>>(start: u64) -> [B; 2] {
    [B::from(Vec::new()), B::from(encode_seq(start))]
}

/// Why a replay request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReplayRequestError {
    /// Only empty frames.
    #[error("replay request has no sequence frame")]
    Missing,
    /// A sequence frame of another length than 8.
    #[error("replay sequence frame has {0} bytes, expected 8")]
    BadLength(usize),
}

impl ReplayRequestError {
    /// Bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            ReplayRequestError::Missing => "missing",
            ReplayRequestError::BadLength(_) => "bad_length",
        }
    }
}

/// Parses the start sequence of a replay request from its frames after the ROUTER identity:
/// `["", seq8]` from a DEALER, or `[seq8]` from a peer that sends no delimiter.
pub fn parse_replay_request<B: AsRef<[u8]>>(frames: &[B]) -> Result<u64, ReplayRequestError> {
    let last = frames
        .iter()
        .rev()
        .map(AsRef::as_ref)
        .find(|f| !f.is_empty())
        .ok_or(ReplayRequestError::Missing)?;
    let bytes: [u8; 8] = last
        .try_into()
        .map_err(|_| ReplayRequestError::BadLength(last.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_end_marker() {
        let seq = 5u64.to_be_bytes();
        let live: [&[u8]; 3] = [b"", &seq, b"\x90"];
        let f = split_frames(&live).unwrap();
        assert_eq!((f.seq, f.payload), (5, &b"\x90"[..]));
        let end: [&[u8]; 4] = [b"", b"", &[0xff; 8], b""];
        assert!(split_frames(&end).unwrap().is_end_marker());
        assert_eq!(split_frames(&[b"x"]), Err(DecodeError::FrameCount(1)));
        let short: [&[u8]; 2] = [b"1234", b""];
        assert_eq!(split_frames(&short), Err(DecodeError::SeqFrame(4)));
        // A 24-byte seq frame (seq + publisher id) reads the first 8 bytes.
        let mut long = 7u64.to_be_bytes().to_vec();
        long.extend_from_slice(&[9; 16]);
        assert_eq!(decode_seq(&long), Ok(7));
    }

    #[test]
    fn built_messages_split_back() {
        let live: [Vec<u8>; 3] = live_message(b"kv".to_vec(), 9, vec![0x90]);
        assert_eq!(live[1], [0, 0, 0, 0, 0, 0, 0, 9]);
        let f = split_frames(&live).unwrap();
        assert_eq!((f.seq, f.payload), (9, &[0x90][..]));
        let reply: [Vec<u8>; 4] = replay_reply(b"kv".to_vec(), 3, vec![0x91]);
        assert_eq!(reply[0], b"");
        assert_eq!(split_frames(&reply).unwrap().seq, 3);
        let end: [Vec<u8>; 4] = replay_end();
        assert_eq!(end, [vec![], vec![], vec![0xff; 8], vec![]]);
        assert!(split_frames(&end).unwrap().is_end_marker());
        let request: [Vec<u8>; 2] = replay_request(12);
        assert_eq!(parse_replay_request(&request), Ok(12));
    }

    #[test]
    fn replay_requests() {
        let seq = 5u64.to_be_bytes();
        assert_eq!(parse_replay_request(&[&b""[..], &seq[..]]), Ok(5));
        assert_eq!(parse_replay_request(&[&seq[..]]), Ok(5));
        assert_eq!(
            parse_replay_request(&[&b""[..], &b"abc"[..]]),
            Err(ReplayRequestError::BadLength(3))
        );
        assert_eq!(
            parse_replay_request(&[&[0u8; 9][..]]),
            Err(ReplayRequestError::BadLength(9))
        );
        assert_eq!(
            parse_replay_request::<&[u8]>(&[]),
            Err(ReplayRequestError::Missing)
        );
    }
}
