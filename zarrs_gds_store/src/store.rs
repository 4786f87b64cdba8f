use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{CudaStream, DevicePtrMut, DeviceSlice};
use zarrs_filesystem::{FilesystemStore, FilesystemStoreCreateError};
use zarrs_storage::byte_range::ByteRangeIterator;
use zarrs_storage::{
    Bytes, ListableStorageTraits, MaybeBytes, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits,
    StorageError, StoreKey, StoreKeys, StoreKeysPrefixes, StorePrefix, WritableStorageTraits,
};

use crate::advise::{advise, Advice};
use crate::backend::{IoBackend, IoPath, IoStatus};
use crate::cufile::CuFileDriver;
use crate::error::ReadError;
use crate::file::{FileCache, GdsFile, OpenValue};
use crate::version::{ValueChanged, ValueVersion};
use crate::write::{
    is_temp, patched, remove_locked, sync_dir, write_atomic, write_many_atomic, Durability, Expected, FileVersion,
    KeyLocks, LockId,
};

/// Files registered with cuFile kept open per store (each holds two descriptors).
const REGISTERED_FILES: usize = 256;

/// Options of a [`GdsStore`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct GdsStoreOptions {
    backend: IoBackend,
    durability: Durability,
}

impl GdsStoreOptions {
    /// The I/O backend for device reads (`ZARRS_GDS_BACKEND` overrides it).
    #[must_use]
    pub fn with_backend(mut self, backend: IoBackend) -> Self {
        self.backend = backend;
        self
    }

    /// Set the I/O backend for device reads.
    pub fn set_backend(&mut self, backend: IoBackend) -> &mut Self {
        self.backend = backend;
        self
    }

    /// The I/O backend asked for.
    #[must_use]
    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    /// What a write guarantees once it has returned (every write replaces its value whole).
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Set what a write guarantees once it has returned.
    pub fn set_durability(&mut self, durability: Durability) -> &mut Self {
        self.durability = durability;
        self
    }

    /// What a write guarantees once it has returned.
    #[must_use]
    pub fn durability(&self) -> Durability {
        self.durability
    }
}

/// A byte range of a stored value, as a read names it: `len` bytes of `key` from `offset`.
#[allow(clippy::len_without_is_empty)]
pub trait ValueRange: Sync {
    /// The key.
    fn key(&self) -> &StoreKey;
    /// The first byte of the value to read.
    fn offset(&self) -> u64;
    /// How many bytes (a range past the value's end is an error).
    fn len(&self) -> usize;
    /// The value's whole size, where the caller knows what it must be (an uncompressed chunk): a
    /// value of another size is an error rather than bytes read from it.
    fn value_len(&self) -> Option<u64> {
        None
    }
    /// The version of the value the range was planned from (its offsets taken from a shard's
    /// index read from that version): a value found in another version, or gone, is a
    /// [`ValueChanged`] error rather than bytes read from it. None: any version.
    fn version(&self) -> Option<&ValueVersion> {
        None
    }
}

/// The files behind some value ranges, opened for one read ([`GdsStore::open_for_device`],
/// [`GdsStore::open_for_host`]), each checked against its range: any part of a range can be read
/// into host memory, or straight into device memory where cuFile registered the file. Many
/// threads may read parts at once.
pub struct GdsRanges<'a, R> {
    ranges: &'a [R],
    /// Per range, its value in `values` (each key is opened once).
    value_of: Vec<usize>,
    values: Vec<OpenValue>,
    status: IoStatus,
}

