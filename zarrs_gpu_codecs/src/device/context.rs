//! Per-device state shared by every retrieval ([`GpuContext`]): the CUDA context, the read
//! engine, the pools of device staging and pinned host memory that live across reads
//! (`pool.rs`), the kernels, and whether the context is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use std::time::Instant;

use crate::reader::{DeviceReadError, DeviceReader, DeviceTransfer, PieceSource, PinnedBuffer};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError};

use crate::config::GpuConfig;
use crate::device::current_context::CurrentContextGuard;
use crate::device::kernels::Kernels;
use crate::device::pool::{
    default_pinned_keep, default_pool_keep, host_memory, pinned_class, BufferPool, DeviceBuffer, OutputPool,
    HOST_RING_MAX,
};
use crate::device::upload::Uploads;
use crate::env;
use crate::error::GpuError;
use crate::schedule::{DecodeRates, Learned};

/// Pinned bytes the rings' pool keeps (two of the largest a read takes, twice).
const RINGS_KEPT: u64 = 4 * HOST_RING_MAX;

/// A codec's name and the key of its rates ([`DecodeRates::key`]).
type LearnedKey = (String, [u64; 5]);

/// What the pools keep idle between reads: device memory (freed results and staging together)
/// and pinned host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Keep {
    pub(crate) device: u64,
    pub(crate) pinned: u64,
}

impl Keep {
    /// The same bound for both (a config's or the environment's one setting).
    pub(crate) fn both(bytes: u64) -> Self {
        Self { device: bytes, pinned: bytes }
    }
}

/// The state of one device.
pub(crate) struct GpuContext {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    pool: OutputPool,
    reader: Arc<DeviceReader>,
    /// Enough for two batches in flight for each of a few concurrent reads.
    staging: BufferPool<DeviceBuffer>,
    pinned: BufferPool<PinnedBuffer>,
    /// The host share's pinned rings, apart from `pinned`: a whole array's large stored-byte
    /// buffers filled that pool's bound, the ring was dropped after each read and mapped again by
    /// the next (S1's 1 GiB slab took 220 ms instead of 45 on the GPU host).
    rings: BufferPool<PinnedBuffer>,
    /// Idle memory kept between reads where a read's config sets none: device memory and pinned
    /// host memory both `ZARRS_GPU_POOL_KEEP_BYTES` where set, else [`default_pool_keep`] and
    /// [`default_pinned_keep`].
    keep: Keep,
    /// Reads in flight on the device ([`ReadInFlight`]), counted from before this state existed.
    in_flight: Arc<InFlight>,
    /// The largest idle bound of the reads since the pools were last trimmed idle (a read's
    /// `GpuConfig::with_pool_keep_bytes` may be larger than the device's): what the pools keep
    /// at most while reads are in flight.
    peak_keep: std::sync::atomic::AtomicU64,
    /// The same for pinned host memory.
    peak_pinned_keep: std::sync::atomic::AtomicU64,
    /// Kernels loaded into this context (a module of another device's context cannot launch here).
    kernels: OnceLock<Result<Kernels, String>>,
    /// Why the context can no longer be used (a sticky fault, or a batch that never finished).
    lost: OnceLock<String>,
    /// What this device's reads have shown the scheduler of each codec (one host thread's decode
    /// rate, nvCOMP's slowness), by codec name and rates.
    learned: Mutex<HashMap<LearnedKey, Arc<Learned>>>,
    /// The pinned buffers through which codecs copy their tables.
    uploads: Uploads,
}

