//! Host-side checks of Blosc1 chunks before their streams reach nvCOMP, where malformed input is
//! undefined behaviour.
//!
//! # The format
//!
//! What c-blosc 1.x writes: the zarr v2 `blosc` compressor and the zarr v3 `blosc` codec (zarrs
//! decodes both with c-blosc 1.21.6, from blosc-src). A 16-byte header: the format version (2),
//! the compressor's format version (1), flags (bit 0 byte shuffle, bit 1 memcpyed, bit 2 bit
//! shuffle, bit 3 reserved, bit 4 "don't split", bits 5 to 7 the compressor: 0 blosclz, 1 lz4 or
//! lz4hc, 2 snappy, 3 zlib, 4 zstd), the typesize, then three little-endian `i32`: the decoded
//! size (`nbytes`), the block size and the stored size with the header (`cbytes`).
//!
//! A memcpyed chunk holds the decoded bytes right after the header, unshuffled. Otherwise the
//! header is followed by one `i32` start per block (`ceil(nbytes / blocksize)` blocks, the last
//! one shorter when the size leaves a remainder), and each block by its streams: each an `i32`
//! compressed size, then that many bytes. A stream whose compressed size equals its decoded size
//! is stored as it is; any other is one compressor stream (an LZ4 block, a zstd frame, a zlib
//! stream, ...). The streams of a block decode, one after the other, into the block's shuffled
//! bytes, which are then unshuffled (byte or bit shuffle by the typesize) into the output.
//!
//! A block is split into `typesize` streams of `blocksize / typesize` bytes when, as c-blosc's
//! decoder decides (`blosc_d` in blosc/blosc.c, the condition marked "for compatibility with
//! before the introduction of the split flag"): the "don't split" flag is clear, the typesize is
//! at most 16 (`MAX_SPLITS`), `blocksize / typesize` is at least 128 (`MIN_BUFFERSIZE`), and the
//! block is not the short last one. Otherwise a block is one stream. (Its writer, `split_block`,
//! sets the flag from the same size rule and, by default, splits for every compressor but zstd.)
//!
//! # What is checked
//!
//! Everything c-blosc's decoder relies on, without overflow: the header's sizes (`cbytes` is the
//! stored chunk's length exactly, not at most: zarrs calls `blosc_cbuffer_validate` with the
//! chunk's length, which asks for equality; `nbytes` is the expected decoded size and within
//! Blosc's limit; a block size that is positive, within the decoded size and Blosc's limit; a
//! typesize of at least 1; a memcpyed chunk's `cbytes` is `nbytes + 16`), the block starts'
//! table within the stored bytes and every start within them, each stream's size field and
//! bytes within the chunk, no empty stream, blocks that split into equal streams; then the
//! layout c-blosc writes: blocks (in any order, as its threads write them) that tile the bytes
//! after the starts table exactly, without gaps or overlaps, none starting inside the header or
//! the table. Streams of a block are contiguous by construction (each starts where the last
//! ended) and decode into consecutive parts of the block.
//!
//! Then every compressed stream is checked as for a chunk of its own: an LZ4 block with
//! [`crate::lz4_block::check_block`], a zstd frame with [`crate::zstd_frame::check_frame`], a
//! zlib stream's 2-byte header (deflate, a window of at most 32 KiB, no preset dictionary) and
//! length. The device decodes the deflate stream inside it ([`BloscChunk::payload`]); its
//! Adler-32 is not verified.
//!
//! # Errors and the host
//!
//! An error ([`BloscError`]) is a chunk c-blosc, as zarrs calls it, also rejects (a split that
//! leaves bytes over makes c-blosc return fewer bytes than the chunk's size, which zarrs refuses
//! too; an LZ4 match offset of 0 is the exception, see [`crate::lz4_block`]). A chunk that is
//! valid, or that c-blosc may decode, but that the device path does not take, is a host verdict
//! with the reason, and zarrs' own codec decides: format or compressor versions other than those
//! c-blosc 1.x writes, the reserved flag, an unknown compressor, both shuffles at once, a layout
//! c-blosc accepts but never writes (gaps, overlaps, a block starting in the header), blosclz and
//! snappy streams (nvCOMP has no decoder for them), LZ4 blocks that break only the end-of-block
//! rules, zstd frames [`check_frame`] sends to the host or that carry a checksum, and an empty
//! chunk.
//!
//! The work is linear in the stored bytes (the LZ4 walks; header-deep for zstd); what it
//! allocates is the stream list and one entry per block, sorted, for the layout.

