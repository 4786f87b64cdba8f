//! The device LZ4 kernel's code run on the CPU (both ways of running a thread block), against lz4_flex,
//! `LZ4_decompress_safe` and the host walk.

use proptest::prelude::*;

use super::*;
use crate::codecs::lz4::block::{check_block, Lz4Error};

/// Guard bytes after each output: the kernel must leave them alone.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

/// Decodes one block both ways into an output of `expected` bytes (guarded); the status, the
/// decoded bytes (the whole output) and the decoded length, the same both ways.
fn ours(block: &[u8], expected: usize) -> (u32, Vec<u8>, u64) {
    let mut results = Vec::new();
    for threads in HostThreads::ALL {
        let mut out = vec![GUARD_BYTE; expected + GUARD];
        let (head, tail) = out.split_at_mut(expected);
        let [(status, decoded)] = decode_on_host(&mut [(block, head)], threads)[..] else { unreachable!() };
        assert!(tail.iter().all(|&b| b == GUARD_BYTE), "{threads:?} wrote past the output");
        assert!(decoded <= expected as u64);
        out.truncate(expected);
        results.push((status, out, decoded));
    }
    let lanes = results.pop().unwrap();
    let one = results.pop().unwrap();
    assert_eq!(one.0, lanes.0, "the two ways of running a thread block disagree on the status");
    if one.0 == OK {
        assert!(one.1 == lanes.1, "the two ways of running a thread block decode different bytes");
    }
    one
}

/// lz4_flex's safe decoder into a buffer of `n`: the bytes, where it decodes exactly `n`.
fn flex(block: &[u8], n: usize) -> Option<Vec<u8>> {
    let mut out = vec![0; n];
    match lz4_flex::block::decompress_into(block, &mut out) {
        Ok(len) if len == n => Some(out),
        _ => None,
    }
}

/// `LZ4_decompress_safe` with a capacity of `n`: the bytes, where it decodes exactly `n`.
fn reference(block: &[u8], n: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; n.max(1)];
    // SAFETY: both buffers are valid for the lengths given.
    let len = unsafe {
        lz4_sys::LZ4_decompress_safe(block.as_ptr().cast(), out.as_mut_ptr().cast(), block.len() as i32, n as i32)
    };
    out.truncate(n);
    (len >= 0 && len as usize == n).then_some(out)
}

/// The agreement on any block and expected length: ours decodes exactly what the host walk
/// accepts, then the bytes lz4_flex and the reference decode; what lz4_flex rejects is an error
/// here; what it decodes and ours rejects breaks the end-of-block rules (which the walk and
/// LZ4_decompress_safe's careful path enforce).
fn agrees(block: &[u8], n: usize) -> Result<u32, TestCaseError> {
    let (status, out, decoded) = ours(block, n);
    let walk = check_block(block, n);
    let flexed = flex(block, n);
    if status == OK {
        prop_assert_eq!(decoded, n as u64);
        prop_assert_eq!(&walk, &Ok(n));
        prop_assert!(flexed.as_ref() == Some(&out), "lz4_flex decodes other bytes");
        prop_assert!(reference(block, n).as_ref() == Some(&out), "LZ4_decompress_safe decodes other bytes");
    } else {
        prop_assert!((1..=END_RULES).contains(&status), "status {}", status);
        prop_assert!(walk.is_err(), "the walk accepts what ours rejects ({})", status_text(status));
        if flexed.is_some() {
            prop_assert_eq!(status, END_RULES, "lz4_flex decodes it: {}", status_text(status));
        }
        if let Err(Lz4Error::Restriction { .. }) = walk {
            prop_assert_eq!(status, END_RULES);
        }
    }
    Ok(status)
}

