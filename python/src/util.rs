//! Errors, locks and waits that the interpreter can interrupt.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PySlice, PyTuple};
use zarrs::array::ArraySubset;
use zarrs_gpu::GpuError;
use zarrs_gpu_codecs::Cancel;

/// A Rust error as the Python exception a Python user expects, with the same message.
#[allow(clippy::needless_pass_by_value)] // used as `.map_err(py_err)`
pub(crate) fn py_err(err: GpuError) -> PyErr {
    py_err_in(&err, None)
}

/// [`py_err`], the message prefixed with what was being read (a tile among many).
pub(crate) fn py_err_in(err: &GpuError, reading: Option<&str>) -> PyErr {
    let message = match reading {
        Some(what) => format!("reading {what}: {err}"),
        None => err.to_string(),
    };
    match err {
        GpuError::ElementType { .. } => PyTypeError::new_err(message),
        GpuError::Config { .. } | GpuError::Overflow(_) | GpuError::Unsupported(_) => PyValueError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

/// A box as numpy's slices print, `[0:10, 24:48]`: what an error names.
pub(crate) fn subset_text(subset: &ArraySubset) -> String {
    let ranges: Vec<String> = subset.to_ranges().iter().map(|r| format!("{}:{}", r.start, r.end)).collect();
    format!("[{}]", ranges.join(", "))
}

/// A box as a key: a tuple of Python slices (`array[key]` selects it again).
pub(crate) fn subset_key<'py>(py: Python<'py>, subset: &ArraySubset) -> PyResult<Bound<'py, PyTuple>> {
    // Python ints: a bound of 2^63 or more has no isize.
    let slice = py.get_type::<PySlice>();
    let slices = subset.to_ranges().iter().map(|r| slice.call1((r.start, r.end))).collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, slices)
}

/// A lock, also after a panic in a holder (the states it guards stay consistent).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long a wait for a read goes without looking for Python's signals (Ctrl-C): well under
/// the second a user waits before pressing it again, and the wake-ups cost nothing beside a read.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(50);

/// How long an interrupted `read_into` gets to stop (at its next stage, [`Cancel`]) before
/// KeyboardInterrupt is raised without it: a read between stages stops within a batch, one
/// waiting on storage (a remote server retrying) may not.
pub(crate) const STOP_WAIT: Duration = Duration::from_millis(500);

/// Run `work` on a thread of its own and wait for it in slices of [`WAIT_SLICE`] without the
/// interpreter lock, looking for Python's signals between them: Ctrl-C during a long or
/// retrying read raises KeyboardInterrupt at once, not when the read returns. A read given
/// `stop` (its configuration's [`Cancel`] and a wait) is told to stop, and waited for that long
/// (a second Ctrl-C ends the wait): one that stopped writes nothing more (into a caller's `out`,
/// say). Interrupted work goes on to its next stage, or its end, on its thread, which then drops
/// its result (device memory goes back to the pool there; nothing else holds it).
pub(crate) fn interruptible<R: Send + 'static>(
    py: Python<'_>,
    stop: Option<(&Cancel, Duration)>,
    work: impl FnOnce() -> R + Send + 'static,
) -> PyResult<R> {
    let (done, result) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("zarrs_gpu-read".into())
        .spawn(move || {
            // A caller gone (interrupted) fails the send: the result is dropped here.
            let _ = done.send(catch_unwind(AssertUnwindSafe(work)));
        })
        .map_err(|err| PyRuntimeError::new_err(format!("starting the read's thread: {err}")))?;
    let mut result = result;
    loop {
        // The receiver moves in and out: it is Send, not Sync.
        let (got, back) = py.allow_threads(move || (result.recv_timeout(WAIT_SLICE), result));
        result = back;
        match got {
            Ok(Ok(out)) => return Ok(out),
            // As if the work had run here.
            Ok(Err(panic)) => resume_unwind(panic),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(interrupt) = py.check_signals() {
                    if let Some((cancel, wait)) = stop {
                        cancel.cancel();
                        wait_for_stop(py, result, wait);
                    }
                    return Err(interrupt);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err("the read's thread ended without a result"))
            }
        }
    }
}

/// After a cancel, wait up to `wait` (in slices, without the interpreter lock) for the work to
/// end, whatever its result (dropped here); a second Ctrl-C ends the wait.
pub(crate) fn wait_for_stop<R: Send + 'static>(
    py: Python<'_>,
    mut result: Receiver<std::thread::Result<R>>,
    wait: Duration,
) {
    let until = Instant::now() + wait;
    while Instant::now() < until && py.check_signals().is_ok() {
        let (got, back) = py.allow_threads(move || (result.recv_timeout(WAIT_SLICE), result));
        result = back;
        if !matches!(got, Err(RecvTimeoutError::Timeout)) {
            return;
        }
    }
}

/// `timeout` as `concurrent.futures` takes it: None (or infinity) waits for good, a negative one
/// as 0; NaN is refused.
pub(crate) fn deadline_of(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_nan() => Err(PyValueError::new_err("timeout=nan: a timeout is a number of seconds or None")),
        // Beyond what an Instant holds: for good.
        Some(t) => Ok(Duration::try_from_secs_f64(t.max(0.0)).ok().and_then(|d| Instant::now().checked_add(d))),
    }
}

/// `len()` of an array of `shape`: its first extent, which Python wants below 2^63.
pub(crate) fn py_len(shape: &[u64]) -> PyResult<usize> {
    let n = shape.first().copied().unwrap_or(0);
    match isize::try_from(n) {
        Ok(n) => Ok(n.unsigned_abs()),
        Err(_) => Err(PyOverflowError::new_err(format!(
            "the first dimension has {n} elements; Python's len() must be below 2^63: use .shape[0]"
        ))),
    }
}

/// The `device` argument as a CUDA device ordinal (a negative one is a ValueError naming the
/// argument, not the OverflowError of an unsigned conversion).
pub(crate) fn device_ordinal(device: i128) -> PyResult<usize> {
    usize::try_from(device).map_err(|_| {
        PyValueError::new_err(format!("device={device}: a CUDA device ordinal is 0 or more (0 is the first GPU)"))
    })
}

extern "C" {
    // Not in the limited API's headers, but exported by every CPython since 3.4: the one way to
    // ask whether this thread holds the interpreter lock (a DLPack deleter may run on any thread).
    fn PyGILState_Check() -> std::os::raw::c_int;
}

/// The wrapper of every blocking wait of a release (a DLPack deleter, a dropped array): without
/// the interpreter lock where this thread holds it, so that other threads (one whose read is
/// timing out among them) go on while it waits.
pub(crate) fn release_wait(wait: &mut dyn FnMut()) {
    /// Takes the lock back when the wait ends, also on a panic.
    struct Restore(*mut pyo3::ffi::PyThreadState);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: the state PyEval_SaveThread returned on this thread.
            unsafe { pyo3::ffi::PyEval_RestoreThread(self.0) };
        }
    }
    // SAFETY: only read the runtime's and this thread's state. An interpreter finalizing (a read
    // left running after Ctrl-C, ending with the process) is not waited under.
    if unsafe { pyo3::ffi::Py_IsInitialized() } != 0 && unsafe { PyGILState_Check() } == 1 {
        // SAFETY: this thread holds the lock; `Restore` takes it back on this thread, and the
        // wait touches no Python object.
        let _restore = Restore(unsafe { pyo3::ffi::PyEval_SaveThread() });
        wait();
    } else {
        wait();
    }
}
