//! Our device decoder of raw LZ4 blocks (Blosc's lz4 and lz4hc streams): one thread block per
//! LZ4 block, a whole batch in one launch (`decode.cu`). One thread follows the block's tokens
//! through tables the others build (a shared-memory read for eight common tokens); the tokens are
//! then parsed, placed by a prefix sum and checked a thread each, and the output is made window
//! by window, every byte an entry that is its value or points to the earlier byte it copies,
//! the pointers followed in passes over the window.
//!
//! It accepts exactly what [`check_block`](super::block::check_block) accepts, and so never
//! what lz4_flex or `LZ4_decompress_safe` reject: a block decodes only to exactly its expected
//! length, with LZ4's end-of-block rules. Any other input ends as a status ([`status_text`]),
//! never a read or write outside the lengths given nor more work than the input and output
//! lengths bound.
//!
//! With the `cpu-kernels` feature the same source runs on the CPU (`decode_on_host`): the
//! build script compiles it behind `host_shim.cpp`, where a thread block is one thread doing
//! every thread's work in order.

use cudarc::driver::{CudaStream, LaunchConfig};

use crate::codecs::ItemArrays;
use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// The kernel's source, compiled with the other kernels (`codecs::KERNEL_SOURCES`).
pub(crate) const SOURCE: &str = include_str!("decode.cu");

/// The block decoded to exactly its expected length.
pub const OK: u32 = 0;
/// A literal run reaches past the end of the input.
pub const LITERALS_PAST_INPUT: u32 = 1;
/// A match offset of 0, or one reaching before the start of the output.
pub const BAD_OFFSET: u32 = 2;
/// Literals or a match reach past the output's capacity (the expected length).
pub const PAST_CAPACITY: u32 = 3;
/// The input ends within a sequence (a length's extension bytes, an offset), or is empty.
pub const INPUT_ENDS: u32 = 4;
/// The block ends, well formed, at another length than the expected one.
pub const LENGTH_MISMATCH: u32 = 5;
/// The block breaks LZ4's end-of-block rules (a match within the last 12 bytes, or ending within
/// the last 5, fewer than 8 input bytes after a match's literals, or 4 after its length's
/// extension), which `LZ4_decompress_safe`, c-blosc's decoder, enforces.
pub const END_RULES: u32 = 6;
/// The block or its decoded length is over 2 GiB, more than the kernel's 32-bit places take.
pub const TOO_LARGE: u32 = 7;
/// Bits of a status that are the kernel's code; the others are the caller's tag.
pub const CODE_MASK: u32 = 0xFF;

/// A kernel status code in words.
#[must_use]
pub fn status_text(code: u32) -> &'static str {
    match code & CODE_MASK {
        OK => "decoded",
        LITERALS_PAST_INPUT => "a literal run reaches past the end of the input",
        BAD_OFFSET => "a match offset is 0 or reaches before the start of the block",
        PAST_CAPACITY => "literals or a match reach past the expected decoded length",
        INPUT_ENDS => "the input ends within a sequence",
        LENGTH_MISMATCH => "the block decodes to another length than the expected one",
        END_RULES => "the block breaks LZ4's end-of-block rules",
        TOO_LARGE => "the block or its decoded length is over 2 GiB",
        _ => "unknown LZ4 status",
    }
}

/// The device decoder of LZ4 streams (Blosc's lz4 and lz4hc), chosen by `ZARRS_GPU_LZ4_DECODER`:
/// ours unless nvCOMP's is named (`Auto`, the default, is ours).
pub type Lz4Decoder = crate::codecs::decoder_choice::DecoderChoice;

/// Threads per thread block of the kernel (one LZ4 block each; the kernel takes `blockDim.x`) for
/// a launch of `n` LZ4 blocks on a device of `sms` multiprocessors: a block a multiprocessor or
/// fewer get 1,024 threads each (a lone stream's time is its threads' waits on memory), more 512
/// each (about 42 KiB of shared memory each: five fit a multiprocessor). Measured on an H100
/// (benches/RESULTS.md, run DR2; kernel alone, B1 chunks of 8 streams, 256 / 512 threads, ms):
/// 1 chunk 0.89 / 0.62, 64 chunks 1.18 / 1.13, 1,024 chunks 10.48 / 10.18, 8,192 chunks 79.5 /
/// 77.5; 1,024 threads for one chunk 0.84 against 0.91 at 512 in DQ1, before the windows' entries
/// went a thread a byte.
fn threads_for(n: usize, sms: usize) -> u32 {
    if n <= sms {
        1024
    } else {
        512
    }
}