use std::borrow::Cow;
use std::ops::Range;

use crate::codecs::lz4::block::{check_block, Lz4Error};
use crate::codecs::zlib::{self, stream::StreamVerdict};
use crate::codecs::zstd::frame::{check_frame, FrameError, FrameVerdict};

/// Bytes of a Blosc1 header.
pub const HEADER_LEN: usize = 16;
/// The format version c-blosc 1.x writes and reads (`BLOSC_VERSION_FORMAT`).
pub(crate) const FORMAT_VERSION: u8 = 2;
/// The compressor format version of every compressor in c-blosc 1.x.
pub(crate) const COMPRESSOR_VERSION: u8 = 1;
pub(crate) const DOSHUFFLE: u8 = 0x01;
pub(crate) const MEMCPYED: u8 = 0x02;
pub(crate) const DOBITSHUFFLE: u8 = 0x04;
const RESERVED: u8 = 0x08;
pub(crate) const DONT_SPLIT: u8 = 0x10;
/// Blocks split into at most this many streams (`MAX_SPLITS`).
const MAX_SPLITS: usize = 16;
/// Split streams are at least this long (`MIN_BUFFERSIZE`).
const MIN_BUFFERSIZE: usize = 128;
/// The largest decoded size (`BLOSC_MAX_BUFFERSIZE`).
const MAX_BUFFERSIZE: u64 = i32::MAX as u64 - HEADER_LEN as u64;
/// The largest block (`BLOSC_MAX_BLOCKSIZE`).
const MAX_BLOCKSIZE: u64 = (i32::MAX as u64 - 255 * 4) / 3;

/// The 16-byte header of a Blosc1 chunk, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BloscHeader {
    /// The format version (2 for c-blosc 1.x).
    pub version: u8,
    /// The compressor's format version (1).
    pub versionlz: u8,
    /// The flags byte.
    pub flags: u8,
    /// The typesize: bytes per element, for shuffling and splitting.
    pub typesize: u8,
    /// The decoded size.
    pub nbytes: u32,
    /// Bytes per block (the last block may be shorter).
    pub blocksize: u32,
    /// The stored size, header included.
    pub cbytes: u32,
}

impl BloscHeader {
    /// Reads the header at the start of `data`.
    ///
    /// # Errors
    /// [`BloscError::Truncated`] for fewer than 16 bytes.
    pub fn parse(data: &[u8]) -> Result<Self, BloscError> {
        let Some(h) = data.first_chunk::<HEADER_LEN>() else {
            return Err(BloscError::Truncated { needed: HEADER_LEN, len: data.len() });
        };
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        Ok(Self {
            version: h[0],
            versionlz: h[1],
            flags: h[2],
            typesize: h[3],
            nbytes: word(4),
            blocksize: word(8),
            cbytes: word(12),
        })
    }

    /// The compressor the flags name.
    pub fn compressor(&self) -> Compressor {
        match self.flags >> 5 {
            0 => Compressor::BloscLz,
            1 => Compressor::Lz4,
            2 => Compressor::Snappy,
            3 => Compressor::Zlib,
            4 => Compressor::Zstd,
            code => Compressor::Unknown(code),
        }
    }

    /// Whether the chunk holds its decoded bytes as they are (the memcpyed flag).
    pub fn memcpyed(&self) -> bool {
        self.flags & MEMCPYED != 0
    }
}

/// The compressor of a chunk's streams (bits 5 to 7 of the flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressor {
    /// blosclz: no device decoder.
    BloscLz,
    /// LZ4 blocks (written by lz4 or lz4hc).
    Lz4,
    /// Snappy: no device decoder.
    Snappy,
    /// zlib streams (RFC 1950: a 2-byte header, deflate, an Adler-32).
    Zlib,
    /// zstd frames.
    Zstd,
    /// A code c-blosc 1.x does not know.
    Unknown(u8),
}

