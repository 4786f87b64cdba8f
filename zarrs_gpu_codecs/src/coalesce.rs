//! Reads from many threads gathered into requests (a thread pool, Dask's threaded scheduler, a
//! server): while a request is in flight, reads that arrive wait in a queue; when it ends, the
//! first of them reads the whole queue as one request, planned once, a chunk that several meet
//! read and decoded once, and each read gets its own result.
//!
//! A read that arrives when no request is in flight starts at once: it never waits for others.
//! A window ([`GpuConfig::with_coalesce_window`]) lets a read that arrives within it of the last
//! request's end (reads are streaming in) wait that long for others to join it first.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use zarrs::array::{Array, ArraySubset};
use zarrs::storage::ReadableStorageTraits;

use crate::config::GpuConfig;
use crate::device_array::FromDeviceBytes;
use crate::error::GpuError;
use crate::report::RetrieveReport;
use crate::retrieve::{check_subset, ArrayDeviceExt};

/// Gathers reads of keys `K` (subsets) into requests; `R` is one read's result. Every read of one
/// coalescer must be served by the same request function (one array, one configuration).
pub struct Coalescer<K, R> {
    window: Duration,
    state: Mutex<State<K, R>>,
    /// Requests of several reads that failed (each read then made alone), and the last error.
    failures: Mutex<(usize, Option<String>)>,
}

struct State<K, R> {
    /// A request is in flight (or its leader is gathering).
    running: bool,
    queue: Vec<Arc<Waiter<K, R>>>,
    /// When the last request ended.
    last_end: Option<Instant>,
}

/// One read waiting for its turn.
struct Waiter<K, R> {
    key: K,
    turn: Mutex<Turn<K, R>>,
    changed: Condvar,
}

