//! Device decoding of compressed chunks (and of every inner chunk of sharded arrays): stored
//! bytes are read into pinned host memory (where zstd frames and crc32c trailers are checked),
//! copied to the device in one transfer per batch on a copy stream (overlapping the previous
//! batch's decode), checked with nvCOMP CRC32C when the chain has `crc32c`, decoded by nvCOMP's
//! batched zstd (large chunks partly on host threads at the same time), then placed into the
//! output by one kernel launch per batch.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaStream};
use nvcomp_sys::{sys as nv, NvcompLibrary};
use rayon::prelude::*;
use zarrs::array::{Array, ArraySubset};
use zarrs_gds_store::{read_store_to_host, DeviceReadRequest, GdsStore, PinnedBuffer};
use zarrs_storage::{ReadableStorageTraits, StoreKey};

use crate::context::{copy_dtod, DeviceBuffer, GpuContext};
use crate::place::{self, Placer};
use crate::plan::{plan_chunks, ChunkPlacement};
use crate::retrieve::{fill_source, DecodePath, DeviceChain, DevicePlan, RetrieveReport};
use crate::shard::sharded_units;
use crate::trace::Trace;
use crate::zstd_frame::{check_frame, FrameVerdict};
use crate::{GpuConfig, GpuError};

/// Stored chunks start at this alignment in the host and device staging when each is read on
/// its own (nvCOMP takes zstd input at any alignment; 256 keeps copies aligned).
const STORED_ALIGN: u64 = 256;
/// Decoded chunks start at this alignment.
const DECODED_ALIGN: u64 = 4096;
/// Chunks at least this large (decoded) may be decoded on host threads: one large zstd frame
/// decodes largely serially on the GPU.
const LARGE_CHUNK: u64 = 4 << 20;
/// Stored ranges of one value this close together are read as one (the gap read and dropped):
/// one pread of 64 KiB more costs less than another request.
const COALESCE_GAP: u64 = 64 << 10;

/// Where a unit's stored bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The whole value at the unit's key (its size is asked batch by batch).
    Whole,
    /// `len` bytes from `offset` of the value at the unit's key (an inner chunk of a shard).
    Range { offset: u64, len: u64 },
    /// Not stored: filled with the fill value.
    Missing,
}

/// What the pipeline decodes: a chunk, or an inner chunk of a shard.
#[derive(Clone, Debug)]
pub(crate) struct Unit {
    /// Where its decoded bytes go; its key is the value its stored bytes are read from.
    pub(crate) placement: ChunkPlacement,
    pub(crate) source: Source,
    /// For an inner chunk, its indices within its shard (named in errors).
    pub(crate) inner: Option<Vec<u64>>,
}

impl Unit {
    /// Each chunk a whole stored value.
    pub(crate) fn whole(placement: ChunkPlacement) -> Self {
        Self { placement, source: Source::Whole, inner: None }
    }

    fn decoded_len(&self, elem: u64) -> u64 {
        self.placement.chunk_shape.iter().product::<u64>() * elem
    }

    /// The chunk's name in errors: its key, and for an inner chunk its indices in the shard.
    pub(crate) fn label(&self) -> String {
        match &self.inner {
            Some(inner) => format!("{} (inner chunk {inner:?})", self.placement.key),
            None => self.placement.key.to_string(),
        }
    }

    fn error(&self, reason: impl Into<String>) -> GpuError {
        GpuError::Chunk { key: self.label(), reason: reason.into() }
    }
}

/// How one unit of a batch is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Missing: filled with the fill value.
    Missing,
    /// nvCOMP on the device (or, with no zstd in the chain, the stored bytes themselves).
    Device,
    /// The zstd crate on a host thread (frames nvCOMP cannot take, or the host's share of large
    /// chunks), then one copy.
    Host,
}

/// A device result to check once the batches are done (offsets into the results buffer).
enum Check {
    /// nvCOMP zstd status and decoded size of a unit.
    Zstd { unit: usize, size: usize, status: usize },
}

struct Item {
    /// Index into the units.
    unit: usize,
    stored_len: u64,
    /// Bytes of the stored chunk that are the zstd frame (or the data): without the crc32c.
    data_len: u64,
    host_offset: u64,
    decoded_offset: u64,
    route: Route,
    /// The crc32c stored after the data, when the chain has crc32c.
    crc: Option<u32>,
}

/// The fraction of large chunks decoded on host threads, when set (`GpuConfig` first, then
/// `ZARRS_GPU_HOST_DECODE_FRACTION`); otherwise [`host_chunks`] decides.
pub(crate) const HOST_FRACTION_ENV: &str = "ZARRS_GPU_HOST_DECODE_FRACTION";

fn host_fraction(config: &GpuConfig) -> Option<f64> {
    config
        .host_decode_fraction()
        .or_else(|| std::env::var(HOST_FRACTION_ENV).ok().and_then(|v| v.trim().parse::<f64>().ok()))
        .map(|f| f.clamp(0.0, 1.0))
}

/// nvCOMP's zstd throughput on large frames given enough of them (H200: 512 frames of 16 MiB
/// in one call ran at 24.9 GiB/s, nvCOMP's Python API on the same chunks).
const DEVICE_LARGE_RATE: f64 = 25.0 * (1u64 << 30) as f64;
/// Frames nvCOMP decodes side by side before its throughput stops growing: fewer take as long
/// as one frame decoded at DEVICE_LARGE_RATE / this (64 and 128 frames of 16 MiB ran at 3.6
/// and 6.9 GiB/s, about this line).
const DEVICE_LARGE_WIDTH: f64 = 512.0;
/// One host thread's zstd rate on these frames while the others also read.
const HOST_THREAD_RATE: f64 = 0.24 * (1u64 << 30) as f64;