/// How a block's decoded bytes are unshuffled into the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// They are the output.
    None,
    /// Byte shuffle by the typesize: the first bytes of every element, then the second, ...;
    /// bytes past the last whole element are stored as they are.
    Byte,
    /// Bit shuffle by the typesize: bitshuffle's transpose of the block's elements (a multiple
    /// of 8) as a matrix of bits; bytes past the last whole element are stored as they are.
    Bit,
}

/// One stream of a chunk: where its bytes are, and where they decode to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    /// The block it belongs to.
    pub block: usize,
    /// Where its bytes start in the chunk (after its 4-byte size).
    pub src_offset: usize,
    /// Its stored length.
    pub src_len: usize,
    /// Where its decoded bytes start among the chunk's decoded (still shuffled) bytes: block
    /// `b` starts at `b * blocksize`.
    pub dst_offset: usize,
    /// Its decoded length.
    pub dst_len: usize,
    /// Whether it is stored as it is (a copy), not compressed.
    pub raw: bool,
}

/// A Blosc1 chunk whose layout checks out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BloscChunk {
    /// The header.
    pub header: BloscHeader,
    /// The compressor of the streams that are not raw.
    pub compressor: Compressor,
    /// Whether the chunk is its decoded bytes after the header (one raw stream per block, no
    /// unshuffling).
    pub memcpyed: bool,
    /// Whether full blocks are split into `typesize` streams.
    pub split: bool,
    /// Blocks in the chunk.
    pub nblocks: usize,
    /// Every stream, block by block, in decoded order.
    pub streams: Vec<Stream>,
    /// Where the blocks do not tile the stored bytes as c-blosc writes them (gaps, overlaps, a
    /// block starting in the header), though c-blosc would decode them: why.
    pub unusual_layout: Option<String>,
}

impl BloscChunk {
    /// Decoded bytes of block `block` (the last one may be short).
    pub fn block_len(&self, block: usize) -> usize {
        let (nbytes, blocksize) = (self.header.nbytes as usize, self.header.blocksize as usize);
        nbytes.saturating_sub(block.saturating_mul(blocksize)).min(blocksize)
    }

    /// How block `block` is unshuffled, as c-blosc does it: not at all in a memcpyed chunk; byte
    /// shuffle when flagged and the typesize is above 1; else bit shuffle when flagged and the
    /// block holds a nonzero multiple of 8 elements (c-blosc copies other blocks as they are).
    pub fn unshuffle(&self, block: usize) -> Shuffle {
        let (flags, typesize) = (self.header.flags, usize::from(self.header.typesize).max(1));
        let elements = self.block_len(block) / typesize;
        if self.memcpyed {
            Shuffle::None
        } else if flags & DOSHUFFLE != 0 && typesize > 1 {
            Shuffle::Byte
        } else if flags & DOBITSHUFFLE != 0 && elements > 0 && elements.is_multiple_of(8) {
            Shuffle::Bit
        } else {
            Shuffle::None
        }
    }

    /// The bytes of `stream` a device decoder takes: all of them, except for a zlib stream, the
    /// deflate stream between its 2-byte header and its 4-byte Adler-32.
    pub fn payload(&self, stream: &Stream) -> Range<usize> {
        let end = stream.src_offset + stream.src_len;
        if self.compressor == Compressor::Zlib && !stream.raw {
            let start = (stream.src_offset + 2).min(end);
            start..end.saturating_sub(4).max(start)
        } else {
            stream.src_offset..end
        }
    }
}

/// How a well-formed chunk is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BloscVerdict {
    /// Every stream checked: the device decodes them, then unshuffles.
    Device(BloscChunk),
    /// Decoded on the host by zarrs' blosc codec, which decides whether it is valid.
    Host(Cow<'static, str>),
}

