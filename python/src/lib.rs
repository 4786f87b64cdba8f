//! Python bindings of zarrs_gpu: `zarrs_gpu.read` and `zarrs_gpu.open` load Zarr arrays straight
//! into GPU memory and return device arrays that CuPy, PyTorch and any DLPack or CUDA array
//! interface consumer take without a copy.

use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::Poll;
use std::time::{Duration, Instant};

use dlpark::{SafeManagedTensor, SafeManagedTensorVersioned};
use pyo3::exceptions::{
    PyBufferError, PyFileNotFoundError, PyImportError, PyIndexError, PyOverflowError, PyRuntimeError, PyTimeoutError,
    PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyEllipsis, PyFloat, PySlice, PyString, PyTuple};
use zarrs::array::{Array, ArraySubset, ElementOwned};
use zarrs_gds_store::AnyStore;
use zarrs_gpu::subset::IndexItem;
use zarrs_gpu::zarrs_gpu_codecs::tile_subsets;
use zarrs_gpu::zarrs_gpu_codecs::TileOrder;
use zarrs_gpu::{
    read_async, ArrayDeviceExt, ArrayDeviceWriteExt, DecodeTrust, DeviceArray, GpuConfig, GpuError, IoBackend,
    PendingRead, ReadAhead, RetrieveReport, ShardIndexCache, WritePath, WriteReport,
};
use zarrs_gpu_codecs::{Cancel, Coalescer, DlpackStream};

/// DLPack's device type of CUDA memory.
const KDL_CUDA: i32 = 2;

/// A Rust error as the Python exception a Python user expects, with the same message.
#[allow(clippy::needless_pass_by_value)] // used as `.map_err(py_err)`
fn py_err(err: GpuError) -> PyErr {
    py_err_in(&err, None)
}

/// [`py_err`], the message prefixed with what was being read (a tile among many).
fn py_err_in(err: &GpuError, reading: Option<&str>) -> PyErr {
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
fn subset_text(subset: &ArraySubset) -> String {
    let ranges: Vec<String> = subset.to_ranges().iter().map(|r| format!("{}:{}", r.start, r.end)).collect();
    format!("[{}]", ranges.join(", "))
}

/// A box as a key: a tuple of Python slices (`array[key]` selects it again).
fn subset_key<'py>(py: Python<'py>, subset: &ArraySubset) -> PyResult<Bound<'py, PyTuple>> {
    // Python ints: a bound of 2^63 or more has no isize.
    let slice = py.get_type::<PySlice>();
    let slices = subset.to_ranges().iter().map(|r| slice.call1((r.start, r.end))).collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, slices)
}

/// A lock, also after a panic in a holder (the states it guards stay consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long a wait for a read goes without looking for Python's signals (Ctrl-C): well under
/// the second a user waits before pressing it again, and the wake-ups cost nothing beside a read.
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// How long an interrupted `read_into` gets to stop (at its next stage, [`Cancel`]) before
/// KeyboardInterrupt is raised without it: a read between stages stops within a batch, one
/// waiting on storage (a remote server retrying) may not.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// Run `work` on a thread of its own and wait for it in slices of [`WAIT_SLICE`] without the
/// interpreter lock, looking for Python's signals between them: Ctrl-C during a long or
/// retrying read raises KeyboardInterrupt at once, not when the read returns. A read given
/// `stop` (its configuration's [`Cancel`] and a wait) is told to stop, and waited for that long
/// (a second Ctrl-C ends the wait): one that stopped writes nothing more (into a caller's `out`,
/// say). Interrupted work goes on to its next stage, or its end, on its thread, which then drops
/// its result (device memory goes back to the pool there; nothing else holds it).
fn interruptible<R: Send + 'static>(
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
fn wait_for_stop<R: Send + 'static>(py: Python<'_>, mut result: Receiver<std::thread::Result<R>>, wait: Duration) {
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
fn deadline_of(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_nan() => Err(PyValueError::new_err("timeout=nan: a timeout is a number of seconds or None")),
        // Beyond what an Instant holds: for good.
        Some(t) => Ok(Duration::try_from_secs_f64(t.max(0.0)).ok().and_then(|d| Instant::now().checked_add(d))),
    }
}

/// A device array of any element type.
trait AnyArray: Send + Sync {
    fn shape(&self) -> &[u64];
    fn ptr(&self) -> u64;
    fn nbytes(&self) -> usize;
    fn ordinal(&self) -> usize;
    /// Wait (bounded) for all work on the array's device (its consumers' too) before its memory
    /// may be freed; where that wait does not end, the memory is leaked instead.
    fn settle(&self);
    fn dlpack<'py>(&self, py: Python<'py>, stream: DlpackStream, versioned: bool) -> PyResult<Bound<'py, PyAny>>;
}

struct Typed<T>(Arc<DeviceArray<T>>);

impl<T: ElementOwned + Send + Sync + 'static> AnyArray for Typed<T> {
    fn shape(&self) -> &[u64] {
        self.0.shape()
    }

    fn ptr(&self) -> u64 {
        self.0.device_ptr()
    }

    fn nbytes(&self) -> usize {
        self.0.num_bytes()
    }

    fn ordinal(&self) -> usize {
        self.0.stream().context().ordinal()
    }

    fn settle(&self) {
        // Bounded, without the interpreter lock (the wrapper `release_wait` installs).
        self.0.settle_for_release();
    }

    fn dlpack<'py>(&self, py: Python<'py>, stream: DlpackStream, versioned: bool) -> PyResult<Bound<'py, PyAny>> {
        if versioned {
            let tensor: SafeManagedTensorVersioned = DeviceArray::share_dlpack(&self.0, stream).map_err(py_err)?;
            tensor.into_pyobject(py)
        } else {
            let tensor: SafeManagedTensor = DeviceArray::share_dlpack_legacy(&self.0, stream).map_err(py_err)?;
            tensor.into_pyobject(py)
        }
    }
}

/// The array's element type: its name (zarrs' and numpy's) and the CUDA array interface's type
/// string (None where numpy has none: bfloat16).
fn element_type(array: &Array<AnyStore>) -> PyResult<(&'static str, Option<&'static str>)> {
    zarrs_gpu::element::element_type(array.data_type()).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "data type {} is not supported on the device (fixed-size numeric types are)",
            array.data_type()
        ))
    })
}

/// numpy's dtype of the element type `name` (ml_dtypes' for bfloat16, or the name itself where
/// that is not installed); numpy missing is an ImportError naming `what` needs it.
fn numpy_dtype<'py>(py: Python<'py>, name: &str, what: &str) -> PyResult<Bound<'py, PyAny>> {
    let numpy = py.import("numpy").map_err(|err| {
        let new = PyErr::from_type(
            err.get_type(py),
            format!("zarrs_gpu.Array.{what} needs numpy (pip install numpy): {}", err.value(py)),
        );
        // `name`, as the import system sets it: handlers that check which module is missing.
        let _ = new.value(py).setattr("name", "numpy");
        new.set_cause(py, Some(err));
        new
    })?;
    if name == "bfloat16" {
        match py.import("ml_dtypes") {
            Ok(ml_dtypes) => return numpy.getattr("dtype")?.call1((ml_dtypes.getattr("bfloat16")?,)),
            Err(err) if err.is_instance_of::<PyImportError>(py) => return Ok(PyString::new(py, name).into_any()),
            Err(err) => return Err(err),
        }
    }
    numpy.getattr("dtype")?.call1((name,))
}

/// Read `subset` as `T`, with the shape `out_shape` (the subset's, less the dimensions an
/// integer index dropped).
fn read_typed<T: ElementOwned + Send + Sync + 'static>(
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    out_shape: Vec<u64>,
) -> Result<(Box<dyn AnyArray>, RetrieveReport), GpuError> {
    let (data, report) = array.retrieve_array_subset_device_opt::<T>(subset, config)?;
    Ok((Box::new(Typed(Arc::new(data.reshape(out_shape)?))), report))
}

fn read_any(
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    out_shape: Vec<u64>,
) -> Result<(Box<dyn AnyArray>, RetrieveReport), GpuError> {
    type Read = fn(
        &Array<AnyStore>,
        &ArraySubset,
        &GpuConfig,
        Vec<u64>,
    ) -> Result<(Box<dyn AnyArray>, RetrieveReport), GpuError>;
    let unsupported =
        || GpuError::Unsupported(format!("data type {} is not supported on the device", array.data_type()));
    let (name, _) = zarrs_gpu::element::element_type(array.data_type()).ok_or_else(unsupported)?;
    let read: Read = zarrs_gpu::by_element_type!(name, read_typed).ok_or_else(unsupported)?;
    read(array, subset, config, out_shape)
}

