//! The host's share of a batch: chunks decoded on host threads into a bounded pinned ring, and
//! copied from there to the batch's decoded region on the device.
//!
//! The ring is the read's, not the batch's, and its size does not follow the host's share. Sized
//! to the share, a read whose share grew (as the scheduler learns the host's rate, read after
//! read) mapped a fresh pinned buffer of that size, 50 to 80 ms for 200 MiB on the GPU host: a
//! 288-chunk read of Z2 swung from 27 to 121 ms. The ring takes a few sizes (powers of two up to
//! [`HOST_RING_MAX`]), which the device's pool of rings keeps between reads; a larger share goes
//! through it in waves, alternating halves, each reused once its copies have finished.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::sys;
use rayon::prelude::*;

use super::device::Layout;
use super::job::{Item, Job, Route};
use super::memory::{HostRing, ReadMemory};
use super::read::Batch;
use crate::codecs::DeviceCodec;
use crate::device::pool::HOST_RING_MAX;
use crate::error::GpuError;
use crate::pipeline::batch::DECODED_ALIGN;

/// The least: small shares share one size, so a pooled ring serves them all.
const HOST_RING_MIN: u64 = 8 << 20;

/// The ring's length for a share of `need` bytes whose largest chunk takes `largest`: a wave of
/// the whole share fits one half where the bound allows, and any chunk fits a half.
fn ring_len(need: u64, largest: u64) -> u64 {
    let share = need.saturating_mul(2).checked_next_power_of_two().unwrap_or(u64::MAX);
    let chunk = largest.saturating_mul(2).checked_next_power_of_two().unwrap_or(u64::MAX);
    share.clamp(HOST_RING_MIN, HOST_RING_MAX).max(chunk)
}

/// Items (by their aligned lengths) in waves of at most `half` bytes each, in order: the index
/// ranges, and each item's offset within its wave.
fn waves(lens: &[u64], half: u64) -> (Vec<std::ops::Range<usize>>, Vec<u64>) {
    let (mut waves, mut at) = (Vec::new(), Vec::with_capacity(lens.len()));
    let (mut start, mut used) = (0, 0u64);
    for (i, &len) in lens.iter().enumerate() {
        if used > 0 && used.saturating_add(len) > half {
            waves.push(start..i);
            (start, used) = (i, 0);
        }
        at.push(used);
        used = used.saturating_add(len);
    }
    if start < lens.len() {
        waves.push(start..lens.len());
    }
    (waves, at)
}

impl Batch {
    /// The host's share of the batch (items routed to host threads), decoded into the slot's host
    /// buffer and copied to the slot's decoded region (`layout.dbase`); the read's stream waits
    /// for the copies. Returns how many.
    pub(super) fn decode_host_share(
        &self,
        job: &Job<'_>,
        memory: &mut ReadMemory<'_>,
        layout: &Layout,
    ) -> Result<usize, GpuError> {
        let host_items: Vec<&Item> = self.items.iter().filter(|it| it.route == Route::Host).collect();
        if host_items.is_empty() {
            return Ok(0);
        }
        // Only a codec's check routes units to host threads.
        let codec = job
            .chain
            .compression
            .as_deref()
            .ok_or_else(|| GpuError::Unsupported("host decoding without a codec".into()))?;
        let (stored_bytes, host_ring) = memory.host_share(self.slot);
        // SAFETY: dbase is the slot's decoded region, which holds every item's decoded bytes and
        // is reused only after this batch's event, which follows the copies queued here.
        unsafe { decode_on_host(job, codec, &host_items, stored_bytes, host_ring, layout.dbase) }?;
        let copied = job.copy_stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
        job.stream.wait(&copied).map_err(GpuError::cuda("ordering host-decoded chunks before placement"))?;
        Ok(host_items.len())
    }
}

