//! The device zstd kernel's code run on the CPU, against libzstd (the `zstd` crate): frames of
//! every level, window, block kind and literals mode decode to libzstd's bytes, and damaged
//! frames that libzstd rejects are errors here too.

use std::io::Write;

use proptest::prelude::*;

use super::*;
use crate::codecs::zstd::frame::chain::SPANS;

/// Guard bytes after each output: the kernel must leave them alone.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;

/// One decoder's run on `frame` into a guarded output of `expected` bytes: status, bytes, length.
fn run(frame: &[u8], expected: usize, path: HostPath) -> (u32, Vec<u8>, u64) {
    let mut out = vec![GUARD_BYTE; expected + GUARD];
    let (head, tail) = out.split_at_mut(expected);
    let [(status, decoded)] = decode_on_host(&mut [(frame, head)], path)[..] else { unreachable!() };
    assert!(tail.iter().all(|&b| b == GUARD_BYTE), "the kernel wrote past the output");
    assert!(decoded <= expected as u64);
    out.truncate(expected);
    (status, out, decoded)
}

/// Our decode of `frame` into an output of `expected` bytes (guarded), by the block-parallel
/// decoder with its bytes resolved by jumps, which must accept exactly what its executing path
/// and the one-warp decoder accept, with the same bytes: the status (a frame with a content
/// checksum that does not match its bytes counts as an error, as the pipeline's check makes it),
/// the bytes and the decoded length.
fn ours(frame: &[u8], expected: usize) -> (u32, Vec<u8>, u64) {
    let (mut status, out, decoded) = run(frame, expected, HostPath::Jump);
    for other in [HostPath::Execute, HostPath::ExecuteThreads(64), HostPath::ExecuteThreads(32), HostPath::OneWarp] {
        let (theirs, their_out, _) = run(frame, expected, other);
        assert_eq!(
            status == OK,
            theirs == OK,
            "the decoders disagree: jumps {}, {other:?} {}",
            status_text(status),
            status_text(theirs)
        );
        if status == OK {
            assert!(out == their_out, "{other:?} decoded other bytes");
        }
    }
    if status == OK && frame.len() > 4 && frame[4] & 4 != 0 {
        let stored = u32::from_le_bytes(frame[frame.len() - 4..].try_into().unwrap());
        if twox_hash::XxHash64::oneshot(0, &out) as u32 != stored {
            status = u32::MAX;
        }
    }
    (status, out, decoded)
}

#[test]
fn a_batch_of_frames_good_and_damaged_decodes_each_as_alone() {
    // Frames of several kinds and sizes, some damaged, some empty, in one batch: each path gives
    // every frame the status and bytes it gets alone (their slots laid end to end).
    let mut frames = Vec::new();
    for k in 0..14usize {
        let n = [0usize, 1, 700, 40_000, 131_073, 300_000][k % 6];
        let raw = data(k, n, 40 + k as u64);
        let mut frame = compress(&raw, [1, 3, 9, -2][k % 4], k % 2 == 0, None, k % 3 != 0);
        if k % 5 == 4 && frame.len() > 20 {
            let at = frame.len() / 2;
            frame[at] ^= 0x21;
        }
        frames.push((frame, raw));
    }
    for path in [HostPath::Jump, HostPath::Execute, HostPath::OneWarp] {
        let mut outs: Vec<Vec<u8>> = frames.iter().map(|(_, raw)| vec![0u8; raw.len()]).collect();
        let mut batch: Vec<(&[u8], &mut [u8])> =
            frames.iter().zip(outs.iter_mut()).map(|((f, _), o)| (&f[..], &mut o[..])).collect();
        let results = decode_on_host(&mut batch, path);
        for (k, ((frame, raw), (status, _))) in frames.iter().zip(&results).enumerate() {
            let (alone, alone_out, _) = run(frame, raw.len(), path);
            assert_eq!(
                *status,
                alone,
                "{path:?} frame {k}: {} alone, {} in the batch",
                status_text(alone),
                status_text(*status)
            );
            // (A damaged frame may still decode: its checksum, where it has one, tells.)
            if *status == OK {
                assert!(outs[k] == alone_out, "{path:?} frame {k}: other bytes than alone");
                assert!(k % 5 == 4 || alone_out == *raw, "{path:?} frame {k}: other bytes than libzstd's input");
            }
        }
        assert!(results.iter().filter(|(s, _)| *s == OK).count() >= 10, "{path:?}: {results:?}");
    }
}

#[test]
fn the_plan_structs_are_laid_out_as_the_host_lays_them_out() {
    assert_eq!(plan_sizes_on_host(), (FRAME_PLAN, BLOCK_PLAN));
}

