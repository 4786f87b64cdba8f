//! The one owner of a decoded read's memory: each slot's device staging and pinned buffer, the
//! decoder's scratch, the fill block, the results log and the host ring, all counted against the
//! read's device memory cap; and their release once the device is done with them.

use std::cell::Cell;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device::pool::DeviceBuffer;
use crate::error::GpuError;
use crate::pipeline::batch::ensure;
use crate::pipeline::place::fill_pattern;
use crate::reader::PinnedBuffer;

/// A read's buffers. Stages ask it for memory by slot and length; none of them takes from the
/// pools or counts against the cap itself.
pub(super) struct ReadMemory<'a> {
    budget: Budget<'a>,
    slots: Vec<SlotMemory>,
    /// What nvCOMP reports back, batch after batch (see `finish::ResultLog`).
    results: PinnedBuffer,
    /// The fill value block for missing units.
    fill: Option<DeviceBuffer>,
    /// The decoder's scratch, one for both slots: every batch decodes on the read's stream, so
    /// batch k+1's decode starts after batch k's has finished with it (nvCOMP's zstd scratch is
    /// about 3 times a batch's decoded bytes: two of them doubled a read's working set).
    scratch: Option<DeviceBuffer>,
    /// Chunks decoded on host threads, batch after batch, on their way to the device.
    host_ring: HostRing,
}

/// One of the (two) places batches alternate in. Its buffers are reused only after the event of
/// the batch that used them last.
#[derive(Default)]
struct SlotMemory {
    /// Device staging: stored bytes, decoded bytes, metadata.
    staging: Option<DeviceBuffer>,
    /// Pinned stored chunks, then the mirror of the metadata for async copies.
    pinned: Option<PinnedBuffer>,
}

/// Device memory taken from the context's pool, counted against the read's cap.
struct Budget<'a> {
    context: &'a GpuContext,
    cap: Option<u64>,
    device: usize,
    taken: Taken,
}

/// Device memory a read has taken (its output where it allocates it, staging, scratch, the fill
/// block) and the most it held at once (its report's peak).
struct Taken {
    now: Cell<u64>,
    peak: Cell<u64>,
}

impl Budget<'_> {
    /// Refused when `len` more bytes would pass the cap.
    fn check(&self, len: u64) -> Result<(), GpuError> {
        let needed = self.taken.now.get().saturating_add(len);
        match self.cap {
            Some(cap) if needed > cap => Err(GpuError::OutOfMemory { needed, free: cap, device: self.device }),
            _ => Ok(()),
        }
    }

    /// A buffer of at least `len` bytes, counted (a pooled buffer may be larger than asked: what
    /// the read holds is its whole length).
    fn take(&self, len: usize) -> Result<DeviceBuffer, GpuError> {
        self.check(len as u64)?;
        let buffer = self.context.take_staging(len)?;
        if let Err(err) = self.check(buffer.len() as u64) {
            self.context.give_staging(buffer);
            return Err(err);
        }
        let Taken { now, peak } = &self.taken;
        now.set(now.get() + buffer.len() as u64);
        peak.set(peak.get().max(now.get()));
        Ok(buffer)
    }

    /// [`ensure`] `buffer` of `len` bytes, counted: the buffer, and whether it is new. A buffer
    /// outgrown is freed, not pooled: kept, it and its larger successor would both hold device
    /// memory, and the successor's allocation could fail for want of it.
    fn ensure<'b>(
        &self,
        buffer: &'b mut Option<DeviceBuffer>,
        len: u64,
    ) -> Result<(&'b mut DeviceBuffer, bool), GpuError> {
        let free = |old: DeviceBuffer| {
            self.taken.now.set(self.taken.now.get().saturating_sub(old.len() as u64));
            drop(old);
        };
        ensure(buffer, len, DeviceBuffer::len, |len| self.take(len), free)
    }
}

/// Room asked of a slot: the device staging's address, and whether the buffer is new (it holds
/// none of the bytes copied to the old one).
pub(super) struct Staged {
    pub(super) ptr: u64,
    pub(super) new: bool,
}

