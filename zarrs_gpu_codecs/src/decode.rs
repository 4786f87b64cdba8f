//! Device decoding of compressed chunks: whole stored chunks are read into pinned host memory
//! (where their zstd frames are checked), copied to the device in one transfer per batch, checked
//! with nvCOMP CRC32C when the chain has `crc32c`, decoded by nvCOMP's batched zstd (large chunks
//! partly on host threads at the same time), then placed into the output like uncompressed chunks.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaStream};
use nvcomp_sys::{sys as nv, NvcompLibrary};
use rayon::prelude::*;
use zarrs::array::{Array, ArraySubset};
use zarrs_gds_store::{read_store_to_host, DeviceReadRequest, GdsStore, PinnedBuffer};
use zarrs_storage::ReadableStorageTraits;

use crate::context::{copy_dtod, DeviceBuffer, GpuContext};
use crate::place::{self, Placer};
use crate::plan::{plan_chunks, ChunkPlacement};
use crate::retrieve::{fill_source, DecodePath, DeviceChain, RetrieveReport};
use crate::trace::Trace;
use crate::zstd_frame::{check_frame, FrameVerdict};
use crate::{GpuConfig, GpuError};

/// Stored chunks start at this alignment in the host and device staging (nvCOMP needs 8 or less
/// for zstd input; 256 keeps copies aligned).
const STORED_ALIGN: u64 = 256;
/// Decoded chunks start at this alignment.
const DECODED_ALIGN: u64 = 4096;
/// Chunks at least this large (decoded) may be decoded on host threads: one large zstd frame
/// decodes largely serially on the GPU.
const LARGE_CHUNK: u64 = 4 << 20;

/// How one chunk of a batch is decoded.
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
    /// nvCOMP zstd status and decoded size of a placement.
    Zstd { placement: usize, size: usize, status: usize },
    /// nvCOMP crc32c of a placement, against the stored value.
    Crc32c { placement: usize, expected: u32, value: usize, status: usize },
}

struct Item {
    /// Index into the placements.
    placement: usize,
    stored_len: u64,
    /// Bytes of the stored chunk that are the zstd frame (or the data): without the crc32c.
    data_len: u64,
    host_offset: u64,
    decoded_offset: u64,
    route: Route,
    /// The crc32c stored after the data, when the chain has crc32c.
    crc: Option<u32>,
}

/// The fraction of large chunks decoded on host threads (`ZARRS_GPU_HOST_DECODE_FRACTION`
/// overrides; `GpuConfig::with_host_decode_fraction` too).
pub(crate) const HOST_FRACTION_ENV: &str = "ZARRS_GPU_HOST_DECODE_FRACTION";

fn host_fraction(config: &GpuConfig, threads: usize) -> f64 {
    if let Some(f) = config.host_decode_fraction() {
        return f.clamp(0.0, 1.0);
    }
    if let Some(f) = std::env::var(HOST_FRACTION_ENV).ok().and_then(|v| v.trim().parse::<f64>().ok()) {
        return f.clamp(0.0, 1.0);
    }
    // Both finish together when each takes a share proportional to its rate: large frames decode
    // on the H200 at about 7 GiB/s (nvCOMP, 16 MiB chunks, hundreds per call) and on one host
    // thread at about 0.24 GiB/s once the threads also read (measured best share 0.35 with 16).
    let host = 0.24 * threads as f64;
    host / (host + 7.0)
}

/// Decoded bytes per batch: the staging budget; for large zstd frames (`free` is then the device
/// memory free for the read) up to 1024 chunks when the device has room, since nvCOMP decodes one
/// large frame largely serially and needs hundreds per call (a batch takes about 5x its decoded
/// bytes, two in flight). One batch of 512 16 MiB chunks ran at 13.5 GiB/s, two of 256 at 11.
fn batch_budget(staging: u64, largest: u64, free: Option<u64>, out_bytes: u64) -> u64 {
    match free {
        Some(free) if largest >= LARGE_CHUNK => staging.max((1024 * largest).min(free.saturating_sub(out_bytes) / 12)),
        _ => staging,
    }
}

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

