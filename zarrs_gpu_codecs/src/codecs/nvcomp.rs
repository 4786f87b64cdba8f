//! The nvCOMP backend the device codecs of this crate share (`zstd`, `gzip`, `zlib`, `blosc`):
//! the process's nvCOMP, its batched decode, and the methods of a device codec that it decodes
//! (its scratch, the alignment it needs of inputs, its statuses in words). Codecs whose decoder
//! is a kernel of ours never load it.

use std::ffi::c_void;

use nvcomp_sys::{sys as nv, Decompressor, NvcompLibrary};

use crate::codecs::DeviceBatch;
use crate::error::GpuError;

/// The process's nvCOMP, loaded on first use, or why it is not loadable.
pub(super) fn library() -> Result<&'static NvcompLibrary, GpuError> {
    NvcompLibrary::get().map_err(|e| GpuError::NoNvcomp(e.to_string()))
}

/// The methods of a device codec that nvCOMP's batched `$decompressor` decodes.
macro_rules! nvcomp_decoder {
    ($decompressor:expr) => {
        fn needs_nvcomp(&self) -> bool {
            true
        }

        fn scratch_bound(&self, count: usize, max: usize, total: usize) -> Result<usize, $crate::error::GpuError> {
            $crate::codecs::nvcomp::scratch_bound($decompressor, count, max, total)
        }

        fn input_alignment(&self) -> Result<usize, $crate::error::GpuError> {
            $crate::codecs::nvcomp::input_alignment($decompressor)
        }

        unsafe fn decode(&self, batch: &$crate::codecs::DeviceBatch<'_>) -> Result<(), $crate::error::GpuError> {
            // SAFETY: the caller's contract.
            unsafe { $crate::codecs::nvcomp::decompress($decompressor, batch) }
        }

        fn status_string(&self, status: u32) -> String {
            $crate::codecs::nvcomp::status_string(status)
        }
    };
}
pub(super) use nvcomp_decoder;

/// nvCOMP's scratch for a batch of `count` units of at most `max` decoded bytes, `total` in all.
pub(super) fn scratch_bound(
    decompressor: Decompressor,
    count: usize,
    max: usize,
    total: usize,
) -> Result<usize, GpuError> {
    Ok(library()?.decompress_temp_size(decompressor, count, max, total)?)
}

/// The alignment nvCOMP's `decompressor` needs of each input.
pub(super) fn input_alignment(decompressor: Decompressor) -> Result<usize, GpuError> {
    Ok(library()?.decompress_alignments(decompressor)?.input)
}

/// A status of nvCOMP's in its words (its number where nvCOMP is not loadable).
pub(crate) fn status_string(status: u32) -> String {
    NvcompLibrary::get().map_or_else(|_| format!("status {status}"), |n| n.status_string(status))
}

/// nvCOMP's batched decode with the batch's arrays, its scratch nvCOMP's temp.
pub(super) unsafe fn decompress(decompressor: Decompressor, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
    // SAFETY: the batch's contract (DeviceCodec::decode).
    unsafe {
        library()?.decompress_async(
            decompressor,
            batch.inputs as *const *const c_void,
            batch.input_sizes as *const usize,
            batch.capacities as *const usize,
            batch.decoded_sizes as *mut usize,
            batch.count,
            batch.scratch as *mut c_void,
            batch.scratch_bytes,
            batch.outputs as *const *mut c_void,
            batch.statuses as *mut nv::nvcompStatus_t,
            batch.stream.cu_stream() as nv::cudaStream_t,
        )
    }?;
    Ok(())
}
