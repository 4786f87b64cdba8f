//! Our device decoder of zstd frames. Where the batch's scratch allows (its `BlockPlan`), a
//! frame's blocks decode side by side (`blocks.cu`, then `bytes.cu`): a walk of each frame's
//! headers plans its blocks; one warp per block decodes its literals and its sequences into
//! records; a thread block per frame executes them in rounds of 32 to 128 (by the launch's
//! frames), each sequence as soon as the bytes it reads are written. Otherwise one warp decodes
//! each frame in order (`decode.cu`, one launch): every lane parses the headers alike, lane 0
//! builds the tables, four lanes decode the literal streams, the copies spread over the lanes.
//!
//! Exact where libzstd decodes (the same bytes), and an error wherever libzstd's one-shot decoder
//! reports one, and also where the format (RFC 8878) forbids what libzstd lets through: a
//! bitstream read past its start, a block over 128 KiB or the window, bytes after the frame. Any
//! input ends as a status ([`status_text`]), never a read or write outside the lengths given nor
//! more work than the input and output lengths bound. The content checksum, where the frame has
//! one, is verified by the caller (the XXH64 kernel, as for nvCOMP's output).
//!
//! With the `cpu-kernels` feature the same source runs on the CPU (`decode_on_host`): the build
//! script compiles it behind `host_shim.cpp`, where a warp is one lane doing every lane's work in
//! order.

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::codecs::decoder_choice::DecoderChoice;
use crate::codecs::ItemArrays;
use crate::config::DecodeTrust;
use crate::device::kernels::Kernels;
use crate::error::GpuError;

use super::frame::chain::{BlockWalk, FrameTables, CHAIN_WORDS};

/// The kernels' source, compiled with the other kernels (`codecs::KERNEL_SOURCES`).
pub(crate) const SOURCE: &str =
    concat!(include_str!("entropy.cu"), include_str!("decode.cu"), include_str!("blocks.cu"), include_str!("bytes.cu"));

/// The frame decoded to exactly its expected length.
pub const OK: u32 = 0;
/// The input ends within the frame.
pub const TRUNCATED: u32 = 1;
/// Not a zstd frame, a damaged frame header (a reserved bit, a window beyond 2 GiB, a
/// dictionary), or bytes after the frame.
pub const BAD_FRAME: u32 = 2;
/// A block of the reserved type, or larger than 128 KiB or the window.
pub const BAD_BLOCK: u32 = 3;
/// A literals section header that does not fit its block.
pub const BAD_LITERALS: u32 = 4;
/// A Huffman tree description that is damaged, or treeless literals without a tree.
pub const BAD_HUFFMAN: u32 = 5;
/// A literal stream without its end mark, too short, or not used up exactly.
pub const BAD_LITERAL_STREAM: u32 = 6;
/// A sequences section header or table description that is damaged.
pub const BAD_SEQUENCES: u32 = 7;
/// The sequences bitstream without its end mark, read past its start or not used up exactly.
pub const BAD_SEQUENCE_STREAM: u32 = 8;
/// A sequence whose literals run past the block's, whose offset reaches before the frame's
/// output, or whose block decodes to more than 128 KiB or the window.
pub const BAD_SEQUENCE: u32 = 9;
/// The frame decodes to more than the expected length.
pub const PAST_CAPACITY: u32 = 10;
/// The frame decodes (or says it decodes) to another length than the expected one.
pub const SIZE_MISMATCH: u32 = 11;
/// (Internal) a block whose sequences `zstd_sequence_lanes` decodes after `zstd_decode_blocks`:
/// never a frame's status once the launches have run.
pub const PENDING: u32 = 12;

/// A kernel status in words.
#[must_use]
pub fn status_text(code: u32) -> &'static str {
    match code {
        OK => "decoded",
        TRUNCATED => "the zstd frame is cut short",
        BAD_FRAME => "damaged zstd frame header, or bytes after the frame",
        BAD_BLOCK => "damaged zstd block header",
        BAD_LITERALS => "damaged literals section header",
        BAD_HUFFMAN => "damaged Huffman tree description",
        BAD_LITERAL_STREAM => "damaged literal stream",
        BAD_SEQUENCES => "damaged sequences section header or table",
        BAD_SEQUENCE_STREAM => "damaged sequences bitstream",
        BAD_SEQUENCE => "a sequence reaches outside its literals, the output or the block",
        PAST_CAPACITY => "the frame decodes to more than the expected length",
        SIZE_MISMATCH => "the frame decodes to another length than the expected one",
        PENDING => "a block's sequences were left undecoded (a launch missing)",
        _ => "unknown zstd decoder status",
    }
}

/// The device decoder of zstd frames and Blosc's zstd streams, chosen by
/// `ZARRS_GPU_ZSTD_DECODER`: `Auto` (the default) picks per read ([`for_route`]).
pub type ZstdDecoder = DecoderChoice;

/// The decoder of a read under `trust`, `verified` where crc32c checks the stored bytes first:
/// `Auto` picks ours where nothing verifies the frames first (ours ends any input as an error
/// status, where nvCOMP may hang the device on a damaged one), nvCOMP's where crc32c verifies them
/// or the trust is `trusted` (and stays `Auto` where the frames decode on the host anyway:
/// `verified` trust, nothing verified); a decoder named stays.
#[must_use]
pub fn for_route(decoder: ZstdDecoder, trust: DecodeTrust, verified: bool) -> ZstdDecoder {
    match decoder {
        DecoderChoice::Auto if verified || trust == DecodeTrust::Trusted => DecoderChoice::Nvcomp,
        DecoderChoice::Auto if trust == DecodeTrust::Checked => DecoderChoice::Ours,
        other => other,
    }
}

/// Whether frames (or Blosc's zstd streams) that passed the host check may decode on the device
/// with `decoder`: ours, named, ends any input as a status, so nothing needs to be trusted; the
/// others keep to the trust's rule (under `verified`, unverified frames decode on the host).
#[must_use]
pub fn may_decode(decoder: ZstdDecoder, trust: DecodeTrust, verified: bool) -> bool {
    decoder == DecoderChoice::Ours || verified || trust != DecodeTrust::Verified
}

