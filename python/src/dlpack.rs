//! Other libraries' device arrays, through DLPack.

use dlpark::SafeManagedTensorVersioned;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// DLPack's device type of CUDA memory.
pub(crate) const KDL_CUDA: i32 = 2;

/// Whether `value` is in CUDA device memory by DLPack's account (`__dlpack_device__`).
pub(crate) fn on_cuda_device(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !value.hasattr("__dlpack_device__")? {
        return Ok(false);
    }
    let device = value.call_method0("__dlpack_device__")?;
    Ok(device.extract::<(i32, i32)>().is_ok_and(|(device_type, _)| device_type == KDL_CUDA))
}

/// `value.__dlpack__(stream=1, max_version=(1, 0))` as a DLPack 1.0 tensor (`what` names it in
/// errors): the producer's work is ordered before the legacy default stream.
pub(crate) fn versioned_capsule(
    py: Python<'_>,
    value: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<SafeManagedTensorVersioned> {
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

/// `read_into`'s `out` must be device memory that DLPack hands over: refuse anything else (a
/// numpy array, whose `__dlpack__` would only say that numpy takes no stream) plainly.
pub(crate) fn check_device_destination(out: &Bound<'_, PyAny>) -> PyResult<()> {
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
