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
    pub(super) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
        // SAFETY: a plain allocation owned by the returned value.
        let ptr =
            unsafe { result::malloc_sync(len.max(1)) }.map_err(GpuError::cuda("allocating device staging memory"))?;
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

/// Buffers kept across reads: allocation is slow (pinned memory most of all), so each is reused.
pub(super) struct BufferPool<B> {
    buffers: Mutex<Vec<B>>,
    /// How many to keep.
    keep: usize,
}

impl<B: PooledBuffer> BufferPool<B> {
    pub(super) fn new(keep: usize) -> Self {
        Self { buffers: Mutex::new(Vec::new()), keep }
    }

    /// The smallest kept buffer of at least `len` bytes.
    pub(super) fn take(&self, len: usize) -> Option<B> {
        let mut buffers = self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = buffers.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity())?.0;
        Some(buffers.swap_remove(i))
    }

    /// Keep `buffer`, dropping the smallest when more than `keep` are kept.
    pub(super) fn give(&self, buffer: B) {
        let mut buffers = self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        buffers.push(buffer);
        buffers.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
        buffers.truncate(self.keep);
    }

    /// Keep the largest buffers that fit in `limit` bytes together, drop the rest (freed here);
    /// returns the bytes kept.
    pub(super) fn trim(&self, limit: u64) -> u64 {
        let dropped: Vec<B> = {
            let mut buffers = self.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // Largest first (take() leaves them out of order).
            buffers.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(usize);

    impl PooledBuffer for Fake {
        fn capacity(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn trimmed_pools_keep_the_largest_buffers_that_fit_the_bound() {
        let pool = BufferPool::new(8);
        for size in [4usize, 1, 3, 2, 8] {
            pool.give(Fake(size << 20));
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
            pool.give(Fake(size << 20));
        }
        // take() swaps the last into the hole: the order is no longer largest first.
        assert_eq!(pool.take(5 << 20).map(|b| b.0), Some(5 << 20));
        assert_eq!(pool.trim(10 << 20), 10 << 20);
        let mut left: Vec<usize> = pool.buffers.lock().unwrap().iter().map(|b| b.0 >> 20).collect();
        left.sort_unstable();
        assert_eq!(left, [4, 6]);
    }

    #[test]
    fn the_default_bound_is_two_percent_of_the_device_and_at_least_one_gib() {
        assert_eq!(default_pool_keep(8 << 30), 1 << 30);
        assert_eq!(default_pool_keep(0), 1 << 30);
        assert_eq!(default_pool_keep(150 << 30), 3 << 30);
    }
}
