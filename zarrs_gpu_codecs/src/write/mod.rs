//! Writes from device memory: a [`DeviceBytes`] (or a typed `DeviceArray`, which derefs to one) stored into a subset of a Zarr array, its chunks
//! (or shards) planned (`plan`: where the data goes, the old values read first), assembled and
//! encoded on the device (`codec`: which chains; `encode`: the stored layout, nvCOMP's batched
//! compression, the frames; a shard's inner chunks gathered and encoded in the same batch), copied
//! to pinned host memory, then stored from there (`store`: a
//! [`GdsStore`](zarrs_gds_store::GdsStore) replaces each file atomically) while the next batch
//! encodes. Chunks the subset covers in part are read (on the device), modified there and encoded
//! again; chunks (and inner chunks) that come out all fill value are erased or left out, as zarrs
//! does. Chains the device does not encode yet go through zarrs on the host, the report says why.

mod codec;
mod encode;
mod host;
mod plan;
mod store;

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use zarrs::array::{Array, ArraySubset};
use zarrs_gds_store::{KeyLockGuard, KeyLocks, LockId};
use zarrs_storage::{ReadableWritableStorageTraits, StoreKey};

use crate::codecs::encode::WriteCodec;
use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device_array::{check_same_type, element_size, DeviceBytes};
use crate::error::GpuError;
use crate::pipeline::place::{copy_dtod, fill_pattern};
use crate::pipeline::plan::{plan_chunks, Copy3D};
use crate::pipeline::route::{chunk_subset, chunks_meeting};
use crate::pipeline::shard::ShardLevel;
use crate::report::{WritePath, WriteReport};
use crate::retrieve::{check_subset, contained, ArrayDeviceExt};
use codec::{write_chain, WriteChain};
use encode::{encode_slots, EncodedBatch, Slots};
pub use host::store_array_subset_host;
use plan::{plan_units, reversed, WriteUnit, SLOT_ALIGN};
use store::{gds_of, read_olds, store_batch, Olds};

/// Raw chunk bytes assembled and encoded on the device at once, at most (about): the working set
/// on the device is two to five times this (raw, a shard's inner slots, a laid-out or shuffled
/// copy, compressed; all from the output pool, back in it after the batch) and up to this in
/// pinned host memory for each of the two batches in flight (kept in the pinned pool).
const WRITE_BATCH_BYTES: u64 = 256 << 20;

/// Storing device arrays into a Zarr array, beside zarrs' `store_array_subset`.
pub trait ArrayDeviceWriteExt {
    /// Store `data` (of `subset`'s shape) into `subset` of the array, as
    /// [`Self::store_array_subset_device_opt`] with the configuration reads use
    /// ([`GpuConfig::current`]: GPU mode's, else the environment's).
    ///
    /// # Errors
    /// As [`Self::store_array_subset_device_opt`].
    fn store_array_subset_device(&self, subset: &ArraySubset, data: &DeviceBytes) -> Result<WriteReport, GpuError> {
        self.store_array_subset_device_opt(subset, data, &GpuConfig::current()?)
    }

