//! Host-side checks of raw deflate streams (RFC 1951) before nvCOMP decodes them: the payload of
//! a zlib stream (`zlib`) and of a gzip member (`gzip`).
//!
//! Where a block ends is known only by decoding it, so the check reads what lies before the first
//! block that is Huffman coded, and that block's header:
//!
//! - every leading stored block: its length and the length's complement, its bytes within the
//!   stream; a stream of stored blocks only (level 0) is checked whole: its blocks hold exactly
//!   the chunk's size and the last one ends where the stream does;
//! - the first block type (3 is reserved);
//! - a dynamic block's header: the numbers of length and distance codes, the code lengths code
//!   (neither over-subscribed nor incomplete), every code length it codes (no repeat before the
//!   first length or past the last), an end-of-block code, and the literal/length and distance
//!   codes those lengths make (neither over-subscribed, nor incomplete but for a single code).
//!
//! Each of those is a rule zlib applies while decoding (`inflate.c`, `inftrees.c`), so an error
//! here is a stream zlib rejects too, and no stream zlib decodes to the chunk's size is refused.
//! What the check cannot decide (a stream that ends early, stored blocks that hold another size,
//! bytes after the last block) goes to the host, where zlib decides. Everything after the first
//! Huffman-coded block header is left to the check value the stream's container carries (zlib's
//! Adler-32, gzip's CRC-32), verified after decoding.

use crate::config::DecodeTrust;
use crate::schedule::{DecodeRates, GIB, MIB};

/// Whether nvCOMP may decode deflate streams (gzip members, zlib streams, Blosc's zlib streams):
/// only those a crc32c verified first, or under [`DecodeTrust::Trusted`]. Its decoder is not
/// defined on malformed streams, and the check here reads only up to the first Huffman-coded block.
pub(crate) fn may_decode(trust: DecodeTrust, verified: bool) -> bool {
    verified || trust == DecodeTrust::Trusted
}

/// First estimates of the rates of 1 MiB deflate streams (gzip members, zlib streams) on an H200:
/// nvCOMP decodes one stream serially (about 40 MiB/s; 4096 members of G2 at 15.5 GiB/s), a host
/// thread inflates about 0.35 GiB/s. A device's reads refine both.
pub(crate) fn decode_rates() -> DecodeRates {
    DecodeRates::default().with_device_rates(1.0e-3, 40.0 * MIB, 20.0 * GIB).with_host_thread_rate(0.35 * GIB)
}

/// Decode from `decoder` (flate2's, over one stored unit) into `out` as zarrs' codecs do: read to
/// the stream's end, which checks its trailer; the bytes written, or `out.len() + 1` when the
/// stream holds more.
pub(crate) fn read_into(mut decoder: impl std::io::Read, out: &mut [u8]) -> std::io::Result<usize> {
    let mut written = 0;
    while written < out.len() {
        match decoder.read(&mut out[written..])? {
            0 => return Ok(written),
            n => written += n,
        }
    }
    // Reading on to the end checks the trailer; anything more is too long.
    let more = decoder.read(&mut [0u8; 1])?;
    Ok(written + more)
}

/// Why a deflate stream is not valid: what zlib reports for it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeflateError {
    /// A block of type 3, which RFC 1951 reserves.
    #[error("block {block}: reserved block type")]
    ReservedBlockType {
        /// The block's index in the stream.
        block: usize,
    },
    /// A stored block's length and its complement disagree.
    #[error("block {block}: stored length {len:#06x} is not the complement of {nlen:#06x}")]
    StoredLength {
        /// The block's index in the stream.
        block: usize,
        /// LEN.
        len: u16,
        /// NLEN.
        nlen: u16,
    },
    /// A dynamic block with more literal/length codes than 286 or distance codes than 30.
    #[error("block {block}: {lengths} literal/length and {distances} distance codes, more than 286 and 30")]
    TooManyCodes {
        /// The block's index in the stream.
        block: usize,
        /// Literal/length codes (HLIT + 257).
        lengths: usize,
        /// Distance codes (HDIST + 1).
        distances: usize,
    },
    /// A dynamic block's Huffman code that zlib cannot build.
    #[error("block {block}: the {code} code is {flaw}")]
    Code {
        /// The block's index in the stream.
        block: usize,
        /// Which code: "code lengths", "literal/length" or "distance".
        code: &'static str,
        /// "over-subscribed" or "incomplete".
        flaw: &'static str,
    },
    /// A code length repeat (symbol 16) before any length, or one past the last length.
    #[error("block {block}: a code length repeat before the first length or past the last")]
    BadRepeat {
        /// The block's index in the stream.
        block: usize,
    },
    /// A dynamic block without a code for its end (symbol 256).
    #[error("block {block}: no end-of-block code")]
    NoEndOfBlock {
        /// The block's index in the stream.
        block: usize,
    },
}

