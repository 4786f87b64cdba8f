//! Reads and writes of any element type: the array's data type picks the typed call, behind
//! object-safe traits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use dlpark::{SafeManagedTensor, SafeManagedTensorVersioned};
use pyo3::exceptions::{PyImportError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use zarrs::array::{Array, ArraySubset, ElementOwned};
use zarrs_gds_store::AnyStore;
use zarrs_gpu::{
    read_async, ArrayDeviceExt, ArrayDeviceWriteExt, DeviceArray, GpuConfig, GpuError, PendingRead, ReadAhead,
    RetrieveReport, WriteReport,
};
use zarrs_gpu_codecs::{Cancel, DlpackStream};

use crate::util::{interruptible, py_err, STOP_WAIT};

/// A device array of any element type.
pub(crate) trait AnyArray: Send + Sync {
    fn shape(&self) -> &[u64];
    fn ptr(&self) -> u64;
    fn nbytes(&self) -> usize;
    fn ordinal(&self) -> usize;
    /// Wait (bounded) for all work on the array's device (its consumers' too) before its memory
    /// may be freed; where that wait does not end, the memory is leaked instead.
    fn settle(&self);
    fn dlpack<'py>(&self, py: Python<'py>, stream: DlpackStream, versioned: bool) -> PyResult<Bound<'py, PyAny>>;
}

pub(crate) struct Typed<T>(Arc<DeviceArray<T>>);

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

/// Read `subset` as `T`, with the shape `out_shape` (the subset's, less the dimensions an
/// integer index dropped).
pub(crate) fn read_typed<T: ElementOwned + Send + Sync + 'static>(
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    out_shape: Vec<u64>,
) -> Result<(Box<dyn AnyArray>, RetrieveReport), GpuError> {
    let (data, report) = array.retrieve_array_subset_device_opt::<T>(subset, config)?;
    Ok((Box::new(Typed(Arc::new(data.reshape(out_shape)?))), report))
}

pub(crate) fn read_any(
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
pub(crate) fn read_many_typed<T: ElementOwned + Send + Sync + 'static>(
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
pub(crate) type ReadMany = fn(
    &Array<AnyStore>,
    &[(ArraySubset, Vec<u64>)],
    &GpuConfig,
    bool,
) -> Result<(Vec<Box<dyn AnyArray>>, RetrieveReport), GpuError>;

/// A result of a read kept in flight: the box read and, where the read succeeded, its data
/// (shaped as its key selects) and report.
pub(crate) type AnyRead = (ArraySubset, Result<(Box<dyn AnyArray>, RetrieveReport), GpuError>);

/// Reads kept in flight ([`ReadAhead`]) of any element type.
pub(crate) trait AnyReadAhead: Send {
    /// The next read, waiting at most `timeout` for it (`Poll::Pending`: not yet; it goes on).
    fn next_read(&mut self, timeout: Duration) -> Poll<Option<AnyRead>>;
}

pub(crate) struct TypedReadAhead<T> {
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
pub(crate) type AnyResult = (Box<dyn AnyArray>, RetrieveReport);

/// Boxes to read, each with the shape its key selects.
pub(crate) type Boxes = Vec<(ArraySubset, Vec<u64>)>;

/// [`start_read_ahead`] for one element type.
pub(crate) type StartReadAhead = fn(Arc<Array<AnyStore>>, Boxes, GpuConfig, usize) -> Box<dyn AnyReadAhead>;

pub(crate) fn start_read_ahead<T: ElementOwned + Send + Sync + 'static>(
    array: Arc<Array<AnyStore>>,
    boxes: Boxes,
    config: GpuConfig,
    depth: usize,
) -> Box<dyn AnyReadAhead> {
    let subsets: Vec<ArraySubset> = boxes.iter().map(|(subset, _)| subset.clone()).collect();
    Box::new(TypedReadAhead { reads: ReadAhead::<T>::new(array, subsets, config, depth), pending: boxes.into() })
}

/// One read started on its own thread ([`read_async`]), of any element type.
pub(crate) trait AnyPending: Send {
    fn is_done(&self) -> bool;
    /// The read's result, waiting at most `timeout` for it (`Poll::Pending`: not yet; it goes on).
    fn wait(&mut self, timeout: Duration) -> Poll<Result<AnyResult, GpuError>>;
}

pub(crate) struct TypedPending<T> {
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
pub(crate) type StartPending = fn(Arc<Array<AnyStore>>, ArraySubset, Vec<u64>, GpuConfig) -> Box<dyn AnyPending>;

pub(crate) fn start_pending<T: ElementOwned + Send + Sync + 'static>(
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
pub(crate) fn read_into_typed<T: ElementOwned + Send + Sync + 'static>(
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

pub(crate) fn read_into_any(
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

/// Write `tensor` (another library's device memory, the subset's shape) into `subset`, as `T`.
/// The write runs without the interpreter lock; the tensor is released with it held.
pub(crate) fn write_from_typed<T: ElementOwned + Send + Sync + 'static>(
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

pub(crate) fn write_from_any(
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