    /// Store `data` (of `subset`'s shape, on `config`'s device) into `subset` of the array: its
    /// chunks are assembled and encoded on the device where the chain allows (a transpose, the
    /// `bytes` codec in either order, then zstd without a content checksum, gzip, zlib or Blosc
    /// with lz4 or zstd, then crc32c; sharded, nested too), else by zarrs on the host. Chunks the
    /// subset covers in part are read, modified and encoded again (of a shard, the inner chunks it
    /// meets); chunks that are all fill value are erased.
    ///
    /// # Errors
    /// Returns an error before anything is written when the element type, shape or device of
    /// `data` does not fit, or the subset lies outside the array; and an error naming the chunk
    /// when encoding or storing one fails (chunks written before it keep their new values).
    fn store_array_subset_device_opt(
        &self,
        subset: &ArraySubset,
        data: &DeviceBytes,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError>;

    /// Store `data` (the chunk's full shape) as the chunk at `chunk_indices`, as
    /// [`Self::store_chunk_device_opt`] with the configuration reads use.
    ///
    /// # Errors
    /// As [`Self::store_chunk_device_opt`].
    fn store_chunk_device(&self, chunk_indices: &[u64], data: &DeviceBytes) -> Result<WriteReport, GpuError> {
        self.store_chunk_device_opt(chunk_indices, data, &GpuConfig::current()?)
    }

    /// Store `data` (the chunk's full shape, on `config`'s device) as the chunk at
    /// `chunk_indices`: its part within the array, as [`Self::store_array_subset_device_opt`]
    /// stores a subset.
    ///
    /// # Errors
    /// As [`Self::store_array_subset_device_opt`], and for chunk indices outside the grid.
    fn store_chunk_device_opt(
        &self,
        chunk_indices: &[u64],
        data: &DeviceBytes,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError>;
}

impl<S: ReadableWritableStorageTraits + 'static> ArrayDeviceWriteExt for Array<S> {
    fn store_array_subset_device_opt(
        &self,
        subset: &ArraySubset,
        data: &DeviceBytes,
        config: &GpuConfig,
    ) -> Result<WriteReport, GpuError> {
        check_same_type(data.data_type(), self.data_type())?;
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
            if chain.codec.and_then(WriteCodec::nvcomp).is_some() {
                nvcomp_sys::NvcompLibrary::get().map_err(|e| e.to_string())?;
            }
            Ok(chain)
        });
        // As a read is: the caller's context restored after, a lost context refused before.
        let mut report = contained(config, || match chain {
            Ok(chain) => write_on_device(self, subset, data, &chain, config),
            Err(reason) => write_on_host(self, subset, data, (reason, config)),
        })?;
        report.seconds = start.elapsed().as_secs_f64();
        Ok(report)
    }

    fn store_chunk_device_opt(
        &self,
        chunk_indices: &[u64],
        data: &DeviceBytes,
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
fn copy_region(data: &DeviceBytes, region: &ArraySubset) -> Result<DeviceBytes, GpuError> {
    let elem = element_size(data.data_type())?;
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
    let source_guard = data.as_cuda_bytes().map(|slice| slice.device_ptr(stream));
    for copy in &placement.copies {
        let copy = Copy3D { src_offset: copy.src_offset + placement.byte_start, ..*copy };
        // SAFETY: the copies lie within `data` (its whole shape) and `out` (the region's shape).
        unsafe { copy_dtod(&copy, data.device_ptr(), dst, stream) }?;
    }
    drop((guard, source_guard));
    // SAFETY: every byte of `out` was written by the copies above, ordered on its stream.
    unsafe { DeviceBytes::from_cuda_slice(out, region.shape().to_vec(), data.data_type().clone()) }
}

/// Whether writes store chunks (and shards) that are all fill value, as zarrs decides for its own
/// writes: its global configuration's `store_empty_chunks` (the default of every array's codec
/// options). The device route and its host fallback both follow it.
fn store_empty_chunks() -> bool {
    zarrs::config::global_config().store_empty_chunks()
}

/// What a write of this process locks to change `key` of `storage` ([`KeyLocks`]): a
/// `GdsStore`'s file, else the key in this store object.
fn lock_id<S: 'static>(storage: &Arc<S>, key: &StoreKey) -> LockId {
    match gds_of(storage) {
        Some(store) => store.lock_id(key),
        None => LockId::Key(Arc::as_ptr(storage).cast::<u8>() as usize, key.as_str().to_owned()),
    }
}