#[test]
fn an_executor_launch_of_another_shape_makes_every_frame_an_error() {
    let raw = data(3, 300_000, 9);
    let frame = compress(&raw, 3, false, None, true);
    assert_eq!(run(&frame, raw.len(), HostPath::ExecuteThreads(128)).1, raw);
    for threads in [0, 48, 256] {
        let (status, _, decoded) = run(&frame, raw.len(), HostPath::ExecuteThreads(threads));
        assert_eq!((status, decoded), (BAD_FRAME, 0), "{threads} threads");
    }
}

#[test]
fn the_executor_launches_as_many_threads_as_its_rounds_take_sequences() {
    assert!(
        SOURCE.contains(&format!("#define ZS_EXEC_THREADS {EXEC_THREADS}u")),
        "EXEC_THREADS differs from bytes.cu's"
    );
}

#[test]
fn the_jump_passes_resolve_the_longest_chain_a_frame_can_hold() {
    assert!(SOURCE.contains(&format!("#define ZS_HOPS {HOPS}u")), "HOPS differs from bytes.cu's");
    assert_eq!([1, 2, 33, 34, 1089, 1090, 1 << 20, 64 << 20].map(jump_passes), [1, 1, 1, 2, 2, 3, 4, 6]);
    // Entry 0 a value, every other a pointer to the entry before it: the deepest chains a frame
    // of `n` bytes holds. The CPU runs each pass last entry first, so that every target is read
    // before the pass moves it: the order the count is made for. The count resolves them all,
    // one pass fewer does not.
    for n in [2u32, 33, 34, 35, 33 * 33, 33 * 33 + 1, 300_000] {
        let chain = || -> Vec<u32> { (0..n).map(|i| if i == 0 { 0x8000_0000 | 0x5A } else { i - 1 }).collect() };
        let passes = jump_passes(u64::from(n));
        for (run, expect_all) in [(passes, true), (passes - 1, false)] {
            let mut entries = chain();
            let mut flags = vec![0u32; passes as usize];
            // SAFETY: n entries, each pointing within them; `passes` flags.
            unsafe { zstd_jump_on_host(entries.as_mut_ptr(), u64::from(n), flags.as_mut_ptr(), run) };
            let resolved = entries.iter().filter(|&&e| e == 0x8000_005A).count();
            if expect_all {
                assert_eq!(resolved, n as usize, "{n} entries, {run} passes");
            } else if run > 0 {
                assert!(resolved < n as usize, "{n} entries: {run} passes resolved all");
            }
        }
    }
}

#[test]
fn a_jump_pass_over_pointers_in_a_cycle_ends_and_leaves_them_unresolved() {
    // What a reused scratch may hold where a frame in error left its entries unwritten.
    let mut entries = vec![3u32, 0x8000_0001, 5, 0, 9, 2, 0xFFFF_FFF0 & !0x8000_0000];
    let mut flags = [0u32; 4];
    // SAFETY: 7 entries (pointers past them are not followed), 4 flags.
    unsafe { zstd_jump_on_host(entries.as_mut_ptr(), 7, flags.as_mut_ptr(), 4) };
    assert_eq!(entries[1], 0x8000_0001);
    for i in [0, 2, 3, 5] {
        assert_eq!(entries[i] & 0x8000_0000, 0, "entry {i} of a cycle came out resolved");
    }
    assert_eq!(flags, [1, 1, 1, 1], "each pass saw pointers left");
}

/// libzstd's one-shot decode into a buffer of `n`: the bytes, where it decodes exactly `n`.
fn libzstd(frame: &[u8], n: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; n];
    match zstd::bulk::Decompressor::new().ok()?.decompress_to_buffer(frame, &mut out) {
        Ok(len) if len == n => Some(out),
        _ => None,
    }
}

/// Our verdict agrees with libzstd's: the same bytes where it decodes (unless ours refuses for a
/// rule of the format that libzstd leaves out: then `Err`), an error wherever it errs.
fn agrees(frame: &[u8], n: usize) -> Result<bool, String> {
    let (status, out, _) = ours(frame, n);
    match (libzstd(frame, n), status) {
        (Some(want), OK) => {
            if out != want {
                let at = out.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!("ours decoded other bytes than libzstd (first at {at} of {n})"));
            }
            Ok(true)
        }
        (None, OK) => Err("ours decoded a frame libzstd rejects".into()),
        (Some(_), _) => Ok(false),
        (None, _) => Ok(true),
    }
}