enum Turn<K, R> {
    Waiting,
    /// Read these (this read first) as one request.
    Lead(Vec<Arc<Waiter<K, R>>>),
    /// The read's result, and how many reads its request served.
    Done(R, usize),
    /// The request failed: read alone, so that the error is this read's own.
    Alone,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<K: Clone, R> Coalescer<K, R> {
    /// A coalescer whose reads wait up to `window` for others while reads are streaming in
    /// (zero: a read waits only for the request in flight).
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            state: Mutex::new(State { running: false, queue: Vec::new(), last_end: None }),
            failures: Mutex::new((0, None)),
        }
    }

    /// How many requests of several reads failed (their reads were then made alone, each with
    /// its own result), and the last one's error. A request fails as a whole where one of its
    /// reads would fail alone; a failure with reads that succeed alone is a bug of the request
    /// path, which this makes visible.
    #[must_use]
    pub fn failures(&self) -> (usize, Option<String>) {
        lock(&self.failures).clone()
    }

    /// The window reads wait for others while reads are streaming in.
    #[must_use]
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Read `key`, alone or with the reads that queued meanwhile: `many` gets every key of a
    /// request (this one or another thread's) and returns one result per key, in order. Returns
    /// this read's result and how many reads its request served.
    ///
    /// # Errors
    /// This read's own error: when a request of several fails, each of its reads is made again
    /// alone.
    ///
    /// # Panics
    /// Where `many` panics on this thread's request (the other reads of it are made alone).
    pub fn read<E: std::fmt::Display>(
        &self,
        key: K,
        many: impl Fn(&[K]) -> Result<Vec<R>, E>,
    ) -> Result<(R, usize), E> {
        let me = Arc::new(Waiter { key, turn: Mutex::new(Turn::Waiting), changed: Condvar::new() });
        let mut state = lock(&self.state);
        if state.running {
            state.queue.push(Arc::clone(&me));
            drop(state);
            let mut turn = lock(&me.turn);
            while matches!(*turn, Turn::Waiting) {
                turn = me.changed.wait(turn).unwrap_or_else(PoisonError::into_inner);
            }
            return match std::mem::replace(&mut *turn, Turn::Waiting) {
                Turn::Lead(batch) => {
                    drop(turn);
                    self.lead(&batch, &many)
                }
                Turn::Done(result, n) => Ok((result, n)),
                Turn::Alone | Turn::Waiting => {
                    drop(turn);
                    alone(&me.key, &many)
                }
            };
        }
        state.running = true;
        let streaming = state.last_end.is_some_and(|end| end.elapsed() < self.window);
        drop(state);
        if streaming {
            std::thread::sleep(self.window);
        }
        let batch: Vec<_> = std::iter::once(me).chain(lock(&self.state).queue.drain(..)).collect();
        self.lead(&batch, &many)
    }

    /// Read `batch` (this thread's read first) as one request, hand the queue to its first read,
    /// then give each read of the batch its result.
    fn lead<E: std::fmt::Display>(
        &self,
        batch: &[Arc<Waiter<K, R>>],
        many: &impl Fn(&[K]) -> Result<Vec<R>, E>,
    ) -> Result<(R, usize), E> {
        let keys: Vec<K> = batch.iter().map(|w| w.key.clone()).collect();
        let n = keys.len();
        let outcome = catch_unwind(AssertUnwindSafe(|| many(&keys)));
        // The next request starts before this one's results are handed out.
        self.hand_off();
        let give = |waiter: &Waiter<K, R>, turn: Turn<K, R>| {
            *lock(&waiter.turn) = turn;
            waiter.changed.notify_one();
        };
        match outcome {
            Ok(Ok(results)) if results.len() == n => {
                let mut results = results.into_iter();
                let own = results.next().expect("n >= 1");
                for (waiter, result) in batch[1..].iter().zip(results) {
                    give(waiter, Turn::Done(result, n));
                }
                Ok((own, n))
            }
            Ok(Err(err)) if n == 1 => Err(err),
            Ok(outcome) => {
                let why = match outcome {
                    Err(err) => format!("a request of {n} reads failed: {err}"),
                    Ok(results) => format!("a request of {n} reads gave {} results", results.len()),
                };
                let mut failures = lock(&self.failures);
                *failures = (failures.0 + 1, Some(why));
                drop(failures);
                for waiter in &batch[1..] {
                    give(waiter, Turn::Alone);
                }
                alone(&keys[0], many)
            }
            Err(panic) => {
                for waiter in &batch[1..] {
                    give(waiter, Turn::Alone);
                }
                resume_unwind(panic)
            }
        }
    }

    /// A request has ended: the reads queued meanwhile become the next request, led by the first.
    fn hand_off(&self) {
        let mut state = lock(&self.state);
        state.last_end = Some(Instant::now());
        if state.queue.is_empty() {
            state.running = false;
            return;
        }
        let next: Vec<_> = state.queue.drain(..).collect();
        drop(state);
        let leader = Arc::clone(&next[0]);
        *lock(&leader.turn) = Turn::Lead(next);
        leader.changed.notify_one();
    }
}

/// One read made alone.
fn alone<K, R, E>(key: &K, many: &impl Fn(&[K]) -> Result<Vec<R>, E>) -> Result<(R, usize), E>
where
    K: Clone,
{
    let mut results = many(std::slice::from_ref(key))?;
    // A request function that returns no result for a key is a bug of the caller's.
    assert!(results.len() == 1, "a request of one read returned {} results", results.len());
    Ok((results.remove(0), 1))
}

/// Reads of one array into device memory from many threads, gathered into requests (see the
/// module): a chunk that the subsets of several threads meet is read and decoded once. Each
/// result is a view of its request's allocation, which goes back to the pool once the last view
/// of it is dropped.
pub struct CoalescedReads<S: ?Sized, O> {
    array: Arc<Array<S>>,
    config: GpuConfig,
    coalescer: Coalescer<ArraySubset, (O, RetrieveReport)>,
}

