//! `ReadAhead` and `PendingRead`: reads in flight while the caller uses earlier ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, TryLockError};
use std::task::Poll;
use std::time::Instant;

use pyo3::exceptions::{PyRuntimeError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use zarrs_gpu::GpuError;

use crate::device_array::PyDeviceArray;
use crate::reads::{PendingTile, Read, TileReads};
use crate::util::{deadline_of, lock, py_err_in, subset_key, subset_text, WAIT_SLICE};

/// Reads kept in flight on a background thread while the caller uses earlier ones
/// (`zarrs_gpu.tiles`, `Array.read_ahead`): iterating yields `(key, DeviceArray)` in order.
#[pyclass(name = "ReadAhead", module = "zarrs_gpu", frozen)]
pub(crate) struct PyReadAhead {
    /// None once the reads have ended or been closed. Held by `__next__` one [`WAIT_SLICE`] at a
    /// time, never by `close`, which only tries it.
    pub(crate) reads: Mutex<Option<TileReads>>,
    /// `close` was called: the next to hold `reads` drops them.
    pub(crate) closed: AtomicBool,
    pub(crate) types: (&'static str, Option<&'static str>),
    pub(crate) count: usize,
    pub(crate) prefetch: usize,
}

#[pymethods]
impl PyReadAhead {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next read's key (a tuple of slices) and array, waiting without the interpreter lock
    /// while it is read (Ctrl-C interrupts the wait; the read goes on, and a later call takes
    /// it). A failed read raises (its message names the box) and ends the iteration.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyTuple>, PyDeviceArray)>> {
        let next = loop {
            let next = py.allow_threads(|| {
                let mut reads = lock(&self.reads);
                if self.closed.load(Ordering::Acquire) {
                    // Closed while another call waited: the reads go here.
                    *reads = None;
                }
                let Some(open) = reads.as_mut() else { return Poll::Ready(None) };
                let next = open.next_read(WAIT_SLICE);
                if matches!(next, Poll::Ready(ref n) if !matches!(n, Some((_, Ok(_))))) {
                    // Ended, or an error (which ends it): the reads' thread and queue go now.
                    *reads = None;
                }
                next
            });
            // A close that found the lock held while this waited left the reads to this call.
            self.drop_if_closed(py);
            match next {
                Poll::Ready(next) => break next,
                Poll::Pending => py.check_signals()?,
            }
        };
        match next {
            None => Ok(None),
            Some((subset, Ok((data, report)))) => {
                Ok(Some((subset_key(py, &subset)?, PyDeviceArray::new(data, self.types, report))))
            }
            Some((subset, Err(err))) => Err(py_err_in(&err, Some(&subset_text(&subset)))),
        }
    }

    /// Stop: no further read starts, the one in progress finishes on its own and the arrays read
    /// ahead are dropped (those already handed out stay valid). Iterating after it ends at once.
    /// Never waits for a read, also while another thread waits in `__next__` (whose call then
    /// ends the iteration).
    fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::Release);
        self.drop_if_closed(py);
    }

    fn __repr__(&self) -> String {
        let open = match self.reads.try_lock() {
            Ok(reads) => reads.is_some(),
            Err(TryLockError::Poisoned(reads)) => reads.into_inner().is_some(),
            Err(TryLockError::WouldBlock) => true,
        };
        format!(
            "zarrs_gpu.ReadAhead(reads={}, prefetch={}, dtype={}{})",
            self.count,
            self.prefetch,
            self.types.0,
            if open { "" } else { ", ended" }
        )
    }
}

impl PyReadAhead {
    /// After `close`: drop the reads (the queue's arrays; that may wait for the device, so
    /// without the interpreter lock) unless another thread holds them, which then does.
    fn drop_if_closed(&self, py: Python<'_>) {
        if !self.closed.load(Ordering::Acquire) {
            return;
        }
        py.allow_threads(|| {
            let taken = match self.reads.try_lock() {
                Ok(mut reads) => reads.take(),
                Err(TryLockError::Poisoned(reads)) => reads.into_inner().take(),
                Err(TryLockError::WouldBlock) => None,
            };
            drop(taken);
        });
    }
}

/// Where a `PendingRead` is.
pub(crate) enum Pending {
    /// The read runs (or has finished, untaken).
    Running(PendingTile),
    /// Its result, taken from the thread and not yet a Python object.
    Finished(Result<Read, GpuError>),
    /// The result `result()` returns, every time.
    Taken(Result<Py<PyDeviceArray>, PyErr>),
    /// Between states; left only by a panic in the wait.
    Gone,
}

/// One read running on a background thread (`Array.read_async`): `result()` waits for it.
#[pyclass(name = "PendingRead", module = "zarrs_gpu", frozen)]
pub(crate) struct PyPendingRead {
    pub(crate) state: Mutex<Pending>,
    pub(crate) types: (&'static str, Option<&'static str>),
    /// The box read, for errors.
    pub(crate) what: String,
}

#[pymethods]
impl PyPendingRead {
    /// Whether the read has finished (`result()` then returns without waiting for it). Never
    /// blocks: while another thread is inside `result()`, False.
    fn done(&self) -> bool {
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(state)) => state.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        match &*state {
            Pending::Running(read) => read.is_done(),
            _ => true,
        }
    }

    /// The array read (the same object on every call), waiting without the interpreter lock
    /// until the read has finished; a failed read raises its error (every call). With `timeout`
    /// (seconds), a read not finished by then raises TimeoutError and goes on (a later call takes
    /// it), as `concurrent.futures.Future.result` does. Ctrl-C interrupts the wait the same way.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyDeviceArray>> {
        let deadline = deadline_of(timeout)?;
        loop {
            let slice = deadline.map_or(WAIT_SLICE, |d| d.saturating_duration_since(Instant::now()).min(WAIT_SLICE));
            let finished = py.allow_threads(|| {
                let mut state = lock(&self.state);
                if let Pending::Running(read) = &mut *state {
                    if let Poll::Ready(read) = read.wait(slice) {
                        *state = Pending::Finished(read);
                    }
                }
                !matches!(*state, Pending::Running(_))
            });
            if finished {
                break;
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(PyTimeoutError::new_err(format!(
                    "reading {}: not finished within {} s (it goes on: call result() again)",
                    self.what,
                    timeout.unwrap_or_default()
                )));
            }
        }
        let mut state = lock(&self.state);
        if matches!(*state, Pending::Finished(_)) {
            if let Pending::Finished(read) = std::mem::replace(&mut *state, Pending::Gone) {
                let taken = match read {
                    Ok((data, report)) => Py::new(py, PyDeviceArray::new(data, self.types, report)),
                    Err(err) => Err(py_err_in(&err, Some(&self.what))),
                };
                *state = Pending::Taken(taken);
            }
        }
        match &*state {
            Pending::Taken(Ok(array)) => Ok(array.clone_ref(py)),
            Pending::Taken(Err(err)) => Err(err.clone_ref(py)),
            _ => Err(PyRuntimeError::new_err(format!("reading {}: the read's thread panicked", self.what))),
        }
    }

    fn __repr__(&self) -> String {
        let done = if self.done() { "True" } else { "False" };
        format!("zarrs_gpu.PendingRead({}, dtype={}, done={done})", self.what, self.types.0)
    }
}
