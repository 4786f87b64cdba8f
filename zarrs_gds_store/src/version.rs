//! Which version of a stored value a read's ranges come from ([`ValueVersion`]), and the error
//! of a read that finds another ([`ValueChanged`]): a reader that took byte offsets from one
//! version (a shard's index) reads the bytes at those offsets from that version or not at all.

use std::sync::Arc;

use zarrs_storage::StorageError;

use crate::write::FileVersion;

/// The version of a value that a read's ranges must come from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueVersion {
    /// A `GdsStore` file: its device, inode, size, modification and status-change times
    /// (compared with `fstat` of the descriptor read from). The status-change time is set by
    /// the kernel on every write and cannot be set back, so a rewrite in place that keeps the
    /// size and restores the modification time (`rsync --inplace -t`) is another version too.
    File(FileVersion),
    /// An object's ETag (sent with each GET as `If-Match`).
    ETag(Arc<str>),
}

/// A read found its value in another version than the one its ranges were planned from (a
/// writer replaced it in between): nothing it read from that value is used. A reader plans the
/// read again from the value's current version.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} changed while it was read: {reason}")]
pub struct ValueChanged {
    /// The key or file.
    pub what: String,
    /// What differs.
    pub reason: String,
}

impl ValueChanged {
    /// The change of `what`, for `reason`.
    #[must_use]
    pub fn new(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { what: what.into(), reason: reason.into() }
    }

    /// The change a storage error carries (as made by [`Self::into_storage_error`]).
    #[must_use]
    pub fn in_storage_error(err: &StorageError) -> Option<&Self> {
        match err {
            StorageError::IOError(io) => io.get_ref()?.downcast_ref(),
            _ => None,
        }
    }

    /// As a storage error that keeps its type ([`Self::in_storage_error`] finds it again).
    #[must_use]
    pub fn into_storage_error(self) -> StorageError {
        StorageError::IOError(Arc::new(std::io::Error::other(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_survives_a_storage_error() {
        let changed = ValueChanged::new("a/c/0", "replaced");
        let err = changed.clone().into_storage_error();
        assert_eq!(ValueChanged::in_storage_error(&err), Some(&changed));
        assert_eq!(err.to_string(), "a/c/0 changed while it was read: replaced");
        assert_eq!(ValueChanged::in_storage_error(&StorageError::Other("x".into())), None);
    }
}
