//! Reads kept in flight while the caller uses earlier results: a volume walked tile by tile
//! ([`tile_subsets`], [`ReadAhead`]) or one read started now and taken later ([`read_async`]).
//!
//! The reads run on a background thread, one after another, each on its own streams; every result
//! is complete when it is handed out (a read synchronizes before it returns), so the caller's
//! kernels on tile k may run on any stream while tile k+1 is read.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use zarrs::array::{Array, ArraySubset};
use zarrs_storage::ReadableStorageTraits;

use crate::config::GpuConfig;
use crate::device_array::FromDeviceBytes;
use crate::error::GpuError;
use crate::reader::DeviceReadError;
use crate::report::RetrieveReport;
use crate::retrieve::ArrayDeviceExt;

/// The order in which [`tile_subsets`] lists the tiles of a grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TileOrder {
    /// Row-major over the tile grid: the last dimension's tile index varies fastest.
    C,
    /// A permutation of the tiles fixed by `seed` (a Fisher–Yates shuffle driven by splitmix64:
    /// the same seed gives the same order on every platform).
    Random {
        /// The permutation's seed.
        seed: u64,
    },
}

/// The tiles of `tile_shape` that cover an array of `shape`, each once, as subsets (tiles at the
/// far edge of a dimension are clipped to the shape), in `order`. An array with an extent of 0 has
/// no tiles; a 0-dimensional one has one.
///
/// # Errors
/// [`GpuError::Unsupported`] when `tile_shape` has another number of dimensions than `shape` or an
/// extent of 0; [`GpuError::Overflow`] when the number of tiles does not fit in 64 bits or their
/// list in memory.
pub fn tile_subsets(shape: &[u64], tile_shape: &[u64], order: TileOrder) -> Result<Vec<ArraySubset>, GpuError> {
    if shape.len() != tile_shape.len() {
        return Err(GpuError::Unsupported(format!(
            "the tile shape {tile_shape:?} has {} dimensions, the array's shape {shape:?} has {}",
            tile_shape.len(),
            shape.len()
        )));
    }
    if let Some(d) = tile_shape.iter().position(|&n| n == 0) {
        return Err(GpuError::Unsupported(format!(
            "the tile shape {tile_shape:?} has extent 0 in dimension {d}: every tile extent must be 1 or more"
        )));
    }
    let grid: Vec<u64> = shape.iter().zip(tile_shape).map(|(&n, &t)| n.div_ceil(t)).collect();
    let count = grid.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n)).ok_or_else(|| {
        GpuError::Overflow(format!(
            "an array of shape {shape:?} in tiles of {tile_shape:?} is a grid of {grid:?} tiles: more than 2^64"
        ))
    })?;
    let too_many = || {
        GpuError::Overflow(format!(
            "an array of shape {shape:?} in tiles of {tile_shape:?} has {count} tiles: their list does not fit in memory"
        ))
    };
    let len = usize::try_from(count).map_err(|_| too_many())?;
    let mut tiles = Vec::new();
    // Fallible: a grid of 2^40 tiles is an error, not an abort.
    tiles.try_reserve_exact(len).map_err(|_| too_many())?;
    let mut index = vec![0u64; shape.len()];
    for _ in 0..len {
        let ranges: Vec<_> = index
            .iter()
            .zip(tile_shape)
            .zip(shape)
            // index < grid, so index * tile < shape + tile; the end is clipped to the shape.
            .map(|((&i, &t), &n)| {
                let start = i * t;
                start..start.saturating_add(t).min(n)
            })
            .collect();
        tiles.push(ArraySubset::new_with_ranges(&ranges));
        // The next grid index, last dimension fastest.
        for d in (0..index.len()).rev() {
            index[d] += 1;
            if index[d] < grid[d] {
                break;
            }
            index[d] = 0;
        }
    }
    if let TileOrder::Random { seed } = order {
        shuffle(&mut tiles, seed);
    }
    Ok(tiles)
}

