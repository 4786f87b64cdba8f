//! Stores: their configuration, object-store options, file locks.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zarrs_gpu::{DecodeTrust, GpuConfig, IoBackend, ShardIndexCache};

use crate::util::{lock, py_err};

/// The configuration of `open` and `read`: the environment (each bad value an error naming its
/// variable), then the arguments; shard indexes kept for the array handle's reads.
pub(crate) fn config(device: usize, backend: Option<&str>, decode_trust: Option<&str>) -> PyResult<GpuConfig> {
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
pub(crate) fn storage_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, String)>> {
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
pub(crate) fn _object_store_options(
    url: &str,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<(String, String)>> {
    zarrs_gds_store::object_store_options(url, self::storage_options(storage_options)?)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// Locks of this process on value files (see `_lock_files`), held until `release()`.
#[pyclass(name = "_FileLocks", module = "zarrs_gpu", frozen)]
pub(crate) struct PyFileLocks(Mutex<Option<zarrs_gds_store::KeyLockGuard>>);

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
pub(crate) fn _lock_files(py: Python<'_>, paths: Vec<PathBuf>) -> PyFileLocks {
    let ids: Vec<zarrs_gds_store::LockId> = paths.into_iter().map(zarrs_gds_store::LockId::File).collect();
    let guard = py.allow_threads(|| zarrs_gds_store::KeyLocks::lock(ids));
    PyFileLocks(Mutex::new(Some(guard)))
}

/// `url` without user, password, query or fragment, as every message shows a URL.
#[pyfunction]
pub(crate) fn _redact_url(url: &str) -> String {
    zarrs_gds_store::redact_url(url)
}
