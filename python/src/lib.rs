//! Python bindings of zarrs_gpu: `zarrs_gpu.read` and `zarrs_gpu.open` load Zarr arrays straight
//! into GPU memory and return device arrays that CuPy, PyTorch and any DLPack or CUDA array
//! interface consumer take without a copy.

mod array;
mod device_array;
mod dlpack;
mod read_ahead;
mod reads;
mod reports;
mod selection;
mod stores;
mod util;

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{PyFileNotFoundError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zarrs_gds_store::AnyStore;
use zarrs_gpu_codecs::Coalescer;

use crate::array::{stored_metadata, tiles, PyZarrArray};
use crate::device_array::PyDeviceArray;
use crate::read_ahead::{PyPendingRead, PyReadAhead};
use crate::selection::key_to_subset;
use crate::stores::{_lock_files, _object_store_options, _redact_url, config, storage_options, PyFileLocks};
use crate::util::{device_ordinal, interruptible, py_err, release_wait};

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
