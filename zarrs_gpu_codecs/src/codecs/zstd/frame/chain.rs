//! The sequences' chain walked on the host, for the block-parallel decoder's small launches.
//!
//! A block's sequences bitstream is one chain (`blocks.cu`, `ZsSpans`): each sequence's states
//! say how many bits the next one takes, so the device's lane 0 walks it alone before a lane a
//! span decodes the sequences, about 310 cycles a sequence (2 ms for a Z2 block of 13,000). A host
//! core walks it in a few nanoseconds a sequence, and a frame's blocks side by side. Here the
//! chain is walked from the block's own bytes and tables, and each span's first bits and states
//! written where the device reads them. The device trusts none of it: it reads the first states
//! itself, checks every span's start against the end of the span before it, and walks the chain
//! itself where an entry is missing or out of range. A wrong entry is an error, never wrong bytes.

use super::fse::{decode_table, read_counts};

/// Spans a block at most and sequences a span at least (`blocks.cu`, `ZS_SPANS`, `ZS_SPAN_MIN`).
pub(crate) const SPANS: u32 = 32;
const SPAN_MIN: u32 = 64;
/// A block's entry: the spans, then each span's bits left and its states (literal length |
/// offset << 10 | match length << 20); 0 spans where the host did not walk the chain.
pub(crate) const CHAIN_WORDS: usize = 1 + 2 * SPANS as usize;

/// Extra bits of literal length codes 16..=35 and of match length codes 32..=52.
const LL_EXTRA: [u8; 20] = [1, 1, 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];
const ML_EXTRA: [u8; 21] = [1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

/// The predefined distributions (RFC 8878 3.1.1.3.2.2) of the three codes, and their logs.
const LL_DEFAULT: [i16; 36] =
    [4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1];
const OF_DEFAULT: [i16; 29] =
    [1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1];
const ML_DEFAULT: [i16; 53] = [
    1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1,
];

/// The codes in the order of their tables in a block (literal length, offset, match length):
/// largest symbol, largest log, predefined distribution and its log.
const CODES: [(usize, u32, &[i16], u32); 3] =
    [(35, 9, &LL_DEFAULT, 6), (31, 8, &OF_DEFAULT, 5), (52, 9, &ML_DEFAULT, 6)];

/// A code's table as the chain reads it: for each state, its update's bits (low byte), its
/// code's extra bits (second byte) and its update's base (high half).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Packed {
    log: u32,
    entries: Vec<u32>,
}

fn extra_bits(code: usize, symbol: usize) -> u32 {
    let from =
        |table: &[u8], first: usize| symbol.checked_sub(first).and_then(|i| table.get(i)).map_or(0, |&b| b.into());
    match code {
        0 => from(&LL_EXTRA, 16),
        1 => symbol as u32,
        _ => from(&ML_EXTRA, 32),
    }
}

fn packed(code: usize, counts: &super::fse::Counts) -> Packed {
    let t = decode_table(counts);
    let entries = (0..1usize << counts.log)
        .map(|u| u32::from(t.bits[u]) | extra_bits(code, usize::from(t.symbol[u])) << 8 | u32::from(t.base[u]) << 16)
        .collect();
    Packed { log: counts.log, entries }
}

fn predefined(code: usize) -> Packed {
    let (_, _, norm, log) = CODES[code];
    let mut counts = super::fse::Counts { log, norm: [0; 256], symbols: norm.len(), len: 0 };
    counts.norm[..norm.len()].copy_from_slice(norm);
    packed(code, &counts)
}

/// A code's table as a block's description gives it, built where its chain is walked (on the
/// walk's own thread: a frame's blocks' tables built one after another took 0.13 ms of one Z2
/// chunk's 0.54, run DS4).
#[derive(Clone)]
enum Description {
    Predefined,
    /// The one symbol of an RLE table.
    Rle(usize),
    Fse(Box<super::fse::Counts>),
}

impl Description {
    fn packed(&self, code: usize) -> Packed {
        match self {
            Description::Predefined => predefined(code),
            Description::Rle(symbol) => Packed { log: 0, entries: vec![extra_bits(code, *symbol) << 8] },
            Description::Fse(counts) => packed(code, counts),
        }
    }
}

