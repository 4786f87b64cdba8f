//! Writes of host values: zarrs encodes and stores them, holding this process's chunk locks, and
//! on a [`GdsStore`] each chunk (or shard) it reads, modifies and stores again is replaced only if
//! its file is still the version zarrs read, as the device writer's read-modify-writes are. Another
//! process's write in between is then an error naming the key, never a lost update.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use zarrs::array::{Array, ArrayBytes, ArraySubset};
use zarrs_gds_store::{Expected, KeyLocks};
use zarrs_storage::byte_range::ByteRangeIterator;
use zarrs_storage::{
    Bytes, MaybeBytes, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits, ReadableWritableStorageTraits,
    StorageError, StoreKey, StorePrefix, WritableStorageTraits,
};

use super::store::gds_of;
use super::{chunks_meeting, lock_id};
use crate::config::GpuConfig;
use crate::error::GpuError;

/// Store `bytes` (the subset's elements in C order, as zarrs' `store_array_subset` takes them) into
/// `subset` of `array` on the host, as zarrs does with its global codec options (its
/// `store_empty_chunks` included), holding the locks of the chunks it writes
/// ([`lock_chunks`](super::lock_chunks)):
/// two writes of this process that share a chunk never lose an update. On a `GdsStore`, a chunk
/// or shard that zarrs reads to modify is replaced (or erased) only if its file is still the
/// version read: a change by another process in between is an error naming the key, its bytes
/// kept. Whatever is written, `config`'s shard index cache forgets.
///
/// # Errors
/// Returns an error when the subset lies outside the array, the bytes do not fit it, or zarrs
/// cannot encode or store a chunk (naming it; chunks stored before it keep their new values).
pub fn store_array_subset_host<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    bytes: ArrayBytes<'_>,
    config: &GpuConfig,
) -> Result<(), GpuError> {
    // zarrs' global options carry its store_empty_chunks (its plain store_* take the defaults).
    let options = zarrs::config::global_config().codec_options();
    // The chunks (or shards) it writes, listed once: locked, and forgotten by the cache after.
    let keys: Vec<StoreKey> = chunks_meeting(array, subset)?.into_iter().map(|(_, key, _)| key).collect();
    let storage = array.storage();
    let locked = KeyLocks::lock(keys.iter().map(|key| lock_id(&storage, key)));
    let stored = if gds_of(&storage).is_some() {
        // The same array over a view of its store whose sets compare versions: the metadata as
        // opened, so the codecs and chunk grid are the ones the caller's array uses.
        let checked = Arc::new(CheckedWrites::new(storage.clone()));
        Array::new_with_metadata(checked, array.path().as_str(), array.metadata().clone())
            .map_err(|e| {
                GpuError::Array(zarrs::array::ArrayError::StorageError(StorageError::Other(format!(
                    "opening {} again for a checked write: {e}",
                    array.path()
                ))))
            })
            .and_then(|view| view.store_array_subset_opt(subset, bytes, &options).map_err(GpuError::from))
    } else {
        array.store_array_subset_opt(subset, bytes, &options).map_err(GpuError::from)
    };
    drop(locked);
    // Whatever zarrs replaced (or failed midway through), the cache forgets.
    if let Some(cache) = config.shard_index_cache() {
        cache.forget(&keys.iter().collect());
    }
    stored
}

/// A view of a store for one write: the version of each value read whole (`get`, as zarrs reads a
/// chunk it modifies) is kept, and the value's `set` or `erase` on a `GdsStore` is made only if
/// its file is still that version. Values not read are written whatever is there.
struct CheckedWrites<S> {
    storage: Arc<S>,
    read: Mutex<HashMap<StoreKey, Expected>>,
}

impl<S: 'static> CheckedWrites<S> {
    fn new(storage: Arc<S>) -> Self {
        Self { storage, read: Mutex::new(HashMap::new()) }
    }

    /// The version `key` was read at (None: not read), forgotten: a value is stored once per read.
    fn expected(&self, key: &StoreKey) -> Expected {
        self.read.lock().unwrap_or_else(PoisonError::into_inner).remove(key).flatten()
    }
}

impl<S: ReadableWritableStorageTraits + 'static> ReadableStorageTraits for CheckedWrites<S> {
    fn get(&self, key: &StoreKey) -> Result<MaybeBytes, StorageError> {
        let Some(gds) = gds_of(&self.storage) else {
            return self.storage.get(key);
        };
        let (bytes, version) = gds.get_versioned(key)?;
        self.read.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone(), Some(version));
        Ok(bytes)
    }

    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        self.storage.get_partial_many(key, byte_ranges)
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        self.storage.size_key(key)
    }

    fn supports_get_partial(&self) -> bool {
        self.storage.supports_get_partial()
    }
}

