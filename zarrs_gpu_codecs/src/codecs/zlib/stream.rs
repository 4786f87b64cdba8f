//! Host-side checks of zlib streams (RFC 1950) before nvCOMP sees them: what numcodecs' `zlib`
//! compressor writes (zarr v2 `{"id": "zlib"}`, zarrs' `zlib` codec, v3 `numcodecs.zlib`).
//!
//! A stream is a 2-byte header (CMF, FLG), a raw deflate stream, then the Adler-32 of the decoded
//! bytes, big-endian. Checked here: the header (method 8, deflate; a window of at most 32 KiB;
//! the FCHECK bits; no preset dictionary), the length (at least the header, the shortest deflate
//! stream and the Adler-32: 8 bytes), and of the deflate stream what can be read without decoding
//! it ([`crate::deflate_stream`]: its first blocks' headers, a stream of stored blocks whole).
//!
//! What zlib rejects is an error ([`ZlibError`]). What is valid, or not shown invalid, but not for
//! the device goes to the host, where zlib (flate2, as zarrs' codec calls it) decides: an empty
//! chunk; a stream shorter than 8 bytes (flate2 returns what a stream cut short holds, without an
//! error, and zarrs then compares its size); a chunk larger than nvCOMP's deflate decoder takes
//! (4 GiB); a deflate stream longer than any encoder writes for its size ([`payload_bound`]: the
//! device copies each deflate stream to an aligned place sized by that bound before it sees the
//! stream, `codecs/zlib/payload.rs`); and what the deflate check leaves to the host.
//!
//! The rest of the deflate stream is covered by the Adler-32, which the device verifies over the
//! decoded bytes before any data is returned. The Adler-32 is taken from the stream's last four
//! bytes: bytes after a compressed stream's end, which zlib ignores, make that check fail (an
//! error where zarrs reads the chunk; no Zarr writer adds any; after a stream of stored blocks
//! the deflate check sees them and sends the chunk to the host).

use crate::codecs::deflate::{self, DeflateError, DeflateVerdict};

/// The header (CMF, FLG) and the Adler-32 around the deflate stream.
pub const HEADER: usize = 2;
/// The Adler-32 after the deflate stream.
pub const TRAILER: usize = 4;
/// The shortest deflate stream: one empty block (fixed Huffman codes, end of block).
const SHORTEST_DEFLATE: usize = 2;
/// nvCOMP's deflate decoder takes chunks of at most this many decoded bytes
/// (`nvcompDeflateDecompressionMaxAllowedChunkSize`).
pub const MAX_DEVICE_DECODED: u64 = (1 << 32) - 1;

/// Why a stored chunk is not a valid zlib stream: what zlib reports for it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZlibError {
    /// The 2-byte header is wrong (zlib's "incorrect header check", "unknown compression method",
    /// "invalid window size"), or asks for a preset dictionary, which numcodecs never sets and
    /// zlib cannot decode without.
    #[error("zlib header {cmf:#04x} {flg:#04x}: {what}")]
    Header {
        /// CMF.
        cmf: u8,
        /// FLG.
        flg: u8,
        /// What is wrong.
        what: &'static str,
    },
    /// The deflate stream inside is invalid.
    #[error("zlib stream: {0}")]
    Deflate(#[from] DeflateError),
}

/// How a stored chunk that is a valid zlib stream, as far as checked, is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamVerdict {
    /// nvCOMP decodes its deflate stream; the Adler-32 is verified on the device after.
    Device {
        /// The Adler-32 of the decoded bytes, from the trailer.
        adler32: u32,
    },
    /// Decoded on the host (zlib decides whether it is valid), for this reason.
    Host(&'static str),
}

