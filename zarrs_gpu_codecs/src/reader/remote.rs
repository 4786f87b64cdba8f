//! The reader's reads from a [`RemoteStore`]: many ranged GETs in flight on the store's runtime,
//! each value handed to the reader's threads as it arrives, which copy it through their pinned
//! buffers to the device (or into the caller's pinned buffer, mirrored to the device). Values
//! fetched whole while a batch was sized ([`Prefetched`]) are not fetched again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use zarrs_gds_store::{
    DeviceReadOutcome, IoPath, IoStatus, ReadError, RemoteRange, RemoteStore, ValueRange, ValueVersion,
};
use zarrs_storage::{Bytes, StoreKey};

use super::{
    DeviceMirror, DeviceReadError, DeviceReadRequest, DeviceReader, HostReadRequest, Outcome, PieceSource, SendPtr,
};

/// The first error of a read's copies, which stops the GETs still to come.
#[derive(Default)]
struct FirstError(Mutex<Option<DeviceReadError>>);

impl FirstError {
    fn set(&self, err: DeviceReadError) {
        let mut first = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert(err);
    }

    fn take(&self) -> Option<DeviceReadError> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// One fetched value, as the source of its pieces.
struct Fetched<'a>(&'a Bytes);

impl PieceSource for Fetched<'_> {
    fn read_host(&self, _transfer: usize, offset: u64, buf: &mut [u8]) -> Result<bool, DeviceReadError> {
        let start = offset as usize;
        buf.copy_from_slice(&self.0[start..start + buf.len()]);
        Ok(true)
    }
}

/// Whole values fetched while their batch was sized (one GET told the size and brought the
/// bytes, where a HEAD would have told only the size): the batch's reads take them from here.
#[derive(Default)]
pub(crate) struct Prefetched(HashMap<StoreKey, Bytes>);

impl Prefetched {
    pub(crate) fn new(values: impl IntoIterator<Item = (StoreKey, Bytes)>) -> Self {
        Self(values.into_iter().collect())
    }

    /// `request`'s bytes from its prefetched value: None when its key was not prefetched, an
    /// error when the range lies past the value's end.
    fn range<R: ValueRange>(&self, request: &R) -> Option<Result<Bytes, DeviceReadError>> {
        let value = self.0.get(request.key())?;
        let (start, len) = (request.offset(), request.len() as u64);
        Some(match start.checked_add(len).filter(|&end| end <= value.len() as u64) {
            Some(end) => Ok(value.slice(start as usize..end as usize)),
            None => Err(ReadError::PastEnd {
                what: request.key().to_string(),
                start,
                end: start.saturating_add(len),
                size: value.len() as u64,
            }
            .into()),
        })
    }

    /// The prefetched value's size.
    fn size(&self, key: &StoreKey) -> Option<u64> {
        self.0.get(key).map(|v| v.len() as u64)
    }
}

fn remote_ranges<R: ValueRange>(requests: &[R], indices: &[usize]) -> Vec<RemoteRange> {
    indices
        .iter()
        .map(|&i| {
            let r = &requests[i];
            RemoteRange { key: r.key().clone(), offset: r.offset(), len: r.len() as u64 }
        })
        .collect()
}

fn remote_status(store: &RemoteStore) -> IoStatus {
    IoStatus::new(IoPath::Remote, format!("{store}: {} ranged GETs in flight", store.concurrency()))
}

impl DeviceReader {
    /// Read every request's bytes from `store` into device memory: up to the store's concurrency
    /// of ranged GETs in flight, each value copied through the reader's pinned buffers as soon as
    /// it arrives. `stream` as in [`Self::read_gds_to_device`].
    ///
    /// # Safety
    /// Every `dst` must be valid device memory of the reader's context for its `len` bytes, and no
    /// two destinations may overlap.
    ///
    /// # Errors
    /// Returns the first failed GET's error (naming its key), an error when a value is shorter
    /// than requested or not its known size, or a copy's error; after every copy in flight has
    /// completed.
    pub unsafe fn read_remote_to_device(
        &self,
        store: &RemoteStore,
        requests: &[DeviceReadRequest],
        stream: Option<&CudaStream>,
    ) -> Result<DeviceReadOutcome, DeviceReadError> {
        // SAFETY: the caller's contract.
        unsafe { self.remote_to_device(store, requests, stream, &Prefetched::default()) }
    }

