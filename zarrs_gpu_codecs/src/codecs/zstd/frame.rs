//! Host-side checks of zstd frames before they reach nvCOMP, where corrupt input is undefined
//! behaviour (it may report success with wrong bytes, or hang).
//!
//! The frame is walked as far as it is cheap, linear in header bytes and without decoding any
//! entropy-coded payload (RFC 8878): the frame header (reserved bit, window within libzstd's
//! limit), every block header, and in every compressed block the literals section header (type,
//! size format, sizes within the block, the window, 128 KiB and the content size), the Huffman
//! tree description (direct or FSE-compressed weights, decoded and checked to form a tree), the
//! four-stream jump table, the literals streams' end marks and lengths where libzstd checks them,
//! the sequences section header (count, reserved bits, each table's mode: RLE codes in range, FSE
//! table descriptions that parse, Repeat and treeless literals only after a table to repeat) and
//! the sequences bitstream's end mark and minimum length. The regenerated size of every block is
//! bounded, and the blocks together must be able to produce the recorded content size.
//!
//! Every rule is one that libzstd applies too, so a rejected chunk is one the host path rejects
//! (where libzstd reads past a section in ways we do not model, we stop checking that section).
//! Two are also spec rules that libzstd's one-shot decoder leaves to its streaming one: a raw or
//! RLE block of more than 128 KiB, and a block whose regenerated size must exceed the window or
//! 128 KiB.
//!
//! What is not checked: the entropy-coded payload itself (literals streams of 8 bytes or more in
//! four-stream mode, sequences bitstreams beyond their minimum length, offsets against the
//! window). Damage there reaches nvCOMP; `benches/RESULTS.md` (corruption sweep) measures how
//! often. The frame's XXH64 content checksum, when present, is verified on the decoded bytes
//! (on the device, by zstd's XXH64 kernel: `xxhash.rs`), which catches such damage.

mod block;
pub(crate) mod chain;
mod fse;

use block::{compressed_block, Entropy, Flaw};

/// The zstd frame magic number (little-endian on disk).
const MAGIC: u32 = 0xFD2F_B528;
/// Skippable frames have magics 0x184D2A50 ..= 0x184D2A5F.
const SKIPPABLE_MASK: u32 = 0xFFFF_FFF0;
const SKIPPABLE: u32 = 0x184D_2A50;
/// The largest block a conforming frame may hold.
const MAX_BLOCK: u32 = 128 << 10;
/// libzstd's largest window log on 64-bit hosts.
const MAX_WINDOW_LOG: u32 = 31;

