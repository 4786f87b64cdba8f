//! Host tables to device memory through pinned buffers that are kept and reused once their copy
//! has run: a copy from pageable memory would first wait for everything queued on the stream
//! (the previous batch's decode), which the pipeline overlaps with the next batch's reads. The
//! device context holds them ([`GpuContext::uploads`](crate::device::context::GpuContext)), so
//! that they outlive a read, and trims them with its pinned buffers.

use std::sync::Mutex;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use crate::error::GpuError;
use crate::reader::PinnedBuffer;

/// Buffers kept for reuse: two batches in flight and one being filled, each with up to three
/// tables (Blosc's stream table, our zstd decoder's frame table, then its chains once the host
/// has walked them). One not kept is freed after its copy, which waits for the stream.
const KEEP: usize = 9;

/// A codec's table uploads (see the module docs).
#[derive(Default)]
pub(crate) struct Uploads {
    kept: Mutex<Vec<Staged>>,
}

struct Staged {
    host: PinnedBuffer,
    /// Recorded after its last copy: the buffer is free once it completes.
    copied: Option<CudaEvent>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        // The pinned memory is freed only after its copy has run.
        if let Some(event) = &self.copied {
            let _ = event.synchronize();
        }
    }
}

impl Staged {
    fn free(&self) -> bool {
        self.copied.as_ref().is_none_or(CudaEvent::is_complete)
    }
}

impl std::fmt::Debug for Uploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploads").finish_non_exhaustive()
    }
}

impl Uploads {
    /// Copy `bytes` to the device address `dst` on `stream`, through a pinned buffer.
    ///
    /// # Safety
    /// `dst` is device memory with room for `bytes`, not in use by other work until `stream`
    /// gets to the copy.
    pub(crate) unsafe fn upload(&self, stream: &CudaStream, bytes: &[u8], dst: u64) -> Result<(), GpuError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let taken = {
            let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            kept.iter().position(|s| s.host.len() >= bytes.len() && s.free()).map(|i| kept.swap_remove(i))
        };
        let mut staged = match taken {
            Some(staged) => staged,
            None => Staged {
                host: PinnedBuffer::new(stream.context(), bytes.len().next_power_of_two().max(1 << 16))
                    .map_err(|e| GpuError::Unsupported(format!("pinned memory for a codec's tables: {e}")))?,
                copied: None,
            },
        };
        staged.host.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: the pinned buffer holds the bytes and is not reused until the event recorded
        // after this copy completes; `dst` is the caller's contract.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, staged.host.as_slice().as_ptr().cast(), bytes.len(), stream.cu_stream())
        }
        .result()
        .map_err(GpuError::cuda("copying a codec's tables to the device"))?;
        staged.copied = Some(stream.record_event(None).map_err(GpuError::cuda("recording an event"))?);
        let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() < KEEP {
            kept.push(staged);
        }
        // Not kept: dropped once its copy has run (`Staged`'s drop).
        Ok(())
    }

    /// Keep the smallest buffers that fit in `limit` bytes (freed ones wait for their copy);
    /// returns the bytes kept. Called when no read is in flight.
    pub(crate) fn trim(&self, limit: u64) -> u64 {
        let dropped: Vec<Staged> = {
            let mut kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            kept.sort_by_key(|s| s.host.len());
            let mut total = 0u64;
            let fit = kept.iter().take_while(|s| {
                total = total.saturating_add(s.host.len() as u64);
                total <= limit
            });
            let fit = fit.count();
            kept.split_off(fit)
        };
        drop(dropped);
        self.bytes()
    }

    /// Bytes of the kept buffers.
    pub(crate) fn bytes(&self) -> u64 {
        let kept = self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.iter().map(|s| s.host.len() as u64).sum()
    }
}