/// A chunk that is not a valid Blosc1 chunk of the expected size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BloscError {
    /// The chunk ends before a structure it needs.
    #[error("truncated Blosc chunk: {needed} bytes needed, {len} present")]
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes present.
        len: usize,
    },
    /// Not the format version c-blosc 1.x writes ([`check_chunk`] leaves these to the host).
    #[error("not a Blosc1 chunk: format version {0}")]
    Version(u8),
    /// The header's stored size is not the chunk's.
    #[error("Blosc header records {cbytes} stored bytes, but the chunk holds {len}")]
    StoredSize {
        /// The header's `cbytes`.
        cbytes: u32,
        /// The chunk's length.
        len: usize,
    },
    /// The header's decoded size is not the chunk's.
    #[error("Blosc chunk holds {found} bytes but the chunk is {expected} bytes")]
    SizeMismatch {
        /// The chunk's decoded size.
        expected: u64,
        /// The header's `nbytes`.
        found: u64,
    },
    /// A header field out of range.
    #[error("corrupt Blosc header: {field} {value} {rule}")]
    Header {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The block starts run past the stored bytes.
    #[error("corrupt Blosc chunk: the starts of {nblocks} blocks end at byte {needed}, past the {len} stored bytes")]
    StartTable {
        /// Blocks in the chunk.
        nblocks: usize,
        /// Where the table ends.
        needed: usize,
        /// Bytes stored.
        len: usize,
    },
    /// Full blocks do not split into `typesize` equal streams.
    #[error("corrupt Blosc chunk: blocks of {blocksize} bytes do not split into {typesize} equal streams")]
    Split {
        /// The block size.
        blocksize: u32,
        /// The typesize.
        typesize: u8,
    },
    /// A block starts outside the stored bytes.
    #[error("corrupt Blosc chunk: block {block} starts at {start}, outside the {len} stored bytes")]
    BlockStart {
        /// The block.
        block: usize,
        /// Its recorded start.
        start: i32,
        /// Bytes stored.
        len: usize,
    },
    /// A stream is damaged.
    #[error("corrupt Blosc chunk: block {block}, stream {stream} at byte {offset}: {flaw}")]
    Stream {
        /// The block.
        block: usize,
        /// The stream in the block, from 0.
        stream: usize,
        /// Where the stream's size field starts.
        offset: usize,
        /// What is wrong.
        flaw: StreamFlaw,
    },
}

/// What is wrong with one stream.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamFlaw {
    /// Its 4-byte size runs past the stored bytes.
    #[error("its 4-byte size runs past the {len} stored bytes")]
    SizeField {
        /// Bytes stored.
        len: usize,
    },
    /// Its bytes run past the stored bytes, or its size is negative.
    #[error("its {size} bytes run past the {len} stored bytes")]
    PastEnd {
        /// Its recorded size.
        size: i32,
        /// Bytes stored.
        len: usize,
    },
    /// It is empty, which no compressor decodes to the block's bytes.
    #[error("an empty stream cannot decode to {0} bytes")]
    Empty(usize),
    /// A corrupt LZ4 block.
    #[error(transparent)]
    Lz4(Lz4Error),
    /// A corrupt zstd frame.
    #[error(transparent)]
    Zstd(FrameError),
    /// A corrupt zlib stream.
    #[error("zlib stream: {0}")]
    Zlib(&'static str),
}

fn header_error(field: &'static str, value: impl Into<u64>, rule: &'static str) -> BloscError {
    BloscError::Header { field, value: value.into(), rule }
}