/// A xorshift generator started at `seed` (made odd: never stuck at 0).
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Data of several kinds: incompressible, runs, text-like, small integers as float32 (what Zarr
/// chunks hold), a repeating pattern with long matches.
fn data(kind: usize, n: usize, seed: u64) -> Vec<u8> {
    let mut next = xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    match kind % 6 {
        0 => (0..n).map(|_| next() as u8).collect(),
        1 => {
            let mut v = Vec::with_capacity(n);
            while v.len() < n {
                let (b, run) = (next() as u8 % 4, 1 + next() as usize % 300);
                v.extend(std::iter::repeat_n(b, run.min(n - v.len())));
            }
            v
        }
        2 => {
            let words = ["zarr ", "chunk ", "shard ", "the ", "of ", "gpu ", "decode ", "frame\n", "a ", "zstd "];
            let mut v = Vec::with_capacity(n + 8);
            while v.len() < n {
                v.extend_from_slice(words[next() as usize % words.len()].as_bytes());
            }
            v.truncate(n);
            v
        }
        3 => {
            let mut v = Vec::with_capacity(n + 4);
            let mut t = 0f32;
            while v.len() < n {
                t += (next() % 7) as f32 - 3.0;
                v.extend_from_slice(&t.to_le_bytes());
            }
            v.truncate(n);
            v
        }
        4 => {
            let pattern: Vec<u8> = (0..=(next() as usize % 5000)).map(|_| next() as u8).collect();
            (0..n).map(|i| pattern[i % pattern.len()] ^ u8::from(next().is_multiple_of(997))).collect()
        }
        _ => (0..n).map(|i| ((i / 3) as u8).wrapping_mul(7) ^ (next() % 3) as u8).collect(),
    }
}

fn compress(raw: &[u8], level: i32, checksum: bool, window_log: Option<u32>, content_size: bool) -> Vec<u8> {
    let mut c = zstd::bulk::Compressor::new(level).unwrap();
    c.include_checksum(checksum).unwrap();
    c.include_contentsize(content_size).unwrap();
    if let Some(log) = window_log {
        c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(log)).unwrap();
    }
    c.compress(raw).unwrap()
}

/// A frame written by the streaming encoder in small writes (no content size; blocks cut where
/// the writes end).
fn streamed(raw: &[u8], level: i32, checksum: bool, piece: usize) -> Vec<u8> {
    let mut e = zstd::stream::Encoder::new(Vec::new(), level).unwrap();
    e.include_checksum(checksum).unwrap();
    for part in raw.chunks(piece.max(1)) {
        e.write_all(part).unwrap();
        e.flush().unwrap();
    }
    e.finish().unwrap()
}

#[test]
fn frames_of_every_kind_and_level_decode_to_libzstds_bytes() {
    let sizes = [0usize, 1, 7, 100, 1023, 4096, 70_000, 131_072, 131_073, 300_001];
    let levels = [-7, -1, 1, 3, 6, 12, 19, 22];
    let mut frames = 0;
    for (i, &n) in sizes.iter().enumerate() {
        for kind in 0..6 {
            let raw = data(kind, n, (i * 7 + kind) as u64);
            for (j, &level) in levels.iter().enumerate() {
                if n > 140_000 && j % 3 != 0 {
                    continue; // the slow levels on the largest inputs, a few only
                }
                let checksum = (i + j) % 2 == 0;
                let frame = compress(&raw, level, checksum, None, (i + kind) % 3 != 0);
                let (status, out, decoded) = ours(&frame, n);
                assert_eq!(status, OK, "size {n} kind {kind} level {level}: {}", status_text(status));
                assert_eq!(decoded, n as u64);
                assert!(out == raw, "size {n} kind {kind} level {level}: other bytes");
                frames += 1;
            }
        }
    }
    assert!(frames > 300, "{frames}");
}

#[test]
fn small_windows_streamed_frames_and_long_offsets() {
    for (k, n) in [5_000usize, 200_000, 600_000].into_iter().enumerate() {
        for kind in [2usize, 3, 4, 5] {
            let raw = data(kind, n, 31 + k as u64);
            for log in [10u32, 12, 17, 20] {
                let frame = compress(&raw, 5, k % 2 == 0, Some(log), true);
                let (status, out, _) = ours(&frame, n);
                assert_eq!(status, OK, "window 2^{log}, size {n}, kind {kind}: {}", status_text(status));
                assert!(out == raw);
            }
            for piece in [1000usize, 65_536] {
                let frame = streamed(&raw, 3, true, piece);
                let (status, out, _) = ours(&frame, n);
                assert_eq!(status, OK, "streamed in {piece}, size {n}, kind {kind}: {}", status_text(status));
                assert!(out == raw);
            }
        }
    }
    // A match far back: a block of noise repeated 1.5 MiB later, with a window that reaches it.
    let noise = data(0, 40_000, 9);
    let mut raw = noise.clone();
    raw.extend(data(3, 1_500_000, 10));
    raw.extend(&noise);
    let frame = compress(&raw, 19, false, Some(22), true);
    let (status, out, _) = ours(&frame, raw.len());
    assert_eq!(status, OK, "{}", status_text(status));
    assert!(out == raw);
}

