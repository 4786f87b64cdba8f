//! Device memory that lives across reads: staging buffers ([`DeviceBuffer`]) and pinned host
//! buffers kept in bounded pools, and the output pool results come from; how much idle memory
//! they keep by default ([`default_pool_keep`]).

use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, CudaContext, DriverError};

use crate::error::GpuError;
use crate::reader::PinnedBuffer;

/// Device memory from `cuMemAlloc`, freed on drop; kept in pools across reads. (Allocated from
/// the output pool instead, stream-ordered, reads ran 2 to 9% slower in the same run: run AE.)
pub(crate) struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    /// A new buffer of `len` bytes; the driver's error as it is, so that the caller can tell
    /// an exhausted device (worth a retry once idle memory is released) from the rest.
    pub(super) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        // SAFETY: a plain allocation owned by the returned value.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }?;
        Ok(Self { ptr, len, ctx: ctx.clone() })
    }

    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemAlloc in new(); every use was synchronized before the buffer
        // went back to its pool or was dropped.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// The idle memory a device of `total` bytes keeps between reads by default: the larger of 1 GiB
/// and 2% of it. Enough for the next read's staging and a result of ordinary size, little
/// beside PyTorch or CuPy in the same process.
#[must_use]
pub fn default_pool_keep(total: u64) -> u64 {
    (total / 50).max(1 << 30)
}

/// The idle pinned host memory kept between reads by default, beside a device bound of
/// `device_keep`, on a host of `host_total` bytes: the larger of that bound and a sixteenth of
/// the host's memory, the latter at most 8 GiB (a host of many GPUs runs a process for each).
/// A whole read of small zstd chunks stages two batches of up to 4 GiB decoded, each slot's
/// stored bytes pinned (1.19 GB for Z2): under the device's bound of 2% of an 80 GB H100 only one
/// slot's buffer stayed (1,134 MiB held), so every such read pinned the other again, about 0.56 s
/// on the GPU host, where its 8 GiB reads took 0.9 s against 0.35 expected.
#[must_use]
pub fn default_pinned_keep(device_keep: u64, host_total: u64) -> u64 {
    device_keep.max((host_total / 16).min(PINNED_KEEP_MAX))
}

/// The most of the host's memory [`default_pinned_keep`] takes beyond the device bound.
const PINNED_KEEP_MAX: u64 = 8 << 30;

/// The memory this process may use, in bytes: the host's physical memory, or its cgroup's limit
/// where that is smaller (a container on a large host); 0 where the system says neither.
pub(crate) fn host_memory() -> u64 {
    // SAFETY: sysconf reads system constants; no memory is touched.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let physical = u64::try_from(pages).unwrap_or(0).saturating_mul(u64::try_from(page).unwrap_or(0));
    // cgroup v2, then v1 ("max", or v1's huge number, where none is set).
    let limit = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| cgroup_limit(&text));
    match limit {
        Some(limit) if physical == 0 || limit < physical => limit,
        _ => physical,
    }
}

/// A cgroup memory file's limit: a byte count, not "max" nor 0.
fn cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&n| n > 0)
}

/// A CUDA memory pool of our own for results: freed results stay reserved (up to a threshold:
/// the part of the idle bound the staging pool leaves) so that the next read does not map its
/// memory again (8 GiB took 12 ms), without changing the device's default pool, which other
/// libraries in the process share.
pub(super) struct OutputPool {
    pub(super) pool: sys::CUmemoryPool,
    /// The release threshold last set (held while it is set, so that the value here is the
    /// driver's), and what the output pool may keep idle now.
    threshold: Mutex<u64>,
}

// SAFETY: a pool handle may be used from any thread.
unsafe impl Send for OutputPool {}
// SAFETY: as above.
unsafe impl Sync for OutputPool {}

