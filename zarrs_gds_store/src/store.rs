use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::CudaStream;
use zarrs_filesystem::{FilesystemStore, FilesystemStoreCreateError};
use zarrs_storage::byte_range::ByteRangeIterator;
use zarrs_storage::{
    Bytes, ListableStorageTraits, MaybeBytes, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits,
    StorageError, StoreKey, StoreKeys, StoreKeysPrefixes, StorePrefix, WritableStorageTraits,
};

use crate::cufile::{CuFileDriver, CuFileHandle};
use crate::engine::{as_host_transfers, as_transfers, DeviceMirror, DevicePtr, DeviceReader, PieceSource};
use crate::{DeviceReadError, IoBackend, IoPath, IoStatus};

/// Options of a [`GdsStore`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct GdsStoreOptions {
    backend: IoBackend,
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
}

/// One read into device memory: `len` bytes of `key` from `offset`, to the device address `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceReadRequest {
    /// The key.
    pub key: StoreKey,
    /// The first byte of the value to read.
    pub offset: u64,
    /// How many bytes (a read past the value's end is an error).
    pub len: usize,
    /// Where the bytes land.
    pub dst: DevicePtr,
    /// The value's whole size, where the caller knows what it must be (an uncompressed chunk):
    /// a value of another size is an error rather than bytes read from it.
    pub value_len: Option<u64>,
}

/// One read into host memory: `len` bytes of `key` from `offset`, to byte `at` of the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostReadRequest {
    /// The key.
    pub key: StoreKey,
    /// The first byte of the value to read.
    pub offset: u64,
    /// How many bytes (a read past the value's end is an error).
    pub len: usize,
    /// Where the bytes land in the buffer.
    pub at: usize,
    /// The value's whole size, where the caller knows what it must be: a value of another size
    /// is an error rather than bytes read from it.
    pub value_len: Option<u64>,
}

/// What both kinds of request read: a byte range of a value.
pub(crate) trait ReadRange: Sync {
    fn key(&self) -> &StoreKey;
    fn offset(&self) -> u64;
    fn len(&self) -> usize;
    fn value_len(&self) -> Option<u64>;
}

macro_rules! read_range {
    ($t:ty) => {
        impl ReadRange for $t {
            fn key(&self) -> &StoreKey {
                &self.key
            }
            fn offset(&self) -> u64 {
                self.offset
            }
            fn len(&self) -> usize {
                self.len
            }
            fn value_len(&self) -> Option<u64> {
                self.value_len
            }
        }
    };
}
read_range!(DeviceReadRequest);
read_range!(HostReadRequest);

/// What a read into device memory did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceReadOutcome {
    /// Per request, whether its key exists (a missing key leaves its destination unwritten).
    pub found: Vec<bool>,
    /// Which path ran and why.
    pub status: IoStatus,
}

/// A filesystem store (the Zarr directory layout) whose values can also be read straight into
/// CUDA device memory: with cuFile where native GPUDirect Storage works for a file, otherwise with
/// many preads in flight into reused pinned buffers and async copies to the device.
///
/// Host reads, writes and listing are those of [`FilesystemStore`].
pub struct GdsStore {
    fs: FilesystemStore,
    base_path: PathBuf,
    options: GdsStoreOptions,
    /// Why native GDS is not used for this store, once a file has failed to register (auto mode).
    gds_off: OnceLock<String>,
    last_status: Mutex<Option<IoStatus>>,
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
        Ok(Self { fs, base_path, options, gds_off: OnceLock::new(), last_status: Mutex::new(None) })
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

    /// The file that holds `key`.
    #[must_use]
    pub fn key_to_fspath(&self, key: &StoreKey) -> PathBuf {
        self.fs.key_to_fspath(key)
    }