/// The tables in effect for a frame's blocks (Repeat mode reuses the last block's).
#[derive(Default)]
pub(crate) struct FrameTables {
    last: Option<[Description; 3]>,
}

/// One block's chain to walk: its sequences bitstream, their count and tables' descriptions.
pub(crate) struct BlockWalk<'a> {
    stream: &'a [u8],
    count: u32,
    tables: [Description; 3],
}

impl FrameTables {
    /// The walk of a compressed block's sequences (`count` of them, `section` their bytes after
    /// the count), or None where the host does not follow it: the device then walks it itself.
    /// A block whose tables cannot be read leaves later blocks' Repeat mode without tables.
    pub(crate) fn block<'a>(&mut self, count: u64, section: &'a [u8]) -> Option<BlockWalk<'a>> {
        if count == 0 {
            return None;
        }
        let result = self.tables(section);
        if result.is_none() {
            self.last = None;
        }
        let (pos, tables) = result?;
        self.last = Some(tables.clone());
        Some(BlockWalk { stream: section.get(pos..)?, count: u32::try_from(count).ok()?, tables })
    }

    fn tables(&self, section: &[u8]) -> Option<(usize, [Description; 3])> {
        let modes = *section.first()?;
        let mut pos = 1;
        let mut read = |code: usize| -> Option<Description> {
            let (max, max_log, _, _) = CODES[code];
            let rest = section.get(pos..)?;
            Some(match (modes >> (6 - 2 * code)) & 3 {
                0 => Description::Predefined,
                1 => {
                    let symbol = usize::from(*rest.first()?);
                    pos += 1;
                    (symbol <= max).then_some(Description::Rle(symbol))?
                }
                2 => {
                    let counts = read_counts(rest, max, max_log).ok()?;
                    pos += counts.len;
                    Description::Fse(Box::new(counts))
                }
                _ => self.last.as_ref()?[code].clone(),
            })
        };
        let tables = [read(0)?, read(1)?, read(2)?];
        // (The modes' two low bits are reserved: the device refuses the block.)
        (modes % 4 == 0).then_some((pos, tables))
    }
}

/// The device's spans of a block of `count` sequences when a block splits into `split` at most
/// (`blocks.cu`, `zs_block_sequences`): their number and their length in sequences.
fn spans(count: u32, split: u32) -> (u32, u32) {
    let want = count / SPAN_MIN;
    let spans = want.clamp(1, split.clamp(1, SPANS));
    let span = count.div_ceil(spans);
    (count.div_ceil(span), span)
}

/// The stream's bits at [at, at + n) (n at most 32), the stream read as one little-endian number.
fn bits_at(stream: &[u8], at: usize, n: u32) -> u32 {
    let byte = at / 8;
    let word = if let Some(eight) = stream.get(byte..byte + 8) {
        u64::from_le_bytes(eight.try_into().expect("8 bytes"))
    } else {
        let mut word = [0u8; 8];
        let src = stream.get(byte..).unwrap_or_default();
        word[..src.len()].copy_from_slice(src);
        u64::from_le_bytes(word)
    };
    ((word >> (at % 8)) & ((1u64 << n) - 1)) as u32
}