/// The decoder's scratch, beside a slot's stored bytes (see [`ReadMemory::decode_buffers`]).
pub(super) struct Scratch<'m, 'a> {
    buffer: &'m mut Option<DeviceBuffer>,
    budget: &'m Budget<'a>,
}

impl Scratch<'_, '_> {
    /// The scratch of at least `len` bytes (its address). A scratch too small is replaced only
    /// after the decodes queued on `stream` (the read's), which may still use it, have finished.
    pub(super) fn ensure(self, len: usize, stream: &CudaStream) -> Result<u64, GpuError> {
        if self.buffer.as_ref().is_some_and(|b| b.len() < len) {
            stream.synchronize().map_err(GpuError::cuda("waiting for a decode's scratch"))?;
        }
        Ok(self.budget.ensure(self.buffer, len as u64)?.0.ptr())
    }
}

impl<'a> ReadMemory<'a> {
    /// Memory for a read in `slots` slots, with `results_len` pinned bytes for nvCOMP's results,
    /// whose output takes `output_bytes` of the cap (none for a caller's destination).
    pub(super) fn new(
        context: &'a GpuContext,
        config: &GpuConfig,
        slots: usize,
        results_len: usize,
        output_bytes: u64,
    ) -> Result<Self, GpuError> {
        Ok(Self {
            budget: Budget {
                context,
                cap: config.device_memory_cap(),
                device: config.device(),
                taken: Taken { now: output_bytes.into(), peak: output_bytes.into() },
            },
            slots: (0..slots).map(|_| SlotMemory::default()).collect(),
            results: context.take_pinned(results_len)?,
            fill: None,
            scratch: None,
            host_ring: HostRing::default(),
        })
    }

    /// The slot's device staging, at least `len` bytes.
    pub(super) fn staging(&mut self, slot: usize, len: u64) -> Result<Staged, GpuError> {
        let (buffer, new) = self.budget.ensure(&mut self.slots[slot].staging, len)?;
        Ok(Staged { ptr: buffer.ptr(), new })
    }

    /// Whether the slot's staging holds `len` bytes already (a larger ask replaces it).
    pub(super) fn staging_holds(&self, slot: usize, len: u64) -> bool {
        self.slots[slot].staging.as_ref().is_some_and(|b| b.len() as u64 >= len)
    }

    /// The slot's pinned buffer, at least `len` bytes (a smaller one goes back to the pool).
    pub(super) fn pinned(&mut self, slot: usize, len: u64) -> Result<&mut PinnedBuffer, GpuError> {
        let context = self.budget.context;
        let (buffer, _) = ensure(
            &mut self.slots[slot].pinned,
            len,
            PinnedBuffer::len,
            |len| context.take_pinned(len),
            |old| context.give_pinned(old),
        )?;
        Ok(buffer)
    }

    /// The slot's pinned bytes as the batch's read left them (empty before any).
    pub(super) fn stored(&self, slot: usize) -> &[u8] {
        self.slots[slot].pinned.as_ref().map_or(&[][..], PinnedBuffer::as_slice)
    }

    /// The slot's pinned metadata mirror from `at`: its host address.
    pub(super) fn pinned_meta(&mut self, slot: usize, at: u64) -> usize {
        let buffer = self.slots[slot].pinned.as_mut().expect("read before its metadata is staged");
        buffer.as_mut_slice()[at as usize..].as_mut_ptr() as usize
    }

    /// The slot's stored bytes and the decoder's scratch, together.
    pub(super) fn decode_buffers(&mut self, slot: usize) -> (&[u8], Scratch<'_, 'a>) {
        let stored = self.slots[slot].pinned.as_ref().map_or(&[][..], PinnedBuffer::as_slice);
        (stored, Scratch { buffer: &mut self.scratch, budget: &self.budget })
    }

    /// The slot's stored bytes and the host ring, for the host's share of its batch.
    pub(super) fn host_share(&mut self, slot: usize) -> (&[u8], &mut HostRing) {
        let stored = self.slots[slot].pinned.as_ref().map_or(&[][..], PinnedBuffer::as_slice);
        (stored, &mut self.host_ring)
    }

