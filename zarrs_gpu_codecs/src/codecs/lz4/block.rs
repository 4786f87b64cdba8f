//! Host-side checks of raw LZ4 blocks (the block format, no frame) before nvCOMP sees them, where
//! malformed input is undefined behaviour.
//!
//! A block is a run of sequences. Each starts with a token: the high nibble is the literal
//! length, the low nibble the match length less 4; a nibble of 15 continues in the bytes that
//! follow (each added, until one is not 255). The literals follow the literal length; then a
//! 2-byte little-endian offset back into the decoded bytes, then the match length's extension
//! bytes. The last sequence is literals only: it ends exactly at the end of the input.
//!
//! [`check_block`] walks the sequences without decoding them, in time linear in the input and
//! without allocating, and checks that every literal run lies within the input and within the
//! expected decoded length, every offset is neither 0 nor beyond the bytes decoded so far, every
//! match ends within the decoded length, the block ends with a literals-only sequence exactly at
//! the end of the input, and the decoded length is exactly the expected one.
//!
//! # The end-of-block rules, and LZ4_decompress_safe
//!
//! The spec (`lz4_Block_format.md`, "parsing restrictions") also asks that the last match start
//! at least 12 bytes (`MFLIMIT`) before the end of the block and that the last 5 bytes
//! (`LASTLITERALS`) be literals. The reference decoder is `LZ4_decompress_safe` (lz4 1.9 and
//! 1.10; c-blosc calls it with the expected size as the capacity, then wants exactly that many
//! bytes). It applies four rules of its own, read from its source (`LZ4_decompress_generic`):
//! 1. a sequence with a match leaves that match at least 12 bytes from the end of the output;
//! 2. a sequence with a match has at least 8 input bytes after its literals (offset, a last
//!    token and 5 literals);
//! 3. a match length's extension leaves at least 4 input bytes;
//! 4. a match ends at least 5 bytes before the end of the output.
//!
//! Rules 1 and 3 hold on every path of its code. Rules 2 and 4 are checked only on its careful
//! path: its shortcut for short sequences (literals and match under 15, at least 16 input and 32
//! output bytes from the end) skips them, and so does, for rule 2, the fast loop of x86-64 and
//! some ARM builds (`LZ4_FAST_DEC_LOOP`, 64 output bytes from the end). Whether a breach of 2 or
//! 4 is decoded thus depends on where it is and how lz4 was built.
//!
//! The walk applies all four everywhere, so:
//! - a block it accepts is one `LZ4_decompress_safe` decodes to exactly the expected length on
//!   every path (all its other checks are implied by the walk's), and every conforming decoder
//!   (nvCOMP's, lz4_flex's) decodes alike;
//! - a block it rejects as [`Lz4Error::Corrupt`] or [`Lz4Error::SizeMismatch`] is one
//!   `LZ4_decompress_safe` does not decode to that length, with one exception: a match offset of
//!   0 ([`Lz4Error::ZERO_OFFSET`]), which the spec calls invalid and lz4_flex rejects, but which
//!   `LZ4_decompress_safe` decodes (copying bytes it has not written yet: zeros on its careful
//!   path);
//! - a block that breaks only rules 2 or 4, but would decode to exactly the expected length with
//!   a lenient decoder, is [`Lz4Error::Restriction`]: `LZ4_decompress_safe` decodes some of
//!   these, so the caller should leave it to the host's decoder rather than call it an error.
//!
//! No LZ4 encoder (lz4, lz4hc, lz4_flex) writes a block that breaks these rules.