/// Read `subsets` as one request: one array per subset with the shape its key selects, or
/// (`stack`) one array of shape `(n, *shape)` where they share `shape`.
fn read_many_typed<T: ElementOwned + Send + Sync + 'static>(
    array: &Array<AnyStore>,
    boxes: &[(ArraySubset, Vec<u64>)],
    config: &GpuConfig,
    stack: bool,
) -> Result<(Vec<Box<dyn AnyArray>>, RetrieveReport), GpuError> {
    let subsets: Vec<ArraySubset> = boxes.iter().map(|(subset, _)| subset.clone()).collect();
    if stack {
        let (data, report) = array.retrieve_array_subsets_stacked_device_opt::<T>(&subsets, config)?;
        let shape: Vec<u64> = std::iter::once(boxes.len() as u64).chain(boxes[0].1.iter().copied()).collect();
        return Ok((vec![Box::new(Typed(Arc::new(data.reshape(shape)?)))], report));
    }
    let (arrays, report) = array.retrieve_array_subsets_device_opt::<T>(&subsets, config)?;
    let arrays = arrays
        .into_iter()
        .zip(boxes)
        .map(|(data, (_, shape))| Ok(Box::new(Typed(Arc::new(data.reshape(shape.clone())?))) as Box<dyn AnyArray>))
        .collect::<Result<_, GpuError>>()?;
    Ok((arrays, report))
}

/// [`read_many_typed`] for one element type.
type ReadMany = fn(
    &Array<AnyStore>,
    &[(ArraySubset, Vec<u64>)],
    &GpuConfig,
    bool,
) -> Result<(Vec<Box<dyn AnyArray>>, RetrieveReport), GpuError>;

/// A result of a read kept in flight: the box read and, where the read succeeded, its data
/// (shaped as its key selects) and report.
type AnyRead = (ArraySubset, Result<(Box<dyn AnyArray>, RetrieveReport), GpuError>);

/// Reads kept in flight ([`ReadAhead`]) of any element type.
trait AnyReadAhead: Send {
    /// The next read, waiting at most `timeout` for it (`Poll::Pending`: not yet; it goes on).
    fn next_read(&mut self, timeout: Duration) -> Poll<Option<AnyRead>>;
}

struct TypedReadAhead<T> {
    reads: ReadAhead<T>,
    /// The boxes not yet handed out and the shapes their keys select, in order.
    pending: VecDeque<(ArraySubset, Vec<u64>)>,
}

impl<T: ElementOwned + Send + Sync + 'static> AnyReadAhead for TypedReadAhead<T> {
    fn next_read(&mut self, timeout: Duration) -> Poll<Option<AnyRead>> {
        let Poll::Ready(read) = self.reads.next_timeout(timeout) else { return Poll::Pending };
        let Some(read) = read else { return Poll::Ready(None) };
        let Some((subset, shape)) = self.pending.pop_front() else { return Poll::Ready(None) };
        let read = read.and_then(|(_, data, report)| {
            Ok((Box::new(Typed(Arc::new(data.reshape(shape)?))) as Box<dyn AnyArray>, report))
        });
        Poll::Ready(Some((subset, read)))
    }
}

/// A read's device array (shaped as its key selects) and report.
type AnyResult = (Box<dyn AnyArray>, RetrieveReport);

/// Boxes to read, each with the shape its key selects.
type Boxes = Vec<(ArraySubset, Vec<u64>)>;

/// [`start_read_ahead`] for one element type.
type StartReadAhead = fn(Arc<Array<AnyStore>>, Boxes, GpuConfig, usize) -> Box<dyn AnyReadAhead>;

fn start_read_ahead<T: ElementOwned + Send + Sync + 'static>(
    array: Arc<Array<AnyStore>>,
    boxes: Boxes,
    config: GpuConfig,
    depth: usize,
) -> Box<dyn AnyReadAhead> {
    let subsets: Vec<ArraySubset> = boxes.iter().map(|(subset, _)| subset.clone()).collect();
    Box::new(TypedReadAhead { reads: ReadAhead::<T>::new(array, subsets, config, depth), pending: boxes.into() })
}

/// One read started on its own thread ([`read_async`]), of any element type.
trait AnyPending: Send {
    fn is_done(&self) -> bool;
    /// The read's result, waiting at most `timeout` for it (`Poll::Pending`: not yet; it goes on).
    fn wait(&mut self, timeout: Duration) -> Poll<Result<AnyResult, GpuError>>;
}

struct TypedPending<T> {
    read: PendingRead<T>,
    shape: Vec<u64>,
}

impl<T: ElementOwned + Send + Sync + 'static> AnyPending for TypedPending<T> {
    fn is_done(&self) -> bool {
        self.read.is_done()
    }

    fn wait(&mut self, timeout: Duration) -> Poll<Result<AnyResult, GpuError>> {
        let shape = &self.shape;
        self.read.wait_timeout(timeout).map(|read| {
            let (data, report) = read?;
            Ok((Box::new(Typed(Arc::new(data.reshape(shape.clone())?))) as Box<dyn AnyArray>, report))
        })
    }
}

/// [`start_pending`] for one element type.
type StartPending = fn(Arc<Array<AnyStore>>, ArraySubset, Vec<u64>, GpuConfig) -> Box<dyn AnyPending>;

fn start_pending<T: ElementOwned + Send + Sync + 'static>(
    array: Arc<Array<AnyStore>>,
    subset: ArraySubset,
    shape: Vec<u64>,
    config: GpuConfig,
) -> Box<dyn AnyPending> {
    Box::new(TypedPending { read: read_async::<T, _>(array, subset, config), shape })
}

/// Read `subset` into `tensor`'s memory (another library's), as `T`, on a thread of its own
/// ([`interruptible`]: Ctrl-C stops the read before it writes more into the tensor). The tensor
/// is released with the interpreter lock held (a Python producer's deleter needs it).
fn read_into_typed<T: ElementOwned + Send + Sync + 'static>(
    py: Python<'_>,
    array: &Arc<Array<AnyStore>>,
    subset: &ArraySubset,
    config: &GpuConfig,
    tensor: SafeManagedTensorVersioned,
) -> PyResult<RetrieveReport> {
    let mut out = DeviceArray::<T>::from_dlpack(tensor, array.data_type().clone()).map_err(py_err)?;
    let cancel = Cancel::new();
    let (array, subset, config) = (array.clone(), subset.clone(), config.clone().with_cancel(cancel.clone()));
    let report = interruptible(py, Some((&cancel, STOP_WAIT)), move || {
        let mut read = || {
            // The waits below bind the device's context on this thread.
            let _current = zarrs_gpu_codecs::CurrentContextGuard::new();
            // The producer ordered its work before the legacy default stream
            // (`__dlpack__(stream=1)`): wait for that before writing.
            out.stream()
                .synchronize()
                .map_err(|source| GpuError::Cuda { what: "waiting for the destination's producer", source })?;
            array.retrieve_array_subset_into_device_opt(&subset, &mut out, &config)
        };
        let report = read();
        Python::with_gil(|_| drop(out));
        report
    })?;
    report.map_err(py_err)
}

fn read_into_any(
    py: Python<'_>,
    array: &Arc<Array<AnyStore>>,
    subset: &ArraySubset,
    config: &GpuConfig,
    tensor: SafeManagedTensorVersioned,
) -> PyResult<RetrieveReport> {
    type ReadInto = fn(
        Python<'_>,
        &Arc<Array<AnyStore>>,
        &ArraySubset,
        &GpuConfig,
        SafeManagedTensorVersioned,
    ) -> PyResult<RetrieveReport>;
    let (name, _) = element_type(array)?;
    let read: ReadInto = zarrs_gpu::by_element_type!(name, read_into_typed)
        .ok_or_else(|| PyTypeError::new_err(format!("data type {name} has no device element type")))?;
    read(py, array, subset, config, tensor)
}