/// Where [`random_crops`] may start a crop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CropStarts {
    /// Anywhere the crop fits: each start from 0 to `shape - extent`.
    Anywhere,
    /// On the grid of the crop's extent: each start a multiple of the extent, the crop wholly
    /// inside the array (a random tile, drawn with replacement).
    OnGrid,
}

/// `count` crops of `extent` inside an array of `shape` at random starts, for training steps
/// and benchmarks: drawn crop by crop and dimension by dimension from splitmix64 seeded by
/// `seed` (each draw below `n` the high 64 bits of the next value times `n`), so a seed gives
/// the same crops on every platform and in any language that draws alike.
///
/// # Errors
/// [`GpuError::Unsupported`] when `extent` has another number of dimensions than `shape`, or an
/// extent larger than the shape (or 0, for [`CropStarts::OnGrid`]).
pub fn random_crops(
    shape: &[u64],
    extent: &[u64],
    count: usize,
    seed: u64,
    starts: CropStarts,
) -> Result<Vec<ArraySubset>, GpuError> {
    let grid = starts == CropStarts::OnGrid;
    if extent.len() != shape.len() || extent.iter().zip(shape).any(|(&e, &n)| e > n || (grid && e == 0)) {
        return Err(GpuError::Unsupported(format!("crops of {extent:?} inside an array of shape {shape:?}")));
    }
    let mut rng = SplitMix64(seed);
    let mut crops = Vec::with_capacity(count);
    for _ in 0..count {
        let start: Vec<u64> = shape
            .iter()
            .zip(extent)
            .map(|(&n, &e)| if grid { rng.below(n / e) * e } else { rng.below(n - e + 1) })
            .collect();
        let ranges: Vec<_> = start.iter().zip(extent).map(|(&a, &e)| a..a + e).collect();
        crops.push(ArraySubset::new_with_ranges(&ranges));
    }
    Ok(crops)
}

/// splitmix64 (Steele, Lea and Flood 2014, as in Vigna's `splitmix64.c`): a small, well-mixed
/// generator, enough for a reproducible shuffle or crops (no dependency).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `bound` (> 0), by the multiply-shift rule (its bias, below 2^-32 for any
    /// bound that fits in memory, does not matter for a shuffle or crops).
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(bound)) >> 64) as u64
    }
}

