//! Host-side checks of zstd frames before they reach nvCOMP, where corrupt input is undefined
//! behaviour: the frame's structure is walked (magic, header, every block header, the checksum
//! field) and its recorded content size compared with the chunk's size.
//!
//! What is not checked: the entropy-coded payload inside well-formed blocks (that needs decoding),
//! and the frame's XXH64 content checksum when present (nvCOMP does not verify it and neither do
//! we on the device path; the host path, zarrs' zstd codec, does).

/// The zstd frame magic number (little-endian on disk).
const MAGIC: u32 = 0xFD2F_B528;
/// Skippable frames have magics 0x184D2A50 ..= 0x184D2A5F.
const SKIPPABLE_MASK: u32 = 0xFFFF_FFF0;
const SKIPPABLE: u32 = 0x184D_2A50;
/// The largest block a conforming frame may hold.
const MAX_BLOCK: u32 = 128 << 10;

/// How a well-formed chunk is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameVerdict {
    /// One frame holding exactly the chunk: nvCOMP can decode it.
    Device {
        /// Whether the frame carries an XXH64 content checksum (not verified on the device).
        checksum: bool,
    },
    /// Valid zstd that nvCOMP cannot decode correctly: decode on the host.
    Host(&'static str),
}

/// A chunk that is not a valid zstd encoding of the expected size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The bytes do not start with a zstd frame.
    #[error("not a zstd frame (magic {0:#010x})")]
    BadMagic(u32),
    /// The frame ends past the chunk's bytes.
    #[error("truncated zstd frame: {needed} bytes needed, {len} present")]
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes present.
        len: usize,
    },
    /// A reserved bit or block type is set.
    #[error("corrupt zstd frame: {0}")]
    Corrupt(&'static str),
    /// The frame records a content size other than the chunk's.
    #[error("zstd frame holds {found} bytes but the chunk is {expected} bytes")]
    SizeMismatch {
        /// The chunk's decoded size.
        expected: u64,
        /// The frame's content size.
        found: u64,
    },
}