/// A read's report as a dict.
fn report_dict<'py>(py: Python<'py>, r: &RetrieveReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("decode", r.decode.to_string())?;
    dict.set_item("io", r.io.as_ref().map(ToString::to_string))?;
    dict.set_item("chunks", r.chunks)?;
    dict.set_item("missing_chunks", r.missing_chunks)?;
    dict.set_item("host_decoded_chunks", r.host_decoded_chunks)?;
    dict.set_item("schedule", r.schedule.as_deref())?;
    dict.set_item("bytes_read", r.bytes_read)?;
    dict.set_item("peak_device_bytes", r.peak_device_bytes)?;
    dict.set_item("coalesced_reads", r.coalesced_reads)?;
    dict.set_item("device_decoder", r.device_decoder.as_deref())?;
    dict.set_item("host_reason", r.host_reason.clone())?;
    let stages = PyDict::new(py);
    for s in &r.stages {
        stages.set_item(s.stage, s.time.as_secs_f64())?;
    }
    dict.set_item("stages", stages)?;
    Ok(dict)
}

/// A numpy-style index (an integer, a slice, `...`, or a tuple of them) as the subset it selects
/// and the shape of the result (integers drop their dimension), by the rule the command line's
/// `--subset` follows (`zarrs_gpu::subset::select`): numpy's. Slices clamp, empty ones select nothing;
/// steps other than 1 are refused.
fn index_to_subset(key: &Bound<'_, PyAny>, shape: &[u64]) -> PyResult<(Vec<Range<u64>>, Vec<u64>)> {
    let items: Vec<Bound<'_, PyAny>> = match key.downcast::<PyTuple>() {
        Ok(tuple) => tuple.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    let items = items.iter().map(index_item).collect::<PyResult<Vec<_>>>()?;
    let selection = zarrs_gpu::subset::select(&items, shape).map_err(PyIndexError::new_err)?;
    Ok((selection.ranges, selection.shape))
}

/// What `Array.read`'s `subset` selects: None the whole array, a string the command line's form
/// (`zarrs_gpu::parse_subset`: integers keep their dimension), anything else an index.
fn key_to_subset(key: Option<&Bound<'_, PyAny>>, shape: &[u64]) -> PyResult<(Vec<Range<u64>>, Vec<u64>)> {
    match key {
        None => Ok((shape.iter().map(|&n| 0..n).collect(), shape.to_vec())),
        Some(spec) if spec.is_instance_of::<pyo3::types::PyString>() => {
            let subset = zarrs_gpu::parse_subset(&spec.extract::<String>()?, shape).map_err(PyIndexError::new_err)?;
            Ok((subset.to_ranges(), subset.shape().to_vec()))
        }
        Some(key) => index_to_subset(key, shape),
    }
}

/// One item of an index as the shared rule's.
fn index_item(item: &Bound<'_, PyAny>) -> PyResult<IndexItem> {
    if item.is(PyEllipsis::get(item.py())) {
        return Ok(IndexItem::Ellipsis);
    }
    if let Ok(slice) = item.downcast::<PySlice>() {
        let bound = |name: &str| slice_bound(&slice.getattr(name)?);
        return Ok(IndexItem::Slice { start: bound("start")?, stop: bound("stop")?, step: bound("step")? });
    }
    if item.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyIndexError::new_err("booleans are not indices (numpy reads them as a mask or a new axis)"));
    }
    // Integers, numpy's among them (anything with `__index__`).
    if let Ok(index) = item.call_method0("__index__") {
        return Ok(IndexItem::Index(saturated(&index)?));
    }
    Err(PyIndexError::new_err(format!(
        "only integers, slices (`:`) and ellipsis (`...`) are valid indices, not {}",
        item.get_type().name()?
    )))
}

/// A slice's start, stop or step: None, or an integer (saturated to 128 bits: a bound that far
/// out clamps all the same).
fn slice_bound(value: &Bound<'_, PyAny>) -> PyResult<Option<i128>> {
    if value.is_none() {
        return Ok(None);
    }
    let index = value
        .call_method0("__index__")
        .map_err(|_| PyTypeError::new_err("slice indices must be integers or None or have an __index__ method"))?;
    saturated(&index).map(Some)
}

/// A Python int as an i128, saturated.
fn saturated(int: &Bound<'_, PyAny>) -> PyResult<i128> {
    match int.extract::<i128>() {
        Ok(v) => Ok(v),
        Err(_) if int.lt(0)? => Ok(i128::MIN),
        Err(_) => Ok(i128::MAX),
    }
}

/// Whether `value` is in CUDA device memory by DLPack's account (`__dlpack_device__`).
fn on_cuda_device(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !value.hasattr("__dlpack_device__")? {
        return Ok(false);
    }
    let device = value.call_method0("__dlpack_device__")?;
    Ok(device.extract::<(i32, i32)>().is_ok_and(|(device_type, _)| device_type == KDL_CUDA))
}

/// `value.__dlpack__(stream=1, max_version=(1, 0))` as a DLPack 1.0 tensor (`what` names it in
/// errors): the producer's work is ordered before the legacy default stream.
fn versioned_capsule(py: Python<'_>, value: &Bound<'_, PyAny>, what: &str) -> PyResult<SafeManagedTensorVersioned> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("stream", 1)?;
    kwargs.set_item("max_version", (1, 0))?;
    let capsule = value.call_method("__dlpack__", (), Some(&kwargs))?;
    let capsule = capsule
        .downcast::<pyo3::types::PyCapsule>()
        .map_err(|_| PyTypeError::new_err(format!("{what}'s __dlpack__() did not return a capsule")))?;
    let name = capsule.name()?.map(|n| n.to_bytes().to_vec());
    if name.as_deref() != Some(b"dltensor_versioned".as_slice()) {
        return Err(PyTypeError::new_err(format!(
            "{what} must be a DLPack 1.0 producer (its __dlpack__(max_version=(1, 0)) gave an unversioned capsule)"
        )));
    }
    capsule.extract()
}

/// Write `tensor` (another library's device memory, the subset's shape) into `subset`, as `T`.
/// The write runs without the interpreter lock; the tensor is released with it held.
fn write_from_typed<T: ElementOwned + Send + Sync + 'static>(
    py: Python<'_>,
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    tensor: SafeManagedTensorVersioned,
) -> PyResult<WriteReport> {
    // The selection's shape (integers as 1s) over the value's (integers dropped).
    let data = DeviceArray::<T>::from_dlpack(tensor, array.data_type().clone())
        .and_then(|data| data.reshape(subset.shape().to_vec()))
        .map_err(py_err)?;
    let report = py.allow_threads(|| {
        let _current = zarrs_gpu_codecs::CurrentContextGuard::new();
        // The producer ordered its work before the legacy default stream: wait for it.
        data.stream()
            .synchronize()
            .map_err(|source| GpuError::Cuda { what: "waiting for the value's producer", source })?;
        array.store_array_subset_device_opt(subset, &data, config)
    });
    drop(data);
    report.map_err(py_err)
}

fn write_from_any(
    py: Python<'_>,
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    tensor: SafeManagedTensorVersioned,
) -> PyResult<WriteReport> {
    type WriteFrom =
        fn(Python<'_>, &Array<AnyStore>, &ArraySubset, &GpuConfig, SafeManagedTensorVersioned) -> PyResult<WriteReport>;
    let (name, _) = element_type(array)?;
    let write: WriteFrom = zarrs_gpu::by_element_type!(name, write_from_typed)
        .ok_or_else(|| PyTypeError::new_err(format!("data type {name} has no device element type")))?;
    write(py, array, subset, config, tensor)
}

/// A write's report as a dict (the keys of `WriteReport`).
fn write_report_dict<'py>(py: Python<'py>, r: &WriteReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("path", if r.path == WritePath::Device { "device" } else { "host" })?;
    dict.set_item("reason", r.reason.clone())?;
    dict.set_item("chunks", r.chunks)?;
    dict.set_item("written", r.written)?;
    dict.set_item("erased", r.erased)?;
    dict.set_item("modified", r.modified)?;
    dict.set_item("bytes_encoded", r.bytes_encoded)?;
    dict.set_item("bytes_stored", r.bytes_stored)?;
    dict.set_item("seconds", r.seconds)?;
    dict.set_item("encode_seconds", r.encode_seconds)?;
    dict.set_item("read_seconds", r.read_seconds)?;
    dict.set_item("store_seconds", r.store_seconds)?;
    Ok(dict)
}