impl OutputPool {
    pub(super) fn new(ctx: &Arc<CudaContext>, ordinal: usize, keep: u64) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        };
        let mut pool = std::ptr::null_mut();
        // SAFETY: props describes device memory of this device; pool receives the handle.
        unsafe { sys::cuMemPoolCreate(&raw mut pool, &raw const props) }
            .result()
            .map_err(GpuError::cuda("creating the output memory pool"))?;
        let pool = Self { pool, threshold: Mutex::new(u64::MAX) };
        pool.keep(keep).map_err(GpuError::cuda("configuring the output memory pool"))?;
        Ok(pool)
    }

    /// Keep at most `bytes` idle from now on: the release threshold (memory above it goes back
    /// to the driver at the next synchronization), and a trim of what is idle now. No driver
    /// call when neither changes anything.
    pub(super) fn keep(&self, bytes: u64) -> Result<(), DriverError> {
        let mut set = self.threshold.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *set != bytes {
            let mut threshold = bytes;
            // SAFETY: the release threshold attribute takes a u64.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    self.pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&raw mut threshold).cast(),
                )
            }
            .result()?;
            *set = bytes;
        }
        if self.idle_bytes() > bytes {
            // SAFETY: trimming releases only memory no allocation uses.
            unsafe { sys::cuMemPoolTrimTo(self.pool, bytes as usize) }.result()?;
        }
        Ok(())
    }

    /// Give back to the driver everything the pool holds idle (its threshold is unchanged).
    pub(super) fn release_idle(&self) -> Result<(), DriverError> {
        // SAFETY: trimming releases only memory no allocation uses.
        unsafe { sys::cuMemPoolTrimTo(self.pool, 0) }.result()
    }

    /// What the pool may keep idle now (its release threshold).
    pub(super) fn threshold(&self) -> u64 {
        *self.threshold.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes the pool holds reserved but unused (free for our next allocation).
    pub(super) fn idle_bytes(&self) -> u64 {
        let attr = |a: sys::CUmemPool_attribute| {
            let mut v: u64 = 0;
            // SAFETY: these attributes are u64 values.
            let ok = unsafe { sys::cuMemPoolGetAttribute(self.pool, a, (&raw mut v).cast()) };
            if ok == sys::CUresult::CUDA_SUCCESS {
                v
            } else {
                0
            }
        };
        let reserved = attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        reserved.saturating_sub(attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT))
    }
}

/// A buffer that a [`BufferPool`] can hand out again.
pub(super) trait PooledBuffer {
    fn capacity(&self) -> usize;
}

impl PooledBuffer for DeviceBuffer {
    fn capacity(&self) -> usize {
        self.len
    }
}

impl PooledBuffer for PinnedBuffer {
    fn capacity(&self) -> usize {
        self.len()
    }
}

/// The most pinned memory a read's ring for host-decoded chunks takes (two halves), unless one
/// chunk needs more (`pipeline/decode/host.rs`).
pub(crate) const HOST_RING_MAX: u64 = 256 << 20;

/// The least length [`pinned_class`] leaves as it is.
pub(crate) const PINNED_EXACT_FROM: usize = 1 << 30;

/// The length a new pinned buffer for `len` bytes is given: an eighth more, rounded up to a
/// sixteenth of its power of two (at most 27% more in all, for all but a few KiB). Requests that
/// differ a little from read to read (the stored bytes of a batch of random crops) are then
/// served by the buffer the first one made: allocated exactly, each new largest request mapped a
/// fresh buffer (a batch of 32 crops of Z2 took 311 ms instead of 65 when its 400 MB of stored
/// bytes outgrew the last one's on the GPU host).
///
/// From [`PINNED_EXACT_FROM`] up, exact: such buffers are the batches of large reads (a whole
/// array's), whose sizes repeat, and rounded they crowded the pool's byte bound, so that the next
/// smaller read's buffer was dropped after each read and mapped again (S1's 1 GiB slab after a
/// whole read took 220 ms instead of 45 on the GPU host).
pub(crate) fn pinned_class(len: usize) -> usize {
    if len >= PINNED_EXACT_FROM {
        return len;
    }
    let want = len.saturating_add(len / 8);
    let step = (want.checked_next_power_of_two().unwrap_or(usize::MAX) / 16).max(4096);
    want.div_ceil(step).saturating_mul(step)
}

