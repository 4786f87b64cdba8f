//! FSE table descriptions (RFC 8878 section 4.1.1) and FSE-compressed Huffman weights (section
//! 4.2.1.2), read with the limits libzstd applies, so that we reject only what it rejects.

/// Why a description could not be accepted.
#[derive(Debug)]
pub(super) enum Stop {
    /// libzstd rejects it too.
    Bad(&'static str),
    /// Past this point libzstd reads bytes beyond the section in a way we do not model; nothing
    /// more can be said about this section (never a rejection).
    Unsure,
}

impl From<&'static str> for Stop {
    fn from(what: &'static str) -> Self {
        Stop::Bad(what)
    }
}

/// A table description: the normalized counts of symbols `0..symbols` (-1 = "less than one").
#[derive(Clone)]
pub(super) struct Counts {
    pub(super) log: u32,
    pub(super) norm: [i16; 256],
    pub(super) symbols: usize,
    /// Bytes the description takes.
    pub(super) len: usize,
}

/// The index of the highest set bit (0 for 0, which callers never pass).
pub(super) fn highbit(x: u32) -> u32 {
    x.max(1).ilog2()
}

/// The 8 bytes from byte `at` as a little-endian word, zeros past the end.
fn word_at(src: &[u8], at: usize) -> u64 {
    if let Some(bytes) = src.get(at..at.saturating_add(8)) {
        return u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    }
    let mut word = [0u8; 8];
    if let Some(rest) = src.get(at..) {
        let k = rest.len().min(8);
        word[..k].copy_from_slice(&rest[..k]);
    }
    u64::from_le_bytes(word)
}

/// `n` (at most 32) bits at bit `pos`, least significant first, zeros past the end (as libzstd
/// reads them). One word read, not bit by bit: this runs for every block of every chunk.
fn forward_bits(src: &[u8], pos: usize, n: u32) -> i32 {
    debug_assert!(n <= 32);
    ((word_at(src, pos / 8) >> (pos % 8)) & ((1u64 << n) - 1)) as i32
}

/// Reads a table description of symbols `0..=max_symbol` and accuracy log at most `max_log`.
pub(super) fn read_counts(src: &[u8], max_symbol: usize, max_log: u32) -> Result<Counts, Stop> {
    if src.is_empty() {
        return Err(Stop::Bad("empty FSE table description"));
    }
    // libzstd pads a section shorter than 8 bytes with zeros; when it refills past the end of
    // the section it reads wrapped bits, which we do not follow.
    let end = 8 * src.len().max(8);
    let log = forward_bits(src, 0, 4) as u32 + 5;
    if log > max_log {
        return Err(Stop::Bad("FSE table accuracy log above the format's maximum"));
    }
    let limit = max_symbol.min(255) + 1;
    let mut counts = [0i16; 256];
    let (mut pos, mut n, mut zero) = (4usize, 0usize, false);
    let mut remaining: i32 = (1 << log) + 1;
    let mut threshold: i32 = 1 << log;
    let mut nb = log + 1;
    loop {
        if zero {
            // Runs of zero counts: 2-bit repeat codes, 3 meaning "3 more, and go on".
            loop {
                let r = forward_bits(src, pos, 2);
                pos += 2;
                n += r as usize;
                if r != 3 {
                    break;
                }
                if pos >= end {
                    return Err(Stop::Unsure);
                }
            }
            if n >= limit {
                break;
            }
            if pos >= end {
                return Err(Stop::Unsure);
            }
        }
        let max = 2 * threshold - 1 - remaining;
        let low = forward_bits(src, pos, nb - 1);
        let mut count = if low < max {
            pos += nb as usize - 1;
            low
        } else {
            let c = forward_bits(src, pos, nb);
            pos += nb as usize;
            if c >= threshold {
                c - max
            } else {
                c
            }
        };
        count -= 1;
        remaining -= count.abs();
        counts[n] = count as i16;
        n += 1;
        zero = count == 0;
        if remaining < threshold {
            if remaining <= 1 {
                break;
            }
            nb = highbit(remaining as u32) + 1;
            threshold = 1 << (nb - 1);
        }
        if n >= limit {
            break;
        }
        if pos >= end {
            return Err(Stop::Unsure);
        }
    }
    if remaining != 1 {
        return Err(Stop::Bad("FSE table counts do not add up to the table size"));
    }
    if n > limit {
        return Err(Stop::Bad("FSE table describes symbols beyond the maximum"));
    }
    let len = pos.div_ceil(8);
    if pos > end || len > src.len() {
        return Err(Stop::Bad("FSE table description runs past its section"));
    }
    Ok(Counts { log, norm: counts, symbols: n, len })
}

/// A decoding table of at most 512 states (accuracy logs up to 9: sequence codes; Huffman
/// weights use logs up to 6).
pub(super) struct Table {
    pub(super) symbol: [u8; 512],
    pub(super) bits: [u8; 512],
    pub(super) base: [u16; 512],
    pub(super) mask: usize,
}

