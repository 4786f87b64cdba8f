//! Writes from device memory: a [`DeviceArray`] stored into a subset of a Zarr array, its chunks
//! assembled and encoded on the device (nvCOMP's batched zstd), then written by the store (a
//! [`GdsStore`](zarrs_gds_store::GdsStore) replaces each chunk file atomically). Chunks the
//! subset covers in part are read (on the device), modified there and encoded again; chunks that
//! come out all fill value are erased, as zarrs does. Chains the device does not encode yet go
//! through zarrs on the host, the report says why.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use rayon::prelude::*;
use zarrs::array::{Array, ArraySubset, ElementOwned};
use zarrs_gds_store::GdsStore;
use zarrs_storage::{Bytes, ReadableWritableStorageTraits, StoreKey};

use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device_array::{check_element, DeviceArray};
use crate::error::GpuError;
use crate::pipeline::place::{copy_dtod, fill_pattern};
use crate::pipeline::plan::{plan_chunks, ChunkPlacement, Copy3D};
use crate::pipeline::route::{chunk_subset, chunks_meeting, write_chain, WriteChain};
use crate::report::{WritePath, WriteReport};
use crate::retrieve::{check_subset, contained, ArrayDeviceExt};

/// Raw chunk bytes assembled and encoded on the device at once, at most (about): the working set
/// is twice this (raw and compressed), freed after the batch.
const WRITE_BATCH_BYTES: u64 = 1 << 30;

/// Storing device arrays into a Zarr array, beside zarrs' `store_array_subset`.
pub trait ArrayDeviceWriteExt {
    /// Store `data` (of `subset`'s shape) into `subset` of the array, as
    /// [`Self::store_array_subset_device_opt`] with the configuration reads use
    /// ([`GpuConfig::current`]: GPU mode's, else the environment's).
    ///
    /// # Errors
    /// As [`Self::store_array_subset_device_opt`].
    fn store_array_subset_device<T: ElementOwned>(
        &self,
        subset: &ArraySubset,
        data: &DeviceArray<T>,
    ) -> Result<WriteReport, GpuError> {
        self.store_array_subset_device_opt(subset, data, &GpuConfig::current()?)
    }