/// Checks the header's sizes against the chunk's length and its expected decoded size.
fn check_sizes(h: &BloscHeader, len: usize, expected: u64) -> Result<(), BloscError> {
    if h.version != FORMAT_VERSION {
        return Err(BloscError::Version(h.version));
    }
    if usize::try_from(h.cbytes) != Ok(len) {
        return Err(BloscError::StoredSize { cbytes: h.cbytes, len });
    }
    if h.cbytes > i32::MAX as u32 {
        return Err(header_error("stored size", h.cbytes, "exceeds Blosc's limit of 2^31 - 1 bytes"));
    }
    if u64::from(h.nbytes) > MAX_BUFFERSIZE {
        return Err(header_error("decoded size", h.nbytes, "exceeds Blosc's limit of 2^31 - 17 bytes"));
    }
    if u64::from(h.nbytes) != expected {
        return Err(BloscError::SizeMismatch { expected, found: u64::from(h.nbytes) });
    }
    if h.nbytes == 0 {
        return Ok(()); // c-blosc stops here, having nothing to decode
    }
    if h.blocksize == 0 {
        return Err(header_error("blocksize", h.blocksize, "is not positive"));
    }
    if h.blocksize > h.nbytes {
        return Err(header_error("blocksize", h.blocksize, "exceeds the decoded size"));
    }
    if u64::from(h.blocksize) > MAX_BLOCKSIZE {
        return Err(header_error("blocksize", h.blocksize, "exceeds Blosc's limit"));
    }
    if h.typesize == 0 {
        return Err(header_error("typesize", h.typesize, "is not positive"));
    }
    if h.memcpyed() && u64::from(h.cbytes) != u64::from(h.nbytes) + HEADER_LEN as u64 {
        return Err(header_error(
            "stored size",
            h.cbytes,
            "is not the decoded size and the header, as a memcpyed chunk's is",
        ));
    }
    Ok(())
}

/// Reads the streams of block `block` into `streams`; returns the stored bytes the block spans.
fn block_streams(
    data: &[u8],
    chunk: &BloscChunk,
    block: usize,
    streams: &mut Vec<Stream>,
) -> Result<Range<usize>, BloscError> {
    let len = data.len();
    let at = HEADER_LEN + 4 * block;
    let start = i32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    let first = usize::try_from(start).ok().filter(|&s| s < len);
    let Some(mut pos) = first else { return Err(BloscError::BlockStart { block, start, len }) };
    let blocksize = chunk.header.blocksize as usize;
    let bsize = chunk.block_len(block);
    let splits = if chunk.split && bsize == blocksize { usize::from(chunk.header.typesize) } else { 1 };
    let neblock = bsize / splits;
    for stream in 0..splits {
        let flaw = |flaw| BloscError::Stream { block, stream, offset: pos, flaw };
        let Some(&size) = data.get(pos..).and_then(<[u8]>::first_chunk::<4>) else {
            return Err(flaw(StreamFlaw::SizeField { len }));
        };
        let size = i32::from_le_bytes(size);
        let past = flaw(StreamFlaw::PastEnd { size, len });
        let n = usize::try_from(size).map_err(|_| past.clone())?;
        if n > len - (pos + 4) {
            return Err(past);
        }
        if n == 0 {
            return Err(flaw(StreamFlaw::Empty(neblock)));
        }
        let dst_offset = block * blocksize + stream * neblock;
        streams.push(Stream {
            block,
            src_offset: pos + 4,
            src_len: n,
            dst_offset,
            dst_len: neblock,
            raw: n == neblock,
        });
        pos += 4 + n;
    }
    Ok(start as usize..pos)
}

/// Where blocks spanning `extents` (start, end, block) do not tile `table_end..len` exactly.
fn layout_oddity(extents: &mut [(usize, usize, usize)], table_end: usize, len: usize) -> Option<String> {
    extents.sort_unstable();
    let mut end = table_end;
    for &(start, stop, block) in extents.iter() {
        if start < table_end {
            return Some(format!(
                "block {block} starts at {start}, inside the header and block starts ({table_end} bytes)"
            ));
        }
        if start < end {
            return Some(format!("block {block} starts at {start}, inside the block before it (which ends at {end})"));
        }
        if start > end {
            return Some(format!("bytes {end}..{start} belong to no block"));
        }
        end = stop;
    }
    (end != len).then(|| format!("bytes {end}..{len} after the last block belong to no block"))
}