/// Fisher–Yates with splitmix64 seeded by `seed`.
fn shuffle<X>(items: &mut [X], seed: u64) {
    let mut rng = SplitMix64(seed);
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// What the worker sends: a read's result, or the panic that ended it (raised again on the
/// consumer's thread, as a joined thread's would be).
enum Message<R, E> {
    Read(Result<R, E>),
    Panicked(Box<dyn Any + Send>),
}

/// Reads of `items`, one after another on a background thread, handed to the consumer in order
/// through a bounded queue: at most `depth` results wait, and one more is being read (or waits
/// for room in the queue). Dropping it stops the thread after its current read, without waiting
/// for that read.
struct Prefetch<R, E> {
    /// None once the iteration has ended (the reads ran out, an error, or a panic).
    receiver: Option<Receiver<Message<R, E>>>,
    /// Set when the consumer goes: the worker starts no further read.
    stop: Arc<AtomicBool>,
    /// Reads finished (successfully or not) by the worker.
    finished: Arc<AtomicUsize>,
    /// Results handed to the consumer.
    taken: usize,
}

impl<R: Send + 'static, E: Send + 'static> Prefetch<R, E> {
    /// [`Self::start_grouped`] with one read per item.
    #[cfg(test)]
    fn start<I, F>(items: I, depth: usize, mut read: F) -> std::io::Result<Self>
    where
        I: IntoIterator + Send + 'static,
        I::IntoIter: Send,
        F: FnMut(I::Item) -> Result<R, E> + Send + 'static,
    {
        Self::start_grouped(items.into_iter().map(|item| [item]), depth, move |[item]| vec![read(item)])
    }

    /// Start the worker over `groups`: each read as one (`read` gives a group's results in order,
    /// up to and including the first error), its results queued one by one. Only `groups`,
    /// `read` and the queue's sending end move to it: nothing of the caller's stack, so a
    /// detached worker is sound.
    fn start_grouped<I, F>(groups: I, depth: usize, mut read: F) -> std::io::Result<Self>
    where
        I: IntoIterator + Send + 'static,
        F: FnMut(I::Item) -> Vec<Result<R, E>> + Send + 'static,
    {
        let (sender, receiver) = sync_channel(depth.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicUsize::new(0));
        let (worker_stop, worker_finished) = (stop.clone(), finished.clone());
        std::thread::Builder::new().name("zarrs_gpu-read-ahead".into()).spawn(move || {
            let run = catch_unwind(AssertUnwindSafe(|| {
                for group in groups {
                    if worker_stop.load(Ordering::Relaxed) {
                        return;
                    }
                    for result in read(group) {
                        worker_finished.fetch_add(1, Ordering::Release);
                        let failed = result.is_err();
                        // A send fails only when the consumer has gone: nothing more to read for.
                        if sender.send(Message::Read(result)).is_err() || failed {
                            return;
                        }
                    }
                }
            }));
            if let Err(panic) = run {
                worker_finished.fetch_add(1, Ordering::Release);
                let _ = sender.send(Message::Panicked(panic));
            }
        })?;
        Ok(Self { receiver: Some(receiver), stop, finished, taken: 0 })
    }
}

impl<R, E> Prefetch<R, E> {
    /// Results finished and not yet taken.
    fn ready(&self) -> usize {
        self.finished.load(Ordering::Acquire).saturating_sub(self.taken)
    }

    /// End the iteration: the worker stops after its current read.
    fn end(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.receiver = None;
    }
}

impl<R, E> Prefetch<R, E> {
    /// As [`Iterator::next`], waiting at most `timeout`: `Poll::Pending` when no result came in
    /// that time (nothing is lost: a later call takes it).
    fn next_timeout(&mut self, timeout: Duration) -> Poll<Option<Result<R, E>>> {
        let Some(receiver) = self.receiver.as_ref() else { return Poll::Ready(None) };
        match receiver.recv_timeout(timeout) {
            Ok(message) => Poll::Ready(self.hand_out(Ok(message))),
            Err(RecvTimeoutError::Timeout) => Poll::Pending,
            Err(RecvTimeoutError::Disconnected) => Poll::Ready(self.hand_out(Err(()))),
        }
    }

    /// What a message received (or the worker's end, `Err`) hands out.
    fn hand_out(&mut self, message: Result<Message<R, E>, ()>) -> Option<Result<R, E>> {
        match message {
            Ok(Message::Read(result)) => {
                self.taken += 1;
                if result.is_err() {
                    self.end();
                }
                Some(result)
            }
            Ok(Message::Panicked(panic)) => {
                self.end();
                resume_unwind(panic)
            }
            // The worker ran out of reads.
            Err(()) => {
                self.receiver = None;
                None
            }
        }
    }
}

impl<R, E> Iterator for Prefetch<R, E> {
    type Item = Result<R, E>;

    fn next(&mut self) -> Option<Self::Item> {
        let message = self.receiver.as_ref()?.recv().map_err(|_| ());
        self.hand_out(message)
    }
}

impl<R, E> Drop for Prefetch<R, E> {
    fn drop(&mut self) {
        // Dropping the receiver fails the worker's next send (also one blocked now); the flag
        // keeps it from starting a read when the queue had room.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The worker could not be started.
fn spawn_error(err: &std::io::Error) -> GpuError {
    GpuError::Read(DeviceReadError::ThreadPool(format!("the read-ahead thread: {err}")))
}

/// A request of [`ReadAhead`] holds at most this many bytes of results (and at most its depth of
/// subsets): enough for the device's batch rate (32 crops of 16 MiB, 512 MiB, read as one request
/// in 53 ms on an H200 against 254 ms one at a time), bounded beside what the caller holds.
pub const READ_AHEAD_REQUEST_BYTES: u64 = 1 << 30;

/// Consecutive subsets taken as one request: up to `count` of them and `budget` bytes of `elem`
/// byte elements (the first alone whatever its size), from `subsets` as the reads go.
struct Requests<I: Iterator<Item = ArraySubset>> {
    subsets: std::iter::Peekable<I>,
    count: usize,
    budget: u64,
    elem: u64,
}

impl<I: Iterator<Item = ArraySubset>> Iterator for Requests<I> {
    type Item = Vec<ArraySubset>;

    fn next(&mut self) -> Option<Vec<ArraySubset>> {
        let bytes = |s: &ArraySubset| s.num_elements().saturating_mul(self.elem);
        let first = self.subsets.next()?;
        let mut total = bytes(&first);
        let mut group = vec![first];
        while group.len() < self.count {
            let Some(next) = self.subsets.peek() else { break };
            let more = total.saturating_add(bytes(next));
            if more > self.budget {
                break;
            }
            total = more;
            group.extend(self.subsets.next());
        }
        Some(group)
    }
}

/// The requests of a list of subsets ([`Requests`]), made where they are iterated: the worker
/// thread takes the subsets from their iterator as the reads go.
struct RequestPlan<I> {
    subsets: I,
    count: usize,
    budget: u64,
    elem: u64,
}

impl<I: IntoIterator<Item = ArraySubset>> IntoIterator for RequestPlan<I> {
    type Item = Vec<ArraySubset>;
    type IntoIter = Requests<I::IntoIter>;

    fn into_iter(self) -> Self::IntoIter {
        let Self { subsets, count, budget, elem } = self;
        Requests { subsets: subsets.into_iter().peekable(), count, budget, elem }
    }
}

/// A tile read: the subset, its data on the device, and how it was read.
pub type TileRead<O> = (ArraySubset, O, RetrieveReport);

/// An iterator over reads of a list of subsets that keeps the next reads in flight while the
/// caller uses the current one.
///
/// A background thread reads the subsets in requests of up to `depth` consecutive ones (and at
/// most [`READ_AHEAD_REQUEST_BYTES`]), each as one read
/// ([`ArrayDeviceExt::retrieve_array_subsets_device_opt`]: a chunk that several of them meet read
/// and decoded once, at the device's batch rate rather than one read's latency; an
/// `Array<GdsStore>` takes the GPUDirect Storage or pread path), and queues the results; the
/// iterator hands them out in the order of the subsets, each with its request's report. Up to
/// `depth` finished results wait in the queue while the next request is read: the device memory
/// in use is up to `2 * depth` tiles beyond those the caller holds. A larger `depth` makes larger
/// requests. Each result ([`DeviceBytes`](crate::DeviceBytes), or a typed [`DeviceArray`](crate::DeviceArray)) is
/// complete when handed out (its read synchronized), so any stream may use it at once.
///
/// The first error is yielded and ends the iteration: a request that fails is read again one
/// subset at a time, so the results before the failing subset come first, then its own error. Dropping the iterator stops the thread after
/// its current read; the drop does not wait for that read (the thread holds only the array's
/// `Arc`, the configuration and the subsets, and exits on its own). A panic in a read is raised
/// again by [`Iterator::next`].
///
/// The configuration is `config`, not the calling thread's GPU mode scope
/// ([`with_gpu_config`](crate::with_gpu_config)), which the worker thread does not see.
///
/// ```no_run
/// use std::sync::Arc;
/// use zarrs::array::Array;
/// use zarrs_gds_store::GdsStore;
/// use zarrs_gpu_codecs::{tile_subsets, DeviceArray, GpuConfig, ReadAhead, TileOrder};
///
/// let array = Arc::new(Array::open(Arc::new(GdsStore::new("volume.zarr")?), "/")?);
/// let tiles = tile_subsets(array.shape(), &[64, 512, 512], TileOrder::C)?;
/// for read in ReadAhead::<DeviceArray<f32>>::new(array, tiles, GpuConfig::from_env()?, 2) {
///     let (subset, tile, _report) = read?;
///     // ... kernels on `tile` while the next tiles are read
///     println!("{subset}: {:?}", tile.shape());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ReadAhead<O> {
    state: State<TileRead<O>>,
}

/// A [`ReadAhead`]'s reads: running, or a worker that could not start (its error, once).
enum State<R> {
    Running(Prefetch<R, GpuError>),
    NotStarted(Option<GpuError>),
}

impl<R: Send + 'static> State<R> {
    fn start<I, F>(groups: I, depth: usize, read: F) -> Self
    where
        I: IntoIterator + Send + 'static,
        F: FnMut(I::Item) -> Vec<Result<R, GpuError>> + Send + 'static,
    {
        match Prefetch::start_grouped(groups, depth, read) {
            Ok(prefetch) => Self::Running(prefetch),
            Err(err) => Self::NotStarted(Some(spawn_error(&err))),
        }
    }
}

impl<R> State<R> {
    fn next(&mut self) -> Option<Result<R, GpuError>> {
        match self {
            Self::Running(prefetch) => prefetch.next(),
            Self::NotStarted(err) => err.take().map(Err),
        }
    }

    fn next_timeout(&mut self, timeout: Duration) -> Poll<Option<Result<R, GpuError>>> {
        match self {
            Self::Running(prefetch) => prefetch.next_timeout(timeout),
            Self::NotStarted(err) => Poll::Ready(err.take().map(Err)),
        }
    }

    fn ready(&self) -> usize {
        match self {
            Self::Running(prefetch) => prefetch.ready(),
            Self::NotStarted(err) => usize::from(err.is_some()),
        }
    }
}

impl<O: FromDeviceBytes + Send + 'static> ReadAhead<O> {
    /// Start reading `subsets` of `array` into `O`s with `config`, at most `depth` results ahead
    /// of the caller (a `depth` of 0 counts as 1; the queue's `depth` slots are allocated at
    /// once). The subsets are taken from their iterator on the worker thread, as reads go: a lazy
    /// iterator works.
    pub fn new<S, I>(array: Arc<Array<S>>, subsets: I, config: GpuConfig, depth: usize) -> Self
    where
        S: ReadableStorageTraits + ?Sized + 'static,
        Array<S>: Send + Sync,
        I: IntoIterator<Item = ArraySubset> + Send + 'static,
    {
        let one = |array: &Array<S>, subset: ArraySubset, config: &GpuConfig| {
            array.retrieve_array_subset_device_opt::<O>(&subset, config).map(|(data, report)| (subset, data, report))
        };
        // A request's bytes, counted in the array's elements (none: one subset a request).
        let elem = array.data_type().fixed_size().map_or(u64::MAX, |n| n as u64);
        let read = move |group: Vec<ArraySubset>| -> Vec<Result<TileRead<O>, GpuError>> {
            if group.len() == 1 {
                return group.into_iter().map(|subset| one(&array, subset, &config)).collect();
            }
            if let Ok((arrays, report)) = array.retrieve_array_subsets_device_opt::<O>(&group, &config) {
                return group
                    .into_iter()
                    .zip(arrays)
                    .map(|(subset, data)| Ok((subset, data, report.clone())))
                    .collect();
            }
            // One at a time: the results before the failing subset, then its own error.
            let mut results = Vec::with_capacity(group.len());
            for subset in group {
                let result = one(&array, subset, &config);
                let failed = result.is_err();
                results.push(result);
                if failed {
                    break;
                }
            }
            results
        };
        let requests = RequestPlan { subsets, count: depth.max(1), budget: READ_AHEAD_REQUEST_BYTES, elem };
        Self { state: State::start(requests, depth, read) }
    }

    /// Results finished and waiting to be taken (a `next` that will not block when above 0).
    pub fn ready(&self) -> usize {
        self.state.ready()
    }
}