/// How many of `large` frames of `chunk` decoded bytes go to host threads so that host and
/// device finish together: the device takes as long for a few frames as for
/// DEVICE_LARGE_WIDTH (one frame decodes largely serially), the host's threads each decode
/// one frame at a time. With hundreds of frames the device alone is fastest; with a handful,
/// the host is.
fn host_chunks(large: usize, chunk: u64, threads: usize) -> usize {
    let chunk = chunk as f64;
    let device = |m: usize| if m == 0 { 0.0 } else { chunk * (m as f64).max(DEVICE_LARGE_WIDTH) / DEVICE_LARGE_RATE };
    let host = |k: usize| k.div_ceil(threads.max(1)) as f64 * chunk / HOST_THREAD_RATE;
    // The smallest share among the fastest (ties keep chunks on the device).
    (0..=large)
        .min_by(|&a, &b| {
            let (ta, tb) = (device(large - a).max(host(a)), device(large - b).max(host(b)));
            ta.total_cmp(&tb).then(a.cmp(&b))
        })
        .unwrap_or(0)
}

/// Decoded bytes per batch of zstd chunks when the device has room (`free` is the device memory
/// free for the read, None for chains without zstd): nvCOMP runs faster the more chunks a call
/// has. Large frames (one decodes largely serially) take up to 1024 chunks: one batch of 512
/// 16 MiB chunks ran at 13.5 GiB/s, two of 256 at 11. Small chunks take up to 4 GiB unless the
/// staging budget was set: 4096 chunks of 1 MiB per call ran at 39 to 41 GiB/s, 1024 at 33. A
/// batch takes about 5x its decoded bytes, two in flight, hence a twelfth of what is free.
fn batch_budget(staging: u64, staging_set: bool, largest: u64, free: Option<u64>, out_bytes: u64) -> u64 {
    let Some(free) = free else { return staging };
    let room = free.saturating_sub(out_bytes) / 12;
    if largest >= LARGE_CHUNK {
        staging.max((1024 * largest).min(room))
    } else if staging_set {
        staging
    } else {
        staging.max(room.min(SMALL_BATCH))
    }
}

/// The most decoded bytes of a batch of small zstd chunks (see [`batch_budget`]).
const SMALL_BATCH: u64 = 4 << 30;

/// Group chunks of these decoded sizes, in order, into batches of at most `budget` bytes (each
/// size rounded up to the staging alignment); a chunk larger than the budget is a batch alone.
fn batches_by_size(sizes: impl IntoIterator<Item = u64>, budget: u64) -> Vec<Vec<usize>> {
    let mut batches: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, size) in sizes.into_iter().enumerate() {
        let need = size.next_multiple_of(DECODED_ALIGN);
        if batches.is_empty() || used + need > budget {
            batches.push(Vec::new());
            used = 0;
        }
        batches.last_mut().expect("a batch").push(i);
        used += need;
    }
    batches
}

/// The reads of a batch: stored spans `(key, offset, len)` of one value that lie at most `gap`
/// bytes apart become one request (in offset order), each request landing at an aligned offset of
/// host staging. Returns the requests, per span its request and host offset, and the staging used.
fn coalesce(spans: &[(&StoreKey, u64, u64)], gap: u64) -> (Vec<DeviceReadRequest>, Vec<(usize, u64)>, u64) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|&a, &b| spans[a].0.as_str().cmp(spans[b].0.as_str()).then(spans[a].1.cmp(&spans[b].1)));
    let mut requests: Vec<DeviceReadRequest> = Vec::new();
    let mut at = vec![(0, 0); spans.len()];
    let mut used = 0u64;
    for i in order {
        let (key, offset, len) = spans[i];
        let joins = requests.last().is_some_and(|r| {
            let end = r.offset + r.len as u64;
            r.key == *key && offset >= end && offset - end <= gap
        });
        if joins {
            let r = requests.last_mut().expect("a request");
            r.len = (offset + len - r.offset) as usize;
        } else {
            if let Some(r) = requests.last() {
                used = (r.dst + r.len as u64).next_multiple_of(STORED_ALIGN);
            }
            requests.push(DeviceReadRequest { key: key.clone(), offset, len: len as usize, dst: used });
        }
        let r = requests.last().expect("a request");
        at[i] = (requests.len() - 1, r.dst + offset - r.offset);
    }
    let total = requests.last().map_or(0, |r| r.dst + r.len as u64);
    (requests, at, total)
}

/// Keep `buffer` at least `len` bytes: a buffer that is too small (or none) is replaced by one a
/// quarter larger than asked, so that batches of slowly growing size do not reallocate each time.
/// The old buffer must no longer be in use.
fn ensure<B>(
    buffer: &mut Option<B>,
    len: u64,
    capacity: impl Fn(&B) -> usize,
    take: impl Fn(usize) -> Result<B, GpuError>,
    give: impl Fn(B),
) -> Result<(), GpuError> {
    if buffer.as_ref().is_some_and(|b| capacity(b) as u64 >= len) {
        return Ok(());
    }
    let grow = buffer.is_some();
    if let Some(old) = buffer.take() {
        give(old);
    }
    let len = if grow { len + len / 4 } else { len };
    *buffer = Some(take(len.max(1) as usize)?);
    Ok(())
}