impl<S: ReadableWritableStorageTraits + 'static> WritableStorageTraits for CheckedWrites<S> {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        match gds_of(&self.storage) {
            Some(gds) => gds.set_many_checked(&[(key.clone(), value)], &[self.expected(key)]),
            None => self.storage.set(key, value),
        }
    }

    fn set_partial_many(&self, key: &StoreKey, offset_values: OffsetBytesIterator) -> Result<(), StorageError> {
        // Partial writes are not offered (below): zarrs reads, modifies and sets the whole value.
        self.storage.set_partial_many(key, offset_values)
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        match gds_of(&self.storage) {
            Some(gds) => gds.erase_checked(key, self.expected(key)),
            None => self.storage.erase(key),
        }
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        self.storage.erase_prefix(prefix)
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zarrs::array::{ArrayBuilder, Element, FillValue};
    use zarrs_gds_store::GdsStore;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    fn array(dir: &std::path::Path) -> std::result::Result<Array<GdsStore>, Box<dyn std::error::Error>> {
        let array = ArrayBuilder::new(vec![8, 6], vec![4, 3], zarrs::array::data_type::int32(), FillValue::from(0i32))
            .build(Arc::new(GdsStore::new(dir)?), "/")?;
        array.store_metadata()?;
        Ok(array)
    }

    #[test]
    fn a_value_changed_between_read_and_write_is_refused_and_kept() -> Result {
        let dir = tempfile::tempdir()?;
        let array = array(dir.path())?;
        array.store_chunk(&[0, 0], (0..12).collect::<Vec<i32>>())?;
        let key = array.chunk_key(&[0, 0]);
        let view = CheckedWrites::new(array.storage());
        let read = view.get(&key)?.ok_or("chunk 0 was stored")?;
        // "Another process": a second store of the directory replaces the file in between.
        GdsStore::new(dir.path())?.set(&key, Bytes::from_static(b"theirs"))?;
        let err = view.set(&key, read.clone()).expect_err("a changed value must not be replaced").to_string();
        assert!(err.contains(key.as_str()) && err.contains("changed after"), "{err}");
        assert_eq!(std::fs::read(dir.path().join(key.as_str()))?, b"theirs");
        // Read again, the write lands; so does an erase of what was read, but not of a value
        // rewritten since.
        view.get(&key)?;
        view.set(&key, read)?;
        view.get(&key)?;
        GdsStore::new(dir.path())?.set(&key, Bytes::from_static(b"again"))?;
        assert!(view.erase(&key).is_err());
        assert_eq!(std::fs::read(dir.path().join(key.as_str()))?, b"again");
        view.get(&key)?;
        view.erase(&key)?;
        assert!(!dir.path().join(key.as_str()).exists());
        Ok(())
    }

    #[test]
    fn a_missing_value_read_then_created_by_another_writer_is_kept() -> Result {
        let dir = tempfile::tempdir()?;
        let array = array(dir.path())?;
        let key = array.chunk_key(&[1, 1]);
        let view = CheckedWrites::new(array.storage());
        assert!(view.get(&key)?.is_none());
        GdsStore::new(dir.path())?.set(&key, Bytes::from_static(b"theirs"))?;
        assert!(view.set(&key, Bytes::from_static(b"mine")).is_err());
        assert_eq!(std::fs::read(dir.path().join(key.as_str()))?, b"theirs");
        Ok(())
    }

    #[test]
    fn host_writes_equal_zarrs_own_and_follow_store_empty_chunks() -> Result {
        let dir = tempfile::tempdir()?;
        let ours = array(dir.path())?;
        let theirs = ArrayBuilder::new(vec![8, 6], vec![4, 3], zarrs::array::data_type::int32(), FillValue::from(0i32))
            .build(Arc::new(zarrs_storage::store::MemoryStore::new()), "/")?;
        let config = GpuConfig::default();
        let options = zarrs::config::global_config().codec_options();
        for (i, ranges) in [[1..7, 2..5], [0..8, 0..6], [3..4, 0..6], [0..4, 0..3]].into_iter().enumerate() {
            let subset = ArraySubset::new_with_ranges(&ranges);
            // The last write is all fill: its chunk is erased unless store_empty_chunks says keep.
            let values: Vec<i32> = if i == 3 {
                vec![0; 12]
            } else {
                (0..subset.num_elements_usize()).map(|k| (k as i32 + 1) * (i as i32 + 7)).collect()
            };
            let bytes = i32::into_array_bytes(ours.data_type(), values.clone())?;
            store_array_subset_host(&ours, &subset, bytes, &config)?;
            theirs.store_array_subset_opt(&subset, values, &options)?;
        }
        let all = ours.subset_all();
        assert_eq!(ours.retrieve_array_subset::<Vec<i32>>(&all)?, theirs.retrieve_array_subset::<Vec<i32>>(&all)?);
        let kept = dir.path().join(ours.chunk_key(&[0, 0]).as_str()).exists();
        assert_eq!(kept, zarrs::config::global_config().store_empty_chunks());
        Ok(())
    }
}