impl<O> ReadAhead<O> {
    /// As [`Iterator::next`], waiting at most `timeout`: `Poll::Pending` when the next result did
    /// not come in that time (it stays in flight; a later call takes it). A caller that must
    /// answer meanwhile (a Python interpreter's Ctrl-C, a closing flag) waits in slices.
    pub fn next_timeout(&mut self, timeout: Duration) -> Poll<Option<Result<TileRead<O>, GpuError>>> {
        self.state.next_timeout(timeout)
    }
}

impl<O> Iterator for ReadAhead<O> {
    type Item = Result<TileRead<O>, GpuError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.state.next()
    }
}

// Once ended (the reads ran out, an error, a panic), `next` stays None.
impl<O> std::iter::FusedIterator for ReadAhead<O> {}

impl<O> std::fmt::Debug for ReadAhead<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ended = match &self.state {
            State::Running(prefetch) => prefetch.receiver.is_none(),
            State::NotStarted(err) => err.is_none(),
        };
        f.debug_struct("ReadAhead").field("ended", &ended).finish_non_exhaustive()
    }
}

/// One read started on a background thread ([`read_async`]); [`PendingRead::wait`] takes its
/// result. Dropping it without waiting lets the read finish and drops its result.
pub struct PendingRead<O> {
    state: State<TileRead<O>>,
}