impl<R: ValueRange> GdsRanges<'_, R> {
    /// How many ranges.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether there are no ranges.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Which path reads into device memory take, and why.
    #[must_use]
    pub fn status(&self) -> &IoStatus {
        &self.status
    }

    /// Whether range `i` is read straight into device memory (its file is registered with cuFile).
    #[must_use]
    pub fn is_direct(&self, i: usize) -> bool {
        self.file(i).is_some_and(GdsFile::is_registered)
    }

    /// Fill `buf` with bytes `offset..offset + buf.len()` of range `i`. Returns `Ok(false)` when
    /// its key does not exist.
    ///
    /// # Errors
    /// Returns an error naming the file when the read fails or leaves the range.
    pub fn read_host(&self, i: usize, offset: u64, buf: &mut [u8]) -> Result<bool, ReadError> {
        let Some(file) = self.file(i) else { return Ok(false) };
        file.read_host(self.at(i, offset, buf.len())?, buf)?;
        Ok(true)
    }

    /// Fill `buf` with bytes `offset..offset + buf.len()` of range `i` read as rows: `width`
    /// bytes from the range's start, then `width` bytes every `pitch` bytes, packed one after
    /// another (byte `p` of the packed rows is byte `(p / width) * pitch + p % width` of the
    /// range). What lies between rows is not returned (gaps of at most 64 KiB are read and
    /// dropped, farther rows read one by one). Returns `Ok(false)` when its key does not exist.
    ///
    /// # Errors
    /// Returns an error when `width` is 0 or more than `pitch`, a row leaves the range, or a read
    /// fails, naming the file.
    pub fn read_host_rows(
        &self,
        i: usize,
        offset: u64,
        width: u64,
        pitch: u64,
        buf: &mut [u8],
    ) -> Result<bool, ReadError> {
        let Some(file) = self.file(i) else { return Ok(false) };
        if buf.is_empty() {
            return Ok(true);
        }
        let range = &self.ranges[i];
        let outside = |start: u64, end: u64| ReadError::PastEnd {
            what: format!("{} (rows of {width} bytes every {pitch} in a range of {} bytes)", range.key(), range.len()),
            start,
            end,
            size: range.len() as u64,
        };
        if width == 0 || width > pitch {
            return Err(outside(offset, offset));
        }
        // Where the first and one past the last packed byte lie in the range (checked: a
        // hostile width or pitch is refused, never wrapped).
        let in_range = |p: u64| (p / width).checked_mul(pitch).and_then(|row| row.checked_add(p % width));
        let end = offset.checked_add(buf.len() as u64);
        let Some((Some(first), Some(last))) = end.map(|end| (in_range(offset), in_range(end - 1))) else {
            return Err(outside(offset, u64::MAX));
        };
        let len = usize::try_from(last - first + 1).map_err(|_| outside(first, last))?;
        let at = self.at(i, first, len)?;
        file.read_rows_host(at, offset % width, width, pitch, buf)?;
        Ok(true)
    }

    /// Read bytes `offset..offset + dst.len()` of range `i` into `dst` with cuFile, after the work
    /// `stream` has queued (this waits for it: cuFile writes from the host's side). Returns
    /// `Ok(false)` when the key does not exist.
    ///
    /// # Errors
    /// Returns an error when range `i`'s file is not registered with cuFile ([`Self::is_direct`]),
    /// or the read fails or leaves the range.
    pub fn read_device<D: DevicePtrMut<u8> + DeviceSlice<u8>>(
        &self,
        i: usize,
        offset: u64,
        dst: &mut D,
        stream: &CudaStream,
    ) -> Result<bool, ReadError> {
        let len = dst.len();
        let cuda = |what| move |source| ReadError::Cuda { what, source };
        stream.context().bind_to_thread().map_err(cuda("binding the CUDA context"))?;
        let (ptr, _record) = dst.device_ptr_mut(stream);
        stream.synchronize().map_err(cuda("waiting for the destination's earlier work"))?;
        // SAFETY: dst is a device slice of len bytes of the stream's context, borrowed mutably, and
        // the stream's earlier work on it has finished.
        unsafe { self.read_device_raw(i, offset, ptr, len) }
    }

    /// As [`Self::read_device`], to a raw device address (for engines that write disjoint parts
    /// of one allocation from many threads).
    ///
    /// # Safety
    /// `dst` must be device memory of the CUDA context current on this thread, valid for `len`
    /// bytes and used by nothing else until this returns.
    ///
    /// # Errors
    /// As [`Self::read_device`].
    pub unsafe fn read_device_raw(&self, i: usize, offset: u64, dst: u64, len: usize) -> Result<bool, ReadError> {
        let Some(file) = self.file(i) else { return Ok(false) };
        let at = self.at(i, offset, len)?;
        // SAFETY: the caller's contract.
        unsafe { file.read_device(at, dst, len) }?;
        Ok(true)
    }

    fn file(&self, i: usize) -> Option<&GdsFile> {
        self.values[self.value_of[i]].file.as_deref()
    }

    /// Where `len` bytes from `offset` of range `i` lie in its file, refused outside the range.
    fn at(&self, i: usize, offset: u64, len: usize) -> Result<u64, ReadError> {
        let range = &self.ranges[i];
        match offset.checked_add(len as u64) {
            Some(end) if end <= range.len() as u64 => Ok(range.offset() + offset),
            _ => Err(ReadError::PastEnd {
                what: format!("{} (a range of {} bytes)", range.key(), range.len()),
                start: offset,
                end: offset.saturating_add(len as u64),
                size: range.len() as u64,
            }),
        }
    }
}

