use zarrs_gds_store::ReadError;

use crate::env::EnvError;
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
    /// Host memory to pin could not be mapped.
    #[error("mapping {bytes} bytes of host memory to pin: {source}")]
    HostMemory {
        /// The bytes asked for.
        bytes: usize,
        /// The system's error.
        source: std::io::Error,
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
    /// Reading the stored bytes failed (a file, a store, cuFile), or they are not the size asked.
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl DeviceReadError {
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

impl From<EnvError> for DeviceReadError {
    fn from(EnvError { variable, value, expected }: EnvError) -> Self {
        Self::Config { variable, value, expected }
    }
}

impl From<StorageError> for DeviceReadError {
    fn from(err: StorageError) -> Self {
        Self::Read(ReadError::Storage(err))
    }
}

impl From<DeviceReadError> for StorageError {
    fn from(err: DeviceReadError) -> Self {
        match err {
            DeviceReadError::Read(err) => err.into(),
            other => StorageError::Other(other.to_string()),
        }
    }
}
