//! The device read engine: many host reads in flight on a thread pool, each into a pinned staging
//! buffer that is allocated once and reused, each followed by an async copy to the device on the
//! worker's own stream (what kvikio calls compat mode); files that cuFile registered are read
//! straight into device memory instead. Also the CUDA contexts and pinned memory it owns.
//!
//! [`DeviceReader`] reads from a [`GdsStore`](zarrs_gds_store::GdsStore) (its files) or any zarrs
//! store (its partial reads), into device memory or into host memory with a [`DeviceMirror`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use rayon::prelude::*;

mod error;
mod pinned;
mod remote;
mod source;
mod store;

pub use error::DeviceReadError;
pub use pinned::PinnedBuffer;
pub(crate) use remote::Prefetched;
pub(crate) use source::ReadSource;
pub use store::{DeviceReadRequest, DeviceRowsRequest, HostReadRequest};
pub use zarrs_gds_store::DeviceReadOutcome;

/// A device address (`CUdeviceptr`).
pub type DevicePtr = sys::CUdeviceptr;

/// Device memory that a read into host memory is copied to, piece by piece, as it is read (see
/// [`DeviceReader::read_host`]).
pub struct DeviceMirror<'a> {
    device: DevicePtr,
    len: usize,
    stream: &'a CudaStream,
}

impl<'a> DeviceMirror<'a> {
    /// Byte `k` of the host buffer goes to `device + k`; `stream`'s later work waits for the
    /// copies.
    ///
    /// # Safety
    /// `device` must be valid device memory of the reader's context for `len` bytes, unused by
    /// other work until `stream` has passed the copies; the host buffer read into must be pinned
    /// (or the copies are synchronous) and must not be written or freed before then either.
    #[must_use]
    pub unsafe fn new(device: DevicePtr, len: usize, stream: &'a CudaStream) -> Self {
        Self { device, len, stream }
    }
}

/// The CUDA primary context of device `ordinal`, created once per process.
///
/// # Errors
/// Returns [`DeviceReadError::NoCuda`] when the driver library is missing or the device cannot be
/// opened, with what to check.
pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>, DeviceReadError> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    // SAFETY: only probes whether the driver library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        return Err(DeviceReadError::NoCuda(
            "the NVIDIA driver library (libcuda.so) was not found: install the NVIDIA driver or run on a GPU machine"
                .into(),
        ));
    }
    let mut contexts = CONTEXTS.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(ctx) = contexts.get(&ordinal) {
        return Ok(ctx.clone());
    }
    let count = {
        result::init().map_err(|e| DeviceReadError::NoCuda(format!("cuInit failed: {e}")))?;
        CudaContext::device_count().map_err(|e| DeviceReadError::NoCuda(format!("counting devices: {e}")))?
    };
    if ordinal >= count.max(0) as usize {
        return Err(DeviceReadError::NoCuda(format!("device {ordinal} requested but {count} CUDA device(s) found")));
    }
    let ctx =
        CudaContext::new(ordinal).map_err(|e| DeviceReadError::NoCuda(format!("opening device {ordinal}: {e}")))?;
    contexts.insert(ordinal, ctx.clone());
    Ok(ctx)
}

/// Settings of a [`DeviceReader`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeviceReaderOptions {
    /// Reader threads (each with its own stream and two pinned buffers).
    pub threads: usize,
    /// Reads are split into pieces of at most this many bytes (each a task on the pool).
    pub task_size: usize,
}

impl Default for DeviceReaderOptions {
    /// All cores (at most 256), 4 MiB tasks. The environment is not read: see
    /// [`DeviceReaderOptions::from_env`].
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(8, std::num::NonZero::get);
        Self { threads: cores.min(256), task_size: 4 << 20 }
    }
}