/// What a read into device memory did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceReadOutcome {
    /// Per request, whether its key exists (a missing key leaves its destination unwritten).
    pub found: Vec<bool>,
    /// Which path ran and why.
    pub status: IoStatus,
}

impl DeviceReadOutcome {
    /// An outcome.
    #[must_use]
    pub fn new(found: Vec<bool>, status: IoStatus) -> Self {
        Self { found, status }
    }
}

/// A filesystem store (the Zarr directory layout) whose values can also be read straight into
/// CUDA device memory: with cuFile where native GPUDirect Storage works for a file; elsewhere a
/// device read engine (such as `zarrs_gpu_codecs`' reader) reads [`GdsRanges`] into pinned memory
/// and copies them on.
///
/// Host reads, writes and listing are those of [`FilesystemStore`]. Files registered with cuFile
/// stay open in the store between reads (at most 256), each used while its path still names it.
pub struct GdsStore {
    fs: FilesystemStore,
    base_path: PathBuf,
    options: GdsStoreOptions,
    /// Why native GDS is not used for this store, once a file has failed to register (auto mode).
    gds_off: OnceLock<String>,
    registered: FileCache<GdsFile>,
    last_status: Mutex<Option<IoStatus>>,
    /// The store's directory resolved (links, `..`): the root of its values' [`LockId`]s.
    lock_root: PathBuf,
}