/// How a well-formed chunk is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameVerdict {
    /// One frame holding exactly the chunk: nvCOMP can decode it.
    Device {
        /// Whether the frame carries an XXH64 content checksum (its last 4 bytes), which the
        /// pipeline verifies on the decoded bytes.
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
    /// The frame header is damaged, or the blocks cannot make up its content size.
    #[error("corrupt zstd frame: {0}")]
    Corrupt(&'static str),
    /// A block is damaged.
    #[error("corrupt zstd frame: block {block} at byte {offset}, {part}: {what}")]
    Block {
        /// The block's index in the frame, from 0.
        block: usize,
        /// Where its header starts in the chunk.
        offset: usize,
        /// Which part of the block.
        part: &'static str,
        /// What is wrong.
        what: &'static str,
    },
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

fn need(data: &[u8], needed: usize) -> Result<(), FrameError> {
    if needed > data.len() {
        Err(FrameError::Truncated { needed, len: data.len() })
    } else {
        Ok(())
    }
}

/// The frame header's fields.
struct Header {
    /// Bytes of the header (magic included).
    len: usize,
    checksum: bool,
    dict_id: u64,
    content_size: Option<u64>,
    /// The largest block: the window or 128 KiB, whichever is smaller.
    block_max: usize,
}

/// Parses the frame header; `None` for a skippable frame.
fn header(data: &[u8]) -> Result<Option<Header>, FrameError> {
    need(data, 4)?;
    let magic = le(&data[..4]) as u32;
    if magic & SKIPPABLE_MASK == SKIPPABLE {
        return Ok(None);
    }
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    need(data, 5)?;
    let descriptor = data[4];
    let single_segment = descriptor & 0x20 != 0;
    if descriptor & 0x08 != 0 {
        return Err(FrameError::Corrupt("reserved bit of the frame header descriptor is set"));
    }
    let dict_len = [0usize, 1, 2, 4][usize::from(descriptor & 3)];
    let fcs_len = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut pos = 5 + usize::from(!single_segment) + dict_len;
    need(data, pos + fcs_len)?;
    let content_size = match fcs_len {
        0 => None,
        2 => Some(le(&data[pos..pos + 2]) + 256),
        n => Some(le(&data[pos..pos + n])),
    };
    let window = if single_segment {
        content_size.unwrap_or(0)
    } else {
        // Exponent and mantissa: (1 << log) plus eighths of it.
        let byte = data[5];
        let log = u32::from(byte >> 3) + 10;
        if log > MAX_WINDOW_LOG {
            return Err(FrameError::Corrupt("window larger than libzstd's limit (2^31 bytes)"));
        }
        (1u64 << log) + (1u64 << log) / 8 * u64::from(byte & 7)
    };
    let dict_id = le(&data[pos - dict_len..pos]);
    pos += fcs_len;
    let checksum = descriptor & CHECKSUM_FLAG != 0;
    let block_max = window.min(u64::from(MAX_BLOCK)) as usize;
    Ok(Some(Header { len: pos, checksum, dict_id, content_size, block_max }))
}

/// Where a block lies and, for a compressed one, its header parts (for the corruption sweep).
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSpan {
    /// Offset of the block header in the chunk.
    pub offset: usize,
    /// Bytes after the 3-byte block header.
    pub len: usize,
    /// For a compressed block: header bytes at the start of the literals section, the literals
    /// section's length, and header bytes at the start of the sequences section.
    pub heads: Option<(usize, usize, usize)>,
}

/// Walks the blocks of the first frame; returns where the frame ends.
fn walk(data: &[u8], header: &Header, bound: u64, spans: &mut Vec<BlockSpan>) -> Result<usize, FrameError> {
    let mut entropy = if header.dict_id != 0 { Entropy::from_dictionary() } else { Entropy::default() };
    let (mut pos, mut min, mut max) = (header.len, 0u64, 0u64);
    for index in 0.. {
        need(data, pos + 3)?;
        let word = le(&data[pos..pos + 3]) as u32;
        let size = word >> 3;
        let flaw = |Flaw(part, what)| FrameError::Block { block: index, offset: pos, part, what };
        let payload = match (word >> 1) & 3 {
            0 | 2 => size as usize, // raw, compressed
            1 => 1,                 // RLE: one byte repeated `size` times
            _ => return Err(flaw(Flaw("block header", "reserved block type"))),
        };
        if size > MAX_BLOCK {
            return Err(flaw(Flaw("block header", "block larger than 128 KiB")));
        }
        need(data, pos + 3 + payload)?;
        let body = &data[pos + 3..pos + 3 + payload];
        let mut span = BlockSpan { offset: pos, len: payload, heads: None };
        if (word >> 1) & 3 == 2 {
            let b = compressed_block(body, header.block_max, bound - min, &mut entropy).map_err(flaw)?;
            span.heads = Some((b.literals_head, b.literals, b.sequences_head));
            min += b.min;
            max = max.saturating_add(b.max);
        } else {
            min += u64::from(size);
            max = max.saturating_add(u64::from(size));
            if min > bound {
                return Err(flaw(Flaw("block size", "blocks decode to more than the frame's content size")));
            }
        }
        spans.push(span);
        pos += 3 + payload;
        if word & 1 != 0 {
            break;
        }
    }
    if header.content_size.is_some_and(|size| max < size) {
        return Err(FrameError::Corrupt("the blocks cannot decode to the frame's content size"));
    }
    Ok(pos + if header.checksum { 4 } else { 0 })
}

/// The blocks of the chunk's first frame, for measuring which bytes are headers.
#[doc(hidden)]
pub fn frame_layout(data: &[u8], expected: u64) -> Result<Vec<BlockSpan>, FrameError> {
    let mut spans = Vec::new();
    if let Some(h) = header(data)? {
        walk(data, &h, h.content_size.unwrap_or(expected), &mut spans)?;
    }
    Ok(spans)
}

/// Check that `data` is one zstd frame of `expected` decoded bytes.
///
/// # Errors
/// Returns a [`FrameError`] for bytes that are not valid zstd of that size.
pub fn check_frame(data: &[u8], expected: u64) -> Result<FrameVerdict, FrameError> {
    if data.is_empty() {
        // No frame at all is zero bytes to libzstd; the host path decides.
        return Ok(FrameVerdict::Host("the chunk is empty"));
    }
    let Some(header) = header(data)? else {
        return Ok(FrameVerdict::Host("the chunk starts with a skippable frame"));
    };
    // Without a recorded size, the first frame can still not hold more than the whole chunk.
    let pos = walk(data, &header, header.content_size.unwrap_or(expected), &mut Vec::new())?;
    need(data, pos)?;
    let more = pos != data.len();
    match header.content_size {
        // More frames may follow a smaller first one; a larger one can never fit.
        Some(found) if found > expected || (found < expected && !more) => {
            return Err(FrameError::SizeMismatch { expected, found })
        }
        Some(_) => {}
        None => return Ok(FrameVerdict::Host("the frame does not record its content size")),
    }
    if header.dict_id != 0 {
        return Ok(FrameVerdict::Host("the frame needs a dictionary"));
    }
    if more {
        return Ok(FrameVerdict::Host("the chunk holds several frames"));
    }
    Ok(FrameVerdict::Device { checksum: header.checksum })
}

/// Marks `frame` as carrying a content checksum: sets the Content_Checksum_flag (bit 2 of the
/// Frame_Header_Descriptor, RFC 8878). The caller appends the checksum, the low 32 bits of the
/// XXH64 (seed 0) of the `content_len` decoded bytes, little endian, right after `frame`.
///
/// `frame` must be exactly one zstd frame without a checksum or a dictionary, as nvCOMP and
/// libzstd write them (a Window_Descriptor or Single_Segment header, any Frame_Content_Size
/// width); its block headers are walked (not their payload) to check that its last block ends
/// where `frame` does.
///
/// # Errors
/// Returns a [`FrameError`] for anything else (nothing is changed then).
pub(crate) fn flag_content_checksum(frame: &mut [u8], content_len: u64) -> Result<(), FrameError> {
    let header = header(frame)?.ok_or(FrameError::Corrupt("a skippable frame, not one to add a checksum to"))?;
    if header.checksum {
        return Err(FrameError::Corrupt("the frame has a content checksum already"));
    }
    if header.dict_id != 0 {
        return Err(FrameError::Corrupt("the frame names a dictionary"));
    }
    if let Some(found) = header.content_size.filter(|&found| found != content_len) {
        return Err(FrameError::SizeMismatch { expected: content_len, found });
    }
    let mut pos = header.len;
    for block in 0.. {
        need(frame, pos + 3)?;
        let word = le(&frame[pos..pos + 3]) as u32;
        let size = word >> 3;
        let flaw = |what| FrameError::Block { block, offset: pos, part: "block header", what };
        let payload = match (word >> 1) & 3 {
            0 | 2 => size as usize,
            1 => 1,
            _ => return Err(flaw("reserved block type")),
        };
        if size > MAX_BLOCK {
            return Err(flaw("block larger than 128 KiB"));
        }
        pos += 3 + payload;
        need(frame, pos)?;
        if word & 1 != 0 {
            break;
        }
    }
    if pos != frame.len() {
        return Err(FrameError::Corrupt("bytes follow the frame's last block"));
    }
    frame[4] |= CHECKSUM_FLAG;
    Ok(())
}

/// The Content_Checksum_flag of the Frame_Header_Descriptor.
const CHECKSUM_FLAG: u8 = 0x04;

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
        for cut in [1, 3, 4, 5, 9, frame.len() / 2, frame.len() - 1] {
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

    fn compress(raw: &[u8], level: i32, checksum: bool) -> Vec<u8> {
        let mut encoder = zstd::bulk::Compressor::new(level).unwrap();
        encoder.include_checksum(checksum).unwrap();
        encoder.compress(raw).unwrap()
    }

    /// Chunks of several kinds: repetitive, random, a smooth float field, text.
    fn kinds(n: usize) -> Vec<Vec<u8>> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut random = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let noise: Vec<u8> = (0..n).map(|_| random() as u8).collect();
        let floats: Vec<u8> =
            (0..n / 4).flat_map(|i| ((i as f32 * 0.01).sin() + (random() % 100) as f32 * 1e-4).to_le_bytes()).collect();
        let words = ["zarr ", "chunk ", "gpu ", "decode ", "frame\n"];
        let text: Vec<u8> = (0..).flat_map(|_| words[random() as usize % words.len()].bytes()).take(n).collect();
        vec![data(n), noise, floats, text, vec![7; n]]
    }

    #[test]
    fn valid_frames_of_every_kind_and_level_are_accepted() {
        for n in [0usize, 1, 5, 100, 4096, 70_000, 1 << 20] {
            for raw in kinds(n) {
                for level in [-7, -1, 1, 3, 9, 19] {
                    if n == 1 << 20 && level == 19 {
                        continue; // slow in debug builds, covered by the sweep in release
                    }
                    for checksum in [false, true] {
                        let frame = compress(&raw, level, checksum);
                        let verdict = check_frame(&frame, raw.len() as u64);
                        assert_eq!(verdict, Ok(FrameVerdict::Device { checksum }), "{n} bytes at level {level}");
                    }
                }
            }
        }
    }

    /// A frame of one compressed block with `body`, recording `size` content bytes.
    fn frame_of(body: &[u8], size: u32) -> Vec<u8> {
        let word = (body.len() as u32) << 3 | 2 << 1 | 1;
        // A 1 KiB window and a 4-byte content size (a single-segment frame's window is its size).
        let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 0];
        frame.extend_from_slice(&size.to_le_bytes());
        frame.extend_from_slice(&word.to_le_bytes()[..3]);
        frame.extend_from_slice(body);
        frame
    }

    /// Raw literals "abcd", then one sequence (RLE codes: literal length 4, offset code 2 with
    /// two zero bits, i.e. offset 1, match length 3): "abcdddd".
    const BLOCK: [u8; 11] = [0x20, b'a', b'b', b'c', b'd', 1, 0x54, 4, 2, 0, 0x04];

    /// `check_frame` rejects `frame` naming `what`, and libzstd rejects it too.
    fn rejects(frame: &[u8], size: u64, what: &str) {
        let err = check_frame(frame, size).unwrap_err();
        assert!(err.to_string().contains(what), "expected {what:?}, got {err}");
        assert!(zstd::bulk::decompress(frame, size as usize).is_err(), "libzstd accepts what we reject: {err}");
    }

    #[test]
    fn crafted_block_and_its_sequence_header_corruptions() {
        let frame = frame_of(&BLOCK, 7);
        assert_eq!(zstd::bulk::decompress(&frame, 7).unwrap(), b"abcdddd");
        assert_eq!(check_frame(&frame, 7), Ok(FrameVerdict::Device { checksum: false }));
        let with = |i: usize, byte: u8| {
            let mut block = BLOCK;
            block[i] = byte;
            frame_of(&block, 7)
        };
        rejects(&with(6, 0x55), 7, "sequences header: reserved bits");
        rejects(&with(7, 36), 7, "literal length table: RLE code above 35");
        rejects(&with(8, 32), 7, "offset table: RLE code above 31");
        rejects(&with(9, 53), 7, "match length table: RLE code above 52");
        rejects(&with(6, 0xD4), 7, "literal length table: repeat mode without an earlier table");
        rejects(&with(10, 0), 7, "sequences bitstream: no end mark");
        rejects(&with(5, 100), 7, "block decodes to more than the frame's content size");
        rejects(&with(0, 0x40), 7, "literals header: more literals than the frame's content size leaves");
        let mut block = BLOCK;
        block[0] = 0xF8; // 31 raw literals
        rejects(&frame_of(&block, 200), 200, "literals header: literals run past the block");
        block[0] = 0x22; // compressed literals, sizes from the next bytes
        rejects(&frame_of(&block, 1000), 1000, "literals header: compressed literals run past the block");
        // Predefined tables need 17 bits for their initial states.
        rejects(&frame_of(&[0x20, b'a', b'b', b'c', b'd', 1, 0, 0x04], 7), 7, "sequences bitstream: too short");
        // An FSE table with an accuracy log of 5 + 15 bits.
        rejects(&frame_of(&[0x20, b'a', b'b', b'c', b'd', 1, 0x80, 0x0F, 0, 0x04], 7), 7, "accuracy log");
        // No sequences, but bytes after the count.
        rejects(&frame_of(&[0x20, b'a', b'b', b'c', b'd', 0, 0], 4), 4, "bytes after an empty sequences section");
        // Four literals and no sequences cannot make the 7 bytes the frame records.
        rejects(&frame_of(&[0x20, b'a', b'b', b'c', b'd', 0], 7), 7, "cannot decode to the frame's content size");
        // A compressed block with fewer bytes than any block needs, or more than the window.
        rejects(&frame_of(&[0x00], 0), 0, "compressed block shorter than 2 bytes");
        let mut single_segment = vec![0x28, 0xB5, 0x2F, 0xFD, 0x20, 7, 0x5D, 0, 0];
        single_segment.extend_from_slice(&BLOCK);
        rejects(&single_segment, 7, "compressed block larger than the window");
    }

    #[test]
    fn corrupt_literals_sections_of_real_frames() {
        // Skewed bytes: little to match, much to Huffman-code.
        let raw: Vec<u8> = kinds(60_000)[1].iter().map(|b| (b % 16) * (b / 64)).collect();
        let frame = compress(&raw, 3, false);
        let spans = frame_layout(&frame, raw.len() as u64).unwrap();
        let first = &spans[0];
        let (lit_head, _, _) = first.heads.unwrap();
        let body = first.offset + 3;
        assert_eq!(frame[body] & 3, 2, "compressed literals");
        let format = usize::from((frame[body] >> 2) & 3);
        assert!(format > 0, "four streams");
        let h = [3, 3, 4, 5][format]; // the literals header's bytes; the tree follows
        let n = raw.len() as u64;
        let with = |edits: &[(usize, u8)]| {
            let mut bad = frame.clone();
            for &(i, b) in edits {
                bad[body + i] = b;
            }
            bad
        };
        // Treeless literals in the first block.
        rejects(&with(&[(0, frame[body] | 3)]), n, "treeless literals without an earlier Huffman tree");
        // One direct weight of zero: no tree.
        rejects(&with(&[(h, 128), (h + 1, 0)]), n, "Huffman tree: Huffman weights all zero");
        // Two direct weights of 3 and 1: no last weight can complete the tree.
        rejects(&with(&[(h, 129), (h + 1, 0x31)]), n, "Huffman tree: Huffman weights do not complete a tree");
        // A first stream longer than the literals.
        let jump = lit_head - 6;
        rejects(&with(&[(jump, 0xFF), (jump + 1, 0xFF)]), n, "jump table: literal streams run past the literals");
        // Reserved block type, and a window beyond libzstd's limit.
        let mut reserved = frame.clone();
        reserved[first.offset] |= 6;
        rejects(&reserved, n, "block header: reserved block type");
    }

    /// Inputs the fuzz targets found (fuzz/fuzz_targets/zstd_frame.rs), kept as regressions.
    #[test]
    fn fuzz_findings() {
        // No bytes: zero frames, which libzstd decodes to zero bytes.
        assert_eq!(check_frame(&[], 0), Ok(FrameVerdict::Host("the chunk is empty")));
        assert_eq!(zstd::bulk::decompress(&[], 0).unwrap(), b"");
    }

    #[test]
    fn window_descriptor_beyond_libzstd_limit() {
        let raw = data(300_000);
        let mut frame = Vec::new();
        let mut encoder = zstd::stream::Encoder::new(&mut frame, 3).unwrap();
        std::io::Write::write_all(&mut encoder, &raw).unwrap();
        encoder.finish().unwrap();
        assert_eq!(frame[4] & 0x20, 0, "not single segment: the window is described");
        let mut bad = frame.clone();
        bad[5] = 22 << 3; // window log 32
        let err = check_frame(&bad, raw.len() as u64).unwrap_err();
        assert_eq!(err, FrameError::Corrupt("window larger than libzstd's limit (2^31 bytes)"));
        assert!(zstd::stream::decode_all(&bad[..]).is_err());
    }

    /// `frame` with a content checksum added as the device writer adds it: the flag set, the low
    /// 32 bits of XXH64 (here twox-hash's, on the CPU) appended little endian.
    fn with_checksum(frame: &[u8], raw: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut out = frame.to_vec();
        flag_content_checksum(&mut out, raw.len() as u64)?;
        out.extend_from_slice(&(twox_hash::XxHash64::oneshot(0, raw) as u32).to_le_bytes());
        Ok(out)
    }

    /// A frame written by libzstd's streaming encoder, which records no content size (a
    /// Window_Descriptor header, no Frame_Content_Size).
    fn streamed(raw: &[u8], level: i32, checksum: bool) -> Vec<u8> {
        let mut frame = Vec::new();
        let mut encoder = zstd::stream::Encoder::new(&mut frame, level).unwrap();
        encoder.include_checksum(checksum).unwrap();
        std::io::Write::write_all(&mut encoder, raw).unwrap();
        encoder.finish().unwrap();
        frame
    }

    #[test]
    fn content_checksums_added_to_frames_equal_libzstds_and_verify() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(8878);
        let noise: Vec<u8> = (0..200_000).map(|_| rng.random()).collect();
        // Sizes for every Frame_Content_Size width a chunk has (1, 2 and 4 bytes; none when
        // streamed), single segment and windowed, compressible and not, empty.
        let contents: Vec<Vec<u8>> =
            vec![vec![], data(1), data(255), data(256), data(70_000), data(65_791), noise, data(3 << 20)];
        let mut forms = std::collections::BTreeSet::new();
        for raw in &contents {
            // Level 19 on the 3 MiB one would take long in a debug build.
            let levels: &[i32] = if raw.len() > 1 << 20 { &[-5, 1] } else { &[-5, 1, 3, 19] };
            for &level in levels {
                let what = format!("{} bytes at level {level}", raw.len());
                for (plain, checked) in [
                    (compress(raw, level, false), compress(raw, level, true)),
                    (streamed(raw, level, false), streamed(raw, level, true)),
                ] {
                    forms.insert((plain[4] & 0x20 != 0, plain[4] >> 6));
                    let patched = with_checksum(&plain, raw).unwrap();
                    assert!(patched == checked, "{what}: not libzstd's frame with its checksum");
                    // libzstd verifies the checksum where the flag is set.
                    assert!(zstd::stream::decode_all(&patched[..]).unwrap() == *raw, "{what}");
                    let mut wrong = patched.clone();
                    *wrong.last_mut().unwrap() ^= 1;
                    assert!(zstd::stream::decode_all(&wrong[..]).is_err(), "{what}: a wrong checksum decodes");
                    // The read path's check takes it and finds the checksum.
                    if plain[4] >> 6 != 0 || plain[4] & 0x20 != 0 {
                        let verdict = check_frame(&patched, raw.len() as u64);
                        assert_eq!(verdict, Ok(FrameVerdict::Device { checksum: true }), "{what}");
                    }
                }
            }
        }
        // Single segment with content sizes of 1, 2 and 4 bytes; windowed with none (streamed)
        // and with 4 bytes (3 MiB, more than levels -5 and 1's window).
        let want = [(false, 0), (false, 2), (true, 0), (true, 1), (true, 2)];
        assert!(want.iter().all(|f| forms.contains(f)), "header forms met: {forms:?}");
    }

    #[test]
    fn frames_that_cannot_take_a_checksum_are_refused_unchanged() {
        let raw = data(100_000);
        let frame = compress(&raw, 3, false);
        let refused = |bytes: &[u8], len: u64| -> FrameError {
            let mut copy = bytes.to_vec();
            let err = flag_content_checksum(&mut copy, len).unwrap_err();
            assert_eq!(copy, bytes, "changed although refused: {err}");
            err
        };
        let n = raw.len() as u64;
        assert_eq!(
            refused(&compress(&raw, 3, true), n),
            FrameError::Corrupt("the frame has a content checksum already")
        );
        assert_eq!(refused(&frame, n + 1), FrameError::SizeMismatch { expected: n + 1, found: n });
        let mut magic = frame.clone();
        magic[0] ^= 0xFF;
        assert!(matches!(refused(&magic, n), FrameError::BadMagic(_)));
        let skippable = [&0x184D_2A50u32.to_le_bytes()[..], &4u32.to_le_bytes(), &[0; 4]].concat();
        assert!(matches!(refused(&skippable, 0), FrameError::Corrupt(_)));
        // Bytes after the last block (another frame, a checksum already appended), and a frame
        // cut short.
        let two = [&frame[..], &frame].concat();
        assert_eq!(refused(&two, n), FrameError::Corrupt("bytes follow the frame's last block"));
        assert_eq!(
            refused(&[&frame[..], &[1, 2, 3, 4]].concat(), n),
            FrameError::Corrupt("bytes follow the frame's last block")
        );
        for cut in [3, 5, 6, frame.len() - 1] {
            assert!(matches!(refused(&frame[..cut], n), FrameError::Truncated { .. }), "cut at {cut}");
        }
        // A dictionary ID (one byte, 7) inserted after a single-segment header's descriptor.
        let small = compress(&data(100), 3, false);
        assert_eq!(small[4] & 0x23, 0x20, "single segment, no dictionary");
        let dict = [&small[..4], &[small[4] | 1, 7], &small[5..]].concat();
        assert_eq!(refused(&dict, 100), FrameError::Corrupt("the frame names a dictionary"));
        // A reserved block type, and a block over 128 KiB.
        let first = frame_layout(&frame, n).unwrap()[0].offset;
        let mut reserved = frame.clone();
        reserved[first] |= 6;
        assert!(matches!(refused(&reserved, n), FrameError::Block { what: "reserved block type", .. }));
        let mut huge = frame.clone();
        huge[first + 2] = 0xFF;
        assert!(matches!(refused(&huge, n), FrameError::Block { what: "block larger than 128 KiB", .. }));
    }
}
