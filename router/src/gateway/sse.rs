//! Server-sent events (the `text/event-stream` wire format): an incremental parser for the
//! worker's streams and an encoder for ours. Pure: bytes in, events out.
//!
//! ```text
//! upstream bytes --push()--> [line buffer] --> SseEvent { event, data } ... --encode()--> client
//! ```
//!
//! The parser follows the WHATWG rules that matter for LLM streams: `\n`, `\r\n` and `\r` end
//! lines, a blank line dispatches an event, `data:` lines are joined with `\n`, a single space
//! after the colon is dropped, comments (`:`) and unknown fields are ignored. A line longer than
//! the configured limit is an error rather than unbounded memory.

use bytes::{BufMut, Bytes, BytesMut};

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any (OpenAI streams have none; Anthropic streams name every event).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

impl SseEvent {
    /// An unnamed event carrying `data`.
    pub fn data(data: impl Into<String>) -> Self {
        Self {
            event: None,
            data: data.into(),
        }
    }

    /// A named event carrying `data`.
    pub fn named(event: impl Into<String>, data: impl Into<String>) -> Self {
        Self {
            event: Some(event.into()),
            data: data.into(),
        }
    }

    /// The event on the wire: optional `event:` line, one `data:` line per data line, blank line.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.data.len() + 32);
        if let Some(name) = &self.event {
            out.put_slice(b"event: ");
            out.put_slice(name.as_bytes());
            out.put_u8(b'\n');
        }
        for line in self.data.split('\n') {
            out.put_slice(b"data: ");
            out.put_slice(line.as_bytes());
            out.put_u8(b'\n');
        }
        out.put_u8(b'\n');
        out.freeze()
    }
}

/// Why the parser gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line (or an event's accumulated data) grew past the limit.
    #[error("server-sent event larger than {limit} bytes")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
}

/// Default limit for one line or one event's data: 4 MiB (a long tool-call argument fits).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 << 20;

/// Incremental SSE parser: feed it byte chunks as they arrive, take complete events out.
#[derive(Debug)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` starting the next chunk belongs to it.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    max_bytes: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser that rejects lines or events longer than `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            after_cr: false,
            event: None,
            data: String::new(),
            has_data: false,
            max_bytes,
        }
    }

    /// Feeds `chunk`; appends every event it completes to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut rest = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let Some(stripped) = rest.strip_prefix(b"\n") {
                rest = stripped;
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.extend_line(&rest[..pos])?;
            let is_cr = rest[pos] == b'\r';
            rest = &rest[pos + 1..];
            if is_cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.process_line(&line)? {
                out.push(event);
            }
        }
        self.extend_line(rest)
    }

    /// End of stream: a final event not followed by a blank line is dispatched anyway (servers
    /// that close right after the last `data:` line would otherwise lose it).
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.process_line(&line)? {
                return Ok(Some(event));
            }
        }
        Ok(self.dispatch())
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > self.max_bytes {
            return Err(SseError::TooLarge {
                limit: self.max_bytes,
            });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8]) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                if self.data.len() + value.len() + 1 > self.max_bytes {
                    return Err(SseError::TooLarge {
                        limit: self.max_bytes,
                    });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"event" => self.event = Some(value.into_owned()),
            // `id` and `retry` do not matter to a proxy that never reconnects.
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        if !self.has_data {
            return None;
        }
        self.has_data = false;
        Some(SseEvent {
            event,
            data: std::mem::take(&mut self.data),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out).expect("push");
        }
        out.extend(p.finish().expect("finish"));
        out
    }

    #[test]
    fn parses_vllm_stream_bytes() {
        let golden = b"data: {\"id\":\"a\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
        let events = parse_all(&[golden]);
        assert_eq!(
            events,
            vec![
                SseEvent::data("{\"id\":\"a\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}"),
                SseEvent::data("[DONE]")
            ]
        );
    }

    #[test]
    fn byte_by_byte_equals_whole() {
        let golden: &[u8] =
            b"event: message_start\r\ndata: {\"a\":1}\r\n\r\n: ping\n\ndata: x\rdata: y\r\r";
        let whole = parse_all(&[golden]);
        let pieces: Vec<&[u8]> = golden.chunks(1).collect();
        assert_eq!(parse_all(&pieces), whole);
        assert_eq!(
            whole,
            vec![
                SseEvent::named("message_start", "{\"a\":1}"),
                SseEvent::data("x\ny")
            ]
        );
    }

    #[test]
    fn comments_unknown_fields_and_empty_events_are_skipped() {
        let events = parse_all(&[b": keepalive\n\nid: 7\nretry: 10\n\nevent: ping\n\ndata\n\n"]);
        // `data` with no colon is a data line with an empty value.
        assert_eq!(events, vec![SseEvent::data("")]);
    }

    #[test]
    fn trailing_event_without_blank_line_is_dispatched_at_finish() {
        assert_eq!(parse_all(&[b"data: last"]), vec![SseEvent::data("last")]);
    }

    #[test]
    fn oversized_line_is_an_error() {
        let mut p = SseParser::new(8);
        let mut out = Vec::new();
        assert_eq!(
            p.push(b"data: 0123456789", &mut out),
            Err(SseError::TooLarge { limit: 8 })
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        let events = parse_all(&[b"data: \xff\xfe\n\n"]);
        assert_eq!(events.len(), 1);
        assert!(events[0].data.contains('\u{fffd}'));
    }

    #[test]
    fn encode_round_trips() {
        for e in [
            SseEvent::data("one"),
            SseEvent::named("content_block_delta", "a\nb"),
            SseEvent::data(""),
        ] {
            let wire = e.encode();
            assert_eq!(parse_all(&[&wire]), vec![e]);
        }
        assert_eq!(
            &SseEvent::named("ping", "{}").encode()[..],
            b"event: ping\ndata: {}\n\n"
        );
    }
}