impl std::fmt::Debug for GdsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GdsStore")
            .field("base_path", &self.base_path)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl GdsStore {
    /// Open (or create) the directory `base_path` as a store.
    ///
    /// # Errors
    /// Returns an error when the path is not a usable directory.
    pub fn new<P: AsRef<Path>>(base_path: P) -> Result<Self, FilesystemStoreCreateError> {
        Self::new_with_options(base_path, GdsStoreOptions::default())
    }

    /// Open (or create) the directory `base_path` as a store, with options.
    ///
    /// # Errors
    /// Returns an error when the path is not a usable directory.
    pub fn new_with_options<P: AsRef<Path>>(
        base_path: P,
        options: GdsStoreOptions,
    ) -> Result<Self, FilesystemStoreCreateError> {
        let base_path = base_path.as_ref().to_path_buf();
        let fs = FilesystemStore::new(&base_path)?.sorted();
        let lock_root = std::fs::canonicalize(&base_path).unwrap_or_else(|_| base_path.clone());
        Ok(Self {
            fs,
            base_path,
            options,
            gds_off: OnceLock::new(),
            registered: FileCache::new(REGISTERED_FILES),
            last_status: Mutex::new(None),
            lock_root,
        })
    }

    /// The store's directory.
    #[must_use]
    pub fn base_path(&self) -> &Path {
        &self.base_path
    }

    /// The store's options.
    #[must_use]
    pub fn options(&self) -> &GdsStoreOptions {
        &self.options
    }

    /// Store many values at once, each replaced whole (atomically) as [`WritableStorageTraits::set`]
    /// replaces one, flushed together: under [`Durability::Sync`] every file is flushed in
    /// parallel before any is renamed into place, then each directory once, so that the values
    /// are durable when the call returns at the cost of one directory flush per directory rather
    /// than one per value.
    ///
    /// # Errors
    /// Returns the first error, naming its key and file; values written before it keep their new
    /// bytes (each whole), the rest their old ones.
    pub fn set_many<V: AsRef<[u8]> + Sync>(&self, values: &[(StoreKey, V)]) -> Result<(), StorageError> {
        self.set_many_checked(values, &[])
    }

    /// [`Self::set_many`] for a read-modify-write: `expected` (empty, or one per value) is the
    /// version each value had when it was read ([`Self::get_versioned`]; `Some(None)`: missing,
    /// `None`: not read). Each is compared just before its new file is renamed over, under a lock
    /// that every write of this store takes for its rename (`flock` of the file, or of its
    /// directory when missing): a value another writer changed in between (another process: within
    /// one, writers hold [`KeyLocks`]) is an error naming its key, and keeps the other's bytes.
    ///
    /// # Errors
    /// As [`Self::set_many`], and for such a conflict.
    pub fn set_many_checked<V: AsRef<[u8]> + Sync>(
        &self,
        values: &[(StoreKey, V)],
        expected: &[Expected],
    ) -> Result<(), StorageError> {
        let paths: Vec<(PathBuf, &[u8])> =
            values.iter().map(|(key, value)| (self.key_to_fspath(key), value.as_ref())).collect();
        write_many_atomic(&paths, expected, self.options.durability).map_err(|(path, err)| {
            let key = values
                .iter()
                .zip(&paths)
                .find(|(_, (p, _))| *p == path)
                .map_or_else(|| format!("a directory of {} values", values.len()), |((key, _), _)| key.to_string());
            StorageError::Other(format!("writing {key} to {}: {err}", path.display()))
        })
    }

    /// The value of `key` and the version of its file that was read (None: missing), for a
    /// read-modify-write that stores through [`Self::set_many_checked`] or
    /// [`Self::erase_checked`].
    ///
    /// # Errors
    /// Returns an error naming the key and file when it cannot be read.
    pub fn get_versioned(&self, key: &StoreKey) -> Result<(MaybeBytes, Option<FileVersion>), StorageError> {
        use std::io::Read;
        let path = self.key_to_fspath(key);
        let named = |err: std::io::Error| StorageError::Other(format!("reading {key} from {}: {err}", path.display()));
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok((None, None)),
            Err(err) => return Err(named(err)),
        };
        let meta = file.metadata().map_err(named)?;
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(named)?;
        Ok((Some(Bytes::from(bytes)), Some(FileVersion::of(&meta))))
    }

    /// Erase `key` if its file is still the version `expected` ([`Self::set_many_checked`]).
    ///
    /// # Errors
    /// Returns an error naming the key when it cannot be erased or changed since it was read.
    pub fn erase_checked(&self, key: &StoreKey, expected: Expected) -> Result<(), StorageError> {
        let path = self.key_to_fspath(key);
        let removed = remove_locked(&path, expected).map_err(|err| write_error(key, &path, &err))?;
        // Under Sync an erase is durable too: the directory's entry is flushed (where there was
        // one to remove: a fresh array's fill chunks cost nothing).
        match path.parent() {
            Some(dir) if removed && self.options.durability == Durability::Sync => {
                sync_dir(dir).map_err(|err| write_error(key, &path, &err))
            }
            _ => Ok(()),
        }
    }

    /// What a write of this process locks to change `key` ([`KeyLocks`]): its file, under the
    /// store's resolved directory (two stores of one directory share their locks).
    #[must_use]
    pub fn lock_id(&self, key: &StoreKey) -> LockId {
        LockId::File(self.lock_root.join(key.as_str()))
    }

    /// The file that holds `key`.
    #[must_use]
    pub fn key_to_fspath(&self, key: &StoreKey) -> PathBuf {
        self.fs.key_to_fspath(key)
    }

    /// Advise the kernel that these ranges of values (`(key, offset, len)`, `len` 0: to the
    /// value's end) will be read soon (`posix_fadvise(WILLNEED)`), from background threads:
    /// returns at once. A reader of cold data calls it for the chunks it reads next, so that the
    /// disk works while it checks and decodes. Missing values are skipped.
    pub fn advise_will_need<'a>(&self, ranges: impl IntoIterator<Item = (&'a StoreKey, u64, u64)>) {
        advise(ranges.into_iter().map(|(key, offset, len)| Advice { path: self.key_to_fspath(key), offset, len }));
    }

    /// Which path the last device read took, and why (None before the first).
    #[must_use]
    pub fn last_io_status(&self) -> Option<IoStatus> {
        self.last_status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Open the files of `ranges` for a read into device memory: each registered with cuFile
    /// where native GDS works (kept open for later reads), the reason recorded where not.
    /// `backend`, when given, is this read's; otherwise the store's option, which the
    /// `ZARRS_GDS_BACKEND` environment variable overrides. Files open in parallel on the current
    /// rayon pool.
    ///
    /// # Errors
    /// Returns an error naming the file when one cannot be opened or a range goes past its value's
    /// end, and when native GDS was forced but is not usable.
    pub fn open_for_device<'a, R: ValueRange>(
        &self,
        ranges: &'a [R],
        backend: Option<IoBackend>,
    ) -> Result<GdsRanges<'a, R>, ReadError> {
        let backend = self.backend_for(backend)?;
        let (driver, mut reason) = self.gds_driver(backend)?;
        let mut ranges = self.open_ranges(ranges, driver)?;
        let mut any_gds = false;
        let mut any_posix = false;
        for value in &ranges.values {
            match (&value.file, &value.gds_error) {
                (Some(file), _) if file.is_registered() => any_gds = true,
                (Some(file), Some(err)) => {
                    if backend == IoBackend::Gds {
                        return Err(ReadError::GdsUnavailable(format!("{}: {err}", file.path.display())));
                    }
                    let why = format!("cuFile could not register {}: {err}", file.path.display());
                    reason.clone_from(self.gds_off.get_or_init(|| why));
                    any_posix = true;
                }
                (file, _) => any_posix |= file.is_some(),
            }
        }
        ranges.status = match (any_gds, any_posix) {
            (true, false) => IoStatus::new(IoPath::Gds, "native GPUDirect Storage"),
            (true, true) => IoStatus::new(IoPath::Gds, format!("some files: pread fallback for others: {reason}")),
            _ => IoStatus::new(IoPath::Posix, reason),
        };
        *self.last_status.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ranges.status.clone());
        Ok(ranges)
    }

    /// Why [`Self::open_for_device`] would read this store's files with preads into pinned memory
    /// under `backend` (`Some`: the reason), or `None` where it would try native GPUDirect Storage
    /// first. Decided before any file is opened, as `open_for_device` decides it: a reader with a
    /// faster pread-only way of its own (rows of uncompressed chunks) takes it only where this is
    /// `Some`, so that a forced `Gds` backend stays an error where GDS is not usable and native GDS
    /// is never skipped where it is up.
    ///
    /// # Errors
    /// As `open_for_device`: when native GDS was forced but is not usable, or the environment
    /// names an unknown backend.
    pub fn pread_reason(&self, backend: Option<IoBackend>) -> Result<Option<String>, ReadError> {
        let backend = self.backend_for(backend)?;
        Ok(match self.gds_driver(backend)? {
            (None, reason) => Some(reason),
            (Some(_), _) => None,
        })
    }

    /// `backend` when given (a read's own), else the store's option under the environment's override.
    fn backend_for(&self, backend: Option<IoBackend>) -> Result<IoBackend, ReadError> {
        match backend {
            Some(backend) => Ok(backend),
            None => self.options.backend.resolve().map_err(ReadError::GdsUnavailable),
        }
    }

    /// Open the files of `ranges` for reads into host memory (parallel preads), in parallel on the
    /// current rayon pool.
    ///
    /// # Errors
    /// Returns an error naming the file when one cannot be opened or a range goes past its value's
    /// end.
    pub fn open_for_host<'a, R: ValueRange>(&self, ranges: &'a [R]) -> Result<GdsRanges<'a, R>, ReadError> {
        self.open_ranges(ranges, None)
    }

    /// Open each distinct key's file once (registered with cuFile when `driver` is given), and
    /// check every range against its file's size, and against its file's version where the
    /// range names one (`fstat` of the descriptor the range is read from).
    fn open_ranges<'a, R: ValueRange>(
        &self,
        ranges: &'a [R],
        driver: Option<&'static CuFileDriver>,
    ) -> Result<GdsRanges<'a, R>, ReadError> {
        use rayon::prelude::*;
        let mut value_of_key: HashMap<&StoreKey, usize> = HashMap::new();
        let mut keys: Vec<&StoreKey> = Vec::new();
        let value_of: Vec<usize> = ranges
            .iter()
            .map(|r| {
                *value_of_key.entry(r.key()).or_insert_with(|| {
                    keys.push(r.key());
                    keys.len() - 1
                })
            })
            .collect();
        let values: Vec<OpenValue> = keys
            .par_iter()
            .map(|key| OpenValue::open(self.key_to_fspath(key), driver, &self.registered))
            .collect::<Result<_, _>>()?;
        for (range, &v) in ranges.iter().zip(&value_of) {
            let value = &values[v];
            if let Some(ValueVersion::File(expected)) = range.version() {
                check_version(&self.key_to_fspath(range.key()), expected, value.version.as_ref())?;
            }
            let Some(file) = &value.file else { continue };
            if let Some(expected) = range.value_len().filter(|&n| n != value.size) {
                return Err(ReadError::WrongSize { what: file.path.display().to_string(), size: value.size, expected });
            }
            // Checked: an end past 2^64 (hostile offsets) is past any file's end. Every later
            // offset of the range lies below this end.
            let end = range.offset().checked_add(range.len() as u64);
            if end.is_none_or(|end| end > value.size) {
                return Err(ReadError::PastEnd {
                    what: file.path.display().to_string(),
                    start: range.offset(),
                    end: end.unwrap_or(u64::MAX),
                    size: value.size,
                });
            }
        }
        let status = IoStatus::new(IoPath::Posix, "host reads");
        Ok(GdsRanges { ranges, value_of, values, status })
    }

    /// The cuFile driver to try files with, or why none (the reason reported with the pread path).
    fn gds_driver(&self, backend: IoBackend) -> Result<(Option<&'static CuFileDriver>, String), ReadError> {
        if backend == IoBackend::Posix {
            return Ok((None, "posix backend requested".into()));
        }
        if backend == IoBackend::Auto {
            if let Some(reason) = self.gds_off.get() {
                return Ok((None, reason.clone()));
            }
        }
        match CuFileDriver::get() {
            Err(reason) if backend == IoBackend::Gds => Err(ReadError::GdsUnavailable(reason)),
            Err(reason) => Ok((None, reason)),
            Ok(driver) if backend == IoBackend::Auto && !driver.has_nvfs() => {
                // Without nvidia-fs, cuFile itself would bounce through host memory: ours is faster.
                Ok((None, "nvidia-fs is not loaded (nvfs 0.0): native GDS unavailable".into()))
            }
            Ok(driver) => Ok((Some(driver), String::new())),
        }
    }
}

