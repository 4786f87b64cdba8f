//! The reader's reads from stores: a [`GdsStore`]'s files (cuFile where registered, parallel
//! preads otherwise), or any zarrs store's partial reads.

use cudarc::driver::CudaStream;
use zarrs_gds_store::{
    DeviceReadOutcome, GdsRanges, GdsStore, IoBackend, IoPath, IoStatus, ReadError, ValueRange, ValueVersion,
};
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::{ReadableStorageTraits, StoreKey};

use super::{DeviceMirror, DevicePtr, DeviceReadError, DeviceReader, DeviceTransfer, HostTransfer, PieceSource};

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
    /// The version of the value its offset was planned from (a shard's index): a value found
    /// in another version is a `ValueChanged` error rather than bytes read from it (GdsStore
    /// files and object stores' ETags; other stores cannot tell). None: any version.
    pub version: Option<ValueVersion>,
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
    /// The version of the value its offset was planned from (see [`DeviceReadRequest`]).
    pub version: Option<ValueVersion>,
}

/// Rows of one value read packed into device memory: `rows` rows of `width` bytes, the first at
/// byte `offset` of the value and each `pitch` bytes after the one before, to `dst` one after
/// another (`rows * width` bytes): part of an uncompressed chunk, without the bytes between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRowsRequest {
    /// The key.
    pub key: StoreKey,
    /// The first row's first byte in the value.
    pub offset: u64,
    /// How many rows.
    pub rows: u64,
    /// Bytes per row (1 or more).
    pub width: u64,
    /// Bytes from one row's start to the next's (`width` or more).
    pub pitch: u64,
    /// Where the packed rows land.
    pub dst: DevicePtr,
    /// The value's whole size, where the caller knows what it must be.
    pub value_len: Option<u64>,
    /// The version of the value its offset was planned from (see [`DeviceReadRequest`]).
    pub version: Option<ValueVersion>,
}

impl DeviceRowsRequest {
    /// The bytes it lands: `rows * width` (saturating: a length past 2^64 is refused when the
    /// value is opened, its span being longer still).
    #[must_use]
    pub fn packed_len(&self) -> u64 {
        self.rows.saturating_mul(self.width)
    }
}

impl ValueRange for DeviceRowsRequest {
    fn key(&self) -> &StoreKey {
        &self.key
    }
    fn offset(&self) -> u64 {
        self.offset
    }
    /// From the first row's start to the last row's end (saturating: past any file's end).
    fn len(&self) -> usize {
        let span = self.rows.saturating_sub(1).saturating_mul(self.pitch).saturating_add(self.width);
        usize::try_from(span).unwrap_or(usize::MAX)
    }
    fn value_len(&self) -> Option<u64> {
        self.value_len
    }
    fn version(&self) -> Option<&ValueVersion> {
        self.version.as_ref()
    }
}

macro_rules! value_range {
    ($t:ty) => {
        impl ValueRange for $t {
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
            fn version(&self) -> Option<&ValueVersion> {
                self.version.as_ref()
            }
        }
    };
}
value_range!(DeviceReadRequest);
value_range!(HostReadRequest);

fn device_transfers(requests: &[DeviceReadRequest]) -> Vec<DeviceTransfer> {
    requests.iter().map(|r| DeviceTransfer { dst: r.dst, len: r.len }).collect()
}

fn host_transfers(requests: &[HostReadRequest]) -> Vec<HostTransfer> {
    requests.iter().map(|r| HostTransfer { at: r.at, len: r.len }).collect()
}

