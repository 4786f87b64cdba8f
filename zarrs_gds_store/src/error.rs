use std::path::PathBuf;

use zarrs_storage::StorageError;

/// An error from a read into device memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceReadError {
    /// No usable CUDA driver or device.
    #[error("no CUDA device available: {0}")]
    NoCuda(String),
    /// An environment variable holds a value that cannot be used.
    #[error("{variable}={value:?} cannot be used: expected {expected}")]
    Config {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },
    /// The reader's thread pool could not be started.
    #[error("starting reader threads: {0}")]
    ThreadPool(String),
    /// A CUDA driver call failed.
    #[error("CUDA error while {what}: {source}")]
    Cuda {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A value whose size is known in advance has another.
    #[error("{what}: the value holds {size} bytes, {expected} expected")]
    WrongSize {
        /// The file or key.
        what: String,
        /// Its size.
        size: u64,
        /// The size it must have.
        expected: u64,
    },
    /// A read asked for bytes past the end of a value.
    #[error("{what}: bytes {start}..{end} requested but the value holds {size} bytes")]
    PastEnd {
        /// The key or file.
        what: String,
        /// The first byte requested.
        start: u64,
        /// One past the last byte requested.
        end: u64,
        /// The value's size.
        size: u64,
    },
    /// Native GPUDirect Storage was forced but is not usable.
    #[error("GPUDirect Storage was requested but is not usable: {0}")]
    GdsUnavailable(String),
    /// A cuFile call failed.
    #[error("cuFile error while {what}: {detail}")]
    CuFile {
        /// What was being done.
        what: &'static str,
        /// The library's error code, decoded.
        detail: String,
    },
    /// The underlying store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl DeviceReadError {
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

impl From<DeviceReadError> for StorageError {
    fn from(err: DeviceReadError) -> Self {
        match err {
            DeviceReadError::Storage(err) => err,
            DeviceReadError::Io { path, source } => {
                StorageError::Other(format!("reading {}: {source}", path.display()))
            }
            other => StorageError::Other(other.to_string()),
        }
    }
}