/// Buffers kept across reads: allocation is slow (pinned memory most of all) and freeing waits
/// for the device, so each is reused.
///
/// How many are kept grows with the reads in flight ([`BufferPool::give`]): reads running
/// together each hold a few, and a pool sized for one read made them allocate and free pinned
/// memory on every round (four random tiles read at once took 3.4 times as long as in turn on
/// the GPU host). What is kept is bounded in bytes too, at all times (a Dask worker keeps a read
/// in flight, so the pools never saw an idle moment to be trimmed in), and more tightly by `trim`
/// once no read is in flight.
pub(super) struct BufferPool<B> {
    buffers: Mutex<Vec<B>>,
    /// How many to keep with no read in flight.
    keep: usize,
}

/// Buffers kept for each read in flight, beyond `keep`: a read holds up to three at once (a
/// batch's host buffer, its host-decode buffer, its results).
const KEPT_PER_READ: usize = 4;

/// Whether a kept buffer of `capacity` bytes may serve a request of `len`: not one many times
/// larger, which a small request (a batch's 1 KiB of results) would otherwise take from a large
/// request that comes next, making it allocate.
fn serves(capacity: usize, len: usize) -> bool {
    capacity >= len && capacity <= len.saturating_mul(4).max(len.saturating_add(16 << 20))
}

impl<B: PooledBuffer> BufferPool<B> {
    pub(super) fn new(keep: usize) -> Self {
        Self { buffers: Mutex::new(Vec::new()), keep }
    }

    /// The smallest kept buffer that [`serves`] `len` bytes.
    pub(super) fn take(&self, len: usize) -> Option<B> {
        let mut buffers = self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let i =
            buffers.iter().enumerate().filter(|(_, b)| serves(b.capacity(), len)).min_by_key(|(_, b)| b.capacity())?.0;
        Some(buffers.swap_remove(i))
    }

    /// Keep `buffer`, with room for `reads` reads running together: at most `keep` plus
    /// [`KEPT_PER_READ`] per read are kept, the smallest dropped beyond that, and at most `limit`
    /// bytes (the largest buffers that fit). What is dropped is freed after the lock is released
    /// (a free waits for the device; other reads' takes and gives must not).
    pub(super) fn give(&self, buffer: B, reads: usize, limit: u64) {
        let room = self.keep.saturating_add(KEPT_PER_READ.saturating_mul(reads));
        let dropped = {
            let mut buffers = self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            buffers.push(buffer);
            let bytes = buffers.iter().fold(0u64, |a, b| a.saturating_add(b.capacity() as u64));
            if buffers.len() <= room && bytes <= limit {
                return;
            }
            buffers.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
            let count = room.min(buffers.len());
            let mut dropped = buffers.split_off(count);
            dropped.extend(keep_largest_within(&mut buffers, limit));
            dropped
        };
        drop(dropped);
    }

    /// Keep the largest buffers that fit in `limit` bytes together, drop the rest (freed here);
    /// returns the bytes kept.
    pub(super) fn trim(&self, limit: u64) -> u64 {
        let dropped: Vec<B> = {
            let mut buffers = self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Largest first (take() leaves them out of order).
            buffers.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
            keep_largest_within(&mut buffers, limit)
        };
        // Freed outside the lock: cuMemFree waits for the device.
        drop(dropped);
        self.bytes()
    }

    /// Bytes held by kept buffers.
    pub(super) fn bytes(&self) -> u64 {
        self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().map(|b| b.capacity() as u64).sum()
    }
}