/// `read_into`'s `out` must be device memory that DLPack hands over: refuse anything else (a
/// numpy array, whose `__dlpack__` would only say that numpy takes no stream) plainly.
fn check_device_destination(out: &Bound<'_, PyAny>) -> PyResult<()> {
    const WANTED: &str = "out must be a device array: a CuPy array, a PyTorch CUDA tensor, or anything with \
                          __dlpack__ on a CUDA device";
    let kind = || out.get_type().name().map_or_else(|_| "?".to_string(), |n| n.to_string());
    if !out.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!("{WANTED}; got {} (no __dlpack__)", kind())));
    }
    if let Ok(device) = out.call_method0("__dlpack_device__") {
        if let Ok((device_type, _)) = device.extract::<(i32, i32)>() {
            if device_type != KDL_CUDA {
                let place = if device_type == 1 {
                    "host memory (kDLCPU)".to_string()
                } else {
                    format!("DLPack device type {device_type}")
                };
                return Err(PyTypeError::new_err(format!("{WANTED}; got {} in {place}", kind())));
            }
        }
    }
    Ok(())
}

/// A Zarr array in a filesystem store, opened for reads to the GPU: numpy-style indexing returns
/// device arrays.
#[pyclass(name = "Array", module = "zarrs_gpu", frozen)]
struct PyZarrArray {
    array: Arc<Array<AnyStore>>,
    config: GpuConfig,
    /// Reads from many threads gathered into requests, where the configuration's coalesce window
    /// is set (`ZARRS_GPU_COALESCE_WINDOW_US`).
    coalescer: Arc<Coalescer<(ArraySubset, Vec<u64>), AnyResult>>,
    path: PathBuf,
    node: String,
    /// Opened with mode "r+": writes are allowed.
    writable: bool,
    /// The metadata file as read just before opening.
    opened_metadata: Option<Vec<u8>>,
}

/// The metadata file (`zarr.json`, else `.zarray`) of the array at `node` of `store`, as stored.
fn stored_metadata(store: &AnyStore, node: &str) -> Result<Option<Vec<u8>>, String> {
    let node = node.trim_matches('/');
    for name in ["zarr.json", ".zarray"] {
        let key = if node.is_empty() { name.to_string() } else { format!("{node}/{name}") };
        let key = zarrs_storage::StoreKey::new(key).map_err(|e| e.to_string())?;
        if let Some(bytes) = zarrs_storage::ReadableStorageTraits::get(store, &key).map_err(|e| e.to_string())? {
            return Ok(Some(bytes.to_vec()));
        }
    }
    Ok(None)
}

impl PyZarrArray {
    /// The shape of the chunk grid's first chunk (of every chunk, on a regular grid).
    fn grid_chunk_shape(&self) -> PyResult<Vec<u64>> {
        let first = vec![0u64; self.array.dimensionality()];
        let shape = self.array.chunk_shape(&first).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(shape.iter().map(|n| n.get()).collect())
    }

    /// The inner chunk shape when the array's codecs are sharding alone (zarr-python's rule for
    /// `chunks` and `shards`: a codec before or after it makes the grid's chunks the chunks).
    fn sharding(&self) -> PyResult<Option<Vec<u64>>> {
        use zarrs::array::codec::ShardingCodecConfiguration;
        let zarrs::metadata::ArrayMetadata::V3(metadata) = self.array.metadata() else { return Ok(None) };
        let [codec] = metadata.codecs.as_slice() else { return Ok(None) };
        if codec.name() != "sharding_indexed" {
            return Ok(None);
        }
        let configuration: ShardingCodecConfiguration = codec
            .to_configuration()
            .map_err(|e| PyValueError::new_err(format!("sharding_indexed configuration: {e}")))?;
        let ShardingCodecConfiguration::V1(c) = configuration else {
            return Err(PyValueError::new_err("this sharding_indexed configuration version is not supported"));
        };
        Ok(Some(c.chunk_shape.iter().map(|n| n.get()).collect()))
    }

    fn read_ranges(&self, py: Python<'_>, ranges: &[Range<u64>], out_shape: Vec<u64>) -> PyResult<PyDeviceArray> {
        let (dtype, typestr) = element_type(&self.array)?;
        let subset = ArraySubset::new_with_ranges(ranges);
        let (array, config) = (self.array.clone(), self.config.clone());
        // The reads run without the interpreter lock (other Python threads go on meanwhile), on
        // their own thread: Ctrl-C interrupts the wait.
        if config.coalesce_window().is_none() {
            let cancel = Cancel::new();
            let config = config.with_cancel(cancel.clone());
            let (data, report) = interruptible(py, Some((&cancel, Duration::ZERO)), move || {
                read_any(&array, &subset, &config, out_shape)
            })?
            .map_err(py_err)?;
            return Ok(PyDeviceArray::new(data, (dtype, typestr), report));
        }
        // With the reads of other threads that arrive while a request is in flight, as one.
        let read: ReadMany = zarrs_gpu::by_element_type!(dtype, read_many_typed)
            .ok_or_else(|| PyTypeError::new_err(format!("data type {dtype} has no device element type")))?;
        let coalescer = self.coalescer.clone();
        // Not cancelled when interrupted: the request may carry other threads' reads.
        let ((data, report), _) = interruptible(py, None, move || {
            let many = |boxes: &[(ArraySubset, Vec<u64>)]| {
                let (arrays, report) = read(&array, boxes, &config, false)?;
                Ok::<Vec<_>, GpuError>(report.shared_by(arrays))
            };
            coalescer.read((subset, out_shape), many)
        })?
        .map_err(py_err)?;
        Ok(PyDeviceArray::new(data, (dtype, typestr), report))
    }

    /// The boxes `keys` select (each with the shape its key selects), every key checked: a bad
    /// one raises, naming its position.
    fn boxes_of(&self, keys: &Bound<'_, PyAny>) -> PyResult<Boxes> {
        if keys.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err("keys is a list of keys, not one string key: pass [key]"));
        }
        let mut boxes = Vec::new();
        for (n, key) in keys.try_iter()?.enumerate() {
            let key = key?;
            let (ranges, out_shape) = key_to_subset(Some(&key), self.array.shape()).map_err(|err| {
                let py = key.py();
                PyErr::from_type(err.get_type(py), format!("keys[{n}]: {}", err.value(py)))
            })?;
            boxes.push((ArraySubset::new_with_ranges(&ranges), out_shape));
        }
        Ok(boxes)
    }

    /// Read `boxes` (each with the shape its key selects) in order on a background thread, at
    /// most `prefetch` ahead of the caller.
    fn start_read_ahead(&self, boxes: Boxes, prefetch: i64) -> PyResult<PyReadAhead> {
        let depth = usize::try_from(prefetch).ok().filter(|&n| n >= 1).ok_or_else(|| {
            PyValueError::new_err(format!(
                "prefetch={prefetch}: the number of reads kept ahead of the one in use is 1 or more"
            ))
        })?;
        let types = element_type(&self.array)?;
        let start: StartReadAhead = zarrs_gpu::by_element_type!(types.0, start_read_ahead)
            .ok_or_else(|| PyTypeError::new_err(format!("data type {} has no device element type", types.0)))?;
        let count = boxes.len();
        // The queue's slots are allocated up front: no more than there are reads.
        let reads = start(self.array.clone(), boxes, self.config.clone(), depth.min(count.max(1)));
        Ok(PyReadAhead {
            reads: Mutex::new(Some(reads)),
            closed: AtomicBool::new(false),
            types,
            count,
            prefetch: depth,
        })
    }
}

