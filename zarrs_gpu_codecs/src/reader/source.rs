//! Where a read's stored bytes come from: a [`GdsStore`]'s files, a [`RemoteStore`]'s objects, or
//! any zarrs store's values.
//! Chosen once per read (as kvikio's `FileHandle` chooses GDS or compat once), so that the
//! pipeline's stages call one method per kind of read instead of matching on the store.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use zarrs_gds_store::{AnyStore, DeviceReadOutcome, GdsStore, IoBackend, IoPath, RemoteStore};
use zarrs_storage::{Bytes, ReadableStorageTraits, StorageError, StoreKey};

use super::remote::Prefetched;
use super::{DeviceMirror, DeviceReadError, DeviceReadRequest, DeviceReader, DeviceRowsRequest, HostReadRequest};

/// Files whose sizes are asked on the calling thread: a stat takes a few microseconds, while
/// handing them to the reader's pool woke its sleeping threads first (0.2 to 0.66 ms in a third
/// of the one-chunk reads traced on the GPU host, benches/RESULTS.md run DS3).
const INLINE_SIZES: usize = 16;

/// The store a read takes its stored bytes from.
#[derive(Clone, Copy)]
pub(crate) enum ReadSource<'a> {
    /// A `GdsStore`: its files, read with cuFile where native GDS is up, else parallel preads.
    Gds(&'a GdsStore),
    /// An object store: many ranged GETs in flight, staged through pinned memory.
    Remote(&'a RemoteStore),
    /// Any other store: its partial reads, staged through pinned memory.
    Store(&'a dyn ReadableStorageTraits),
}

impl<'a> ReadSource<'a> {
    /// The store as one of this crate's own, where it is one: a `GdsStore` or a `RemoteStore`,
    /// also behind an `AnyStore`. The one place that recognises stores: reads and writes ask here.
    /// A store behind `dyn` is not recognised (it is read through its partial reads, as any
    /// store): its `Arc`'s type is not the concrete store's.
    pub(crate) fn recognise<S: ?Sized + 'static>(storage: &'a Arc<S>) -> Option<Self> {
        let any = storage as &dyn Any;
        if let Some(store) = any.downcast_ref::<Arc<GdsStore>>() {
            Some(Self::Gds(store))
        } else if let Some(store) = any.downcast_ref::<Arc<RemoteStore>>() {
            Some(Self::Remote(store))
        } else {
            any.downcast_ref::<Arc<AnyStore>>().map(|store| match store.as_ref() {
                AnyStore::Gds(store) => Self::Gds(store),
                AnyStore::Remote(store) => Self::Remote(store),
            })
        }
    }

    /// The source of a read of `storage`: its own store where [`Self::recognise`] knows it, else
    /// `any`, the same store as zarrs' storage traits see it.
    pub(crate) fn of<S: ?Sized + 'static>(storage: &'a Arc<S>, any: &'a dyn ReadableStorageTraits) -> Self {
        Self::recognise(storage).unwrap_or(Self::Store(any))
    }

    /// The store, for what every store answers alike (sizes, partial reads of indexes).
    pub(crate) fn storage(self) -> &'a dyn ReadableStorageTraits {
        match self {
            Self::Gds(store) => store,
            Self::Remote(store) => store,
            Self::Store(store) => store,
        }
    }

    /// The `GdsStore`, when it is one.
    pub(crate) fn gds(self) -> Option<&'a GdsStore> {
        match self {
            Self::Gds(store) => Some(store),
            Self::Remote(_) | Self::Store(_) => None,
        }
    }

    /// The `RemoteStore`, when it is one.
    pub(crate) fn remote(self) -> Option<&'a RemoteStore> {
        match self {
            Self::Remote(store) => Some(store),
            Self::Gds(_) | Self::Store(_) => None,
        }
    }

    /// The size of `key`'s value, None when it does not exist.
    pub(crate) fn size_key(self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        self.storage().size_key(key)
    }

    /// The size of each whole value (None: missing) of `keys`, each with the most stored bytes it
    /// may take: a `RemoteStore`'s values are fetched whole (one GET each, at most their limit
    /// and a byte more: a longer one is then refused by its size), kept for the batch's read,
    /// unless `fetched` brings them (fetched ahead, [`RemoteStore::fetch_value_batches`]); other stores' sizes
    /// are asked in parallel on the reader's threads (a few files' on the calling thread).
    pub(crate) fn sizes(
        self,
        reader: &DeviceReader,
        keys: &[(&StoreKey, u64)],
        fetched: Option<Vec<Option<Bytes>>>,
    ) -> Result<(Vec<Option<u64>>, Prefetched), StorageError> {
        use rayon::prelude::*;
        if let Self::Remote(store) = self {
            let values = match fetched {
                Some(values) if values.len() == keys.len() => values,
                Some(values) => {
                    return Err(StorageError::Other(format!(
                        "{store}: {} values fetched ahead for a batch of {} keys",
                        values.len(),
                        keys.len()
                    )))
                }
                None => store.fetch_values(keys)?,
            };
            let sizes = values.iter().map(|v| v.as_ref().map(|b| b.len() as u64)).collect();
            let kept = keys.iter().zip(values).filter_map(|(&(key, _), value)| Some((key.clone(), value?)));
            return Ok((sizes, Prefetched::new(kept)));
        }
        let sizes = if matches!(self, Self::Gds(_)) && keys.len() <= INLINE_SIZES {
            keys.iter().map(|(key, _)| self.size_key(key)).collect::<Result<Vec<_>, _>>()?
        } else {
            reader.install(|| keys.par_iter().map(|(key, _)| self.size_key(key)).collect::<Result<Vec<_>, _>>())?
        };
        Ok((sizes, Prefetched::default()))
    }

    /// Tell the store these ranges (`(key, offset, len)`, `len` 0: the whole value) are read
    /// next: a `GdsStore` has the kernel read them ahead (`posix_fadvise(WILLNEED)`, from
    /// background threads); other stores ignore it. Returns at once; whether advice was given.
    pub(crate) fn advise<'k>(self, ranges: impl IntoIterator<Item = (&'k StoreKey, u64, u64)>) -> bool {
        match self {
            Self::Gds(store) => {
                store.advise_will_need(ranges);
                true
            }
            Self::Remote(_) | Self::Store(_) => false,
        }
    }

    /// The I/O path a read staged through host memory (to be checked there) takes.
    pub(crate) fn host_path(self) -> IoPath {
        match self {
            Self::Gds(_) => IoPath::Posix,
            Self::Remote(_) => IoPath::Remote,
            Self::Store(_) => IoPath::Staged,
        }
    }

    /// Whether rows of uncompressed chunks may be read with preadv: only from a `GdsStore` whose
    /// device reads under `backend` would go through preads anyway (a forced GDS backend errs,
    /// and native GDS is never skipped).
    pub(crate) fn reads_rows(self, backend: Option<IoBackend>) -> Result<bool, DeviceReadError> {
        match self {
            Self::Gds(store) => Ok(store.pread_reason(backend)?.is_some()),
            Self::Remote(_) | Self::Store(_) => Ok(false),
        }
    }

    /// Read `requests` into device memory (see [`DeviceReader::read_gds_to_device`],
    /// [`DeviceReader::read_remote_to_device`] and [`DeviceReader::read_store_to_device`]); a
    /// remote store's values in `prefetched` are taken from there.
    ///
    /// # Safety
    /// As those: every `dst` valid device memory of the reader's context for its `len` bytes, no
    /// two overlapping.
    pub(crate) unsafe fn to_device(
        self,
        reader: &DeviceReader,
        requests: &[DeviceReadRequest],
        backend: Option<IoBackend>,
        stream: Option<&CudaStream>,
        prefetched: &Prefetched,
    ) -> Result<DeviceReadOutcome, DeviceReadError> {
        // SAFETY: the caller's contract, which both reads share.
        unsafe {
            match self {
                Self::Gds(store) => reader.read_gds_to_device(store, requests, backend, stream),
                Self::Remote(store) => reader.remote_to_device(store, requests, stream, prefetched),
                Self::Store(store) => reader.read_store_to_device(store, requests, stream),
            }
        }
    }

    /// Read `requests` into `buf`, mirrored to the device (see [`DeviceReader::read_gds_to_host`]
    /// and [`DeviceReader::read_store_to_host`]). Per request, whether its value exists.
    pub(crate) fn to_host(
        self,
        reader: &DeviceReader,
        requests: &[HostReadRequest],
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
        prefetched: &Prefetched,
    ) -> Result<Vec<bool>, DeviceReadError> {
        match self {
            Self::Gds(store) => reader.read_gds_to_host(store, requests, buf, mirror),
            Self::Remote(store) => reader.remote_to_host(store, requests, buf, mirror, prefetched),
            Self::Store(store) => reader.read_store_to_host(store, requests, buf, mirror),
        }
    }

    /// Read rows into device memory, packed (see [`DeviceReader::read_gds_rows_to_device`]): a
    /// `GdsStore`'s only ([`Self::reads_rows`]).
    ///
    /// # Safety
    /// As [`DeviceReader::read_gds_rows_to_device`].
    pub(crate) unsafe fn rows_to_device(
        self,
        reader: &DeviceReader,
        rows: &[DeviceRowsRequest],
        stream: Option<&CudaStream>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        match self {
            // SAFETY: the caller's contract.
            Self::Gds(store) => unsafe { reader.read_gds_rows_to_device(store, rows, stream) },
            // Never planned (`reads_rows` is false): refused rather than read wrongly.
            Self::Remote(_) | Self::Store(_) => {
                Err(StorageError::Other("rows are read from a GdsStore only".into()).into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use zarrs_gds_store::{AnyStore, GdsStore, RemoteStore};
    use zarrs_storage::store::MemoryStore;
    use zarrs_storage::{ReadableStorageTraits, StorageHandle};

    use super::ReadSource;

    /// Our stores are recognised concrete and behind an `AnyStore`; a store behind `dyn`, or any
    /// other store, is read through zarrs' traits (the handle given).
    #[test]
    fn stores_are_recognised_in_one_place() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let gds = Arc::new(GdsStore::new(dir.path())?);
        assert!(ReadSource::recognise(&gds).and_then(ReadSource::gds).is_some());
        let any = Arc::new(AnyStore::Gds(GdsStore::new(dir.path())?));
        assert!(ReadSource::recognise(&any).and_then(ReadSource::gds).is_some());
        let remote = Arc::new(RemoteStore::new(Arc::new(object_store::memory::InMemory::new())));
        assert!(ReadSource::recognise(&remote).and_then(ReadSource::remote).is_some());
        let erased: Arc<dyn ReadableStorageTraits> = gds.clone();
        assert!(ReadSource::recognise(&erased).is_none());
        let memory = Arc::new(MemoryStore::new());
        let handle = StorageHandle::new(memory.clone());
        let source = ReadSource::of(&memory, &handle);
        assert!(source.gds().is_none() && source.remote().is_none());
        Ok(())
    }
}