/// What the check says of a deflate stream that is not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeflateVerdict {
    /// Valid as far as checked: the device may decode it.
    Device,
    /// Not shown invalid, but zlib on the host should decide (the reason).
    Host(&'static str),
}

/// The order in which a dynamic block stores the code lengths code's lengths.
const CODE_LENGTHS_ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];
/// The longest code of deflate's Huffman codes.
const MAX_BITS: usize = 15;

/// Deflate's bits: least significant first within each byte.
struct Bits<'a> {
    data: &'a [u8],
    /// The next bit's index.
    at: usize,
}

impl Bits<'_> {
    /// The next `n` (at most 16) bits, the first read the lowest; None past the end.
    fn take(&mut self, n: usize) -> Option<u32> {
        if self.data.len().checked_mul(8)?.checked_sub(self.at)? < n {
            return None;
        }
        let mut value = 0;
        for i in 0..n {
            let bit = (self.data[self.at / 8] >> (self.at % 8)) & 1;
            value |= u32::from(bit) << i;
            self.at += 1;
        }
        Some(value)
    }
}

/// A canonical Huffman code's symbols per length, to decode with and check as zlib's
/// `inflate_table` does.
struct Huffman {
    /// Codes of each length (index 0 unused).
    count: [u16; MAX_BITS + 1],
    /// Symbols ordered by code.
    symbols: Vec<u16>,
}

impl Huffman {
    fn new(lengths: &[u8]) -> Self {
        let mut count = [0u16; MAX_BITS + 1];
        for &len in lengths {
            count[usize::from(len)] += 1;
        }
        count[0] = 0;
        let mut symbols: Vec<u16> = (0..lengths.len() as u16).filter(|&s| lengths[usize::from(s)] != 0).collect();
        symbols.sort_by_key(|&s| lengths[usize::from(s)]);
        Self { count, symbols }
    }