impl DeviceReaderOptions {
    /// The defaults, then `ZARRS_GDS_NTHREADS` (1 to 256) and `ZARRS_GDS_TASK_SIZE` (4096 bytes
    /// or more) where set. The shared reader of each device is made with these.
    ///
    /// # Errors
    /// Returns [`DeviceReadError::Config`] naming a variable whose value cannot be used.
    pub fn from_env() -> Result<Self, DeviceReadError> {
        let mut options = Self::default();
        if let Some(threads) = crate::env::reader_threads()? {
            options.threads = threads;
        }
        if let Some(task_size) = crate::env::reader_task_size()? {
            options.task_size = task_size;
        }
        Ok(options)
    }

    /// Set the number of reader threads.
    #[must_use]
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads.max(1);
        self
    }

    /// Set the task size in bytes.
    #[must_use]
    pub fn with_task_size(mut self, task_size: usize) -> Self {
        self.task_size = task_size.max(4096);
        self
    }
}

/// One host destination of a transfer: `len` bytes at byte `at` of the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostTransfer {
    /// Where the bytes land in the buffer.
    pub at: usize,
    /// How many bytes.
    pub len: usize,
}

/// One device destination of a transfer: `len` bytes at `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTransfer {
    /// Where the bytes land.
    pub dst: DevicePtr,
    /// How many bytes.
    pub len: usize,
}

/// Where the bytes of a transfer come from, read in pieces from many threads at once.
pub trait PieceSource: Sync {
    /// Fill `buf` with bytes `offset..offset + buf.len()` of transfer `transfer`.
    /// Returns `Ok(false)` when the transfer's source does not exist (a missing key).
    ///
    /// # Errors
    /// Returns an error when the source cannot be read.
    fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError>;

    /// Whether transfers whose destinations follow one another lie in one allocation, so that
    /// one copy may span them (and their reads share a piece).
    fn shares_pieces(&self) -> bool {
        false
    }

    /// Whether transfer `transfer` is read straight into device memory by [`Self::read_device`].
    fn is_direct(&self, _transfer: usize) -> bool {
        false
    }

    /// Read bytes `offset..offset + len` of transfer `transfer` straight to `dst` (GPUDirect).
    ///
    /// # Safety
    /// `dst` must be device memory of the context current on this thread, valid for `len` bytes
    /// and used by nothing else meanwhile.
    ///
    /// # Errors
    /// Returns an error when the source cannot be read.
    unsafe fn read_device(
        &self,
        transfer: usize,
        offset: u64,
        dst: DevicePtr,
        len: usize,
    ) -> Result<bool, DeviceReadError> {
        let _ = (transfer, offset, dst, len);
        Err(zarrs_gds_store::ReadError::GdsUnavailable("this source has no direct device reads".into()).into())
    }
}

/// Per transfer, whether pieces found its source or found it missing.
struct Outcome {
    found: Vec<AtomicBool>,
    missing: Vec<AtomicBool>,
}