    /// [`Self::read_remote_to_device`], the values in `prefetched` taken from there.
    ///
    /// # Safety
    /// As [`Self::read_remote_to_device`].
    pub(crate) unsafe fn remote_to_device(
        &self,
        store: &RemoteStore,
        requests: &[DeviceReadRequest],
        stream: Option<&CudaStream>,
        prefetched: &Prefetched,
    ) -> Result<DeviceReadOutcome, DeviceReadError> {
        check_remote_sizes(store, requests, prefetched)?;
        let outcome = Outcome::new(requests.len());
        let task = self.options.task_size;
        let result = self.fetch_each(store, requests, prefetched, &outcome, |i, bytes| {
            let (source, dst) = (Fetched(&bytes), requests[i].dst);
            for offset in (0..bytes.len()).step_by(task) {
                let piece = [(i, offset as u64, (bytes.len() - offset).min(task))];
                self.piece_via_pinned(&source, &piece, dst + offset as u64, &outcome)?;
            }
            Ok(())
        });
        self.settle(result, stream)?;
        let found = outcome.finish(requests.iter().map(|r| r.len))?;
        Ok(DeviceReadOutcome::new(found, remote_status(store)))
    }

    /// Read every request's bytes from `store` into `buf` at its `at` offset (ranged GETs as
    /// [`Self::read_remote_to_device`]), each value also copied to the device with a `mirror` as
    /// soon as it lands. Returns, per request, whether its key exists.
    ///
    /// # Errors
    /// As [`Self::read_remote_to_device`], and an error when a destination lies outside `buf` or
    /// two overlap.
    pub fn read_remote_to_host(
        &self,
        store: &RemoteStore,
        requests: &[HostReadRequest],
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
    ) -> Result<Vec<bool>, DeviceReadError> {
        self.remote_to_host(store, requests, buf, mirror, &Prefetched::default())
    }

    /// [`Self::read_remote_to_host`], the values in `prefetched` taken from there.
    pub(crate) fn remote_to_host(
        &self,
        store: &RemoteStore,
        requests: &[HostReadRequest],
        buf: &mut [u8],
        mirror: Option<DeviceMirror<'_>>,
        prefetched: &Prefetched,
    ) -> Result<Vec<bool>, DeviceReadError> {
        let transfers: Vec<super::HostTransfer> =
            requests.iter().map(|r| super::HostTransfer { at: r.at, len: r.len }).collect();
        super::check_host_destinations(&transfers, buf.len(), mirror.as_ref())?;
        check_remote_sizes(store, requests, prefetched)?;
        let base = SendPtr(buf.as_mut_ptr());
        let outcome = Outcome::new(requests.len());
        let result = self.fetch_each(store, requests, prefetched, &outcome, |i, bytes| {
            let at = requests[i].at;
            // SAFETY: the destinations were checked to lie in `buf` and not to overlap, and each
            // request's bytes are written by its own task only.
            let host = unsafe { std::slice::from_raw_parts_mut(base.get().add(at), bytes.len()) };
            host.copy_from_slice(&bytes);
            match &mirror {
                Some(mirror) => self.copy_piece(host, mirror.device + at as u64),
                None => Ok(()),
            }
        });
        self.settle_mirrored(result, mirror.map(|m| m.stream))?;
        outcome.finish(requests.iter().map(|r| r.len))
    }
}