#[test]
fn a_frame_must_decode_to_exactly_the_expected_length() {
    let raw = data(2, 50_000, 3);
    for content_size in [true, false] {
        let frame = compress(&raw, 3, false, None, content_size);
        for n in [0usize, 49_999, 50_001] {
            let (status, _, _) = ours(&frame, n);
            assert!(matches!(status, PAST_CAPACITY | SIZE_MISMATCH), "expected {n}: {}", status_text(status));
        }
    }
    // Bytes after the frame, a second frame, nothing at all, a skippable frame.
    let frame = compress(&raw, 3, false, None, true);
    let mut two = frame.clone();
    two.extend(&frame);
    assert_ne!(ours(&two, 100_000).0, OK);
    assert_eq!(ours(&two, 50_000).0, BAD_FRAME);
    let mut tail = frame.clone();
    tail.push(0);
    assert_ne!(ours(&tail, 50_000).0, OK);
    assert_eq!(ours(&[], 0).0, OK);
    assert_ne!(ours(&[], 1).0, OK);
    assert_ne!(ours(&[0x50, 0x2A, 0x4D, 0x18, 0, 0, 0, 0], 0).0, OK);
}

#[test]
fn damaged_frames_libzstd_rejects_are_errors() {
    let mut checked = 0usize;
    let mut refused_valid = 0usize;
    for (k, kind) in [0usize, 2, 3, 4, 5, 1].into_iter().enumerate() {
        let n = [3000usize, 20_000, 140_000][k % 3];
        let raw = data(kind, n, 77 + k as u64);
        for (level, checksum) in [(1, false), (3, true), (19, false)] {
            let frame = compress(&raw, level, checksum, None, k % 2 == 0);
            let mut next = xorshift(frame.len() as u64 * 2_654_435_761 + k as u64);
            for trial in 0..120 {
                let mut bad = frame.clone();
                match trial % 4 {
                    0 => {
                        let at = next() as usize % bad.len();
                        bad[at] ^= 1 << (next() % 8);
                    }
                    1 => {
                        let at = next() as usize % bad.len();
                        bad[at] = next() as u8;
                    }
                    2 => bad.truncate(next() as usize % bad.len()),
                    _ => {
                        // Damage near the start, where the headers and tables are.
                        let at = next() as usize % bad.len().min(40);
                        bad[at] ^= 1 << (next() % 8);
                    }
                }
                match agrees(&bad, n) {
                    Ok(true) => checked += 1,
                    Ok(false) => refused_valid += 1,
                    Err(what) => panic!("kind {kind} level {level} trial {trial}: {what}"),
                }
            }
        }
    }
    assert!(checked > 1500, "{checked} checked, {refused_valid} refused where libzstd decodes");
}

/// `n` frames of `len` bytes (data kinds 2 on) at zstd level 3 with a window of `2^window_log`
/// bytes (so blocks of that size at most), and the plan of their batch.
fn frames_of_small_blocks(n: usize, len: usize, window_log: u32) -> (Vec<Vec<u8>>, Vec<Vec<u8>>, BlockPlan) {
    let raws: Vec<Vec<u8>> = (0..n).map(|k| data(2 + k, len, 900 + k as u64)).collect();
    let frames: Vec<Vec<u8>> = raws.iter().map(|raw| compress(raw, 3, false, Some(window_log), true)).collect();
    let stored: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
    let capacities: Vec<u64> = raws.iter().map(|r| r.len() as u64).collect();
    let plan = BlockPlan::device_walks(&stored, &capacities);
    (raws, frames, plan)
}

#[test]
fn a_launch_of_many_blocks_takes_a_lane_a_block_where_its_tables_fit_the_bound() {
    // Nine frames of 8 KiB blocks, 3,300 blocks in all: more than a launch splits into spans,
    // their tables within the scratch the pipeline gives the batch (its bound): a lane a block,
    // and its bytes libzstd's on both paths.
    let (raws, frames, plan) = frames_of_small_blocks(9, 3_000_000, 13);
    assert!(plan.slots.blocks > SPLIT_BLOCKS, "{:?}", plan.slots);
    assert_eq!(plan.split, LANES);
    assert!(plan.len <= BlockPlan::bound(raws.len(), raws.iter().map(Vec::len).sum()));
    for path in [HostPath::Jump, HostPath::Execute] {
        let mut outs: Vec<Vec<u8>> = raws.iter().map(|raw| vec![0u8; raw.len()]).collect();
        let mut batch: Vec<(&[u8], &mut [u8])> =
            frames.iter().zip(outs.iter_mut()).map(|(f, o)| (&f[..], &mut o[..])).collect();
        let results = decode_on_host_split(&mut batch, path, plan.split, Chains::Rule);
        for ((status, decoded), (out, raw)) in results.iter().zip(outs.iter().zip(&raws)) {
            assert_eq!((*status, *decoded), (OK, raw.len() as u64), "{path:?}");
            assert!(out == raw, "{path:?}");
        }
    }
    // Blocks of 1 KiB: more blocks than the bound counts on (4 KiB each), their tables past it:
    // a warp a block, lane 0 decoding its sequences.
    let (raws, _, plan) = frames_of_small_blocks(2, 1_700_000, 10);
    assert!(plan.slots.blocks > SPLIT_BLOCKS, "{:?}", plan.slots);
    assert_eq!(plan.split, 1);
    assert!(plan.with_split(LANES).len > BlockPlan::bound(2, raws.iter().map(Vec::len).sum()));
}