    /// No symbol has a code.
    fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// zlib's verdict on the code (`inflate_table`): over-subscribed lengths fail; an incomplete
    /// set fails for the code lengths code, and for the others unless it is a single code of
    /// one bit; no code at all passes.
    fn flaw(&self, code_lengths: bool) -> Option<&'static str> {
        let max = (1..=MAX_BITS).rev().find(|&len| self.count[len] != 0).unwrap_or(0);
        let mut left: i64 = 1;
        for len in 1..=MAX_BITS {
            left = 2 * left - i64::from(self.count[len]);
            if left < 0 {
                return Some("over-subscribed");
            }
        }
        (max > 0 && left > 0 && (code_lengths || max != 1)).then_some("incomplete")
    }

    /// The next symbol (the code is complete: every bit string decodes); None past the end.
    fn decode(&self, bits: &mut Bits<'_>) -> Option<u16> {
        let (mut code, mut first, mut index) = (0i64, 0i64, 0i64);
        for len in 1..=MAX_BITS {
            code |= i64::from(bits.take(1)?);
            let count = i64::from(self.count[len]);
            if code - first < count {
                return Some(self.symbols[(index + code - first) as usize]);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        None
    }
}

/// Check `stream`, a raw deflate stream that should decode to `expected` bytes (see the module
/// docs).
///
/// # Errors
/// Returns what makes zlib reject the stream.
pub fn check_stream(stream: &[u8], expected: u64) -> Result<DeflateVerdict, DeflateError> {
    let mut bits = Bits { data: stream, at: 0 };
    let mut stored: u64 = 0;
    let mut block = 0;
    loop {
        let Some(header) = bits.take(3) else {
            return Ok(DeflateVerdict::Host("the stream ends inside a block header"));
        };
        let last = header & 1 == 1;
        match header >> 1 {
            0 => {
                let at = bits.at.div_ceil(8);
                let Some(lengths) = stream.get(at..at + 4) else {
                    return Ok(DeflateVerdict::Host("the stream ends inside a stored block's lengths"));
                };
                let len = u16::from_le_bytes([lengths[0], lengths[1]]);
                let nlen = u16::from_le_bytes([lengths[2], lengths[3]]);
                if len != !nlen {
                    return Err(DeflateError::StoredLength { block, len, nlen });
                }
                let end = at + 4 + usize::from(len);
                if end > stream.len() {
                    return Ok(DeflateVerdict::Host("a stored block runs past the stream"));
                }
                stored += u64::from(len);
                if stored > expected {
                    return Ok(DeflateVerdict::Host("stored blocks hold more than the chunk's size"));
                }
                bits.at = end * 8;
                if last {
                    return Ok(if end != stream.len() {
                        DeflateVerdict::Host("bytes after the deflate stream")
                    } else if stored != expected {
                        DeflateVerdict::Host("stored blocks hold less than the chunk's size")
                    } else {
                        DeflateVerdict::Device
                    });
                }
            }
            1 => return Ok(DeflateVerdict::Device),
            2 => return dynamic_header(&mut bits, block),
            _ => return Err(DeflateError::ReservedBlockType { block }),
        }
        block += 1;
    }
}

/// Check a dynamic block's header (after its 3 header bits) as zlib reads it.
fn dynamic_header(bits: &mut Bits<'_>, block: usize) -> Result<DeflateVerdict, DeflateError> {
    const ENDS: DeflateVerdict = DeflateVerdict::Host("the stream ends inside a dynamic block's header");
    let (Some(hlit), Some(hdist), Some(hclen)) = (bits.take(5), bits.take(5), bits.take(4)) else { return Ok(ENDS) };
    let (lengths, distances) = (hlit as usize + 257, hdist as usize + 1);
    if lengths > 286 || distances > 30 {
        return Err(DeflateError::TooManyCodes { block, lengths, distances });
    }
    let mut code_lengths = [0u8; 19];
    for &symbol in &CODE_LENGTHS_ORDER[..hclen as usize + 4] {
        let Some(len) = bits.take(3) else { return Ok(ENDS) };
        code_lengths[symbol] = len as u8;
    }
    let code = Huffman::new(&code_lengths);
    if let Some(flaw) = code.flaw(true) {
        return Err(DeflateError::Code { block, code: "code lengths", flaw });
    }
    let total = lengths + distances;
    if code.is_empty() {
        // zlib then reads every length as 0, one bit each: no end-of-block code.
        let left = bits.data.len() * 8 - bits.at;
        return if left >= total { Err(DeflateError::NoEndOfBlock { block }) } else { Ok(ENDS) };
    }
    let mut lens = [0u8; 286 + 30];
    let mut have = 0;
    while have < total {
        let Some(symbol) = code.decode(bits) else { return Ok(ENDS) };
        let (len, repeat) = match symbol {
            0..=15 => (symbol as u8, 1),
            16 => {
                let Some(extra) = bits.take(2) else { return Ok(ENDS) };
                if have == 0 {
                    return Err(DeflateError::BadRepeat { block });
                }
                (lens[have - 1], 3 + extra as usize)
            }
            17 => match bits.take(3) {
                Some(extra) => (0, 3 + extra as usize),
                None => return Ok(ENDS),
            },
            _ => match bits.take(7) {
                Some(extra) => (0, 11 + extra as usize),
                None => return Ok(ENDS),
            },
        };
        if have + repeat > total {
            return Err(DeflateError::BadRepeat { block });
        }
        lens[have..have + repeat].fill(len);
        have += repeat;
    }
    if lens[256] == 0 {
        return Err(DeflateError::NoEndOfBlock { block });
    }
    if let Some(flaw) = Huffman::new(&lens[..lengths]).flaw(false) {
        return Err(DeflateError::Code { block, code: "literal/length", flaw });
    }
    if let Some(flaw) = Huffman::new(&lens[lengths..total]).flaw(false) {
        return Err(DeflateError::Code { block, code: "distance", flaw });
    }
    Ok(DeflateVerdict::Device)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use flate2::write::DeflateEncoder;
    use flate2::Compression;

    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i / 7) as u8).wrapping_mul(31) ^ (i % 5) as u8).collect()
    }

    fn deflate(raw: &[u8], level: u32) -> Vec<u8> {
        let mut encoder = DeflateEncoder::new(Vec::new(), Compression::new(level));
        encoder.write_all(raw).unwrap();
        encoder.finish().unwrap()
    }

    /// What zlib (flate2) makes of `stream`: its decoded bytes, and whether it ended exactly at
    /// the stream's end; None when it reports an error.
    fn inflate(stream: &[u8]) -> Option<(Vec<u8>, bool)> {
        let mut decoder = flate2::bufread::DeflateDecoder::new(stream);
        let mut out = Vec::new();
        decoder.read_to_end(&mut out).ok()?;
        let whole = decoder.into_inner().is_empty();
        Some((out, whole))
    }

    #[test]
    fn valid_streams_of_every_level_go_to_the_device() {
        let random: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for raw in [data(1), data(300), data(200_000), random, vec![0; 100_000]] {
            for level in 0..=9 {
                let stream = deflate(&raw, level);
                assert_eq!(
                    check_stream(&stream, raw.len() as u64),
                    Ok(DeflateVerdict::Device),
                    "{} at {level}",
                    raw.len()
                );
            }
        }
        // Level 0 is checked whole: another size, bytes after, a cut stream go to the host.
        let stream = deflate(&data(150_000), 0);
        let host = |bytes: &[u8], n: u64| matches!(check_stream(bytes, n), Ok(DeflateVerdict::Host(_)));
        assert!(host(&stream, 149_999) && host(&stream, 150_001));
        let mut after = stream.clone();
        after.push(0);
        assert!(host(&after, 150_000));
        assert!(host(&stream[..stream.len() - 1], 150_000));
        assert!(host(&stream[..70_000], 150_000));
        assert!(host(&[], 1));
    }

    #[test]
    fn broken_headers_are_the_errors_zlib_reports() {
        // A reserved block type, stored lengths that disagree.
        assert_eq!(check_stream(&[0b111, 0, 0], 1), Err(DeflateError::ReservedBlockType { block: 0 }));
        let stored = deflate(&data(1000), 0);
        let mut bad = stored.clone();
        bad[3] ^= 1;
        assert!(matches!(check_stream(&bad, 1000), Err(DeflateError::StoredLength { block: 0, .. })));
        assert!(inflate(&bad).is_none());
        // A dynamic block header with 287 literal/length codes (HLIT = 30).
        let too_many = [0b1111_0101, 0b0000_0011, 0, 0, 0, 0];
        assert!(matches!(check_stream(&too_many, 1), Err(DeflateError::TooManyCodes { lengths: 287, .. })));
        // The second stored block broken.
        let mut second = deflate(&data(100_000), 0);
        let at = 5 + usize::from(u16::from_le_bytes([second[1], second[2]]));
        second[at + 1] ^= 0xFF;
        assert!(matches!(check_stream(&second, 100_000), Err(DeflateError::StoredLength { block: 1, .. })));
    }

    /// Streams with flipped bytes, cut or random: an error here is an error for zlib too, and
    /// whatever zlib decodes to the expected size with nothing after goes to the device.
    fn agrees_with_zlib(stream: &[u8], expected: u64) {
        let verdict = check_stream(stream, expected);
        match inflate(stream) {
            Some((out, whole)) if whole && out.len() as u64 == expected => {
                assert_eq!(verdict, Ok(DeflateVerdict::Device), "{stream:02x?}");
            }
            _ => {}
        }
        if let Err(err) = verdict {
            assert!(inflate(stream).is_none(), "{err}, but zlib decodes {stream:02x?}");
        }
    }

    #[test]
    fn damaged_streams_agree_with_zlib() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (mut errors, mut tries) = (0, 0);
        for (n, level) in [(2000, 6), (300, 9), (5000, 1), (800, 0), (60_000, 6)] {
            let raw = data(n);
            let good = deflate(&raw, level);
            agrees_with_zlib(&good, n as u64);
            // Damage in the first bytes, where the block header is.
            for _ in 0..400 {
                let mut bad = good.clone();
                let at = rng.random_range(0..bad.len().min(40));
                bad[at] ^= rng.random_range(1..=255u8);
                agrees_with_zlib(&bad, n as u64);
                tries += 1;
                errors += usize::from(check_stream(&bad, n as u64).is_err());
            }
        }
        // A sizable share of header damage is caught.
        assert!(errors * 4 > tries, "{errors} of {tries}");
    }

    proptest::proptest! {
        /// Random bytes and mutated streams: never a panic, never an error on what zlib decodes.
        #[test]
        fn random_and_mutated_streams_agree_with_zlib(
            random in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            n in 0..3000usize,
            level in 0..10u32,
            edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..3),
            cut in proptest::option::of(proptest::prelude::any::<proptest::sample::Index>()),
        ) {
            agrees_with_zlib(&random, 16);
            let mut stream = deflate(&data(n), level);
            for (at, byte) in &edits {
                let at = at.index(stream.len());
                stream[at] = *byte;
            }
            if let Some(cut) = cut {
                stream.truncate(cut.index(stream.len() + 1));
            }
            agrees_with_zlib(&stream, n as u64);
        }
    }
}