impl GpuContext {
    /// The process's device states, by ordinal.
    fn registry() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<GpuContext>>> {
        static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<GpuContext>>>> = OnceLock::new();
        CONTEXTS.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The state of device `ordinal` if a read has made it (no CUDA call otherwise).
    pub(crate) fn existing(ordinal: usize) -> Option<Arc<Self>> {
        Self::registry().get(&ordinal).cloned()
    }

    /// The shared state of device `ordinal`, made on first use.
    pub(crate) fn get(ordinal: usize) -> Result<Arc<Self>, GpuError> {
        let mut contexts = Self::registry();
        if let Some(context) = contexts.get(&ordinal) {
            return Ok(context.clone());
        }
        let reader = DeviceReader::shared(ordinal)?;
        let total = reader.context().total_mem().unwrap_or(0) as u64;
        let keep = env::pool_keep()?.map_or_else(
            || {
                let device = default_pool_keep(total);
                Keep { device, pinned: default_pinned_keep(device, host_memory()) }
            },
            Keep::both,
        );
        let context = Arc::new(Self {
            ctx: reader.context().clone(),
            ordinal,
            pool: OutputPool::new(reader.context(), ordinal, keep.device)?,
            reader,
            staging: BufferPool::new(8),
            pinned: BufferPool::new(6),
            rings: BufferPool::new(2),
            keep,
            in_flight: InFlight::of(ordinal),
            peak_keep: std::sync::atomic::AtomicU64::new(0),
            peak_pinned_keep: std::sync::atomic::AtomicU64::new(0),
            kernels: OnceLock::new(),
            lost: OnceLock::new(),
            learned: Mutex::default(),
            uploads: Uploads::default(),
        });
        contexts.insert(ordinal, context.clone());
        Ok(context)
    }

    /// The device's kernels, loaded on first use from `sources` (every call passes the same:
    /// see [`Kernels::load`]); None without NVRTC.
    /// The pinned buffers through which codecs copy their tables (see `device/upload.rs`).
    pub(crate) fn uploads(&self) -> &Uploads {
        &self.uploads
    }

    pub(crate) fn kernels(&self, sources: &[&[&str]]) -> Option<&Kernels> {
        self.kernels.get_or_init(|| Kernels::load(&self.ctx, sources)).as_ref().ok()
    }

    /// Fail fast once the context is lost: after a sticky fault every CUDA call of the process on
    /// this device fails, and after a batch that never finished its buffers may still be written.
    pub(crate) fn check_alive(&self) -> Result<(), GpuError> {
        match self.lost.get() {
            Some(reason) => Err(GpuError::ContextLost { device: self.ordinal, reason: reason.clone() }),
            None => Ok(()),
        }
    }

    /// Mark the context lost for every later call.
    pub(crate) fn mark_lost(&self, reason: String) {
        let _ = self.lost.set(reason);
    }

    /// After a failed retrieval: when the failure left the context unusable (a sticky error, seen
    /// in the error itself or by probing the context, since nvCOMP reports CUDA failures without
    /// their code), remember it and say so; other errors pass through.
    pub(crate) fn contain(&self, err: GpuError) -> GpuError {
        if let GpuError::ContextLost { .. } = err {
            return err;
        }
        let sticky = match &err {
            GpuError::Cuda { source, .. } | GpuError::Read(DeviceReadError::Cuda { source, .. }) => is_sticky(*source),
            _ => false,
        };
        let probe = || -> Result<(), DriverError> {
            self.ctx.bind_to_thread()?;
            let stream = self.ctx.new_stream()?;
            stream.synchronize()
        };
        let fault = if sticky { None } else { probe().err().filter(|e| is_sticky(*e)) };
        if sticky || fault.is_some() {
            let cause = match fault {
                Some(fault) => format!("{err}; the context reports {fault}"),
                None => err.to_string(),
            };
            self.mark_lost(cause);
            return self.check_alive().expect_err("just marked lost");
        }
        err
    }

    /// Wait for `event` until `deadline`: Ok(false) when the deadline passed first. A blocking
    /// wait cannot time out and polling adds its sleep to every read, so a helper thread makes
    /// the blocking wait and this one waits for it with a timeout; after a timeout the helper
    /// stays blocked on a batch that never ends (the context is lost then anyway).
    pub(crate) fn wait_until(event: CudaEvent, deadline: Instant) -> Result<bool, DriverError> {
        if event.try_is_complete()? {
            return Ok(true);
        }
        let (done, waited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(event.synchronize());
        });
        match waited.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(result) => result.map(|()| true),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(false),
            // The helper ended without a word: it cannot have, short of a panic in the driver call.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(DriverError(sys::cudaError_enum::CUDA_ERROR_UNKNOWN))
            }
        }
    }

    /// Make the device's context current on this thread.
    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))
    }

    /// What this device's reads have shown of the codec `name` (whose rates are `rates`): one
    /// host thread's decode rate, and how much slower than its rates nvCOMP has decoded.
    pub(crate) fn learned(&self, name: &str, rates: &DecodeRates) -> Arc<Learned> {
        let mut learned = self.learned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(learned.entry((name.to_owned(), rates.key())).or_insert_with(|| Arc::new(Learned::new(rates))))
    }

    pub(crate) fn reader(&self) -> &DeviceReader {
        &self.reader
    }

    /// A stream of its own for one retrieval.
    pub(crate) fn new_stream(&self) -> Result<Arc<CudaStream>, GpuError> {
        self.ctx.new_stream().map_err(GpuError::cuda("creating a stream"))
    }

    /// Device memory free for our reads: the driver's free memory plus what our pools hold idle.
    pub(crate) fn free_bytes(&self) -> Result<u64, GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
        let (free, _total) = result::mem_get_info().map_err(GpuError::cuda("querying free device memory"))?;
        Ok(free as u64 + self.pool.idle_bytes() + self.staging.bytes())
    }

    /// Fail early, with the sizes, when `bytes` more device memory would not fit.
    pub(crate) fn check_free(&self, bytes: u64) -> Result<(), GpuError> {
        let free = self.free_bytes()?;
        if bytes > free {
            return Err(GpuError::OutOfMemory { needed: bytes, free, device: self.ordinal });
        }
        Ok(())
    }

    /// Uninitialised device memory of `len` bytes for a result, from the output pool, ordered
    /// on `stream` (freed, like any cudarc slice, on the same stream when dropped).
    pub(crate) fn alloc(&self, stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<u8>, GpuError> {
        self.ctx.bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
        let mut ptr = 0;
        // SAFETY: allocation from our pool on the caller's stream; the slice below owns it.
        let mut alloc = || {
            unsafe { sys::cuMemAllocFromPoolAsync(&raw mut ptr, len.max(1), self.pool.pool, stream.cu_stream()) }
                .result()
        };
        // The output pool reuses its own idle memory; idle staging buffers are released for it.
        self.retry_out_of_memory(&mut alloc).map_err(GpuError::cuda("allocating device memory"))?;
        // SAFETY: ptr is a fresh allocation of len bytes on this stream; every byte is written
        // (data or fill value) before the result is handed out.
        Ok(unsafe { stream.upgrade_device_ptr::<u8>(ptr, len) })
    }

    /// A result buffer of `len` bytes and its address, ready for writes from any stream (the
    /// reader's streams write into it too, so the allocation is complete when this returns).
    pub(crate) fn alloc_output(&self, stream: &Arc<CudaStream>, len: usize) -> Result<(CudaSlice<u8>, u64), GpuError> {
        use cudarc::driver::DevicePtrMut;
        let mut out = self.alloc(stream, len)?;
        let ptr = out.device_ptr_mut(stream).0;
        stream.synchronize().map_err(GpuError::cuda("allocating the output"))?;
        Ok((out, ptr))
    }

    /// Copy host bytes (pageable memory, such as zarrs' decoded `Vec`) to new device memory:
    /// in pieces on the reader's threads, each copied into its thread's pinned buffer and on to
    /// the device asynchronously (one pageable copy runs at 6 to 9 GB/s). Returns when done.
    pub(crate) fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, GpuError> {
        /// The bytes themselves as the reader's source.
        struct HostBytes<'a>(&'a [u8]);
        impl PieceSource for HostBytes<'_> {
            fn read_host(&self, _: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
                buf.copy_from_slice(&self.0[offset as usize..][..buf.len()]);
                Ok(true)
            }
        }
        let stream = self.new_stream()?;
        self.check_free(bytes.len() as u64)?;
        let (device, ptr) = self.alloc_output(&stream, bytes.len())?;
        let transfers = [DeviceTransfer { dst: ptr, len: bytes.len() }];
        // SAFETY: the destination is the fresh allocation of bytes.len() bytes; with no stream
        // the copies are complete when this returns.
        unsafe { self.reader.transfer(&transfers, &HostBytes(bytes), None) }?;
        Ok(device)
    }

    /// A staging buffer of at least `len` bytes from the pool (or a new one).
    pub(crate) fn take_staging(&self, len: usize) -> Result<DeviceBuffer, GpuError> {
        if let Some(buffer) = self.staging.take(len) {
            return Ok(buffer);
        }
        self.check_free(len as u64)?;
        self.retry_out_of_memory(|| DeviceBuffer::new(&self.ctx, len))
            .map_err(GpuError::cuda("allocating device staging memory"))
    }

    /// `alloc`, and once more when the device is out of memory after what our pools hold idle
    /// (staging buffers none of our reads is using, freed results) has gone back to the driver:
    /// the free-memory check counts that memory as ours, and a caller beside PyTorch or CuPy may
    /// have left no other.
    fn retry_out_of_memory<T>(&self, mut alloc: impl FnMut() -> Result<T, DriverError>) -> Result<T, DriverError> {
        match alloc() {
            Err(err) if err.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                self.staging.trim(0);
                // Where the release or the binding fails, the device's answer stays the error.
                if self.pool.release_idle().is_err() || self.ctx.bind_to_thread().is_err() {
                    return Err(err);
                }
                alloc()
            }
            other => other,
        }
    }

    /// Return a staging buffer whose last use has completed (kept within the reads' idle bound).
    pub(crate) fn give_staging(&self, buffer: DeviceBuffer) {
        self.staging.give(buffer, self.concurrency(), self.bound_in_flight().device);
    }

    /// A read with idle bound `keep` (its config's, else the device's) starts: until the pools are
    /// next trimmed idle, they keep up to the largest such bound.
    pub(crate) fn note_keep(&self, keep: Keep) {
        self.peak_keep.fetch_max(keep.device, std::sync::atomic::Ordering::SeqCst);
        self.peak_pinned_keep.fetch_max(keep.pinned, std::sync::atomic::Ordering::SeqCst);
    }

    /// What the staging and pinned pools keep at most while reads are in flight.
    fn bound_in_flight(&self) -> Keep {
        let peak = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::SeqCst);
        Keep {
            device: self.keep.device.max(peak(&self.peak_keep)),
            pinned: self.keep.pinned.max(peak(&self.peak_pinned_keep)),
        }
    }

    /// A pinned host buffer of at least `len` bytes from the pool (or a new one).
    pub(crate) fn take_pinned(&self, len: usize) -> Result<PinnedBuffer, GpuError> {
        match self.pinned.take(len) {
            Some(buffer) => Ok(buffer),
            None => Ok(PinnedBuffer::new(&self.ctx, pinned_class(len))?),
        }
    }

    /// A pinned ring for host-decoded chunks of at least `len` bytes, from the rings' pool.
    pub(crate) fn take_ring(&self, len: usize) -> Result<PinnedBuffer, GpuError> {
        match self.rings.take(len) {
            Some(buffer) => Ok(buffer),
            None => Ok(PinnedBuffer::new(&self.ctx, len)?),
        }
    }

    /// Return a ring whose copies have completed: kept, up to [`RINGS_KEPT`] bytes.
    pub(crate) fn give_ring(&self, buffer: PinnedBuffer) {
        self.rings.give(buffer, self.concurrency(), RINGS_KEPT);
    }

    /// Return a pinned buffer whose last use has completed.
    pub(crate) fn give_pinned(&self, buffer: PinnedBuffer) {
        self.pinned.give(buffer, self.concurrency(), self.bound_in_flight().pinned);
    }

    /// How many reads are in flight on this device (in this process).
    pub(crate) fn reads_in_flight(&self) -> usize {
        self.in_flight.reads.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The reads the buffer pools keep room for: the most in flight at once since the pools were
    /// last trimmed idle, or those in flight now.
    fn concurrency(&self) -> usize {
        self.in_flight.peak.load(std::sync::atomic::Ordering::SeqCst).max(self.reads_in_flight())
    }

    /// Trim to `keep` when no read is in flight (the last read to end trims).
    pub(crate) fn trim_when_idle(&self, keep: Keep) -> Result<(), GpuError> {
        if self.reads_in_flight() == 0 {
            // Idle: what is kept is bounded in bytes now, and room is made again as reads come.
            self.in_flight.peak.store(0, std::sync::atomic::Ordering::SeqCst);
            self.peak_keep.store(0, std::sync::atomic::Ordering::SeqCst);
            self.peak_pinned_keep.store(0, std::sync::atomic::Ordering::SeqCst);
            self.trim(keep)
        } else {
            Ok(())
        }
    }

    /// The idle bounds of a read with `config`: its own (for both kinds of memory), else the
    /// device's.
    pub(crate) fn keep_for(&self, config: &GpuConfig) -> Keep {
        config.pool_keep_bytes().map_or(self.keep, Keep::both)
    }

    /// Give back to the driver what the pools hold idle beyond `keep`: staging buffers first (the
    /// largest that fit stay), then freed results, so that both together keep at most
    /// `keep.device`; pinned host buffers within `keep.pinned` likewise. Buffers in use by other
    /// reads are not in the pools and are not touched.
    fn trim(&self, keep: Keep) -> Result<(), GpuError> {
        self.bind()?;
        let staging = self.staging.trim(keep.device);
        // Codecs' table buffers count against the pinned bound first (a few MiB at most).
        let uploads = self.uploads.trim(keep.pinned);
        self.pinned.trim(keep.pinned.saturating_sub(uploads));
        // Rings are few and bounded: kept but for `empty_cache`.
        self.rings.trim(if keep.pinned == 0 { 0 } else { RINGS_KEPT });
        self.pool.keep(keep.device.saturating_sub(staging)).map_err(GpuError::cuda("trimming the output memory pool"))
    }

    /// Whether the output pool holds more idle than its share of the bound (and the context is
    /// usable): [`after_free`](Self::after_free) has work to do. No device call waits.
    pub(crate) fn holds_freed_beyond_bound(&self) -> bool {
        self.lost.get().is_none() && self.pool.idle_bytes() > self.pool.threshold()
    }

    /// After a result of this device was freed on `stream`: when the output pool now holds more
    /// idle than its threshold, wait (boundedly) for the stream's work and give the excess back,
    /// so that memory freed by the caller is free for other libraries at once, not only at the
    /// next synchronization somewhere in the process.
    pub(crate) fn after_free(&self, stream: &CudaStream) {
        if !self.holds_freed_beyond_bound() {
            return;
        }
        // The output pool's share of the bound the last read ended with.
        let threshold = self.pool.threshold();
        let Ok(event) = stream.record_event(None) else { return };
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        if matches!(Self::wait_until(event, deadline), Ok(true)) {
            // SAFETY: releases only memory no allocation uses.
            let _ = unsafe { sys::cuMemPoolTrimTo(self.pool.pool, threshold as usize) };
        }
    }
}

