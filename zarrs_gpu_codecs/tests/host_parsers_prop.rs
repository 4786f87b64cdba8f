//! Properties of the host-side parsers that guard nvCOMP, on random and mutated inputs: they never
//! panic, accept valid encodings with the right verdict, and reject only what libzstd rejects.

use std::io::{Read, Write};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use proptest::prelude::*;
use zarrs_gpu_codecs::gzip_member::{check_member, MemberVerdict};
use zarrs_gpu_codecs::zstd_frame::{check_frame, FrameVerdict};

/// Whether libzstd's one-shot decoder (zarrs' host path) decodes `data` to `n` bytes.
fn zstd_decodes(data: &[u8], n: u64) -> bool {
    matches!(zstd::bulk::decompress(data, n as usize), Ok(out) if out.len() as u64 == n)
}

/// A frame of one compressed block holding `body`, recording `size` bytes (1 KiB window).
fn one_block(body: &[u8], size: u8) -> Vec<u8> {
    let word = (body.len() as u32) << 3 | 2 << 1 | 1;
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 0, size, 0, 0, 0];
    frame.extend_from_slice(&word.to_le_bytes()[..3]);
    frame.extend_from_slice(body);
    frame
}

/// Compressible chunks: runs of a few symbols.
fn chunk() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((0u8..12, 1usize..40), 0..600)
        .prop_map(|runs| runs.into_iter().flat_map(|(b, n)| std::iter::repeat_n(b.wrapping_mul(37), n)).collect())
}

/// Flips applied to a frame: (position as a fraction of its length, XOR mask).
fn flips() -> impl Strategy<Value = Vec<(f64, u8)>> {
    prop::collection::vec((0.0..1.0f64, 1u8..=255), 1..4)
}

fn flip(bytes: &[u8], flips: &[(f64, u8)]) -> Vec<u8> {
    let mut bad = bytes.to_vec();
    for &(at, mask) in flips {
        let i = ((at * bad.len() as f64) as usize).min(bad.len() - 1);
        bad[i] ^= mask;
    }
    bad
}

fn gzip(raw: &[u8], level: u32) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::new(level));
    encoder.write_all(raw).unwrap();
    encoder.finish().unwrap()
}

// 256 cases each (proptest's default; `PROPTEST_CASES` sets more).
proptest! {
    #[test]
    fn zstd_random_bytes(data in prop::collection::vec(any::<u8>(), 0..300), n in 0u64..4000) {
        if check_frame(&data, n).is_err() {
            prop_assert!(!zstd_decodes(&data, n));
        }
    }

    /// Random block bodies behind a valid header reach the literals and sequences parsers.
    #[test]
    fn zstd_random_blocks(body in prop::collection::vec(any::<u8>(), 0..200), size in any::<u8>()) {
        let frame = one_block(&body, size);
        if let Err(e) = check_frame(&frame, u64::from(size)) {
            prop_assert!(!zstd_decodes(&frame, u64::from(size)), "we reject what libzstd decodes: {}", e);
        }
    }

    #[test]
    fn zstd_valid_and_mutated(raw in chunk(), level in -5i32..=12, checksum in any::<bool>(), flips in flips()) {
        let mut encoder = zstd::bulk::Compressor::new(level).unwrap();
        encoder.include_checksum(checksum).unwrap();
        let frame = encoder.compress(&raw).unwrap();
        let n = raw.len() as u64;
        prop_assert_eq!(check_frame(&frame, n), Ok(FrameVerdict::Device { checksum }));
        let bad = flip(&frame, &flips);
        if let Err(e) = check_frame(&bad, n) {
            prop_assert!(!zstd_decodes(&bad, n), "we reject what libzstd decodes: {}", e);
        }
    }

    #[test]
    fn gzip_random_bytes(data in prop::collection::vec(any::<u8>(), 0..300), n in 0u64..4000) {
        if let MemberVerdict::Device { crc32 } = check_member(&data, n) {
            // Only a plain member whose trailer has the chunk's size and this CRC goes to the device.
            prop_assert_eq!(&data[..3], &[0x1F, 0x8B, 8]);
            prop_assert_eq!(u32::from_le_bytes(data[data.len() - 8..data.len() - 4].try_into().unwrap()), crc32);
        }
    }

    #[test]
    fn gzip_valid_and_mutated(raw in chunk(), level in 0u32..=9, flips in flips()) {
        let member = gzip(&raw, level);
        let n = raw.len() as u64;
        if n > 0 {
            prop_assert_eq!(check_member(&member, n), MemberVerdict::Device { crc32: crc32fast::hash(&raw) });
        }
        let bad = flip(&member, &flips);
        let verdict = check_member(&bad, n);
        let mut out = Vec::new();
        let flate2_ok = GzDecoder::new(&bad[..]).read_to_end(&mut out).is_ok() && out.len() as u64 == n;
        // A member flate2 decodes to the chunk's size, with a plain header, goes to the device.
        if flate2_ok && n > 0 && bad[3] & !1 == 0 && gzip_len(&bad) == Some(bad.len()) {
            prop_assert!(matches!(verdict, MemberVerdict::Device { .. }), "{:?}", verdict);
        }
    }
}

/// Bytes of the first gzip member in `data` (flate2 stops after one; its `bufread` decoder leaves
/// exactly the bytes after it in the reader).
fn gzip_len(data: &[u8]) -> Option<usize> {
    let mut decoder = flate2::bufread::GzDecoder::new(data);
    let mut sink = Vec::new();
    decoder.read_to_end(&mut sink).ok()?;
    let rest = decoder.into_inner();
    Some(data.len() - rest.len())
}