    /// Store `data` (of `subset`'s shape, on `config`'s device) into `subset` of the array: its
    /// chunks are assembled and encoded on the device where the chain allows (the `bytes` codec in
    /// the platform's order, then zstd without a content checksum and crc32c), else by zarrs on
    /// the host. Chunks the subset covers in part are read, modified and encoded again; chunks
    /// that are all fill value are erased.
    ///
    /// # Errors
    /// Returns an error before anything is written when the element type, shape or device of
    /// `data` does not fit, or the subset lies outside the array; and an error naming the chunk
    /// when encoding or storing one fails (chunks written before it keep their new values).
    fn store_array_subset_device_opt<T: ElementOwned>(
        &self,
        subset: &ArraySubset,
        data: &DeviceArray<T>,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError>;

    /// Store `data` (the chunk's full shape) as the chunk at `chunk_indices`, as
    /// [`Self::store_chunk_device_opt`] with the configuration reads use.
    ///
    /// # Errors
    /// As [`Self::store_chunk_device_opt`].
    fn store_chunk_device<T: ElementOwned>(
        &self,
        chunk_indices: &[u64],
        data: &DeviceArray<T>,
    ) -> Result<WriteReport, GpuError> {
        self.store_chunk_device_opt(chunk_indices, data, &GpuConfig::current()?)
    }

    /// Store `data` (the chunk's full shape, on `config`'s device) as the chunk at
    /// `chunk_indices`: its part within the array, as [`Self::store_array_subset_device_opt`]
    /// stores a subset.
    ///
    /// # Errors
    /// As [`Self::store_array_subset_device_opt`], and for chunk indices outside the grid.
    fn store_chunk_device_opt<T: ElementOwned>(
        &self,
        chunk_indices: &[u64],
        data: &DeviceArray<T>,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError>;
}

impl<S: ReadableWritableStorageTraits + 'static> ArrayDeviceWriteExt for Array<S> {
    fn store_array_subset_device_opt<T: ElementOwned>(
        &self,
        subset: &ArraySubset,
        data: &DeviceArray<T>,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError> {
        check_element::<T>(self.data_type())?;
        check_subset(self, subset, false)?;
        if data.shape() != subset.shape() {
            return Err(GpuError::Unsupported(format!(
                "the data has shape {:?}, the subset {:?}",
                data.shape(),
                subset.shape()
            )));
        }
        let ordinal = data.stream().context().ordinal();
        if ordinal != config.device() {
            return Err(GpuError::Unsupported(format!(
                "the data is on device {ordinal}, the write on device {}",
                config.device()
            )));
        }
        let start = Instant::now();
        let chain = write_chain(self).and_then(|chain| {
            if chain.zstd {
                nvcomp_sys::NvcompLibrary::get().map_err(|e| e.to_string())?;
            }
            Ok(chain)
        });
        // As a read is: the caller's context restored after, a lost context refused before.
        let mut report = contained(config, || match chain {
            Ok(chain) => write_on_device(self, subset, data, chain, config),
            Err(reason) => write_on_host(self, subset, data, reason),
        })?;
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    fn store_chunk_device_opt<T: ElementOwned>(
        &self,
        chunk_indices: &[u64],
        data: &DeviceArray<T>,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError> {
        let grid = self.chunk_grid_shape();
        if chunk_indices.len() != grid.len() || chunk_indices.iter().zip(grid).any(|(i, n)| i >= n) {
            return Err(zarrs::array::ArrayError::InvalidChunkGridIndicesError(chunk_indices.to_vec()).into());
        }
        // The chunk's part within the array: what zarrs stores of it (the rest is fill value).
        let chunk = chunk_subset(self, chunk_indices)?;
        if data.shape() != chunk.shape() {
            return Err(GpuError::Unsupported(format!(
                "the data has shape {:?}, chunk {chunk_indices:?} {:?}",
                data.shape(),
                chunk.shape()
            )));
        }
        let bounded: Vec<std::ops::Range<u64>> =
            chunk.start().iter().zip(chunk.shape()).zip(self.shape()).map(|((&a, &n), &e)| a..(a + n).min(e)).collect();
        let bounded = ArraySubset::new_with_ranges(&bounded);
        if bounded.shape() == chunk.shape() {
            return self.store_array_subset_device_opt(&bounded, data, config);
        }
        // An edge chunk: its part within the array, taken from the full-shape data (the copy binds
        // the device's context on this thread: the caller's comes back after).
        let _current = crate::device::current_context::CurrentContextGuard::new();
        let within = ArraySubset::new_with_start_shape(vec![0; chunk.dimensionality()], bounded.shape().to_vec())
            .map_err(|e| GpuError::Array(e.into()))?;
        let part = copy_region(data, &within)?;
        self.store_array_subset_device_opt(&bounded, &part, config)
    }
}

/// `region` of `data`, as a new device array on its stream.
fn copy_region<T: ElementOwned>(data: &DeviceArray<T>, region: &ArraySubset) -> Result<DeviceArray<T>, GpuError> {
    let elem = std::mem::size_of::<T>() as u64;
    let whole = ArraySubset::new_with_shape(data.shape().to_vec());
    let chunk = (vec![0; data.shape().len()], StoreKey::new("data").expect("a valid key"), whole);
    let placement =
        plan_chunks(elem, region, [chunk])?.pop().ok_or_else(|| GpuError::Unsupported("an empty region".into()))?;
    let stream = data.stream();
    let len = region.num_elements() as usize;
    // SAFETY: every byte is written by the copies below before the array is handed out.
    let out: CudaSlice<u8> =
        unsafe { stream.alloc(len * elem as usize) }.map_err(GpuError::cuda("allocating a region"))?;
    let (dst, guard) = out.device_ptr(stream);
    let source_guard = data.as_cuda_slice().map(|slice| slice.device_ptr(stream));
    for copy in &placement.copies {
        let copy = Copy3D { src_offset: copy.src_offset + placement.byte_start, ..*copy };
        // SAFETY: the copies lie within `data` (its whole shape) and `out` (the region's shape).
        unsafe { copy_dtod(&copy, data.device_ptr(), dst, stream) }?;
    }
    drop((guard, source_guard));
    // SAFETY: every byte of `out` was written by the copies above, ordered on its stream.
    unsafe { DeviceArray::from_device_bytes(out, region.shape().to_vec(), data.data_type().clone()) }
}

/// zarrs' own write, from a host copy of `data`.
fn write_on_host<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    subset: &ArraySubset,
    data: &DeviceArray<T>,
    reason: String,
) -> Result<WriteReport, GpuError> {
    let elements = data.to_host()?;
    let chunks = array.chunks_in_array_subset(subset).map_err(|e| GpuError::Array(e.into()))?;
    array.store_array_subset(subset, elements)?;
    let mut report = WriteReport::new(WritePath::Host, chunks.map_or(0, |c| c.num_elements() as usize));
    report.reason = Some(reason);
    Ok(report)
}

/// A chunk of a write: where it lies, and whether the subset covers all of its part within the
/// array (else its old value is read first).
struct WriteUnit {
    placement: ChunkPlacement,
    whole: bool,
}

fn write_on_device<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    subset: &ArraySubset,
    data: &DeviceArray<T>,
    chain: WriteChain,
    config: &GpuConfig,
) -> Result<WriteReport, GpuError> {
    let elem = std::mem::size_of::<T>() as u64;
    let chunks = chunks_meeting(array, subset)?;
    let mut units = Vec::with_capacity(chunks.len());
    for (indices, key, chunk) in chunks {
        // The chunk's part within the array: covered by the subset, nothing of it is read.
        let within: Vec<std::ops::Range<u64>> = chunk
            .start()
            .iter()
            .zip(chunk.shape())
            .zip(array.shape())
            .map(|((&a, &n), &e)| a..(a + n).min(e))
            .collect();
        let whole = within
            .iter()
            .zip(subset.start().iter().zip(subset.shape()))
            .all(|(r, (&s, &n))| s <= r.start && r.end <= s + n);
        let placement = plan_chunks(elem, subset, [(indices, key, chunk)])?.pop().expect("the chunk meets the subset");
        units.push(WriteUnit { placement, whole });
    }
    // nvCOMP's zstd takes chunks up to a size (16 MiB in nvCOMP 6): larger ones go to zarrs.
    let largest = units.iter().map(|u| u.placement.chunk_bytes).max().unwrap_or(0);
    if chain.zstd {
        let nvcomp = nvcomp_sys::NvcompLibrary::get().map_err(|e| GpuError::NoNvcomp(e.to_string()))?;
        if let Err(err) = nvcomp.compress_max_output_chunk_size(nvcomp_sys::Compressor::Zstd, largest as usize) {
            return write_on_host(array, subset, data, format!("chunks of {largest} bytes: {err}"));
        }
    }
    // The driver calls below (fills, copies) run in the device's context.
    GpuContext::get(config.device())?.bind()?;
    let mut report = WriteReport::new(WritePath::Device, units.len());
    let mut batches: Vec<Vec<WriteUnit>> = Vec::new();
    let mut batch_bytes = 0u64;
    for unit in units {
        if batches.is_empty() || batch_bytes >= WRITE_BATCH_BYTES {
            batches.push(Vec::new());
            batch_bytes = 0;
        }
        batch_bytes = batch_bytes.saturating_add(unit.placement.chunk_bytes);
        batches.last_mut().expect("pushed").push(unit);
    }
    // Batch k's files are stored on another thread while batch k + 1 is assembled and encoded.
    std::thread::scope(|scope| -> Result<(), GpuError> {
        let mut storing = None;
        for batch in &batches {
            let encoded = encode_batch(array, data, batch, chain, config, &mut report);
            let stored = storing.take().map(|h: std::thread::ScopedJoinHandle<'_, _>| h.join());
            if let Some(stored) = stored {
                report.add(stored.map_err(|_| GpuError::Unsupported("storing a batch of chunks panicked".into()))??);
            }
            let encoded = encoded?;
            storing = Some(scope.spawn(move || store_batch(array, batch, encoded, chain)));
        }
        if let Some(h) = storing {
            report.add(h.join().map_err(|_| GpuError::Unsupported("storing a batch of chunks panicked".into()))??);
        }
        Ok(())
    })?;
    Ok(report)
}

/// Assemble and encode one batch of chunks on the device: each chunk's encoded bytes, on the host.
fn encode_batch<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    data: &DeviceArray<T>,
    units: &[WriteUnit],
    chain: WriteChain,
    config: &GpuConfig,
    report: &mut WriteReport,
) -> Result<Vec<Vec<u8>>, GpuError> {
    let stream = data.stream().clone();
    let cuda = |what| GpuError::cuda(what);
    // Each chunk's raw bytes at an offset aligned for nvCOMP (checked: chunk shapes come from
    // metadata).
    let mut offsets = Vec::with_capacity(units.len());
    let mut total = 0u64;
    for unit in units {
        offsets.push(total);
        total = unit
            .placement
            .chunk_bytes
            .checked_next_multiple_of(256)
            .and_then(|len| total.checked_add(len))
            .ok_or_else(|| GpuError::bytes_overflow("a batch of chunks of shape", &unit.placement.chunk_shape, 1))?;
    }
    // SAFETY: each chunk's place is written whole (fill or old value, then the data) before it is
    // encoded or copied out; the alignment padding between chunks is never read.
    let raw: CudaSlice<u8> =
        unsafe { stream.alloc(total.max(1) as usize) }.map_err(cuda("allocating chunks to encode"))?;
    // Old chunks are read on their own streams and copied out on this one: whatever happens, they
    // are freed only after this stream has run those copies.
    let mut olds = Vec::new();
    let encoded = assemble_and_encode(array, data, units, chain, config, report, (&raw, &offsets), &mut olds);
    if !olds.is_empty() {
        let synced = stream.synchronize().map_err(cuda("copying chunks to modify"));
        if synced.is_err() {
            // The copies may still run: their sources must never be reused.
            olds.iter().for_each(DeviceArray::abandon);
        }
        synced?;
    }
    drop(olds);
    let encoded = encoded?;
    report.bytes_encoded += units.iter().map(|u| u.placement.chunk_bytes).sum::<u64>();
    Ok(encoded)
}

/// [`encode_batch`]'s work on `raw` (the batch's chunks at `offsets`): each chunk assembled, then
/// encoded; the old values of chunks covered in part go to `olds`.
#[allow(clippy::too_many_arguments)]
fn assemble_and_encode<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    data: &DeviceArray<T>,
    units: &[WriteUnit],
    chain: WriteChain,
    config: &GpuConfig,
    report: &mut WriteReport,
    (raw, offsets): (&CudaSlice<u8>, &[u64]),
    olds: &mut Vec<DeviceArray<T>>,
) -> Result<Vec<Vec<u8>>, GpuError> {
    let stream = data.stream().clone();
    let cuda = |what| GpuError::cuda(what);
    let (raw_ptr, raw_guard) = raw.device_ptr(&stream);
    // The stream waits for the data's last writer where cudarc tracks it (a slice written on
    // another stream).
    let source_guard = data.as_cuda_slice().map(|slice| slice.device_ptr(&stream));
    let fill = array.fill_value().as_ne_bytes();
    // Chunks covered in part: their old values first (decoded on the device).
    for (unit, &at) in units.iter().zip(offsets) {
        let p = &unit.placement;
        if unit.whole {
            // Elements past the array's edge (an edge chunk's) hold the fill value.
            // SAFETY: the chunk's place in `raw`, ordered on the stream.
            unsafe { fill_pattern(fill, raw_ptr + at, p.chunk_bytes as usize, &stream) }?;
        } else {
            let (old, _) = array.retrieve_chunk_device_opt::<T>(&p.chunk_indices, config)?;
            // The read's own stream: the copy waits for it.
            old.stream().synchronize().map_err(cuda("reading a chunk to modify"))?;
            let copy = Copy3D {
                src_offset: 0,
                dst_offset: 0,
                width: p.chunk_bytes,
                height: 1,
                depth: 1,
                src_pitch: p.chunk_bytes,
                src_height: 1,
                dst_pitch: p.chunk_bytes,
                dst_height: 1,
            };
            // SAFETY: the old chunk has the chunk's full shape (chunk_bytes), as its place in `raw`.
            unsafe { copy_dtod(&copy, old.device_ptr(), raw_ptr + at, &stream) }?;
            olds.push(old);
            report.modified += 1;
        }
        // The subset's part of the chunk, from `data` (the copies that a read makes, reversed).
        for c in &p.copies {
            let back = Copy3D {
                src_offset: c.dst_offset,
                dst_offset: p.byte_start + c.src_offset,
                src_pitch: c.dst_pitch,
                src_height: c.dst_height,
                dst_pitch: c.src_pitch,
                dst_height: c.src_height,
                ..*c
            };
            // SAFETY: the copies of a read of this chunk into `data`'s subset, reversed: within
            // `data` and the chunk's place in `raw`.
            unsafe { copy_dtod(&back, data.device_ptr(), raw_ptr + at, &stream) }?;
        }
    }
    drop((raw_guard, source_guard));
    let lens: Vec<u64> = units.iter().map(|u| u.placement.chunk_bytes).collect();
    let encoded = if chain.zstd {
        let keys: Vec<&StoreKey> = units.iter().map(|u| &u.placement.key).collect();
        compress_zstd(&stream, raw, offsets, &lens, &keys)?
    } else {
        // Each chunk straight into its own host buffer.
        let mut chunks = Vec::with_capacity(units.len());
        for (&at, &len) in offsets.iter().zip(&lens) {
            let mut chunk = vec![0u8; len as usize];
            let view = raw.slice(at as usize..(at + len) as usize);
            stream.memcpy_dtoh(&view, &mut chunk).map_err(cuda("copying chunks to the host"))?;
            chunks.push(chunk);
        }
        stream.synchronize().map_err(cuda("copying chunks to the host"))?;
        chunks
    };
    Ok(encoded)
}

/// What storing a batch did: chunks written, erased, and the bytes stored.
type Stored = (usize, usize, u64);

impl WriteReport {
    fn add(&mut self, (written, erased, bytes): Stored) {
        self.written += written;
        self.erased += erased;
        self.bytes_stored += bytes;
    }
}

/// Store one batch's encoded chunks (`encoded`, in the units' order): those all fill value are
/// erased (zarrs' behaviour), the others stored with their crc32c where the chain has one.
fn store_batch<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    units: &[WriteUnit],
    mut encoded: Vec<Vec<u8>>,
    chain: WriteChain,
) -> Result<Stored, GpuError> {
    let fill = array.fill_value().as_ne_bytes();
    // A zstd chunk can be all fill value only when it compressed to a small fraction of its size
    // (or is small, when its frame's overhead weighs): only those are decoded again to check.
    let is_fill = |bytes: &[u8], len: u64| -> bool {
        let all_fill = |raw: &[u8]| raw.len() as u64 == len && raw.chunks_exact(fill.len().max(1)).all(|e| e == fill);
        if !chain.zstd {
            return all_fill(bytes);
        }
        (bytes.len() as u64 * 32 <= len || len <= 1 << 16)
            && zstd::bulk::decompress(bytes, len as usize).is_ok_and(|raw| all_fill(&raw))
    };
    // Each chunk's stored value (its crc32c appended), or None where it is all fill value.
    let values: Vec<Option<Bytes>> = encoded
        .par_iter_mut()
        .zip(units)
        .map(|(bytes, unit)| {
            if is_fill(bytes, unit.placement.chunk_bytes) {
                return None;
            }
            if chain.crc32c {
                let crc = crc32c::crc32c(bytes);
                bytes.extend_from_slice(&crc.to_le_bytes());
            }
            Some(Bytes::from(std::mem::take(bytes)))
        })
        .collect();
    let storage = array.storage();
    let named = |key: &StoreKey| {
        let key = key.to_string();
        move |e: zarrs_storage::StorageError| GpuError::chunk(key, format!("storing it: {e}"))
    };
    let (sets, erases): (Vec<_>, Vec<_>) =
        units.iter().map(|u| &u.placement.key).zip(values).partition(|(_, value)| value.is_some());
    erases.par_iter().try_for_each(|(key, _)| storage.erase(key).map_err(named(key)))?;
    let sets: Vec<(StoreKey, Bytes)> =
        sets.into_iter().filter_map(|(key, value)| value.map(|v| ((*key).clone(), v))).collect();
    // A GdsStore writes them as one: every file flushed in parallel, each directory once.
    match (storage.as_ref() as &dyn std::any::Any).downcast_ref::<GdsStore>() {
        Some(store) => store.set_many(&sets).map_err(|e| GpuError::Array(e.into()))?,
        None => sets.par_iter().try_for_each(|(key, value)| storage.set(key, value.clone()).map_err(named(key)))?,
    }
    let bytes = sets.iter().map(|(_, v)| v.len() as u64).sum();
    Ok((sets.len(), erases.len(), bytes))
}