/// Builds the decoding table as RFC 8878 section 4.1.1 lays it out.
pub(super) fn decode_table(c: &Counts) -> Table {
    let size = 1usize << c.log;
    let mut t = Table { symbol: [0; 512], bits: [0; 512], base: [0; 512], mask: size - 1 };
    let mut next = [0u32; 256];
    let mut high = size as isize - 1;
    for (s, &count) in c.norm.iter().enumerate().take(c.symbols) {
        if count == -1 {
            if let Some(cell) = usize::try_from(high).ok().and_then(|h| t.symbol.get_mut(h)) {
                *cell = s as u8;
            }
            high -= 1;
            next[s] = 1;
        } else {
            next[s] = count.max(0) as u32;
        }
    }
    let step = (size >> 1) + (size >> 3) + 3;
    let mut pos = 0usize;
    if high >= 0 {
        for (s, &count) in c.norm.iter().enumerate().take(c.symbols) {
            for _ in 0..count.max(0) {
                t.symbol[pos & t.mask] = s as u8;
                pos = (pos + step) & t.mask;
                while pos as isize > high {
                    pos = (pos + step) & t.mask;
                }
            }
        }
    }
    for u in 0..size {
        let s = usize::from(t.symbol[u]);
        let x = next[s].max(1);
        next[s] = x + 1;
        let nb = c.log.saturating_sub(highbit(x));
        t.bits[u] = nb as u8;
        t.base[u] = ((x << nb) as usize).saturating_sub(size) as u16;
    }
    t
}

/// A bitstream read backwards from its end mark (the highest set bit of its last byte).
pub(super) struct BackBits<'a> {
    data: &'a [u8],
    left: usize,
    overflow: bool,
}

impl<'a> BackBits<'a> {
    /// `None` for an empty stream or one whose last byte is zero (no end mark).
    pub(super) fn new(data: &'a [u8]) -> Option<Self> {
        let last = *data.last().filter(|&&b| b != 0)?;
        Some(Self { data, left: 8 * (data.len() - 1) + highbit(u32::from(last)) as usize, overflow: false })
    }

    /// Bits before the end mark.
    pub(super) fn len(&self) -> usize {
        self.left
    }

    fn read(&mut self, n: u32) -> usize {
        let n = n as usize;
        if n > self.left {
            self.overflow = true;
            return 0;
        }
        self.left -= n;
        // n is at most 32 and the bits lie within the data (n <= left above).
        ((word_at(self.data, self.left / 8) >> (self.left % 8)) & ((1u64 << n) - 1)) as usize
    }
}

/// Decodes FSE-compressed Huffman weights into `out`; returns how many.
///
/// As libzstd does: two interleaved states, until a state update reads past the start of the
/// stream; then the other state gives the last weight. At most 255 weights fit.
pub(super) fn fse_weights(src: &[u8], out: &mut [u8; 256]) -> Result<usize, Stop> {
    let counts = read_counts(src, 255, 6)?;
    let table = decode_table(&counts);
    let stream = src.get(counts.len..).unwrap_or_default();
    let mut bits = BackBits::new(stream).ok_or(Stop::Bad("Huffman weights stream without its end mark"))?;
    let (mut even, mut odd) = (bits.read(counts.log), bits.read(counts.log));
    if bits.overflow {
        return Err(Stop::Bad("Huffman weights stream shorter than its initial states"));
    }
    // The two states written out in turn (not an array indexed by a flag) so that the lookups
    // of one overlap the other's: this loop runs for every block with Huffman-coded literals.
    let mut weights = 0usize;
    let mut step = |state: &mut usize, other: usize, weights: &mut usize| -> Option<Result<usize, Stop>> {
        if *weights >= 254 {
            return Some(Err(Stop::Bad("more than 255 Huffman weights")));
        }
        let now = *state & table.mask;
        out[*weights] = table.symbol[now];
        *weights += 1;
        let update = bits.read(u32::from(table.bits[now]));
        if bits.overflow {
            out[*weights] = table.symbol[other & table.mask];
            return Some(Ok(*weights + 1));
        }
        *state = usize::from(table.base[now]) + update;
        None
    };
    loop {
        if let Some(done) = step(&mut even, odd, &mut weights) {
            return done;
        }
        if let Some(done) = step(&mut odd, even, &mut weights) {
            return done;
        }
    }
}

/// The maximum code length of a Huffman tree given its weights (the last one implied), or why
/// they do not make a tree (libzstd's `HUF_readStats` rules).
pub(super) fn tree_log(weights: &[u8]) -> Result<u32, &'static str> {
    let mut total = 0u32;
    let mut ones = 0u32;
    for &w in weights {
        if w > 12 {
            return Err("Huffman weight above 12");
        }
        ones += u32::from(w == 1);
        total += (1u32 << w) >> 1;
    }
    if total == 0 {
        return Err("Huffman weights all zero");
    }
    let log = highbit(total) + 1;
    if log > 12 {
        return Err("Huffman tree deeper than 12 bits");
    }
    let rest = (1u32 << log) - total;
    if !rest.is_power_of_two() {
        return Err("Huffman weights do not complete a tree");
    }
    ones += u32::from(highbit(rest) == 0);
    if ones < 2 || !ones.is_multiple_of(2) {
        return Err("Huffman tree with an odd number of deepest codes");
    }
    Ok(log)
}