/// Bytes of a compressibility between none and runs of one byte: `kind` picks runs, repeats of
/// earlier stretches, a small alphabet, or noise.
fn data(len: usize, seed: u64, kind: u8) -> Vec<u8> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let r = next();
        let run = 1 + (r >> 40) as usize % 300;
        match (kind + (r & 3) as u8) % 5 {
            0 => out.extend(std::iter::repeat_n((r >> 8) as u8, run)),
            1 if out.len() > run => {
                let from = (r >> 20) as usize % (out.len() - run + 1);
                out.extend_from_within(from..from + run);
            }
            2 => out.extend((0..run).map(|i| ((r >> 16) as usize + i % 7) as u8 % 5)),
            3 => out.extend((0..=run / 4).map(|i| ((r >> 8) as usize + i) as u8)),
            _ => out.extend((0..run.min(40)).map(|_| next() as u8)),
        }
    }
    out.truncate(len);
    out
}

/// c-blosc's lz4hc at `level` (lz4's own HC encoder, as blosc-src builds it).
fn lz4hc(raw: &[u8], level: i32) -> Vec<u8> {
    if raw.is_empty() {
        return vec![0];
    }
    // SAFETY: LZ4_compressBound is pure; `out` holds the bound for `raw`.
    unsafe {
        let bound = lz4_sys::LZ4_compressBound(raw.len() as i32);
        let mut out = vec![0u8; bound as usize];
        let n = lz4_sys::LZ4_compress_HC(raw.as_ptr().cast(), out.as_mut_ptr().cast(), raw.len() as i32, bound, level);
        assert!(n > 0, "LZ4_compress_HC failed");
        out.truncate(n as usize);
        out
    }
}

/// One block decodes to `raw` with ours, lz4_flex and the reference alike.
fn decodes(block: &[u8], raw: &[u8]) {
    let (status, out, decoded) = ours(block, raw.len());
    assert_eq!((status, decoded), (OK, raw.len() as u64), "{}", status_text(status));
    assert!(out == raw, "decoded bytes differ");
    assert_eq!(agrees(block, raw.len()).map_err(|e| e.to_string()), Ok(OK));
}

#[test]
fn hand_built_blocks_decode() {
    // "abcdefgh", 8 bytes copied from 8 back, "12345".
    let block = [0x84, b'a', b'b', b'c', b'd', b'e', b'f', b'g', b'h', 8, 0, 0x50, b'1', b'2', b'3', b'4', b'5'];
    decodes(&block, b"abcdefghabcdefgh12345");
    decodes(&[0x30, b'x', b'y', b'z'], b"xyz");
    decodes(&[0], b"");
    // Overlapping matches of every offset from 1 to 40, short and long (a token's bytes past 32
    // are spread over the threads), within one window and across windows of 4 KiB.
    for offset in 1usize..=40 {
        for matched in [4usize, 31, 32, 33, 100, 1000, 9000] {
            let head: Vec<u8> = (0..offset.max(1)).map(|i| (i * 7 + 1) as u8).collect();
            let mut raw = head.clone();
            for i in 0..matched {
                raw.push(raw[i]);
            }
            raw.extend(TAIL);
            let mut block = Vec::new();
            let lit = head.len();
            let ml = matched - 4;
            block.push(((lit.min(15) as u8) << 4) | ml.min(15) as u8);
            if lit >= 15 {
                extend_length(&mut block, lit - 15);
            }
            block.extend(&head);
            block.extend((offset as u16).to_le_bytes());
            if ml >= 15 {
                extend_length(&mut block, ml - 15);
            }
            block.push(0xD0);
            block.extend(TAIL);
            decodes(&block, &raw);
        }
    }
}

/// The last literals of hand-built blocks: 13 bytes, so that a match before them keeps LZ4's
/// end-of-block rules.
const TAIL: &[u8; 13] = b"the tail ends";

fn extend_length(block: &mut Vec<u8>, mut rest: usize) {
    while rest >= 255 {
        block.push(255);
        rest -= 255;
    }
    block.push(rest as u8);
}