#[pymethods]
impl PyZarrArray {
    /// The array's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.array.shape())
    }

    /// numpy's dtype of what reads return, as zarr-python's `Array.dtype` but in native byte order
    /// (a big-endian array's reads are native): `numpy.dtype("float32")`, ... bfloat16, which
    /// numpy lacks, is ml_dtypes' where that is installed, else the name `"bfloat16"`.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_dtype(py, element_type(&self.array)?.0, "dtype")
    }

    /// The number of elements (the product of the shape), as zarr-python's `Array.size`.
    #[getter]
    fn size<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // Python's integers: a shape's product may pass 2^64.
        py.import("math")?.call_method1("prod", (PyTuple::new(py, self.array.shape())?,))
    }

    /// The bytes of the whole array: `size` times the element size, as zarr-python's
    /// `Array.nbytes` (not what its chunks take in the store).
    #[getter]
    fn nbytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let element = self.array.data_type().fixed_size().ok_or_else(|| {
            PyTypeError::new_err(format!("data type {} has no fixed element size", self.array.data_type()))
        })?;
        self.size(py)?.mul(element)
    }

    /// The array's attributes (`zarr.json`'s `attributes`, a v2 array's `.zattrs`), as
    /// zarr-python's `Array.attrs` holds them: a new dict at each call, changed in memory only.
    #[getter]
    fn attrs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let loads = py.import("json")?.getattr("loads")?;
        let attrs = PyDict::new(py);
        for (key, value) in self.array.attributes() {
            // A JSON value displays as its JSON text.
            attrs.set_item(key, loads.call1((value.to_string(),))?)?;
        }
        Ok(attrs)
    }

    /// The fill value, as zarr-python's `Array.fill_value`: a numpy scalar of `dtype`, or None
    /// where a v2 array's metadata says `null` (zarrs then fills with zeros). bfloat16 without
    /// ml_dtypes: a Python float.
    #[getter]
    fn fill_value<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let zarrs::metadata::ArrayMetadata::V2(metadata) = self.array.metadata() {
            if metadata.fill_value.is_null() {
                return Ok(py.None().into_bound(py));
            }
        }
        let (name, _) = element_type(&self.array)?;
        let bytes = self.array.fill_value().as_ne_bytes();
        let expected = self.array.data_type().fixed_size();
        if expected != Some(bytes.len()) {
            return Err(PyValueError::new_err(format!(
                "the fill value of {} has {} bytes, its data type {} {expected:?}",
                self.path.display(),
                bytes.len(),
                self.array.data_type()
            )));
        }
        let dtype = numpy_dtype(py, name, "fill_value")?;
        if dtype.is_instance_of::<PyString>() {
            let bits: [u8; 2] = bytes.try_into().map_err(|_| PyValueError::new_err("a bfloat16 has 2 bytes"))?;
            return Ok(PyFloat::new(py, zarrs_gpu::half::bf16::from_ne_bytes(bits).to_f64()).into_any());
        }
        let numpy = py.import("numpy")?;
        numpy.call_method1("frombuffer", (PyBytes::new(py, bytes), dtype))?.get_item(0)
    }

    /// The shape of the chunks a read decodes, as zarr-python's `Array.chunks`: for an array
    /// whose one codec is sharding, the shards' inner chunk shape (the outermost shard's, when
    /// shards nest); else the chunk grid's. On an irregular grid, the first chunk's shape.
    #[getter]
    fn chunks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        match self.sharding()? {
            Some(inner) => PyTuple::new(py, inner),
            None => PyTuple::new(py, self.grid_chunk_shape()?),
        }
    }

    /// The shard shape (the chunk grid's) of an array whose one codec is sharding, else None: as
    /// zarr-python's `Array.shards`.
    #[getter]
    fn shards<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        if self.sharding()?.is_none() || self.regular_chunks(py)?.is_none() {
            return Ok(None);
        }
        PyTuple::new(py, self.grid_chunk_shape()?).map(Some)
    }

    /// The number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.array.dimensionality()
    }

    /// The GPU this array's reads land on (`open`'s `device`).
    #[getter]
    fn device(&self) -> usize {
        self.config.device()
    }

    /// The chunk grid's chunk shape (the shard shape of a sharded array) when every chunk has it
    /// (a regular grid: every v2 array, v3 arrays with the "regular" chunk grid), else None.
    #[getter]
    fn regular_chunks<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let regular = match self.array.metadata() {
            zarrs::metadata::ArrayMetadata::V2(_) => true,
            zarrs::metadata::ArrayMetadata::V3(m) => m.chunk_grid.name() == "regular",
        };
        if !regular {
            return Ok(None);
        }
        PyTuple::new(py, self.grid_chunk_shape()?).map(Some)
    }

    /// Read `subset` (numpy-style slices as a string, `"0:64, :, :"`, or an index as for
    /// `array[...]`; None: the whole array) to the device.
    #[pyo3(signature = (subset=None))]
    fn read(&self, py: Python<'_>, subset: Option<&Bound<'_, PyAny>>) -> PyResult<PyDeviceArray> {
        let (ranges, out_shape) = key_to_subset(subset, self.array.shape())?;
        self.read_ranges(py, &ranges, out_shape)
    }

    /// Read the selection `key` (an index as for `array[...]`, or `read`'s string form; None: the
    /// whole array) into `out`, a C-contiguous CUDA array of the selection's shape and this
    /// array's dtype that another library owns (a CuPy array or a PyTorch CUDA tensor: any DLPack
    /// 1.0 producer on a CUDA device; host arrays are a TypeError), in place. Returns the read's
    /// report.
    #[pyo3(signature = (out, key=None))]
    fn read_into<'py>(
        &self,
        py: Python<'py>,
        out: &Bound<'py, PyAny>,
        key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_device_destination(out)?;
        let (ranges, selected) = key_to_subset(key, self.array.shape())?;
        // The destination's shape must be the selection's, as numpy's `out=` asks (not only as
        // many elements).
        let out_shape: Vec<u64> = out.getattr("shape")?.extract()?;
        if out_shape != selected {
            return Err(PyValueError::new_err(format!("out has shape {out_shape:?}, the selection {selected:?}")));
        }
        let tensor = versioned_capsule(py, out, "out")?;
        let subset = ArraySubset::new_with_ranges(&ranges);
        let report = read_into_any(py, &self.array, &subset, &self.config, tensor)?;
        report_dict(py, &report)
    }

    /// Start reading the selection `key` (as for `read`; None: the whole array) on a background
    /// thread and return at once: a `PendingRead` whose `result()` waits for the array. A bad key
    /// raises here, a failed read in `result()`.
    #[pyo3(signature = (key=None))]
    fn read_async(&self, key: Option<&Bound<'_, PyAny>>) -> PyResult<PyPendingRead> {
        let (ranges, out_shape) = key_to_subset(key, self.array.shape())?;
        let types = element_type(&self.array)?;
        let start: StartPending = zarrs_gpu::by_element_type!(types.0, start_pending)
            .ok_or_else(|| PyTypeError::new_err(format!("data type {} has no device element type", types.0)))?;
        let subset = ArraySubset::new_with_ranges(&ranges);
        let what = subset_text(&subset);
        let read = start(self.array.clone(), subset, out_shape, self.config.clone());
        Ok(PyPendingRead { state: Mutex::new(Pending::Running(read)), types, what })
    }

    /// Read the selections `keys` (a finite iterable of keys as for `array[...]` or `read`'s
    /// string form: random crops, say) in order on a background thread, `prefetch` ahead of the
    /// one in use. Every key is checked now (a bad one raises here, naming its position); the
    /// iterator yields `(key, DeviceArray)` with `key` the tuple of slices of the box read.
    #[pyo3(signature = (keys, *, prefetch=2))]
    fn read_ahead(&self, keys: &Bound<'_, PyAny>, prefetch: i64) -> PyResult<PyReadAhead> {
        let boxes = self.boxes_of(keys)?;
        self.start_read_ahead(boxes, prefetch)
    }

    /// Read the selections `keys` (a finite iterable of keys as for `array[...]` or `read`'s
    /// string form) as one request: planned once, a chunk that several selections meet read and
    /// decoded once. Returns a list of `DeviceArray`s, one per key (views of one allocation, freed
    /// with the last), or with `stack=True` one `DeviceArray` of shape `(len(keys), *shape)`,
    /// where every key selects `shape` (a training batch: no stacking copy). Every key is checked
    /// before anything is read.
    #[pyo3(signature = (keys, *, stack=false))]
    fn read_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, stack: bool) -> PyResult<Py<PyAny>> {
        let boxes = self.boxes_of(keys)?;
        if stack {
            if let Some((n, (_, other))) = boxes.iter().enumerate().find(|(_, (_, shape))| *shape != boxes[0].1) {
                return Err(PyValueError::new_err(format!(
                    "stack=True needs keys of one shape: keys[0] selects {:?}, keys[{n}] {other:?}",
                    boxes[0].1
                )));
            }
            if boxes.is_empty() {
                return Err(PyValueError::new_err("stack=True needs at least one key (the shape comes from it)"));
            }
        }
        let types = element_type(&self.array)?;
        let read: ReadMany = zarrs_gpu::by_element_type!(types.0, read_many_typed)
            .ok_or_else(|| PyTypeError::new_err(format!("data type {} has no device element type", types.0)))?;
        let cancel = Cancel::new();
        let (array, config) = (self.array.clone(), self.config.clone().with_cancel(cancel.clone()));
        // The read runs without the interpreter lock (other Python threads go on meanwhile), on
        // its own thread: Ctrl-C interrupts the wait, and stops the read.
        let (arrays, report) =
            interruptible(py, Some((&cancel, Duration::ZERO)), move || read(&array, &boxes, &config, stack))?
                .map_err(py_err)?;
        let mut arrays: Vec<PyDeviceArray> =
            arrays.into_iter().map(|data| PyDeviceArray::new(data, types, report.clone())).collect();
        if stack {
            return Ok(Py::new(py, arrays.remove(0))?.into_any());
        }
        let list = pyo3::types::PyList::empty(py);
        for array in arrays {
            list.append(Py::new(py, array)?)?;
        }
        Ok(list.into_any().unbind())
    }

    /// For benches/python_tile.py: read each of `keys` as benches/bench.rs does (the read, which
    /// ends synchronized, then the array dropped), all in Rust on this thread without the
    /// interpreter lock; the seconds each took. The Rust bench's loop inside this process, to
    /// tell the Python API's own cost from the process's.
    fn _time_reads(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
        let boxes = self.boxes_of(keys)?;
        let (array, config) = (&self.array, &self.config);
        py.allow_threads(|| {
            boxes
                .into_iter()
                .map(|(subset, shape)| {
                    let start = Instant::now();
                    drop(read_any(array, &subset, config, shape)?);
                    Ok(start.elapsed().as_secs_f64())
                })
                .collect::<Result<Vec<f64>, GpuError>>()
        })
        .map_err(py_err)
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyDeviceArray> {
        let (ranges, out_shape) = index_to_subset(key, self.array.shape())?;
        self.read_ranges(py, &ranges, out_shape)
    }

    /// `a[key] = value`: see `write`.
    fn __setitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.write(py, key, value).map(|_| ())
    }

    /// Store `value` into the selection `key` (numpy's basic indexing, as `a[key]` reads) and
    /// return the write's report. From device memory (a CuPy array, a PyTorch CUDA tensor: any
    /// DLPack 1.0 producer on a CUDA device, of the array's dtype and the selection's shape,
    /// C-contiguous), its chunks assembled and encoded on the device where the array's codecs
    /// allow; from anything else numpy takes (broadcast to the selection and cast to the array's
    /// dtype, as numpy's assignment does), written by zarrs on the host. Needs `mode="r+"`.
    fn write<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if !self.writable {
            return Err(PyValueError::new_err(format!(
                "{} was opened for reading (mode=\"r\"): open it with mode=\"r+\" to write",
                self.node
            )));
        }
        let (ranges, selected) = index_to_subset(key, self.array.shape())?;
        let subset = ArraySubset::new_with_ranges(&ranges);
        if on_cuda_device(value)? {
            let shape: Vec<u64> = value.getattr("shape")?.extract()?;
            if shape != selected {
                return Err(PyValueError::new_err(format!(
                    "the value has shape {shape:?}, the selection {selected:?}"
                )));
            }
            let tensor = versioned_capsule(py, value, "the value")?;
            let report = write_from_any(py, &self.array, &subset, &self.config, tensor)?;
            return write_report_dict(py, &report);
        }
        // Host memory: numpy's own assignment (its broadcasting, casting and errors) into an array
        // of the selection, then zarrs' own write of its bytes.
        let numpy = py.import("numpy")?;
        let dtype = self.dtype(py)?;
        if dtype.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err(format!(
                "{} holds {dtype}, which numpy knows only with ml_dtypes installed: write it from device memory",
                self.node
            )));
        }
        let host = numpy.call_method1("empty", (PyTuple::new(py, &selected)?, dtype))?;
        host.set_item(pyo3::types::PyEllipsis::get(py), value)?;
        // Its bytes where numpy keeps them (no copy: 1 GiB took three before).
        let (ptr, _): (usize, bool) = host.getattr("__array_interface__")?.get_item("data")?.extract()?;
        let len: usize = host.getattr("nbytes")?.extract()?;
        let bytes: &[u8] = if len == 0 || ptr == 0 {
            &[]
        } else {
            // SAFETY: `host` is the C-contiguous array of `len` bytes numpy.empty made above; no
            // one else refers to it, and it lives (held here) until the write below has returned.
            unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
        };
        let array = &self.array;
        let config = &self.config;
        py.allow_threads(|| {
            // Locked as the device writer locks (two writes of this process sharing a chunk never
            // lose either's update), each chunk read checked against another process's write.
            let bytes = zarrs::array::ArrayBytes::new_flen(std::borrow::Cow::Borrowed(bytes));
            zarrs_gpu_codecs::store_array_subset_host(array, &subset, bytes, config).map_err(py_err)
        })?;
        drop(host);
        let report = PyDict::new(py);
        report.set_item("path", "host")?;
        report.set_item("reason", "the value is in host memory: zarrs encodes and writes it")?;
        Ok(report)
    }

    fn __len__(&self) -> PyResult<usize> {
        py_len(self.array.shape())
    }

    /// The array's metadata file (`zarr.json`, else `.zarray`) as its store holds it now, fetched
    /// through the array's own store; None when neither is there. Cached arrays compare it with
    /// `_opened_metadata` (an object store has no modification time to ask).
    fn _stored_metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let storage = self.array.storage();
        let bytes = py.allow_threads(|| stored_metadata(&storage, &self.node)).map_err(PyValueError::new_err)?;
        Ok(bytes.map(|b| PyBytes::new(py, &b)))
    }

    /// The metadata file's bytes read just before the array was opened (None: not read).
    fn _opened_metadata<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.opened_metadata.as_ref().map(|b| PyBytes::new(py, b))
    }

    fn __repr__(&self) -> String {
        format!(
            "zarrs_gpu.Array({:?}, array={:?}, shape={:?}, dtype={}, device={})",
            self.path.display().to_string(),
            self.node,
            self.array.shape(),
            self.array.data_type(),
            self.config.device()
        )
    }
}