#[test]
fn sequences_split_into_spans_decode_as_one_lane_walks_them() {
    // Blocks of thousands of sequences (float32-like and text-like data, 1 MiB frames of 128 KiB
    // blocks), whole and damaged: split into 2, 7 and 32 spans a block, their chains walked by
    // the device's lane 0 or by the host, and a lane a block in a launch of their own (their
    // tables from the warps'), each frame gets the very status, decoded length and bytes it gets
    // with one lane of a warp a block walking its sequences.
    let mut cases = 0usize;
    let mut errors = 0usize;
    for (k, kind) in [3usize, 2, 5, 4].into_iter().enumerate() {
        let raw = data(kind, [1 << 20, 300_000][k % 2], 500 + k as u64);
        for level in [1, 3, 19] {
            if level == 19 && raw.len() > 300_000 {
                continue;
            }
            let frame = compress(&raw, level, k % 2 == 0, None, true);
            let mut next = xorshift(frame.len() as u64 ^ (k as u64) << 40);
            for trial in 0..24 {
                let mut bad = frame.clone();
                // Past the headers: within the blocks' literals and sequences.
                if trial > 0 {
                    let at = 64 + next() as usize % (bad.len() - 64);
                    match trial % 3 {
                        0 => bad[at] ^= 1 << (next() % 8),
                        1 => bad[at] = next() as u8,
                        _ => bad.truncate(at),
                    }
                }
                let one_lane = {
                    let mut out = vec![0u8; raw.len()];
                    let r = decode_on_host_split(&mut [(&bad, &mut out[..])], HostPath::Jump, 1, Chains::Device);
                    (r, out)
                };
                let lanes = (LANES, Chains::Device);
                for (split, chains) in [2, 7, 32]
                    .into_iter()
                    .flat_map(|s| [(s, Chains::Device), (s, Chains::Host(&|_| {}))])
                    .chain([lanes])
                {
                    let mut out = vec![0u8; raw.len()];
                    let r = decode_on_host_split(&mut [(&bad, &mut out[..])], HostPath::Jump, split, chains);
                    let who = if matches!(chains, Chains::Device) { "device" } else { "host" };
                    assert_eq!(r, one_lane.0, "kind {kind} level {level} trial {trial}: {split} spans, {who} chains");
                    if r[0].0 == OK {
                        assert!(out == one_lane.1, "kind {kind} level {level} trial {trial}: {split} spans' bytes");
                    }
                }
                if trial == 0 {
                    assert_eq!(one_lane.0[0].0, OK);
                    assert!(one_lane.1 == raw);
                }
                cases += 1;
                errors += usize::from(one_lane.0[0].0 != OK);
            }
        }
    }
    assert!(cases >= 200 && errors > cases / 3, "{cases} cases, {errors} errors");
}

/// A frame of `units` blocks of 131,072 bytes after 5 MiB or more of fresh bytes, each 40,000
/// fresh bytes, then 70,000 copied from the frame's first bytes (over 5 MiB back: offset code 22),
/// then text: a sequence of a literal length of 15 extra bits, a match length of 16 and an offset
/// code of 22 first in each block, beside a few thousand short ones. Its bytes and the frame.
fn frame_of_long_sequences(units: usize) -> (Vec<u8>, Vec<u8>) {
    const SOURCE: usize = 70_000;
    let mut raw = data(0, units * SOURCE, 71);
    // Fresh bytes up to a block's end after 5 MiB (with text there, zstd coded all but the last
    // block's long sequences otherwise).
    raw.extend(data(0, (5 << 20) - raw.len() % (128 << 10), 72));
    for u in 0..units {
        raw.extend(data(0, 40_000, 80 + u as u64));
        raw.extend_from_within(u * SOURCE..(u + 1) * SOURCE);
        raw.extend(data(2, (128 << 10) - 110_000, 90 + u as u64));
    }
    let mut c = zstd::bulk::Compressor::new(3).unwrap();
    c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(23)).unwrap();
    c.set_parameter(zstd::zstd_safe::CParameter::EnableLongDistanceMatching(true)).unwrap();
    let frame = c.compress(&raw).unwrap();
    (raw, frame)
}