#[test]
fn each_status_names_its_flaw() {
    let good = [0x84, b'a', b'b', b'c', b'd', b'e', b'f', b'g', b'h', 8, 0, 0x50, b'1', b'2', b'3', b'4', b'5'];
    let with = |i: usize, byte: u8| {
        let mut block = good;
        block[i] = byte;
        block
    };
    let status = |block: &[u8], n: usize| ours(block, n).0;
    assert_eq!(status(&good, 21), OK);
    assert_eq!(status(&with(0, 0xF4), 21), LITERALS_PAST_INPUT);
    assert_eq!(status(&with(9, 0), 21), BAD_OFFSET);
    assert_eq!(status(&with(9, 9), 21), BAD_OFFSET);
    assert_eq!(status(&good, 7), PAST_CAPACITY);
    assert_eq!(status(&with(0, 0x8A), 21), PAST_CAPACITY);
    assert_eq!(status(&[], 5), INPUT_ENDS);
    assert_eq!(status(&[0xF0], 20), INPUT_ENDS);
    assert_eq!(status(&good, 22), LENGTH_MISMATCH);
    assert_eq!(status(&with(0, 0x83), 21), LENGTH_MISMATCH);
    // A match 9 bytes before the end: lz4_flex decodes it, LZ4_decompress_safe does not.
    let early = [0x50, b'a', b'b', b'c', b'd', b'e', 1, 0, 0x50, b'1', b'2', b'3', b'4', b'5'];
    assert_eq!(status(&early, 14), END_RULES);
    assert!(flex(&early, 14).is_some() && reference(&early, 14).is_none());
    assert_eq!(status(&good[..11], 21), END_RULES);
    // "abcde", a match of `m` from 1 back, `last` literals: the rules' exact edges.
    let edge = |m: usize, last: usize| {
        let mut block = vec![0x50 | (m - 4) as u8, b'a', b'b', b'c', b'd', b'e', 1, 0, (last as u8) << 4];
        block.extend((0..last).map(|i| b'0' + i as u8));
        status(&block, 5 + m + last)
    };
    assert_eq!(edge(4, 8), OK); // the match starts 12 bytes before the end
    assert_eq!(edge(4, 7), END_RULES); // 11
    assert_eq!(edge(7, 5), OK); // it ends 5 bytes before the end
    assert_eq!(edge(8, 4), END_RULES); // 4
    assert_eq!(status(&[0, 0], 0), END_RULES);
    assert_eq!(status(&[0x10, b'a'], 0), PAST_CAPACITY);
    // Every code has words, and a tag in the high bits does not change them.
    for code in OK..=END_RULES {
        assert_eq!(status_text(code | 0x4000_1200), status_text(code));
        assert_ne!(status_text(code), status_text(99));
    }
}

/// Blocks side by side in one call: each its own status and bytes, a damaged one beside good
/// ones changing nothing of theirs.
#[test]
fn a_batch_of_blocks_decodes_each_alone() {
    let raws: Vec<Vec<u8>> = (0..24).map(|k| data(k * 997 + (k % 3) * 40_000, k as u64 + 1, k as u8)).collect();
    let mut blocks: Vec<Vec<u8>> = raws.iter().map(|r| lz4_flex::block::compress(r)).collect();
    let damaged = 7;
    let cut = blocks[damaged].len() / 2;
    blocks[damaged].truncate(cut);
    for threads in HostThreads::ALL {
        let mut outs: Vec<Vec<u8>> = raws.iter().map(|r| vec![0u8; r.len()]).collect();
        let mut pairs: Vec<(&[u8], &mut [u8])> =
            blocks.iter().map(Vec::as_slice).zip(outs.iter_mut().map(Vec::as_mut_slice)).collect();
        let results = decode_on_host(&mut pairs, threads);
        for (k, (status, decoded)) in results.iter().enumerate() {
            if k == damaged {
                assert_ne!(*status, OK);
            } else {
                assert_eq!((*status, *decoded), (OK, raws[k].len() as u64), "block {k}: {}", status_text(*status));
                assert!(outs[k] == raws[k], "block {k} differs");
            }
        }
    }
}