/// Take the locks of every chunk (or shard) of `array` that `subset` meets, held by a write of
/// it until the guard is dropped: two writes of this process that share a chunk, whichever
/// elements of it each changes, then never lose an update (each reads the chunk after the other
/// stored it). Every write of this crate takes them; a write through zarrs' own
/// `store_array_subset` (host values) should be made while holding them. Locks of many chunks are
/// taken in one order, so writes never wait on each other in a circle; a thread must not take
/// them twice.
///
/// # Errors
/// Returns an error when the subset lies outside the array.
pub fn lock_chunks<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
) -> Result<KeyLockGuard, GpuError> {
    let storage = array.storage();
    let ids: Vec<LockId> =
        chunks_meeting(array, subset)?.into_iter().map(|(_, key, _)| lock_id(&storage, &key)).collect();
    Ok(KeyLocks::lock(ids))
}

/// zarrs' own write, from a host copy of `data` ([`store_array_subset_host`]).
fn write_on_host<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    data: &DeviceBytes,
    (reason, config): (String, &GpuConfig),
) -> Result<WriteReport, GpuError> {
    // The elements' bytes as they lie in memory: zarrs' in-memory bytes of the same type.
    let bytes = zarrs::array::ArrayBytes::new_flen(data.to_host_bytes()?);
    let chunks = array.chunks_in_array_subset(subset).map_err(|e| GpuError::Array(e.into()))?;
    store_array_subset_host(array, subset, bytes, config)?;
    let mut report = WriteReport::new(WritePath::Host, chunks.map_or(0, |c| c.num_elements() as usize));
    report.reason = Some(reason);
    Ok(report)
}

fn write_on_device<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    data: &DeviceBytes,
    chain: &WriteChain,
    config: &GpuConfig,
) -> Result<WriteReport, GpuError> {
    let units = plan_units(array, subset, chain, element_size(data.data_type())?)?;
    // nvCOMP compresses chunks up to a size (16 MiB for zstd and LZ4 in nvCOMP 6): larger ones go
    // to zarrs.
    let largest = units.iter().map(|u| u.encoded().1).max().unwrap_or(0);
    if let Some(compressor) = chain.codec.and_then(WriteCodec::nvcomp) {
        let nvcomp = nvcomp_sys::NvcompLibrary::get().map_err(|e| GpuError::NoNvcomp(e.to_string()))?;
        if let Err(err) = nvcomp.compress_max_output_chunk_size(compressor, largest as usize) {
            return write_on_host(array, subset, data, (format!("chunks of {largest} bytes: {err}"), config));
        }
    }
    // The driver calls below (fills, copies) run in the device's context.
    GpuContext::get(config.device())?.bind()?;
    if encode::needs_kernels(chain) && GpuContext::get(config.device())?.kernels(crate::pipeline::KERNELS).is_none() {
        return write_on_host(
            array,
            subset,
            data,
            ("this chain's device encoders need NVRTC, not found".into(), config),
        );
    }
    let mut report = WriteReport::new(WritePath::Device, units.len());
    let mut batches: Vec<Vec<WriteUnit>> = Vec::new();
    let mut batch_bytes = 0u64;
    for unit in units {
        if batches.is_empty() || batch_bytes >= WRITE_BATCH_BYTES {
            batches.push(Vec::new());
            batch_bytes = 0;
        }
        // A shard's inner chunks take their aligned slots beside its raw bytes.
        let slots = unit.slots_len();
        batch_bytes = batch_bytes.saturating_add(unit.placement.chunk_bytes.max(slots));
        batches.last_mut().expect("pushed").push(unit);
    }
    let ctx = GpuContext::get(config.device())?;
    // Every chunk (shard) written is locked for the whole write: another write of this process
    // reads it only after this one stored it (the old values and kept inner chunks of one version).
    let storage = array.storage();
    let _locked = KeyLocks::lock(batches.iter().flatten().map(|u| lock_id(&storage, &u.placement.key)));
    let store_empty = store_empty_chunks();
    // A codec level at or above the configured one: every chunk on host threads.
    let at_level = chain.codec.as_ref().zip(config.host_encode_level()).is_some_and(|(c, l)| c.level() >= l);
    let share = if at_level { Some(1.0) } else { config.host_encode_fraction() };
    let batch_encoder = BatchEncoder { array, data, chain, share, config, ctx: &ctx };
    // Batch k's files are stored on another thread while batch k + 1 is assembled and encoded.
    let stored = std::thread::scope(|scope| -> Result<(), GpuError> {
        let mut storing = None;
        for batch in &batches {
            let start = Instant::now();
            let encoded = batch_encoder.encode(batch, &mut report);
            report.encode_seconds += start.elapsed().as_secs_f64();
            let stored = storing.take().map(|h: std::thread::ScopedJoinHandle<'_, _>| h.join());
            if let Some(stored) = stored {
                report.add(stored.map_err(|_| GpuError::Unsupported("storing a batch of chunks panicked".into()))??);
            }
            let (encoded, olds) = encoded?;
            storing = Some(scope.spawn(move || store_batch(array, batch, (encoded, olds), chain, store_empty)));
        }
        if let Some(h) = storing {
            report.add(h.join().map_err(|_| GpuError::Unsupported("storing a batch of chunks panicked".into()))??);
        }
        Ok(())
    });
    // Shards replaced or erased (all of them, or some before an error): the caller's cache must
    // not serve their old indexes (on stores without file stamps it would).
    if let (Some(cache), false) = (config.shard_index_cache(), chain.shards.is_empty()) {
        cache.forget(&batches.iter().flatten().map(|u| &u.placement.key).collect());
    }
    stored?;
    Ok(report)
}

/// What encodes a write's batches: the array, the data (on its stream), the chain and the host's
/// share of the encode, the configuration (a read's, for the old values) and the device.
struct BatchEncoder<'a, S: ?Sized> {
    array: &'a Array<S>,
    data: &'a DeviceBytes,
    chain: &'a WriteChain,
    /// Of each batch's chunks, the share encoded on host threads (None: by the batch's size).
    share: Option<f64>,
    config: &'a GpuConfig,
    ctx: &'a Arc<GpuContext>,
}