/// Of `buffers` (largest first), keep the largest that fit in `limit` bytes together; returns
/// the others.
fn keep_largest_within<B: PooledBuffer>(buffers: &mut Vec<B>, limit: u64) -> Vec<B> {
    let mut kept = 0u64;
    let mut dropped = Vec::new();
    let mut i = 0;
    while i < buffers.len() {
        let size = buffers[i].capacity() as u64;
        if kept.saturating_add(size) <= limit {
            kept += size;
            i += 1;
        } else {
            dropped.push(buffers.remove(i));
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(usize);

    impl PooledBuffer for Fake {
        fn capacity(&self) -> usize {
            self.0
        }
    }

    /// Requests within an eighth above the first are served by the buffer it made, whose
    /// length stays within 27% above the request (or a page or two); a pinned buffer serves what
    /// it was made for.
    #[test]
    fn pinned_buffers_are_made_with_room_for_requests_a_little_larger() {
        for len in [1usize, 1000, 4096, 1 << 20, 50 << 20, 415_000_000, PINNED_EXACT_FROM / 8 * 7] {
            let made = pinned_class(len);
            assert!(made >= len + len / 8 && made <= (len + len / 100 * 27).max(len + 8192), "{len}: {made}");
            assert!(serves(made, len), "{len}: {made}");
            let pool = BufferPool::new(8);
            pool.give(Fake(made), 0, u64::MAX);
            assert_eq!(pool.take(len + len / 8).map(|b| b.0), Some(made), "{len}");
        }
        // Large buffers (a whole array's batches) are made as asked.
        assert_eq!(pinned_class(PINNED_EXACT_FROM), PINNED_EXACT_FROM);
        assert_eq!(pinned_class((3 << 30) + 17), (3 << 30) + 17);
        assert_eq!(pinned_class(usize::MAX), usize::MAX);
    }

    #[test]
    fn small_requests_leave_large_buffers_for_large_ones() {
        let pool = BufferPool::new(8);
        pool.give(Fake(50 << 20), 0, u64::MAX);
        assert!(pool.take(1024).is_none(), "a 1 KiB request took a 50 MiB buffer");
        pool.give(Fake(4 << 20), 0, u64::MAX);
        assert_eq!(pool.take(1024).map(|b| b.0), Some(4 << 20)); // within 16 MiB of it
        assert_eq!(pool.take(20 << 20).map(|b| b.0), Some(50 << 20)); // within 4 times
        pool.give(Fake(1 << 30), 0, u64::MAX);
        assert!(pool.take(100 << 20).is_none());
        assert_eq!(pool.take(300 << 20).map(|b| b.0), Some(1 << 30));
    }

    /// Reads in flight together, each taking what a tile read takes (a host buffer, a
    /// host-decode buffer, 1 KiB of results, sizes varying a little), returning them at the end:
    /// after the first round every take is served from the pool and nothing is dropped.
    #[test]
    fn concurrent_reads_reuse_their_buffers_round_after_round() {
        for readers in [1usize, 4, 16] {
            let pool = BufferPool::new(6);
            let mut per_round = Vec::new();
            for round in 0..10usize {
                let mut held = Vec::new();
                let mut missed = 0;
                for r in 0..readers {
                    let jitter = ((round * 7 + r * 3) % 5) << 20;
                    for len in [1024, (33 << 20) + jitter, (45 << 20) + jitter] {
                        held.push(pool.take(len).unwrap_or_else(|| {
                            missed += 1;
                            Fake(len + len / 4) // ensure() grows a miss by a quarter
                        }));
                    }
                }
                // Returned one by one, with room for the reads that ran together.
                for b in held {
                    pool.give(b, readers, u64::MAX);
                }
                per_round.push(missed);
            }
            assert!(per_round[1..].iter().all(|&m| m == 0), "{readers} readers: misses per round {per_round:?}");
            assert!(pool.buffers.lock().unwrap().len() <= 6 + 4 * readers);
        }
    }

    /// A buffer dropped by give() is freed after the pool's lock is released.
    #[test]
    fn buffers_are_freed_outside_the_lock() {
        use std::sync::OnceLock;
        static POOL: OnceLock<BufferPool<Probe>> = OnceLock::new();
        struct Probe(usize);
        impl PooledBuffer for Probe {
            fn capacity(&self) -> usize {
                self.0
            }
        }
        impl Drop for Probe {
            fn drop(&mut self) {
                if let Some(pool) = POOL.get() {
                    assert!(pool.buffers.try_lock().is_ok(), "freed under the pool's lock");
                }
            }
        }
        let pool = POOL.get_or_init(|| BufferPool::new(1));
        pool.give(Probe(2), 0, u64::MAX);
        pool.give(Probe(1), 0, u64::MAX); // the smaller one is dropped
        assert_eq!(pool.bytes(), 2);
        pool.give(Probe(3), 0, u64::MAX);
        assert_eq!(pool.bytes(), 3);
    }

    #[test]
    fn trimmed_pools_keep_the_largest_buffers_that_fit_the_bound() {
        let pool = BufferPool::new(8);
        for size in [4usize, 1, 3, 2, 8] {
            pool.give(Fake(size << 20), 0, u64::MAX);
        }
        assert_eq!(pool.bytes(), 18 << 20);
        // 8 + 4 fit in 13 MiB, 3 would not, 1 does.
        assert_eq!(pool.trim(13 << 20), 13 << 20);
        let mut left: Vec<usize> = pool.buffers.lock().unwrap().iter().map(|b| b.0 >> 20).collect();
        left.sort_unstable();
        assert_eq!(left, [1, 4, 8]);
        assert_eq!(pool.trim(0), 0);
        assert!(pool.take(1).is_none());
    }

    #[test]
    fn trims_after_takes_still_keep_the_largest() {
        let pool = BufferPool::new(8);
        for size in [1usize, 2, 3, 4, 5, 6] {
            pool.give(Fake(size << 20), 0, u64::MAX);
        }
        // take() swaps the last into the hole: the order is no longer largest first.
        assert_eq!(pool.take(5 << 20).map(|b| b.0), Some(5 << 20));
        assert_eq!(pool.trim(10 << 20), 10 << 20);
        let mut left: Vec<usize> = pool.buffers.lock().unwrap().iter().map(|b| b.0 >> 20).collect();
        left.sort_unstable();
        assert_eq!(left, [4, 6]);
    }

    /// With reads in flight (room for many buffers by count), the bytes kept stay within the
    /// bound: the largest buffers that fit are kept, a buffer larger than the bound is freed.
    #[test]
    fn pools_with_reads_in_flight_stay_within_their_bytes() {
        let pool = BufferPool::new(8);
        for size in [300usize, 200, 500, 100, 400] {
            pool.give(Fake(size << 20), 16, 1 << 30);
            assert!(pool.bytes() <= 1 << 30, "{} MiB kept", pool.bytes() >> 20);
        }
        let mut left: Vec<usize> = pool.buffers.lock().unwrap().iter().map(|b| b.0 >> 20).collect();
        left.sort_unstable();
        assert_eq!(left, [400, 500]); // 500 + 400 fit, then neither 300 nor 200 does
        pool.give(Fake(2 << 30), 16, 1 << 30);
        assert!(pool.take(2 << 30).is_none(), "a buffer past the bound was kept");
        assert_eq!(pool.bytes(), 900 << 20);
    }

    #[test]
    fn the_default_bound_is_two_percent_of_the_device_and_at_least_one_gib() {
        assert_eq!(default_pool_keep(8 << 30), 1 << 30);
        assert_eq!(default_pool_keep(0), 1 << 30);
        assert_eq!(default_pool_keep(150 << 30), 3 << 30);
    }

    #[test]
    fn pinned_memory_is_kept_up_to_a_sixteenth_of_the_host_and_never_below_the_device_bound() {
        // A host of 2 TiB keeps no more than one of 128 GiB.
        assert_eq!(default_pinned_keep(1 << 30, 2 << 40), 8 << 30);
        assert_eq!(default_pinned_keep(16 << 30, 2 << 40), 16 << 30);
        assert_eq!(default_pinned_keep(1 << 30, 32 << 30), 2 << 30);
        // The GPU host (128 GiB) beside an 80 GB device: both slots of a whole Z2 read fit.
        let device = default_pool_keep(80 << 30);
        assert_eq!(default_pinned_keep(device, 128 << 30), 8 << 30);
        assert!(2 * 1_190_000_000 <= default_pinned_keep(device, 128 << 30));
        assert_eq!(default_pinned_keep(device, 8 << 30), device);
        assert_eq!(default_pinned_keep(device, 0), device);
        assert!(host_memory() > 0, "sysconf gave no physical memory");
        assert_eq!(cgroup_limit("17179869184\n"), Some(16 << 30));
        assert_eq!((cgroup_limit("max\n"), cgroup_limit("0"), cgroup_limit("")), (None, None, None));
    }
}
