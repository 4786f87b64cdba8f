//! `zarrs_gpu.DeviceArray`: an array in GPU memory, shared with the tensors handed out.

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::sync::Arc;

use dlpark::{SafeManagedTensor, SafeManagedTensorVersioned};
use zarrs_gpu::{DeviceBytes, RetrieveReport};
use zarrs_gpu_codecs::DlpackStream;

use crate::dlpack::KDL_CUDA;
use crate::reports::report_dict;
use crate::util::{py_err, py_len};

/// An array in GPU memory, owned by this object (and shared with the tensors handed out):
/// `cupy.asarray(x)`, `cupy.from_dlpack(x)` and `torch.from_dlpack(x)` take it without a copy.
#[pyclass(name = "DeviceArray", module = "zarrs_gpu", frozen)]
pub(crate) struct PyDeviceArray {
    pub(crate) data: Arc<DeviceBytes>,
    pub(crate) dtype: &'static str,
    pub(crate) typestr: Option<&'static str>,
    pub(crate) report: RetrieveReport,
    /// Handed out through the CUDA array interface, whose consumers order nothing before the
    /// memory is freed: wait for the device first.
    pub(crate) interfaced: std::sync::atomic::AtomicBool,
}

impl PyDeviceArray {
    pub(crate) fn new(
        data: Arc<DeviceBytes>,
        (dtype, typestr): (&'static str, Option<&'static str>),
        report: RetrieveReport,
    ) -> Self {
        Self { data, dtype, typestr, report, interfaced: std::sync::atomic::AtomicBool::new(false) }
    }
}

impl PyDeviceArray {
    /// The CUDA device ordinal.
    fn ordinal(&self) -> usize {
        self.data.stream().context().ordinal()
    }
}

impl Drop for PyDeviceArray {
    fn drop(&mut self) {
        if self.interfaced.load(std::sync::atomic::Ordering::Relaxed) {
            // Bounded, without the interpreter lock (the wrapper `release_wait` installs).
            self.data.settle_for_release();
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
        self.data.num_bytes()
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> usize {
        PyDeviceArray::ordinal(self)
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
                self.ordinal()
            )));
        }
        let stream = DlpackStream::from_protocol(stream).map_err(py_err)?;
        if max_version.is_some_and(|v| v.0 >= 1) {
            let tensor: SafeManagedTensorVersioned = DeviceBytes::share_dlpack(&self.data, stream).map_err(py_err)?;
            tensor.into_pyobject(py)
        } else {
            let tensor: SafeManagedTensor = DeviceBytes::share_dlpack_legacy(&self.data, stream).map_err(py_err)?;
            tensor.into_pyobject(py)
        }
    }

    /// The DLPack protocol: (kDLCUDA, the device ordinal).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.ordinal() as i32)
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
        dict.set_item("data", (self.data.device_ptr(), false))?;
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
            self.ordinal(),
            self.report.decode
        )
    }
}