/// Enqueue the decode of `n` blocks on `stream`, one launch; `tags`: a device array of `n` `u32`
/// or-ed into each failing status, or 0 for none.
///
/// # Safety
/// The arrays are device memory of `n` entries ordered on `stream`; each input pointer holds its
/// size in readable bytes and each output pointer its capacity in writable bytes, outputs not
/// overlapping inputs or each other.
pub(crate) unsafe fn launch_decode(
    kernels: &Kernels,
    stream: &CudaStream,
    arrays: &ItemArrays,
    tags: u64,
    n: usize,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(n).map_err(|_| GpuError::Unsupported(format!("{n} LZ4 blocks in one launch")))?;
    let sms = stream
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(GpuError::cuda("asking the device's multiprocessors"))?;
    let threads = threads_for(n, usize::try_from(sms).unwrap_or(1));
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
    let a = arrays;
    let args = [a.inputs, a.input_sizes, a.capacities, a.outputs, a.decoded, a.statuses, tags, n as u64];
    // SAFETY: seven device addresses and a count, as the kernel takes them; the rest is the
    // caller's contract.
    unsafe { kernels.launch_u64(stream, "lz4_decode_blocks", config, &args, "launching the LZ4 decoder") }
}

/// How the CPU runs a thread block of the kernel ([`decode_on_host`]).
#[cfg(any(test, feature = "cpu-kernels"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostThreads {
    /// One thread does the block's work in order.
    OneThread,
    /// A launch's threads a block (1 to 1,024): their strided loops run one thread after the
    /// other, with the device's strides.
    Emulated(u32),
}

#[cfg(any(test, feature = "cpu-kernels"))]
impl HostThreads {
    /// One thread, and each thread count a launch takes ([`threads_for`]).
    pub const ALL: [Self; 4] = [Self::OneThread, Self::Emulated(256), Self::Emulated(512), Self::Emulated(1024)];
}

#[cfg(any(test, feature = "cpu-kernels"))]
unsafe extern "C" {
    /// The kernel's grid run block by block; `threads` 0: one thread does a block's work in
    /// order, else its threads' loops run one thread after the other.
    fn lz4_decode_blocks_on_host(items: *const crate::codecs::HostItemPointers, tags: *const u32, n: u64, threads: u32);
}

#[cfg(test)]
unsafe extern "C" {
    /// One block decoded with a thread block's threads as OS threads (`host_shim_lanes.cpp`),
    /// all but thread 0 sleeping `ahead_us` after each barrier.
    #[allow(clippy::too_many_arguments, reason = "the C entry's out-parameters")]
    fn lz4_decode_block_on_lanes(
        input: *const u8,
        n: u64,
        output: *mut u8,
        capacity: u64,
        threads: u32,
        ahead_us: u32,
        status: *mut u32,
        decoded: *mut u64,
        fewest_barriers: *mut u32,
        most_barriers: *mut u32,
    );
}

/// `block` decoded into `out` (its length the expected one) by `threads` OS threads running the
/// kernel's code as a thread block's, thread 0 let run ahead `ahead_us` after each barrier: the
/// status, the decoded length, and the fewest and most barriers a thread passed (equal in a
/// kernel whose threads keep step).
#[cfg(test)]
fn decode_on_lanes(block: &[u8], out: &mut [u8], threads: u32, ahead_us: u32) -> (u32, u64, u32, u32) {
    let (mut status, mut decoded, mut fewest, mut most) = (u32::MAX, 0u64, 0u32, 0u32);
    // SAFETY: the input and output are valid for their lengths until the call returns (it joins
    // its threads); the out-parameters are locals.
    unsafe {
        lz4_decode_block_on_lanes(
            block.as_ptr(),
            block.len() as u64,
            out.as_mut_ptr(),
            out.len() as u64,
            threads,
            ahead_us,
            &raw mut status,
            &raw mut decoded,
            &raw mut fewest,
            &raw mut most,
        );
    }
    (status, decoded, fewest, most)
}

/// The device kernel's code run on the CPU over `blocks` (each a block and the output it decodes
/// into, whose length is the expected one), its thread blocks run as `threads` says: each block's status
/// and decoded length, as the device writes them.
#[cfg(any(test, feature = "cpu-kernels"))]
#[must_use]
pub fn decode_on_host(blocks: &mut [(&[u8], &mut [u8])], threads: HostThreads) -> Vec<(u32, u64)> {
    let mut items = crate::codecs::HostItems::new(blocks);
    let pointers = items.pointers();
    // SAFETY: as many entries in each array as blocks, alive and unmoved until the call returns;
    // every input holds its size and every output its capacity, the outputs distinct `&mut`
    // slices; the kernel stays within those lengths.
    unsafe {
        lz4_decode_blocks_on_host(
            &raw const pointers,
            std::ptr::null(),
            items.count(),
            match threads {
                HostThreads::OneThread => 0,
                HostThreads::Emulated(n) => n.clamp(1, 1024),
            },
        );
    }
    items.results()
}

#[cfg(test)]
mod tests;
