//! Writes from device memory: a [`DeviceArray`] stored into a subset of a Zarr array, its chunks
//! (or shards) assembled and encoded on the device (`codec`: which chains; `encode`: the stored
//! layout, nvCOMP's batched compression, the frames; a shard's inner chunks gathered and encoded
//! in the same batch), copied to pinned host memory, then written by the
//! store from there (a [`GdsStore`](zarrs_gds_store::GdsStore) replaces each file atomically)
//! while the next batch encodes. Chunks the subset covers in part are read (on the device),
//! modified there and encoded again; chunks (and inner chunks) that come out all fill value are
//! erased or left out, as zarrs does. Chains the device does not encode yet go through zarrs on
//! the host, the report says why.

mod codec;
mod encode;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use rayon::prelude::*;
use zarrs::array::{Array, ArraySubset, ElementOwned};
use zarrs_gds_store::{AnyStore, GdsStore};
use zarrs_storage::{Bytes, ReadableWritableStorageTraits, StoreKey};

use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device_array::{check_element, DeviceArray};
use crate::error::GpuError;
use crate::pipeline::place::{copy_dtod, fill_pattern};
use crate::pipeline::plan::{plan_chunks, ChunkPlacement, Copy3D};
use crate::pipeline::route::{chunk_subset, chunks_meeting};
use crate::pipeline::shard::{encode_shards, nested_origins, ShardLevel};
use crate::report::{WritePath, WriteReport};
use crate::retrieve::{check_subset, contained, ArrayDeviceExt};
use codec::{write_chain, WriteChain, WriteCodec};
use encode::{encode_slots, is_memcpyed, EncodedBatch, Slots, BLOSC_HEADER, CRC_ROOM};

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
    fn store_array_subset_device<T: ElementOwned>(
        &self,
        subset: &ArraySubset,
        data: &DeviceArray<T>,
    ) -> Result<WriteReport, GpuError> {
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
            if chain.codec.as_ref().and_then(WriteCodec::nvcomp).is_some() {
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
    (reason, config): (String, &GpuConfig),
) -> Result<WriteReport, GpuError> {
    let elements = data.to_host()?;
    let chunks = array.chunks_in_array_subset(subset).map_err(|e| GpuError::Array(e.into()))?;
    // Whatever zarrs replaces, the caller's shard index cache forgets (as after a device write).
    let forget = || -> Result<(), GpuError> {
        if let Some(cache) = config.shard_index_cache() {
            let keys: Vec<StoreKey> = chunks_meeting(array, subset)?.into_iter().map(|(_, key, _)| key).collect();
            cache.forget(&keys.iter().collect());
        }
        Ok(())
    };
    let stored = array.store_array_subset(subset, elements);
    forget()?;
    stored?;
    let mut report = WriteReport::new(WritePath::Host, chunks.map_or(0, |c| c.num_elements() as usize));
    report.reason = Some(reason);
    Ok(report)
}

/// A chunk (or shard) of a write: where it lies, whether the subset covers all of its part within
/// the array (else its old value is read first), and a shard's inner chunks.
struct WriteUnit {
    placement: ChunkPlacement,
    /// The chunk reaches past the array's edge: the elements there hold the fill value.
    edge: bool,
    /// Old values read before the chunk is assembled (regions of the array, bounded by its edge)
    /// and the copies that put each into the chunk's place: a chunk covered in part, its part
    /// within the array; a shard covered in part, the parts of the inner chunks covered in part.
    olds: Vec<(ArraySubset, Vec<Copy3D>)>,
    inner: Option<Arc<InnerChunks>>,
    /// A shard covered in part: the inner chunks it encodes again (those the subset meets, in C
    /// order of the inner grid); the others keep their stored bytes. None: all of them.
    touched: Option<Vec<usize>>,
}

impl WriteUnit {
    /// The values it encodes (its inner chunks, or itself) and the raw bytes of each.
    fn encoded(&self) -> (usize, u64) {
        match (&self.inner, &self.touched) {
            (None, _) => (1, self.placement.chunk_bytes),
            (Some(inner), Some(touched)) => (touched.len(), inner.bytes),
            (Some(inner), None) => (inner.count, inner.bytes),
        }
    }

    /// Bytes of its inner chunks' slots (those it encodes), one after another.
    fn slots_len(&self) -> u64 {
        self.inner.as_ref().map_or(0, |inner| inner.slot.saturating_mul(self.encoded().0 as u64))
    }
}

/// A shard's inner chunks, gathered from its raw bytes (C order of the shard's shape) into slots
/// [`SLOT_ALIGN`]-aligned one after another, in C order of the inner grid (the shard's layout).
struct InnerChunks {
    count: usize,
    /// Raw bytes of each, and of its slot ([`SLOT_ALIGN`]-aligned).
    bytes: u64,
    slot: u64,
    /// The copies from the shard's bytes into the slots: those of inner chunk k (into slot k) are
    /// `copies[per_chunk[k]]`.
    copies: Vec<Copy3D>,
    per_chunk: Vec<std::ops::Range<usize>>,
}

/// Where chunks start in a device buffer of chunks to encode (nvCOMP's alignment, and more).
const SLOT_ALIGN: u64 = 256;

impl InnerChunks {
    /// The innermost chunks of a shard of `shard_shape` whose levels' inner shapes are
    /// `inner_shapes` (outermost first; one for a shard of chunks), elements of `elem` bytes, in
    /// the order [`nested_origins`] lists them.
    fn new(elem: u64, shard_shape: &[u64], inner_shapes: &[&[u64]]) -> Result<Self, GpuError> {
        let inner_shape = *inner_shapes.last().ok_or_else(|| GpuError::Unsupported("no sharding level".into()))?;
        let shard = ArraySubset::new_with_shape(shard_shape.to_vec());
        let grid: Vec<u64> = shard_shape.iter().zip(inner_shape).map(|(&s, &c)| s / c.max(1)).collect();
        let count = grid.iter().try_fold(1u64, |n, &g| n.checked_mul(g));
        let bytes = inner_shape.iter().try_fold(elem, |n, &c| n.checked_mul(c));
        let (Some(count), Some(bytes)) = (count, bytes) else {
            return Err(GpuError::bytes_overflow("inner chunks of shape", inner_shape, elem));
        };
        let slot = bytes
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or_else(|| GpuError::bytes_overflow("inner chunks of shape", inner_shape, elem))?;
        let key = StoreKey::new("inner").expect("a valid key");
        let (mut copies, mut per_chunk) = (Vec::new(), Vec::new());
        for (k, start) in nested_origins(shard_shape, inner_shapes).into_iter().enumerate() {
            let indices: Vec<u64> = start.iter().zip(inner_shape).map(|(&o, &c)| o / c.max(1)).collect();
            let chunk = ArraySubset::new_with_start_shape(start, inner_shape.to_vec())
                .map_err(|e| GpuError::Array(e.into()))?;
            let placement =
                plan_chunks(elem, &shard, [(indices, key.clone(), chunk)])?.pop().expect("inside the shard");
            // A read's copies (chunk to shard), reversed into slot k.
            let base =
                slot.checked_mul(k as u64).ok_or_else(|| GpuError::bytes_overflow("a shard of", shard_shape, elem))?;
            let first = copies.len();
            copies.extend(placement.copies.iter().map(|c| reversed(c, base + placement.byte_start)));
            per_chunk.push(first..copies.len());
        }
        let count = usize::try_from(count).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        Ok(Self { count, bytes, slot, copies, per_chunk })
    }
}

/// The parts within the array (bounded by its `shape`) of the inner chunks of `inner_shape` of a
/// shard at `shard` (unbounded), in C order of the inner grid; None for one wholly past the edge.
fn inner_parts(shard: &ArraySubset, inner_shape: &[u64], shape: &[u64]) -> Result<Vec<Option<ArraySubset>>, GpuError> {
    let grid: Vec<u64> = shard.shape().iter().zip(inner_shape).map(|(&s, &c)| s / c.max(1)).collect();
    ArraySubset::new_with_shape(grid)
        .indices()
        .into_iter()
        .map(|indices| {
            let mut ranges = Vec::with_capacity(indices.len());
            for (((&i, &c), &origin), &end) in indices.iter().zip(inner_shape).zip(shard.start()).zip(shape) {
                // Within the shard, whose end was checked.
                let start = origin + i * c;
                if start >= end {
                    return Ok(None);
                }
                ranges.push(start..(start + c).min(end));
            }
            Ok(Some(ArraySubset::new_with_ranges(&ranges)))
        })
        .collect()
}

/// Inner chunks of `inner_shape` in a shard at `shard` (past the array's edge too).
fn inner_parts_count(shard: &ArraySubset, inner_shape: &[u64]) -> usize {
    shard.shape().iter().zip(inner_shape).map(|(&s, &c)| (s / c.max(1)) as usize).product()
}

/// Whether two subsets share an element.
fn meets(a: &ArraySubset, b: &ArraySubset) -> bool {
    a.start()
        .iter()
        .zip(a.shape())
        .zip(b.start().iter().zip(b.shape()))
        .all(|((&a0, &an), (&b0, &bn))| a0 < b0 + bn && b0 < a0 + an)
}

/// Whether `outer` holds every element of `inner`.
fn covers(outer: &ArraySubset, inner: &ArraySubset) -> bool {
    outer
        .start()
        .iter()
        .zip(outer.shape())
        .zip(inner.start().iter().zip(inner.shape()))
        .all(|((&o0, &on), (&i0, &in_))| o0 <= i0 && i0 + in_ <= o0 + on)
}

/// A read's copy (stored chunk to output) the other way: from the output into the chunk's
/// bytes, which start at `chunk_at`.
fn reversed(c: &Copy3D, chunk_at: u64) -> Copy3D {
    Copy3D {
        src_offset: c.dst_offset,
        dst_offset: chunk_at + c.src_offset,
        src_pitch: c.dst_pitch,
        src_height: c.dst_height,
        dst_pitch: c.src_pitch,
        dst_height: c.src_height,
        ..*c
    }
}

/// The units of a write of `subset` (elements of `elem` bytes): each chunk (or shard) it meets,
/// where its data goes, the old values read first, a shard's inner chunks and which of them it
/// encodes again.
fn plan_units<S: ?Sized>(
    array: &Array<S>,
    subset: &ArraySubset,
    chain: &WriteChain,
    elem: u64,
) -> Result<Vec<WriteUnit>, GpuError> {
    let chunks = chunks_meeting(array, subset)?;
    let mut units = Vec::with_capacity(chunks.len());
    // Shards of one shape share their inner layout (a regular grid has one shape).
    let mut layouts: Vec<(Vec<u64>, Arc<InnerChunks>)> = Vec::new();
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
        let edge = within.iter().zip(chunk.shape()).any(|(r, &n)| r.end - r.start < n);
        let within = ArraySubset::new_with_ranges(&within);
        // A read of the chunk into `region` (within the array), reversed: the old values' copies.
        let old = |region: ArraySubset| -> Result<(ArraySubset, Vec<Copy3D>), GpuError> {
            let old = plan_chunks(elem, &region, [(indices.clone(), key.clone(), chunk.clone())])?.pop();
            let old = old.expect("a chunk meets its own part");
            let copies = old.copies.iter().map(|c| reversed(c, old.byte_start)).collect();
            Ok((region, copies))
        };
        let (olds, touched) = match chain.shards.as_slice() {
            _ if whole => (Vec::new(), None),
            // A chunk, or nested shards (encoded whole again), covered in part.
            [] | [_, _, ..] => (vec![old(within.clone())?], None),
            // A shard covered in part: its inner chunks the subset meets are encoded again (those
            // it covers in part read first), the others kept as they are stored.
            [level] => {
                let (mut olds, mut touched) = (Vec::new(), Vec::new());
                for (k, part) in inner_parts(&chunk, level.inner_shape(), array.shape())?.into_iter().enumerate() {
                    let Some(part) = part else { continue };
                    if !meets(&part, subset) {
                        continue;
                    }
                    touched.push(k);
                    if !covers(subset, &part) {
                        olds.push(old(part)?);
                    }
                }
                // Every inner chunk met: nothing to keep (the shard is encoded whole).
                let count = inner_parts_count(&chunk, level.inner_shape());
                (olds, (touched.len() != count).then_some(touched))
            }
        };
        let placement = plan_chunks(elem, subset, [(indices, key, chunk)])?.pop().expect("the chunk meets the subset");
        let inner = if chain.shards.is_empty() {
            None
        } else if let Some((_, inner)) = layouts.iter().find(|(shape, _)| *shape == placement.chunk_shape) {
            Some(inner.clone())
        } else {
            let shapes: Vec<&[u64]> = chain.shards.iter().map(ShardLevel::inner_shape).collect();
            let inner = Arc::new(InnerChunks::new(elem, &placement.chunk_shape, &shapes)?);
            layouts.push((placement.chunk_shape.clone(), inner.clone()));
            Some(inner)
        };
        units.push(WriteUnit { placement, edge, olds, inner, touched });
    }
    Ok(units)
}