/// Parse the layout of `data`, a Blosc1 chunk of `expected` decoded bytes: its header and
/// every stream, with the checks of the module docs up to the layout (not the streams'
/// contents, nor what goes to the host).
///
/// # Errors
/// Returns a [`BloscError`] for a chunk c-blosc would reject, or another format version.
pub fn parse_chunk(data: &[u8], expected: u64) -> Result<BloscChunk, BloscError> {
    let header = BloscHeader::parse(data)?;
    check_sizes(&header, data.len(), expected)?;
    let mut chunk = BloscChunk {
        header,
        compressor: header.compressor(),
        memcpyed: header.memcpyed(),
        split: false,
        nblocks: 0,
        streams: Vec::new(),
        unusual_layout: None,
    };
    if header.nbytes == 0 {
        return Ok(chunk);
    }
    let (nbytes, blocksize, typesize) =
        (header.nbytes as usize, header.blocksize as usize, usize::from(header.typesize));
    chunk.nblocks = nbytes.div_ceil(blocksize);
    if chunk.memcpyed {
        chunk.streams = (0..chunk.nblocks)
            .map(|block| {
                let (at, len) = (block * blocksize, chunk.block_len(block));
                Stream { block, src_offset: HEADER_LEN + at, src_len: len, dst_offset: at, dst_len: len, raw: true }
            })
            .collect();
        return Ok(chunk);
    }
    chunk.split = header.flags & DONT_SPLIT == 0 && typesize <= MAX_SPLITS && blocksize / typesize >= MIN_BUFFERSIZE;
    if chunk.split && blocksize % typesize != 0 {
        return Err(BloscError::Split { blocksize: header.blocksize, typesize: header.typesize });
    }
    let table_end = chunk.nblocks.checked_mul(4).and_then(|t| t.checked_add(HEADER_LEN)).unwrap_or(usize::MAX);
    if table_end > data.len() {
        return Err(BloscError::StartTable { nblocks: chunk.nblocks, needed: table_end, len: data.len() });
    }
    let per_block = if chunk.split { typesize } else { 1 };
    // Every stream takes at least 5 stored bytes: no more than the chunk can hold.
    let mut streams = Vec::with_capacity((chunk.nblocks * per_block).min(data.len() / 5));
    let mut extents = Vec::with_capacity(chunk.nblocks);
    for block in 0..chunk.nblocks {
        let span = block_streams(data, &chunk, block, &mut streams)?;
        extents.push((span.start, span.end, block));
    }
    chunk.streams = streams;
    chunk.unusual_layout = layout_oddity(&mut extents, table_end, data.len());
    Ok(chunk)
}

/// Why a parsed chunk goes to the host, before its streams are looked at.
fn host_reason(chunk: &BloscChunk) -> Option<Cow<'static, str>> {
    let h = &chunk.header;
    if h.nbytes == 0 {
        return Some("the chunk is empty".into());
    }
    if let Some(why) = &chunk.unusual_layout {
        return Some(format!("a layout c-blosc does not write: {why}").into());
    }
    if chunk.memcpyed {
        return None;
    }
    if h.flags & DOSHUFFLE != 0 && h.flags & DOBITSHUFFLE != 0 {
        return Some("both byte and bit shuffle are flagged".into());
    }
    if let Compressor::Unknown(code) = chunk.compressor {
        return Some(format!("compressor code {code}, which c-blosc 1.x does not know").into());
    }
    if h.versionlz != COMPRESSOR_VERSION {
        return Some(format!("compressor format version {}, not c-blosc 1.x's 1", h.versionlz).into());
    }
    let name = match chunk.compressor {
        Compressor::BloscLz => "blosclz",
        Compressor::Snappy => "snappy",
        _ => return None,
    };
    chunk.streams.iter().any(|s| !s.raw).then(|| format!("{name} streams, which nvCOMP does not decode").into())
}

/// Checks a zlib stream's header and length (zlib rejects what fails here).
fn zlib_stream(bytes: &[u8]) -> Result<(), &'static str> {
    let &[cmf, flg, ..] = bytes else { return Err("shorter than its 2-byte header") };
    if (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
        return Err("header check fails");
    }
    if cmf & 0x0F != 8 {
        return Err("compression method is not deflate");
    }
    if cmf >> 4 > 7 {
        return Err("window larger than 32 KiB");
    }
    if flg & 0x20 != 0 {
        return Err("needs a preset dictionary");
    }
    if bytes.len() < 2 + 2 + 4 {
        return Err("too short for a deflate stream and its Adler-32");
    }
    Ok(())
}