    /// Which path the last device read took, and why (None before the first).
    #[must_use]
    pub fn last_io_status(&self) -> Option<IoStatus> {
        self.last_status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Read every request's bytes straight into device memory, all in flight at once on
    /// `reader`'s threads. `backend`, when given, is the backend of this read; otherwise the
    /// store's option, which the `ZARRS_GDS_BACKEND` environment variable overrides. With
    /// `stream` None the device
    /// memory is written on return; with a stream, the writes are ordered before any work
    /// enqueued on it afterwards.
    ///
    /// # Safety
    /// Every `dst` must be valid device memory of `reader`'s context for its `len` bytes, and no
    /// two destinations may overlap.
    ///
    /// # Errors
    /// Returns an error naming the file when a read fails or goes past a value's end, and when
    /// native GDS was forced but is not usable.
    pub unsafe fn read_to_device(
        &self,
        reader: &DeviceReader,
        requests: &[DeviceReadRequest],
        backend: Option<IoBackend>,
        stream: Option<&CudaStream>,
    ) -> Result<DeviceReadOutcome, DeviceReadError> {
        // A backend the caller gives wins; the store's own option yields to ZARRS_GDS_BACKEND.
        let backend = match backend {
            Some(backend) => backend,
            None => self.options.backend.resolve().map_err(DeviceReadError::GdsUnavailable)?,
        };
        let (driver, mut reason) = self.gds_driver(backend)?;
        let (files, request_file) = self.open_files(reader, requests, driver)?;
        let mut any_gds = false;
        let mut any_posix = false;
        for file in &files {
            match (&file.handle, &file.gds_error) {
                (Some(_), _) => any_gds = true,
                (None, Some(err)) => {
                    if backend == IoBackend::Gds {
                        return Err(DeviceReadError::GdsUnavailable(format!("{}: {err}", file.path.display())));
                    }
                    let why = format!("cuFile could not register {}: {err}", file.path.display());
                    reason.clone_from(self.gds_off.get_or_init(|| why));
                    any_posix = true;
                }
                (None, None) => any_posix |= file.file.is_some(),
            }
        }
        let transfers = as_transfers(requests);
        let source = FileSource { requests, request_file: &request_file, files: &files };
        // SAFETY: the destinations are the caller's, under the same contract.
        let found = unsafe { reader.transfer(&transfers, &source, stream) }?;
        let status = match (any_gds, any_posix) {
            (true, false) => IoStatus { path: IoPath::Gds, reason: "native GPUDirect Storage".into() },
            (true, true) => {
                IoStatus { path: IoPath::Gds, reason: format!("some files: pread fallback for others: {reason}") }
            }
            _ => IoStatus { path: IoPath::Posix, reason },
        };
        *self.last_status.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(status.clone());
        Ok(DeviceReadOutcome { found, status })
    }

    /// Read every request's bytes into `buf` at its `at` offset, all in flight at once on
    /// `reader`'s threads (parallel preads), each piece also copied to the device with a `mirror`
    /// (see [`DeviceReader::read_host`]). Returns, per request, whether its key exists.
    ///
    /// # Errors
    /// Returns an error naming the file when a read fails or goes past a value's end, or when a
    /// destination lies outside `buf`.
    pub fn read_to_host(
        &self,
        reader: &DeviceReader,
        requests: &[HostReadRequest],
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        let (files, request_file) = self.open_files(reader, requests, None)?;
        let source = FileSource { requests, request_file: &request_file, files: &files };
        reader.read_host(&as_host_transfers(requests), &source, buf, mirror)
    }

    /// Open each distinct key's file once, in parallel (registered with cuFile when `driver` is
    /// given), and check every request against its file's size.
    fn open_files<R: ReadRange>(
        &self,
        reader: &DeviceReader,
        requests: &[R],
        driver: Option<&'static CuFileDriver>,
    ) -> Result<(Vec<OpenFile>, Vec<usize>), DeviceReadError> {
        let mut file_of_key: HashMap<&StoreKey, usize> = HashMap::new();
        let mut keys: Vec<&StoreKey> = Vec::new();
        let request_file: Vec<usize> = requests
            .iter()
            .map(|r| {
                *file_of_key.entry(r.key()).or_insert_with(|| {
                    keys.push(r.key());
                    keys.len() - 1
                })
            })
            .collect();
        let files: Vec<OpenFile> = reader.install(|| {
            use rayon::prelude::*;
            keys.par_iter().map(|key| OpenFile::open(self.key_to_fspath(key), driver)).collect::<Result<_, _>>()
        })?;
        for (request, &f) in requests.iter().zip(&request_file) {
            let file = &files[f];
            if let (Some(_), Some(expected)) = (&file.file, request.value_len().filter(|&n| n != file.size)) {
                return Err(DeviceReadError::WrongSize {
                    what: file.path.display().to_string(),
                    size: file.size,
                    expected,
                });
            }
            // Checked: an end past 2^64 (hostile offsets) is past any file's end. Every later
            // offset of the request lies below this end.
            let end = request.offset().checked_add(request.len() as u64);
            if file.file.is_some() && end.is_none_or(|end| end > file.size) {
                return Err(DeviceReadError::PastEnd {
                    what: file.path.display().to_string(),
                    start: request.offset(),
                    end: end.unwrap_or(u64::MAX),
                    size: file.size,
                });
            }
        }
        Ok((files, request_file))
    }

    /// The cuFile driver to try files with, or why none (the reason reported with the pread path).
    fn gds_driver(&self, backend: IoBackend) -> Result<(Option<&'static CuFileDriver>, String), DeviceReadError> {
        if backend == IoBackend::Posix {
            return Ok((None, "posix backend requested".into()));
        }
        if backend == IoBackend::Auto {
            if let Some(reason) = self.gds_off.get() {
                return Ok((None, reason.clone()));
            }
        }
        match CuFileDriver::get() {
            Err(reason) if backend == IoBackend::Gds => Err(DeviceReadError::GdsUnavailable(reason)),
            Err(reason) => Ok((None, reason)),
            Ok(driver) if backend == IoBackend::Auto && !driver.has_nvfs() => {
                // Without nvidia-fs, cuFile itself would bounce through host memory: ours is faster.
                Ok((None, "nvidia-fs is not loaded (nvfs 0.0): native GDS unavailable".into()))
            }
            Ok(driver) => Ok((Some(driver), String::new())),
        }
    }
}

struct OpenFile {
    path: PathBuf,
    /// None when the key does not exist.
    file: Option<File>,
    size: u64,
    handle: Option<CuFileHandle>,
    gds_error: Option<DeviceReadError>,
}

impl OpenFile {
    fn open(path: PathBuf, driver: Option<&'static CuFileDriver>) -> Result<Self, DeviceReadError> {
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self { path, file: None, size: 0, handle: None, gds_error: None })
            }
            Err(source) => return Err(DeviceReadError::Io { path, source }),
        };
        let size = file.metadata().map_err(|source| DeviceReadError::Io { path: path.clone(), source })?.len();
        let (handle, gds_error) = match driver.map(|d| d.register(&path)) {
            None => (None, None),
            Some(Ok(handle)) => (Some(handle), None),
            Some(Err(err)) => (None, Some(err)),
        };
        Ok(Self { path, file: Some(file), size, handle, gds_error })
    }
}

