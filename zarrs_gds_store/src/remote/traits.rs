//! zarrs' storage traits for a [`RemoteStore`]: partial reads (nearby ranges of a value fetched
//! together), listing, writes.

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use zarrs_storage::byte_range::{ByteRange, ByteRangeIterator};
use zarrs_storage::{
    Bytes, ListableStorageTraits, MaybeBytes, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits,
    StorageError, StoreKey, StoreKeys, StoreKeysPrefixes, StorePrefix, StorePrefixes, WritableStorageTraits,
};

use super::{block_on, get_range, in_any_order, RemoteStore, PARTIAL_CONCURRENCY};

impl ReadableStorageTraits for RemoteStore {
    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        let ranges: Vec<ByteRange> = byte_ranges.collect();
        let bounded: Option<Vec<(u64, u64)>> = ranges
            .iter()
            .map(|r| match *r {
                ByteRange::FromStart(offset, Some(len)) if len > 0 => Some((offset, len)),
                _ => None,
            })
            .collect();
        let values: Option<Vec<Bytes>> = block_on(async {
            if let Some(bounded) = bounded {
                return self.get_ranges(key, &bounded).await;
            }
            let fetches = ranges.iter().map(|&range| async move {
                match range {
                    ByteRange::FromStart(offset, Some(len)) => Ok(self.get_exact(key, offset, len).await?.map(|g| g.0)),
                    other => self.get(key, get_range(other)?).await,
                }
            });
            let values: Vec<MaybeBytes> = in_any_order(fetches, PARTIAL_CONCURRENCY).await?;
            Ok::<_, StorageError>(values.into_iter().collect())
        })?;
        Ok(values.map(|values| {
            Box::new(values.into_iter().map(Ok)) as Box<dyn Iterator<Item = Result<Bytes, StorageError>> + 'a>
        }))
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        block_on(self.size(key))
    }

    fn supports_get_partial(&self) -> bool {
        true
    }
}

fn store_key(path: &ObjectPath) -> Result<StoreKey, StorageError> {
    StoreKey::new(path.as_ref()).map_err(|e| StorageError::Other(e.to_string()))
}

fn prefix_path(prefix: &StorePrefix) -> Option<ObjectPath> {
    let trimmed = prefix.as_str().trim_end_matches('/');
    (!trimmed.is_empty()).then(|| ObjectPath::from(trimmed))
}

impl ListableStorageTraits for RemoteStore {
    fn list(&self) -> Result<StoreKeys, StorageError> {
        self.list_prefix(&StorePrefix::root())
    }

    fn list_prefix(&self, prefix: &StorePrefix) -> Result<StoreKeys, StorageError> {
        let store = self.object_store("listing")?;
        let error = |e: object_store::Error| StorageError::Other(format!("{}: listing {prefix}: {e}", self.name));
        let metas: Vec<_> = block_on(store.list(prefix_path(prefix).as_ref()).try_collect()).map_err(error)?;
        let mut keys = metas.iter().map(|m| store_key(&m.location)).collect::<Result<Vec<_>, _>>()?;
        keys.sort();
        Ok(keys)
    }

    fn list_dir(&self, prefix: &StorePrefix) -> Result<StoreKeysPrefixes, StorageError> {
        let store = self.object_store("listing")?;
        let error = |e: object_store::Error| StorageError::Other(format!("{}: listing {prefix}: {e}", self.name));
        let listed = block_on(store.list_with_delimiter(prefix_path(prefix).as_ref())).map_err(error)?;
        let mut keys = listed.objects.iter().map(|m| store_key(&m.location)).collect::<Result<Vec<_>, _>>()?;
        let mut prefixes: StorePrefixes = listed
            .common_prefixes
            .iter()
            .map(|p| StorePrefix::new(format!("{p}/")).map_err(|e| StorageError::Other(e.to_string())))
            .collect::<Result<_, _>>()?;
        keys.sort();
        prefixes.sort();
        Ok(StoreKeysPrefixes::new(keys, prefixes))
    }

    fn size_prefix(&self, prefix: &StorePrefix) -> Result<u64, StorageError> {
        let store = self.object_store("listing")?;
        let error = |e: object_store::Error| StorageError::Other(format!("{}: listing {prefix}: {e}", self.name));
        let metas: Vec<_> = block_on(store.list(prefix_path(prefix).as_ref()).try_collect()).map_err(error)?;
        Ok(metas.iter().map(|m| m.size).sum())
    }
}

impl WritableStorageTraits for RemoteStore {
    /// One PUT: object stores replace a value whole, so no reader sees a torn one.
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        let store = self.object_store("writes")?;
        block_on(store.put(&Self::object_path(key), PutPayload::from_bytes(value)))
            .map_err(|e| StorageError::Other(format!("{}: writing {key}: {e}", self.name)))?;
        Ok(())
    }

    fn set_partial_many(&self, key: &StoreKey, offset_values: OffsetBytesIterator) -> Result<(), StorageError> {
        zarrs_storage::store_set_partial_many(self, key, offset_values)
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        let store = self.object_store("writes")?;
        match block_on(store.delete(&Self::object_path(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StorageError::Other(format!("{}: erasing {key}: {e}", self.name))),
        }
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        let store = self.object_store("writes")?.clone();
        let error = |e: object_store::Error| StorageError::Other(format!("{}: erasing {prefix}: {e}", self.name));
        block_on(async move {
            let locations = store.list(prefix_path(prefix).as_ref()).map_ok(|m| m.location).boxed();
            store.delete_stream(locations).try_collect::<Vec<_>>().await
        })
        .map_err(error)?;
        Ok(())
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}