/// Checks every compressed stream of a chunk of LZ4 (where `walk_lz4`), zstd or zlib streams;
/// returns why it goes to the host, if it does.
fn check_streams(data: &[u8], chunk: &BloscChunk, walk_lz4: bool) -> Result<Option<Cow<'static, str>>, BloscError> {
    let mut host: Option<Cow<'static, str>> = None;
    let (mut block, mut stream) = (usize::MAX, 0);
    for s in &chunk.streams {
        (block, stream) = if s.block == block { (block, stream + 1) } else { (s.block, 0) };
        if s.raw {
            continue;
        }
        let bytes = &data[s.src_offset..s.src_offset + s.src_len];
        let flaw = |flaw| BloscError::Stream { block, stream, offset: s.src_offset - 4, flaw };
        let why: Option<Cow<'static, str>> = match chunk.compressor {
            Compressor::Lz4 if !walk_lz4 => None,
            Compressor::Lz4 => match check_block(bytes, s.dst_len) {
                Ok(_) => None,
                Err(e) if e.is_restriction() => Some(format!("block {block}, stream {stream}: {e}").into()),
                Err(e) => return Err(flaw(StreamFlaw::Lz4(e))),
            },
            Compressor::Zstd => match check_frame(bytes, s.dst_len as u64) {
                Ok(FrameVerdict::Device { checksum: false }) => None,
                Ok(FrameVerdict::Device { checksum: true }) => Some("a zstd stream with a content checksum".into()),
                Ok(FrameVerdict::Host(why)) => Some(format!("block {block}, stream {stream}: {why}").into()),
                Err(e) => return Err(flaw(StreamFlaw::Zstd(e))),
            },
            Compressor::Zlib => {
                zlib_stream(bytes).map_err(|what| flaw(StreamFlaw::Zlib(what)))?;
                // The deflate stream's headers as zlib's own check reads them: what it doubts or
                // rejects, c-blosc decides on the host.
                match zlib::stream::check_stream(bytes, s.dst_len as u64) {
                    Ok(StreamVerdict::Device { .. }) => None,
                    Ok(StreamVerdict::Host(why)) => Some(format!("block {block}, stream {stream}: {why}").into()),
                    Err(e) => Some(format!("block {block}, stream {stream}: {e}").into()),
                }
            }
            _ => Some("streams of a compressor nvCOMP does not decode".into()),
        };
        if host.is_none() {
            host = why;
        }
    }
    Ok(host)
}

/// Check that `data` is one Blosc1 chunk of `expected` decoded bytes, and whether the device
/// decodes it.
///
/// # Errors
/// Returns a [`BloscError`] for a chunk that is not valid Blosc of that size (see the module
/// docs).
pub fn check_chunk(data: &[u8], expected: u64) -> Result<BloscVerdict, BloscError> {
    check_chunk_as(data, expected, true)
}

/// As [`check_chunk`], but LZ4 streams are walked only where `walk_lz4`: a decoder that checks
/// every LZ4 block by the walk's rules itself (ours: any input ends as a status) needs the
/// header and the layout checked, not the walk, which bounds bulk reads on the host.
///
/// # Errors
/// As [`check_chunk`]; without the walk, damage within an LZ4 stream is the decoder's to find.
pub fn check_chunk_as(data: &[u8], expected: u64, walk_lz4: bool) -> Result<BloscVerdict, BloscError> {
    let header = BloscHeader::parse(data)?;
    if header.version != FORMAT_VERSION {
        return Ok(BloscVerdict::Host(format!("Blosc format version {}, not Blosc1's 2", header.version).into()));
    }
    if header.flags & RESERVED != 0 {
        return Ok(BloscVerdict::Host("the reserved flag (bit 3) is set".into()));
    }
    let chunk = parse_chunk(data, expected)?;
    if let Some(why) = host_reason(&chunk) {
        return Ok(BloscVerdict::Host(why));
    }
    if let Some(why) = check_streams(data, &chunk, walk_lz4)? {
        return Ok(BloscVerdict::Host(why));
    }
    Ok(BloscVerdict::Device(chunk))
}

#[cfg(test)]
mod tests;