/// nvCOMP's batched zstd of the chunks at `offsets` (lengths `lens`) of `raw`: each chunk's frame
/// (`keys`: the chunks', for errors).
fn compress_zstd(
    stream: &std::sync::Arc<CudaStream>,
    raw: &CudaSlice<u8>,
    offsets: &[u64],
    lens: &[u64],
    keys: &[&StoreKey],
) -> Result<Vec<Vec<u8>>, GpuError> {
    use nvcomp_sys::{sys, Compressor};
    let nvcomp = nvcomp_sys::NvcompLibrary::get().map_err(|e| GpuError::NoNvcomp(e.to_string()))?;
    let cuda = |what| GpuError::cuda(what);
    let n = lens.len();
    let max_len = lens.iter().copied().max().unwrap_or(0) as usize;
    let total = lens.iter().sum::<u64>() as usize;
    let bound = nvcomp.compress_max_output_chunk_size(Compressor::Zstd, max_len).map_err(GpuError::Nvcomp)?;
    let slot = bound.next_multiple_of(256);
    let temp_bytes = nvcomp.compress_temp_size(Compressor::Zstd, n, max_len, total).map_err(GpuError::Nvcomp)?;
    // SAFETY: nvCOMP writes the frames and uses the scratch; only the bytes of each frame it
    // reports are copied out.
    let mut out: CudaSlice<u8> = unsafe { stream.alloc(n * slot) }.map_err(cuda("allocating compressed chunks"))?;
    // SAFETY: as above.
    let mut temp: CudaSlice<u8> =
        unsafe { stream.alloc(temp_bytes.max(1)) }.map_err(cuda("allocating nvCOMP's scratch"))?;
    let mut sizes: CudaSlice<u64> = stream.alloc_zeros(n).map_err(cuda("allocating sizes"))?;
    let mut statuses: CudaSlice<u32> = stream.alloc_zeros(n).map_err(cuda("allocating statuses"))?;
    {
        let (raw_ptr, _a) = raw.device_ptr(stream);
        let (out_ptr, _b) = out.device_ptr_mut(stream);
        let (temp_ptr, _c) = temp.device_ptr_mut(stream);
        let inputs: Vec<u64> = offsets.iter().map(|&at| raw_ptr + at).collect();
        let outputs: Vec<u64> = (0..n).map(|k| out_ptr + (k * slot) as u64).collect();
        let d_inputs = stream.clone_htod(&inputs).map_err(cuda("staging compression arrays"))?;
        let d_lens = stream.clone_htod(lens).map_err(cuda("staging compression arrays"))?;
        let d_outputs = stream.clone_htod(&outputs).map_err(cuda("staging compression arrays"))?;
        let (p_inputs, _d) = d_inputs.device_ptr(stream);
        let (p_lens, _e) = d_lens.device_ptr(stream);
        let (p_outputs, _f) = d_outputs.device_ptr(stream);
        let (p_sizes, _g) = sizes.device_ptr_mut(stream);
        let (p_statuses, _h) = statuses.device_ptr_mut(stream);
        // SAFETY: n device pointers to chunks within `raw` (256-byte aligned, each at most
        // max_len bytes) and their lengths; n output slots of nvCOMP's bound; its temp size; n
        // sizes and statuses; all alive until the stream has run the work (awaited below).
        unsafe {
            nvcomp.compress_async(
                Compressor::Zstd,
                p_inputs as *const *const c_void,
                p_lens as *const usize,
                max_len,
                n,
                temp_ptr as *mut c_void,
                temp_bytes,
                p_outputs as *const *mut c_void,
                p_sizes as *mut usize,
                p_statuses as *mut sys::nvcompStatus_t,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(GpuError::Nvcomp)?;
        stream.synchronize().map_err(cuda("compressing chunks"))?;
    }
    let statuses = stream.clone_dtoh(&statuses).map_err(cuda("reading compression statuses"))?;
    let sizes = stream.clone_dtoh(&sizes).map_err(cuda("reading compressed sizes"))?;
    if let Some(k) = statuses.iter().position(|&s| s != sys::nvcompSuccess) {
        let reason = format!("nvCOMP zstd compression: {}", nvcomp.status_string(statuses[k]));
        return Err(GpuError::chunk(keys[k].to_string(), reason));
    }
    let mut frames = Vec::with_capacity(n);
    for (k, &size) in sizes.iter().enumerate() {
        let size = size as usize;
        if size == 0 || size > bound {
            return Err(GpuError::chunk(
                keys[k].to_string(),
                format!("nvCOMP zstd wrote {size} bytes (bound {bound})"),
            ));
        }
        let mut frame = vec![0u8; size];
        let view = out.slice(k * slot..k * slot + size);
        stream.memcpy_dtoh(&view, &mut frame).map_err(cuda("copying compressed chunks to the host"))?;
        frames.push(frame);
    }
    stream.synchronize().map_err(cuda("copying compressed chunks to the host"))?;
    Ok(frames)
}
