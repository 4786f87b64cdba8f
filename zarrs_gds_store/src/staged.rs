use cudarc::driver::CudaStream;
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::{ReadableStorageTraits, StoreKey};

use crate::engine::{as_host_transfers, as_transfers, DeviceMirror, DeviceReader, PieceSource};
use crate::store::ReadRange;
use crate::{DeviceReadError, DeviceReadOutcome, DeviceReadRequest, HostReadRequest, IoPath, IoStatus};

/// Read every request's bytes from any zarrs store into device memory: the store's partial
/// reads run in parallel on `reader`'s threads, each staged through a pinned buffer and copied to
/// the device asynchronously. `stream` as in [`GdsStore::read_to_device`](crate::GdsStore::read_to_device).
///
/// # Safety
/// Every `dst` must be valid device memory of `reader`'s context for its `len` bytes, and no two
/// destinations may overlap.
///
/// # Errors
/// Returns the store's error, or an error when a value is shorter than requested.
pub unsafe fn read_store_to_device<S: ReadableStorageTraits + ?Sized>(
    store: &S,
    reader: &DeviceReader,
    requests: &[DeviceReadRequest],
    stream: Option<&CudaStream>,
) -> Result<DeviceReadOutcome, DeviceReadError> {
    check_sizes(store, reader, requests)?;
    let transfers = as_transfers(requests);
    let source = StoreSource { store, requests };
    // SAFETY: the destinations are the caller's, under the same contract.
    let found = unsafe { reader.transfer(&transfers, &source, stream) }?;
    Ok(DeviceReadOutcome {
        found,
        status: IoStatus { path: IoPath::Staged, reason: "the store is not a GdsStore".into() },
    })
}

/// Read every request's bytes from any zarrs store into `buf` at its `at` offset, in parallel on
/// `reader`'s threads, each piece also copied to the device with a `mirror` (see
/// [`DeviceReader::read_host`]). Returns, per request, whether its key exists.
///
/// # Errors
/// Returns the store's error, or an error when a value is shorter than requested or a destination
/// lies outside `buf`.
pub fn read_store_to_host<S: ReadableStorageTraits + ?Sized>(
    store: &S,
    reader: &DeviceReader,
    requests: &[HostReadRequest],
    buf: &mut [u8],
    mirror: Option<DeviceMirror<'_>>,
) -> Result<Vec<bool>, DeviceReadError> {
    check_sizes(store, reader, requests)?;
    reader.read_host(&as_host_transfers(requests), &StoreSource { store, requests }, buf, mirror)
}

/// Values whose size the requests know must have it (asked once per key, in parallel).
fn check_sizes<S: ReadableStorageTraits + ?Sized, R: ReadRange>(
    store: &S,
    reader: &DeviceReader,
    requests: &[R],
) -> Result<(), DeviceReadError> {
    use rayon::prelude::*;
    let mut known: Vec<(&StoreKey, u64)> =
        requests.iter().filter_map(|r| r.value_len().map(|n| (r.key(), n))).collect();
    known.sort_unstable();
    known.dedup();
    reader.install(|| {
        known.par_iter().try_for_each(|&(key, expected)| match store.size_key(key)? {
            Some(size) if size != expected => Err(DeviceReadError::WrongSize { what: key.to_string(), size, expected }),
            _ => Ok(()),
        })
    })
}

struct StoreSource<'a, S: ?Sized, R> {
    store: &'a S,
    requests: &'a [R],
}

impl<S: ReadableStorageTraits + ?Sized, R: ReadRange> PieceSource for StoreSource<'_, S, R> {
    fn read_host(&self, transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
        let request = &self.requests[transfer];
        // Checked: a range ending past 2^64 (hostile offsets) lies past any value's end.
        let start = request.offset().checked_add(offset);
        let Some((start, end)) = start.and_then(|s| Some((s, s.checked_add(buf.len() as u64)?))) else {
            let reason =
                format!("{}: bytes from {} + {offset} + {} overflow u64", request.key(), request.offset(), buf.len());
            return Err(DeviceReadError::Storage(zarrs_storage::StorageError::Other(reason)));
        };
        let range = ByteRange::FromStart(start, Some(buf.len() as u64));
        let Some(bytes) = self.store.get_partial(request.key(), range)? else { return Ok(false) };
        if bytes.len() != buf.len() {
            return Err(DeviceReadError::PastEnd {
                what: request.key().to_string(),
                start,
                end,
                size: start.saturating_add(bytes.len() as u64),
            });
        }
        buf.copy_from_slice(&bytes);
        Ok(true)
    }
}