impl<S: ReadableWritableStorageTraits + 'static> BatchEncoder<'_, S> {
    /// Assemble and encode one batch of chunks on the device: each chunk's encoded bytes, on the
    /// host, and the stored values read (what the shards covered in part keep, the versions read).
    fn encode(&self, units: &[WriteUnit], report: &mut WriteReport) -> Result<(EncodedBatch, Olds), GpuError> {
        let stream = self.data.stream().clone();
        let cuda = |what| GpuError::cuda(what);
        let start = Instant::now();
        let stored = read_olds(self.array, units, self.chain)?;
        report.read_seconds += start.elapsed().as_secs_f64();
        // Each chunk's raw bytes at an offset aligned for nvCOMP (checked: chunk shapes come from
        // metadata).
        let mut offsets = Vec::with_capacity(units.len());
        let mut total = 0u64;
        for unit in units {
            offsets.push(total);
            total = unit
                .placement
                .chunk_bytes
                .checked_next_multiple_of(SLOT_ALIGN)
                .and_then(|len| total.checked_add(len))
                .ok_or_else(|| {
                    GpuError::bytes_overflow("a batch of chunks of shape", &unit.placement.chunk_shape, 1)
                })?;
        }
        // From the device's pool, as a read's buffers. What is encoded of each chunk's place is written
        // whole (fill past the edge, the old value where the subset covers it in part, the data)
        // before it is encoded or copied out; the alignment padding between chunks, and the inner
        // chunks a shard keeps, are never read.
        let raw = self.ctx.alloc(&stream, total.max(1) as usize)?;
        // Old chunks are read on their own streams and copied out on this one: whatever happens, they
        // are freed only after this stream has run those copies.
        let mut olds = Vec::new();
        let encoded = self.assemble_and_encode(units, (&raw, &offsets), (&stored, &mut olds), report);
        if !olds.is_empty() {
            let synced = stream.synchronize().map_err(cuda("copying chunks to modify"));
            if synced.is_err() {
                // The copies may still run: their sources must never be reused.
                olds.iter().for_each(DeviceBytes::abandon);
            }
            synced?;
        }
        drop(olds);
        let encoded = encoded?;
        report.bytes_encoded += units.iter().map(|u| u.encoded().0 as u64 * u.encoded().1).sum::<u64>();
        Ok((encoded, stored))
    }