/// Start reading `subset` of `array` into an `O` with `config` on a background thread, and
/// return at once. The configuration is `config`, not the calling thread's GPU mode scope.
pub fn read_async<O, S>(array: Arc<Array<S>>, subset: ArraySubset, config: GpuConfig) -> PendingRead<O>
where
    O: FromDeviceBytes + Send + 'static,
    S: ReadableStorageTraits + ?Sized + 'static,
    Array<S>: Send + Sync,
{
    PendingRead { state: ReadAhead::<O>::new(array, [subset], config, 1).state }
}

impl<O> PendingRead<O> {
    /// Whether the read has finished: [`Self::wait`] returns at once.
    pub fn is_done(&self) -> bool {
        match &self.state {
            State::Running(prefetch) => prefetch.finished.load(Ordering::Acquire) > 0,
            State::NotStarted(_) => true,
        }
    }

    /// Wait for the read; its result (complete on the device) and how it was read.
    ///
    /// # Errors
    /// The read's error, or the thread's that could not start.
    pub fn wait(mut self) -> Result<(O, RetrieveReport), GpuError> {
        Self::result_of(self.state.next())
    }

    /// [`Self::wait`] for at most `timeout`: `Poll::Pending` when the read has not finished by
    /// then (it goes on; a later call takes its result). Once it has returned `Poll::Ready`,
    /// later calls return an error saying the result was taken.
    ///
    /// # Errors
    /// As [`Self::wait`].
    pub fn wait_timeout(&mut self, timeout: Duration) -> Poll<Result<(O, RetrieveReport), GpuError>> {
        self.state.next_timeout(timeout).map(Self::result_of)
    }

    fn result_of(result: Option<Result<TileRead<O>, GpuError>>) -> Result<(O, RetrieveReport), GpuError> {
        match result {
            Some(result) => result.map(|(_, data, report)| (data, report)),
            // The worker sends one result or panics (raised by `next`); a second call after it.
            None => Err(GpuError::Read(DeviceReadError::ThreadPool(
                "the read's thread ended without a result (or it was taken)".into(),
            ))),
        }
    }
}

impl<O> std::fmt::Debug for PendingRead<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRead").field("done", &self.is_done()).finish()
    }
}

#[cfg(test)]
mod tests;
