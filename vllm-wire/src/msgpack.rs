//! A minimal msgpack cursor and writer: only what vLLM's event batches use.
//!
//! ```text
//! bytes --Reader (bounds-checked, iterative skip, depth limit)--> ints, strs, bins, lengths
//! values --write_* (smallest form, as msgspec picks it)--> bytes
//! ```
//!
//! Every read is bounds-checked and returns a [`DecodeError`] instead of panicking; skipping
//! an unknown value is iterative with a nesting limit, so hostile input cannot overflow the
//! stack or make us allocate for counts the input cannot hold.

use crate::decode::DecodeError;

/// Nesting limit when skipping values we do not understand.
pub(crate) const MAX_SKIP_DEPTH: usize = 64;

/// A msgpack integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Int {
    U(u64),
    I(i64),
}

/// Cursor over a byte slice. Every read is bounds-checked.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub(crate) fn peek(&self) -> Result<u8, DecodeError> {
        self.buf
            .get(self.pos)
            .copied()
            .ok_or(DecodeError::Truncated(self.pos))
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(DecodeError::Truncated(self.pos))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated(self.pos))?;
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let at = self.pos;
        self.take(N)?
            .try_into()
            .map_err(|_| DecodeError::Truncated(at))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    pub(crate) fn len_u16(&mut self) -> Result<usize, DecodeError> {
        Ok(usize::from(u16::from_be_bytes(self.be()?)))
    }

    pub(crate) fn len_u32(&mut self) -> Result<usize, DecodeError> {
        usize::try_from(u32::from_be_bytes(self.be()?))
            .map_err(|_| DecodeError::IntOutOfRange(self.pos))
    }

    pub(crate) fn nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            return Ok(true);
        }
        Ok(false)
    }

    pub(crate) fn array_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        match self.u8()? {
            b @ 0x90..=0x9f => Ok(usize::from(b & 0x0f)),
            0xdc => self.len_u16(),
            0xdd => self.len_u32(),
            _ => Err(DecodeError::UnexpectedType {
                expected: "array",
                at,
            }),
        }
    }

    pub(crate) fn map_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        match self.u8()? {
            b @ 0x80..=0x8f => Ok(usize::from(b & 0x0f)),
            0xde => self.len_u16(),
            0xdf => self.len_u32(),
            _ => Err(DecodeError::UnexpectedType {
                expected: "map",
                at,
            }),
        }
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, DecodeError> {
        let at = self.pos;
        let n = match self.u8()? {
            b @ 0xa0..=0xbf => usize::from(b & 0x1f),
            0xd9 => usize::from(self.u8()?),
            0xda => self.len_u16()?,
            0xdb => self.len_u32()?,
            _ => {
                return Err(DecodeError::UnexpectedType {
                    expected: "string",
                    at,
                });
            }
        };
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::InvalidUtf8(at))
    }

    /// A map key: a string (other key types are not produced by vLLM).
    pub(crate) fn key(&mut self) -> Result<&'a str, DecodeError> {
        self.str()
    }

    pub(crate) fn opt_str(&mut self) -> Result<Option<&'a str>, DecodeError> {
        if self.nil()? {
            Ok(None)
        } else {
            self.str().map(Some)
        }
    }

    pub(crate) fn bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let at = self.pos;
        let n = match self.u8()? {
            0xc4 => usize::from(self.u8()?),
            0xc5 => self.len_u16()?,
            0xc6 => self.len_u32()?,
            _ => {
                return Err(DecodeError::UnexpectedType {
                    expected: "bin",
                    at,
                });
            }
        };
        self.take(n)
    }

    pub(crate) fn int(&mut self) -> Result<Int, DecodeError> {
        let at = self.pos;
        Ok(match self.u8()? {
            b @ 0x00..=0x7f => Int::U(u64::from(b)),
            b @ 0xe0..=0xff => Int::I(i64::from(b as i8)),
            0xcc => Int::U(u64::from(self.u8()?)),
            0xcd => Int::U(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Int::U(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Int::U(u64::from_be_bytes(self.be()?)),
            0xd0 => Int::I(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Int::I(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Int::I(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Int::I(i64::from_be_bytes(self.be()?)),
            _ => {
                return Err(DecodeError::UnexpectedType {
                    expected: "integer",
                    at,
                });
            }
        })
    }

    pub(crate) fn opt_int(&mut self) -> Result<Option<i64>, DecodeError> {
        if self.nil()? {
            return Ok(None);
        }
        let at = self.pos;
        match self.int()? {
            Int::U(v) => i64::try_from(v)
                .map(Some)
                .map_err(|_| DecodeError::IntOutOfRange(at)),
            Int::I(v) => Ok(Some(v)),
        }
    }

    /// A float or an integer, as f64.
    pub(crate) fn number(&mut self) -> Result<f64, DecodeError> {
        match self.peek()? {
            0xcb => {
                self.pos += 1;
                Ok(f64::from_be_bytes(self.be()?))
            }
            0xca => {
                self.pos += 1;
                Ok(f64::from(f32::from_be_bytes(self.be()?)))
            }
            _ => Ok(match self.int()? {
                Int::U(v) => v as f64,
                Int::I(v) => v as f64,
            }),
        }
    }

    /// Skips one complete value and returns its bytes.
    pub(crate) fn raw_value(&mut self) -> Result<&'a [u8], DecodeError> {
        let start = self.pos;
        self.skip()?;
        self.buf
            .get(start..self.pos)
            .ok_or(DecodeError::Truncated(start))
    }

    /// Skips one complete value of any type, iteratively (bounded depth, no recursion).
    pub(crate) fn skip(&mut self) -> Result<(), DecodeError> {
        // Number of values still to skip at each open nesting level.
        let mut pending: Vec<usize> = vec![1];
        while let Some(top) = pending.last_mut() {
            if *top == 0 {
                pending.pop();
                continue;
            }
            *top -= 1;
            let at = self.pos;
            let children = match self.u8()? {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                b @ 0x80..=0x8f => 2 * usize::from(b & 0x0f),
                b @ 0x90..=0x9f => usize::from(b & 0x0f),
                b @ 0xa0..=0xbf => {
                    self.take(usize::from(b & 0x1f))?;
                    0
                }
                0xc4 | 0xd9 => {
                    let n = usize::from(self.u8()?);
                    self.take(n)?;
                    0
                }
                0xc5 | 0xda => {
                    let n = self.len_u16()?;
                    self.take(n)?;
                    0
                }
                0xc6 | 0xdb => {
                    let n = self.len_u32()?;
                    self.take(n)?;
                    0
                }
                0xc7 => {
                    let n = usize::from(self.u8()?);
                    self.take(n + 1)?;
                    0
                }
                0xc8 => {
                    let n = self.len_u16()?;
                    self.take(n + 1)?;
                    0
                }
                0xc9 => {
                    let n = self.len_u32()?;
                    self.take(n.saturating_add(1))?;
                    0
                }
                0xca => {
                    self.take(4)?;
                    0
                }
                0xcb => {
                    self.take(8)?;
                    0
                }
                0xcc | 0xd0 => {
                    self.take(1)?;
                    0
                }
                0xcd | 0xd1 => {
                    self.take(2)?;
                    0
                }
                0xce | 0xd2 => {
                    self.take(4)?;
                    0
                }
                0xcf | 0xd3 => {
                    self.take(8)?;
                    0
                }
                0xd4 => {
                    self.take(2)?;
                    0
                }
                0xd5 => {
                    self.take(3)?;
                    0
                }
                0xd6 => {
                    self.take(5)?;
                    0
                }
                0xd7 => {
                    self.take(9)?;
                    0
                }
                0xd8 => {
                    self.take(17)?;
                    0
                }
                0xdc => self.len_u16()?,
                0xdd => self.len_u32()?,
                0xde => 2 * self.len_u16()?,
                0xdf => self.len_u32()?.saturating_mul(2),
                0xc1 => {
                    return Err(DecodeError::UnexpectedType {
                        expected: "msgpack value",
                        at,
                    });
                }
            };
            if children > 0 {
                if pending.len() >= MAX_SKIP_DEPTH {
                    return Err(DecodeError::TooDeep);
                }
                // Every child needs at least one byte: reject impossible counts early.
                if children > self.remaining() {
                    return Err(DecodeError::Truncated(self.pos));
                }
                pending.push(children);
            }
        }
        Ok(())
    }
}

pub(crate) fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

/// A non-negative integer in its smallest form (positive fixint, uint8 .. uint64).
pub(crate) fn write_uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v < 0x100 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 0x1_0000 {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v < 0x1_0000_0000 {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// A signed integer: non-negative ones as [`write_uint`] (as msgspec does), negative ones in
/// the smallest signed form.
pub(crate) fn write_int(out: &mut Vec<u8>, v: i64) {
    if let Ok(u) = u64::try_from(v) {
        write_uint(out, u);
    } else if v >= -32 {
        out.push(v as i8 as u8);
    } else if let Ok(b) = i8::try_from(v) {
        out.push(0xd0);
        out.extend_from_slice(&b.to_be_bytes());
    } else if let Ok(h) = i16::try_from(v) {
        out.push(0xd1);
        out.extend_from_slice(&h.to_be_bytes());
    } else if let Ok(w) = i32::try_from(v) {
        out.push(0xd2);
        out.extend_from_slice(&w.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn write_f64(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_be_bytes());
}

pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 0x100 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 0x1_0000 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&len_u32(n).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn write_array_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if n < 0x1_0000 {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&len_u32(n).to_be_bytes());
    }
}

/// msgpack cannot say more than u32::MAX elements or bytes; nothing kvroute writes comes near.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    #[test]
    fn integers_take_the_smallest_form_and_read_back() {
        let cases: &[(i64, &[u8])] = &[
            (0, &[0x00]),
            (127, &[0x7f]),
            (128, &[0xcc, 0x80]),
            (65_535, &[0xcd, 0xff, 0xff]),
            (1 << 32, &[0xcf, 0, 0, 0, 1, 0, 0, 0, 0]),
            (-1, &[0xff]),
            (-32, &[0xe0]),
            (-33, &[0xd0, 0xdf]),
            (-129, &[0xd1, 0xff, 0x7f]),
            (-40_000, &[0xd2, 0xff, 0xff, 0x63, 0xc0]),
            (i64::MIN, &[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0]),
        ];
        for &(v, bytes) in cases {
            let out = written(|o| write_int(o, v));
            assert_eq!(out, bytes, "{v}");
            let mut r = Reader::new(&out);
            assert_eq!(r.opt_int(), Ok(Some(v)), "{v}");
            assert_eq!(r.remaining(), 0);
        }
        let max = written(|o| write_uint(o, u64::MAX));
        assert_eq!(Reader::new(&max).int(), Ok(Int::U(u64::MAX)));
    }

    #[test]
    fn strings_and_arrays_switch_header_at_the_limits() {
        for n in [0usize, 31, 32, 255, 256, 65_535, 65_536] {
            let s = "x".repeat(n);
            let out = written(|o| write_str(o, &s));
            let mut r = Reader::new(&out);
            assert_eq!(r.str(), Ok(s.as_str()), "str {n}");
            let out = written(|o| {
                write_array_len(o, n);
                o.extend(std::iter::repeat_n(0xc0, n));
            });
            let mut r = Reader::new(&out);
            assert_eq!(r.array_len(), Ok(n), "array {n}");
            if n > 0 {
                assert_eq!(r.raw_value(), Ok(&[0xc0][..]));
            }
        }
    }
}