impl Outcome {
    fn new(n: usize) -> Self {
        Self {
            found: (0..n).map(|_| AtomicBool::new(false)).collect(),
            missing: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn record(&self, transfer: usize, present: bool) {
        if present { &self.found[transfer] } else { &self.missing[transfer] }.store(true, Ordering::Relaxed);
    }

    /// Whether each transfer (of these lengths) found its source; an error when it vanished part
    /// way.
    fn finish(&self, lens: impl Iterator<Item = usize>) -> Result<Vec<bool>, DeviceReadError> {
        lens.enumerate()
            .map(|(i, len)| match (self.found[i].load(Ordering::Relaxed), self.missing[i].load(Ordering::Relaxed)) {
                (true, true) => Err(zarrs_storage::StorageError::Other(format!(
                    "transfer {i} ({len} bytes): its source disappeared during the read"
                ))
                .into()),
                (present, _) => Ok(present || len == 0),
            })
            .collect()
    }
}

/// A raw pointer that may cross to the pool's threads (each writes a disjoint part).
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: used only for disjoint writes, checked by the caller.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// The bytes of transfers of these lengths (saturating).
fn total_len(lens: &[usize]) -> u64 {
    lens.iter().fold(0u64, |acc, &len| acc.saturating_add(len as u64))
}

/// Split transfers into pieces of at most `task` bytes for the reader's threads. A piece is one
/// or more segments `(transfer, offset, len)` whose destinations follow one another, up to
/// `group` bytes (0: one segment a piece): small transfers packed side by side in one allocation
/// (the rows of a tile) are read into one pinned buffer and go to the device in one copy, not one
/// each. A direct transfer's pieces have one segment.
fn group_pieces(
    transfers: &[DeviceTransfer],
    task: u64,
    group: u64,
    is_direct: impl Fn(usize) -> bool,
) -> Vec<Vec<(usize, u64, usize)>> {
    let (task, group) = (task.max(1), group.min(task));
    let mut pieces: Vec<Vec<(usize, u64, usize)>> = Vec::new();
    // The destination just past the last piece and its bytes, while it may still grow.
    let mut open: Option<(DevicePtr, u64)> = None;
    for (i, t) in transfers.iter().enumerate() {
        let len = t.len as u64;
        let direct = is_direct(i);
        for offset in (0..len).step_by(usize::try_from(task).unwrap_or(usize::MAX)) {
            let n = (len - offset).min(task);
            let dst = t.dst + offset;
            match (open, pieces.last_mut()) {
                (Some((end, filled)), Some(last)) if !direct && end == dst && filled + n <= group => {
                    last.push((i, offset, n as usize));
                    open = Some((dst + n, filled + n));
                }
                _ => {
                    pieces.push(vec![(i, offset, n as usize)]);
                    open = (!direct).then_some((dst + n, n));
                }
            }
        }
    }
    pieces
}

struct Worker {
    stream: Arc<CudaStream>,
    /// Recorded after a transfer's copies, for a consumer stream to wait on.
    done: CudaEvent,
    slots: [(PinnedBuffer, CudaEvent, bool); 2],
    next: usize,
}

/// Reads host-side sources into device memory: a thread pool, a pinned buffer pair and a stream
/// per thread, all made once and reused by every read.
pub struct DeviceReader {
    ctx: Arc<CudaContext>,
    pool: rayon::ThreadPool,
    workers: Vec<Mutex<Worker>>,
    options: DeviceReaderOptions,
}

impl DeviceReader {
    /// Create a reader on `ctx`: allocates `threads x 2 x task_size` bytes of pinned memory.
    ///
    /// # Errors
    /// Returns an error when the streams, events or pinned memory cannot be made.
    pub fn new(ctx: Arc<CudaContext>, mut options: DeviceReaderOptions) -> Result<Self, DeviceReadError> {
        // The fields are public: no thread count or task size of zero (pieces divide by both).
        options.threads = options.threads.clamp(1, 256);
        options.task_size = options.task_size.max(4096);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.threads)
            .thread_name(|i| format!("zarrs-gds-{i}"))
            .build()
            .map_err(|e| DeviceReadError::ThreadPool(e.to_string()))?;
        let workers = (0..options.threads)
            .map(|_| {
                let stream = ctx.new_stream().map_err(DeviceReadError::cuda("creating a stream"))?;
                let slot = || -> Result<_, DeviceReadError> {
                    Ok((
                        PinnedBuffer::new(&ctx, options.task_size)?,
                        ctx.new_event(None).map_err(DeviceReadError::cuda("creating an event"))?,
                        false,
                    ))
                };
                let done = ctx.new_event(None).map_err(DeviceReadError::cuda("creating an event"))?;
                Ok(Mutex::new(Worker { stream, done, slots: [slot()?, slot()?], next: 0 }))
            })
            .collect::<Result<Vec<_>, DeviceReadError>>()?;
        Ok(Self { ctx, pool, workers, options })
    }

    /// The shared reader of device `ordinal` with [`DeviceReaderOptions::from_env`], made on first use.
    ///
    /// # Errors
    /// Returns an error when there is no usable device or the reader cannot be made.
    pub fn shared(ordinal: usize) -> Result<Arc<Self>, DeviceReadError> {
        static READERS: OnceLock<Mutex<HashMap<usize, Arc<DeviceReader>>>> = OnceLock::new();
        let mut readers = READERS.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(reader) = readers.get(&ordinal) {
            return Ok(reader.clone());
        }
        let reader = Arc::new(Self::new(cuda_context(ordinal)?, DeviceReaderOptions::from_env()?)?);
        readers.insert(ordinal, reader.clone());
        Ok(reader)
    }

    /// The CUDA context this reader copies into.
    #[must_use]
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The reader's settings.
    #[must_use]
    pub fn options(&self) -> &DeviceReaderOptions {
        &self.options
    }

    /// Run a closure on the reader's thread pool (for work that should share its threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Read every transfer's bytes from `source` into its device destination. Returns, per
    /// transfer, whether its source existed; a missing source leaves its destination unwritten.
    ///
    /// With `stream` None the device memory is written when this returns. With a stream, the
    /// host reads are done when this returns and the copies to the device are ordered before any
    /// work enqueued on `stream` afterwards: the next reads start while the last copies finish.
    ///
    /// # Safety
    /// Every destination must be valid device memory of this reader's context for `len` bytes,
    /// and no two destinations may overlap.
    ///
    /// # Errors
    /// Returns the first error of any piece, after every copy in flight has completed.
    pub unsafe fn transfer(
        &self,
        transfers: &[DeviceTransfer],
        source: &dyn PieceSource,
        stream: Option<&CudaStream>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        let lens: Vec<usize> = transfers.iter().map(|t| t.len).collect();
        let total = total_len(&lens);
        let task = self.task_size(total);
        // Grouped, a piece a thread at least: its segments are read one after another.
        let group = if source.shares_pieces() { (total / self.workers.len() as u64).max(64 << 10) } else { 0 };
        let pieces = group_pieces(transfers, task, group, |i| source.is_direct(i));
        let outcome = Outcome::new(transfers.len());
        let result: Result<(), DeviceReadError> = self.pool.install(|| {
            pieces.par_iter().try_for_each(|piece| {
                let (i, offset, len) = piece[0];
                let dst = transfers[i].dst + offset;
                if source.is_direct(i) {
                    self.ctx.bind_to_thread().map_err(DeviceReadError::cuda("binding the CUDA context"))?;
                    // SAFETY: the piece's destination lies in its transfer's, which the caller
                    // vouches for; pieces are disjoint; the context is bound above. A direct
                    // transfer's pieces have one segment each (group_pieces).
                    let present = unsafe { source.read_device(i, offset, dst, len) }?;
                    outcome.record(i, present);
                } else {
                    self.piece_via_pinned(source, piece, dst, &outcome)?;
                }
                Ok(())
            })
        });
        self.settle(result, stream)?;
        outcome.finish(lens.into_iter())
    }

    /// After a read's copies to device destinations were enqueued: on an error, wait for the
    /// copies in flight (they may still write the destinations) and return it; else order them
    /// before `stream`'s later work or, without a stream, wait for them.
    fn settle(&self, result: Result<(), DeviceReadError>, stream: Option<&CudaStream>) -> Result<(), DeviceReadError> {
        match (result, stream) {
            (Err(err), _) => {
                let _ = self.synchronize();
                Err(err)
            }
            (Ok(()), None) => self.synchronize(),
            (Ok(()), Some(stream)) => self.order_before(stream),
        }
    }

    /// As [`Self::settle`], for reads into host memory whose pieces a mirror's `stream` copies
    /// to the device (none without a mirror: nothing to wait for).
    fn settle_mirrored(
        &self,
        result: Result<(), DeviceReadError>,
        stream: Option<&CudaStream>,
    ) -> Result<(), DeviceReadError> {
        match (result, stream) {
            (Err(err), Some(_)) => {
                let _ = self.synchronize();
                Err(err)
            }
            (Err(err), None) => Err(err),
            (Ok(()), Some(stream)) => self.order_before(stream),
            (Ok(()), None) => Ok(()),
        }
    }

    /// Read every transfer's bytes from `source` into host memory: `buf[at..at + len]` for each,
    /// in pieces on the reader's threads. Returns, per transfer,
    /// whether its source existed.
    ///
    /// With a [`DeviceMirror`], each piece is also copied to the device as soon as it is read (on
    /// the reader's streams), and the mirror's stream waits for those copies: the copy of a batch
    /// to the device overlaps its reads, and the host can look at the bytes meanwhile.
    ///
    /// # Errors
    /// Returns the first error of any piece (after every copy in flight has completed), or an
    /// error when a destination lies outside `buf` or two overlap.
    pub fn read_host(
        &self,
        transfers: &[HostTransfer],
        source: &dyn PieceSource,
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        check_host_destinations(transfers, buf.len(), mirror.as_ref())?;
        let base = SendPtr(buf.as_mut_ptr());
        let lens: Vec<usize> = transfers.iter().map(|t| t.len).collect();
        let pieces = self.pieces(&lens);
        let outcome = Outcome::new(transfers.len());
        let result = self.pool.install(|| {
            pieces.par_iter().try_for_each(|&(i, offset, len)| {
                let start = transfers[i].at + offset as usize;
                // SAFETY: the destinations were checked to lie in `buf` and not to overlap, and
                // pieces of one transfer are disjoint, so every piece writes its own bytes.
                let piece = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), len) };
                let present = source.read_host(i, offset, piece)?;
                outcome.record(i, present);
                if let (Some(mirror), true) = (&mirror, present) {
                    self.copy_piece(piece, mirror.device + start as u64)?;
                }
                Ok::<(), DeviceReadError>(())
            })
        });
        self.settle_mirrored(result, mirror.map(|m| m.stream))?;
        outcome.finish(lens.into_iter())
    }

    /// Copy host bytes just read to `dst` on this thread's worker stream.
    fn copy_piece(&self, piece: &[u8], dst: DevicePtr) -> Result<(), DeviceReadError> {
        let index = rayon::current_thread_index().unwrap_or(0) % self.workers.len();
        let worker = self.workers[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.ctx.bind_to_thread().map_err(DeviceReadError::cuda("binding the CUDA context"))?;
        // SAFETY: the mirror's contract: dst is valid device memory for the piece's bytes, and
        // the host bytes stay untouched until the mirror's stream has passed these copies.
        unsafe { result::memcpy_htod_async(dst, piece, worker.stream.cu_stream()) }
            .map_err(DeviceReadError::cuda("copying to the device"))
    }

    /// Split transfers into pieces `(transfer, offset, len)`. Small reads get smaller pieces (down
    /// to 1 MiB), so that every thread has several in flight and reads overlap copies; large reads
    /// use the full task size.
    fn pieces(&self, lens: &[usize]) -> Vec<(usize, u64, usize)> {
        let task = self.task_size(total_len(lens));
        lens.iter()
            .enumerate()
            .flat_map(|(i, &len)| {
                let len = len as u64;
                (0..len.div_ceil(task)).map(move |p| (i, p * task, (len - p * task).min(task) as usize))
            })
            .collect()
    }

    /// Make `stream` wait for every copy enqueued so far on the workers' streams.
    fn order_before(&self, stream: &CudaStream) -> Result<(), DeviceReadError> {
        self.ctx.bind_to_thread().map_err(DeviceReadError::cuda("binding the CUDA context"))?;
        for worker in &self.workers {
            let worker = worker.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            worker.done.record(&worker.stream).map_err(DeviceReadError::cuda("recording an event"))?;
            stream.wait(&worker.done).map_err(DeviceReadError::cuda("ordering copies before placement"))?;
        }
        Ok(())
    }

    /// The size of a piece for transfers of `total` bytes (see [`Self::pieces`]).
    fn task_size(&self, total: u64) -> u64 {
        let per_thread = total / (self.workers.len() as u64 * 8);
        per_thread.next_multiple_of(4096).max(1 << 20).min(self.options.task_size as u64)
    }

    /// Read a piece's segments one after another into a pinned buffer and copy them to the
    /// device from `dst` on (their destinations follow one another): one copy for the piece, or
    /// one per run of segments whose sources exist.
    fn piece_via_pinned(
        &self,
        source: &dyn PieceSource,
        piece: &[(usize, u64, usize)],
        dst: DevicePtr,
        outcome: &Outcome,
    ) -> Result<(), DeviceReadError> {
        let index = rayon::current_thread_index().unwrap_or(0) % self.workers.len();
        let mut worker = self.workers[index].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let worker = &mut *worker;
        let slot_index = worker.next;
        worker.next ^= 1;
        let (buffer, event, in_use) = &mut worker.slots[slot_index];
        if *in_use {
            // The copy that last used this buffer must finish before it is overwritten.
            event.synchronize().map_err(DeviceReadError::cuda("waiting for a host-to-device copy"))?;
            *in_use = false;
        }
        let total: usize = piece.iter().map(|s| s.2).sum();
        let host = &mut buffer.as_mut_slice()[..total];
        let stream = &worker.stream;
        let (copied, result) =
            read_piece_runs(source, piece, host, outcome, |run, bytes| self.copy_run(bytes, dst + run as u64, stream));
        // Even after an error: a copy enqueued keeps the buffer until its event.
        if copied {
            event.record(&worker.stream).map_err(DeviceReadError::cuda("recording an event"))?;
            *in_use = true;
        }
        result
    }

    /// Enqueue the copy of `bytes` (pinned) to `dst` on `stream`; false when there are none.
    fn copy_run(&self, bytes: &[u8], dst: DevicePtr, stream: &CudaStream) -> Result<bool, DeviceReadError> {
        if bytes.is_empty() {
            return Ok(false);
        }
        self.ctx.bind_to_thread().map_err(DeviceReadError::cuda("binding the CUDA context"))?;
        // SAFETY: dst is valid for these bytes (the caller's contract: a piece's destinations
        // follow one another); the pinned bytes stay untouched until the event recorded after
        // the piece's copies completes.
        unsafe { result::memcpy_htod_async(dst, bytes, stream.cu_stream()) }
            .map_err(DeviceReadError::cuda("copying to the device"))?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<(), DeviceReadError> {
        let mut first = Ok(());
        for worker in &self.workers {
            let mut worker = worker.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let synced = worker.stream.synchronize().map_err(DeviceReadError::cuda("waiting for copies"));
            for slot in &mut worker.slots {
                slot.2 = false;
            }
            if first.is_ok() {
                first = synced;
            }
        }
        first
    }
}

/// Host destinations must lie in a buffer of `buf_len` bytes, none overlapping another, and a
/// device mirror must be as long as the buffer.
fn check_host_destinations(
    transfers: &[HostTransfer],
    buf_len: usize,
    mirror: Option<&DeviceMirror<'_>>,
) -> Result<(), DeviceReadError> {
    // Saturating: an end past 2^64 lies outside any buffer and is refused below.
    let mut spans: Vec<(u64, u64)> =
        transfers.iter().map(|t| (t.at as u64, (t.at as u64).saturating_add(t.len as u64))).collect();
    spans.sort_unstable();
    let overlapping = spans.windows(2).any(|w| w[1].0 < w[0].1);
    if overlapping || spans.last().is_some_and(|s| s.1 > buf_len as u64) {
        return Err(zarrs_storage::StorageError::Other(
            "host read destinations overlap or lie outside the buffer".into(),
        )
        .into());
    }
    if mirror.is_some_and(|m| m.len < buf_len) {
        return Err(
            zarrs_storage::StorageError::Other("the device mirror is shorter than the host buffer".into()).into()
        );
    }
    Ok(())
}

/// Read `piece`'s segments one after another into `host` and hand each run of them whose
/// sources exist to `copy` (its offset in `host`, its bytes): a missing source ends a run. Returns
/// whether any copy was enqueued, also after an error (the buffer is then in use until the
/// copies finish), and the first error.
fn read_piece_runs(
    source: &dyn PieceSource,
    piece: &[(usize, u64, usize)],
    host: &mut [u8],
    outcome: &Outcome,
    mut copy: impl FnMut(usize, &[u8]) -> Result<bool, DeviceReadError>,
) -> (bool, Result<(), DeviceReadError>) {
    // Bytes run..at are read and not yet copied.
    let (mut run, mut at, mut copied) = (0, 0, false);
    let result = (|| {
        for &(i, offset, len) in piece {
            let present = source.read_host(i, offset, &mut host[at..at + len])?;
            outcome.record(i, present);
            if !present {
                copied |= copy(run, &host[run..at])?;
                run = at + len;
            }
            at += len;
        }
        copied |= copy(run, &host[run..at])?;
        Ok(())
    })();
    (copied, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Segments of transfers 0 to 4: transfer 2 is missing, transfer 4 fails to read.
    struct Segments;

    impl PieceSource for Segments {
        fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
            match transfer {
                2 => Ok(false),
                4 => Err(zarrs_storage::StorageError::Other("transfer 4 cannot be read".into()).into()),
                _ => {
                    buf.iter_mut().enumerate().for_each(|(k, b)| *b = (transfer * 50 + offset as usize + k) as u8);
                    Ok(true)
                }
            }
        }
    }

    /// A piece with a missing segment in its middle is copied as the runs on either side of it,
    /// each from its own offset with its own bytes; a read error after a copy was queued still
    /// reports the copy, so that the pinned buffer stays guarded until it finishes.
    #[test]
    fn pieces_copy_the_runs_around_missing_segments_and_guard_queued_runs_after_errors() {
        let expect = |t: usize, o: usize, n: usize| -> Vec<u8> { (0..n).map(|k| (t * 50 + o + k) as u8).collect() };
        let run = |piece: &[(usize, u64, usize)]| {
            let outcome = Outcome::new(5);
            let mut host = vec![0u8; piece.iter().map(|s| s.2).sum()];
            let mut runs: Vec<(usize, Vec<u8>)> = Vec::new();
            let (queued, result) = read_piece_runs(&Segments, piece, &mut host, &outcome, |at, bytes| {
                if !bytes.is_empty() {
                    runs.push((at, bytes.to_vec()));
                }
                Ok(!bytes.is_empty())
            });
            (queued, result, runs, outcome)
        };
        let (queued, result, runs, outcome) = run(&[(0, 10, 6), (1, 0, 4), (2, 0, 5), (3, 7, 3)]);
        assert!(queued && result.is_ok());
        assert_eq!(runs, vec![(0, [expect(0, 10, 6), expect(1, 0, 4)].concat()), (15, expect(3, 7, 3))]);
        assert!(outcome.finish([6, 4, 5, 3, 1].into_iter()).is_ok_and(|f| f == [true, true, false, true, false]));
        // The missing segment first, then last: no empty runs, nothing lost.
        let (_, _, runs, _) = run(&[(2, 0, 5), (0, 0, 2)]);
        assert_eq!(runs, vec![(5, expect(0, 0, 2))]);
        let (_, _, runs, _) = run(&[(0, 0, 2), (2, 0, 5)]);
        assert_eq!(runs, vec![(0, expect(0, 0, 2))]);
        // An error after a run was queued: the copy is reported with the error.
        let (queued, result, runs, _) = run(&[(0, 0, 3), (2, 0, 1), (4, 0, 2)]);
        assert!(queued, "a queued copy must keep its buffer guarded");
        assert!(result.is_err_and(|e| e.to_string().contains("transfer 4")));
        assert_eq!(runs, vec![(0, expect(0, 0, 3))]);
        // An error before anything was queued: nothing to guard.
        let (queued, result, runs, _) = run(&[(4, 0, 2), (0, 0, 3)]);
        assert!(!queued && result.is_err() && runs.is_empty());
    }

    fn transfers(spans: &[(u64, usize)]) -> Vec<DeviceTransfer> {
        spans.iter().map(|&(dst, len)| DeviceTransfer { dst, len }).collect()
    }

    /// Every byte of every transfer, once, in order, with destinations that follow one
    /// another within each piece and no piece over `task`.
    fn check(t: &[DeviceTransfer], task: u64, pieces: &[Vec<(usize, u64, usize)>]) {
        let mut next = vec![0u64; t.len()];
        for piece in pieces {
            assert!(!piece.is_empty());
            assert!(piece.iter().map(|s| s.2 as u64).sum::<u64>() <= task, "{piece:?} over {task}");
            let mut end = None;
            for &(i, offset, len) in piece {
                assert_eq!(offset, next[i], "transfer {i} out of order in {pieces:?}");
                next[i] += len as u64;
                let dst = t[i].dst + offset;
                assert!(end.is_none_or(|e| e == dst), "{piece:?}: destinations do not follow one another");
                end = Some(dst + len as u64);
            }
        }
        for (i, tr) in t.iter().enumerate() {
            assert_eq!(next[i], tr.len as u64, "transfer {i}");
        }
    }

    #[test]
    fn small_transfers_side_by_side_share_a_piece_and_others_do_not() {
        // Rows of a tile packed one after another: 300 transfers of 3000 bytes from 1 << 20.
        let packed: Vec<(u64, usize)> = (0..300).map(|k| ((1 << 20) + k * 3000, 3000)).collect();
        let t = transfers(&packed);
        let pieces = group_pieces(&t, 1 << 20, 64 << 10, |_| false);
        check(&t, 1 << 20, &pieces);
        // 21 transfers of 3000 bytes fit in a group of 64 KiB: 300 of them in 15 pieces, not 300.
        assert_eq!(pieces.len(), 300usize.div_ceil(21));
        // Not grouped (a source whose destinations may lie in several allocations): one each.
        let pieces = group_pieces(&t, 1 << 20, 0, |_| false);
        check(&t, 1 << 20, &pieces);
        assert_eq!(pieces.len(), 300);
        // Apart (a gap between destinations) or direct: one piece each.
        let apart = transfers(&[(0, 100), (200, 100), (300, 100)]);
        let pieces = group_pieces(&apart, 4096, 4096, |_| false);
        check(&apart, 4096, &pieces);
        assert_eq!(pieces.len(), 2, "{pieces:?}");
        let pieces = group_pieces(&t, 64 << 10, 64 << 10, |i| i % 2 == 0);
        check(&t, 64 << 10, &pieces);
        assert!(pieces.iter().all(|p| p.len() == 1), "a direct transfer's neighbours stay apart");
    }

    #[test]
    fn large_transfers_split_at_the_task_size_and_their_tails_join_the_next() {
        // 2.5 tasks, then 0.5 task right after: the tail and the next share a piece.
        let task = 1u64 << 20;
        let t = transfers(&[(0, (5 * task / 2) as usize), (5 * task / 2, (task / 2) as usize), (1 << 40, 0)]);
        let pieces = group_pieces(&t, task, task, |_| false);
        check(&t, task, &pieces);
        assert_eq!(
            pieces,
            vec![
                vec![(0, 0, task as usize)],
                vec![(0, task, task as usize)],
                vec![(0, 2 * task, (task / 2) as usize), (1, 0, (task / 2) as usize)],
            ]
        );
    }
}
