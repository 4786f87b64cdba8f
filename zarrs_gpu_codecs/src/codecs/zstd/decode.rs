//! Our device decoder of zstd frames (`decode.cu`): one warp per frame, a whole batch in one
//! launch. Every lane parses the frame and block headers alike; lane 0 reads the table
//! descriptions and builds the Huffman and FSE decoding tables in shared memory; the four
//! literal streams of a block decode on four lanes side by side; the sequences are decoded by
//! every lane alike and their literal and match copies spread over the lanes.
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

use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// The kernel's source, compiled with the other kernels (`codecs::KERNEL_SOURCES`).
pub(crate) const SOURCE: &str = include_str!("decode.cu");

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
        _ => "unknown zstd decoder status",
    }
}

/// The environment variable that picks the device decoder of zstd frames: `nvcomp` (the default:
/// nvCOMP's batched decoder) or `ours` (our kernel, one warp per frame).
pub const ZSTD_DECODER_ENV: &str = "ZARRS_GPU_ZSTD_DECODER";

/// The device decoder of zstd frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZstdDecoder {
    /// nvCOMP's batched zstd (its input must be valid: the host check makes sure of what it can).
    #[default]
    Nvcomp,
    /// Ours: one warp per frame, a batch in one launch, any input an error status at worst.
    Ours,
}

impl std::str::FromStr for ZstdDecoder {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ours" => Ok(Self::Ours),
            "nvcomp" => Ok(Self::Nvcomp),
            other => Err(format!("{ZSTD_DECODER_ENV}={other:?}: the zstd decoder is ours or nvcomp")),
        }
    }
}

impl ZstdDecoder {
    /// The decoder [`ZSTD_DECODER_ENV`] names (unset or empty: the default), or why its value is
    /// not one.
    pub(crate) fn from_env() -> Result<Self, String> {
        match std::env::var(ZSTD_DECODER_ENV) {
            Ok(v) if !v.trim().is_empty() => v.parse(),
            _ => Ok(Self::default()),
        }
    }
}

/// Threads per thread block: one warp, one frame (its tables fill 14 KiB of shared memory).
const THREADS: u32 = 32;

/// The device arrays of a batch of `n` frames for [`launch_decode`] (as nvCOMP's batched
/// decoders take them): input pointers, input sizes, capacities (each frame's expected length)
/// and output pointers, then where the kernel writes decoded lengths (`u64`) and statuses
/// (`u32`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ZstdArrays {
    pub(crate) inputs: u64,
    pub(crate) input_sizes: u64,
    pub(crate) capacities: u64,
    pub(crate) outputs: u64,
    pub(crate) decoded: u64,
    pub(crate) statuses: u64,
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
    arrays: &ZstdArrays,
    n: usize,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let function = kernels.function("zstd_decode_frames")?;
    let blocks = u32::try_from(n).map_err(|_| GpuError::Unsupported(format!("{n} zstd frames in one launch")))?;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let n = n as u64;
    let mut launch = stream.launch_builder(&function);
    launch
        .arg(&arrays.inputs)
        .arg(&arrays.input_sizes)
        .arg(&arrays.capacities)
        .arg(&arrays.outputs)
        .arg(&arrays.decoded)
        .arg(&arrays.statuses)
        .arg(&n);
    // SAFETY: six device addresses and a count, as the kernel takes them; the rest is the
    // caller's contract.
    unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the zstd decoder"))?;
    Ok(())
}

#[cfg(any(test, feature = "cpu-kernels"))]
unsafe extern "C" {
    fn zstd_decode_frames_on_host(
        inputs: *const *const u8,
        input_sizes: *const u64,
        capacities: *const u64,
        outputs: *const *mut u8,
        decoded: *mut u64,
        statuses: *mut u32,
        n: u64,
    );
}

/// The device kernel's code run on the CPU over `frames` (each a frame and the output it decodes
/// into, whose length is the expected one): each frame's status and decoded length, as the device
/// writes them.
#[cfg(any(test, feature = "cpu-kernels"))]
#[must_use]
pub fn decode_on_host(frames: &mut [(&[u8], &mut [u8])]) -> Vec<(u32, u64)> {
    let n = frames.len();
    let inputs: Vec<*const u8> = frames.iter().map(|(i, _)| i.as_ptr()).collect();
    let input_sizes: Vec<u64> = frames.iter().map(|(i, _)| i.len() as u64).collect();
    let capacities: Vec<u64> = frames.iter().map(|(_, o)| o.len() as u64).collect();
    let outputs: Vec<*mut u8> = frames.iter_mut().map(|(_, o)| o.as_mut_ptr()).collect();
    let mut decoded = vec![0u64; n];
    let mut statuses = vec![u32::MAX; n];
    // SAFETY: n entries each; every input holds its size and every output its capacity, the
    // outputs distinct `&mut` slices; the kernel stays within those lengths.
    unsafe {
        zstd_decode_frames_on_host(
            inputs.as_ptr(),
            input_sizes.as_ptr(),
            capacities.as_ptr(),
            outputs.as_ptr(),
            decoded.as_mut_ptr(),
            statuses.as_mut_ptr(),
            n as u64,
        );
    }
    statuses.into_iter().zip(decoded).collect()
}

#[cfg(test)]
mod tests;