/// Give back to the driver everything this library's pools hold idle on every device it has
/// used: freed results kept for the next read, staging buffers and pinned host buffers (what
/// PyTorch's `torch.cuda.empty_cache()` does for its allocator). Memory of arrays still alive
/// and of reads in flight is not touched; a device with a read in flight is left as it is (freeing
/// waits for all of the device's work). Reads after it allocate again.
///
/// # Errors
/// Returns an error when a device's context cannot be bound (a lost context is skipped).
pub fn empty_cache() -> Result<(), GpuError> {
    let _current = CurrentContextGuard::new();
    let contexts: Vec<Arc<GpuContext>> = GpuContext::registry().values().cloned().collect();
    for context in contexts.iter().filter(|c| c.check_alive().is_ok()) {
        context.trim_when_idle(Keep::both(0))?;
    }
    Ok(())
}

/// Reads in flight on one device, and the most at once since its pools were last trimmed idle
/// (what the buffer pools keep room for: reads that run together reuse each other's buffers
/// round after round). The pools are trimmed only when no read is in flight, since freeing device
/// memory waits for all of the device's work (another thread's read, or one that hangs). Kept
/// apart from [`GpuContext`], so that the first read of a process, which makes the context, counts
/// too: uncounted, two reads at start-up each planned with every reader thread, learned from
/// timings the other shared, and one could trim while the other read.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    reads: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