fn le(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// Check that `data` is one zstd frame of `expected` decoded bytes.
///
/// # Errors
/// Returns a [`FrameError`] for bytes that are not valid zstd of that size.
pub fn check_frame(data: &[u8], expected: u64) -> Result<FrameVerdict, FrameError> {
    let need = |needed: usize| {
        if needed > data.len() {
            Err(FrameError::Truncated { needed, len: data.len() })
        } else {
            Ok(())
        }
    };
    need(4)?;
    let magic = le(&data[..4]) as u32;
    if magic & SKIPPABLE_MASK == SKIPPABLE {
        return Ok(FrameVerdict::Host("the chunk starts with a skippable frame"));
    }
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    need(5)?;
    let descriptor = data[4];
    let fcs_flag = descriptor >> 6;
    let single_segment = descriptor & 0x20 != 0;
    if descriptor & 0x08 != 0 {
        return Err(FrameError::Corrupt("reserved bit of the frame header descriptor is set"));
    }
    let checksum = descriptor & 0x04 != 0;
    let dict_len = [0usize, 1, 2, 4][usize::from(descriptor & 3)];
    let fcs_len = match fcs_flag {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut pos = 5 + usize::from(!single_segment) + dict_len;
    need(pos + fcs_len)?;
    let dict_id = le(&data[pos - dict_len..pos]);
    let content_size = match fcs_len {
        0 => None,
        2 => Some(le(&data[pos..pos + 2]) + 256),
        n => Some(le(&data[pos..pos + n])),
    };
    pos += fcs_len;
    // Walk the blocks to find where the frame ends.
    loop {
        need(pos + 3)?;
        let header = le(&data[pos..pos + 3]) as u32;
        let last = header & 1 != 0;
        let size = header >> 3;
        let payload = match (header >> 1) & 3 {
            0 | 2 => size as usize, // raw, compressed
            1 => 1,                 // RLE: one byte repeated `size` times
            _ => return Err(FrameError::Corrupt("reserved block type")),
        };
        if size > MAX_BLOCK {
            return Err(FrameError::Corrupt("block larger than 128 KiB"));
        }
        pos += 3 + payload;
        need(pos)?;
        if last {
            break;
        }
    }
    if checksum {
        pos += 4;
        need(pos)?;
    }
    let more = pos != data.len();
    match content_size {
        // More frames may follow a smaller first one; a larger one can never fit.
        Some(found) if found > expected || (found < expected && !more) => {
            return Err(FrameError::SizeMismatch { expected, found })
        }
        Some(_) => {}
        None => return Ok(FrameVerdict::Host("the frame does not record its content size")),
    }
    if dict_id != 0 {
        return Ok(FrameVerdict::Host("the frame needs a dictionary"));
    }
    if more {
        return Ok(FrameVerdict::Host("the chunk holds several frames"));
    }
    Ok(FrameVerdict::Device { checksum })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| ((i / 7) as u8).wrapping_mul(31) ^ (i % 5) as u8).collect()
    }

    #[test]
    fn valid_frames_at_levels_sizes_and_checksums() {
        for (n, level, checksum) in
            [(0usize, 3, false), (1, 1, false), (300, 3, true), (200_000, 19, false), (1 << 20, 3, true)]
        {
            let raw = data(n);
            let mut encoder = zstd::bulk::Compressor::new(level).unwrap();
            encoder.include_checksum(checksum).unwrap();
            let frame = encoder.compress(&raw).unwrap();
            assert_eq!(check_frame(&frame, n as u64), Ok(FrameVerdict::Device { checksum }), "{n} bytes level {level}");
            assert_eq!(
                check_frame(&frame, n as u64 + 1),
                Err(FrameError::SizeMismatch { expected: n as u64 + 1, found: n as u64 })
            );
        }
    }

    #[test]
    fn truncated_corrupt_and_multi_frame_chunks() {
        let raw = data(300_000);
        let frame = zstd::bulk::compress(&raw, 3).unwrap();
        for cut in [0, 3, 4, 5, 9, frame.len() / 2, frame.len() - 1] {
            let err = check_frame(&frame[..cut], raw.len() as u64).unwrap_err();
            assert!(matches!(err, FrameError::Truncated { .. }), "cut at {cut}: {err}");
        }
        let mut bad = frame.clone();
        bad[0] ^= 0xFF;
        assert!(matches!(check_frame(&bad, raw.len() as u64), Err(FrameError::BadMagic(_))));
        let mut reserved = frame.clone();
        reserved[4] |= 0x08;
        assert!(matches!(check_frame(&reserved, raw.len() as u64), Err(FrameError::Corrupt(_))));
        // Two frames: valid zstd, but nvCOMP decodes only the first.
        let half = zstd::bulk::compress(&raw[..150_000], 3).unwrap();
        let mut two = half.clone();
        two.extend(zstd::bulk::compress(&raw[150_000..], 3).unwrap());
        assert_eq!(check_frame(&two, 300_000), Ok(FrameVerdict::Host("the chunk holds several frames")));
        // Streaming encoders may leave the content size out.
        let mut streamed = Vec::new();
        {
            let mut encoder = zstd::stream::Encoder::new(&mut streamed, 3).unwrap();
            encoder.include_contentsize(false).unwrap();
            std::io::Write::write_all(&mut encoder, &raw).unwrap();
            encoder.finish().unwrap();
        }
        assert_eq!(
            check_frame(&streamed, raw.len() as u64),
            Ok(FrameVerdict::Host("the frame does not record its content size"))
        );
        // A skippable frame first.
        let mut skippable = vec![0x50, 0x2A, 0x4D, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
        skippable.extend(&frame);
        assert_eq!(
            check_frame(&skippable, raw.len() as u64),
            Ok(FrameVerdict::Host("the chunk starts with a skippable frame"))
        );
    }

    proptest::proptest! {
        /// Stored chunks are hostile input: random bytes, and valid frames with bytes changed,
        /// cut short or appended, are a verdict or an error, never a panic; what goes to the
        /// device still records the chunk's size.
        #[test]
        fn random_and_mutated_frames_never_panic(
            random in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            n in 0..5000usize,
            edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..4),
            cut in proptest::option::of(proptest::prelude::any::<proptest::sample::Index>()),
            expected in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::prelude::any::<u64>(), 0..6000u64],
        ) {
            let _ = check_frame(&random, expected);
            let mut frame = zstd::bulk::compress(&data(n), 3).unwrap();
            for (at, byte) in &edits {
                let at = at.index(frame.len());
                frame[at] = *byte;
            }
            if let Some(cut) = cut {
                frame.truncate(cut.index(frame.len() + 1));
            }
            frame.extend_from_slice(&random[..random.len() % 5]);
            for expected in [expected, n as u64] {
                if let Ok(FrameVerdict::Device { .. }) = check_frame(&frame, expected) {
                    proptest::prop_assert!(frame.len() >= 4);
                }
            }
        }
    }
}
