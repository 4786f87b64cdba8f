use std::path::PathBuf;

use zarrs_storage::StorageError;

use crate::version::ValueChanged;

/// An error from reading stored values by byte range (into host memory, or into device memory
/// through cuFile).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
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
    /// A read into device memory was asked of a range whose file is not registered with cuFile.
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
    /// A CUDA driver call failed.
    #[error("CUDA error while {what}: {source}")]
    Cuda {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// The underlying store failed reading a key's bytes.
    #[error("reading {key}, bytes {start}..{end}: {source}")]
    Key {
        /// The key.
        key: String,
        /// The first byte asked for.
        start: u64,
        /// One past the last byte asked for.
        end: u64,
        /// The store's error.
        source: StorageError,
    },
    /// The underlying store failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A value was replaced between the planning of a read (its byte offsets, from a shard's
    /// index) and the read itself.
    #[error(transparent)]
    Changed(#[from] ValueChanged),
}

impl ReadError {
    /// The change of a value this error reports, also where a store's error carries it.
    #[must_use]
    pub fn value_changed(&self) -> Option<&ValueChanged> {
        match self {
            Self::Changed(changed) => Some(changed),
            Self::Storage(err) | Self::Key { source: err, .. } => ValueChanged::in_storage_error(err),
            _ => None,
        }
    }
}

impl From<ReadError> for StorageError {
    fn from(err: ReadError) -> Self {
        match err {
            ReadError::Storage(err) => err,
            ReadError::Changed(changed) => changed.into_storage_error(),
            other => StorageError::Other(other.to_string()),
        }
    }
}