/// Decode `subset` of an array on the device: its chunks (or, for sharded arrays, the inner
/// chunks meeting the subset) are stored as `plan` says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn retrieve_decoded<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    plan: &DevicePlan,
    nvcomp: Option<&NvcompLibrary>,
) -> Result<(CudaSlice<u8>, RetrieveReport), GpuError> {
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
    let chunks = crate::retrieve::chunks_meeting(array, subset)?;
    if plan.shards.is_empty() {
        let units: Vec<Unit> = plan_chunks(elem, subset, chunks).into_iter().map(Unit::whole).collect();
        return decode_units(array, &units, gds, config, context, stream, subset.shape(), &plan.chain, nvcomp);
    }
    let storage = array.storage();
    let (units, index_bytes) =
        sharded_units(storage.as_ref(), gds, context.reader(), &plan.shards, elem, subset, chunks)?;
    let (out, mut report) =
        decode_units(array, &units, gds, config, context, stream, subset.shape(), &plan.chain, nvcomp)?;
    report.bytes_read += index_bytes;
    Ok((out, report))
}

/// Read, check, decode and place `units` (chunks or inner chunks, all stored as `chain` says)
/// into a new C-order output of `out_shape`.
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
pub(crate) fn decode_units<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    units: &[Unit],
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    out_shape: &[u64],
    chain: &DeviceChain,
    nvcomp: Option<&NvcompLibrary>,
) -> Result<(CudaSlice<u8>, RetrieveReport), GpuError> {
    let mut trace = Trace::new();
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
    let out_bytes = out_shape.iter().product::<u64>() * elem;
    let storage = array.storage();
    let nvcomp = match nvcomp {
        Some(nvcomp) => Some(nvcomp),
        None if !chain.needs_nvcomp() => None,
        None => return Err(GpuError::NoCuda("nvCOMP is needed for this codec chain".into())),
    };

    let decoded_len = |u: usize| units[u].decoded_len(elem);
    let largest = (0..units.len()).map(decoded_len).max().unwrap_or(0);
    let free = if chain.zstd { Some(context.free_bytes()?) } else { None };
    let budget = batch_budget(config.staging_bytes() as u64, config.staging_is_set(), largest, free, out_bytes);
    let batches = batches_by_size((0..units.len()).map(decoded_len), budget);
    let threads = context.reader().options().threads;
    let fraction = host_fraction(config);
    let slots = if batches.len() > 1 { 2 } else { 1 };

    // Device memory a batch may take: stored bytes (at most about the decoded bytes), decoded
    // bytes, nvCOMP's temp space, metadata. Checked before anything is allocated.
    let meta_len = |batch: &[usize]| -> u64 {
        let copies: usize = batch.iter().map(|&u| units[u].placement.copies.len()).sum();
        // nvCOMP's arrays (at most 68 bytes per chunk, zstd and crc32c together), then the
        // placement kernels' tables: gather jobs (one per chunk) and strided copies.
        let gather = if chain.needs_gather() { place::gather_table_bytes(batch.len()) as u64 } else { 0 };
        (batch.len() as u64 * 96 + gather + place::table_bytes(copies) as u64).next_multiple_of(DECODED_ALIGN)
    };
    let mut largest_slot = 0u64;
    for batch in &batches {
        let decoded: u64 = batch.iter().map(|&u| decoded_len(u).next_multiple_of(DECODED_ALIGN)).sum();
        let max_chunk = batch.iter().map(|&u| decoded_len(u)).max().unwrap_or(0);
        let temp = match nvcomp {
            Some(nvcomp) if chain.zstd => nvcomp
                .zstd_decompress_temp_size(batch.len(), max_chunk as usize, decoded as usize)
                .map_err(nvcomp_err)? as u64,
            _ => 0,
        };
        largest_slot = largest_slot.max(2 * decoded + temp + meta_len(batch));
    }
    context.check_free(out_bytes + largest_slot * slots as u64)?;
    trace.mark("plan");

    let (out, out_ptr) = context.alloc_output(stream, out_bytes as usize)?;
    // Host-to-device copies of stored and host-decoded bytes run on their own stream, so that a
    // batch's copy overlaps the previous batch's decode.
    let copy_stream = context.new_stream()?;
    let mut device: Vec<(Option<DeviceBuffer>, Option<CudaEvent>)> = (0..slots).map(|_| (None, None)).collect();
    // Per slot: stored chunks then the metadata staged for async copies; chunks decoded on host
    // threads.
    let mut host: Vec<Option<PinnedBuffer>> = (0..slots).map(|_| None).collect();
    let mut host_decoded: Vec<Option<PinnedBuffer>> = (0..slots).map(|_| None).collect();
    // What nvCOMP zstd reports back, batch after batch: per batch its decoded sizes (u64) and
    // statuses (u32), 12 bytes per chunk.
    let mut results = context.take_pinned(units.len().max(1) * 12)?;
    let results_base = results.as_mut_slice().as_mut_ptr();
    trace.mark("buffers");

    let mut report = RetrieveReport::new(DecodePath::Device, units.len());
    report.io = Some(zarrs_gds_store::IoStatus {
        path: if gds.is_some() { zarrs_gds_store::IoPath::Posix } else { zarrs_gds_store::IoPath::Staged },
        reason: "stored chunks are read to host memory, where they are checked".into(),
    });
    let mut fill: Option<DeviceBuffer> = None;
    let fill_len = units.iter().map(|u| u.placement.read_len()).max().unwrap_or(0);
    let mut checks: Vec<Check> = Vec::new();
    let mut results_at = 0usize;
    let placer = Placer::get(context.cuda());
    let result = (|| -> Result<(), GpuError> {
        for (b, batch) in batches.iter().enumerate() {
            let slot = b % slots;
            if let Some(event) = device[slot].1.take() {
                event.synchronize().map_err(GpuError::cuda("waiting for a batch"))?;
                trace.mark("wait slot");
            }
            // Stored spans: whole values are sized here, batch by batch, so that later batches'
            // queries overlap the device's work on earlier ones.
            let spans: Vec<Option<(u64, u64)>> = context
                .reader()
                .install(|| {
                    batch
                        .par_iter()
                        .map(|&u| match units[u].source {
                            Source::Whole => storage.size_key(&units[u].placement.key).map(|s| s.map(|s| (0, s))),
                            Source::Range { offset, len } => Ok(Some((offset, len))),
                            Source::Missing => Ok(None),
                        })
                        .collect::<Result<_, _>>()
                })
                .map_err(|e| GpuError::Array(e.into()))?;
            let stored: Vec<(&StoreKey, u64, u64)> = batch
                .iter()
                .zip(&spans)
                .filter_map(|(&u, s)| s.map(|(offset, len)| (&units[u].placement.key, offset, len)))
                .collect();
            let (requests, at, stored_total) = coalesce(&stored, COALESCE_GAP);
            let mut items = Vec::with_capacity(batch.len());
            let mut decoded_at = 0u64;
            let mut next_span = at.iter();
            for (&u, span) in batch.iter().zip(&spans) {
                let (route, stored_len, host_offset) = match span {
                    Some((_, len)) => (Route::Device, *len, next_span.next().expect("one per span").1),
                    None => (Route::Missing, 0, 0),
                };
                items.push(Item {
                    unit: u,
                    stored_len,
                    data_len: stored_len,
                    host_offset,
                    decoded_offset: decoded_at,
                    route,
                    crc: None,
                });
                decoded_at += decoded_len(u).next_multiple_of(DECODED_ALIGN);
            }
            let decoded_total = decoded_at;
            trace.mark("sizes");

            let meta_bytes = meta_len(batch);
            let host_meta_at = stored_total.next_multiple_of(STORED_ALIGN);
            ensure(
                &mut host[slot],
                host_meta_at + meta_bytes,
                PinnedBuffer::len,
                |len| context.take_pinned(len),
                |old| context.give_pinned(old),
            )?;
            let hbuf = host[slot].as_mut().expect("ensured");
            let found = match gds {
                Some(store) => store.read_to_host(context.reader(), &requests, hbuf.as_mut_slice())?,
                None => read_store_to_host(storage.as_ref(), context.reader(), &requests, hbuf.as_mut_slice())?,
            };
            report.bytes_read +=
                requests.iter().zip(&found).filter(|(_, &f)| f).map(|(r, _)| r.len as u64).sum::<u64>();
            let mut next_span = at.iter();
            for it in items.iter_mut().filter(|it| it.route != Route::Missing) {
                if !found[next_span.next().expect("one per span").0] {
                    it.route = Route::Missing; // deleted between the size query and the read
                }
            }
            trace.mark("read");
            // Check every stored chunk on the host: crc32c trailer, zstd frame structure and size.
            let stored_bytes = hbuf.as_slice();
            context.reader().install(|| {
                items.par_iter_mut().filter(|it| it.route != Route::Missing).try_for_each(|it| {
                    let unit = &units[it.unit];
                    let bytes = &stored_bytes[it.host_offset as usize..][..it.stored_len as usize];
                    if chain.crc32c {
                        if bytes.len() < 4 {
                            return Err(unit.error(format!("{} bytes cannot hold a crc32c checksum", bytes.len())));
                        }
                        it.data_len -= 4;
                        it.crc = Some(u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes")));
                    }
                    let data = &bytes[..it.data_len as usize];
                    let expected = decoded_len(it.unit);
                    if chain.zstd {
                        match check_frame(data, expected).map_err(|e| unit.error(e.to_string()))? {
                            FrameVerdict::Device { .. } => {}
                            FrameVerdict::Host(_) => it.route = Route::Host,
                        }
                    } else if data.len() as u64 != expected {
                        return Err(unit.error(format!("{} bytes stored, {expected} expected", data.len())));
                    }
                    Ok(())
                })
            })?;
            // The host's share of large chunks.
            let large: Vec<usize> = (0..items.len())
                .filter(|&k| items[k].route == Route::Device && chain.zstd && decoded_len(items[k].unit) >= LARGE_CHUNK)
                .collect();
            let largest = large.iter().map(|&k| decoded_len(items[k].unit)).max().unwrap_or(0);
            let host_share = match fraction {
                Some(fraction) => (large.len() as f64 * fraction).round() as usize,
                None => host_chunks(large.len(), largest, threads),
            };
            for &k in large.iter().rev().take(host_share) {
                items[k].route = Route::Host;
            }
            trace.mark("check");

            // This batch's device layout: stored bytes, decoded bytes, nvCOMP temp, metadata.
            let on_device: Vec<&Item> = items.iter().filter(|it| it.route == Route::Device).collect();
            let with_crc: Vec<&Item> = items.iter().filter(|it| it.crc.is_some()).collect();
            let (n_zstd, n_crc) = (if chain.zstd { on_device.len() } else { 0 }, with_crc.len());
            let max_chunk = on_device.iter().map(|it| decoded_len(it.unit)).max().unwrap_or(0);
            let temp_bytes = match nvcomp {
                Some(nvcomp) if n_zstd > 0 => nvcomp
                    .zstd_decompress_temp_size(n_zstd, max_chunk as usize, decoded_total as usize)
                    .map_err(nvcomp_err)?,
                _ => 0,
            };
            let decoded_room = if chain.zstd { decoded_total } else { 0 };
            let stored_room = stored_total.next_multiple_of(DECODED_ALIGN);
            let temp_room = (temp_bytes as u64).next_multiple_of(DECODED_ALIGN);
            ensure(
                &mut device[slot].0,
                stored_room + decoded_room + temp_room + meta_bytes,
                DeviceBuffer::len,
                |len| context.take_staging(len),
                |old| context.give_staging(old),
            )?;
            let cbase = device[slot].0.as_ref().expect("ensured").ptr();
            let dbase = cbase + stored_room;
            let temp = dbase + decoded_room;
            let meta = temp + temp_room;
            let host_meta = hbuf.as_mut_slice()[host_meta_at as usize..].as_mut_ptr() as usize;
            // Metadata goes through pinned memory, so that its copies do not wait for the stream
            // (a pageable copy would, serialising the next batch's reads behind this one's decode).
            let stage = |at: u64, words: &[u64], device: u64, on: &CudaStream| -> Result<(), GpuError> {
                let bytes = words.len() * 8;
                // SAFETY: the slot's metadata region holds meta_bytes; `at + bytes` stays within
                // it (crc32c arrays, zstd arrays, the placement table at its end); the region is
                // reused only after this batch's event.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        words.as_ptr().cast::<u8>(),
                        (host_meta + at as usize) as *mut u8,
                        bytes,
                    );
                    sys::cuMemcpyHtoDAsync_v2(device, (host_meta + at as usize) as *const c_void, bytes, on.cu_stream())
                }
                .result()
                .map_err(GpuError::cuda("copying decode metadata"))
            };

            // One copy of the batch's stored bytes to the device, on the copy stream.
            context.bind()?;
            let stored_bytes = hbuf.as_slice();
            if stored_total > 0 {
                // SAFETY: the host buffer holds stored_total bytes; cbase has room for them; both
                // are reused only after this batch's event, which follows this copy.
                unsafe {
                    sys::cuMemcpyHtoDAsync_v2(
                        cbase,
                        stored_bytes.as_ptr().cast(),
                        stored_total as usize,
                        copy_stream.cu_stream(),
                    )
                }
                .result()
                .map_err(GpuError::cuda("copying chunks to the device"))?;
            }
            // crc32c on the copy stream too, awaited before anything is decoded: a corrupt frame
            // must never reach nvCOMP (undefined behaviour; a kernel that never ends at worst).
            // The wait overlaps the previous batch's decode on the other stream.
            // Layout at `meta`: pointers, sizes (u64), values, statuses (u32), n_crc of each.
            let crc_room = (24 * n_crc as u64).next_multiple_of(8);
            if let (Some(nvcomp), true) = (nvcomp, n_crc > 0) {
                let mut words: Vec<u64> = with_crc.iter().map(|it| cbase + it.host_offset).collect();
                words.extend(with_crc.iter().map(|it| it.data_len));
                stage(0, &words, meta, copy_stream.as_ref())?;
                let (crc_out, crc_status) = (meta + 16 * n_crc as u64, meta + 20 * n_crc as u64);
                let max_crc = with_crc.iter().map(|it| it.data_len as usize).max().unwrap_or(0);
                let crc_conf = nvcomp.crc32_kernel_conf(n_crc, max_crc).map_err(nvcomp_err)?;
                // SAFETY: pointer and size arrays of n_crc entries in device memory, outputs as
                // many; the results come back into the host metadata region after the arrays.
                unsafe {
                    let status = nvcomp.functions().nvcompBatchedCRC32Async(
                        meta as *const *const c_void,
                        (meta + 8 * n_crc as u64) as *const usize,
                        n_crc,
                        crc_out as *mut u32,
                        nvcomp_sys::crc32c_opts(crc_conf),
                        nv::nvcompCRC32OnlySegment,
                        crc_status as *mut nv::nvcompStatus_t,
                        copy_stream.cu_stream() as nv::cudaStream_t,
                    );
                    nvcomp.check("computing crc32c checksums", status).map_err(nvcomp_err)?;
                    sys::cuMemcpyDtoHAsync_v2(
                        (host_meta + 16 * n_crc) as *mut c_void,
                        crc_out,
                        8 * n_crc,
                        copy_stream.cu_stream(),
                    )
                    .result()
                    .map_err(GpuError::cuda("reading crc32c results"))?;
                }
                copy_stream.synchronize().map_err(GpuError::cuda("computing crc32c checksums"))?;
                // SAFETY: the copy above wrote 8 * n_crc bytes there and has completed.
                let got = unsafe { std::slice::from_raw_parts((host_meta + 16 * n_crc) as *const u32, 2 * n_crc) };
                for (k, it) in with_crc.iter().enumerate() {
                    let unit = &units[it.unit];
                    let (crc, status) = (got[k], got[n_crc + k]);
                    if status != nv::nvcompSuccess {
                        return Err(unit.error(format!("nvCOMP crc32c: {}", nvcomp.status_string(status))));
                    }
                    let expected = it.crc.expect("with crc");
                    if crc != expected {
                        return Err(unit.error(format!(
                            "crc32c checksum mismatch: stored {expected:#010x}, computed {crc:#010x}"
                        )));
                    }
                }
            }
            if stored_total > 0 {
                let copied = copy_stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
                stream.wait(&copied).map_err(GpuError::cuda("ordering a copy before decoding"))?;
            }
            // zstd: pointer, size, capacity and output arrays (u64), then what nvCOMP reports:
            // decoded sizes (u64) and statuses (u32), n_zstd of each, after the crc32c arrays.
            let zmeta = meta + crc_room;
            let actual = zmeta + 32 * n_zstd as u64;
            let zstatus = actual + 8 * n_zstd as u64;
            if let (Some(nvcomp), true) = (nvcomp, n_zstd > 0) {
                let mut words: Vec<u64> = Vec::with_capacity(4 * n_zstd);
                words.extend(on_device.iter().map(|it| cbase + it.host_offset));
                words.extend(on_device.iter().map(|it| it.data_len));
                words.extend(on_device.iter().map(|it| decoded_len(it.unit)));
                words.extend(on_device.iter().map(|it| dbase + it.decoded_offset));
                stage(crc_room, &words, zmeta, stream.as_ref())?;
                let ptr = |k: usize| zmeta + 8 * k as u64;
                // SAFETY: every frame was checked on the host (one frame, recorded size equal to
                // the output buffer) and its crc32c, where the chain has one, on the device; arrays
                // of n_zstd entries in device memory; temp sized by nvCOMP.
                let status = unsafe {
                    nvcomp.functions().nvcompBatchedZstdDecompressAsync(
                        ptr(0) as *const *const c_void,
                        ptr(n_zstd) as *const usize,
                        ptr(2 * n_zstd) as *const usize,
                        actual as *mut usize,
                        n_zstd,
                        temp as *mut c_void,
                        temp_bytes,
                        ptr(3 * n_zstd) as *const *mut c_void,
                        nvcomp_sys::zstd_decompress_opts(),
                        zstatus as *mut nv::nvcompStatus_t,
                        stream.cu_stream() as nv::cudaStream_t,
                    )
                };
                nvcomp.check("launching zstd decompression", status).map_err(nvcomp_err)?;
            }
            // Meanwhile the host decodes its chunks into the slot's pinned buffer, each copied to
            // the device as soon as it is done.
            let host_items: Vec<&Item> = items.iter().filter(|it| it.route == Route::Host).collect();
            report.host_decoded_chunks += host_items.len();
            if !host_items.is_empty() {
                let mut at = Vec::with_capacity(host_items.len());
                let mut need = 0u64;
                for it in &host_items {
                    at.push(need as usize);
                    need += decoded_len(it.unit).next_multiple_of(DECODED_ALIGN);
                }
                ensure(
                    &mut host_decoded[slot],
                    need,
                    PinnedBuffer::len,
                    |len| context.take_pinned(len),
                    |old| context.give_pinned(old),
                )?;
                let base = host_decoded[slot].as_mut().expect("ensured").as_mut_slice().as_mut_ptr() as usize;
                let copy_stream = &copy_stream;
                context.reader().install(|| {
                    host_items.par_iter().zip(&at).try_for_each(|(it, &offset)| {
                        let unit = &units[it.unit];
                        let len = decoded_len(it.unit) as usize;
                        // SAFETY: the regions at `at` are disjoint and lie within the buffer
                        // (sized to their sum).
                        let out = unsafe { std::slice::from_raw_parts_mut((base + offset) as *mut u8, len) };
                        let data = &stored_bytes[it.host_offset as usize..][..it.data_len as usize];
                        let written = zstd::bulk::decompress_to_buffer(data, out)
                            .map_err(|e| unit.error(format!("zstd: {e}")))?;
                        if written != len {
                            return Err(unit.error(format!("zstd decoded {written} bytes, {len} expected")));
                        }
                        context.bind()?;
                        // SAFETY: pinned source within the buffer (reused only after this batch's
                        // event); destination within the slot's decoded region.
                        unsafe {
                            sys::cuMemcpyHtoDAsync_v2(
                                dbase + it.decoded_offset,
                                (base + offset) as *const c_void,
                                len,
                                copy_stream.cu_stream(),
                            )
                        }
                        .result()
                        .map_err(GpuError::cuda("copying host-decoded chunks"))
                    })
                })?;
                let copied = copy_stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
                stream.wait(&copied).map_err(GpuError::cuda("ordering host-decoded chunks before placement"))?;
            }
            trace.mark("decode");
            // zstd results back to the host in one copy (sizes and statuses lie together on the
            // device), checked after the last batch.
            let result_bytes = 12 * n_zstd;
            if result_bytes > 0 {
                // SAFETY: results holds 12 bytes per unit; the source is the contiguous tail of
                // this batch's zstd metadata.
                unsafe {
                    sys::cuMemcpyDtoHAsync_v2(
                        (results_base as usize + results_at) as *mut c_void,
                        actual,
                        result_bytes,
                        stream.cu_stream(),
                    )
                }
                .result()
                .map_err(GpuError::cuda("reading decode results"))?;
            }
            let at = |base: u64, k: usize, width: usize| results_at + (base - actual) as usize + k * width;
            for (k, it) in on_device.iter().enumerate().take(n_zstd) {
                checks.push(Check::Zstd { unit: it.unit, size: at(actual, k, 8), status: at(zstatus, k, 4) });
            }
            results_at += result_bytes;
            // Placement: every copy of the batch in one kernel launch (or by the copy engines);
            // transposed or byte-swapped chunks element by element, by the gather kernel.
            let mut copies = Vec::new();
            let mut srcs = Vec::new();
            let mut jobs = Vec::new();
            for it in &items {
                let p = &units[it.unit].placement;
                let base = if chain.zstd { dbase + it.decoded_offset } else { cbase + it.host_offset };
                let src = match it.route {
                    Route::Missing => {
                        report.missing_chunks += 1;
                        // The fill block is uniform and as long as the longest read.
                        fill_source(&mut fill, context, array, fill_len, stream)?
                    }
                    _ if chain.needs_gather() => {
                        jobs.push(gather_job(chain, elem, p, base, out_shape));
                        continue;
                    }
                    _ => base + p.byte_start,
                };
                copies.extend_from_slice(&p.copies);
                srcs.extend(std::iter::repeat_n(src, p.copies.len()));
            }
            if !jobs.is_empty() {
                let placer = placer.ok_or_else(|| {
                    GpuError::NoCuda("NVRTC is needed to place transposed or byte-swapped chunks".into())
                })?;
                let at = crc_room + 32 * n_zstd as u64 + 12 * n_zstd as u64;
                let at = at.next_multiple_of(8);
                stage(at, &place::encode_gather(&jobs), meta + at, stream.as_ref())?;
                // SAFETY: each job stays within its decoded chunk and `out` (planned from both shapes).
                unsafe { placer.launch_gather(stream, meta + at, &jobs, out_ptr) }?;
            }
            if let Some(placer) = placer {
                let table = place::encode(&copies, &srcs);
                let at = meta_bytes - place::table_bytes(copies.len()) as u64;
                stage(at, &table, meta + at, stream.as_ref())?;
                // SAFETY: copies stay within their decoded chunks (or the fill block) and `out`.
                unsafe { placer.launch(stream, meta + at, &copies, out_ptr) }?;
            } else {
                for (copy, &src) in copies.iter().zip(&srcs) {
                    // SAFETY: as above.
                    unsafe { copy_dtod(copy, src, out_ptr, stream) }?;
                }
            }
            device[slot].1 = Some(stream.record_event(None).map_err(GpuError::cuda("recording an event"))?);
            trace.mark("place");
        }
        stream.synchronize().map_err(GpuError::cuda("decoding on the device"))?;
        trace.mark("final sync");
        // Every chunk's device result: zstd status and size, crc32c status and value.
        let results = results.as_slice();
        let word = |at: usize| u32::from_ne_bytes(results[at..at + 4].try_into().expect("4 bytes"));
        let status_string = |s: u32| nvcomp.map_or_else(|| s.to_string(), |n| n.status_string(s));
        for check in &checks {
            match *check {
                Check::Zstd { unit, size, status } => {
                    if word(status) != nv::nvcompSuccess {
                        return Err(units[unit].error(format!("nvCOMP zstd: {}", status_string(word(status)))));
                    }
                    let size = u64::from_ne_bytes(results[size..size + 8].try_into().expect("8 bytes"));
                    let expected = decoded_len(unit);
                    if size != expected {
                        return Err(units[unit].error(format!("zstd decoded {size} bytes, {expected} expected")));
                    }
                }
            }
        }
        Ok(())
    })();
    let synced = stream.synchronize().and(copy_stream.synchronize());
    if synced.is_ok() {
        for buffer in device.into_iter().filter_map(|(buffer, _)| buffer).chain(fill) {
            context.give_staging(buffer);
        }
        for buffer in host.into_iter().chain(host_decoded).flatten() {
            context.give_pinned(buffer);
        }
        context.give_pinned(results);
    }
    result?;
    trace.finish(&format!(
        "{out_bytes} bytes decoded on the device, {} chunks, {} batches",
        report.chunks,
        batches.len()
    ));
    Ok((out, report))
}

