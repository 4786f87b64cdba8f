//! The end of each batch and of the read: nvCOMP's results copied back and checked once the
//! device is done, each batch's event awaited until its deadline.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{sys, CudaEvent};

use super::device::Layout;
use super::job::{Item, Job};
use super::memory::ReadMemory;
use super::read::Batch;
use crate::device::context::GpuContext;
use crate::error::GpuError;
use crate::pipeline::layout::MetaLayout;
use crate::pipeline::unit::Unit;
use crate::reader::PinnedBuffer;

/// A unit's device decode result, checked once the batches are done: where its decoded size
/// (u64) and status (u32) lie in the results buffer, and for a chunk carrying a digest, the
/// stored value and where the computed one and its status (u32 each) lie.
struct DecodeCheck {
    unit: usize,
    size: usize,
    status: usize,
    digest: Option<(u32, usize, usize)>,
}

impl Batch {
    /// The batch's decode results queued to `results`, in the read's results buffer (see
    /// [`ResultLog::queue`]).
    pub(super) fn queue_results(
        &self,
        job: &Job<'_>,
        layout: &Layout,
        results: &mut ResultLog,
        memory: &mut ReadMemory<'_>,
    ) -> Result<(), GpuError> {
        results.queue(job, layout, &self.on_device(), memory.results())
    }
}

/// What nvCOMP reports back, batch after batch, in one pinned buffer: per batch its decoded sizes
/// (u64) and statuses (u32), and the content checks' values (and statuses): at most 20 bytes a
/// chunk; and where each device-decoded unit's lie, to check once every batch is done.
#[derive(Default)]
pub(super) struct ResultLog {
    /// Where the next batch's results go in the buffer.
    at: usize,
    /// The content checks to make once every batch is done.
    checks: Vec<DecodeCheck>,
}

impl ResultLog {
    /// The pinned bytes the results of `units` units take, digests included (see
    /// `MetaLayout::result_bytes`).
    pub(super) fn buffer_len(units: usize) -> usize {
        MetaLayout::new(0, units.max(1), true, 0, 0).result_bytes() as usize
    }

    /// Copy a batch's decode results back to the host in one copy (sizes, statuses and content
    /// checks lie together on the device) after the results queued before, and note where each
    /// device-decoded unit's lie, for [`ResultLog::check`] after the last batch.
    fn queue(
        &mut self,
        job: &Job<'_>,
        layout: &Layout,
        on_device: &[&Item],
        buffer: &mut PinnedBuffer,
    ) -> Result<(), GpuError> {
        let results_at = self.at;
        let arrays = &layout.arrays;
        let result_bytes = arrays.result_bytes() as usize;
        if result_bytes > 0 {
            let results_base = buffer.as_mut_slice().as_mut_ptr();
            // SAFETY: the buffer holds every unit's results with digests (`buffer_len`); the source is this batch's
            // contiguous results.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    (results_base as usize + results_at) as *mut c_void,
                    layout.at(arrays.results()),
                    result_bytes,
                    job.stream.cu_stream(),
                )
            }
            .result()
            .map_err(GpuError::cuda("reading decode results"))?;
        }
        let at = |array: u64, k: usize, width: usize| results_at + (array - arrays.results()) as usize + k * width;
        for (k, it) in on_device.iter().enumerate().take(arrays.dec) {
            let digest = it.digest.map(|d| (d, at(arrays.digest_values(), k, 4), at(arrays.digest_statuses(), k, 4)));
            let (size, status) = (at(arrays.results(), k, 8), at(arrays.statuses(), k, 4));
            self.checks.push(DecodeCheck { unit: it.unit, size, status, digest });
        }
        self.at += result_bytes;
        Ok(())
    }

    /// Every device-decoded unit's status and size, and the check of its decoded bytes it carries
    /// (gzip CRC-32, zstd XXH64; crc32c was checked before decoding), once the device is done.
    pub(super) fn check(&self, job: &Job<'_>, results: &[u8]) -> Result<(), GpuError> {
        let units = job.units;
        let Some(codec) = job.chain.compression.as_deref() else { return Ok(()) };
        let name = codec.name();
        let status_string = |s: u32| codec.status_string(s);
        let word = |at: usize| u32::from_ne_bytes(results[at..at + 4].try_into().expect("4 bytes"));
        for &DecodeCheck { unit, size, status, digest } in &self.checks {
            let status = word(status);
            if status != 0 {
                return Err(units[unit].error(format!("{name} on the device: {}", status_string(status))));
            }
            let size = u64::from_ne_bytes(results[size..size + 8].try_into().expect("8 bytes"));
            let expected = job.decoded_len(unit);
            if size != expected {
                return Err(units[unit].error(format!("{name} decoded {size} bytes, {expected} expected")));
            }
            if let Some((stored, value, status)) = digest {
                let digest_name = codec.digest_name();
                if word(status) != 0 {
                    return Err(
                        units[unit].error(format!("{digest_name} on the device: {}", status_string(word(status))))
                    );
                }
                if word(value) != stored {
                    return Err(units[unit].error(format!(
                        "{digest_name} mismatch: stored {stored:#010x}, decoded bytes give {:#010x}",
                        word(value)
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `bound` from now (a bound too large for the clock: a year, which no wait reaches).
pub(super) fn after(bound: std::time::Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(bound).unwrap_or_else(|| now + std::time::Duration::from_hours(365 * 24))
}

/// A batch enqueued on the device: the event after its last work, and when it must be done by.
pub(super) struct Pending {
    pub(super) event: CudaEvent,
    pub(super) deadline: Instant,
    pub(super) bound: std::time::Duration,
    pub(super) batch: usize,
}

impl Pending {
    /// Wait for the batch (whose units are `batch`) until its deadline; past it, an error naming
    /// its first chunks.
    pub(super) fn wait(self, batch: &[usize], units: &[Unit]) -> Result<(), GpuError> {
        if GpuContext::wait_until(self.event, self.deadline).map_err(GpuError::cuda("waiting for a batch"))? {
            return Ok(());
        }
        let mut chunks: Vec<String> = batch.iter().take(3).map(|&u| units[u].label()).collect();
        if batch.len() > 3 {
            chunks.push("...".into());
        }
        Err(GpuError::Timeout { count: batch.len(), chunks: chunks.join(", "), seconds: self.bound.as_secs_f64() })
    }
}
