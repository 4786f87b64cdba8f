//! The nvCOMP glue the device codecs of this crate share (`zstd`, `gzip`, `zlib`): nvCOMP where a batch
//! needs it, its batched decode, and the methods of a device codec that it decodes.

use std::ffi::c_void;

use nvcomp_sys::{sys as nv, Decompressor, NvcompLibrary};

use crate::codecs::DeviceBatch;
use crate::error::GpuError;

pub(super) fn need(nvcomp: Option<&NvcompLibrary>) -> Result<&NvcompLibrary, GpuError> {
    nvcomp.ok_or_else(|| GpuError::NoNvcomp("this codec chain needs it".into()))
}

/// The methods of a device codec that nvCOMP's batched `$decompressor` decodes.
macro_rules! nvcomp_decoder {
    ($decompressor:expr) => {
        fn needs_nvcomp(&self) -> bool {
            true
        }

        fn temp_bytes(
            &self,
            nvcomp: Option<&nvcomp_sys::NvcompLibrary>,
            count: usize,
            max: usize,
            total: usize,
        ) -> Result<usize, $crate::error::GpuError> {
            $crate::codecs::nvcomp::temp_bytes($decompressor, nvcomp, count, max, total)
        }

        fn input_alignment(
            &self,
            nvcomp: Option<&nvcomp_sys::NvcompLibrary>,
        ) -> Result<usize, $crate::error::GpuError> {
            $crate::codecs::nvcomp::input_alignment($decompressor, nvcomp)
        }

        unsafe fn decode(&self, batch: &$crate::codecs::DeviceBatch<'_>) -> Result<(), $crate::error::GpuError> {
            // SAFETY: the caller's contract.
            unsafe { $crate::codecs::nvcomp::decompress($decompressor, batch) }
        }
    };
}
pub(super) use nvcomp_decoder;

/// nvCOMP's scratch for a batch of `count` units of at most `max` decoded bytes, `total` in all.
pub(super) fn temp_bytes(
    decompressor: Decompressor,
    nvcomp: Option<&NvcompLibrary>,
    count: usize,
    max: usize,
    total: usize,
) -> Result<usize, GpuError> {
    Ok(need(nvcomp)?.decompress_temp_size(decompressor, count, max, total)?)
}

/// The alignment nvCOMP's `decompressor` needs of each input.
pub(super) fn input_alignment(decompressor: Decompressor, nvcomp: Option<&NvcompLibrary>) -> Result<usize, GpuError> {
    Ok(need(nvcomp)?.decompress_alignments(decompressor)?.input)
}

/// A device status in nvCOMP's words (its number where nvCOMP is not loaded).
pub(crate) fn status_string(status: u32, nvcomp: Option<&NvcompLibrary>) -> String {
    nvcomp.map_or_else(|| format!("status {status}"), |n| n.status_string(status))
}

/// nvCOMP's batched decode with the batch's arrays.
pub(super) unsafe fn decompress(decompressor: Decompressor, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
    // SAFETY: the batch's contract (DeviceCodec::decode).
    unsafe {
        need(batch.nvcomp)?.decompress_async(
            decompressor,
            batch.inputs as *const *const c_void,
            batch.input_sizes as *const usize,
            batch.capacities as *const usize,
            batch.decoded_sizes as *mut usize,
            batch.count,
            batch.temp as *mut c_void,
            batch.temp_bytes,
            batch.outputs as *const *mut c_void,
            batch.statuses as *mut nv::nvcompStatus_t,
            batch.stream.cu_stream() as nv::cudaStream_t,
        )
    }?;
    Ok(())
}