#[test]
fn sequences_of_the_most_bits_are_walked_at_every_alignment_of_their_stream() {
    // The device's chain walk reads a sequence's state bits from the four words below the unread
    // bits' top, the lowest of those only for sequences of 66 bits or more (`blocks.cu`,
    // ZS_SEQUENCE_BITS): at the stream's four byte alignments, one of 74 bits or more takes it at
    // one of them at least. Such a sequence is each block's first (span 0's), so a wrong read
    // there moves every later span's start.
    let (raw, frame) = frame_of_long_sequences(4);
    let widest = frame_walks(&frame, 0)
        .iter()
        .filter_map(|(_, walk)| walk.sequence_bits()?.into_iter().max())
        .collect::<Vec<_>>();
    assert!(widest.iter().filter(|&&bits| bits >= 74).count() >= 2, "{widest:?}");
    for lead in 0..4 {
        let mut held = vec![0u8; frame.len() + 8];
        let at = 4 - held.as_ptr() as usize % 4 + lead;
        held[at..at + frame.len()].copy_from_slice(&frame);
        let mut out = vec![0u8; raw.len()];
        let r = decode_on_host_split(
            &mut [(&held[at..at + frame.len()], &mut out[..])],
            HostPath::Jump,
            32,
            Chains::Device,
        );
        assert_eq!(r, [(OK, raw.len() as u64)], "stream at byte {lead} of a word: {}", status_text(r[0].0));
        assert!(out == raw, "stream at byte {lead} of a word: other bytes");
    }
}

#[test]
fn the_host_walks_a_dozen_z2_chunks_chains_and_leaves_twenty_to_the_device() {
    // A Z2 chunk: 10 blocks, 120,842 sequences, the longest block about 12,800.
    let chunks = |n: u64| Slots { blocks: 10 * n, sequences: 120_842 * n, literals: 0, most: 12_800 };
    assert!(host_walks(&chunks(1), 16));
    assert!(host_walks(&chunks(1), 2));
    assert!(host_walks(&chunks(4), 16));
    assert!(host_walks(&chunks(12), 16));
    assert!(!host_walks(&chunks(20), 16));
    assert!(!host_walks(&chunks(2), 1), "one thread walks all 20 blocks in turn");
    // Blocks of few sequences: the pool's wake is not worth it.
    assert!(!host_walks(&Slots { blocks: 8, sequences: 800, literals: 0, most: 100 }, 16));
}

/// A change made to the host's chain entries.
type Edit<'a> = &'a dyn Fn(&mut [u32]);