impl DeviceReader {
    /// Read every request's bytes from `store`'s files straight into device memory, all in flight
    /// at once on the reader's threads: cuFile for files it registered, parallel preads into
    /// pinned buffers and async copies otherwise. `backend` as in [`GdsStore::open_for_device`].
    /// With `stream` None the device memory is written on return; with a stream, the writes are
    /// ordered before any work enqueued on it afterwards.
    ///
    /// # Safety
    /// Every `dst` must be valid device memory of the reader's context for its `len` bytes, and no
    /// two destinations may overlap.
    ///
    /// # Errors
    /// Returns an error naming the file when a read fails or goes past a value's end, and when
    /// native GDS was forced but is not usable.
    pub unsafe fn read_gds_to_device(
        &self,
        store: &GdsStore,
        requests: &[DeviceReadRequest],
        backend: Option<IoBackend>,
        stream: Option<&CudaStream>,
    ) -> Result<DeviceReadOutcome, DeviceReadError> {
        let files = self.install(|| store.open_for_device(requests, backend))?;
        // SAFETY: the destinations are the caller's, under the same contract.
        let found = unsafe { self.transfer(&device_transfers(requests), &files, stream) }?;
        Ok(DeviceReadOutcome::new(found, files.status().clone()))
    }

    /// Read every request's rows from `store`'s files, packed, into device memory: parallel
    /// preads into pinned buffers (a `preadv` takes many rows, the short gaps between them read
    /// and dropped) and async copies, as [`Self::read_gds_to_device`]'s host path. Returns, per
    /// request, whether its key exists.
    ///
    /// # Safety
    /// Every `dst` must be valid device memory of the reader's context for the request's
    /// [`DeviceRowsRequest::packed_len`] bytes, and no two destinations may overlap.
    ///
    /// # Errors
    /// Returns an error naming the file when a read fails, a row lies past its value's end or the
    /// value is not its known size.
    pub unsafe fn read_gds_rows_to_device(
        &self,
        store: &GdsStore,
        requests: &[DeviceRowsRequest],
        stream: Option<&CudaStream>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        let files = self.install(|| store.open_for_host(requests))?;
        let mut transfers = Vec::with_capacity(requests.len());
        for r in requests {
            let len = usize::try_from(r.packed_len()).map_err(|_| ReadError::PastEnd {
                what: r.key.to_string(),
                start: r.offset,
                end: u64::MAX,
                size: 0,
            })?;
            transfers.push(DeviceTransfer { dst: r.dst, len });
        }
        let source = RowsSource { files, requests };
        // SAFETY: the destinations are the caller's, under the same contract.
        unsafe { self.transfer(&transfers, &source, stream) }
    }

    /// Read every request's bytes from `store`'s files into `buf` at its `at` offset (parallel
    /// preads), each piece also copied to the device with a `mirror` (see
    /// [`DeviceReader::read_host`]). Returns, per request, whether its key exists.
    ///
    /// # Errors
    /// Returns an error naming the file when a read fails or goes past a value's end, or when a
    /// destination lies outside `buf`.
    pub fn read_gds_to_host(
        &self,
        store: &GdsStore,
        requests: &[HostReadRequest],
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        let files = self.install(|| store.open_for_host(requests))?;
        self.read_host(&host_transfers(requests), &files, buf, mirror)
    }

    /// Read every request's bytes from any zarrs store into device memory: the store's partial
    /// reads run in parallel on the reader's threads, each staged through a pinned buffer and
    /// copied to the device asynchronously. `stream` as in [`Self::read_gds_to_device`].
    ///
    /// # Safety
    /// Every `dst` must be valid device memory of the reader's context for its `len` bytes, and no
    /// two destinations may overlap.
    ///
    /// # Errors
    /// Returns the store's error, or an error when a value is shorter than requested.
    pub unsafe fn read_store_to_device<S: ReadableStorageTraits + ?Sized>(
        &self,
        store: &S,
        requests: &[DeviceReadRequest],
        stream: Option<&CudaStream>,
    ) -> Result<DeviceReadOutcome, DeviceReadError> {
        self.check_sizes(store, requests)?;
        let source = StoreSource { store, requests };
        // SAFETY: the destinations are the caller's, under the same contract.
        let found = unsafe { self.transfer(&device_transfers(requests), &source, stream) }?;
        Ok(DeviceReadOutcome::new(found, IoStatus::new(IoPath::Staged, "the store is not a GdsStore")))
    }