/// An array in GPU memory, owned by this object (and shared with the tensors handed out):
/// `cupy.asarray(x)`, `cupy.from_dlpack(x)` and `torch.from_dlpack(x)` take it without a copy.
#[pyclass(name = "DeviceArray", module = "zarrs_gpu", frozen)]
struct PyDeviceArray {
    data: Box<dyn AnyArray>,
    dtype: &'static str,
    typestr: Option<&'static str>,
    report: RetrieveReport,
    /// Handed out through the CUDA array interface, whose consumers order nothing before the
    /// memory is freed: wait for the device first.
    interfaced: std::sync::atomic::AtomicBool,
}

impl PyDeviceArray {
    fn new(
        data: Box<dyn AnyArray>,
        (dtype, typestr): (&'static str, Option<&'static str>),
        report: RetrieveReport,
    ) -> Self {
        Self { data, dtype, typestr, report, interfaced: std::sync::atomic::AtomicBool::new(false) }
    }
}

impl Drop for PyDeviceArray {
    fn drop(&mut self) {
        if self.interfaced.load(std::sync::atomic::Ordering::Relaxed) {
            self.data.settle();
        }
    }
}

#[pymethods]
impl PyDeviceArray {
    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.data.shape())
    }

    /// numpy's name of the element type.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype
    }

    /// The number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.data.shape().len()
    }

    /// The size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.data.nbytes()
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.data.ordinal()
    }

    /// What the read did: where it decoded, the I/O path, chunks, bytes read, stage times.
    #[getter]
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        report_dict(py, &self.report)
    }

    /// The DLPack protocol: a capsule sharing this array's memory. `stream` is the consumer's
    /// (None: the legacy default stream; -1: none), which waits for the read without the host
    /// waiting. `max_version` (1, 0) or later gives a versioned capsule.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(true) {
            return Err(PyBufferError::new_err("zarrs_gpu arrays are exported without copies (copy=True asked)"));
        }
        if let Some(device) = dl_device.filter(|&d| d != self.__dlpack_device__()) {
            return Err(PyBufferError::new_err(format!(
                "the array is on CUDA device {}, not {device:?}",
                self.data.ordinal()
            )));
        }
        let stream = DlpackStream::from_protocol(stream).map_err(py_err)?;
        self.data.dlpack(py, stream, max_version.is_some_and(|v| v.0 >= 1))
    }

    /// The DLPack protocol: (kDLCUDA, the device ordinal).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.data.ordinal() as i32)
    }

    /// The CUDA array interface (version 3): the data are ready (reads end synchronized).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let typestr = self.typestr.ok_or_else(|| {
            PyTypeError::new_err(format!("{} has no CUDA array interface type; use DLPack", self.dtype))
        })?;
        self.interfaced.store(true, std::sync::atomic::Ordering::Relaxed);
        let dict = PyDict::new(py);
        dict.set_item("shape", PyTuple::new(py, self.data.shape())?)?;
        dict.set_item("typestr", typestr)?;
        dict.set_item("data", (self.data.ptr(), false))?;
        dict.set_item("strides", py.None())?;
        dict.set_item("stream", py.None())?;
        dict.set_item("version", 3)?;
        Ok(dict)
    }

    fn __len__(&self) -> PyResult<usize> {
        py_len(self.data.shape())
    }

    fn __repr__(&self) -> String {
        format!(
            "zarrs_gpu.DeviceArray(shape={:?}, dtype={}, device={}, decode={})",
            self.data.shape(),
            self.dtype,
            self.data.ordinal(),
            self.report.decode
        )
    }
}