impl<S: ReadableStorageTraits + ?Sized + 'static, O: FromDeviceBytes> CoalescedReads<S, O>
where
    Array<S>: ArrayDeviceExt,
{
    /// Reads of `array` with `config`, waiting up to its
    /// [`coalesce_window`](GpuConfig::coalesce_window) (none set: zero) for others while reads
    /// stream in.
    #[must_use]
    pub fn new(array: Arc<Array<S>>, config: GpuConfig) -> Self {
        let window = config.coalesce_window().unwrap_or_default();
        Self { array, config, coalescer: Coalescer::new(window) }
    }

    /// The array read.
    #[must_use]
    pub fn array(&self) -> &Arc<Array<S>> {
        &self.array
    }

    /// Requests of several reads that failed and were made again read by read, and the last
    /// error ([`Coalescer::failures`]).
    #[must_use]
    pub fn failures(&self) -> (usize, Option<String>) {
        self.coalescer.failures()
    }

    /// Retrieve `subset` into device memory, in one request with the reads of other threads
    /// that arrive while one is in flight. The report is the request's, and says how many reads
    /// it served ([`RetrieveReport::coalesced_reads`]).
    ///
    /// # Errors
    /// As [`ArrayDeviceExt::retrieve_array_subset_device_opt`], for this subset.
    pub fn retrieve_array_subset_device(&self, subset: &ArraySubset) -> Result<(O, RetrieveReport), GpuError> {
        // A subset the array cannot have is this read's error before it joins a request: it
        // would fail the request, and every read of it would be made again alone (the GPU test
        // of 24 threads shared no request in runs BR to BU for want of this check).
        check_subset(&self.array, subset, false)?;
        let many = |subsets: &[ArraySubset]| {
            let (arrays, report) = self.array.retrieve_array_subsets_device_opt::<O>(subsets, &self.config)?;
            Ok::<_, GpuError>(report.shared_by(arrays))
        };
        Ok(self.coalescer.read(subset.clone(), many)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceArray;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    /// A read's result in these tests: the doubled key and its request's size, or an error.
    type Reply = Result<(u64, usize), String>;

    /// Reads of `threads` threads started together, each of key `i`, through a request
    /// function that takes `ms` and doubles every key; returns each result and the requests'
    /// sizes.
    fn together(
        coalescer: &Coalescer<u64, u64>,
        threads: u64,
        ms: u64,
        fail: impl Fn(&[u64]) -> bool + Sync,
    ) -> (Vec<Reply>, Vec<usize>) {
        let sizes = Mutex::new(Vec::new());
        let barrier = Barrier::new(threads as usize);
        let many = |keys: &[u64]| {
            lock(&sizes).push(keys.len());
            std::thread::sleep(Duration::from_millis(ms));
            if fail(keys) {
                return Err(format!("request {keys:?} failed"));
            }
            Ok(keys.iter().map(|k| k * 2).collect())
        };
        let results = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let (barrier, many) = (&barrier, &many);
                    s.spawn(move || {
                        barrier.wait();
                        // Staggered a little so that one thread leads the first request.
                        std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 5 }));
                        coalescer.read(i, many)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (results, sizes.into_inner().unwrap())
    }

    #[test]
    fn reads_arriving_during_a_request_become_the_next_request_and_each_gets_its_own_result() {
        let coalescer = Coalescer::new(Duration::ZERO);
        let (results, sizes) = together(&coalescer, 8, 40, |_| false);
        for (i, result) in results.iter().enumerate() {
            assert_eq!(result.as_ref().map(|r| r.0), Ok(2 * i as u64));
        }
        // The first read alone, the seven that arrived while it ran as one request.
        assert_eq!(sizes, vec![1, 7]);
        assert_eq!(results[0], Ok((0, 1)));
        assert!(results[1..].iter().all(|r| r.as_ref().map(|r| r.1) == Ok(7)));
        assert!(!lock(&coalescer.state).running && lock(&coalescer.state).queue.is_empty());
    }

    #[test]
    fn a_failed_request_reads_each_again_alone_and_errors_are_their_own() {
        let coalescer = Coalescer::new(Duration::ZERO);
        // Requests of several fail, as does key 3 alone.
        let (results, sizes) = together(&coalescer, 6, 30, |keys| keys.len() > 1 || keys == [3]);
        for (i, result) in results.iter().enumerate() {
            if i == 3 {
                assert_eq!(result, &Err("request [3] failed".to_string()));
            } else {
                assert_eq!(result, &Ok((2 * i as u64, 1)));
            }
        }
        assert_eq!(sizes.iter().filter(|&&n| n > 1).count(), 1, "{sizes:?}");
        assert_eq!(sizes.iter().filter(|&&n| n == 1).count(), 6, "{sizes:?}");
        let (count, last) = coalescer.failures();
        assert_eq!(count, 1);
        assert!(last.is_some_and(|why| why.starts_with("a request of 5 reads failed: request [")));
    }

    #[test]
    fn a_panicking_request_leaves_the_others_to_read_alone() {
        let coalescer = Coalescer::new(Duration::ZERO);
        let panics = AtomicUsize::new(0);
        let barrier = Barrier::new(4);
        let many = |keys: &[u64]| -> Result<Vec<u64>, String> {
            std::thread::sleep(Duration::from_millis(30));
            if keys.len() > 1 {
                panics.fetch_add(1, Ordering::SeqCst);
                panic!("a request of {} reads", keys.len());
            }
            Ok(keys.iter().map(|k| k + 100).collect())
        };
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u64)
                .map(|i| {
                    let (barrier, many, coalescer) = (&barrier, &many, &coalescer);
                    s.spawn(move || {
                        barrier.wait();
                        std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 5 }));
                        coalescer.read(i, many)
                    })
                })
                .collect();
            handles.into_iter().map(std::thread::ScopedJoinHandle::join).collect()
        });
        assert_eq!(panics.load(Ordering::SeqCst), 1);
        // The leader of the request that panicked panics; the others read alone.
        assert_eq!(results.iter().filter(|r| r.is_err()).count(), 1);
        for (i, r) in results.iter().enumerate() {
            if let Ok(r) = r {
                assert_eq!(r, &Ok((i as u64 + 100, 1)));
            }
        }
        assert!(!lock(&coalescer.state).running);
    }

    /// `CoalescedReads` end to end on a device that cannot be had: a lone read is its own error,
    /// the threads that follow within the window are gathered into one request, which fails, so
    /// each is made again alone and gets its own error; a subset out of bounds never joins.
    #[test]
    fn coalesced_reads_gather_threads_and_give_each_its_own_error() {
        let store = Arc::new(zarrs_storage::store::MemoryStore::new());
        let array = zarrs::array::ArrayBuilder::new(
            vec![40, 96],
            vec![8, 16],
            zarrs::array::data_type::float32(),
            zarrs::array::FillValue::from(0f32),
        )
        .build(store, "/")
        .unwrap();
        // A long window: the threads gather behind the first however slowly a loaded host starts them.
        let config = GpuConfig::default().with_device(4096).with_coalesce_window(Some(Duration::from_secs(2)));
        let reads = CoalescedReads::<_, DeviceArray<f32>>::new(Arc::new(array), config);
        let subset = |i: u64| ArraySubset::new_with_ranges(&[i..i + 4, 0..16]);
        assert!(reads.retrieve_array_subset_device(&subset(0)).is_err());
        assert_eq!(reads.failures().0, 0, "a lone read is no request of several");
        let barrier = Barrier::new(9);
        let errors: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..9u64)
                .map(|i| {
                    let (reads, barrier) = (&reads, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        // The ninth reaches past the array's edge.
                        let subset = if i == 8 { ArraySubset::new_with_ranges(&[38..42, 0..4]) } else { subset(i) };
                        reads.retrieve_array_subset_device(&subset).map(|_| ()).unwrap_err().to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(errors[..8].iter().all(|e| e.contains("4096") || e.to_lowercase().contains("cuda")), "{errors:?}");
        assert!(errors[8].contains("not compatible"), "the subset out of bounds is refused first: {}", errors[8]);
        let (count, last) = reads.failures();
        assert_eq!(count, 1, "one request of the eight: {last:?}");
        assert!(last.as_ref().is_some_and(|why| why.starts_with("a request of 8 reads failed")), "{last:?}");
    }

    #[test]
    fn a_lone_read_never_waits_for_the_window_and_a_streaming_one_gathers_others() {
        let coalescer = Coalescer::new(Duration::from_millis(300));
        let many = |keys: &[u64]| Ok::<_, String>(keys.to_vec());
        let start = Instant::now();
        assert_eq!(coalescer.read(1, many), Ok((1, 1)));
        assert!(start.elapsed() < Duration::from_millis(150), "a lone read waited {:?}", start.elapsed());
        // Right after a request: the next read waits the window, and one arriving meanwhile
        // joins its request.
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| coalescer.read(2, many));
            std::thread::sleep(Duration::from_millis(100));
            let b = s.spawn(|| coalescer.read(3, many));
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!((a, b), (Ok((2, 2)), Ok((3, 2))));
        assert!(start.elapsed() >= Duration::from_millis(300));
    }
}