impl BlockWalk<'_> {
    /// The block's chain entry (`CHAIN_WORDS` words) for a launch whose blocks split into
    /// `split` spans at most; None where it has one span (its lane walks the chain itself) or the
    /// bits run out (the device then finds where).
    pub(crate) fn walk(&self, split: u32) -> Option<[u32; CHAIN_WORDS]> {
        self.walk_seeing(split, |_| {})
    }

    /// The bits of each sequence of the block but the last (its extra bits and its states'
    /// update bits) as the walk of a block split into spans finds them; None as [`Self::walk`].
    #[cfg(test)]
    pub(crate) fn sequence_bits(&self) -> Option<Vec<u32>> {
        let mut bits = Vec::new();
        self.walk_seeing(SPANS, |n| bits.push(n))?;
        Some(bits)
    }

    /// [`Self::walk`], each sequence's bits (but the last's) told to `seen`.
    fn walk_seeing(&self, split: u32, mut seen: impl FnMut(u32)) -> Option<[u32; CHAIN_WORDS]> {
        let (n_spans, span) = spans(self.count, split);
        if n_spans < 2 {
            return None;
        }
        let &last = self.stream.last().filter(|&&b| b != 0)?;
        // Bits before the end mark, read from the top down: `left` of them unread.
        let mut left = 8 * (self.stream.len() - 1) + last.ilog2() as usize;
        let tables: [Packed; 3] = std::array::from_fn(|code| self.tables[code].packed(code));
        let [ll_t, of_t, ml_t] = &tables;
        let read = |n: u32, left: &mut usize| -> Option<u32> {
            *left = left.checked_sub(n as usize)?;
            Some(bits_at(self.stream, *left, n))
        };
        let mut ll = read(ll_t.log, &mut left)? as usize;
        let mut of = read(of_t.log, &mut left)? as usize;
        let mut ml = read(ml_t.log, &mut left)? as usize;
        let mut entry = [0u32; CHAIN_WORDS];
        entry[0] = n_spans;
        let (lefts, states) = entry[1..].split_at_mut(SPANS as usize);
        // Every sequence but the last: the last reads no state bits, and no span starts after it.
        let mut walked = 0u32;
        for j in 0..n_spans as usize {
            lefts[j] = u32::try_from(left).ok()?;
            states[j] = (ll | of << 10 | ml << 20) as u32;
            let end = (walked + span).min(self.count - 1);
            while walked < end {
                let (ll_e, of_e, ml_e) = (*ll_t.entries.get(ll)?, *of_t.entries.get(of)?, *ml_t.entries.get(ml)?);
                let (lb, mb, ob) = (ll_e & 0xFF, ml_e & 0xFF, of_e & 0xFF);
                let extra = (ll_e >> 8 & 0xFF) + (of_e >> 8 & 0xFF) + (ml_e >> 8 & 0xFF);
                left = left.checked_sub(extra as usize)?;
                seen(extra + lb + mb + ob);
                // The updates' bits, lowest of the sequence's: literal length's, match length's,
                // offset's, from the top down.
                let v = read(lb + mb + ob, &mut left)?;
                ll = (ll_e >> 16) as usize + (v >> (mb + ob)) as usize;
                ml = (ml_e >> 16) as usize + ((v >> ob) & ((1 << mb) - 1)) as usize;
                of = (of_e >> 16) as usize + (v & ((1 << ob) - 1)) as usize;
                walked += 1;
            }
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_as_the_device_splits() {
        assert_eq!(spans(63, 32), (1, 63));
        assert_eq!(spans(130, 32), (2, 65));
        assert_eq!(spans(2050, 32), (32, 65));
        assert_eq!(spans(12_780, 32), (32, 400));
        assert_eq!(spans(12_780, 1), (1, 12_780));
        assert_eq!(spans(1000, 4), (4, 250));
    }

    /// The numbers of the device's `zs_<name>_default` array (`entropy.cu`).
    fn device_default(name: &str) -> Vec<i16> {
        let source = include_str!("../entropy.cu");
        let at = source.find(&format!("zs_{name}_default[")).expect("the array");
        let body = &source[at..];
        let body = &body[body.find('{').expect("its values") + 1..body.find('}').expect("their end")];
        body.split(',').map(|v| v.trim().parse().expect("a count")).collect()
    }

    #[test]
    fn predefined_distributions_are_the_devices_and_sum_to_their_tables() {
        for (code, name) in ["ll", "of", "ml"].into_iter().enumerate() {
            let (max, _, norm, log) = CODES[code];
            assert_eq!(norm, device_default(name).as_slice(), "{name}");
            assert!(norm.len() <= max + 1, "{name}");
            assert_eq!(norm.iter().map(|&n| i32::from(n.abs())).sum::<i32>(), 1 << log, "{name}");
            assert_eq!(predefined(code).entries.len(), 1 << log);
        }
    }

    #[test]
    fn bits_read_as_one_little_endian_number() {
        let s = [0b1010_0101u8, 0xFF, 0x01];
        assert_eq!(bits_at(&s, 0, 4), 0b0101);
        assert_eq!(bits_at(&s, 4, 8), 0xFA);
        assert_eq!(bits_at(&s, 16, 2), 1);
        assert_eq!(bits_at(&s, 20, 8), 0);
    }
}