    /// [`Self::encode`]'s work on `raw` (the batch's chunks at `offsets`): each chunk assembled, then
    /// encoded; the old values of chunks covered in part go to `olds`.
    fn assemble_and_encode(
        &self,
        units: &[WriteUnit],
        (raw, offsets): (&CudaSlice<u8>, &[u64]),
        (stored, olds): (&Olds, &mut Vec<DeviceBytes>),
        report: &mut WriteReport,
    ) -> Result<EncodedBatch, GpuError> {
        let Self { array, data, chain, share, config, ctx } = *self;
        let stream = data.stream().clone();
        let cuda = |what| GpuError::cuda(what);
        let (raw_ptr, raw_guard) = raw.device_ptr(&stream);
        // The stream waits for the data's last writer where cudarc tracks it (a slice written on
        // another stream).
        let source_guard = data.as_cuda_bytes().map(|slice| slice.device_ptr(&stream));
        let fill = array.fill_value().as_ne_bytes();
        // Chunks covered in part: their old values (their parts within the array; a shard's, those of
        // its inner chunks covered in part), read as one request (decoded on the device), then copied
        // into their places.
        let partial: Vec<ArraySubset> =
            units.iter().flat_map(|u| u.olds.iter().map(|(region, _)| region.clone())).collect();
        if !partial.is_empty() {
            let start = Instant::now();
            // Decoded from the values read once (`stored`), not read from the store again: no
            // shard index cache (it knows the store's files, not these bytes).
            let read = array.with_storage(stored.values.clone());
            let read_config = config.clone().with_shard_index_cache(None);
            let (parts, _) = read.retrieve_array_subsets_device_opt::<DeviceBytes>(&partial, &read_config)?;
            // The read's own stream: the copies wait for it.
            if let Some(first) = parts.first() {
                first.stream().synchronize().map_err(cuda("reading chunks to modify"))?;
            }
            olds.extend(parts);
            report.read_seconds += start.elapsed().as_secs_f64();
        }
        let mut old_parts = olds.iter();
        for (unit, &at) in units.iter().zip(offsets) {
            let p = &unit.placement;
            if unit.edge {
                // Elements past the array's edge hold the fill value.
                // SAFETY: the chunk's place in `raw`, ordered on the stream.
                unsafe { fill_pattern(fill, raw_ptr + at, p.chunk_bytes as usize, &stream) }?;
            }
            for (_, copies) in &unit.olds {
                let old = old_parts.next().expect("one old part per region read");
                for c in copies {
                    // SAFETY: a read's copies of this chunk into the region (the shape of `old`),
                    // reversed: within `old` and the chunk's place in `raw`.
                    unsafe { copy_dtod(c, old.device_ptr(), raw_ptr + at, &stream) }?;
                }
            }
            if unit.touched.is_some() || !unit.olds.is_empty() {
                report.modified += 1;
            }
            // The subset's part of the chunk, from `data` (the copies that a read makes, reversed).
            for c in &p.copies {
                // SAFETY: the copies of a read of this chunk into `data`'s subset, reversed: within
                // `data` and the chunk's place in `raw`.
                unsafe { copy_dtod(&reversed(c, p.byte_start), data.device_ptr(), raw_ptr + at, &stream) }?;
            }
        }
        drop((raw_guard, source_guard));
        let kernels = ctx.kernels(crate::pipeline::KERNELS);
        let elem = element_size(self.data.data_type())?;
        if units.iter().all(|u| u.inner.is_none()) {
            let slots = Slots {
                offsets: offsets.to_vec(),
                lens: units.iter().map(|u| u.placement.chunk_bytes).collect(),
                shapes: units.iter().map(|u| u.placement.chunk_shape.as_slice()).collect(),
                keys: units.iter().map(|u| &u.placement.key).collect(),
                elem,
            };
            return encode_slots(chain, share, (ctx, &stream, kernels), raw, &slots);
        }
        // Shards: each inner chunk gathered into a slot of its own, then encoded as chunks are.
        let inner_shape = chain.shards.last().map_or(&[][..], ShardLevel::inner_shape);
        let (slots, inner_slots) = gather_inner_chunks(units, (ctx, &stream), (raw, offsets), inner_shape, elem)?;
        encode_slots(chain, share, (ctx, &stream, kernels), &slots, &inner_slots)
    }
}