/// Decode `items` (host-routed) from `stored` on the reader's threads through `ring`, each copied
/// on the copy stream to `dbase` plus its decoded offset. The host's rate is learned from the
/// threads' time.
///
/// # Safety
/// `dbase` plus each item's decoded offset must be device memory holding its decoded length, not
/// used by other work until the copy stream's work queued here has finished.
unsafe fn decode_on_host(
    job: &Job<'_>,
    codec: &dyn DeviceCodec,
    items: &[&Item],
    stored: &[u8],
    ring: &mut HostRing,
    dbase: u64,
) -> Result<(), GpuError> {
    let (context, units, copy_stream) = (job.context, job.units, job.copy_stream);
    let lens: Vec<u64> = items.iter().map(|it| units[it.unit].decoded_len().next_multiple_of(DECODED_ALIGN)).collect();
    let need = lens.iter().fold(0u64, |a, &l| a.saturating_add(l));
    let largest = lens.iter().copied().max().unwrap_or(0);
    let half = ring.ensure(context, ring_len(need, largest))?.len() as u64 / 2;
    let (waves, at) = waves(&lens, half);
    // Thread time spent decoding, which teaches the scheduler this host's rate.
    let busy_ns = AtomicU64::new(0);
    for wave in waves {
        let side = ring.next;
        ring.next ^= 1;
        if let Some(event) = ring.copied[side].take() {
            event.synchronize().map_err(GpuError::cuda("waiting for host-decoded copies"))?;
        }
        let base = ring.buffer.as_mut().expect("ensured").as_mut_slice().as_mut_ptr() as usize + side * half as usize;
        context.reader().install(|| {
            items[wave.clone()].par_iter().zip(&at[wave.clone()]).try_for_each(|(it, &offset)| {
                let unit = &units[it.unit];
                let len = unit.decoded_len() as usize;
                // SAFETY: a wave's regions are disjoint and lie within its half (`waves` packs
                // them within `half`); no copy out of that half is still queued (its event).
                let out = unsafe { std::slice::from_raw_parts_mut((base + offset as usize) as *mut u8, len) };
                let data = &stored[it.host_offset as usize..][..it.data_len as usize];
                let name = codec.name();
                let start = Instant::now();
                let written = codec.decode_host(data, out).map_err(|e| unit.error(format!("{name}: {e}")))?;
                busy_ns.fetch_add(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
                if written != len {
                    return Err(unit.error(format!("{name} decoded {written} bytes, {len} expected")));
                }
                context.bind()?;
                // SAFETY: pinned source within the half, written again only after this wave's
                // event; destination as the caller promises.
                unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        dbase + it.decoded_offset,
                        (base + offset as usize) as *const c_void,
                        len,
                        copy_stream.cu_stream(),
                    )
                }
                .result()
                .map_err(GpuError::cuda("copying host-decoded chunks"))
            })
        })?;
        ring.copied[side] = Some(copy_stream.record_event(None).map_err(GpuError::cuda("recording an event"))?);
    }
    let bytes = items.iter().map(|it| units[it.unit].decoded_len()).sum();
    if let Some(learned) = &job.learned {
        learned.host.observe(bytes, busy_ns.into_inner() as f64 * 1e-9);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_takes_few_sizes_and_holds_any_chunk() {
        let mib = 1u64 << 20;
        // Small shares share the least size; a share fits one half up to the bound.
        assert_eq!(ring_len(0, 0), HOST_RING_MIN);
        assert_eq!(ring_len(3 * mib, mib), HOST_RING_MIN);
        assert_eq!(ring_len(5 * mib, mib), 16 * mib);
        assert_eq!(ring_len(100 * mib, mib), HOST_RING_MAX);
        assert_eq!(ring_len(4096 * mib, mib), HOST_RING_MAX);
        // A chunk larger than a half widens the ring to hold two.
        assert_eq!(ring_len(4096 * mib, 200 * mib), 512 * mib);
        assert_eq!(ring_len(u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn waves_pack_items_in_order_within_a_half() {
        let (w, at) = waves(&[4, 4, 4, 8, 2, 2], 8);
        assert_eq!(w, vec![0..2, 2..3, 3..4, 4..6]);
        assert_eq!(at, vec![0, 4, 0, 0, 0, 2]);
        // One wave where the half holds the share; none for no items.
        assert_eq!(waves(&[1, 2, 3], 8).0, vec![0..3]);
        assert_eq!(waves(&[], 8), (vec![], vec![]));
        // An item larger than the half (which `ring_len` prevents) still gets a wave of its own.
        assert_eq!(waves(&[9, 1], 8).0, vec![0..1, 1..2]);
    }
}