/// Literals at the end of a block: the last match ends at least this far before the end.
const LAST_LITERALS: usize = 5;
/// The last match starts at least this far before the end of the block.
const MF_LIMIT: usize = 12;
/// Input bytes `LZ4_decompress_safe` wants after the literals of a sequence with a match: the
/// offset, the last token and [`LAST_LITERALS`] literals.
const AFTER_LITERALS: usize = 2 + 1 + LAST_LITERALS;
/// Input bytes `LZ4_decompress_safe` wants after a match length's extension.
const AFTER_MATCH_LENGTH: usize = LAST_LITERALS - 1;
/// The shortest match.
const MIN_MATCH: usize = 4;
/// Input bytes from a sequence's token within which its checks cannot fail when its lengths
/// need no extension: the token, 14 literals, then [`AFTER_LITERALS`] bytes.
const FAST_INPUT: usize = 1 + 14 + AFTER_LITERALS;
/// Output bytes within which they cannot fail either: 14 literals, then [`MF_LIMIT`] bytes
/// (which hold the longest such match, 18 bytes, and [`LAST_LITERALS`] after it).
const FAST_OUTPUT: usize = 14 + 18 + LAST_LITERALS;

/// Why a block is not a valid LZ4 block of the expected length.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Lz4Error {
    /// `LZ4_decompress_safe` cannot decode the block to the expected length (except for a match
    /// offset of 0, see the module docs).
    #[error("corrupt LZ4 block at input byte {offset}: {what}")]
    Corrupt {
        /// Where in the block the damaged part starts.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// The sequences are sound but decode to another length than the expected one.
    #[error("LZ4 block decodes to {decoded} bytes, not the expected {expected}")]
    SizeMismatch {
        /// The expected decoded length.
        expected: usize,
        /// What the block decodes to.
        decoded: usize,
    },
    /// The block decodes to the expected length with a lenient decoder, but breaks an
    /// end-of-block rule that `LZ4_decompress_safe` checks on its careful path only (rules 2
    /// and 4 of the module docs), the first time here: it may or may not decode it.
    #[error("LZ4 block breaks the end-of-block rules at input byte {offset}: {what}")]
    Restriction {
        /// Where the sequence that breaks the rule starts.
        offset: usize,
        /// Which rule.
        what: &'static str,
    },
}

impl Lz4Error {
    /// The `what` of a match offset of 0, the one corruption `LZ4_decompress_safe` decodes.
    pub const ZERO_OFFSET: &'static str = "match offset 0";

    /// Whether the block is a valid one of the expected length for a lenient decoder, breaking
    /// only the end-of-block rules.
    pub fn is_restriction(&self) -> bool {
        matches!(self, Self::Restriction { .. })
    }
}

fn corrupt(offset: usize, what: &'static str) -> Lz4Error {
    Lz4Error::Corrupt { offset, what }
}

/// Reads a length whose nibble is `nibble`: 15 continues in the bytes at `ip`.
fn length(input: &[u8], ip: &mut usize, nibble: u8, what: &'static str) -> Result<usize, Lz4Error> {
    let mut len = usize::from(nibble);
    if nibble == 15 {
        loop {
            let Some(&byte) = input.get(*ip) else { return Err(corrupt(*ip, what)) };
            *ip += 1;
            len = len.saturating_add(usize::from(byte));
            if byte != 255 {
                break;
            }
        }
    }
    Ok(len)
}

