//! The sections of a compressed block (RFC 8878 section 3.1.1.3): literals and sequences
//! headers, Huffman and FSE table descriptions, and the ends of the bitstreams. Payloads are not
//! decoded; each rule is one libzstd applies, so a rejected block is one libzstd rejects.

use super::fse::{fse_weights, highbit, read_counts, tree_log, BackBits, Counts, Stop};

/// The longest match one sequence can ask for (match length code 52: 65539 + 16 bits).
const MAX_MATCH: u64 = 65_539 + 0xFFFF;
/// Extra bits of literal length codes 16..=35 (codes below 16 have none).
const LL_EXTRA: [u8; 20] = [1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
/// Extra bits of match length codes 32..=52 (codes below 32 have none).
const ML_EXTRA: [u8; 21] = [1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

/// What the bitstream must hold for one of the three sequence codes' tables.
#[derive(Clone, Copy, Default)]
pub(super) struct Table {
    /// Bits read to set the initial state.
    log: u32,
    /// Fewest bits one state update reads.
    update: u32,
    /// Fewest extra bits one code reads.
    extra: u32,
}

/// The three kinds of sequence codes: literal length, offset, match length.
struct Code {
    name: &'static str,
    rle_too_large: &'static str,
    max: usize,
    max_log: u32,
    /// The predefined distribution's table (RFC 8878 3.1.1.3.2.2): accuracy log, and its largest
    /// count's state updates.
    predefined: Table,
}

const CODES: [Code; 3] = [
    Code {
        name: "literal length table",
        rle_too_large: "RLE code above 35",
        max: 35,
        max_log: 9,
        predefined: Table { log: 6, update: 4, extra: 0 },
    },
    Code {
        name: "offset table",
        rle_too_large: "RLE code above 31",
        max: 31,
        max_log: 8,
        predefined: Table { log: 5, update: 4, extra: 0 },
    },
    Code {
        name: "match length table",
        rle_too_large: "RLE code above 52",
        max: 52,
        max_log: 9,
        predefined: Table { log: 6, update: 4, extra: 0 },
    },
];

fn extra_bits(code: usize, symbol: usize) -> u32 {
    let table: &[u8] = match code {
        0 => return u32::from(*symbol.checked_sub(16).and_then(|i| LL_EXTRA.get(i)).unwrap_or(&0)),
        1 => return symbol as u32,
        _ => &ML_EXTRA,
    };
    u32::from(*symbol.checked_sub(32).and_then(|i| table.get(i)).unwrap_or(&0))
}

/// A damaged part of a block: which part, and what is wrong with it.
#[derive(Debug)]
pub(super) struct Flaw(pub(super) &'static str, pub(super) &'static str);

fn part(name: &'static str) -> impl Fn(&'static str) -> Flaw {
    move |what| Flaw(name, what)
}

/// Tables and Huffman trees that later blocks of the same frame may repeat.
#[derive(Default)]
pub(super) struct Entropy {
    /// The last Huffman tree's longest code (0: a tree whose depth is unknown).
    huffman: Option<u32>,
    /// The last block with sequences' tables, for Repeat mode.
    tables: Option<[Table; 3]>,
}

impl Entropy {
    /// A frame with a dictionary may repeat the dictionary's tables, which we do not see.
    pub(super) fn from_dictionary() -> Self {
        Self { huffman: Some(0), tables: Some([Table::default(); 3]) }
    }
}

/// Bytes of a compressed block: what the header parts take and what the block decodes to.
pub(super) struct Block {
    /// Regenerated size bounds.
    pub(super) min: u64,
    pub(super) max: u64,
    /// Header bytes: the literals section's (header, tree, jump table), its total, then the
    /// sequences section's header and tables. The rest is entropy-coded payload.
    pub(super) literals_head: usize,
    pub(super) literals: usize,
    pub(super) sequences_head: usize,
}

/// Checks a compressed block of a frame whose blocks hold at most `block_max` bytes and that
/// has at most `room` bytes of content left.
pub(super) fn compressed_block(
    block: &[u8],
    block_max: usize,
    room: u64,
    entropy: &mut Entropy,
) -> Result<Block, Flaw> {
    let size_flaw = part("block size");
    if block.len() < 2 {
        return Err(size_flaw("compressed block shorter than 2 bytes"));
    }
    if block.len() > block_max {
        return Err(size_flaw("compressed block larger than the window or 128 KiB"));
    }
    let (literals_head, literals, size) = literals(block, block_max, room, entropy)?;
    let rest = block.get(literals..).unwrap_or_default();
    let (count, head) = sequence_count(rest).map_err(part("sequences header"))?;
    // Every sequence copies a match of 3 bytes or more after the block's literals.
    let min = size as u64 + 3 * count as u64;
    if min > room {
        return Err(size_flaw("block decodes to more than the frame's content size"));
    }
    if min > block_max as u64 {
        return Err(size_flaw("block decodes to more than the window or 128 KiB"));
    }
    let sequences_head = match sequences(rest.get(head..).unwrap_or_default(), count, entropy)? {
        Some(tables) => head + tables,
        None => rest.len(),
    };
    let max = size as u64 + count as u64 * MAX_MATCH;
    Ok(Block { min, max, literals_head, literals, sequences_head })
}

/// The literals section: returns (header bytes, section bytes, regenerated size).
fn literals(block: &[u8], block_max: usize, room: u64, entropy: &mut Entropy) -> Result<(usize, usize, usize), Flaw> {
    let flaw = part("literals header");
    let b0 = block[0];
    let (kind, format) = (b0 & 3, (b0 >> 2) & 3);
    let byte = |i: usize| u32::from(block.get(i).copied().unwrap_or(0));
    if kind < 2 {
        // Raw or RLE: the size in 5, 12 or 20 bits.
        let (head, size) = match format {
            0 | 2 => (1, byte(0) >> 3),
            1 => (2, (byte(0) | byte(1) << 8) >> 4),
            _ => (3, (byte(0) | byte(1) << 8 | byte(2) << 16) >> 4),
        };
        let size = size as usize;
        check_size(size, block_max, room).map_err(&flaw)?;
        let len = head + if kind == 0 { size } else { 1 };
        if len > block.len() {
            return Err(flaw("literals run past the block"));
        }
        return Ok((head, len, size));
    }
    if block.len() < 5 {
        return Err(flaw("compressed literals in a block shorter than 5 bytes"));
    }
    let word = byte(0) | byte(1) << 8 | byte(2) << 16 | byte(3) << 24;
    let (head, size, csize) = match format {
        0 | 1 => (3, (word >> 4) & 0x3FF, (word >> 14) & 0x3FF),
        2 => (4, (word >> 4) & 0x3FFF, word >> 18),
        _ => (5, (word >> 4) & 0x3_FFFF, (word >> 22) | byte(4) << 10),
    };
    let (size, csize) = (size as usize, csize as usize);
    check_size(size, block_max, room).map_err(&flaw)?;
    let streams = if format == 0 { 1 } else { 4 };
    if streams == 4 && size < 6 {
        return Err(flaw("four literal streams for fewer than 6 literals"));
    }
    let section = block.get(head..head + csize).ok_or(flaw("compressed literals run past the block"))?;
    let tree = huffman(section, size, streams, kind == 3, entropy)?;
    Ok((head + tree, head + csize, size))
}

fn check_size(size: usize, block_max: usize, room: u64) -> Result<(), &'static str> {
    if size > block_max {
        return Err("more literals than the window or 128 KiB");
    }
    if size as u64 > room {
        return Err("more literals than the frame's content size leaves");
    }
    Ok(())
}

/// Huffman-coded literals: the tree (unless `treeless`), then the streams. Returns the bytes of
/// the tree description and jump table.
fn huffman(section: &[u8], size: usize, streams: usize, treeless: bool, entropy: &mut Entropy) -> Result<usize, Flaw> {
    let (tree_flaw, jump_flaw, stream_flaw) = (part("Huffman tree"), part("jump table"), part("literal streams"));
    let (tree, depth) = if treeless {
        (0, entropy.huffman.ok_or(tree_flaw("treeless literals without an earlier Huffman tree in the frame"))?)
    } else {
        let (tree, depth) = huffman_tree(section).map_err(&tree_flaw)?;
        if tree >= section.len() {
            return Err(tree_flaw("Huffman tree leaves no literal stream"));
        }
        entropy.huffman = Some(depth);
        (tree, depth)
    };
    let data = section.get(tree..).unwrap_or_default();
    if streams == 1 {
        stream(data, size, depth).map_err(stream_flaw)?;
        return Ok(tree);
    }
    if data.len() < 10 {
        return Err(jump_flaw("four literal streams in fewer than 10 bytes"));
    }
    let le16 = |i: usize| usize::from(u16::from_le_bytes([data[i], data[i + 1]]));
    let (a, b, c) = (le16(0), le16(2), le16(4));
    let d = (data.len() - 6).checked_sub(a + b + c).ok_or(jump_flaw("literal streams run past the literals"))?;
    if a == 0 || b == 0 || c == 0 || d == 0 {
        return Err(jump_flaw("empty literal stream"));
    }
    // With every stream 8 bytes or longer, libzstd's fast decoder may take them, and it checks
    // neither their end marks nor that they are used up; shorter ones go to the exact decoder.
    if a.min(b).min(c).min(d) < 8 {
        let segment = size.div_ceil(4);
        let fourth = size.checked_sub(3 * segment).ok_or(jump_flaw("literal streams do not split the literals"))?;
        let mut at = 6;
        for (len, symbols) in [(a, segment), (b, segment), (c, segment), (d, fourth)] {
            stream(&data[at..at + len], symbols, depth).map_err(&stream_flaw)?;
            at += len;
        }
    }
    Ok(tree + 6)
}

/// The tree description: returns its bytes and its longest code (0 when not decoded).
fn huffman_tree(section: &[u8]) -> Result<(usize, u32), &'static str> {
    let (&head, rest) = section.split_first().ok_or("no Huffman tree description")?;
    let mut weights = [0u8; 256];
    if head >= 128 {
        // Direct: 4-bit weights, two to a byte.
        let n = usize::from(head - 127);
        let packed = rest.get(..n.div_ceil(2)).ok_or("Huffman weights run past the literals")?;
        for (i, b) in packed.iter().enumerate() {
            weights[2 * i] = b >> 4;
            weights[2 * i + 1] = b & 15;
        }
        return Ok((1 + packed.len(), tree_log(&weights[..n])?));
    }
    let body = rest.get(..usize::from(head)).ok_or("Huffman weights run past the literals")?;
    match fse_weights(body, &mut weights) {
        Ok(n) => Ok((1 + body.len(), tree_log(&weights[..n])?)),
        Err(Stop::Bad(what)) => Err(what),
        Err(Stop::Unsure) => Ok((1 + body.len(), 0)),
    }
}