impl DeviceReader {
    /// Every request's bytes, each handed to `copy` on the reader's threads as soon as it is
    /// there: taken from `prefetched` at once where its value was fetched whole, else fetched from
    /// `store` (a missing value recorded as such). The first error, of a GET or of a copy, stops
    /// the GETs still to come and is returned once every copy begun has returned.
    fn fetch_each<R: ValueRange + Sync>(
        &self,
        store: &RemoteStore,
        requests: &[R],
        prefetched: &Prefetched,
        outcome: &Outcome,
        copy: impl Fn(usize, Bytes) -> Result<(), DeviceReadError> + Sync,
    ) -> Result<(), DeviceReadError> {
        let failed = FirstError::default();
        let mut to_fetch = Vec::new();
        let fetched = self.pool.in_place_scope(|scope| {
            let copies = Copies { copy: &copy, requests, outcome, failed: &failed };
            for (i, request) in requests.iter().enumerate() {
                match prefetched.range(request) {
                    Some(bytes) => copies.spawn(scope, i, bytes?, prefetched.size(request.key())),
                    None => to_fetch.push(i),
                }
            }
            // Ranges planned from one version of their object (a shard's index) are fetched from
            // that version only (If-Match): one replaced since is an error, never its bytes.
            let e_tags: Vec<Option<Arc<str>>> = to_fetch
                .iter()
                .map(|&i| match requests[i].version() {
                    Some(ValueVersion::ETag(e_tag)) => Some(e_tag.clone()),
                    _ => None,
                })
                .collect();
            store.fetch_many_if_match(&remote_ranges(requests, &to_fetch), &e_tags, |j, got| {
                if let Some(err) = failed.take() {
                    return Err(err);
                }
                let i = to_fetch[j];
                match got {
                    Some((bytes, value_size)) => copies.spawn(scope, i, bytes, value_size),
                    None => outcome.record(i, false),
                }
                Ok(())
            })
        });
        fetched.and_then(|()| failed.take().map_or(Ok(()), Err))
    }
}

/// What each value's copy task needs: the copy, the requests, where outcomes and the first
/// error go.
struct Copies<'a, F, R> {
    copy: &'a F,
    requests: &'a [R],
    outcome: &'a Outcome,
    failed: &'a FirstError,
}

impl<'a, F: Fn(usize, Bytes) -> Result<(), DeviceReadError> + Sync, R: ValueRange + Sync> Copies<'a, F, R> {
    /// Copy request `i`'s `bytes` on one of the scope's threads: exactly its length, checked
    /// here (the copies write that many bytes at its destination), from a value of the size the
    /// request knows it must have, where the response said its size (`value_size`).
    fn spawn(&self, scope: &rayon::Scope<'a>, i: usize, bytes: Bytes, value_size: Option<u64>) {
        let Copies { copy, requests, outcome, failed } = *self;
        scope.spawn(move |_| {
            let request = &requests[i];
            let wrong_size = request.value_len().zip(value_size).filter(|(expected, size)| expected != size);
            let copied = if let Some((expected, size)) = wrong_size {
                Err(ReadError::WrongSize { what: request.key().to_string(), size, expected }.into())
            } else if bytes.len() == request.len() {
                copy(i, bytes)
            } else {
                Err(ReadError::PastEnd {
                    what: request.key().to_string(),
                    start: request.offset(),
                    end: request.offset().saturating_add(request.len() as u64),
                    size: request.offset().saturating_add(bytes.len() as u64),
                }
                .into())
            };
            match copied {
                Ok(()) => outcome.record(i, true),
                Err(err) => failed.set(err),
            }
        });
    }
}

/// Values whose size the requests know must have it, before anything is read: a prefetched
/// value's own size, and where the store's responses do not tell sizes, the others asked with
/// many requests in flight (an object store's are checked as each response arrives).
fn check_remote_sizes<R: ValueRange>(
    store: &RemoteStore,
    requests: &[R],
    prefetched: &Prefetched,
) -> Result<(), DeviceReadError> {
    let mut known: Vec<(&StoreKey, u64)> =
        requests.iter().filter_map(|r| r.value_len().map(|n| (r.key(), n))).collect();
    known.sort_unstable();
    known.dedup();
    let wrong = |key: &StoreKey, size: u64, expected: u64| -> DeviceReadError {
        ReadError::WrongSize { what: key.to_string(), size, expected }.into()
    };
    // Object stores tell each value's size with its bytes: checked as they arrive, no HEAD first.
    if store.reports_sizes() {
        known.retain(|(key, _)| prefetched.size(key).is_some());
    }
    let mut ask = Vec::new();
    for &(key, expected) in &known {
        match prefetched.size(key) {
            Some(size) if size != expected => return Err(wrong(key, size, expected)),
            Some(_) => {}
            None => ask.push((key, expected)),
        }
    }
    if ask.is_empty() {
        return Ok(());
    }
    let keys: Vec<&StoreKey> = ask.iter().map(|k| k.0).collect();
    for (&(key, expected), size) in ask.iter().zip(store.sizes(&keys)?) {
        if let Some(size) = size.filter(|&size| size != expected) {
            return Err(wrong(key, size, expected));
        }
    }
    Ok(())
}