/// Decode `subset` of an array whose chunks are stored `bytes` + `chain` on the device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn retrieve_decoded<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    out_bytes: u64,
    chain: DeviceChain,
    nvcomp: &NvcompLibrary,
) -> Result<(CudaSlice<u8>, RetrieveReport), GpuError> {
    let mut trace = Trace::new();
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
    let chunks = crate::retrieve::chunks_meeting(array, subset)?;
    let placements = plan_chunks(elem, subset, chunks);
    let decoded_len = |p: &ChunkPlacement| p.chunk_shape.iter().product::<u64>() * elem;
    let storage = array.storage();
    let sizes: Vec<Option<u64>> = context
        .reader()
        .install(|| placements.par_iter().map(|p| storage.size_key(&p.key)).collect::<Result<_, _>>())
        .map_err(|e| GpuError::Array(e.into()))?;
    trace.mark("sizes");

    let largest = placements.iter().map(decoded_len).max().unwrap_or(0);
    let free = if chain.zstd && largest >= LARGE_CHUNK { Some(context.free_bytes()?) } else { None };
    let budget = batch_budget(config.staging_bytes() as u64, largest, free, out_bytes);
    let batches = batches_by_size(placements.iter().map(decoded_len), budget);
    let threads = context.reader().options().threads;
    let fraction = if chain.zstd { host_fraction(config, threads) } else { 0.0 };

    // Sizes of the per-batch buffers: the largest batch decides.
    let layout = |batch: &[usize]| -> (u64, u64, usize, u64) {
        let stored: u64 = batch.iter().map(|&i| sizes[i].unwrap_or(0).next_multiple_of(STORED_ALIGN)).sum();
        let decoded: u64 = batch.iter().map(|&i| decoded_len(&placements[i]).next_multiple_of(DECODED_ALIGN)).sum();
        let max_chunk = batch.iter().map(|&i| decoded_len(&placements[i])).max().unwrap_or(0);
        (stored, decoded, batch.len(), max_chunk)
    };
    let mut max_stored = 0;
    let mut max_decoded = 0;
    let mut max_temp = 0;
    for batch in &batches {
        let (stored, decoded, n, max_chunk) = layout(batch);
        max_stored = max_stored.max(stored);
        max_decoded = max_decoded.max(decoded);
        if chain.zstd {
            let temp = nvcomp.zstd_decompress_temp_size(n, max_chunk as usize, decoded as usize).map_err(nvcomp_err)?;
            max_temp = max_temp.max(temp as u64);
        }
    }
    // nvCOMP's arrays (at most 68 bytes per chunk, zstd and crc32c together), then the placement
    // kernel's table.
    let max_copies =
        batches.iter().map(|b| b.iter().map(|&i| placements[i].copies.len()).sum::<usize>()).max().unwrap_or(0);
    let meta_bytes = (batches.iter().map(Vec::len).max().unwrap_or(0) as u64 * 96
        + place::table_bytes(max_copies) as u64)
        .next_multiple_of(DECODED_ALIGN);
    let placer = Placer::get(context.cuda());
    let device_slot = max_stored.next_multiple_of(DECODED_ALIGN)
        + if chain.zstd { max_decoded } else { 0 }
        + max_temp.next_multiple_of(DECODED_ALIGN)
        + meta_bytes;
    let slots = if batches.len() > 1 { 2 } else { 1 };
    context.check_free(out_bytes + device_slot * slots)?;
    trace.mark("plan");

    let (out, out_ptr) = context.alloc_output(stream, out_bytes as usize)?;
    let mut device: Vec<(DeviceBuffer, Option<CudaEvent>)> = Vec::new();
    let mut host: Vec<PinnedBuffer> = Vec::new();
    // Per slot, pinned memory for the chunks decoded on host threads (grown on demand).
    let mut host_decoded: Vec<Option<PinnedBuffer>> = Vec::new();
    for _ in 0..slots.min(batches.len() as u64) {
        device.push((context.take_staging(device_slot.max(1) as usize)?, None));
        // Stored chunks, then the metadata staged for async copies.
        host.push(context.take_pinned((max_stored + meta_bytes) as usize)?);
        host_decoded.push(None);
    }
    // What the device reports back, batch after batch: per batch its decoded sizes (u64), zstd
    // statuses, crc32c values and crc32c statuses (u32), at most 20 bytes per chunk.
    let mut results = context.take_pinned(placements.len().max(1) * 20)?;
    let results_base = results.as_mut_slice().as_mut_ptr();
    trace.mark("buffers");

    let mut report = RetrieveReport::new(DecodePath::Device, placements.len());
    let mut fill: Option<DeviceBuffer> = None;
    let mut checks: Vec<Check> = Vec::new();
    let mut results_at = 0usize;
    let result = (|| -> Result<(), GpuError> {
        for (b, batch) in batches.iter().enumerate() {
            let (dbuf, event) = &mut device[b % slots as usize];
            if let Some(event) = event.take() {
                event.synchronize().map_err(GpuError::cuda("waiting for a batch"))?;
                trace.mark("wait slot");
            }
            let hbuf = &mut host[b % slots as usize];
            let host_meta = hbuf.as_mut_slice()[max_stored as usize..].as_mut_ptr() as usize;
            // Metadata goes through pinned memory, so that its copies do not wait for the stream
            // (a pageable copy would, serialising the next batch's reads behind this one's decode).
            let stage = |at: u64, words: &[u64], device: u64| -> Result<(), GpuError> {
                let bytes = words.len() * 8;
                // SAFETY: the slot's metadata region holds meta_bytes; `at + bytes` stays within
                // it (nvCOMP arrays first, the placement table at its end); the region is reused
                // only after this batch's event.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        words.as_ptr().cast::<u8>(),
                        (host_meta + at as usize) as *mut u8,
                        bytes,
                    );
                    sys::cuMemcpyHtoDAsync_v2(
                        device,
                        (host_meta + at as usize) as *const c_void,
                        bytes,
                        stream.cu_stream(),
                    )
                }
                .result()
                .map_err(GpuError::cuda("copying decode metadata"))
            };
            // Layout: stored chunks in host and device staging, decoded chunks after them.
            let (stored_total, _, _, _) = layout(batch);
            let mut items = Vec::with_capacity(batch.len());
            let (mut host_at, mut decoded_at) = (0u64, 0u64);
            for &i in batch {
                let stored_len = sizes[i].unwrap_or(0);
                let route = if sizes[i].is_some() { Route::Device } else { Route::Missing };
                items.push(Item {
                    placement: i,
                    stored_len,
                    data_len: stored_len,
                    host_offset: host_at,
                    decoded_offset: decoded_at,
                    route,
                    crc: None,
                });
                host_at += stored_len.next_multiple_of(STORED_ALIGN);
                decoded_at += decoded_len(&placements[i]).next_multiple_of(DECODED_ALIGN);
            }
            let requests: Vec<DeviceReadRequest> = items
                .iter()
                .filter(|it| it.route != Route::Missing)
                .map(|it| DeviceReadRequest {
                    key: placements[it.placement].key.clone(),
                    offset: 0,
                    len: it.stored_len as usize,
                    dst: it.host_offset,
                })
                .collect();
            let found = match gds {
                Some(store) => store.read_to_host(context.reader(), &requests, hbuf.as_mut_slice())?,
                None => read_store_to_host(storage.as_ref(), context.reader(), &requests, hbuf.as_mut_slice())?,
            };
            report.io = Some(zarrs_gds_store::IoStatus {
                path: if gds.is_some() { zarrs_gds_store::IoPath::Posix } else { zarrs_gds_store::IoPath::Staged },
                reason: "compressed chunks are read to host memory, where their frames are checked".into(),
            });
            let mut found_iter = found.iter();
            for it in items.iter_mut().filter(|it| it.route != Route::Missing) {
                if !found_iter.next().copied().unwrap_or(false) {
                    it.route = Route::Missing; // deleted between the size query and the read
                }
            }
            trace.mark("read");
            // Check every stored chunk on the host: crc32c trailer, zstd frame structure and size.
            let stored = hbuf.as_slice();
            context.reader().install(|| {
                items.par_iter_mut().filter(|it| it.route != Route::Missing).try_for_each(|it| {
                    let p = &placements[it.placement];
                    let bytes = &stored[it.host_offset as usize..][..it.stored_len as usize];
                    let chunk_error = |reason: String| GpuError::Chunk { key: p.key.to_string(), reason };
                    if chain.crc32c {
                        if bytes.len() < 4 {
                            return Err(chunk_error(format!("{} bytes cannot hold a crc32c checksum", bytes.len())));
                        }
                        it.data_len -= 4;
                        it.crc = Some(u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes")));
                    }
                    let data = &bytes[..it.data_len as usize];
                    if chain.zstd {
                        match check_frame(data, decoded_len(p)).map_err(|e| chunk_error(e.to_string()))? {
                            FrameVerdict::Device { .. } => {}
                            FrameVerdict::Host(_) => it.route = Route::Host,
                        }
                    } else if data.len() as u64 != decoded_len(p) {
                        return Err(chunk_error(format!("{} bytes stored, {} expected", data.len(), decoded_len(p))));
                    }
                    Ok(())
                })
            })?;
            // The host's share of large chunks.
            let large: Vec<usize> = (0..items.len())
                .filter(|&k| {
                    items[k].route == Route::Device
                        && chain.zstd
                        && decoded_len(&placements[items[k].placement]) >= LARGE_CHUNK
                })
                .collect();
            let host_share = (large.len() as f64 * fraction).round() as usize;
            for &k in large.iter().rev().take(host_share) {
                items[k].route = Route::Host;
            }
            trace.mark("check");

            // One copy of the batch's stored bytes to the device.
            let cbase = dbuf.ptr();
            let dbase = cbase + max_stored.next_multiple_of(DECODED_ALIGN);
            let temp = dbase + if chain.zstd { max_decoded } else { 0 };
            let meta = temp + max_temp.next_multiple_of(DECODED_ALIGN);
            context.bind()?;
            // SAFETY: hbuf holds stored_total bytes; cbase has room for max_stored >= stored_total.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(cbase, stored.as_ptr().cast(), stored_total as usize, stream.cu_stream())
            }
            .result()
            .map_err(GpuError::cuda("copying chunks to the device"))?;
            for it in &items {
                if it.route != Route::Missing {
                    report.bytes_read += it.stored_len;
                }
            }
            // Metadata arrays for nvCOMP, built on the host, copied once.
            let on_device: Vec<&Item> = items.iter().filter(|it| it.route == Route::Device).collect();
            let with_crc: Vec<&Item> = items.iter().filter(|it| it.crc.is_some()).collect();
            let n_zstd = on_device.len();
            let n_crc = with_crc.len();
            let mut words: Vec<u64> = Vec::with_capacity(4 * n_zstd + 2 * n_crc);
            words.extend(on_device.iter().map(|it| cbase + it.host_offset)); // compressed pointers
            words.extend(on_device.iter().map(|it| it.data_len)); // compressed sizes
            words.extend(on_device.iter().map(|it| decoded_len(&placements[it.placement]))); // buffer sizes
            words.extend(on_device.iter().map(|it| dbase + it.decoded_offset)); // output pointers
            words.extend(with_crc.iter().map(|it| cbase + it.host_offset)); // crc input pointers
            words.extend(with_crc.iter().map(|it| it.data_len)); // crc input sizes
            let meta_in = words.len() as u64 * 8;
            let actual = meta + meta_in; // n_zstd x u64
            let zstatus = actual + 8 * n_zstd as u64; // n_zstd x u32
            let crc_out = zstatus + 4 * n_zstd as u64; // n_crc x u32
            let crc_status = crc_out + 4 * n_crc as u64; // n_crc x u32
            if !words.is_empty() {
                stage(0, &words, meta)?;
            }
            let ptr = |k: usize| meta + 8 * k as u64;
            let nv_stream = stream.cu_stream() as nv::cudaStream_t;
            if n_crc > 0 {
                let max_crc = with_crc.iter().map(|it| it.data_len as usize).max().unwrap_or(0);
                let crc_conf = nvcomp.crc32_kernel_conf(n_crc, max_crc).map_err(nvcomp_err)?;
                // SAFETY: pointer and size arrays of n_crc entries in device memory, outputs as many.
                let status = unsafe {
                    nvcomp.functions().nvcompBatchedCRC32Async(
                        ptr(4 * n_zstd) as *const *const c_void,
                        ptr(4 * n_zstd + n_crc) as *const usize,
                        n_crc,
                        crc_out as *mut u32,
                        nvcomp_sys::crc32c_opts(crc_conf),
                        nv::nvcompCRC32OnlySegment,
                        crc_status as *mut nv::nvcompStatus_t,
                        nv_stream,
                    )
                };
                nvcomp.check("computing crc32c checksums", status).map_err(nvcomp_err)?;
            }
            if chain.zstd && n_zstd > 0 {
                let (_, decoded_total, _, max_chunk) = layout(batch);
                let temp_bytes = nvcomp
                    .zstd_decompress_temp_size(n_zstd, max_chunk as usize, decoded_total as usize)
                    .map_err(nvcomp_err)?;
                // SAFETY: every frame was checked on the host (one frame, recorded size equal to
                // the output buffer); arrays of n_zstd entries in device memory; temp sized by nvCOMP.
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
                        nv_stream,
                    )
                };
                nvcomp.check("launching zstd decompression", status).map_err(nvcomp_err)?;
            }
            // Meanwhile the host decodes its chunks, into the slot's pinned decode buffer.
            let host_items: Vec<&Item> = items.iter().filter(|it| it.route == Route::Host).collect();
            report.host_decoded_chunks += host_items.len();
            if !host_items.is_empty() {
                let mut at = Vec::with_capacity(host_items.len());
                let mut need = 0usize;
                for it in &host_items {
                    at.push(need);
                    need += decoded_len(&placements[it.placement]).next_multiple_of(DECODED_ALIGN) as usize;
                }
                let hdec = &mut host_decoded[b % slots as usize];
                if hdec.as_ref().is_none_or(|buffer| buffer.len() < need) {
                    if let Some(old) = hdec.take() {
                        context.give_pinned(old);
                    }
                    *hdec = Some(context.take_pinned(need)?);
                }
                let base = hdec.as_mut().expect("just made").as_mut_slice().as_mut_ptr() as usize;
                let stored_part = &hbuf.as_slice()[..max_stored as usize];
                context.reader().install(|| {
                    host_items.par_iter().zip(&at).try_for_each(|(it, &offset)| {
                        let p = &placements[it.placement];
                        let len = decoded_len(p) as usize;
                        // SAFETY: the regions at `at` are disjoint and lie within the buffer
                        // (sized to their sum).
                        let out = unsafe { std::slice::from_raw_parts_mut((base + offset) as *mut u8, len) };
                        let data = &stored_part[it.host_offset as usize..][..it.data_len as usize];
                        let written = zstd::bulk::decompress_to_buffer(data, out)
                            .map_err(|e| GpuError::Chunk { key: p.key.to_string(), reason: format!("zstd: {e}") })?;
                        if written == len {
                            Ok(())
                        } else {
                            Err(GpuError::Chunk {
                                key: p.key.to_string(),
                                reason: format!("zstd decoded {written} bytes, {len} expected"),
                            })
                        }
                    })
                })?;
                for (it, &offset) in host_items.iter().zip(&at) {
                    let len = decoded_len(&placements[it.placement]) as usize;
                    // SAFETY: pinned source within the buffer (reused only after this batch's
                    // event); destination within the slot.
                    unsafe {
                        sys::cuMemcpyHtoDAsync_v2(
                            dbase + it.decoded_offset,
                            (base + offset) as *const c_void,
                            len,
                            stream.cu_stream(),
                        )
                    }
                    .result()
                    .map_err(GpuError::cuda("copying host-decoded chunks"))?;
                }
            }
            trace.mark("decode");
            // Results back to the host in one copy (sizes, zstd statuses, crc values, crc
            // statuses lie together on the device), checked after the last batch.
            let result_bytes = 12 * n_zstd + 8 * n_crc;
            if result_bytes > 0 {
                // SAFETY: results holds 20 bytes per placement, what a chunk with both zstd and
                // crc32c takes (12 + 8); the source is the contiguous tail of this batch's metadata.
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
            if chain.zstd {
                for (k, it) in on_device.iter().enumerate() {
                    checks.push(Check::Zstd {
                        placement: it.placement,
                        size: at(actual, k, 8),
                        status: at(zstatus, k, 4),
                    });
                }
            }
            for (k, it) in with_crc.iter().enumerate() {
                checks.push(Check::Crc32c {
                    placement: it.placement,
                    expected: it.crc.expect("with crc"),
                    value: at(crc_out, k, 4),
                    status: at(crc_status, k, 4),
                });
            }
            results_at += result_bytes;
            // Placement: every copy of the batch in one kernel launch (or by the copy engines).
            let mut copies = Vec::new();
            let mut srcs = Vec::new();
            for it in &items {
                let p = &placements[it.placement];
                let src = match it.route {
                    Route::Missing => {
                        report.missing_chunks += 1;
                        // The fill block is uniform and as long as the longest read.
                        fill_source(&mut fill, context, array, &placements, stream)?
                    }
                    _ if chain.zstd => dbase + it.decoded_offset + p.byte_start,
                    _ => cbase + it.host_offset + p.byte_start,
                };
                copies.extend_from_slice(&p.copies);
                srcs.extend(std::iter::repeat_n(src, p.copies.len()));
            }
            if let Some(placer) = placer {
                let table = place::encode(&copies, &srcs);
                let at = meta_bytes - place::table_bytes(max_copies) as u64;
                stage(at, &table, meta + at)?;
                // SAFETY: copies stay within their decoded chunks (or the fill block) and `out`.
                unsafe { placer.launch(stream, meta + at, &copies, out_ptr) }?;
            } else {
                for (copy, &src) in copies.iter().zip(&srcs) {
                    // SAFETY: as above.
                    unsafe { copy_dtod(copy, src, out_ptr, stream) }?;
                }
            }
            *event = Some(stream.record_event(None).map_err(GpuError::cuda("recording an event"))?);
            trace.mark("place");
        }
        stream.synchronize().map_err(GpuError::cuda("decoding on the device"))?;
        trace.mark("final sync");
        // Every chunk's device result: zstd status and size, crc32c status and value.
        let results = results.as_slice();
        let word = |at: usize| u32::from_ne_bytes(results[at..at + 4].try_into().expect("4 bytes"));
        for check in &checks {
            match *check {
                Check::Zstd { placement, size, status } => {
                    let key = placements[placement].key.to_string();
                    if word(status) != nv::nvcompSuccess {
                        return Err(GpuError::Chunk {
                            key,
                            reason: format!("nvCOMP zstd: {}", nvcomp.status_string(word(status))),
                        });
                    }
                    let size = u64::from_ne_bytes(results[size..size + 8].try_into().expect("8 bytes"));
                    let expected = decoded_len(&placements[placement]);
                    if size != expected {
                        return Err(GpuError::Chunk {
                            key,
                            reason: format!("zstd decoded {size} bytes, {expected} expected"),
                        });
                    }
                }
                Check::Crc32c { placement, expected, value, status } => {
                    let key = placements[placement].key.to_string();
                    if word(status) != nv::nvcompSuccess {
                        return Err(GpuError::Chunk {
                            key,
                            reason: format!("nvCOMP crc32c: {}", nvcomp.status_string(word(status))),
                        });
                    }
                    let crc = word(value);
                    if crc != expected {
                        return Err(GpuError::Chunk {
                            key,
                            reason: format!("crc32c checksum mismatch: stored {expected:#010x}, computed {crc:#010x}"),
                        });
                    }
                }
            }
        }
        Ok(())
    })();
    let synced = stream.synchronize();
    if synced.is_ok() {
        for (buffer, _) in device {
            context.give_staging(buffer);
        }
        for buffer in host.into_iter().chain(host_decoded.into_iter().flatten()) {
            context.give_pinned(buffer);
        }
        context.give_pinned(results);
        if let Some(buffer) = fill {
            context.give_staging(buffer);
        }
    }
    result?;
    trace.finish(&format!(
        "{out_bytes} bytes decoded on the device, {} chunks, {} batches",
        report.chunks,
        batches.len()
    ));
    Ok((out, report))
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
    fn large_frames_get_large_batches_within_free_memory() {
        let gib = 1u64 << 30;
        let staging = gib;
        // Small chunks, or no memory query: the staging budget.
        assert_eq!(batch_budget(staging, 1 << 20, Some(100 * gib), 8 * gib), staging);
        assert_eq!(batch_budget(staging, 16 << 20, None, 8 * gib), staging);
        // 16 MiB frames with plenty of room: 1024 of them.
        assert_eq!(batch_budget(staging, 16 << 20, Some(300 * gib), 8 * gib), 16 * gib);
        // Little room: a twelfth of what the output leaves, never less than the staging budget.
        assert_eq!(batch_budget(staging, 16 << 20, Some(32 * gib), 8 * gib), 2 * gib);
        assert_eq!(batch_budget(staging, 16 << 20, Some(9 * gib), 8 * gib), staging);
    }

    #[test]
    fn host_share_of_large_frames() {
        let config = GpuConfig::default();
        let auto = host_fraction(&config, 16);
        if std::env::var_os(HOST_FRACTION_ENV).is_none() {
            assert!((auto - 0.354).abs() < 0.01, "{auto}");
            assert!(host_fraction(&config, 4) < auto, "fewer threads, smaller share");
        }
        assert!((host_fraction(&config.clone().with_host_decode_fraction(Some(0.2)), 16) - 0.2).abs() < 1e-12);
        assert!((host_fraction(&config.clone().with_host_decode_fraction(Some(3.0)), 16) - 1.0).abs() < 1e-12);
        assert!(host_fraction(&config.with_host_decode_fraction(Some(-1.0)), 16).abs() < 1e-12);
    }
}