impl ReadableStorageTraits for GdsStore {
    fn get(&self, key: &StoreKey) -> Result<MaybeBytes, StorageError> {
        self.fs.get(key)
    }

    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        self.fs.get_partial_many(key, byte_ranges)
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        self.fs.size_key(key)
    }

    fn supports_get_partial(&self) -> bool {
        self.fs.supports_get_partial()
    }
}

/// Values are written whole and atomically (see [`Durability`]): a partial write reads the value,
/// patches it and writes it whole, so `supports_set_partial` is false and zarrs writes whole shards.
impl WritableStorageTraits for GdsStore {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        let path = self.key_to_fspath(key);
        write_atomic(&path, &value, self.options.durability).map_err(|err| write_error(key, &path, &err))
    }

    fn set_partial_many(&self, key: &StoreKey, offset_values: OffsetBytesIterator<'_>) -> Result<(), StorageError> {
        // A read-modify-write: other writes of this process wait (those of others are detected).
        let _locked = KeyLocks::lock([self.lock_id(key)]);
        let path = self.key_to_fspath(key);
        let (old, version) = self.get_versioned(key)?;
        let old = old.map(|bytes| bytes.to_vec()).unwrap_or_default();
        let value = patched(old, offset_values).map_err(|err| write_error(key, &path, &err))?;
        self.set_many_checked(&[(key.clone(), value)], &[Some(version)])
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        self.erase_checked(key, None)
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        let dir = self.base_path.join(prefix.as_str());
        let existed = dir.exists();
        self.fs.erase_prefix(prefix)?;
        // Under Sync the removal is durable: the prefix's entry in its parent is flushed (the
        // store's own directory, for the root prefix, is emptied: flushed itself).
        if existed && self.options.durability == Durability::Sync {
            let flushed =
                if dir.exists() { dir.clone() } else { dir.parent().map_or_else(|| dir.clone(), Path::to_path_buf) };
            if flushed.is_dir() {
                sync_dir(&flushed).map_err(|err| {
                    StorageError::Other(format!("erasing {prefix}: flushing {}: {err}", flushed.display()))
                })?;
            }
        }
        Ok(())
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}

