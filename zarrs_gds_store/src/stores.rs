//! [`AnyStore`]: a directory's [`GdsStore`] or an object store's [`RemoteStore`], chosen from a
//! path or a URL, for programs that open what their user names (the command line, Python).

use zarrs_storage::byte_range::ByteRangeIterator;
use zarrs_storage::{
    Bytes, ListableStorageTraits, MaybeBytes, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits,
    StorageError, StoreKey, StoreKeys, StoreKeysPrefixes, StorePrefix, WritableStorageTraits,
};

use crate::remote::RemoteStore;
use crate::store::GdsStore;

/// A [`GdsStore`] or a [`RemoteStore`]: the device pipeline recognises each behind this type and
/// reads it its own way.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per opened array, never moved in a loop
pub enum AnyStore {
    /// A directory.
    Gds(GdsStore),
    /// An object store.
    Remote(RemoteStore),
}

impl AnyStore {
    /// Whether `location` is a URL of an object store (`s3://`, `http://`, `https://`) rather
    /// than a path.
    #[must_use]
    pub fn is_url(location: &str) -> bool {
        location
            .split_once("://")
            .is_some_and(|(scheme, _)| matches!(scheme.to_ascii_lowercase().as_str(), "s3" | "s3a" | "http" | "https"))
    }

    /// The store at `location`: an object store's URL ([`RemoteStore::from_url`], with
    /// `options`) or a directory's path (`options` must then be empty).
    ///
    /// # Errors
    /// Returns an error naming the location when the URL or its options are not usable, or the
    /// directory cannot be a store.
    pub fn open<K: AsRef<str>, V: AsRef<str>>(
        location: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, StorageError> {
        if Self::is_url(location) {
            return RemoteStore::from_url(location, options).map(Self::Remote);
        }
        if let Some((key, _)) = options.into_iter().next() {
            return Err(StorageError::Other(format!(
                "{location}: a directory takes no storage options ({} given)",
                key.as_ref()
            )));
        }
        GdsStore::new(location).map(Self::Gds).map_err(|e| StorageError::Other(format!("{location}: {e}")))
    }

    /// The `GdsStore`, when it is one.
    #[must_use]
    pub fn gds(&self) -> Option<&GdsStore> {
        match self {
            Self::Gds(store) => Some(store),
            Self::Remote(_) => None,
        }
    }

    /// The `RemoteStore`, when it is one.
    #[must_use]
    pub fn remote(&self) -> Option<&RemoteStore> {
        match self {
            Self::Gds(_) => None,
            Self::Remote(store) => Some(store),
        }
    }

    fn readable(&self) -> &dyn ReadableStorageTraits {
        match self {
            Self::Gds(store) => store,
            Self::Remote(store) => store,
        }
    }

    fn writable(&self) -> &dyn WritableStorageTraits {
        match self {
            Self::Gds(store) => store,
            Self::Remote(store) => store,
        }
    }

    fn listable(&self) -> &dyn ListableStorageTraits {
        match self {
            Self::Gds(store) => store,
            Self::Remote(store) => store,
        }
    }
}

impl From<GdsStore> for AnyStore {
    fn from(store: GdsStore) -> Self {
        Self::Gds(store)
    }
}

impl From<RemoteStore> for AnyStore {
    fn from(store: RemoteStore) -> Self {
        Self::Remote(store)
    }
}

impl ReadableStorageTraits for AnyStore {
    fn get(&self, key: &StoreKey) -> Result<MaybeBytes, StorageError> {
        self.readable().get(key)
    }

    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        self.readable().get_partial_many(key, byte_ranges)
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        self.readable().size_key(key)
    }

    fn supports_get_partial(&self) -> bool {
        self.readable().supports_get_partial()
    }
}

impl WritableStorageTraits for AnyStore {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        self.writable().set(key, value)
    }

    fn set_partial_many(&self, key: &StoreKey, offset_values: OffsetBytesIterator) -> Result<(), StorageError> {
        self.writable().set_partial_many(key, offset_values)
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        self.writable().erase(key)
    }

    fn erase_many(&self, keys: &[StoreKey]) -> Result<(), StorageError> {
        self.writable().erase_many(keys)
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        self.writable().erase_prefix(prefix)
    }

    fn supports_set_partial(&self) -> bool {
        self.writable().supports_set_partial()
    }
}

impl ListableStorageTraits for AnyStore {
    fn list(&self) -> Result<StoreKeys, StorageError> {
        self.listable().list()
    }

    fn list_prefix(&self, prefix: &StorePrefix) -> Result<StoreKeys, StorageError> {
        self.listable().list_prefix(prefix)
    }

    fn list_dir(&self, prefix: &StorePrefix) -> Result<StoreKeysPrefixes, StorageError> {
        self.listable().list_dir(prefix)
    }

    fn size_prefix(&self, prefix: &StorePrefix) -> Result<u64, StorageError> {
        self.listable().size_prefix(prefix)
    }

    fn size(&self) -> Result<u64, StorageError> {
        self.listable().size()
    }
}