impl InFlight {
    /// The count of device `ordinal` (made on first use, without any CUDA call).
    fn of(ordinal: usize) -> Arc<Self> {
        static COUNTS: OnceLock<Mutex<HashMap<usize, Arc<InFlight>>>> = OnceLock::new();
        let mut counts = COUNTS.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.entry(ordinal).or_default().clone()
    }
}

/// A read counted in flight on a device until it drops.
pub(crate) struct ReadInFlight(Arc<InFlight>);

impl ReadInFlight {
    /// Count a read on device `ordinal` (no CUDA call: the device may not be set up yet).
    pub(crate) fn start(ordinal: usize) -> Self {
        let count = InFlight::of(ordinal);
        let now = count.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        count.peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for ReadInFlight {
    fn drop(&mut self) {
        self.0.reads.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The memory a device's retrievals hold: what a long-running process watches to see that reads
/// leave nothing behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryInUse {
    /// Device memory free, as the driver reports it.
    pub device_free: u64,
    /// The device's memory.
    pub device_total: u64,
    /// Freed results kept reserved by the output pool for the next read.
    pub output_pool_idle: u64,
    /// Device staging buffers kept for the next read.
    pub staging_pooled: u64,
    /// Pinned host buffers kept for the next read.
    pub pinned_pooled: u64,
    /// The bound on idle device memory (results and staging together) kept between reads where
    /// a read's config sets none.
    pub pool_keep: u64,
    /// The bound on idle pinned host memory kept between reads where a read's config sets none.
    pub pinned_keep: u64,
}

/// The memory retrievals on `device` hold now (the device is initialised if it was not).
///
/// # Errors
/// Returns an error when there is no usable device `device`, or its context is lost.
pub fn memory_in_use(device: usize) -> Result<MemoryInUse, GpuError> {
    let _current = CurrentContextGuard::new();
    let context = GpuContext::get(device)?;
    context.check_alive()?;
    context.bind()?;
    let (free, total) = result::mem_get_info().map_err(GpuError::cuda("querying device memory"))?;
    Ok(MemoryInUse {
        device_free: free as u64,
        device_total: total as u64,
        output_pool_idle: context.pool.idle_bytes(),
        staging_pooled: context.staging.bytes(),
        pinned_pooled: context.pinned.bytes() + context.uploads.bytes() + context.rings.bytes(),
        pool_keep: context.keep.device,
        pinned_keep: context.keep.pinned,
    })
}

/// Errors after which the context cannot be used again: every later call returns them.
fn is_sticky(err: DriverError) -> bool {
    use sys::cudaError_enum as E;
    matches!(
        err.0,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
            | E::CUDA_ERROR_CONTEXT_IS_DESTROYED
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// Reads are counted before any device state exists (no CUDA here), per device, and the
    /// peak stays until the pools are trimmed idle.
    #[test]
    fn reads_count_in_flight_without_a_device() {
        let count = InFlight::of(9001);
        let first = ReadInFlight::start(9001);
        let second = ReadInFlight::start(9001);
        assert_eq!(count.reads.load(Ordering::SeqCst), 2);
        assert_eq!(InFlight::of(9002).reads.load(Ordering::SeqCst), 0, "another device");
        drop(first);
        drop(second);
        assert_eq!((count.reads.load(Ordering::SeqCst), count.peak.load(Ordering::SeqCst)), (0, 2));
    }
}