/// The temporary files of writes in flight (or of a writer that was killed) are not keys.
impl ListableStorageTraits for GdsStore {
    fn list(&self) -> Result<StoreKeys, StorageError> {
        Ok(values_only(self.fs.list()?))
    }

    fn list_prefix(&self, prefix: &StorePrefix) -> Result<StoreKeys, StorageError> {
        Ok(values_only(self.fs.list_prefix(prefix)?))
    }

    fn list_dir(&self, prefix: &StorePrefix) -> Result<StoreKeysPrefixes, StorageError> {
        let listed = self.fs.list_dir(prefix)?;
        Ok(StoreKeysPrefixes::new(values_only(listed.keys().clone()), listed.prefixes().clone()))
    }

    /// The sizes of the values listed (a killed writer's temporary files are not counted).
    fn size_prefix(&self, prefix: &StorePrefix) -> Result<u64, StorageError> {
        let mut total = 0u64;
        for key in self.list_prefix(prefix)? {
            // A value erased since the listing counts nothing.
            total = total.saturating_add(self.fs.size_key(&key)?.unwrap_or(0));
        }
        Ok(total)
    }
}

/// `keys` without the temporary files of writes.
fn values_only(mut keys: StoreKeys) -> StoreKeys {
    keys.retain(|key| !is_temp(key.as_str().rsplit('/').next().unwrap_or_default()));
    keys
}

/// A range planned from the version `expected` of the file at `path`, which is now `found`
/// (None: gone): another version is a [`ValueChanged`] error.
fn check_version(path: &Path, expected: &FileVersion, found: Option<&FileVersion>) -> Result<(), ValueChanged> {
    match found {
        Some(found) if found == expected => Ok(()),
        Some(found) => Err(ValueChanged::new(
            path.display().to_string(),
            format!("planned from {expected:?}, found {found:?} (replaced or rewritten)"),
        )),
        None => Err(ValueChanged::new(path.display().to_string(), "it was removed")),
    }
}

/// A write that failed, naming the key and its file (a full disk, a read-only directory).
fn write_error(key: &StoreKey, path: &Path, err: &std::io::Error) -> StorageError {
    StorageError::Other(format!("writing {key} to {}: {err}", path.display()))
}