fn write_on_device<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    subset: &ArraySubset,
    data: &DeviceArray<T>,
    chain: &WriteChain,
    config: &GpuConfig,
) -> Result<WriteReport, GpuError> {
    let units = plan_units(array, subset, chain, std::mem::size_of::<T>() as u64)?;
    // nvCOMP compresses chunks up to a size (16 MiB for zstd and LZ4 in nvCOMP 6): larger ones go
    // to zarrs.
    let largest = units.iter().map(|u| u.encoded().1).max().unwrap_or(0);
    if let Some(compressor) = chain.codec.as_ref().and_then(WriteCodec::nvcomp) {
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
    // A codec level at or above the configured one: every chunk on host threads.
    let at_level = chain.codec.as_ref().zip(config.host_encode_level()).is_some_and(|(c, l)| c.level() >= l);
    let share = if at_level { Some(1.0) } else { config.host_encode_fraction() };
    // Batch k's files are stored on another thread while batch k + 1 is assembled and encoded.
    let stored = std::thread::scope(|scope| -> Result<(), GpuError> {
        let mut storing = None;
        for batch in &batches {
            let start = Instant::now();
            let encoded = encode_batch(array, data, batch, (chain, share), config, &ctx, &mut report);
            report.encode_seconds += start.elapsed().as_secs_f64();
            let stored = storing.take().map(|h: std::thread::ScopedJoinHandle<'_, _>| h.join());
            if let Some(stored) = stored {
                report.add(stored.map_err(|_| GpuError::Unsupported("storing a batch of chunks panicked".into()))??);
            }
            let (encoded, kept) = encoded?;
            storing = Some(scope.spawn(move || store_batch(array, batch, (encoded, kept), chain)));
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

/// Assemble and encode one batch of chunks on the device: each chunk's encoded bytes, on the host.
fn encode_batch<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    data: &DeviceArray<T>,
    units: &[WriteUnit],
    chain: (&WriteChain, Option<f64>),
    config: &GpuConfig,
    ctx: &Arc<GpuContext>,
    report: &mut WriteReport,
) -> Result<(EncodedBatch, Vec<Kept>), GpuError> {
    let stream = data.stream().clone();
    let cuda = |what| GpuError::cuda(what);
    let kept = kept_shards(array, units, chain.0)?;
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
            .ok_or_else(|| GpuError::bytes_overflow("a batch of chunks of shape", &unit.placement.chunk_shape, 1))?;
    }
    // From the device's pool, as a read's buffers. What is encoded of each chunk's place is written
    // whole (fill past the edge, the old value where the subset covers it in part, the data)
    // before it is encoded or copied out; the alignment padding between chunks, and the inner
    // chunks a shard keeps, are never read.
    let raw = ctx.alloc(&stream, total.max(1) as usize)?;
    // Old chunks are read on their own streams and copied out on this one: whatever happens, they
    // are freed only after this stream has run those copies.
    let mut olds = Vec::new();
    let encoded = assemble_and_encode(array, data, units, chain, (config, ctx), report, (&raw, &offsets), &mut olds);
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
    report.bytes_encoded += units.iter().map(|u| u.encoded().0 as u64 * u.encoded().1).sum::<u64>();
    Ok((encoded, kept))
}

/// [`encode_batch`]'s work on `raw` (the batch's chunks at `offsets`): each chunk assembled, then
/// encoded; the old values of chunks covered in part go to `olds`.
#[allow(clippy::too_many_arguments)]
fn assemble_and_encode<S: ReadableWritableStorageTraits + 'static, T: ElementOwned>(
    array: &Array<S>,
    data: &DeviceArray<T>,
    units: &[WriteUnit],
    (chain, share): (&WriteChain, Option<f64>),
    (config, ctx): (&GpuConfig, &Arc<GpuContext>),
    report: &mut WriteReport,
    (raw, offsets): (&CudaSlice<u8>, &[u64]),
    olds: &mut Vec<DeviceArray<T>>,
) -> Result<EncodedBatch, GpuError> {
    let stream = data.stream().clone();
    let cuda = |what| GpuError::cuda(what);
    let (raw_ptr, raw_guard) = raw.device_ptr(&stream);
    // The stream waits for the data's last writer where cudarc tracks it (a slice written on
    // another stream).
    let source_guard = data.as_cuda_slice().map(|slice| slice.device_ptr(&stream));
    let fill = array.fill_value().as_ne_bytes();
    // Chunks covered in part: their old values (their parts within the array; a shard's, those of
    // its inner chunks covered in part), read as one request (decoded on the device), then copied
    // into their places.
    let partial: Vec<ArraySubset> =
        units.iter().flat_map(|u| u.olds.iter().map(|(region, _)| region.clone())).collect();
    if !partial.is_empty() {
        let start = Instant::now();
        let (parts, _) = array.retrieve_array_subsets_device_opt::<T>(&partial, config)?;
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
    let elem = std::mem::size_of::<T>() as u64;
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
                for c in &inner.copies[inner.per_chunk[k].clone()] {
                    let c = Copy3D { dst_offset: c.dst_offset.wrapping_add(moved), ..*c };
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

/// What a shard covered in part keeps of its stored value: the value and where each inner
/// chunk's stored bytes lie in it (None: missing); None for a shard not stored yet (or a unit
/// that keeps nothing).
type Kept = Option<(Bytes, Vec<Option<std::ops::Range<usize>>>)>;

/// The stored values of the shards of `units` covered in part, read on host threads (one per
/// unit, in order), their indexes decoded: a damaged one is an error naming the shard, never a
/// shard rewritten without its other inner chunks.
fn kept_shards<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    units: &[WriteUnit],
    chain: &WriteChain,
) -> Result<Vec<Kept>, GpuError> {
    // Units keep inner chunks only with one level of sharding.
    let [level] = chain.shards.as_slice() else { return Ok(units.iter().map(|_| None).collect()) };
    let storage = array.storage();
    units
        .par_iter()
        .map(|unit| {
            if unit.touched.is_none() {
                return Ok(None);
            }
            let key = &unit.placement.key;
            let named = |reason: String| GpuError::chunk(key.to_string(), reason);
            let Some(bytes) = storage.get(key).map_err(|e| named(format!("reading the shard to keep: {e}")))? else {
                return Ok(None);
            };
            let ranges = level
                .stored_chunks(&unit.placement.chunk_shape, &bytes)
                .map_err(|e| named(format!("the stored shard: {e}")))?;
            Ok(Some((bytes, ranges)))
        })
        .collect()
}

/// What storing a batch did: chunks written, erased, the bytes stored, and the seconds it took.
type Stored = (usize, usize, u64, f64);

impl WriteReport {
    fn add(&mut self, (written, erased, bytes, seconds): Stored) {
        self.written += written;
        self.erased += erased;
        self.bytes_stored += bytes;
        self.store_seconds += seconds;
    }
}

/// Store one batch's encoded chunks (`encoded`, in the units' order): those all fill value are
/// erased (zarrs' behaviour), the others stored with their crc32c where the chain has one.
fn store_batch<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    units: &[WriteUnit],
    (mut encoded, kept): (EncodedBatch, Vec<Kept>),
    chain: &WriteChain,
) -> Result<Stored, GpuError> {
    let start = Instant::now();
    // The fill value as stored (its words swapped where the chunk's are).
    let mut fill = array.fill_value().as_ne_bytes().to_vec();
    if let Some(swap) =
        chain.layout.as_ref().map(|l| l.swap as usize).filter(|&w| w > 1 && fill.len().is_multiple_of(w))
    {
        fill.chunks_exact_mut(swap).for_each(<[u8]>::reverse);
    }
    let all_fill =
        |raw: &[u8], len: u64| raw.len() as u64 == len && raw.chunks_exact(fill.len().max(1)).all(|e| *e == *fill);
    // An encoded chunk can be all fill value only when it compressed to a small fraction of its
    // size (or is small, when its frame's overhead weighs): only those are decoded again to check,
    // by the codec's host decoder. A memcpyed Blosc chunk holds its raw bytes.
    let is_fill = |bytes: &[u8], len: u64| -> bool {
        let Some(decoder) = &chain.decoder else { return all_fill(bytes, len) };
        if matches!(chain.codec, Some(WriteCodec::Blosc(_))) && is_memcpyed(bytes) {
            return all_fill(&bytes[BLOSC_HEADER..], len);
        }
        if bytes.len() as u64 * 32 > len && len > 1 << 16 {
            return false;
        }
        let mut raw = vec![0u8; len as usize];
        decoder.decode_host(bytes, &mut raw).is_ok_and(|n| n as u64 == len && all_fill(&raw, len))
    };
    // Each chunk's bytes with the room after them, in turn (the frames lie in order).
    let host = encoded.buffer.as_mut().expect("held until dropped").as_mut_slice();
    let mut slots = Vec::with_capacity(encoded.frames.len());
    let mut rest = host;
    let mut at = 0;
    for &(start, len) in &encoded.frames {
        let (slot, tail) = std::mem::take(&mut rest)[start - at..].split_at_mut(len + CRC_ROOM);
        slots.push(slot);
        rest = tail;
        at = start + len + CRC_ROOM;
    }
    // The raw length of each encoded chunk (a shard's are its inner chunks).
    let raw_lens: Vec<u64> = units
        .iter()
        .flat_map(|u| {
            let (count, bytes) = u.encoded();
            std::iter::repeat_n(bytes, count)
        })
        .collect();
    if raw_lens.len() != slots.len() {
        return Err(GpuError::Unsupported(format!("{} chunks encoded for {} to store", slots.len(), raw_lens.len())));
    }
    // Each chunk's stored bytes (its crc32c appended), or None where it is all fill value.
    let chunks: Vec<Option<&[u8]>> = slots
        .into_par_iter()
        .zip(raw_lens)
        .map(|(slot, raw_len)| {
            let len = slot.len() - CRC_ROOM;
            if is_fill(&slot[..len], raw_len) {
                return None;
            }
            if !chain.crc32c {
                return Some(&slot[..len]);
            }
            let crc = crc32c::crc32c(&slot[..len]);
            slot[len..].copy_from_slice(&crc.to_le_bytes());
            Some(&*slot)
        })
        .collect();
    // Each unit's value: the chunk's bytes as they are, a shard laid out with its index; None
    // (erased) where all of it is fill value.
    let values: Vec<Option<Cow<'_, [u8]>>> = match chain.shards.as_slice() {
        [] => chunks.into_iter().map(|c| c.map(Cow::Borrowed)).collect(),
        levels => shard_values(levels, units, &kept, chunks)?.into_iter().map(|shard| shard.map(Cow::Owned)).collect(),
    };
    let storage = array.storage();
    let named = |key: &StoreKey| {
        let key = key.to_string();
        move |e: zarrs_storage::StorageError| GpuError::chunk(key, format!("storing it: {e}"))
    };
    let (sets, erases): (Vec<_>, Vec<_>) =
        units.iter().map(|u| &u.placement.key).zip(values).partition(|(_, value)| value.is_some());
    erases.par_iter().try_for_each(|(key, _)| storage.erase(key).map_err(named(key)))?;
    let sets: Vec<(StoreKey, Cow<'_, [u8]>)> =
        sets.into_iter().filter_map(|(key, value)| value.map(|v| ((*key).clone(), v))).collect();
    // A GdsStore writes them as one, from the pinned buffer: every file flushed in parallel, each
    // directory once. Other stores take owned bytes.
    let any = storage.as_ref() as &dyn std::any::Any;
    let gds = any.downcast_ref::<GdsStore>().or_else(|| any.downcast_ref::<AnyStore>().and_then(AnyStore::gds));
    match gds {
        Some(store) => store.set_many(&sets).map_err(|e| GpuError::Array(e.into()))?,
        None => sets
            .par_iter()
            .try_for_each(|(key, value)| storage.set(key, Bytes::copy_from_slice(value)).map_err(named(key)))?,
    }
    let bytes = sets.iter().map(|(_, v)| v.len() as u64).sum();
    Ok((sets.len(), erases.len(), bytes, start.elapsed().as_secs_f64()))
}

/// Each shard's value from its encoded inner chunks `chunks` (the units' in order; None: fill
/// value): a shard covered in part with its other inner chunks as `kept`, laid out by `levels`;
/// None where all of it is missing (erased).
fn shard_values(
    levels: &[ShardLevel],
    units: &[WriteUnit],
    kept: &[Kept],
    mut chunks: Vec<Option<&[u8]>>,
) -> Result<Vec<Option<Vec<u8>>>, GpuError> {
    let mut parts = Vec::with_capacity(units.len());
    for (unit, kept) in units.iter().zip(kept) {
        let rest = chunks.split_off(unit.encoded().0);
        parts.push((unit, kept, std::mem::replace(&mut chunks, rest)));
    }
    parts
        .into_par_iter()
        .map(|(unit, kept, new)| {
            let named = |reason: String| GpuError::chunk(unit.placement.key.to_string(), reason);
            // A shard covered in part: its other inner chunks as stored, the ones encoded
            // again in their places.
            let inner = match (&unit.touched, &unit.inner) {
                (Some(touched), Some(inner)) => {
                    let mut all: Vec<Option<&[u8]>> = match kept {
                        Some((bytes, ranges)) => ranges.iter().map(|r| r.clone().map(|r| &bytes[r])).collect(),
                        None => vec![None; inner.count],
                    };
                    if all.len() != inner.count {
                        return Err(named(format!("{} inner chunks stored, {} planned", all.len(), inner.count)));
                    }
                    for (&k, chunk) in touched.iter().zip(new) {
                        all[k] = chunk;
                    }
                    all
                }
                _ => new,
            };
            let shard = encode_shards(levels, &unit.placement.chunk_shape, &inner).map_err(named)?;
            Ok(shard)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_parts_of_edge_shards_and_the_inner_chunks_a_tile_meets() {
        let sub = |r: &[std::ops::Range<u64>]| ArraySubset::new_with_ranges(r);
        // A shard of 8 x 16 in 4 x 8 inner chunks, at the array's edge (14 x 30).
        let parts = inner_parts(&sub(&[8..16, 16..32]), &[4, 8], &[14, 30]).unwrap();
        let want = [sub(&[8..12, 16..24]), sub(&[8..12, 24..30]), sub(&[12..14, 16..24]), sub(&[12..14, 24..30])];
        assert_eq!(parts, want.map(Some).to_vec());
        // Inner chunks wholly past the edge have no part.
        let parts = inner_parts(&sub(&[8..16, 16..32]), &[4, 8], &[12, 24]).unwrap();
        assert_eq!(parts, vec![Some(sub(&[8..12, 16..24])), None, None, None]);
        assert!(meets(&sub(&[0..4, 0..4]), &sub(&[3..9, 3..9])) && !meets(&sub(&[0..4, 0..4]), &sub(&[4..9, 0..9])));
        assert!(
            covers(&sub(&[0..10, 0..10]), &sub(&[3..10, 0..1])) && !covers(&sub(&[0..10, 1..10]), &sub(&[3..9, 0..2]))
        );
        // The GPU test's tile (5..37, 20..70, 33..90 of 40 x 70 x 90) in shards of 16 x 32 x 64
        // and inner chunks of 8 x 16 x 32 meets 5 x 4 x 2 inner chunks and covers 3 x 3 x 1 of
        // their parts within the array whole (z 8..32, y 32..70, x 64..90): 31 are read first.
        let tile = sub(&[5..37, 20..70, 33..90]);
        let (mut met, mut covered) = (0, 0);
        for (z, y, x) in (0..3u64).flat_map(|z| (0..3u64).flat_map(move |y| (0..2u64).map(move |x| (z, y, x)))) {
            let shard = sub(&[z * 16..z * 16 + 16, y * 32..y * 32 + 32, x * 64..x * 64 + 64]);
            for part in inner_parts(&shard, &[8, 16, 32], &[40, 70, 90]).unwrap().into_iter().flatten() {
                met += usize::from(meets(&part, &tile));
                covered += usize::from(covers(&tile, &part));
            }
        }
        assert_eq!((met, covered), (40, 9));
    }
}