/// A Blosc chunk of `data` as c-blosc writes it (byte shuffle, typesize 4, its own blocksize).
pub(crate) fn blosc_compress(data: &[u8], cname: &str, clevel: i32) -> Vec<u8> {
    let mut out = vec![0u8; data.len() + 16];
    let cname = std::ffi::CString::new(cname).unwrap();
    // SAFETY: buffers of the lengths given; c-blosc writes at most `out.len()` bytes.
    let n = unsafe {
        blosc_src::blosc_compress_ctx(
            clevel,
            1,
            4,
            data.len(),
            data.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            out.len(),
            cname.as_ptr(),
            0,
            1,
        )
    };
    assert!(n > 0, "c-blosc could not compress ({n})");
    out.truncate(n as usize);
    out
}

/// The B1 benchmark's kind of data: c-blosc lz4 and lz4hc at several levels, byte shuffle,
/// float32 in 1 MiB chunks, every stream through ours, equal to lz4_flex's decode of it.
#[test]
fn blosc_streams_of_1_mib_chunks_decode() {
    use crate::codecs::blosc::header::parse_chunk;
    let raw: Vec<u8> = (0..1u32 << 18)
        .flat_map(|i| {
            let v = (i as f32 * 0.001).sin() * 1000.0 + ((i.wrapping_mul(2_654_435_761) >> 28) as f32);
            v.round().to_le_bytes()
        })
        .collect();
    let mut streams = 0;
    for (cname, level) in [("lz4", 1), ("lz4", 5), ("lz4", 9), ("lz4hc", 5), ("lz4hc", 9)] {
        let chunk = blosc_compress(&raw, cname, level);
        let parsed = parse_chunk(&chunk, raw.len() as u64).unwrap();
        for s in parsed.streams.iter().filter(|s| !s.raw) {
            let payload = &chunk[parsed.payload(s)];
            let expected = lz4_flex::block::decompress(payload, s.dst_len).unwrap();
            decodes(payload, &expected);
            streams += 1;
        }
    }
    assert!(streams >= 5 * 4, "{streams} compressed streams");
}