    /// Read every request's bytes from any zarrs store into `buf` at its `at` offset, in parallel
    /// on the reader's threads, each piece also copied to the device with a `mirror` (see
    /// [`DeviceReader::read_host`]). Returns, per request, whether its key exists.
    ///
    /// # Errors
    /// Returns the store's error, or an error when a value is shorter than requested or a
    /// destination lies outside `buf`.
    pub fn read_store_to_host<S: ReadableStorageTraits + ?Sized>(
        &self,
        store: &S,
        requests: &[HostReadRequest],
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        self.check_sizes(store, requests)?;
        self.read_host(&host_transfers(requests), &StoreSource { store, requests }, buf, mirror)
    }

    /// Values whose size the requests know must have it (asked once per key, in parallel).
    fn check_sizes<S: ReadableStorageTraits + ?Sized, R: ValueRange>(
        &self,
        store: &S,
        requests: &[R],
    ) -> Result<(), DeviceReadError> {
        use rayon::prelude::*;
        let mut known: Vec<(&StoreKey, u64)> =
            requests.iter().filter_map(|r| r.value_len().map(|n| (r.key(), n))).collect();
        known.sort_unstable();
        known.dedup();
        self.install(|| {
            known.par_iter().try_for_each(|&(key, expected)| match store.size_key(key)? {
                Some(size) if size != expected => {
                    Err(ReadError::WrongSize { what: key.to_string(), size, expected }.into())
                }
                _ => Ok(()),
            })
        })
    }
}

impl<R: ValueRange> PieceSource for GdsRanges<'_, R> {
    fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
        Ok(GdsRanges::read_host(self, transfer, offset, buf)?)
    }

    fn is_direct(&self, transfer: usize) -> bool {
        GdsRanges::is_direct(self, transfer)
    }

    unsafe fn read_device(
        &self,
        transfer: usize,
        offset: u64,
        dst: DevicePtr,
        len: usize,
    ) -> Result<bool, DeviceReadError> {
        // SAFETY: the trait's contract is the store's.
        Ok(unsafe { self.read_device_raw(transfer, offset, dst, len) }?)
    }
}

/// Rows of a GdsStore's values, packed ([`DeviceRowsRequest`]).
struct RowsSource<'a> {
    files: GdsRanges<'a, DeviceRowsRequest>,
    requests: &'a [DeviceRowsRequest],
}

impl PieceSource for RowsSource<'_> {
    /// Rows are packed in the batch's staging, one allocation.
    fn shares_pieces(&self) -> bool {
        true
    }

    fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
        let r = &self.requests[transfer];
        Ok(self.files.read_host_rows(transfer, offset, r.width, r.pitch, buf)?)
    }
}

/// Any store's values, by partial reads.
struct StoreSource<'a, S: ?Sized, R> {
    store: &'a S,
    requests: &'a [R],
}

impl<S: ReadableStorageTraits + ?Sized, R: ValueRange> PieceSource for StoreSource<'_, S, R> {
    fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
        let request = &self.requests[transfer];
        // Checked: a range ending past 2^64 (hostile offsets) lies past any value's end.
        let start = request.offset().checked_add(offset);
        let Some((start, end)) = start.and_then(|s| Some((s, s.checked_add(buf.len() as u64)?))) else {
            let reason =
                format!("{}: bytes from {} + {offset} + {} overflow u64", request.key(), request.offset(), buf.len());
            return Err(zarrs_storage::StorageError::Other(reason).into());
        };
        let range = ByteRange::FromStart(start, Some(buf.len() as u64));
        let bytes = self.store.get_partial(request.key(), range).map_err(|source| ReadError::Key {
            key: request.key().to_string(),
            start,
            end,
            source,
        })?;
        let Some(bytes) = bytes else { return Ok(false) };
        if bytes.len() != buf.len() {
            return Err(ReadError::PastEnd {
                what: request.key().to_string(),
                start,
                end,
                size: start.saturating_add(bytes.len() as u64),
            }
            .into());
        }
        buf.copy_from_slice(&bytes);
        Ok(true)
    }
}