/// Threads per thread block: one warp, one frame or block (its tables fill 14 KiB of shared
/// memory).
const THREADS: u32 = 32;

/// Bytes of a frame's plan and of a block's in the scratch (`blocks.cu`: `ZsFramePlan`,
/// `ZsBlockPlan`), and of a sequence record.
const FRAME_PLAN: usize = 64;
const BLOCK_PLAN: usize = 128;
const RECORD: usize = 12;
/// Bytes of a block's sequence tables where its sequences decode on a lane of their own
/// (`blocks.cu` `ZS_TABLE_WORDS`: 2 bytes a state), in the scratch and in
/// `zstd_sequence_lanes`' shared memory.
const TABLE_BYTES: usize = 4 * 644;
/// Batches decoding to at most this many bytes resolve their bytes by jumps (`zstd_jump`: 4
/// bytes of scratch a decoded byte, and passes over all of them at once); larger ones execute
/// each frame's sequences on a thread block (`zstd_execute`).
const JUMP_MAX: u64 = 64 << 20;
/// The most threads of `zstd_execute`'s thread block, a round's sequences (`bytes.cu`
/// `ZS_EXEC_THREADS`): a round runs in phases, every sequence whose sources are written in each.
const EXEC_THREADS: u32 = 128;

/// Threads of `zstd_execute`'s thread blocks (and sequences of a round) for a launch of `frames`
/// frames. On Z2's frames rounds of 128 take 1,100 to 2,400 phases a frame where rounds of 32
/// take 3,400 to 5,800 (`benches/zstd_rounds.sh`): a few hundred frames, which leave the device
/// waiting on each frame's steps, execute fastest in rounds of 128; thousands keep it busy, and
/// there each phase's barriers and idle threads cost more than the fewer phases save (decoder
/// alone on an H100, run DV1: 288 frames 6.8 ms with 128 threads, 10.2 with 64; 1,024 frames
/// 14.3 and 12.2; 8,192 frames 91.5 and 77.4, where a warp's rounds of 32 took 63.7).
fn exec_threads(frames: u64) -> u32 {
    match frames {
        0..=512 => EXEC_THREADS,
        513..=2048 => 64,
        _ => 32,
    }
}
/// Alignment of the scratch's regions.
const ALIGN: usize = 256;
/// Links a jump pass follows from each pointer (`bytes.cu` `ZS_HOPS`).
const HOPS: u64 = 32;
/// Thread blocks of a jump pass at most, each taking every `JUMP_GRID`-th tile of 256 entries:
/// enough to fill the device, few enough that a pass with nothing left to do costs little.
const JUMP_GRID: u64 = 8192;

/// Jump passes that resolve every chain of a frame of `largest` bytes: a chain has at most
/// `largest - 1` links (each to an earlier byte of the frame), and after pass k every chain of
/// up to `(HOPS + 1)^k - 1` links is resolved, whatever order the passes' lanes run in
/// (`bytes.cu`).
fn jump_passes(largest: u64) -> u32 {
    let links = largest.saturating_sub(1);
    let (mut passes, mut span) = (1, HOPS + 1);
    while span - 1 < links {
        passes += 1;
        span = span.saturating_mul(HOPS + 1);
    }
    passes
}

/// What one frame takes of the scratch: block plans, sequence records, literal bytes (those
/// not stored raw), from its block and section headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slots {
    blocks: u64,
    sequences: u64,
    literals: u64,
    /// The most sequences of one block.
    most: u64,
}