/// One Huffman stream of `symbols` literals whose codes are 1 to `depth` bits (0: unknown).
fn stream(data: &[u8], symbols: usize, depth: u32) -> Result<(), &'static str> {
    let bits = BackBits::new(data).ok_or("literal stream without its end mark")?.len();
    // libzstd must use the stream up exactly; every literal but the last takes a bit or more.
    if bits + 1 < symbols {
        return Err("literal stream too short for its literals");
    }
    if depth > 0 && bits > symbols * depth as usize {
        return Err("literal stream longer than its literals can use");
    }
    Ok(())
}

/// The number of sequences and the bytes that say it.
fn sequence_count(rest: &[u8]) -> Result<(usize, usize), &'static str> {
    let byte = |i: usize| rest.get(i).copied().map(usize::from).ok_or("sequences section header cut short");
    match byte(0).map_err(|_| "no sequences section")? {
        b @ 0..=127 => Ok((b, 1)),
        255 => Ok((byte(1)? + (byte(2)? << 8) + 0x7F00, 3)),
        b => Ok((((b - 128) << 8) + byte(1)?, 2)),
    }
}

/// The tables and bitstream of `count` sequences; returns the table bytes (`None` when they
/// could not be followed to their end).
fn sequences(body: &[u8], count: usize, entropy: &mut Entropy) -> Result<Option<usize>, Flaw> {
    let flaw = part("sequences header");
    if count == 0 {
        return if body.is_empty() { Ok(Some(0)) } else { Err(flaw("bytes after an empty sequences section")) };
    }
    let modes = *body.first().ok_or(flaw("no symbol compression modes"))?;
    if modes & 3 != 0 {
        return Err(flaw("reserved bits of the symbol compression modes are set"));
    }
    let mut pos = 1;
    let mut tables = [Table::default(); 3];
    for (i, code) in CODES.iter().enumerate() {
        let rest = body.get(pos..).unwrap_or_default();
        let flaw = part(code.name);
        tables[i] = match (modes >> (6 - 2 * i)) & 3 {
            0 => code.predefined,
            1 => {
                let s = usize::from(*rest.first().ok_or(flaw("RLE code missing"))?);
                if s > code.max {
                    return Err(flaw(code.rle_too_large));
                }
                pos += 1;
                Table { log: 0, update: 0, extra: extra_bits(i, s) }
            }
            2 => match read_counts(rest, code.max, code.max_log) {
                Ok(c) => {
                    pos += c.len;
                    stats(&c, i)
                }
                Err(Stop::Bad(what)) => return Err(flaw(what)),
                Err(Stop::Unsure) => {
                    entropy.tables = Some([Table::default(); 3]);
                    return Ok(None);
                }
            },
            _ => entropy.tables.ok_or(flaw("repeat mode without an earlier table in the frame"))?[i],
        };
    }
    entropy.tables = Some(tables);
    let flaw = part("sequences bitstream");
    let bits = BackBits::new(body.get(pos..).unwrap_or_default()).ok_or(flaw("no end mark"))?;
    // libzstd must use it up exactly: initial states, then each sequence's extra bits and (but
    // for the last) state updates.
    let sum = |f: fn(&Table) -> u32| u64::from(tables.iter().map(f).sum::<u32>());
    let need = sum(|t| t.log) + (count as u64 - 1) * sum(|t| t.update) + count as u64 * sum(|t| t.extra);
    if (bits.len() as u64) < need {
        return Err(flaw("too short for its sequences"));
    }
    Ok(Some(pos))
}

/// The fewest bits a table's state updates and codes read.
fn stats(c: &Counts, code: usize) -> Table {
    let present = || c.norm.iter().enumerate().take(c.symbols).filter(|(_, &n)| n != 0);
    // A symbol of count n owns states n..2n-1; from state x an update reads log - highbit(x).
    let update = present().map(|(_, &n)| if n < 0 { c.log } else { c.log - highbit(2 * n as u32 - 1) }).min();
    let extra = present().map(|(s, _)| extra_bits(code, s)).min();
    Table { log: c.log, update: update.unwrap_or(0), extra: extra.unwrap_or(0) }
}