/// Sizes from 0 to 1 MiB, every kind of data, lz4_flex's encoder and lz4hc's at low and high
/// levels.
#[test]
fn blocks_up_to_1_mib_decode() {
    for (k, len) in [0usize, 1, 5, 12, 13, 64, 1000, 65_535, 65_536, 65_537, 300_001, 1 << 20].into_iter().enumerate() {
        for kind in 0..5u8 {
            let raw = data(len, k as u64 * 31 + u64::from(kind), kind);
            decodes(&lz4_flex::block::compress(&raw), &raw);
            decodes(&lz4hc(&raw, 9), &raw);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random data of every compressibility: lz4_flex's and lz4hc's blocks decode to it.
    #[test]
    fn compressed_blocks_decode(len in prop_oneof![0usize..300, 0usize..70_000], seed: u64, kind in 0u8..5, level in 1i32..=12) {
        let raw = data(len, seed, kind);
        let (status, out, _) = ours(&lz4_flex::block::compress(&raw), len);
        prop_assert_eq!(status, OK);
        prop_assert!(out == raw);
        let (status, out, _) = ours(&lz4hc(&raw, level), len);
        prop_assert_eq!(status, OK);
        prop_assert!(out == raw);
    }

    /// Damaged blocks (bytes changed, bits flipped, cut short, the expected length off): the
    /// agreement with lz4_flex, the reference and the walk.
    #[test]
    fn damaged_blocks_agree(
        len in 0usize..5000,
        seed: u64,
        kind in 0u8..5,
        hc in any::<bool>(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
        flips in proptest::collection::vec((any::<proptest::sample::Index>(), 0u8..8), 0..4),
        cut in proptest::option::of(any::<proptest::sample::Index>()),
        delta in prop_oneof![4 => Just(0i64), 1 => -3i64..=3],
    ) {
        let raw = data(len, seed, kind);
        let mut block = if hc { lz4hc(&raw, 9) } else { lz4_flex::block::compress(&raw) };
        for (at, byte) in &edits {
            let at = at.index(block.len());
            block[at] = *byte;
        }
        for (at, bit) in &flips {
            let at = at.index(block.len());
            block[at] ^= 1 << bit;
        }
        if let Some(cut) = cut {
            block.truncate(cut.index(block.len() + 1));
        }
        agrees(&block, (len as i64 + delta).max(0) as usize)?;
    }

    /// Random bytes, short and long.
    #[test]
    fn random_bytes_agree(block in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(any::<u8>(), 0..2000),
    ], n in prop_oneof![0usize..200, 0usize..100_000]) {
        agrees(&block, n)?;
    }

    /// Blocks of random sequences near the end-of-block rules (lengths on both sides of the
    /// extension, offsets anywhere), which random bytes rarely form.
    #[test]
    fn random_sequences_agree(
        sequences in proptest::collection::vec((0usize..40, 4usize..300, 0u16..=u16::MAX), 0..30),
        last in 0usize..20,
        delta in prop_oneof![Just(0i64), -2i64..=2],
    ) {
        let mut block = Vec::new();
        let mut op = 0usize;
        for &(literals, matched, offset) in &sequences {
            block.push(((literals.min(15) as u8) << 4) | (matched - 4).min(15) as u8);
            if literals >= 15 {
                extend_length(&mut block, literals - 15);
            }
            block.extend((0..literals).map(|i| (op + i) as u8));
            op += literals;
            // Mostly within the bytes so far.
            let offset = if op > 0 && offset % 8 != 0 { 1 + usize::from(offset) % op } else { usize::from(offset) };
            block.extend((offset.min(0xFFFF) as u16).to_le_bytes());
            if matched - 4 >= 15 {
                extend_length(&mut block, matched - 4 - 15);
            }
            op += matched;
        }
        block.push((last.min(15) as u8) << 4);
        if last >= 15 {
            extend_length(&mut block, last - 15);
        }
        block.extend((0..last).map(|i| i as u8));
        agrees(&block, ((op + last) as i64 + delta).max(0) as usize)?;
    }
}

/// Writes the cases and B1 streams `benches/lz4_decoder.py` runs on the GPU (to `$LZ4_DUMP` and
/// `$LZ4_DUMP.b1`): each case's block, expected length, and this CPU run's status, decoded length
/// and bytes, which the GPU's must equal.
#[test]
#[ignore = "writes the GPU harness's cases: run by hand with LZ4_DUMP set"]
fn dump_cases_for_the_gpu_harness() {
    use std::io::Write;
    let path = std::env::var("LZ4_DUMP").expect("LZ4_DUMP: where to write the cases");
    let mut f = std::fs::File::create(path).unwrap();
    let mut cases: Vec<(Vec<u8>, usize)> = Vec::new();
    for (k, len) in [0usize, 1, 13, 1000, 65_536, 300_001, 1 << 20].into_iter().enumerate() {
        for kind in 0..5u8 {
            let raw = data(len, k as u64 * 31 + u64::from(kind), kind);
            cases.push((lz4_flex::block::compress(&raw), len));
            cases.push((lz4hc(&raw, 9), len));
            let mut bad = lz4_flex::block::compress(&raw);
            let n = bad.len();
            bad[n / 2] ^= 0x10;
            cases.push((bad.clone(), len));
            bad.truncate(n / 3);
            cases.push((bad, len));
        }
    }
    let mut state = 7u64;
    for i in 0..2000usize {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let len = (state >> 50) as usize % 3000;
        let block: Vec<u8> = (0..len).map(|j| (state >> (j % 56)) as u8 ^ j as u8).collect();
        cases.push((block, i * 7 % 5000));
    }
    for kind in 0..5u8 {
        for overlap in 1..40usize {
            let raw = data(20_000, overlap as u64, kind);
            let mut block = lz4_flex::block::compress(&raw);
            let n = block.len();
            block[(overlap * 97) % n] ^= 1 << (overlap % 8);
            cases.push((block, 20_000));
        }
    }
    for (block, n) in &cases {
        let (status, out, decoded) = ours(block, *n);
        for v in [block.len() as u32, *n as u32, status, decoded as u32] {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        f.write_all(block).unwrap();
        f.write_all(&out).unwrap();
    }
    // B1-like: c-blosc lz4 streams of 1 MiB chunks, for the timing.
    let raw: Vec<u8> = (0..1u32 << 18)
        .flat_map(|i| {
            let v = (i as f32 * 0.001).sin() * 1000.0 + ((i.wrapping_mul(2_654_435_761) >> 28) as f32);
            v.round().to_le_bytes()
        })
        .collect();
    let chunk = blosc_compress(&raw, "lz4", 5);
    let parsed = crate::codecs::blosc::header::parse_chunk(&chunk, raw.len() as u64).unwrap();
    let mut g = std::fs::File::create(std::env::var("LZ4_DUMP").unwrap() + ".b1").unwrap();
    for s in parsed.streams.iter().filter(|s| !s.raw) {
        let payload = &chunk[parsed.payload(s)];
        for v in [payload.len() as u32, s.dst_len as u32] {
            g.write_all(&v.to_le_bytes()).unwrap();
        }
        g.write_all(payload).unwrap();
    }
    eprintln!("{} cases, {} B1 streams", cases.len(), parsed.streams.len());
}

#[test]
fn few_streams_get_many_threads_and_many_streams_fewer() {
    // An H100's 132 multiprocessors: a stream each or fewer 1,024 threads, more 512.
    assert_eq!([8, 132, 133, 512, 8192].map(|n| threads_for(n, 132)), [1024, 1024, 512, 512, 512]);
    assert!(HostThreads::ALL.contains(&HostThreads::Emulated(threads_for(1, 1))));
    assert!(HostThreads::ALL.contains(&HostThreads::Emulated(threads_for(1000, 1))));
}

/// A block of `tokens` 4-byte tokens (a literal, its 2-byte offset, a match of 4) and 8 literals
/// to end it, and its bytes: 1,024 tokens a 4 KiB tile, so each tile ends where a round of 512
/// does.
fn tile_edge_block(tokens: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let (mut block, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..tokens {
        let literal = next() as u8;
        block.extend([0x10, literal]);
        raw.push(literal);
        let offset = 1 + next() as usize % raw.len().min(65_535);
        block.extend((offset as u16).to_le_bytes());
        for _ in 0..4 {
            raw.push(raw[raw.len() - offset]);
        }
    }
    let tail: Vec<u8> = (0..8).map(|_| next() as u8).collect();
    block.push(0x80);
    block.extend(&tail);
    raw.extend(&tail);
    (block, raw)
}

/// The kernel's threads as OS threads, thread 0 let run ahead after each barrier: a block whose
/// rounds end at its tiles' ends decodes to its bytes, and every thread passes the same
/// barriers. Before 1c7f0ea a thread could read the next round's `need_tile` (set by thread 0's
/// chain) and move the tile alone, its barriers matched with the others' elsewhere: valid
/// chunks failed on the GPU now and then (run DT1), and here every time.
#[test]
fn threads_left_behind_by_thread_0_keep_step() {
    let (block, raw) = tile_edge_block(3000, 7);
    assert_eq!(flex(&block, raw.len()).as_deref(), Some(&raw[..]), "the block is valid LZ4");
    for threads in [32, 256] {
        let mut out = vec![0u8; raw.len()];
        let (status, decoded, fewest, most) = decode_on_lanes(&block, &mut out, threads, 20);
        assert_eq!(fewest, most, "{threads} threads passed different barriers");
        assert_eq!((status, decoded), (OK, raw.len() as u64), "{threads} threads: {}", status_text(status));
        assert!(out == raw, "{threads} threads decoded other bytes");
    }
}