/// The inner chunks each shard of `units` encodes, gathered from the shards' raw bytes (`raw`, at
/// `offsets`) into slots of a new buffer: the buffer and its slots (chunks of `inner_shape`,
/// elements of `elem` bytes).
fn gather_inner_chunks<'a>(
    units: &'a [WriteUnit],
    (ctx, stream): (&Arc<GpuContext>, &Arc<CudaStream>),
    (raw, offsets): (&CudaSlice<u8>, &[u64]),
    inner_shape: &'a [u64],
    elem: u64,
) -> Result<(CudaSlice<u8>, Slots<'a>), GpuError> {
    let mut slots_at = Vec::with_capacity(units.len());
    let mut total = 0u64;
    for unit in units {
        slots_at.push(total);
        let len = unit.slots_len();
        total = total
            .checked_add(len)
            .ok_or_else(|| GpuError::bytes_overflow("a batch of shards of shape", &unit.placement.chunk_shape, 1))?;
    }
    // Every slot is written whole by the gathers below (an inner chunk's copies cover it); the
    // alignment padding is never read.
    let slots = ctx.alloc(stream, total.max(1) as usize)?;
    let mut inner_slots = Slots { offsets: Vec::new(), lens: Vec::new(), shapes: Vec::new(), keys: Vec::new(), elem };
    {
        let (raw_ptr, _a) = raw.device_ptr(stream);
        let (slots_ptr, _b) = slots.device_ptr(stream);
        for ((unit, &at), &base) in units.iter().zip(offsets).zip(&slots_at) {
            let inner = unit.inner.as_ref().expect("every unit of a sharded array is a shard");
            let all: Vec<usize>;
            let encoded = if let Some(touched) = &unit.touched {
                touched
            } else {
                all = (0..inner.count).collect();
                &all
            };
            // Inner chunk k into the j-th slot of those encoded.
            for (j, &k) in encoded.iter().enumerate() {
                let moved = (j as u64 * inner.slot).wrapping_sub(k as u64 * inner.slot);
                for c in inner.copies(k)? {
                    let c = Copy3D { dst_offset: c.dst_offset.wrapping_add(moved), ..c };
                    // SAFETY: within the shard's raw bytes and its j-th slot (planned from their
                    // shapes, for slot k).
                    unsafe { copy_dtod(&c, raw_ptr + at, slots_ptr + base, stream) }?;
                }
            }
            let n = encoded.len();
            inner_slots.offsets.extend((0..n as u64).map(|j| base + j * inner.slot));
            inner_slots.lens.extend(std::iter::repeat_n(inner.bytes, n));
            inner_slots.shapes.extend(std::iter::repeat_n(inner_shape, n));
            inner_slots.keys.extend(std::iter::repeat_n(&unit.placement.key, n));
        }
    }
    Ok((slots, inner_slots))
}