/// Reads kept in flight on a background thread while the caller uses earlier ones
/// (`zarrs_gpu.tiles`, `Array.read_ahead`): iterating yields `(key, DeviceArray)` in order.
#[pyclass(name = "ReadAhead", module = "zarrs_gpu", frozen)]
struct PyReadAhead {
    /// None once the reads have ended or been closed. Held by `__next__` one [`WAIT_SLICE`] at a
    /// time, never by `close`, which only tries it.
    reads: Mutex<Option<Box<dyn AnyReadAhead>>>,
    /// `close` was called: the next to hold `reads` drops them.
    closed: AtomicBool,
    types: (&'static str, Option<&'static str>),
    count: usize,
    prefetch: usize,
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
enum Pending {
    /// The read runs (or has finished, untaken).
    Running(Box<dyn AnyPending>),
    /// Its result, taken from the thread and not yet a Python object.
    Finished(Result<(Box<dyn AnyArray>, RetrieveReport), GpuError>),
    /// The result `result()` returns, every time.
    Taken(Result<Py<PyDeviceArray>, PyErr>),
    /// Between states; left only by a panic in the wait.
    Gone,
}

/// One read running on a background thread (`Array.read_async`): `result()` waits for it.
#[pyclass(name = "PendingRead", module = "zarrs_gpu", frozen)]
struct PyPendingRead {
    state: Mutex<Pending>,
    types: (&'static str, Option<&'static str>),
    /// The box read, for errors.
    what: String,
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

/// The tiles of `tile_shape` covering `array` (edge tiles clipped to its shape), read in `order`
/// ("C": row-major over the tile grid; "random": a permutation fixed by `seed`) on a background
/// thread, `prefetch` ahead of the one in use. Yields `(key, DeviceArray)`; `key` is the tile's
/// tuple of slices. Bad arguments raise here.
#[pyfunction]
#[pyo3(signature = (array, tile_shape, *, order="C", prefetch=2, seed=0))]
#[allow(clippy::needless_pass_by_value)] // extracted from Python as it is
fn tiles(array: &PyZarrArray, tile_shape: Vec<i128>, order: &str, prefetch: i64, seed: i128) -> PyResult<PyReadAhead> {
    let order = match order {
        "C" => TileOrder::C,
        "random" => TileOrder::Random {
            seed: u64::try_from(seed)
                .map_err(|_| PyValueError::new_err(format!("seed={seed}: a seed is an integer from 0 to 2^64 - 1")))?,
        },
        other => {
            return Err(PyValueError::new_err(format!("order={other:?}: the tile orders are \"C\" and \"random\"")))
        }
    };
    if tile_shape.iter().any(|&n| n < 1) {
        return Err(PyValueError::new_err(format!("tile_shape={tile_shape:?}: every tile extent is 1 or more")));
    }
    // An extent beyond 2^64 covers any array as 2^64 - 1 does.
    let tile_shape: Vec<u64> = tile_shape.iter().map(|&n| u64::try_from(n).unwrap_or(u64::MAX)).collect();
    let subsets = tile_subsets(array.array.shape(), &tile_shape, order).map_err(py_err)?;
    let boxes = subsets.into_iter().map(|subset| {
        let shape = subset.shape().to_vec();
        (subset, shape)
    });
    array.start_read_ahead(boxes.collect(), prefetch)
}

/// `len()` of an array of `shape`: its first extent, which Python wants below 2^63.
fn py_len(shape: &[u64]) -> PyResult<usize> {
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
fn device_ordinal(device: i128) -> PyResult<usize> {
    usize::try_from(device).map_err(|_| {
        PyValueError::new_err(format!("device={device}: a CUDA device ordinal is 0 or more (0 is the first GPU)"))
    })
}

/// The configuration of `open` and `read`: the environment (each bad value an error naming its
/// variable), then the arguments; shard indexes kept for the array handle's reads.
fn config(device: usize, backend: Option<&str>, decode_trust: Option<&str>) -> PyResult<GpuConfig> {
    let cache = Some(Arc::new(ShardIndexCache::new()));
    let mut config = GpuConfig::from_env().map_err(py_err)?.with_device(device).with_shard_index_cache(cache);
    if let Some(backend) = backend {
        config = config.with_backend(backend.parse::<IoBackend>().map_err(PyValueError::new_err)?);
    }
    if let Some(trust) = decode_trust {
        config = config.with_decode_trust(trust.parse::<DecodeTrust>().map_err(PyValueError::new_err)?);
    }
    Ok(config)
}

/// `storage_options` values as object_store reads them: booleans as "true"/"false", the rest as
/// Python's `str` of them; s3fs's nested `client_kwargs` (`endpoint_url`, `region_name`) and
/// `config_kwargs` flattened.
fn storage_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, String)>> {
    let mut out = Vec::new();
    let Some(options) = options else { return Ok(out) };
    for (key, value) in options.iter() {
        let key: String = key.extract()?;
        if let (true, Ok(nested)) =
            (matches!(key.as_str(), "client_kwargs" | "config_kwargs"), value.downcast::<PyDict>())
        {
            out.extend(storage_options(Some(nested))?);
            continue;
        }
        if value.is_none() {
            continue; // s3fs's "not given" (token=None)
        }
        let value = if value.is_instance_of::<pyo3::types::PyBool>() {
            value.extract::<bool>()?.to_string()
        } else {
            value.str()?.to_string()
        };
        out.push((key, value));
    }
    Ok(out)
}

/// `storage_options` for `url` as object_store names them (flattened, fsspec's names
/// translated, `allow_http` for plain HTTP), for Python's other object_store client (obstore),
/// which zarr-python lists groups through.
#[pyfunction]
fn _object_store_options(url: &str, storage_options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, String)>> {
    zarrs_gds_store::object_store_options(url, self::storage_options(storage_options)?)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// Locks of this process on value files (see `_lock_files`), held until `release()`.
#[pyclass(name = "_FileLocks", module = "zarrs_gpu", frozen)]
struct PyFileLocks(Mutex<Option<zarrs_gds_store::KeyLockGuard>>);

#[pymethods]
impl PyFileLocks {
    /// Release the locks (again: nothing).
    fn release(&self) {
        drop(lock(&self.0).take());
    }
}

/// Lock the value files `paths` (absolute, under a store's resolved directory) as zarrs_gpu's own
/// writes lock the chunks they change, waiting (without the interpreter lock) while another
/// write of this process holds any: zarr-python's writes through `GpuCodecPipeline` take them so
/// that they and zarrs_gpu's writes of one chunk never lose an update.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)] // extracted from Python as it is
fn _lock_files(py: Python<'_>, paths: Vec<PathBuf>) -> PyFileLocks {
    let ids: Vec<zarrs_gds_store::LockId> = paths.into_iter().map(zarrs_gds_store::LockId::File).collect();
    let guard = py.allow_threads(|| zarrs_gds_store::KeyLocks::lock(ids));
    PyFileLocks(Mutex::new(Some(guard)))
}

/// `url` without user, password, query or fragment, as every message shows a URL.
#[pyfunction]
fn _redact_url(url: &str) -> String {
    zarrs_gds_store::redact_url(url)
}

/// Open the Zarr array `array` (a node path; the leading `/` is optional) of the store at
/// `store_path` (a directory, or an object store's URL: `s3://bucket/prefix`,
/// `https://host/prefix`, with `storage_options`) for reads to GPU `device` (and writes, with
/// `mode="r+"`). `backend`: "auto", "gds" or "posix"; `decode_trust`: "verified", "checked" or
/// "trusted".
#[pyfunction]
#[pyo3(signature = (store_path, array="/", *, device=0, backend=None, decode_trust=None, mode="r", storage_options=None))]
#[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)] // Python's keywords, extracted owned
fn open(
    py: Python<'_>,
    store_path: PathBuf,
    array: &str,
    device: i128,
    backend: Option<&str>,
    decode_trust: Option<&str>,
    mode: &str,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyZarrArray> {
    let writable = match mode {
        "r" => false,
        "r+" => true,
        other => return Err(PyValueError::new_err(format!("mode={other:?}: \"r\" (read) or \"r+\" (read and write)"))),
    };
    let device = device_ordinal(device)?;
    let url = store_path.to_str().filter(|location| AnyStore::is_url(location)).map(str::to_string);
    if url.is_none() && !store_path.exists() {
        return Err(PyFileNotFoundError::new_err(format!("{}: no such directory", store_path.display())));
    }
    let options = self::storage_options(storage_options)?;
    let config = config(device, backend, decode_trust)?;
    let node = zarrs_gpu::open::node_path(array);
    // What messages and the repr show: a URL without credentials or signatures.
    let shown = url.as_deref().map_or_else(|| store_path.clone(), |u| PathBuf::from(zarrs_gds_store::redact_url(u)));
    // Storage requests (remote ones may wait on a server, retrying) without the interpreter
    // lock, on their own thread: Ctrl-C interrupts the wait.
    let (shown_at, node_at, array_at) = (shown.clone(), node.clone(), array.to_string());
    #[allow(clippy::result_large_err)] // once per opening
    let opened = interruptible(py, None, move || {
        // A directory by its path as given (not every path is text); a URL, or options a
        // directory refuses, by text.
        let store = match &url {
            None if options.is_empty() => zarrs_gpu::store_at(&store_path),
            _ => zarrs_gpu::open::store_with_options(&store_path.to_string_lossy(), &options),
        }?;
        // The metadata as stored, read before the array opens: a rewrite in between makes the
        // next comparison (`_stored_metadata`) differ, never hides.
        let opened_metadata = stored_metadata(&store, &node_at).ok().flatten();
        Ok((zarrs_gpu::open_array_in(&store, &shown_at, &array_at, "array=...")?, opened_metadata))
    })?;
    let (opened, opened_metadata) = opened.map_err(|err: zarrs_gpu::OpenError| match err {
        // zarr-python raises its ArrayNotFoundError here; ours is a FileNotFoundError and a
        // ValueError as zarr's is (zarrs_gpu/errors.py says why it is not zarr's class).
        zarrs_gpu::OpenError::NodeNotFound { .. } => py
            .import("zarrs_gpu.errors")
            .and_then(|m| m.getattr("ArrayNotFoundError"))
            .and_then(|class| Ok(class.downcast_into::<pyo3::types::PyType>()?))
            .map_or_else(|e| e, |class| PyErr::from_type(class, err.to_string())),
        err => PyValueError::new_err(err.to_string()),
    })?;
    let coalescer = Arc::new(Coalescer::new(config.coalesce_window().unwrap_or_default()));
    Ok(PyZarrArray { array: Arc::new(opened), config, coalescer, path: shown, node, writable, opened_metadata })
}

/// Read `subset` of the Zarr array `array` of the store at `store_path` to GPU `device`: one
/// call of `open(...).read(subset)`.
#[pyfunction]
#[pyo3(signature = (store_path, array="/", subset=None, *, device=0, backend=None, decode_trust=None, storage_options=None))]
#[allow(clippy::too_many_arguments)] // Python's keywords
fn read(
    py: Python<'_>,
    store_path: PathBuf,
    array: &str,
    subset: Option<&Bound<'_, PyAny>>,
    device: i128,
    backend: Option<&str>,
    decode_trust: Option<&str>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyDeviceArray> {
    open(py, store_path, array, device, backend, decode_trust, "r", storage_options)?.read(py, subset)
}

/// Give back to the driver the device memory (and pinned host memory) this package keeps idle
/// between reads, on every GPU it has used, as `torch.cuda.empty_cache()` does for PyTorch's.
/// Arrays still alive keep theirs. Reads keep at most max(1 GiB, 2% of the device) of device
/// memory idle anyway, and of pinned host memory that or a sixteenth of the host's memory up to
/// 8 GiB, whichever is larger (`ZARRS_GPU_POOL_KEEP_BYTES` sets another bound for both).
#[pyfunction]
fn empty_cache(py: Python<'_>) -> PyResult<()> {
    py.allow_threads(zarrs_gpu::empty_cache).map_err(py_err)
}

/// The memory reads on GPU `device` hold now, as a dict of byte counts: `device_free` and
/// `device_total` (the driver's figures), `output_pool_idle` (freed results kept for the next
/// read), `staging_pooled`, `pinned_pooled` (host), `pool_keep` (the bound on idle device memory)
/// and `pinned_keep` (the bound on idle pinned host memory).
#[pyfunction]
#[pyo3(signature = (device=0))]
fn memory_in_use(py: Python<'_>, device: usize) -> PyResult<std::collections::HashMap<&'static str, u64>> {
    let m = py.allow_threads(|| zarrs_gpu::memory_in_use(device)).map_err(py_err)?;
    Ok(std::collections::HashMap::from([
        ("device_free", m.device_free),
        ("device_total", m.device_total),
        ("output_pool_idle", m.output_pool_idle),
        ("staging_pooled", m.staging_pooled),
        ("pinned_pooled", m.pinned_pooled),
        ("pool_keep", m.pool_keep),
        ("pinned_keep", m.pinned_keep),
    ]))
}

extern "C" {
    // Not in the limited API's headers, but exported by every CPython since 3.4: the one way to
    // ask whether this thread holds the interpreter lock (a DLPack deleter may run on any thread).
    fn PyGILState_Check() -> std::os::raw::c_int;
}

/// The wrapper of every blocking wait of a release (a DLPack deleter, a dropped array): without
/// the interpreter lock where this thread holds it, so that other threads (one whose read is
/// timing out among them) go on while it waits.
fn release_wait(wait: &mut dyn FnMut()) {
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

/// The interpreter's package directories (`sys.path`, site and user site directories), where pip
/// put nvCOMP's wheel: for a venv's python run by its path, `VIRTUAL_ENV` is not set.
fn python_package_dirs(py: Python<'_>) -> PyResult<Vec<PathBuf>> {
    let sys = py.import("sys")?;
    let site = py.import("site")?;
    let mut dirs: Vec<PathBuf> = sys.getattr("path")?.extract()?;
    if let Ok(more) = site.call_method0("getsitepackages").and_then(|d| d.extract::<Vec<PathBuf>>()) {
        dirs.extend(more);
    }
    if let Ok(user) = site.call_method0("getusersitepackages").and_then(|d| d.extract::<PathBuf>()) {
        dirs.push(user);
    }
    Ok(dirs)
}

/// Where nvCOMP will be looked for, in order (for the tests: the interpreter's directories are
/// among them).
#[pyfunction]
fn _nvcomp_candidates() -> Vec<String> {
    zarrs_gpu::nvcomp_sys::candidates()
}

/// What `key` selects of an array of `shape`, without an array: the box read (a (start, stop) pair
/// per dimension) and the result's shape. `key` as for `Array.read` (a string is the command
/// line's form, whose integers keep their dimension). For tests of the index rule against numpy.
#[pyfunction]
#[allow(clippy::type_complexity, clippy::needless_pass_by_value)] // extracted from Python as it is
fn _selection(key: Option<&Bound<'_, PyAny>>, shape: Vec<u64>) -> PyResult<(Vec<(u64, u64)>, Vec<u64>)> {
    let (ranges, out_shape) = key_to_subset(key, &shape)?;
    Ok((ranges.iter().map(|r| (r.start, r.end)).collect(), out_shape))
}

#[pymodule]
fn _zarrs_gpu(m: &Bound<'_, PyModule>) -> PyResult<()> {
    zarrs_gpu::nvcomp_sys::add_search_dirs(python_package_dirs(m.py())?);
    zarrs_gpu_codecs::set_release_wait_wrapper(release_wait);
    m.add_function(wrap_pyfunction!(_nvcomp_candidates, m)?)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(_object_store_options, m)?)?;
    m.add_function(wrap_pyfunction!(_redact_url, m)?)?;
    m.add_function(wrap_pyfunction!(_lock_files, m)?)?;
    m.add_class::<PyFileLocks>()?;
    m.add_function(wrap_pyfunction!(read, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(memory_in_use, m)?)?;
    m.add_function(wrap_pyfunction!(_selection, m)?)?;
    m.add_function(wrap_pyfunction!(tiles, m)?)?;
    m.add_class::<PyZarrArray>()?;
    m.add_class::<PyDeviceArray>()?;
    m.add_class::<PyReadAhead>()?;
    m.add_class::<PyPendingRead>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