/// Check a zlib stream's 2-byte header (what Blosc's zlib streams are checked for too).
///
/// # Errors
/// Returns what makes zlib reject the header.
pub fn check_header(cmf: u8, flg: u8) -> Result<(), ZlibError> {
    let header = |what| Err(ZlibError::Header { cmf, flg, what });
    if (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
        return header("the header check (FCHECK) fails");
    }
    if cmf & 0x0F != 8 {
        return header("the compression method is not deflate");
    }
    if cmf >> 4 > 7 {
        return header("a window larger than 32 KiB");
    }
    if flg & 0x20 != 0 {
        return header("a preset dictionary");
    }
    Ok(())
}

/// The longest deflate stream the device takes for `decoded` bytes: more than any encoder writes
/// for that many (zlib's `compressBound` allows about 0.03% more than the bytes; zlib-ng's fast
/// level, Huffman-coded literals of up to 9 bits, an eighth more), so that its aligned copy can be
/// sized before the stream is seen.
pub fn payload_bound(decoded: u64) -> u64 {
    decoded.saturating_add(decoded / 8).saturating_add(64)
}

/// Check that `data` is one zlib stream of `expected` decoded bytes (see the module docs).
///
/// # Errors
/// Returns what makes zlib reject the stream.
pub fn check_stream(data: &[u8], expected: u64) -> Result<StreamVerdict, ZlibError> {
    if let &[cmf, flg, ..] = data {
        check_header(cmf, flg)?;
    }
    if data.len() < HEADER + SHORTEST_DEFLATE + TRAILER {
        return Ok(StreamVerdict::Host("too short for a zlib stream (8 bytes)"));
    }
    let payload = &data[HEADER..data.len() - TRAILER];
    let verdict = deflate::check_stream(payload, expected)?;
    if expected == 0 {
        return Ok(StreamVerdict::Host("empty chunk"));
    }
    if expected > MAX_DEVICE_DECODED {
        return Ok(StreamVerdict::Host("larger than nvCOMP's deflate decoder takes (4 GiB)"));
    }
    if payload.len() as u64 > payload_bound(expected) {
        return Ok(StreamVerdict::Host("a deflate stream longer than any encoder writes for its size"));
    }
    match verdict {
        DeflateVerdict::Device => {
            let t = &data[data.len() - TRAILER..];
            Ok(StreamVerdict::Device { adler32: u32::from_be_bytes([t[0], t[1], t[2], t[3]]) })
        }
        DeflateVerdict::Host(reason) => Ok(StreamVerdict::Host(reason)),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use flate2::write::ZlibEncoder;
    use flate2::Compression;

    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i / 7) as u8).wrapping_mul(31) ^ (i % 5) as u8).collect()
    }

    fn zlib(raw: &[u8], level: u32) -> Vec<u8> {
        let mut encoder = ZlibEncoder::new(Vec::new(), Compression::new(level));
        encoder.write_all(raw).unwrap();
        encoder.finish().unwrap()
    }

    /// zlib's decode of `stream` as zarrs' codec runs it: None when it reports an error.
    fn unzlib(stream: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(stream).read_to_end(&mut out).ok()?;
        Some(out)
    }

    #[test]
    fn streams_of_every_level_go_to_the_device_with_their_adler32() {
        let random: Vec<u8> = (0..70_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for raw in [data(1), data(300), data(200_000), random, vec![7; 1 << 20]] {
            let adler32 = adler2::adler32_slice(&raw);
            for level in 0..=9 {
                let stream = zlib(&raw, level);
                let verdict = check_stream(&stream, raw.len() as u64);
                assert_eq!(verdict, Ok(StreamVerdict::Device { adler32 }), "{} bytes at level {level}", raw.len());
                assert!(stream.len() as u64 - 6 <= payload_bound(raw.len() as u64));
            }
        }
    }

    #[test]
    fn bad_headers_are_errors_as_for_zlib() {
        let raw = data(5000);
        let good = zlib(&raw, 6);
        let with = |cmf: u8, flg: u8| {
            let mut b = good.clone();
            (b[0], b[1]) = (cmf, flg);
            b
        };
        let header_error = |bytes: &[u8], what: &str| {
            let err = check_stream(bytes, 5000).unwrap_err();
            assert!(matches!(err, ZlibError::Header { .. }) && err.to_string().contains(what), "{err}");
            assert!(unzlib(bytes).is_none(), "zlib decodes what the check refuses: {err}");
        };
        header_error(&with(0x78, 0x9D), "FCHECK");
        header_error(&with(0x77, 0x85), "not deflate");
        header_error(&with(0x88, 0x98), "32 KiB");
        // FDICT: the dictionary's Adler-32 would follow the header.
        header_error(&with(0x78, 0xBB), "preset dictionary");
        let mut compress = flate2::Compress::new(Compression::default(), true);
        compress.set_dictionary(b"a dictionary").unwrap();
        let mut dictionary = ZlibEncoder::new_with_compress(Vec::new(), compress);
        dictionary.write_all(&raw).unwrap();
        header_error(&dictionary.finish().unwrap(), "preset dictionary");
        // Too short for a header, a deflate stream and an Adler-32 (empty too): the host's, but
        // for a bad header.
        for len in [0, 1, 2, 7] {
            assert!(matches!(check_stream(&good[..len], 5000), Ok(StreamVerdict::Host(_))), "{len}");
        }
        assert!(matches!(check_stream(&with(0x78, 0x9D)[..5], 5000), Err(ZlibError::Header { .. })));
        // A damaged first block header: the deflate check's error.
        let stored = zlib(&raw, 0);
        let mut bad = stored.clone();
        bad[5] ^= 0x10;
        assert!(matches!(check_stream(&bad, 5000), Err(ZlibError::Deflate(DeflateError::StoredLength { .. }))));
        assert!(unzlib(&bad).is_none());
    }

    #[test]
    fn valid_streams_the_device_does_not_take_go_to_the_host() {
        let host = |bytes: &[u8], expected: u64| matches!(check_stream(bytes, expected), Ok(StreamVerdict::Host(_)));
        // Empty, cut short (level 0: the deflate check sees it), another size.
        assert!(host(&zlib(&[], 6), 0));
        let stored = zlib(&data(100_000), 0);
        assert!(host(&stored[..stored.len() - 10], 100_000));
        assert!(host(&stored, 99_999));
        // Longer than any encoder writes: many empty stored blocks before the data.
        let raw = data(1000);
        let mut padded = vec![0x78, 0x01];
        for _ in 0..100 {
            padded.extend_from_slice(&[0, 0, 0, 0xFF, 0xFF]);
        }
        let deflated = zlib(&raw, 6);
        padded.extend_from_slice(&deflated[2..]);
        assert_eq!(unzlib(&padded).as_deref(), Some(&raw[..]));
        assert!(host(&padded, 1000));
    }

    proptest::proptest! {
        /// Random bytes and mutated streams: never a panic, never an error on what zlib decodes;
        /// a stream sent to the device carries its trailer's Adler-32.
        #[test]
        fn random_and_mutated_streams_never_panic(
            random in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            n in 0..5000usize,
            level in 0..10u32,
            edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..4),
            cut in proptest::option::of(proptest::prelude::any::<proptest::sample::Index>()),
        ) {
            let _ = check_stream(&random, 100);
            let mut stream = zlib(&data(n), level);
            for (at, byte) in &edits {
                let at = at.index(stream.len());
                stream[at] = *byte;
            }
            if let Some(cut) = cut {
                stream.truncate(cut.index(stream.len() + 1));
            }
            match check_stream(&stream, n as u64) {
                Err(err) => proptest::prop_assert!(unzlib(&stream).is_none(), "{}", err),
                Ok(StreamVerdict::Device { adler32 }) => {
                    let t = &stream[stream.len() - 4..];
                    proptest::prop_assert_eq!(adler32, u32::from_be_bytes([t[0], t[1], t[2], t[3]]));
                }
                Ok(StreamVerdict::Host(_)) => {}
            }
        }
    }
}
