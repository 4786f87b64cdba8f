//! Host-side checks of gzip members (RFC 1952) before nvCOMP sees them.
//!
//! A member nvCOMP decodes must be the plain kind every Zarr writer produces (zarr-python and
//! numcodecs, tensorstore, zarrs): the magic, deflate, no optional header fields, and a trailer
//! whose length (ISIZE) is the chunk's size. Anything else is decoded on the host by zarrs' own
//! gzip codec, which also decides whether it is an error, so both routes fail alike.
//!
//! Of the deflate stream inside, what can be read without decoding it: its first blocks' headers
//! ([`crate::deflate_stream`], shared with zlib); a stream that check refuses or cannot decide
//! goes to the host too. The rest cannot be checked before decoding. The CRC-32 (the trailer)
//! covers the decoded bytes, so it is verified on the device after decoding: a corrupted stream
//! that nvCOMP decodes without complaint is still an error, never wrong data. A chain with
//! `crc32c` after gzip catches corruption before nvCOMP reads anything.

use crate::codecs::deflate::{check_stream, DeflateVerdict};

/// The gzip magic bytes and the deflate method.
const MAGIC: [u8; 3] = [0x1F, 0x8B, 8];
/// Header (10 bytes) and trailer (CRC-32 and ISIZE, 8 bytes) of a member without optional fields.
const HEADER: usize = 10;
const TRAILER: usize = 8;
/// FTEXT, a hint with no effect on decoding; every other flag adds header fields.
const FTEXT: u8 = 1;

/// How a stored chunk that should be a gzip member is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberVerdict {
    /// One plain member of the chunk's size: nvCOMP decodes it, then its CRC-32 is checked.
    Device {
        /// The CRC-32 of the decoded bytes, from the trailer.
        crc32: u32,
    },
    /// Decoded on the host by zarrs' gzip codec (which reports what is wrong, if anything).
    Host(&'static str),
}

/// Check that `data` is one plain gzip member of `expected` decoded bytes.
#[must_use]
pub fn check_member(data: &[u8], expected: u64) -> MemberVerdict {
    if data.len() < HEADER + TRAILER + 2 {
        return MemberVerdict::Host("too short for a gzip member");
    }
    if data[..3] != MAGIC {
        return MemberVerdict::Host("not a deflate gzip member");
    }
    if data[3] & !FTEXT != 0 {
        return MemberVerdict::Host("gzip header with optional fields or reserved flags");
    }
    let t = &data[data.len() - TRAILER..];
    let crc32 = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
    let isize = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
    // ISIZE is the length modulo 2^32. Several members, or bytes after the member, leave a
    // trailer that does not match, unless the first member is empty or the bytes after happen to
    // end in the size: contrived cases, where the device's CRC-32 check or nvCOMP's decoded size
    // may refuse what zarrs reads, or read what zarrs (first member only) refuses.
    if u64::from(isize) != expected % (1 << 32) {
        return MemberVerdict::Host("gzip trailer length is not the chunk's size (several members, or trailing bytes)");
    }
    if expected == 0 {
        return MemberVerdict::Host("empty chunk");
    }
    match check_stream(&data[HEADER..data.len() - TRAILER], expected) {
        Ok(DeflateVerdict::Device) => MemberVerdict::Device { crc32 },
        Ok(DeflateVerdict::Host(reason)) => MemberVerdict::Host(reason),
        Err(_) => MemberVerdict::Host("a deflate stream zlib rejects"),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::write::GzEncoder;
    use flate2::{Compression, GzBuilder};

    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i / 7) as u8).wrapping_mul(31) ^ (i % 5) as u8).collect()
    }

    fn gzip(raw: &[u8], level: u32) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::new(level));
        encoder.write_all(raw).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn plain_members_go_to_the_device_with_their_crc() {
        for (n, level) in [(1usize, 1), (300, 5), (200_000, 9), (1 << 20, 0)] {
            let raw = data(n);
            let member = gzip(&raw, level);
            let crc32 = crc32fast::hash(&raw);
            assert_eq!(check_member(&member, n as u64), MemberVerdict::Device { crc32 }, "{n} at level {level}");
        }
    }

    #[test]
    fn anything_unusual_goes_to_the_host() {
        let raw = data(5000);
        let member = gzip(&raw, 6);
        let host = |bytes: &[u8], expected: u64| matches!(check_member(bytes, expected), MemberVerdict::Host(_));
        // Another size than the chunk's, a truncated member, trailing bytes, two members.
        assert!(host(&member, 4999));
        assert!(host(&member[..member.len() - 1], 5000));
        let mut trailing = member.clone();
        trailing.extend_from_slice(&[0; 8]);
        assert!(host(&trailing, 5000));
        let mut two = gzip(&raw[..2000], 6);
        two.extend(gzip(&raw[2000..], 6));
        assert!(host(&two, 5000));
        // Not gzip, another method, a file name in the header, too short, empty.
        assert!(host(&zstd::bulk::compress(&raw, 3).unwrap(), 5000));
        let mut method = member.clone();
        method[2] = 7;
        assert!(host(&method, 5000));
        let mut named = GzBuilder::new().filename("chunk").write(Vec::new(), Compression::default());
        named.write_all(&raw).unwrap();
        assert!(host(&named.finish().unwrap(), 5000));
        assert!(host(&member[..12], 5000));
        assert!(host(&gzip(&[], 6), 0));
    }

    proptest::proptest! {
        /// Random bytes and mutated members are a verdict, never a panic; a member sent to the
        /// device records the chunk's size in its trailer.
        #[test]
        fn random_and_mutated_members_never_panic(
            random in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            n in 0..5000usize,
            edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..4),
            cut in proptest::option::of(proptest::prelude::any::<proptest::sample::Index>()),
            expected in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::prelude::any::<u64>(), 0..6000u64],
        ) {
            let _ = check_member(&random, expected);
            let mut member = gzip(&data(n), 6);
            for (at, byte) in &edits {
                let at = at.index(member.len());
                member[at] = *byte;
            }
            if let Some(cut) = cut {
                member.truncate(cut.index(member.len() + 1));
            }
            for expected in [expected, n as u64] {
                if let MemberVerdict::Device { .. } = check_member(&member, expected) {
                    let t = &member[member.len() - 4..];
                    proptest::prop_assert_eq!(u64::from(u32::from_le_bytes([t[0], t[1], t[2], t[3]])), expected % (1 << 32));
                }
            }
        }
    }

    /// Inputs the fuzz targets found (fuzz/fuzz_targets/gzip_member.rs), kept as regressions.
    #[test]
    fn fuzz_findings() {
        // A member of 13 bytes and one byte after it: to the host, which reads the first member.
        let chunk =
            [0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 3, 0x63, 0x60, 0x40, 2, 0, 0x82, 0x46, 0x74, 0x0F, 0x0D, 0, 0, 0, 0x88];
        assert!(matches!(check_member(&chunk, 13), MemberVerdict::Host(_)));
        let mut decoder = flate2::bufread::GzDecoder::new(&chunk[..]);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut decoder, &mut out).unwrap();
        assert_eq!((out.len(), decoder.into_inner().len()), (13, 1));
    }
}