/// The gather job placing `p`'s part of a chunk decoded at `base` (its elements in the chunk's
/// stored layout: C order of its transpose, if any) into an output of `out_shape`.
fn gather_job(chain: &DeviceChain, elem: u64, p: &ChunkPlacement, base: u64, out_shape: &[u64]) -> place::Gather {
    let c_strides = |shape: &[u64]| -> Vec<u64> {
        let mut strides = vec![elem; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        strides
    };
    let shape = &p.chunk_shape;
    // Stored as the transpose by `order`: stored dimension j is chunk dimension order[j].
    let src_stride = match &chain.transpose {
        Some(order) => {
            let stored: Vec<u64> = order.iter().map(|&d| shape[d]).collect();
            let stored_strides = c_strides(&stored);
            let mut strides = vec![0; shape.len()];
            for (j, &d) in order.iter().enumerate() {
                strides[d] = stored_strides[j];
            }
            strides
        }
        None => c_strides(shape),
    };
    let dst_stride = c_strides(out_shape);
    let dot = |start: &[u64], strides: &[u64]| start.iter().zip(strides).map(|(a, b)| a * b).sum::<u64>();
    place::Gather {
        src: base + dot(p.chunk_region.start(), &src_stride),
        dst: dot(p.output_region.start(), &dst_stride),
        elem,
        swap: chain.swap,
        extent: p.chunk_region.shape().to_vec(),
        src_stride,
        dst_stride,
    }
}

fn nvcomp_err(err: nvcomp_sys::NvcompError) -> GpuError {
    GpuError::Nvcomp(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_the_budget_in_order() {
        let k = DECODED_ALIGN;
        let batches = batches_by_size([3 * k, 3 * k, 3 * k, 10 * k, k, 1], 6 * k);
        assert_eq!(batches, vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]);
        assert_eq!(batches_by_size([], k), Vec::<Vec<usize>>::new());
        // Sizes round up to the alignment: two odd sizes of just over half a budget do not share.
        assert_eq!(batches_by_size([k + 1, k + 1], 3 * k), vec![vec![0], vec![1]]);
    }

    #[test]
    fn adjacent_ranges_of_one_value_become_one_read() {
        let (a, b) = (StoreKey::new("c/0").unwrap(), StoreKey::new("c/1").unwrap());
        // Out of order; a[0..100] and a[100..150] touch, a[150 + 10..] is within the gap, b apart.
        let spans = [(&a, 100, 50), (&b, 0, 10), (&a, 0, 100), (&a, 160, 40), (&a, 10_000, 5)];
        let (requests, at, total) = coalesce(&spans, 64);
        let got: Vec<(&str, u64, usize, u64)> =
            requests.iter().map(|r| (r.key.as_str(), r.offset, r.len, r.dst)).collect();
        assert_eq!(got, vec![("c/0", 0, 200, 0), ("c/0", 10_000, 5, 256), ("c/1", 0, 10, 512)]);
        assert_eq!(at, vec![(0, 100), (2, 512), (0, 0), (0, 160), (1, 256)]);
        assert_eq!(total, 522);
        // Overlapping ranges (a shard whose index points twice into the same bytes) read apart.
        let (requests, at, _) = coalesce(&[(&a, 0, 100), (&a, 50, 100)], 64);
        assert_eq!(requests.len(), 2);
        assert_eq!(at, vec![(0, 0), (1, 256)]);
        assert_eq!(coalesce(&[], 64).2, 0);
    }

    /// What the gather kernel does, on the host.
    fn apply_gather(job: &place::Gather, src: &[u8], out: &mut [u8]) {
        let count: u64 = job.extent.iter().product();
        for i in 0..count {
            let (mut rest, mut s, mut d) = (i, job.src, job.dst);
            for k in (0..job.extent.len()).rev() {
                let x = rest % job.extent[k];
                rest /= job.extent[k];
                s += x * job.src_stride[k];
                d += x * job.dst_stride[k];
            }
            for w in (0..job.elem).step_by(job.swap.max(1) as usize) {
                let word = job.swap.max(1);
                for b in 0..word {
                    let from = if job.swap > 1 { w + word - 1 - b } else { w + b };
                    out[(d + w + b) as usize] = src[(s + from) as usize];
                }
            }
        }
    }

    #[test]
    fn gather_jobs_undo_transposes_and_byte_order() {
        // A 2 x 3 x 4 chunk of u16 at [4, 0, 0] of the array, stored transposed by [2, 0, 1]
        // and big-endian; the subset [5..6, 1..3, 1..4] of an output of shape [2, 3, 4] at [4, 0, 0].
        let shape = [2u64, 3, 4];
        let value = |z: u64, y: u64, x: u64| (z * 100 + y * 10 + x) as u16 + 0x0100;
        let mut stored = Vec::new();
        for x in 0..4 {
            for z in 0..2 {
                for y in 0..3 {
                    stored.extend(value(z, y, x).to_be_bytes());
                }
            }
        }
        let subset = ArraySubset::new_with_ranges(&[5..6, 1..3, 1..4]);
        let out_subset = ArraySubset::new_with_ranges(&[4..6, 0..3, 0..4]);
        let chunk = ArraySubset::new_with_start_shape(vec![4, 0, 0], shape.to_vec()).unwrap();
        let key = StoreKey::new("c").unwrap();
        let p = plan_chunks(2, &out_subset, [(vec![0, 0, 0], key, chunk)]).pop().unwrap();
        let p = ChunkPlacement {
            chunk_region: subset.relative_to(&[4, 0, 0]).unwrap(),
            output_region: subset.relative_to(&[4, 0, 0]).unwrap(),
            ..p
        };
        let chain = DeviceChain { swap: 2, transpose: Some(vec![2, 0, 1]), ..DeviceChain::default() };
        let job = gather_job(&chain, 2, &p, 0, out_subset.shape());
        let mut out = vec![0u8; 2 * 24];
        apply_gather(&job, &stored, &mut out);
        for z in 0..2u64 {
            for y in 0..3u64 {
                for x in 0..4u64 {
                    let i = ((z * 3 + y) * 4 + x) as usize * 2;
                    let got = u16::from_ne_bytes([out[i], out[i + 1]]);
                    let inside = z == 1 && (1..3).contains(&y) && (1..4).contains(&x);
                    assert_eq!(got, if inside { value(z, y, x) } else { 0 }, "at {z} {y} {x}");
                }
            }
        }
    }

    #[test]
    fn batches_grow_with_free_memory_for_zstd() {
        let gib = 1u64 << 30;
        let staging = gib;
        // No zstd (no memory query): the staging budget.
        assert_eq!(batch_budget(staging, false, 1 << 20, None, 8 * gib), staging);
        // Small frames: up to 4 GiB where a twelfth of the room allows, unless a budget is set.
        assert_eq!(batch_budget(staging, false, 1 << 20, Some(100 * gib), 8 * gib), 4 * gib);
        assert_eq!(batch_budget(staging, false, 1 << 20, Some(32 * gib), 8 * gib), 2 * gib);
        assert_eq!(batch_budget(staging, false, 1 << 20, Some(9 * gib), 8 * gib), staging);
        assert_eq!(batch_budget(staging, true, 1 << 20, Some(100 * gib), 8 * gib), staging);
        // 16 MiB frames with plenty of room: 1024 of them.
        assert_eq!(batch_budget(staging, false, 16 << 20, Some(300 * gib), 8 * gib), 16 * gib);
        // Little room: a twelfth of what the output leaves, never less than the staging budget.
        assert_eq!(batch_budget(staging, true, 16 << 20, Some(32 * gib), 8 * gib), 2 * gib);
        assert_eq!(batch_budget(staging, false, 16 << 20, Some(9 * gib), 8 * gib), staging);
    }

    #[test]
    fn host_share_of_large_frames() {
        let mib = 1u64 << 20;
        // Hundreds of 16 MiB frames: the device alone (it takes as long for 400 as for 512).
        assert_eq!(host_chunks(512, 16 * mib, 16), 0);
        assert_eq!(host_chunks(400, 16 * mib, 16), 0);
        // A handful: all on host threads, each frame about 65 ms there against 320 ms on the device.
        assert_eq!(host_chunks(6, 16 * mib, 16), 6);
        assert_eq!(host_chunks(2, 64 * mib, 16), 2);
        // Thousands: the host takes a share where both finish together.
        let k = host_chunks(2048, 16 * mib, 16);
        assert!(k > 100 && k < 400, "{k}");
        assert_eq!(host_chunks(0, 16 * mib, 16), 0);
        // Set fractions win, clamped to 0..1.
        let config = GpuConfig::default();
        assert_eq!(host_fraction(&config.clone().with_host_decode_fraction(Some(0.2))), Some(0.2));
        assert_eq!(host_fraction(&config.clone().with_host_decode_fraction(Some(3.0))), Some(1.0));
        assert_eq!(host_fraction(&config.with_host_decode_fraction(Some(-1.0))), Some(0.0));
    }
}