/// The slots of `frame`, read as `zstd_plan` reads it. A header cut short or damaged ends the
/// walk: the device's walk then stops there too, with an error. `block` meets each block in
/// order (`block_seen`): a compressed one's sequence count and its sequences section after the
/// count, None for others.
fn slots<'a>(frame: &'a [u8], mut block_seen: impl FnMut(Option<(u64, &'a [u8])>)) -> Slots {
    let mut slots = Slots::default();
    let byte = |i: usize| frame.get(i).copied().map_or(0, u64::from);
    if frame.len() < 5 || u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) != 0xFD2F_B528 {
        return slots;
    }
    let fhd = frame[4];
    let single = (fhd >> 5) & 1 == 1;
    let dict = [0usize, 1, 2, 4][usize::from(fhd & 3)];
    let fcs = [usize::from(single), 2, 4, 8][usize::from(fhd >> 6)];
    let mut pos = 5 + usize::from(!single) + dict + fcs;
    while pos + 3 <= frame.len() {
        let header = byte(pos) | byte(pos + 1) << 8 | byte(pos + 2) << 16;
        let (last, kind, size) = (header & 1 == 1, (header >> 1) & 3, (header >> 3) as usize);
        if kind == 3 {
            break;
        }
        slots.blocks += 1;
        let body = if kind == 1 { 1 } else { size };
        let Some(block) = frame.get(pos + 3..pos + 3 + body) else {
            block_seen(None);
            break;
        };
        if kind == 2 && block.len() >= 2 {
            let b = |i: usize| block.get(i).copied().map_or(0, u64::from);
            let (lit_kind, format) = (b(0) & 3, (b(0) >> 2) & 3);
            let (taken, regenerated) = if lit_kind < 2 {
                let (head, size) = match format {
                    0 | 2 => (1, b(0) >> 3),
                    1 => (2, (b(0) | b(1) << 8) >> 4),
                    _ => (3, (b(0) | b(1) << 8 | b(2) << 16) >> 4),
                };
                (head + if lit_kind == 0 { size } else { 1 }, size)
            } else {
                let word = b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24;
                let (head, size, csize) = match format {
                    0 | 1 => (3, (word >> 4) & 0x3FF, (word >> 14) & 0x3FF),
                    2 => (4, (word >> 4) & 0x3FFF, word >> 18),
                    _ => (5, (word >> 4) & 0x3_FFFF, (word >> 22) | b(4) << 10),
                };
                (head + csize, size)
            };
            if lit_kind != 0 {
                slots.literals += regenerated;
            }
            let t = taken as usize;
            let (count, head) = match block.get(t).copied().map(u64::from) {
                Some(c0 @ 0..=127) => (c0, 1),
                Some(255) => (b(t + 1) + (b(t + 2) << 8) + 0x7F00, 3),
                Some(c0) => (((c0 - 128) << 8) + b(t + 1), 2),
                None => (0, 0),
            };
            slots.sequences += count;
            slots.most = slots.most.max(count);
            block_seen(block.get(t + head..).map(|section| (count, section)));
        } else {
            block_seen(None);
        }
        pos += 3 + body;
        if last {
            break;
        }
    }
    slots
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// The walks of a frame's compressed blocks with sequences (their tables' descriptions read in
/// order: Repeat mode takes the block's before), numbered on from its first block's index.
fn frame_walks(frame: &[u8], first: u64) -> Vec<(u64, BlockWalk<'_>)> {
    let (mut tables, mut index, mut walks) = (FrameTables::default(), first, Vec::new());
    slots(frame, |block| {
        if let Some(walk) = block.and_then(|(count, section)| tables.block(count, section)) {
            walks.push((index, walk));
        }
        index += 1;
    });
    walks
}

/// The scratch of the block-parallel decode of a batch: each frame's plan (its slots, from its
/// headers on the host) and where the regions lie.
#[derive(Clone, Debug)]
pub(crate) struct BlockPlan {
    /// Each frame's plan as the device reads it (8 words a frame).
    frames: Vec<u64>,
    /// Each block's chain as the host walked it ([`CHAIN_WORDS`] words a block), after the frame
    /// table; empty where the device walks them.
    chains: Vec<u32>,
    chains_at: usize,
    /// The most spans a block's sequences split into ([`split_for`]; [`LANES`]: a lane a block,
    /// its tables at `tables_at`).
    split: u64,
    tables_at: usize,
    /// Whether the blocks' literals decode in a launch of their own before the rest
    /// ([`BlockPlan::literals_first`]).
    literals_first: bool,
    /// The batch's slots (its blocks, sequences, literals), which also decide who walks the
    /// chains.
    slots: Slots,
    blocks_at: usize,
    records_at: usize,
    literals_at: usize,
    /// Where the bytes are resolved by jumps: the entries (4 bytes a decoded byte), the pass
    /// flags, the passes, the largest frame; None: each frame's sequences executed on a warp.
    jump: Option<Jump>,
    /// Scratch bytes in all.
    pub(crate) len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Jump {
    entries_at: usize,
    entries: u64,
    flags_at: usize,
    passes: u32,
    largest: u64,
}

impl BlockPlan {
    /// The plan of a batch of frames, each decoding to its capacity; the blocks' chains walked
    /// on the host where that is quicker ([`host_walks`]).
    #[cfg(any(test, feature = "cpu-kernels"))]
    pub(crate) fn new(frames: &[&[u8]], capacities: &[u64]) -> Self {
        Self::device_walks(frames, capacities).walking(frames, None)
    }

    /// The plan of a batch of frames, each decoding to its capacity, the chains left to the
    /// device (for its scratch's size, or where the host's threads have other work);
    /// [`BlockPlan::with_host_chains`] adds them.
    pub(crate) fn device_walks(frames: &[&[u8]], capacities: &[u64]) -> Self {
        let mut words = Vec::with_capacity(8 * frames.len());
        let mut total = Slots::default();
        let decoded: u64 = capacities.iter().sum();
        let largest = capacities.iter().copied().max().unwrap_or(0);
        let jump = decoded <= JUMP_MAX;
        let mut entries = 0u64;
        for (frame, &capacity) in frames.iter().zip(capacities) {
            let s = slots(frame, |_| {});
            words.extend([
                total.literals,
                s.literals,
                total.sequences,
                s.sequences,
                total.blocks | s.blocks << 32,
                0,
                0,
                entries,
            ]);
            total.blocks += s.blocks;
            total.sequences += s.sequences;
            total.literals += s.literals;
            total.most = total.most.max(s.most);
            entries += capacity;
        }
        let jump = jump.then_some((entries, largest));
        let plan = Self::laid_out(words, frames.len(), total, jump, split_for(total.blocks));
        // A lane a block where its tables fit the scratch the batch was given (its bound): else
        // a warp a block, lane 0 decoding its sequences.
        if plan.split == LANES && plan.len > Self::bound(frames.len(), decoded as usize) {
            return plan.with_split(1);
        }
        plan
    }

    /// The same plan with a block's sequences split into `split` spans at most ([`LANES`]: a
    /// lane a block), its chains left to the device.
    fn with_split(self, split: u64) -> Self {
        let n = self.frames.len() / 8;
        Self::laid_out(self.frames, n, self.slots, self.jump.map(|j| (j.entries, j.largest)), split)
    }

    /// Whether the host walks this batch's chains where nothing else keeps its threads
    /// ([`host_walks`]; a launch of many blocks splits none, so none are walked).
    pub(crate) fn host_walks_chains(&self) -> bool {
        self.split > 1 && host_walks(&self.slots, rayon::current_num_threads())
    }

    /// The same plan of `frames` (the frames it was made of), the chains walked on the host
    /// where that is quicker ([`BlockPlan::host_walks_chains`]); its size is unchanged.
    pub(crate) fn with_host_chains(self, frames: &[&[u8]]) -> Self {
        self.walking(frames, None)
    }

    /// The same plan, its blocks' literals decoded by a launch of their own right after the
    /// frame plans (`yes`), so that they decode while the host walks the chains (0.19 ms of a Z2
    /// block's 0.6, run DT1), or with the rest of each block.
    pub(crate) fn literals_first(mut self, yes: bool) -> Self {
        self.literals_first = yes;
        self
    }

    /// The plan of [`BlockPlan::device_walks`], the chains walked on the host as `host_chains`
    /// says (None: as [`host_walks`] says).
    fn walking(mut self, frames: &[&[u8]], host_chains: Option<bool>) -> Self {
        if self.split > 1 && host_chains.unwrap_or_else(|| self.host_walks_chains()) {
            self.chains = self.chains(frames, self.split as u32);
        }
        self
    }

    /// The chains of the blocks of `frames` walked on the host, side by side, for a launch that
    /// splits a block into `split` spans at most: a block's entry all zeros where the host did
    /// not walk it.
    fn chains(&self, frames: &[&[u8]], split: u32) -> Vec<u32> {
        use rayon::prelude::*;
        // Each frame's walks; its first block from its plan (word 4: first | blocks << 32).
        let firsts: Vec<u64> = self.frames.chunks(8).map(|words| words[4] & 0xFFFF_FFFF).collect();
        let walks: Vec<(u64, BlockWalk<'_>)> = if frames.len() == 1 {
            frames.iter().zip(&firsts).flat_map(|(frame, &first)| frame_walks(frame, first)).collect()
        } else {
            frames.par_iter().zip(&firsts).flat_map_iter(|(frame, &first)| frame_walks(frame, first)).collect()
        };
        // The walks (0.15 ms a Z2 block) on every thread of the pool at once, each taking
        // blocks off a counter: a broadcast wakes the sleeping threads together, where a
        // parallel iterator's splits wake them one after another (a Z2 chunk's 10 blocks on 16
        // threads: 0.30 ms, against 0.54; runs DT6 and DS4). It returns once every thread has
        // run it: a thread busy with another read's host decode delays it by that decode's
        // remainder (not measured yet with concurrent reads).
        let next = std::sync::atomic::AtomicUsize::new(0);
        let entries = std::sync::Mutex::new(Vec::with_capacity(walks.len()));
        rayon::broadcast(|_| loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((index, walk)) = walks.get(i) else { break };
            if let Some(entry) = walk.walk(split) {
                entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((*index, entry));
            }
        });
        let mut out = vec![0u32; self.slots.blocks as usize * CHAIN_WORDS];
        for (index, entry) in entries.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            let at = index as usize * CHAIN_WORDS;
            if let Some(slot) = out.get_mut(at..at + CHAIN_WORDS) {
                slot.copy_from_slice(&entry);
            }
        }
        out
    }

    /// [`BlockPlan::new`], the chains walked on the host or not as `host_chains` says.
    #[cfg(any(test, feature = "cpu-kernels"))]
    fn walked(frames: &[&[u8]], capacities: &[u64], host_chains: Option<bool>) -> Self {
        Self::device_walks(frames, capacities).walking(frames, host_chains)
    }

    /// `frames` holds the table of `n` frames (or nothing, for a bound); a block's sequences
    /// split into `split` spans at most, the chains' region where they may be walked on the host,
    /// the tables' where [`LANES`].
    fn laid_out(frames: Vec<u64>, n: usize, total: Slots, jump: Option<(u64, u64)>, split: u64) -> Self {
        let blocks = total.blocks as usize;
        let chains_at = align(n * FRAME_PLAN);
        let blocks_at = chains_at + if split > 1 { align(blocks * CHAIN_WORDS * 4) } else { 0 };
        let records_at = blocks_at + align(blocks * BLOCK_PLAN);
        let literals_at = records_at + align(total.sequences as usize * RECORD);
        let tables_at = literals_at + align(total.literals as usize);
        let mut len = tables_at + if split == LANES { align(blocks * TABLE_BYTES) } else { 0 };
        let jump = jump.map(|(entries, largest)| {
            let passes = jump_passes(largest);
            let (entries_at, flags_at) = (len, len + align(4 * entries as usize));
            len = flags_at + align(4 * passes as usize);
            Jump { entries_at, entries, flags_at, passes, largest }
        });
        Self {
            frames,
            chains: Vec::new(),
            chains_at,
            split,
            tables_at,
            literals_first: false,
            slots: total,
            blocks_at,
            records_at,
            literals_at,
            jump,
            len,
        }
    }

    /// Scratch enough for any batch of `count` frames decoding to `total` bytes whose
    /// sequences average 6 bytes or more and whose blocks 4 KiB or more (a batch that needs more
    /// decodes one warp per frame, with no scratch).
    pub(crate) fn bound(count: usize, total: usize) -> usize {
        let total_slots = Slots {
            blocks: (2 * count + total / 4096) as u64,
            sequences: (total / 6) as u64,
            literals: total as u64,
            most: 0,
        };
        let jump = (total as u64 <= JUMP_MAX).then_some((total as u64, total as u64));
        // (Laid out for spans, the chains' region too: a plan takes a lane a block only where
        // its tables fit this.)
        Self::laid_out(Vec::new(), count, total_slots, jump, split_for(0)).len
    }

    /// Where its regions lie in a scratch at `base`.
    fn regions(&self, base: u64) -> Regions {
        let at = |offset: usize| base + offset as u64;
        Regions {
            frames: base,
            chains: if self.chains.is_empty() { 0 } else { at(self.chains_at) },
            blocks: at(self.blocks_at),
            records: at(self.records_at),
            literals: at(self.literals_at),
            tables: if self.split == LANES { at(self.tables_at) } else { 0 },
        }
    }

    /// The same batch with each frame's sequences executed by a warp (no entries, no jumps).
    #[cfg(any(test, feature = "cpu-kernels"))]
    fn executed(mut self) -> Self {
        if let Some(jump) = self.jump.take() {
            self.len = jump.entries_at;
        }
        self
    }

    /// The frame table: the scratch's first bytes.
    fn frame_table(&self) -> Vec<u8> {
        self.frames.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The chains the host walked (none where it did not), at `chains_at` in the scratch.
    fn chain_table(&self) -> Vec<u8> {
        self.chains.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The frame table, then the chains where the host walked them: the scratch's first bytes.
    #[cfg(any(test, feature = "cpu-kernels"))]
    fn frame_bytes(&self) -> Vec<u8> {
        let mut bytes = self.frame_table();
        if !self.chains.is_empty() {
            bytes.resize(self.chains_at, 0);
            bytes.extend(self.chain_table());
        }
        bytes
    }
}

/// Enqueue the decode of `n` frames on `stream`, one launch.
///
/// # Safety
/// The arrays are device memory of `n` entries ordered on `stream`; each input pointer holds its
/// size in readable bytes and each output pointer its capacity in writable bytes, outputs not
/// overlapping inputs or each other.
pub(crate) unsafe fn launch_decode(
    kernels: &Kernels,
    stream: &CudaStream,
    arrays: &ItemArrays,
    n: usize,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let n = n as u64;
    let a = arrays;
    let args = [a.inputs, a.input_sizes, a.capacities, a.outputs, a.decoded, a.statuses, n];
    // SAFETY: six device addresses and a count, as the kernel takes them; the rest is the
    // caller's contract.
    unsafe { kernels.launch_u64(stream, "zstd_decode_frames", warps(n, 1)?, &args, "launching the zstd decoder") }
}

/// The device addresses of a plan's regions in a scratch at some address.
#[derive(Clone, Copy, Debug)]
struct Regions {
    frames: u64,
    /// The host's chains (0: none, the device walks them).
    chains: u64,
    blocks: u64,
    records: u64,
    literals: u64,
    /// The blocks' packed tables where a lane a block decodes their sequences (0: none).
    tables: u64,
}

/// A launch of one warp a thread block, `x` by `y` of them.
fn warps(x: u64, y: u64) -> Result<LaunchConfig, GpuError> {
    grid(x, y, THREADS, 0)
}

/// A launch of `x` by `y` thread blocks of `threads` threads and `shared` bytes of dynamic
/// shared memory each.
fn grid(x: u64, y: u64, threads: u32, shared: u32) -> Result<LaunchConfig, GpuError> {
    let dim = |v: u64| u32::try_from(v).map_err(|_| GpuError::Unsupported(format!("a zstd grid of {v} in one launch")));
    Ok(LaunchConfig { grid_dim: (dim(x)?, dim(y)?, 1), block_dim: (threads, 1, 1), shared_mem_bytes: shared })
}

/// The most spans a block's sequences split into (`blocks.cu`, `ZS_SPANS`) when `blocks` blocks
/// decode in one launch. Few blocks leave the device idle but for their one-lane chains: a lane a
/// span decodes them after lane 0 walks the chain alone. Many blocks keep every scheduler busy
/// already, and a split's second walk of the chain would only add work.
fn split_for(blocks: u64) -> u64 {
    if blocks <= SPLIT_BLOCKS {
        32
    } else {
        LANES
    }
}

/// [`split_for`] of a launch whose blocks' sequences decode a lane a block (`zstd_sequence_lanes`)
/// after a warp a block has decoded their literals and built their tables: a block's sequences
/// are one state chain that one lane walks in order whoever walks it, and a warp a block issued an
/// instruction for each of its steps where a warp of 32 blocks issues one for 32 (DM3: 130
/// instructions a sequence made the warp a block's launch issue-bound in bulk).
const LANES: u64 = 0;

/// Threads (lanes, blocks) a thread block of `zstd_sequence_lanes`, each block's tables in its
/// shared memory ([`TABLE_BYTES`] a lane): 8 lanes take 21 KiB (and the 1 KiB an H100 keeps a
/// thread block), so a multiprocessor's 228 KiB hold 10 such thread blocks, 80 lanes, where 4
/// bytes a state held 40 (with as many lanes an SM, 8 lanes a thread block ran as fast as 4, and
/// 2 slower: run DU2).
const LANE_THREADS: u32 = 8;

/// Whether the host walks the blocks' chains, on `threads` threads, for a launch of `total`
/// slots: where its walk, the longest block's at least, and the wake of rayon's sleeping threads
/// take less than the device's walk of the longest block. Measured on the GPU host (H100 and a
/// 16-core Xeon, benches/RESULTS.md runs DR2, DS4 and DT6): the device's lane 0 walks about 270
/// cycles a sequence at 1.98 GHz; a host core 11.5 ns (the block's tables built on its thread
/// included), and a frame's 10 blocks took 0.30 ms on 16 threads that had slept, woken by a
/// broadcast (0.14 ms of walking each): one Z2 chunk's chains walk on the host (about 0.3
/// against 1.7 ms), and up to about 20 chunks' (1.6 against 1.7).
fn host_walks(total: &Slots, threads: usize) -> bool {
    const DEVICE_NS: f64 = 136.0;
    const HOST_NS: f64 = 11.5;
    const WAKE_NS: f64 = 160_000.0;
    let (sequences, most) = (total.sequences as f64, total.most as f64);
    let host = WAKE_NS + HOST_NS * (sequences / threads.max(1) as f64).max(most);
    host < most * DEVICE_NS
}

/// Warps that make a block's entries side by side, each a part of its sequences (`bytes.cu`,
/// `zstd_entries`): a Z2 block's 12,800 sequences were 400 rounds of one warp's waits (0.48 ms
/// for one frame's link and entries on an H100, run DR2).
const ENTRY_PARTS: u32 = 8;

/// Blocks a launch at most whose sequences split into spans. A warp a block takes its blocks in
/// waves of about 1,600 on an H100, 3.4 ms a wave of Z2's blocks (the chain walked, then the
/// spans), while a lane a block stays near 8 ms from 2,304 blocks to 4,096 (its chains' steps
/// are longer, and the launch is under one wave): decoder alone (run DX1), 288 Z2 frames (2,304
/// blocks) 6.7 ms of blocks phase with spans against 7.7 a lane a block, 512 frames (4,096) 10.5
/// against 8.1. So spans while they take two waves or fewer.
const SPLIT_BLOCKS: u64 = 3072;

/// Enqueue the block-parallel decode of `n` frames on `stream`: [`launch_frame_plans`], then
/// [`launch_block_decode`].
///
/// # Safety
/// As for [`launch_decode`]; `temp` is device memory of `plan.len` bytes or more ordered on
/// `stream`, and `plan` was made from the batch's own stored bytes.
pub(crate) unsafe fn launch_blocks(
    kernels: &Kernels,
    uploads: &crate::device::upload::Uploads,
    stream: &CudaStream,
    arrays: &ItemArrays,
    n: usize,
    plan: &BlockPlan,
    temp: u64,
) -> Result<(), GpuError> {
    // SAFETY: the caller's contract, passed on.
    unsafe { launch_frame_plans(kernels, uploads, stream, arrays, n, plan, temp) }?;
    // SAFETY: as above, after the frame plans.
    unsafe { launch_block_decode(kernels, uploads, stream, arrays, n, plan, temp) }
}

/// Enqueue the first launches of the block-parallel decode of `n` frames on `stream`: the plan's
/// frame table copied to the scratch at `temp`, then each frame's headers walked into its block
/// plans (`zstd_plan`), then, where the plan says ([`BlockPlan::literals_first`]), the blocks'
/// literals (`zstd_block_literals`). They read no chain: the host may walk them while they run,
/// into the same plan ([`BlockPlan::with_host_chains`]) that [`launch_block_decode`] then takes.
///
/// # Safety
/// As for [`launch_blocks`].
pub(crate) unsafe fn launch_frame_plans(
    kernels: &Kernels,
    uploads: &crate::device::upload::Uploads,
    stream: &CudaStream,
    arrays: &ItemArrays,
    n: usize,
    plan: &BlockPlan,
    temp: u64,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let Regions { frames, blocks, literals, .. } = plan.regions(temp);
    let n = n as u64;
    // SAFETY: the frame table's region is the scratch's first bytes, which the stream owns until
    // the batch's work has run.
    unsafe { uploads.upload(stream, &plan.frame_table(), frames) }?;
    let a = arrays;
    let args = [a.inputs, a.input_sizes, a.capacities, frames, blocks, n];
    // SAFETY: device addresses and a count as the kernel takes them: n frames, their plans and
    // the block plans' region of the slots those plans give.
    unsafe { kernels.launch_u64(stream, "zstd_plan", warps(n, 1)?, &args, "launching the zstd plan") }?;
    if !plan.literals_first || plan.slots.blocks == 0 {
        return Ok(());
    }
    let args = [a.inputs, frames, blocks, literals, plan.slots.blocks];
    // SAFETY: the plans written by zstd_plan before it on the stream; literals in their region,
    // within the slots of each frame (checked by the plan).
    unsafe {
        kernels.launch_u64(
            stream,
            "zstd_block_literals",
            warps(plan.slots.blocks, 1)?,
            &args,
            "launching the zstd literals",
        )
    }
}

/// Enqueue the rest of the block-parallel decode after [`launch_frame_plans`] of the same
/// layout: the chains the host walked (if it did) copied to their region, each block's
/// literals and sequences decoded, then the frames' bytes.
///
/// # Safety
/// As for [`launch_blocks`], after [`launch_frame_plans`] on `stream` of a plan of the same
/// frames (with or without chains: the layout is one).
pub(crate) unsafe fn launch_block_decode(
    kernels: &Kernels,
    uploads: &crate::device::upload::Uploads,
    stream: &CudaStream,
    arrays: &ItemArrays,
    n: usize,
    plan: &BlockPlan,
    temp: u64,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let Regions { frames, chains, blocks, records, literals, tables } = plan.regions(temp);
    let n = n as u64;
    if !plan.chains.is_empty() {
        // SAFETY: the chains' region lies after the frame table within the scratch, which the
        // stream owns until the batch's work has run.
        unsafe { uploads.upload(stream, &plan.chain_table(), chains) }?;
    }
    let a = arrays;
    if plan.slots.blocks > 0 {
        let (split, literals_done) = (plan.split, u64::from(plan.literals_first));
        let args =
            [a.inputs, frames, blocks, literals, records, plan.slots.blocks, split, chains, literals_done, tables];
        // SAFETY: the plans written by zstd_plan (and zstd_block_literals where the plan says)
        // before it on the stream; records and literals in their regions, within the slots of
        // each frame (checked by the plan); the chains (or 0) of plan.slots.blocks entries, each
        // checked before use.
        unsafe {
            kernels.launch_u64(
                stream,
                "zstd_decode_blocks",
                warps(plan.slots.blocks, 1)?,
                &args,
                "launching the zstd block decoder",
            )
        }?;
        if tables != 0 {
            let threads = LANE_THREADS;
            let lanes = grid(plan.slots.blocks.div_ceil(threads.into()), 1, threads, threads * TABLE_BYTES as u32)?;
            let args = [a.inputs, frames, blocks, records, tables, plan.slots.blocks];
            // SAFETY: the block plans zstd_decode_blocks left pending before it on the stream,
            // their tables in the tables' region (a block's at its index), records within each
            // frame's slots.
            unsafe {
                kernels.launch_u64(stream, "zstd_sequence_lanes", lanes, &args, "launching the zstd sequence lanes")
            }?;
        }
    }
    if let Some(jump) = plan.jump {
        // SAFETY: as above; the entries and pass flags in their regions, sized by the plan.
        return unsafe {
            launch_jumps(kernels, stream, arrays, n, &plan.regions(temp), plan.slots.blocks, &jump, temp)
        };
    }
    let args = [a.inputs, a.capacities, a.outputs, a.decoded, a.statuses, frames, blocks, literals, records, n];
    // SAFETY: as above; outputs of their capacities, which the kernel stays within.
    let executor = grid(n, 1, exec_threads(n), 0)?;
    unsafe { kernels.launch_u64(stream, "zstd_execute", executor, &args, "launching the zstd executor") }
}

/// The jump path's launches after the blocks are decoded: link, entries, the passes, write.
///
/// # Safety
/// As for [`launch_blocks`], after its first two launches.
#[allow(clippy::too_many_arguments, reason = "the launches' shared arrays and regions")]
unsafe fn launch_jumps(
    kernels: &Kernels,
    stream: &CudaStream,
    arrays: &ItemArrays,
    n: u64,
    regions: &Regions,
    n_blocks: u64,
    jump: &Jump,
    temp: u64,
) -> Result<(), GpuError> {
    let &Regions { frames, blocks, records, literals, .. } = regions;
    let (entries, flags) = (temp + jump.entries_at as u64, temp + jump.flags_at as u64);
    let link = kernels.function("zstd_link")?;
    let mut launch = stream.launch_builder(&link);
    launch
        .arg(&arrays.capacities)
        .arg(&arrays.decoded)
        .arg(&arrays.statuses)
        .arg(&frames)
        .arg(&blocks)
        .arg(&flags)
        .arg(&jump.passes)
        .arg(&n);
    // SAFETY: n frames' arrays and plans, the block plans the plan kernel wrote; `passes` flags.
    unsafe { launch.launch(warps(n, 1)?) }.map_err(GpuError::cuda("launching the zstd link"))?;
    let a = arrays;
    if n_blocks > 0 {
        let args = [a.inputs, a.decoded, a.statuses, frames, blocks, literals, records, entries, n_blocks];
        // SAFETY: each block's entries lie within its frame's (its place and size checked
        // against the frame's capacity by the link), the frames' within the entries region.
        unsafe {
            let grid = warps(n_blocks, ENTRY_PARTS.into())?;
            kernels.launch_u64(stream, "zstd_entries", grid, &args, "launching the zstd entries")
        }?;
    }
    let jump_fn = kernels.function("zstd_jump")?;
    for t in 0..jump.passes {
        let mut launch = stream.launch_builder(&jump_fn);
        launch.arg(&entries).arg(&jump.entries).arg(&flags).arg(&t);
        // SAFETY: the entries region of `jump.entries` entries, each pointing within it.
        unsafe { launch.launch(warps(jump.entries.div_ceil(256).clamp(1, JUMP_GRID), 1)?) }
            .map_err(GpuError::cuda("launching a zstd jump pass"))?;
    }
    let y = jump.largest.div_ceil(4096).clamp(1, 1024);
    let args = [a.capacities, a.outputs, a.decoded, a.statuses, frames, entries, n];
    // SAFETY: each frame's bytes within its capacity, from its entries.
    unsafe { kernels.launch_u64(stream, "zstd_write", warps(n, y)?, &args, "launching the zstd write") }
}

#[cfg(any(test, feature = "cpu-kernels"))]
unsafe extern "C" {
    fn zstd_plan_on_host(
        inputs: *const *const u8,
        input_sizes: *const u64,
        capacities: *const u64,
        frames: *mut u8,
        blocks: *mut u8,
        n: u64,
    );
    fn zstd_decode_blocks_on_host(
        inputs: *const *const u8,
        frames: *const u8,
        blocks: *mut u8,
        literals: *mut u8,
        records: *mut u32,
        n_blocks: u64,
        split: u64,
        chains: *const u32,
        literals_done: u64,
        tables: *mut u32,
    );
    fn zstd_sequence_lanes_on_host(
        inputs: *const *const u8,
        frames: *const u8,
        blocks: *mut u8,
        seq_scratch: *mut u32,
        tables: *const u32,
        n_blocks: u64,
    );
    fn zstd_block_literals_on_host(
        inputs: *const *const u8,
        frames: *const u8,
        blocks: *mut u8,
        literals: *mut u8,
        n_blocks: u64,
    );
    #[allow(clippy::too_many_arguments, reason = "the kernel's arguments")]
    fn zstd_execute_on_host(
        inputs: *const *const u8,
        capacities: *const u64,
        outputs: *const *mut u8,
        decoded: *mut u64,
        statuses: *mut u32,
        frames: *const u8,
        blocks: *const u8,
        literals: *const u8,
        records: *const u32,
        n: u64,
        threads: u32,
    );
    #[cfg(test)]
    fn zstd_plan_sizes_on_host() -> u64;
    #[allow(clippy::too_many_arguments, reason = "the kernel's arguments")]
    fn zstd_link_on_host(
        capacities: *const u64,
        decoded: *mut u64,
        statuses: *mut u32,
        frames: *const u8,
        blocks: *mut u8,
        flags: *mut u32,
        passes: u32,
        n: u64,
    );
    #[allow(clippy::too_many_arguments, reason = "the kernel's arguments")]
    fn zstd_entries_on_host(
        inputs: *const *const u8,
        decoded: *mut u64,
        statuses: *mut u32,
        frames: *const u8,
        blocks: *const u8,
        literals: *const u8,
        records: *const u32,
        entries: *mut u32,
        n_blocks: u64,
        parts: u32,
    );
    fn zstd_jump_on_host(entries: *mut u32, total: u64, flags: *mut u32, passes: u32);
    #[allow(clippy::too_many_arguments, reason = "the kernel's arguments")]
    fn zstd_write_on_host(
        capacities: *const u64,
        outputs: *const *mut u8,
        decoded: *mut u64,
        statuses: *mut u32,
        frames: *const u8,
        entries: *const u32,
        n: u64,
        grid_y: u32,
    );
    fn zstd_decode_frames_on_host(items: *const crate::codecs::HostItemPointers, n: u64);
}

/// The device kernels' code run on the CPU over `frames` (each a frame and the output it decodes
/// into, whose length is the expected one): each frame's status and decoded length, as the device
/// writes them, by `path`.
#[cfg(any(test, feature = "cpu-kernels"))]
#[must_use]
pub fn decode_on_host(frames: &mut [(&[u8], &mut [u8])], path: HostPath) -> Vec<(u32, u64)> {
    // The jump path's batches are small (64 MiB or less) and split their blocks' sequences;
    // the executed ones stand for large batches, which do not.
    let split = if path == HostPath::Jump { split_for(0) } else { split_for(u64::MAX) };
    decode_on_host_split(frames, path, split, Chains::Rule)
}

/// Who walks the blocks' chains in [`decode_on_host_split`].
#[cfg(any(test, feature = "cpu-kernels"))]
#[cfg_attr(not(test), expect(dead_code, reason = "only the tests choose who walks"))]
#[derive(Clone, Copy)]
enum Chains<'a> {
    /// As [`host_walks`] says.
    Rule,
    /// The device (lane 0 of each block).
    Device,
    /// The host, its entries then changed by the function (to see the device check them).
    Host(&'a dyn Fn(&mut [u32])),
}

/// [`decode_on_host`] with a block's sequences split into `split` spans at most, their chains
/// walked as `chains` says.
#[cfg(any(test, feature = "cpu-kernels"))]
fn decode_on_host_split(
    frames: &mut [(&[u8], &mut [u8])],
    path: HostPath,
    split: u64,
    chains: Chains<'_>,
) -> Vec<(u32, u64)> {
    let stored: Vec<&[u8]> = frames.iter().map(|(i, _)| &**i).collect();
    let mut a = crate::codecs::HostItems::new(frames);
    let n = a.count();
    if path == HostPath::OneWarp {
        let pointers = a.pointers();
        // SAFETY: n entries each, alive and unmoved until the call returns; every input holds
        // its size and every output its capacity, the outputs distinct `&mut` slices; the kernel
        // stays within those lengths.
        unsafe {
            zstd_decode_frames_on_host(&raw const pointers, n);
        }
        return a.results();
    }
    let mut plan = match chains {
        Chains::Rule => BlockPlan::new(&stored, &a.capacities),
        Chains::Device => BlockPlan::walked(&stored, &a.capacities, Some(false)),
        Chains::Host(edit) => {
            let mut plan = BlockPlan::walked(&stored, &a.capacities, Some(true));
            edit(&mut plan.chains);
            plan
        }
    };
    // A lane a block takes a layout of its own (its tables' region); other splits share one.
    if (split == LANES) != (plan.split == LANES) {
        plan = plan.with_split(split);
    }
    let threads = match path {
        HostPath::ExecuteThreads(threads) => threads,
        _ => exec_threads(n),
    };
    if matches!(path, HostPath::Execute | HostPath::ExecuteThreads(_)) {
        plan = plan.executed();
    }
    // The literals apart where the host walked chains, as the device's launches take them.
    let walked = !plan.chains.is_empty();
    let plan = plan.literals_first(walked);
    // The scratch as on the device: 8-byte aligned, the frame table first, and holding whatever
    // an earlier batch left: here bytes that, read as entries or indices, point far outside.
    let mut scratch = vec![0x3737_3737_3737_3737u64; plan.len.div_ceil(8)];
    let words = scratch.as_mut_ptr();
    let base = words.cast::<u8>();
    let table = plan.frame_bytes();
    // SAFETY: the scratch holds plan.len bytes, the table fits its first region, each region
    // lies within it at 256-byte alignment (records 4-byte aligned); n entries in each array as
    // above; the kernels stay within the slots the plan gives.
    unsafe {
        std::ptr::copy_nonoverlapping(table.as_ptr(), base, table.len());
        let (frames_p, blocks_p) = (base, base.add(plan.blocks_at));
        let chains_p =
            if plan.chains.is_empty() { std::ptr::null() } else { words.add(plan.chains_at / 8).cast::<u32>() };
        // (Regions start at multiples of 256 bytes: whole words of the scratch.)
        let (records_p, literals_p) = (words.add(plan.records_at / 8).cast::<u32>(), base.add(plan.literals_at));
        let tables_p =
            if plan.split == LANES { words.add(plan.tables_at / 8).cast::<u32>() } else { std::ptr::null_mut() };
        zstd_plan_on_host(a.inputs.as_ptr(), a.input_sizes.as_ptr(), a.capacities.as_ptr(), frames_p, blocks_p, n);
        if plan.literals_first {
            zstd_block_literals_on_host(a.inputs.as_ptr(), frames_p, blocks_p, literals_p, plan.slots.blocks);
        }
        zstd_decode_blocks_on_host(
            a.inputs.as_ptr(),
            frames_p,
            blocks_p,
            literals_p,
            records_p,
            plan.slots.blocks,
            split,
            chains_p,
            u64::from(plan.literals_first),
            tables_p,
        );
        if !tables_p.is_null() {
            zstd_sequence_lanes_on_host(a.inputs.as_ptr(), frames_p, blocks_p, records_p, tables_p, plan.slots.blocks);
        }
        if let Some(jump) = plan.jump {
            let (entries_p, flags_p) =
                (words.add(jump.entries_at / 8).cast::<u32>(), words.add(jump.flags_at / 8).cast::<u32>());
            let (decoded_p, statuses_p) = (a.decoded.as_mut_ptr(), a.statuses.as_mut_ptr());
            zstd_link_on_host(
                a.capacities.as_ptr(),
                decoded_p,
                statuses_p,
                frames_p,
                blocks_p,
                flags_p,
                jump.passes,
                n,
            );
            zstd_entries_on_host(
                a.inputs.as_ptr(),
                decoded_p,
                statuses_p,
                frames_p,
                blocks_p,
                literals_p,
                records_p,
                entries_p,
                plan.slots.blocks,
                ENTRY_PARTS,
            );
            zstd_jump_on_host(entries_p, jump.entries, flags_p, jump.passes);
            let y = jump.largest.div_ceil(4096).clamp(1, 3) as u32;
            zstd_write_on_host(
                a.capacities.as_ptr(),
                a.outputs.as_ptr(),
                decoded_p,
                statuses_p,
                frames_p,
                entries_p,
                n,
                y,
            );
            return a.results();
        }
        zstd_execute_on_host(
            a.inputs.as_ptr(),
            a.capacities.as_ptr(),
            a.outputs.as_ptr(),
            a.decoded.as_mut_ptr(),
            a.statuses.as_mut_ptr(),
            frames_p,
            blocks_p,
            literals_p,
            records_p,
            n,
            threads,
        );
    }
    a.results()
}

/// Which of our decoders [`decode_on_host`] runs.
#[cfg(any(test, feature = "cpu-kernels"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPath {
    /// One warp per frame (`decode.cu`).
    OneWarp,
    /// Blocks side by side (each block's sequences decoded a lane a block, as in large
    /// batches: `zstd_sequence_lanes`), each frame's sequences executed by a warp
    /// (`zstd_execute`, its thread blocks as many threads as the device's launch of as many
    /// frames takes).
    Execute,
    /// [`HostPath::Execute`] with thread blocks of this many threads (32, 64 or 128; another
    /// number makes every frame an error).
    ExecuteThreads(u32),
    /// Blocks side by side (each block's sequences split into spans, as in small batches), the
    /// bytes resolved by jumps (`zstd_jump`; batches up to 64 MiB).
    Jump,
}

/// The sizes of the plan structs as the kernels' source lays them out (frame, block).
#[cfg(test)]
fn plan_sizes_on_host() -> (usize, usize) {
    // SAFETY: a pure function of the compiled source.
    let both = unsafe { zstd_plan_sizes_on_host() };
    ((both & 0xFFFF_FFFF) as usize, (both >> 32) as usize)
}

#[cfg(test)]
mod tests;