    /// The fill block (`pattern` repeated, `len` bytes), made at the first missing unit on
    /// `stream`: its address.
    pub(super) fn fill(&mut self, pattern: &[u8], len: u64, stream: &CudaStream) -> Result<u64, GpuError> {
        if let Some(buffer) = &self.fill {
            return Ok(buffer.ptr());
        }
        let buffer = self.budget.take(len as usize)?;
        // SAFETY: the buffer holds at least len bytes, a whole number of elements (the longest
        // read); it is used only by work ordered after this on the read's stream.
        unsafe { fill_pattern(pattern, buffer.ptr(), len as usize, stream) }?;
        Ok(self.fill.insert(buffer).ptr())
    }

    /// The pinned buffer nvCOMP's results come back to.
    pub(super) fn results(&mut self) -> &mut PinnedBuffer {
        &mut self.results
    }

    /// The most device memory the read held at once, its output included.
    pub(super) fn peak(&self) -> u64 {
        self.budget.taken.peak.get()
    }

    /// Give the buffers back to the pools once the device is done with them (everything enqueued
    /// on `streams`, by `deadline`). A batch that never finishes (or, after an error, work in
    /// flight that does not finish in time) leaves them to kernels that may still write them:
    /// they are leaked, and the context is lost for later reads.
    pub(super) fn release(
        self,
        result: &Result<(), GpuError>,
        streams: &[&CudaStream],
        deadline: Instant,
    ) -> Result<(), GpuError> {
        let settled = match result {
            Err(GpuError::Timeout { .. }) => Ok(false),
            _ => settle(streams, deadline),
        };
        let context = self.budget.context;
        match (settled, result) {
            (Ok(true), _) => {
                let Self { slots, results, fill, scratch, host_ring, .. } = self;
                for slot in slots {
                    if let Some(staging) = slot.staging {
                        context.give_staging(staging);
                    }
                    if let Some(buffer) = slot.pinned {
                        context.give_pinned(buffer);
                    }
                }
                for buffer in fill.into_iter().chain(scratch) {
                    context.give_staging(buffer);
                }
                context.give_pinned(results);
                if let Some(buffer) = host_ring.buffer {
                    context.give_ring(buffer);
                }
            }
            (Ok(false), result) => {
                let cause = result.as_ref().err().map_or_else(String::new, ToString::to_string);
                context.mark_lost(format!("a device batch did not finish: {cause}"));
                std::mem::forget(self);
            }
            (Err(err), Ok(())) => {
                std::mem::forget(self);
                return Err(GpuError::Cuda { what: "finishing a read", source: err });
            }
            (Err(_), Err(_)) => std::mem::forget(self),
        }
        Ok(())
    }
}

/// A read's pinned ring for host-decoded chunks: two halves, and for each, the event after the
/// last copies out of it (it is written again only once they have finished).
#[derive(Default)]
pub(super) struct HostRing {
    pub(super) buffer: Option<PinnedBuffer>,
    pub(super) copied: [Option<CudaEvent>; 2],
    /// The half the next wave writes.
    pub(super) next: usize,
}

impl HostRing {
    /// The ring, at least `len` bytes: a smaller one is given back once its copies are done.
    pub(super) fn ensure(&mut self, context: &GpuContext, len: u64) -> Result<&mut PinnedBuffer, GpuError> {
        if self.buffer.as_ref().is_some_and(|b| (b.len() as u64) < len) {
            self.wait_all()?;
            context.give_ring(self.buffer.take().expect("checked"));
        }
        match &mut self.buffer {
            Some(buffer) => Ok(buffer),
            none => Ok(none.insert(context.take_ring(len as usize)?)),
        }
    }

    fn wait_all(&mut self) -> Result<(), GpuError> {
        for event in self.copied.iter_mut().filter_map(Option::take) {
            event.synchronize().map_err(GpuError::cuda("waiting for host-decoded copies"))?;
        }
        Ok(())
    }
}

/// Wait for everything enqueued on `streams` until `deadline`: Ok(false) when it passes first.
fn settle(streams: &[&CudaStream], deadline: Instant) -> Result<bool, cudarc::driver::DriverError> {
    for stream in streams {
        let done = stream.record_event(None)?;
        if !GpuContext::wait_until(done, deadline)? {
            return Ok(false);
        }
    }
    Ok(true)
}