/// Check that `input` is one LZ4 block that decodes to exactly `expected` bytes; returns that
/// length.
///
/// # Errors
/// Returns an [`Lz4Error`] for a block that does not decode to `expected` bytes, or that breaks
/// the end-of-block rules ([`Lz4Error::Restriction`], see the module docs).
pub fn check_block(input: &[u8], expected: usize) -> Result<usize, Lz4Error> {
    if expected == 0 {
        // As LZ4_decompress_safe: an empty block is the single token 0.
        return if input == [0] { Ok(0) } else { Err(corrupt(0, "a block of 0 bytes must be the single token 0")) };
    }
    let n = input.len();
    let (mut ip, mut op) = (0usize, 0usize);
    let mut restriction = None;
    let mut restrict = |offset: usize, what: &'static str| {
        restriction.get_or_insert(Lz4Error::Restriction { offset, what });
    };
    loop {
        // Sequences far from both ends whose lengths need no extension bytes pass every check
        // below but the offset's (at most 14 literals and an 18-byte match: see FAST_INPUT and
        // FAST_OUTPUT); most sequences are such. Any other goes the full way.
        while ip + FAST_INPUT <= n && op + FAST_OUTPUT <= expected {
            let token = input[ip];
            let (literals, matched) = (usize::from(token >> 4), usize::from(token & 15));
            if literals == 15 || matched == 15 {
                break;
            }
            let at = ip + 1 + literals;
            let offset = usize::from(u16::from_le_bytes([input[at], input[at + 1]]));
            if offset == 0 || offset > op + literals {
                break;
            }
            ip = at + 2;
            op += literals + matched + MIN_MATCH;
        }
        let start = ip;
        let Some(&token) = input.get(ip) else {
            let what = if n == 0 { "empty input" } else { "the block ends with a match, not literals" };
            return Err(corrupt(ip, what));
        };
        ip += 1;
        let literals = length(input, &mut ip, token >> 4, "literal length runs past the input")?;
        if literals > n - ip {
            return Err(corrupt(ip, "literals run past the input"));
        }
        if literals > expected - op {
            return Err(corrupt(ip, "literals run past the decoded size"));
        }
        ip += literals;
        op += literals;
        if ip == n {
            break; // the last sequence: literals only
        }
        // A match follows.
        if expected - op < MF_LIMIT {
            return Err(corrupt(start, "a match starts within the last 12 bytes of the block"));
        }
        if n - ip < AFTER_LITERALS {
            restrict(start, "fewer than 8 input bytes follow the literals of a sequence with a match");
        }
        if n - ip < 2 {
            return Err(corrupt(ip, "match offset runs past the input"));
        }
        let offset = usize::from(u16::from_le_bytes([input[ip], input[ip + 1]]));
        if offset == 0 {
            return Err(corrupt(ip, Lz4Error::ZERO_OFFSET));
        }
        if offset > op {
            return Err(corrupt(ip, "match offset reaches before the start of the block"));
        }
        ip += 2;
        let matched = length(input, &mut ip, token & 15, "match length runs past the input")?.saturating_add(MIN_MATCH);
        if token & 15 == 15 && n - ip < AFTER_MATCH_LENGTH {
            return Err(corrupt(start, "a match length's extension runs into the last 4 input bytes"));
        }
        if matched > expected - op {
            return Err(corrupt(start, "match runs past the decoded size"));
        }
        if expected - op - matched < LAST_LITERALS {
            restrict(start, "a match ends within the last 5 bytes of the block");
        }
        op += matched;
    }
    if op != expected {
        return Err(Lz4Error::SizeMismatch { expected, decoded: op });
    }
    restriction.map_or(Ok(op), Err)
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `LZ4_decompress_safe` (lz4 1.10, as blosc-src links it) with a capacity of `capacity`:
    /// the decoded length, or its negative error.
    pub(crate) fn reference(input: &[u8], capacity: usize) -> i32 {
        let mut out = vec![0u8; capacity.max(1)];
        // SAFETY: both buffers are valid for the lengths given; the decoder never writes past
        // the capacity nor reads past the input.
        unsafe {
            lz4_sys::LZ4_decompress_safe(
                input.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                input.len() as i32,
                capacity as i32,
            )
        }
    }

    /// lz4_flex's safe decoder into a buffer of `capacity`.
    fn flex(input: &[u8], capacity: usize) -> Option<usize> {
        lz4_flex::block::decompress_into(input, &mut vec![0; capacity]).ok()
    }

    /// The reference compressors (c-blosc's lz4 and lz4hc) at `level` (0: LZ4_compress_default).
    fn reference_compress(raw: &[u8], level: i32) -> Vec<u8> {
        if raw.is_empty() {
            return vec![0]; // LZ4_compress_HC's optimal levels read the source even when empty
        }
        // SAFETY: LZ4_compressBound is pure.
        let bound = unsafe { lz4_sys::LZ4_compressBound(raw.len() as i32) } as usize;
        let mut out = vec![0u8; bound];
        // SAFETY: `out` holds the bound for `raw`.
        let n = unsafe {
            let (src, dst) = (raw.as_ptr().cast(), out.as_mut_ptr().cast());
            if level == 0 {
                lz4_sys::LZ4_compress_default(src, dst, raw.len() as i32, bound as i32)
            } else {
                lz4_sys::LZ4_compress_HC(src, dst, raw.len() as i32, bound as i32, level)
            }
        };
        assert!(n > 0, "LZ4 compression failed");
        out.truncate(n as usize);
        out
    }

    /// "abcdefgh", then 8 bytes copied from 8 back, then "12345": 21 bytes.
    const BLOCK: [u8; 17] =
        [0x84, b'a', b'b', b'c', b'd', b'e', b'f', b'g', b'h', 8, 0, 0x50, b'1', b'2', b'3', b'4', b'5'];

    /// The walk, lz4_flex and the reference agree that `block` is a valid block of `n` bytes.
    fn valid(block: &[u8], n: usize) {
        assert_eq!(check_block(block, n), Ok(n), "{block:?}");
        assert_eq!(flex(block, n), Some(n));
        assert_eq!(reference(block, n), n as i32);
    }

    /// The walk rejects `block` naming `what`, and the reference does not decode `n` bytes.
    fn rejects(block: &[u8], n: usize, what: &str) {
        let err = check_block(block, n).unwrap_err();
        assert!(err.to_string().contains(what), "expected {what:?}, got {err}");
        assert!(!err.is_restriction());
        assert_ne!(reference(block, n), n as i32, "LZ4_decompress_safe decodes what we reject: {err}");
    }

    #[test]
    fn hand_built_blocks() {
        valid(&BLOCK, 21);
        valid(&[0x30, b'x', b'y', b'z'], 3);
        valid(&[0], 0);
        // 300 literals: 15 + 255 + 30.
        let mut long = vec![0xF0, 255, 30];
        long.extend((0..300).map(|i| i as u8));
        valid(&long, 300);
        // A run: "a", then 20 bytes copied from 1 back (15 + 1 in the extension), then 5 literals.
        valid(&[0x1F, b'a', 1, 0, 1, 0x50, b'1', b'2', b'3', b'4', b'5'], 26);
    }

    #[test]
    fn corrupt_hand_built_blocks() {
        let with = |i: usize, byte: u8| {
            let mut block = BLOCK;
            block[i] = byte;
            block
        };
        rejects(&BLOCK, 22, "decodes to 21 bytes, not the expected 22");
        rejects(&BLOCK, 20, "literals run past the decoded size");
        // Offset 0: corrupt to the spec and lz4_flex, decoded by LZ4_decompress_safe.
        assert_eq!(check_block(&with(9, 0), 21), Err(Lz4Error::Corrupt { offset: 9, what: Lz4Error::ZERO_OFFSET }));
        assert_eq!((flex(&with(9, 0), 21), reference(&with(9, 0), 21)), (None, 21));
        rejects(&with(9, 9), 21, "match offset reaches before the start of the block");
        rejects(&with(0, 0x8F), 21, "match runs past the decoded size");
        rejects(&with(0, 0x8F)[..11], 21, "match length runs past the input");
        rejects(&with(0, 0x83), 21, "decodes to 20 bytes");
        rejects(&with(0, 0x85), 21, "literals run past the decoded size");
        rejects(&with(0, 0x8A), 21, "match runs past the decoded size");
        rejects(&with(0, 0xF4), 21, "literals run past the input");
        rejects(&BLOCK[..10], 21, "match offset runs past the input");
        rejects(&BLOCK[..11], 21, "the block ends with a match, not literals");
        rejects(&[], 5, "empty input");
        rejects(&[], 0, "a block of 0 bytes must be the single token 0");
        rejects(&[0, 0], 0, "a block of 0 bytes must be the single token 0");
        rejects(&[0xF0], 20, "literal length runs past the input");
        // The match starts 9 bytes before the end (rule 1, checked on every path); lz4_flex
        // decodes it.
        let early = [0x50, b'a', b'b', b'c', b'd', b'e', 1, 0, 0x50, b'1', b'2', b'3', b'4', b'5'];
        rejects(&early, 14, "within the last 12 bytes");
        assert_eq!(flex(&early, 14), Some(14));
        // A match length's extension leaving 3 input bytes (rule 3, every path).
        rejects(
            &[0x8F, b'a', b'b', b'c', b'd', b'e', b'f', b'g', b'h', 8, 0, 0, 0x20, b'1', b'2'],
            8 + 19 + 2,
            "extension runs into the last 4 input bytes",
        );
    }

    #[test]
    fn restrictions_some_of_which_the_reference_decodes() {
        // 14 literals, 18 bytes copied from 8 back up to the very end, an empty last sequence:
        // rules 2 and 4 broken. The reference's shortcut decodes it, lz4_flex too.
        let mut shortcut = vec![0xEE];
        shortcut.extend(b"abcdefghijklmn");
        shortcut.extend([8, 0, 0]);
        let err = check_block(&shortcut, 32).unwrap_err();
        assert_eq!(
            err,
            Lz4Error::Restriction {
                offset: 0,
                what: "fewer than 8 input bytes follow the literals of a sequence with a match"
            }
        );
        assert_eq!(reference(&shortcut, 32), 32);
        assert_eq!(flex(&shortcut, 32), Some(32));
        // The same with 15 literals (a length extension): the careful path, which rejects it.
        let mut careful = vec![0xFE, 0];
        careful.extend(b"abcdefghijklmno");
        careful.extend([8, 0, 0]);
        assert!(check_block(&careful, 33).unwrap_err().is_restriction());
        assert!(reference(&careful, 33) < 0);
        assert_eq!(flex(&careful, 33), Some(33));
    }

    /// Bytes with matches to find: a few symbols, runs, and repeats of earlier stretches.
    fn compressible() -> impl Strategy<Value = Vec<u8>> {
        (proptest::collection::vec((0u8..4, any::<u8>(), 1usize..40), 0..200), 1u8..=255).prop_map(
            |(parts, alphabet)| {
                let mut out: Vec<u8> = Vec::new();
                for (kind, byte, len) in parts {
                    match kind {
                        0 => out.extend(std::iter::repeat_n(byte, len)),
                        1 if out.len() > len => out.extend_from_within(out.len() - len..),
                        _ => out.extend((0..len).map(|i| byte.wrapping_add(i as u8) % alphabet)),
                    }
                }
                out
            },
        )
    }

    /// Appends the LZ4 extension bytes of a length whose nibble is 15.
    fn extend_length(block: &mut Vec<u8>, mut rest: usize) {
        while rest >= 255 {
            block.push(255);
            rest -= 255;
        }
        block.push(rest as u8);
    }

    /// A block of `sequences` (literals, match length, offset back as a share of the bytes so
    /// far: 0 for 0, all ones for one byte too far), then `last` literals, written without
    /// regard to the end-of-block rules.
    fn encode(sequences: &[(usize, usize, u16)], last: usize) -> (Vec<u8>, usize) {
        let (mut block, mut op) = (Vec::new(), 0usize);
        for &(literals, matched, share) in sequences {
            let token = (literals.min(15) << 4) as u8 | (matched - MIN_MATCH).min(15) as u8;
            block.push(token);
            if literals >= 15 {
                extend_length(&mut block, literals - 15);
            }
            block.extend((0..literals).map(|i| (op + i) as u8));
            op += literals;
            let offset = match share {
                0 => 0,
                u16::MAX => op + 1,
                _ => 1 + ((op.saturating_sub(1) as u64 * u64::from(share)) >> 16) as usize,
            }
            .min(usize::from(u16::MAX)) as u16;
            block.extend(offset.to_le_bytes());
            if matched - MIN_MATCH >= 15 {
                extend_length(&mut block, matched - MIN_MATCH - 15);
            }
            op += matched;
        }
        block.push((last.min(15) << 4) as u8);
        if last >= 15 {
            extend_length(&mut block, last - 15);
        }
        block.extend((0..last).map(|i| i as u8));
        (block, op + last)
    }

    /// The three-way agreement with both decoders, and the converse: what LZ4_decompress_safe
    /// decodes to the expected length, the walk accepts, or calls a restriction or offset 0.
    fn agrees(block: &[u8], n: usize) -> Result<(), TestCaseError> {
        let reference = reference(block, n);
        match check_block(block, n) {
            Ok(len) => {
                prop_assert_eq!(len, n);
                prop_assert_eq!(flex(block, n), Some(n));
                prop_assert_eq!(reference, n as i32);
            }
            Err(Lz4Error::Restriction { .. }) => prop_assert_eq!(flex(block, n), Some(n)),
            Err(Lz4Error::Corrupt { what: Lz4Error::ZERO_OFFSET, .. }) => {}
            Err(err) => prop_assert_ne!(reference, n as i32, "{}", err),
        }
        Ok(())
    }

    proptest! {
        /// Blocks of random sequences, near the end-of-block rules and across the reference's
        /// fast paths and the walk's own (long blocks of short sequences): the walk agrees with
        /// both decoders, both ways.
        #[test]
        fn random_sequences(
            sequences in proptest::collection::vec((
                prop_oneof![1usize..16, 0usize..300],
                prop_oneof![4usize..20, 4usize..300],
                prop_oneof![1 => Just(0u16), 1 => Just(u16::MAX), 40 => 1..u16::MAX],
            ), 0..40),
            last in prop_oneof![0usize..8, 0usize..40],
            delta in prop_oneof![Just(0i64), -2i64..=2],
        ) {
            let (block, decoded) = encode(&sequences, last);
            agrees(&block, (decoded as i64 + delta).max(0) as usize)?;
        }

        /// Blocks from lz4_flex and the reference compressors are accepted, with their length.
        #[test]
        fn compressed_blocks_are_accepted(raw in compressible(), level in 0i32..=12) {
            let flexed = lz4_flex::block::compress(&raw);
            prop_assert_eq!(check_block(&flexed, raw.len()), Ok(raw.len()));
            prop_assert_eq!(check_block(&reference_compress(&raw, level), raw.len()), Ok(raw.len()));
        }

        /// Mutated blocks: what the walk accepts, lz4_flex and LZ4_decompress_safe decode to the
        /// same length; what it calls corrupt, LZ4_decompress_safe does not decode to that
        /// length (offset 0 aside); what it calls a restriction, lz4_flex decodes.
        #[test]
        fn mutated_blocks_never_pass_what_decoders_reject(
            raw in compressible(),
            edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..4),
            cut in proptest::option::of(any::<proptest::sample::Index>()),
            delta in -3i64..=3,
        ) {
            let mut block = lz4_flex::block::compress(&raw);
            for (at, byte) in &edits {
                let at = at.index(block.len());
                block[at] = *byte;
            }
            if let Some(cut) = cut {
                block.truncate(cut.index(block.len() + 1));
            }
            agrees(&block, (raw.len() as i64 + delta).max(0) as usize)?;
        }

        /// Random bytes: never a panic, and the same three-way agreement.
        #[test]
        fn random_bytes(block in proptest::collection::vec(any::<u8>(), 0..64), n in 0usize..200) {
            agrees(&block, n)?;
        }
    }
}