struct FileSource<'a, R> {
    requests: &'a [R],
    request_file: &'a [usize],
    files: &'a [OpenFile],
}

impl<R: ReadRange> PieceSource for FileSource<'_, R> {
    fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
        let file = &self.files[self.request_file[transfer]];
        let Some(handle) = &file.file else { return Ok(false) };
        handle
            .read_exact_at(buf, self.requests[transfer].offset() + offset)
            .map_err(|source| DeviceReadError::Io { path: file.path.clone(), source })?;
        Ok(true)
    }

    fn is_direct(&self, transfer: usize) -> bool {
        self.files[self.request_file[transfer]].handle.is_some()
    }

    fn read_device(&self, transfer: usize, offset: u64, dst: DevicePtr, len: usize) -> Result<bool, DeviceReadError> {
        let file = &self.files[self.request_file[transfer]];
        let Some(handle) = &file.handle else { return Ok(false) };
        handle.read(&file.path, self.requests[transfer].offset() + offset, dst, len)?;
        Ok(true)
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

impl WritableStorageTraits for GdsStore {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        self.fs.set(key, value)
    }

    fn set_partial_many(&self, key: &StoreKey, offset_values: OffsetBytesIterator<'_>) -> Result<(), StorageError> {
        self.fs.set_partial_many(key, offset_values)
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        self.fs.erase(key)
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        self.fs.erase_prefix(prefix)
    }

    fn supports_set_partial(&self) -> bool {
        self.fs.supports_set_partial()
    }
}

impl ListableStorageTraits for GdsStore {
    fn list(&self) -> Result<StoreKeys, StorageError> {
        self.fs.list()
    }

    fn list_prefix(&self, prefix: &StorePrefix) -> Result<StoreKeys, StorageError> {
        self.fs.list_prefix(prefix)
    }

    fn list_dir(&self, prefix: &StorePrefix) -> Result<StoreKeysPrefixes, StorageError> {
        self.fs.list_dir(prefix)
    }

    fn size_prefix(&self, prefix: &StorePrefix) -> Result<u64, StorageError> {
        self.fs.size_prefix(prefix)
    }
}
