//! Ranges planned from one version of a value (a shard's index) are read from that version or
//! not at all: a `GdsStore` file compared by `fstat` of the descriptor read from, an object by
//! its ETag (`If-Match`).

use std::error::Error;
use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt, PutPayload};
use zarrs_gds_store::{GdsStore, ReadError, RemoteRange, RemoteStore, ValueChanged, ValueRange, ValueVersion};
use zarrs_storage::{StoreKey, WritableStorageTraits};

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

/// A range of a value, planned from `version`.
struct Planned {
    key: StoreKey,
    offset: u64,
    len: usize,
    version: Option<ValueVersion>,
}

impl ValueRange for Planned {
    fn key(&self) -> &StoreKey {
        &self.key
    }
    fn offset(&self) -> u64 {
        self.offset
    }
    fn len(&self) -> usize {
        self.len
    }
    fn version(&self) -> Option<&ValueVersion> {
        self.version.as_ref()
    }
}

fn file_version(path: &std::path::Path) -> Result<ValueVersion> {
    Ok(ValueVersion::File(zarrs_gds_store::FileVersion::of(&std::fs::metadata(path)?)))
}

#[test]
fn a_file_replaced_after_its_ranges_were_planned_is_not_read() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("a/c/0")?;
    store.set(&key, vec![1u8; 4096].into())?;
    let path = store.key_to_fspath(&key);
    let planned = |version| [Planned { key: key.clone(), offset: 100, len: 50, version: Some(version) }];
    // The same version: read.
    let ranges = planned(file_version(&path)?);
    let mut buf = [0u8; 50];
    assert!(store.open_for_host(&ranges)?.read_host(0, 0, &mut buf)?);
    assert_eq!(buf, [1u8; 50]);
    // Renamed over by a writer (same size): another version, not read.
    store.set(&key, vec![2u8; 4096].into())?;
    let err = store.open_for_host(&ranges).err().ok_or("read from the new file")?;
    let changed = err.value_changed().ok_or_else(|| format!("not a change: {err}"))?;
    assert!(changed.what.ends_with("a/c/0") && changed.reason.contains("replaced"), "{changed}");
    // Rewritten in place (same inode, same size): another version too (its status change).
    let ranges = planned(file_version(&path)?);
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&path, vec![3u8; 4096])?;
    assert!(store.open_for_host(&ranges).err().is_some_and(|e| e.value_changed().is_some()));
    // Removed: a change, where an unversioned range is simply missing.
    let ranges = planned(file_version(&path)?);
    store.erase(&key)?;
    let err = store.open_for_host(&ranges).err().ok_or("a removed file read")?;
    assert!(err.value_changed().is_some_and(|c| c.reason.contains("removed")), "{err}");
    let any = [Planned { key: key.clone(), offset: 0, len: 1, version: None }];
    assert!(!store.open_for_host(&any)?.read_host(0, 0, &mut buf[..1])?);
    // The change survives the conversion to a storage error.
    let storage: zarrs_storage::StorageError = err.into();
    assert!(ValueChanged::in_storage_error(&storage).is_some());
    Ok(())
}

#[test]
fn an_object_replaced_after_its_ranges_were_planned_is_not_read() -> Result {
    let objects = Arc::new(InMemory::new());
    let store = RemoteStore::new(objects.clone());
    let key = StoreKey::new("a/c/0")?;
    let put = |byte: u8| {
        let objects = objects.clone();
        futures::executor::block_on(objects.put(&ObjectPath::from("a/c/0"), PutPayload::from(vec![byte; 1000])))
    };
    put(1)?;
    let (_, e_tag) = store.stamp_and_e_tag(&key)?.ok_or("missing")?;
    let e_tag: Arc<str> = e_tag.ok_or("no ETag")?.into();
    let ranges = [RemoteRange { key: key.clone(), offset: 10, len: 20 }];
    let fetch = |e_tag: &Arc<str>| {
        let mut got = Vec::new();
        store
            .fetch_many_if_match(&ranges, &[Some(e_tag.clone())], |_, bytes| -> std::result::Result<(), ReadError> {
                got.push(bytes.map(|(b, _)| b.to_vec()));
                Ok(())
            })
            .map(|()| got)
    };
    assert_eq!(fetch(&e_tag)?, [Some(vec![1u8; 20])]);
    assert_eq!(store.get_if_match(&key, 10, 20, &e_tag)?.as_deref(), Some(&[1u8; 20][..]));
    // Replaced: If-Match fails, an error naming the key, never the new bytes.
    put(2)?;
    let err = fetch(&e_tag).err().ok_or("read from the new object")?;
    let changed = err.value_changed().ok_or_else(|| format!("not a change: {err}"))?;
    assert!(changed.what.contains("a/c/0") && changed.reason.contains("ETag"), "{changed}");
    let err = store.get_if_match(&key, 10, 20, &e_tag).err().ok_or("read from the new object")?;
    assert!(ValueChanged::in_storage_error(&err).is_some(), "{err}");
    // Any version where none is named.
    store.fetch_many_sized(&ranges, |_, bytes| -> std::result::Result<(), ReadError> {
        assert_eq!(bytes.map(|(b, _)| b.to_vec()), Some(vec![2u8; 20]));
        Ok(())
    })?;
    // Removed: a change too.
    futures::executor::block_on(objects.delete(&ObjectPath::from("a/c/0")))?;
    assert!(store
        .get_if_match(&key, 10, 20, &e_tag)
        .err()
        .is_some_and(|e| ValueChanged::in_storage_error(&e).is_some()));
    Ok(())
}