#[test]
fn the_hosts_chains_are_walked_and_checked_link_by_link() {
    // Frames of several kinds (repeat and predefined tables among them): the host walks every
    // block of many sequences, and what it writes is what the device's walk finds. A chain
    // entry changed anywhere (a span's bits or states, within the tables or not, or its span
    // count) never gives other bytes: an error, or the device walking the chain itself.
    let mut walked = 0usize;
    for (k, kind) in [3usize, 2, 5, 4, 1].into_iter().enumerate() {
        let raw = data(kind, [1 << 20, 300_000][k % 2], 900 + k as u64);
        let frame = compress(&raw, [3, 1, 19, 7, -3][k], false, None, true);
        let plan = BlockPlan::walked(&[&frame], &[raw.len() as u64], Some(true));
        let entries: Vec<&[u32]> = plan.chains.chunks(CHAIN_WORDS).filter(|e| e[0] > 1).collect();
        walked += entries.len();
        let mut out = vec![0u8; raw.len()];
        let r = decode_on_host_split(&mut [(&frame, &mut out[..])], HostPath::Jump, 32, Chains::Host(&|_| {}));
        assert_eq!(r, [(OK, raw.len() as u64)], "kind {kind}");
        assert!(out == raw, "kind {kind}");
        let Some(first) = plan.chains.chunks(CHAIN_WORDS).position(|e| e[0] > 2) else { continue };
        let at = first * CHAIN_WORDS;
        let spans = SPANS as usize;
        let edits: [(&str, Edit<'_>); 6] = [
            ("bits one less", &|c| c[at + 2] -= 1),
            ("bits one more", &|c| c[at + 2] += 1),
            ("a literal length state", &|c| c[at + 1 + spans + 1] ^= 1),
            ("a match length state", &|c| c[at + 1 + spans + 2] ^= 1 << 20),
            ("a state past its table", &|c| c[at + 1 + spans + 1] |= 0x3FF),
            ("the span count", &|c| c[at] -= 1),
        ];
        for (what, edit) in edits {
            let mut out = vec![0u8; raw.len()];
            let r = decode_on_host_split(&mut [(&frame, &mut out[..])], HostPath::Jump, 32, Chains::Host(edit));
            assert!(r[0].0 != OK || out == raw, "kind {kind}: {what} gave other bytes");
            // A change within range is taken, and its link fails.
            if !what.contains("past") && !what.contains("count") {
                assert_eq!(r[0].0, BAD_SEQUENCE_STREAM, "kind {kind}: {what} was not caught");
            }
        }
    }
    assert!(walked >= 20, "{walked} blocks walked on the host");
}

/// Crafted frames: each block kind, RLE and raw literals, treeless literals and repeat tables
/// are exercised by the encoder above; here the headers the encoder never writes.
#[test]
fn crafted_headers_are_refused_as_libzstd_refuses_them() {
    // Magic, header with a raw last block of 4 bytes: "abcd".
    let good = [0x28, 0xB5, 0x2F, 0xFD, 0x20, 4, 0x21, 0, 0, b'a', b'b', b'c', b'd'];
    assert_eq!(ours(&good, 4), (OK, b"abcd".to_vec(), 4));
    assert!(libzstd(&good, 4).is_some());
    let cases: [(usize, u8); 4] = [
        (4, 0x28), // reserved header bit
        (4, 0x21), // a dictionary ID byte (taken as content size: then the sizes differ)
        (6, 0x27), // block type 3 (reserved)
        (0, 0x29), // magic
    ];
    for (at, value) in cases {
        let mut bad = good;
        bad[at] = value;
        assert!(agrees(&bad, 4).is_ok(), "byte {at} = {value:#x}");
        assert_ne!(ours(&bad, 4).0, OK, "byte {at} = {value:#x}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn any_frame_agrees_with_libzstd(kind in 0usize..6, n in 0usize..200_000, seed in any::<u64>(), level in -5i32..20, checksum in any::<bool>()) {
        let raw = data(kind, n, seed);
        let frame = compress(&raw, level, checksum, None, seed % 2 == 0);
        let (status, out, _) = ours(&frame, n);
        prop_assert_eq!(status, OK, "{}", status_text(status));
        prop_assert!(out == raw);
    }

    #[test]
    fn any_damage_agrees_with_libzstd(kind in 0usize..6, n in 1usize..40_000, seed in any::<u64>(), at in any::<usize>(), byte in any::<u8>(), cut in any::<bool>()) {
        let raw = data(kind, n, seed);
        let mut frame = compress(&raw, 3, seed % 3 == 0, None, true);
        let at = at % frame.len();
        if cut { frame.truncate(at) } else { frame[at] = byte }
        if let Err(what) = agrees(&frame, n) {
            return Err(TestCaseError::fail(what));
        }
    }
}

/// Writes the cases `benches/zstd_decoder.py` replays on the GPU (the kernel through NVRTC):
/// frames of every kind and level, and damaged ones, each with the status, length and bytes the
/// CPU run of the same source gives.
#[test]
#[ignore = "writes the GPU harness's cases where ZSTD_DUMP says"]
fn dump_cases_for_the_gpu_harness() {
    let path = std::env::var("ZSTD_DUMP").expect("ZSTD_DUMP: where to write the cases");
    let mut f = std::fs::File::create(path).unwrap();
    let mut cases: Vec<(Vec<u8>, usize)> = Vec::new();
    for (k, n) in [0usize, 1, 100, 5000, 70_000, 131_073].into_iter().enumerate() {
        for kind in 0..6 {
            let raw = data(kind, n, (k * 11 + kind) as u64);
            for (j, level) in [-3, 1, 3, 9, 19].into_iter().enumerate() {
                if n > 100_000 && j % 2 == 1 {
                    continue;
                }
                let frame = compress(&raw, level, (k + j) % 2 == 0, None, j != 3);
                cases.push((frame.clone(), n));
                if j == 2 && !frame.is_empty() {
                    let mut bad = frame.clone();
                    let len = bad.len();
                    bad[len / 2] ^= 0x10;
                    cases.push((bad.clone(), n));
                    bad[len.min(30) / 2] ^= 0x04;
                    cases.push((bad, n));
                    cases.push((frame[..len * 2 / 3].to_vec(), n));
                }
            }
        }
    }
    let mut state = 11u64;
    for k in 0..600usize {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let n = 1000 + (state >> 40) as usize % 30_000;
        let mut frame = compress(&data(k % 6, n, state), 3, k % 3 == 0, None, true);
        let at = (state >> 20) as usize % frame.len();
        frame[at] ^= 1 << (k % 8);
        cases.push((frame, n));
    }
    // Sequences of up to 77 bits (the chain walk's lowest word, which the cases above never take).
    let (raw, frame) = frame_of_long_sequences(2);
    cases.push((frame, raw.len()));
    for (frame, n) in &cases {
        let (status, out, decoded) = ours(frame, *n);
        // The harness compares the kernel's own status: a checksum verdict is not the kernel's.
        let status = if status == u32::MAX { OK } else { status };
        for v in [frame.len() as u32, *n as u32, status, decoded as u32] {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        f.write_all(frame).unwrap();
        f.write_all(&out).unwrap();
    }
}

#[test]
#[ignore = "a timing, for looking at the kernel's code on the CPU"]
fn time_a_z2_like_frame_on_the_cpu() {
    let raw = data(3, 1 << 20, 5);
    let frame = compress(&raw, 3, false, None, true);
    let mut out = vec![0u8; raw.len()];
    let start = std::time::Instant::now();
    for _ in 0..10 {
        let [(status, _)] = decode_on_host(&mut [(&frame, &mut out)], HostPath::Jump)[..] else { unreachable!() };
        assert_eq!(status, OK);
    }
    let ours = start.elapsed().as_secs_f64() / 10.0;
    let start = std::time::Instant::now();
    for _ in 0..10 {
        libzstd(&frame, raw.len()).unwrap();
    }
    let theirs = start.elapsed().as_secs_f64() / 10.0;
    eprintln!(
        "ratio {:.2}: ours {:.2} ms, libzstd {:.2} ms",
        raw.len() as f64 / frame.len() as f64,
        ours * 1e3,
        theirs * 1e3
    );
}

#[test]
#[ignore = "a timing of the host's chain walk (decode.rs `host_walks` takes 13 ns a sequence)"]
fn time_the_hosts_chain_walk_of_a_z2_like_frame() {
    let raw = data(3, 1 << 20, 5);
    let frame = compress(&raw, 3, false, None, true);
    let s = slots(&frame, |_| {});
    let plan = BlockPlan::device_walks(&[&frame], &[raw.len() as u64]);
    let start = std::time::Instant::now();
    for _ in 0..20 {
        std::hint::black_box(plan.chains(&[&frame], 32));
    }
    let per_frame = start.elapsed().as_secs_f64() / 20.0;
    eprintln!(
        "{} blocks, {} sequences: {:.3} ms a frame on {} threads, {:.1} ns a sequence a thread",
        s.blocks,
        s.sequences,
        per_frame * 1e3,
        rayon::current_num_threads(),
        per_frame * 1e9 * rayon::current_num_threads().min(s.blocks as usize) as f64 / s.sequences as f64
    );
}

#[test]
#[ignore = "a timing of the host's chain walk's parts, and of rayon's pool against threads of their own"]
fn time_the_parts_of_the_hosts_chain_walk() {
    let raw = data(3, 1 << 20, 5);
    let frame = compress(&raw, 3, false, None, true);
    let s = slots(&frame, |_| {});
    let plan = BlockPlan::device_walks(&[&frame], &[raw.len() as u64]);
    let mut rows = Vec::new();
    for round in 0..12 {
        // Reads come a few ms apart: the pool's threads have gone to sleep by the next.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t = std::time::Instant::now();
        let mut tables = FrameTables::default();
        let mut walks = Vec::new();
        slots(&frame, |block| {
            if let Some(w) = block.and_then(|(count, section)| tables.block(count, section)) {
                walks.push(w);
            }
        });
        let tables_s = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        for w in &walks {
            std::hint::black_box(w.walk(32));
        }
        let serial_s = t.elapsed().as_secs_f64();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t = std::time::Instant::now();
        std::hint::black_box(plan.chains(&[&frame], 32));
        let rayon_s = t.elapsed().as_secs_f64();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t = std::time::Instant::now();
        std::thread::scope(|scope| {
            for w in &walks {
                scope.spawn(move || std::hint::black_box(w.walk(32)));
            }
        });
        let threads_s = t.elapsed().as_secs_f64();
        // The pool's threads woken all at once (a broadcast), each taking blocks off a counter;
        // or a spawn a block from one of them (each spawn wakes a thread).
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t = std::time::Instant::now();
        let next = std::sync::atomic::AtomicUsize::new(0);
        rayon::broadcast(|_| loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(w) = walks.get(i) else { break };
            std::hint::black_box(w.walk(32));
        });
        let broadcast_s = t.elapsed().as_secs_f64();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let t = std::time::Instant::now();
        rayon::scope(|scope| {
            for w in &walks {
                scope.spawn(move |_| {
                    std::hint::black_box(w.walk(32));
                });
            }
        });
        let spawns_s = t.elapsed().as_secs_f64();
        if round > 1 {
            rows.push([tables_s, serial_s, rayon_s, threads_s, broadcast_s, spawns_s]);
        }
    }
    rows.sort_by(|a, b| a[2].total_cmp(&b[2]));
    let m = rows[rows.len() / 2];
    eprintln!(
        "{} blocks, {} sequences, {} threads; medians, ms: tables {:.3}, walks one after another {:.3} ({:.1} ns a \
         sequence), rayon's pool {:.3}, a thread a block {:.3}, a broadcast {:.3}, a spawn a block {:.3}",
        s.blocks,
        s.sequences,
        rayon::current_num_threads(),
        m[0] * 1e3,
        m[1] * 1e3,
        m[1] * 1e9 / s.sequences as f64,
        m[2] * 1e3,
        m[3] * 1e3,
        m[4] * 1e3,
        m[5] * 1e3
    );
}
