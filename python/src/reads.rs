//! Reads and writes of the array's bytes, whatever their data type: the results are
//! [`DeviceBytes`], which carry it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use dlpark::SafeManagedTensorVersioned;
use pyo3::exceptions::{PyImportError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use zarrs::array::{Array, ArraySubset};
use zarrs_gds_store::AnyStore;
use zarrs_gpu::{
    read_async, ArrayDeviceExt, ArrayDeviceWriteExt, DeviceBytes, GpuConfig, GpuError, PendingRead, ReadAhead,
    RetrieveReport, WriteReport,
};
use zarrs_gpu_codecs::Cancel;

use crate::util::{interruptible, py_err, STOP_WAIT};

/// A read's device array, shared with the tensors handed out, and its report.
pub(crate) type Read = (Arc<DeviceBytes>, RetrieveReport);

/// The array's element type: its name (zarrs' and numpy's) and the CUDA array interface's type
/// string (None where numpy has none: bfloat16).
pub(crate) fn element_type(array: &Array<AnyStore>) -> PyResult<(&'static str, Option<&'static str>)> {
    zarrs_gpu::element::element_type(array.data_type()).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "data type {} is not supported on the device (fixed-size numeric types are)",
            array.data_type()
        ))
    })
}

/// numpy's dtype of the element type `name` (ml_dtypes' for bfloat16, or the name itself where
/// that is not installed); numpy missing is an ImportError naming `what` needs it.
pub(crate) fn numpy_dtype<'py>(py: Python<'py>, name: &str, what: &str) -> PyResult<Bound<'py, PyAny>> {
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

/// Read `subset`, with the shape `out_shape` (the subset's, less the dimensions an integer
/// index dropped).
pub(crate) fn read(
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    out_shape: Vec<u64>,
) -> Result<Read, GpuError> {
    let (data, report) = array.retrieve_array_subset_device_opt::<DeviceBytes>(subset, config)?;
    Ok((Arc::new(data.reshape(out_shape)?), report))
}

/// Read `subsets` as one request: one array per subset with the shape its key selects, or
/// (`stack`) one array of shape `(n, *shape)` where they share `shape`.
pub(crate) fn read_many(
    array: &Array<AnyStore>,
    boxes: &[(ArraySubset, Vec<u64>)],
    config: &GpuConfig,
    stack: bool,
) -> Result<(Vec<Arc<DeviceBytes>>, RetrieveReport), GpuError> {
    let subsets: Vec<ArraySubset> = boxes.iter().map(|(subset, _)| subset.clone()).collect();
    if stack {
        let (data, report) = array.retrieve_array_subsets_stacked_device_opt::<DeviceBytes>(&subsets, config)?;
        let shape: Vec<u64> = std::iter::once(boxes.len() as u64).chain(boxes[0].1.iter().copied()).collect();
        return Ok((vec![Arc::new(data.reshape(shape)?)], report));
    }
    let (arrays, report) = array.retrieve_array_subsets_device_opt::<DeviceBytes>(&subsets, config)?;
    let arrays = arrays
        .into_iter()
        .zip(boxes)
        .map(|(data, (_, shape))| Ok(Arc::new(data.reshape(shape.clone())?)))
        .collect::<Result<_, GpuError>>()?;
    Ok((arrays, report))
}

/// A read kept in flight: the box read and, where the read succeeded, its data (shaped as its
/// key selects) and report.
pub(crate) type TileRead = (ArraySubset, Result<Read, GpuError>);

/// Boxes to read, each with the shape its key selects.
pub(crate) type Boxes = Vec<(ArraySubset, Vec<u64>)>;

/// Reads kept in flight ([`ReadAhead`]), each shaped as its key selects.
pub(crate) struct TileReads {
    reads: ReadAhead<DeviceBytes>,
    /// The boxes not yet handed out and the shapes their keys select, in order.
    pending: VecDeque<(ArraySubset, Vec<u64>)>,
}

impl TileReads {
    /// Start reading `boxes` of `array`, at most `depth` ahead.
    pub(crate) fn start(array: Arc<Array<AnyStore>>, boxes: Boxes, config: GpuConfig, depth: usize) -> Self {
        let subsets: Vec<ArraySubset> = boxes.iter().map(|(subset, _)| subset.clone()).collect();
        Self { reads: ReadAhead::new(array, subsets, config, depth), pending: boxes.into() }
    }

    /// The next read, waiting at most `timeout` for it (`Poll::Pending`: not yet; it goes on).
    pub(crate) fn next_read(&mut self, timeout: Duration) -> Poll<Option<TileRead>> {
        let Poll::Ready(read) = self.reads.next_timeout(timeout) else { return Poll::Pending };
        let Some(read) = read else { return Poll::Ready(None) };
        let Some((subset, shape)) = self.pending.pop_front() else { return Poll::Ready(None) };
        let read = read.and_then(|(_, data, report)| Ok((Arc::new(data.reshape(shape)?), report)));
        Poll::Ready(Some((subset, read)))
    }
}

/// One read started on its own thread ([`read_async`]), shaped as its key selects.
pub(crate) struct PendingTile {
    read: PendingRead<DeviceBytes>,
    shape: Vec<u64>,
}

impl PendingTile {
    /// Start reading `subset` of `array`, to be shaped `shape`.
    pub(crate) fn start(array: Arc<Array<AnyStore>>, subset: ArraySubset, shape: Vec<u64>, config: GpuConfig) -> Self {
        Self { read: read_async(array, subset, config), shape }
    }

    pub(crate) fn is_done(&self) -> bool {
        self.read.is_done()
    }

    /// The read's result, waiting at most `timeout` for it (`Poll::Pending`: not yet; it goes on).
    pub(crate) fn wait(&mut self, timeout: Duration) -> Poll<Result<Read, GpuError>> {
        let shape = &self.shape;
        self.read.wait_timeout(timeout).map(|read| {
            let (data, report) = read?;
            Ok((Arc::new(data.reshape(shape.clone())?), report))
        })
    }
}

/// Read `subset` into `tensor`'s memory (another library's), on a thread of its own
/// ([`interruptible`]: Ctrl-C stops the read before it writes more into the tensor). The tensor
/// is released with the interpreter lock held (a Python producer's deleter needs it).
pub(crate) fn read_into(
    py: Python<'_>,
    array: &Arc<Array<AnyStore>>,
    subset: &ArraySubset,
    config: &GpuConfig,
    tensor: SafeManagedTensorVersioned,
) -> PyResult<RetrieveReport> {
    let mut out = DeviceBytes::from_dlpack(tensor, array.data_type().clone()).map_err(py_err)?;
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

/// Write `tensor` (another library's device memory, the subset's shape) into `subset`. The write
/// runs without the interpreter lock; the tensor is released with it held.
pub(crate) fn write_from(
    py: Python<'_>,
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    tensor: SafeManagedTensorVersioned,
) -> PyResult<WriteReport> {
    // The selection's shape (integers as 1s) over the value's (integers dropped).
    let data = DeviceBytes::from_dlpack(tensor, array.data_type().clone())
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
