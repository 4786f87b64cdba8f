//! The device retrieval pipeline: plan, fetch into device staging (or straight into the output),
//! place with strided device copies, fill missing chunks; or, for codec chains with no device
//! implementation yet, decode on the host into pinned memory and copy once.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use zarrs::array::{Array, ArrayBytesDecodeIntoTarget, ArrayBytesFixedDisjointView, ArraySubset};
use zarrs_storage::{ReadableStorageTraits, StorageHandle};

use crate::config::GpuConfig;
use crate::device::context::{GpuContext, ReadInFlight};
use crate::device::current_context::CurrentContextGuard;
use crate::device_array::{check_same_type, element_size, DeviceBytes, FromDeviceBytes};
use crate::error::GpuError;
use crate::pipeline::decode::{decode_units, OnDevice};
use crate::pipeline::output::{Destination, Output};
use crate::pipeline::plan::{checked_bytes, end_fits};
use crate::pipeline::request::{Layout, Request};
use crate::pipeline::route::{chunk_subset, chunks_meeting, read_route, ChunkRef};
use crate::pipeline::units::{replanned_once, units_of};
use crate::reader::ReadSource;
use crate::report::{DecodePath, RetrieveReport};

/// Whether `indices` (a box of `shape` from `start`) lies within `bound`, checked: zarrs'
/// `inbounds_shape` adds unchecked.
fn within(start: &[u64], shape: &[u64], bound: &[u64]) -> bool {
    start.len() == bound.len() && shape.len() == bound.len() && end_fits(start, shape, Some(bound))
}

/// Device retrieval for zarrs arrays: results land in CUDA device memory, as what the type
/// parameter `O` names ([`FromDeviceBytes`]): [`DeviceBytes`] (untyped, any numeric data type) or
/// a [`DeviceArray<T>`](crate::DeviceArray) checked against `T`.
///
/// Uses the GPU mode in force ([`with_gpu_config`](crate::with_gpu_config)), else the default
/// [`GpuConfig`]. Arrays on a [`GdsStore`](zarrs_gds_store::GdsStore) are read with GPUDirect Storage or its pread fallback;
/// other stores are staged through pinned memory.
pub trait ArrayDeviceExt {
    /// Retrieve `subset` of the array into device memory, and say how.
    ///
    /// # Errors
    /// Returns an error when the subset is out of bounds, `O` does not take the array's data type,
    /// storage or decoding fails, or there is no usable CUDA device.
    fn retrieve_array_subset_device_opt<O: FromDeviceBytes>(
        &self,
        subset: &ArraySubset,
        config: &GpuConfig,
    ) -> Result<(O, RetrieveReport), GpuError>;

    /// Retrieve `subset` of the array into device memory.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`].
    fn retrieve_array_subset_device<O: FromDeviceBytes>(&self, subset: &ArraySubset) -> Result<O, GpuError> {
        Ok(self.retrieve_array_subset_device_opt(subset, &GpuConfig::current()?)?.0)
    }

    /// Retrieve `subset` of the array into `out`, a device array of as many elements (C order; the
    /// subset's shape, or that less dimensions of extent 1) that may be another library's memory
    /// ([`DeviceBytes::from_dlpack`]), and say how. `out`'s earlier work must be done (its
    /// producer's stream synchronized); after an error its contents are unspecified, and after a
    /// timeout (work on it may still be running) `out` never frees nor returns its memory.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`], and when `out` has another number of
    /// elements, another data type, or lies on another device than `config`'s.
    fn retrieve_array_subset_into_device_opt<O: AsRef<DeviceBytes>>(
        &self,
        subset: &ArraySubset,
        out: &mut O,
        config: &GpuConfig,
    ) -> Result<RetrieveReport, GpuError>;

    /// Retrieve each of `subsets` into device memory as one request, and say how: the request is
    /// planned once, a chunk that several subsets meet is read and decoded once, and the split
    /// between host threads and the device covers all of it. The arrays are views of one
    /// allocation ([`DeviceBytes::as_cuda_bytes`] is None for them), which goes back to the pool
    /// once the last of them is dropped. Subsets may overlap each other and differ in shape.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`], for any of the subsets.
    fn retrieve_array_subsets_device_opt<O: FromDeviceBytes>(
        &self,
        subsets: &[ArraySubset],
        config: &GpuConfig,
    ) -> Result<(Vec<O>, RetrieveReport), GpuError>;

    /// Retrieve each of `subsets` into device memory as one request (see
    /// [`Self::retrieve_array_subsets_device_opt`]).
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subsets_device_opt`].
    fn retrieve_array_subsets_device<O: FromDeviceBytes>(&self, subsets: &[ArraySubset]) -> Result<Vec<O>, GpuError> {
        Ok(self.retrieve_array_subsets_device_opt(subsets, &GpuConfig::current()?)?.0)
    }

    /// Retrieve `subsets`, which share their shape, as one request into one device array of
    /// shape `(subsets.len(), *shape)`, subset `i` at index `i` (a training batch of crops, with
    /// no stacking copy after it), and say how.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subsets_device_opt`], and when the subsets' shapes differ.
    fn retrieve_array_subsets_stacked_device_opt<O: FromDeviceBytes>(
        &self,
        subsets: &[ArraySubset],
        config: &GpuConfig,
    ) -> Result<(O, RetrieveReport), GpuError>;

    /// Retrieve `subsets`, which share their shape, into one device array of shape
    /// `(subsets.len(), *shape)` (see [`Self::retrieve_array_subsets_stacked_device_opt`]).
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subsets_stacked_device_opt`].
    fn retrieve_array_subsets_stacked_device<O: FromDeviceBytes>(
        &self,
        subsets: &[ArraySubset],
    ) -> Result<O, GpuError> {
        Ok(self.retrieve_array_subsets_stacked_device_opt(subsets, &GpuConfig::current()?)?.0)
    }

    /// Retrieve the chunk at `chunk_indices` into device memory: its full shape as stored, like
    /// zarrs' `retrieve_chunk` (an edge chunk includes the part beyond the array's shape).
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`], and for invalid chunk indices.
    fn retrieve_chunk_device<O: FromDeviceBytes>(&self, chunk_indices: &[u64]) -> Result<O, GpuError> {
        Ok(self.retrieve_chunk_device_opt(chunk_indices, &GpuConfig::current()?)?.0)
    }

    /// [`Self::retrieve_chunk_device`] with `config`, and what the read did. The chunk is
    /// decoded on the device as a subset would be (a shard's inner chunks in one batch).
    ///
    /// # Errors
    /// As [`Self::retrieve_chunk_device`].
    fn retrieve_chunk_device_opt<O: FromDeviceBytes>(
        &self,
        chunk_indices: &[u64],
        config: &GpuConfig,
    ) -> Result<(O, RetrieveReport), GpuError>;

    /// Retrieve the region of the array that the chunks in `chunks` (a subset of the chunk grid)
    /// cover, bounded by the array's shape, into device memory.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`], and for invalid chunk indices.
    fn retrieve_chunks_device<O: FromDeviceBytes>(&self, chunks: &ArraySubset) -> Result<O, GpuError>;
}

/// One impl for every store, concrete or behind `dyn`: where the store is a `GdsStore` or a
/// `RemoteStore` (also behind an `AnyStore`), `ReadSource::of` says so, and the read takes
/// its own path; any other store is read through zarrs' storage traits.
impl<S: ReadableStorageTraits + ?Sized + 'static> ArrayDeviceExt for Array<S> {
    fn retrieve_array_subset_device_opt<O: FromDeviceBytes>(
        &self,
        subset: &ArraySubset,
        config: &GpuConfig,
    ) -> Result<(O, RetrieveReport), GpuError> {
        contained_read(self, config, |source| retrieve_new(self, subset, source, config, None))
    }

    fn retrieve_array_subsets_device_opt<O: FromDeviceBytes>(
        &self,
        subsets: &[ArraySubset],
        config: &GpuConfig,
    ) -> Result<(Vec<O>, RetrieveReport), GpuError> {
        contained_read(self, config, |source| retrieve_many(self, subsets, source, config))
    }

    fn retrieve_array_subsets_stacked_device_opt<O: FromDeviceBytes>(
        &self,
        subsets: &[ArraySubset],
        config: &GpuConfig,
    ) -> Result<(O, RetrieveReport), GpuError> {
        contained_read(self, config, |source| retrieve_stacked(self, subsets, source, config))
    }

    fn retrieve_array_subset_into_device_opt<O: AsRef<DeviceBytes>>(
        &self,
        subset: &ArraySubset,
        out: &mut O,
        config: &GpuConfig,
    ) -> Result<RetrieveReport, GpuError> {
        let out = out.as_ref();
        check_same_type(out.data_type(), self.data_type())?;
        let ordinal = out.stream().context().ordinal();
        if ordinal != config.device() {
            return Err(GpuError::Unsupported(format!(
                "the destination is on device {ordinal}, the read on device {}",
                config.device()
            )));
        }
        // `out` is borrowed mutably for the whole read: nothing else writes it meanwhile.
        let output = Output::Into { ptr: out.device_ptr(), len: out.num_bytes() };
        let subsets = std::slice::from_ref(subset);
        let result = contained_read(self, config, |source| {
            Ok(retrieve::<_, DeviceBytes>(self, subsets, Layout::Stacked, source, config, None, output)?.2)
        });
        if matches!(result, Err(GpuError::Timeout { .. } | GpuError::ContextLost { .. })) {
            // Work that writes `out` may still be running: its memory must never be reused.
            out.abandon();
        }
        result
    }

    fn retrieve_chunk_device_opt<O: FromDeviceBytes>(
        &self,
        chunk_indices: &[u64],
        config: &GpuConfig,
    ) -> Result<(O, RetrieveReport), GpuError> {
        let grid = self.chunk_grid_shape();
        if chunk_indices.len() != grid.len() || chunk_indices.iter().zip(grid).any(|(i, n)| i >= n) {
            return Err(zarrs::array::ArrayError::InvalidChunkGridIndicesError(chunk_indices.to_vec()).into());
        }
        let subset = chunk_subset(self, chunk_indices)?;
        contained_read(self, config, |source| retrieve_new(self, &subset, source, config, Some(chunk_indices)))
    }

    fn retrieve_chunks_device<O: FromDeviceBytes>(&self, chunks: &ArraySubset) -> Result<O, GpuError> {
        // zarrs' chunks_subset_bounded multiplies and adds unchecked: the box must lie in the
        // grid, and its chunks' subsets are computed checked.
        if !within(chunks.start(), chunks.shape(), self.chunk_grid_shape()) {
            return Err(zarrs::array::ArrayError::InvalidChunkGridIndicesError(chunks.start().to_vec()).into());
        }
        let subset = match chunks.end_inc() {
            None => ArraySubset::new_empty(chunks.dimensionality()),
            Some(last) => {
                let (first, last) = (chunk_subset(self, chunks.start())?, chunk_subset(self, &last)?);
                let ranges: Vec<_> = first
                    .start()
                    .iter()
                    .zip(last.end_exc())
                    .zip(self.shape())
                    .map(|((&a, b), &n)| a.min(n)..b.min(n))
                    .collect();
                ArraySubset::new_with_ranges(&ranges)
            }
        };
        self.retrieve_array_subset_device(&subset)
    }
}

/// [`contained`], reading from `array`'s store as a read source (`ReadSource::of`: our stores
/// by their own paths, any other through zarrs' storage traits).
fn contained_read<S: ReadableStorageTraits + ?Sized + 'static, R>(
    array: &Array<S>,
    config: &GpuConfig,
    read: impl FnOnce(ReadSource<'_>) -> Result<R, GpuError>,
) -> Result<R, GpuError> {
    let storage = array.storage();
    let handle = StorageHandle::new(storage.clone());
    let source = ReadSource::of(&storage, &handle);
    contained(config, || read(source))
}

/// Run a retrieval on `config`'s device: fail fast when an earlier fault lost the device's
/// context, and record such a loss when this retrieval causes it.
pub(crate) fn contained<R>(config: &GpuConfig, read: impl FnOnce() -> Result<R, GpuError>) -> Result<R, GpuError> {
    // The read binds the device's context on this thread: the caller's comes back after it.
    let _current = CurrentContextGuard::new();
    // Only a device some read has set up can be lost; requests refused on the host (overflowing
    // sizes) never touch the driver.
    if let Some(context) = GpuContext::existing(config.device()) {
        context.check_alive()?;
    }
    // Counted in flight on the device, the first read of a process (which sets it up) too.
    let counted = ReadInFlight::start(config.device());
    let result = read().map_err(|err| match GpuContext::existing(config.device()) {
        Some(context) => context.contain(err),
        None => err,
    });
    drop(counted);
    let context = GpuContext::existing(config.device());
    // What the read leaves idle beyond the bound goes back to the driver: a program that shares
    // the device (PyTorch, CuPy) gets it for its own allocations. Only when no other read is in
    // flight: freeing waits for all of the device's work, a hung batch's too.
    if let Some(context) = context.filter(|c| c.check_alive().is_ok()) {
        let trimmed = context.trim_when_idle(context.keep_for(config));
        if result.is_ok() {
            trimmed?;
        }
    }
    result
}

/// Check `subset` against the array: its end within u64 and (unless it is a whole chunk, which
/// may reach past the array's edge) within the array's shape.
pub(crate) fn check_subset<S: ?Sized>(
    array: &Array<S>,
    subset: &ArraySubset,
    whole_chunk: bool,
) -> Result<(), GpuError> {
    if subset.start().iter().zip(subset.shape()).any(|(&a, &n)| a.checked_add(n).is_none()) {
        // Not InvalidArraySubset: zarrs' Display of such a subset overflows.
        let (start, shape) = (subset.start(), subset.shape());
        return Err(GpuError::Overflow(format!("the subset from {start:?} of shape {shape:?} ends past 2^64")));
    }
    if subset.dimensionality() != array.dimensionality()
        || !(whole_chunk || within(subset.start(), subset.shape(), array.shape()))
    {
        return Err(zarrs::array::ArrayError::InvalidArraySubset(subset.clone(), array.shape().to_vec()).into());
    }
    Ok(())
}

fn retrieve<S: ReadableStorageTraits + ?Sized + 'static, O: FromDeviceBytes>(
    array: &Array<S>,
    subsets: &[ArraySubset],
    layout: Layout,
    source: ReadSource<'_>,
    config: &GpuConfig,
    whole_chunk: Option<&[u64]>,
    output: Output,
) -> Result<(Option<CudaSlice<u8>>, Request, RetrieveReport), GpuError> {
    O::check_data_type(array.data_type())?;
    let elem = element_size(array.data_type())?;
    for subset in subsets {
        check_subset(array, subset, whole_chunk.is_some())?;
    }
    // Pure arithmetic before any CUDA call: a request whose size overflows is refused as such.
    let request = Request::new(subsets, elem, layout)?;
    // A caller's destination must hold the result (an empty one too).
    let destination = output.holding(request.out_bytes)?;
    config.check_cancelled()?;
    if request.out_bytes == 0 {
        let (out, report) = retrieve_empty(config, destination)?;
        return Ok((out, request, report));
    }
    let context = GpuContext::get(config.device())?;
    context.note_keep(context.keep_for(config));
    // A result larger than the device's free memory fails now, before any planning.
    // A caller's destination exists already: only a new output counts against free memory.
    if destination.allocated() > 0 {
        context.check_free(destination.allocated())?;
    }
    let stream = context.new_stream()?;
    // A whole chunk (its full shape, past the array's edge too) is that chunk alone.
    let chunks = match whole_chunk {
        Some(indices) => vec![vec![(indices.to_vec(), array.chunk_key(indices), subsets[0].clone())]],
        None => subsets.iter().map(|subset| chunks_meeting(array, subset)).collect::<Result<_, _>>()?,
    };
    let (out, report) = match read_route(array, config.decode_trust()) {
        Ok((plan, nvcomp)) => {
            let device = OnDevice { context: &context, stream: &stream, nvcomp };
            // A shard replaced between the read of its index and of its inner chunks: planned
            // again once (every unit placed anew), else an error naming it. Only sharded reads
            // are planned from stored bytes, so only they keep their chunks for a second plan.
            let spare = (!plan.shards.is_empty()).then(|| chunks.clone());
            let mut chunks = Some(chunks);
            replanned_once(|| {
                let chunks = chunks.take().or_else(|| spare.clone());
                let chunks =
                    chunks.ok_or_else(|| GpuError::Unsupported("a read of unsharded chunks planned again".into()))?;
                // A chunk met by several subsets is one unit, read and decoded once.
                let (units, index_bytes) = units_of(array, &request, chunks, source, config, context.reader(), &plan)?;
                let (out, mut report) = decode_units(array, &units, source, config, device, &plan.chain, destination)?;
                report.bytes_read += index_bytes;
                Ok((out, report))
            })?
        }
        Err(reason) => {
            let host = HostRead { chunks: &chunks, whole_chunk, host_reason: Some(reason), destination, config };
            retrieve_host(array, &request, &context, &stream, host)?
        }
    };
    Ok((out, request, report))
}

/// An empty selection (numpy's `a[3:3]`) reads no chunk: a new array of no elements (one byte
/// allocated, so that its address is a real one for consumers), or nothing to write.
fn retrieve_empty(
    config: &GpuConfig,
    destination: Destination,
) -> Result<(Option<CudaSlice<u8>>, RetrieveReport), GpuError> {
    let out = match destination.output {
        Output::New => {
            let context = GpuContext::get(config.device())?;
            let stream = context.new_stream()?;
            Some(context.alloc_output(&stream, 0)?.0)
        }
        Output::Into { .. } => None,
    };
    Ok((out, RetrieveReport::new(DecodePath::Device, 0)))
}

/// [`retrieve`] into a new device array of `subset`'s shape.
fn retrieve_new<S: ReadableStorageTraits + ?Sized + 'static, O: FromDeviceBytes>(
    array: &Array<S>,
    subset: &ArraySubset,
    source: ReadSource<'_>,
    config: &GpuConfig,
    whole_chunk: Option<&[u64]>,
) -> Result<(O, RetrieveReport), GpuError> {
    let subsets = std::slice::from_ref(subset);
    let (out, _, report) = retrieve::<_, O>(array, subsets, Layout::Stacked, source, config, whole_chunk, Output::New)?;
    let out = out.ok_or_else(|| GpuError::Unsupported("no output was allocated".into()))?;
    // SAFETY: every byte of `out` was written by the pipeline, synchronized on its stream.
    let device = unsafe { DeviceBytes::from_cuda_slice(out, subset.shape().to_vec(), array.data_type().clone()) }?;
    Ok((O::from_device_bytes(device)?, report))
}

/// [`retrieve`] of `subsets` as one request, into one new device array of shape
/// `(n, *shape)`: the subsets must share their shape.
fn retrieve_stacked<S: ReadableStorageTraits + ?Sized + 'static, O: FromDeviceBytes>(
    array: &Array<S>,
    subsets: &[ArraySubset],
    source: ReadSource<'_>,
    config: &GpuConfig,
) -> Result<(O, RetrieveReport), GpuError> {
    let shape = stacked_shape(array, subsets)?;
    let (out, _, report) = retrieve::<_, O>(array, subsets, Layout::Stacked, source, config, None, Output::New)?;
    let out = out.ok_or_else(|| GpuError::Unsupported("no output was allocated".into()))?;
    // SAFETY: every byte of `out` was written by the pipeline, synchronized on its stream.
    let device = unsafe { DeviceBytes::from_cuda_slice(out, shape, array.data_type().clone()) }?;
    Ok((O::from_device_bytes(device)?, report))
}

/// The shape of `subsets` stacked: `(n, *shape)`, where they share `shape`.
fn stacked_shape<S: ?Sized>(array: &Array<S>, subsets: &[ArraySubset]) -> Result<Vec<u64>, GpuError> {
    let shape = subsets.first().map_or_else(|| vec![0; array.dimensionality()], |s| s.shape().to_vec());
    if let Some((i, other)) = subsets.iter().enumerate().find(|(_, s)| s.shape() != shape.as_slice()) {
        return Err(GpuError::Unsupported(format!(
            "stacked subsets share their shape: subset 0 has shape {shape:?}, subset {i} {:?}",
            other.shape()
        )));
    }
    Ok(std::iter::once(subsets.len() as u64).chain(shape).collect())
}

/// [`retrieve`] of `subsets` as one request, one new device array each: views of one buffer,
/// which goes back to the pool once the last of them is dropped.
fn retrieve_many<S: ReadableStorageTraits + ?Sized + 'static, O: FromDeviceBytes>(
    array: &Array<S>,
    subsets: &[ArraySubset],
    source: ReadSource<'_>,
    config: &GpuConfig,
) -> Result<(Vec<O>, RetrieveReport), GpuError> {
    if subsets.is_empty() {
        return Ok((Vec::new(), RetrieveReport::new(DecodePath::Device, 0)));
    }
    let (out, request, report) = retrieve::<_, O>(array, subsets, Layout::Aligned, source, config, None, Output::New)?;
    let out = out.ok_or_else(|| GpuError::Unsupported("no output was allocated".into()))?;
    let views: Vec<(u64, Vec<u64>)> =
        request.bases.iter().zip(subsets).map(|(&base, subset)| (base, subset.shape().to_vec())).collect();
    // SAFETY: every byte of each view was written by the pipeline, synchronized on its stream.
    let arrays = unsafe { DeviceBytes::views_of(out, &views, array.data_type()) }?;
    Ok((arrays.into_iter().map(O::from_device_bytes).collect::<Result<_, _>>()?, report))
}

/// What the host route reads and where its result goes.
struct HostRead<'a> {
    /// Each subset's chunks.
    chunks: &'a [Vec<ChunkRef>],
    whole_chunk: Option<&'a [u64]>,
    host_reason: Option<String>,
    destination: Destination,
    /// Whose cancel switch is looked at before the output is written.
    config: &'a GpuConfig,
}

/// Host decode by zarrs into pinned memory from the pool (each subset at its base), then one
/// copy.
fn retrieve_host<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    request: &Request,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    read: HostRead<'_>,
) -> Result<(Option<CudaSlice<u8>>, RetrieveReport), GpuError> {
    let HostRead { chunks, whole_chunk, host_reason, destination, config } = read;
    let out_bytes = request.out_bytes;
    // zarrs decodes whole chunks on the host: a chunk shape that overflows, or one larger than
    // the device could ever take, is refused rather than handed to zarrs' allocations.
    let elem = array.data_type().fixed_size().expect("checked before the read (element_size)") as u64;
    let mut largest = 0u64;
    for (_, key, chunk) in chunks.iter().flatten() {
        let bytes = checked_bytes(chunk.shape(), elem)
            .ok_or_else(|| GpuError::bytes_overflow(&format!("chunk {key} of shape"), chunk.shape(), elem))?;
        largest = largest.max(bytes);
    }
    context.check_free(destination.allocated().saturating_add(largest))?;
    let len = out_bytes as usize;
    let mut pinned = context.take_pinned(len)?;
    if let Some(chunk_indices) = whole_chunk {
        // The full stored chunk, as zarrs' retrieve_chunk decodes it.
        let bytes = array.retrieve_chunk::<zarrs::array::ArrayBytes<'static>>(chunk_indices)?;
        let bytes = bytes.into_fixed().map_err(|e| GpuError::Array(zarrs::array::ArrayError::Other(e.to_string())))?;
        if bytes.len() != len {
            let reason = format!("zarrs decoded {} bytes, {len} expected", bytes.len());
            return Err(GpuError::Array(zarrs::array::ArrayError::Other(reason)));
        }
        pinned.as_mut_slice()[..len].copy_from_slice(&bytes);
    } else {
        let elem = elem as usize;
        for ((subset, base), &part_len) in request.parts().zip(&request.lens) {
            if part_len == 0 {
                continue; // an empty selection (zarrs' view of no elements is an error)
            }
            let part = &mut pinned.as_mut_slice()[base as usize..(base + part_len) as usize];
            let bytes = unsafe_cell_slice::UnsafeCellSlice::new(part);
            let shape = subset.shape().to_vec();
            // SAFETY: the view covers the whole part; nothing else writes it meanwhile.
            let mut view = unsafe {
                ArrayBytesFixedDisjointView::new(bytes, elem, &shape, ArraySubset::new_with_shape(shape.clone()))
            }
            .map_err(|e| GpuError::Array(e.into()))?;
            array.retrieve_array_subset_into(subset, ArrayBytesDecodeIntoTarget::Fixed(&mut view))?;
        }
    }
    if let Err(cancelled) = config.check_cancelled() {
        context.give_pinned(pinned);
        return Err(cancelled);
    }
    let out = match destination.output {
        Output::New => {
            let mut out = context.alloc(stream, len)?;
            stream.memcpy_htod(&pinned.as_slice()[..len], &mut out).map_err(GpuError::cuda("copying to the device"))?;
            Some(out)
        }
        Output::Into { ptr, .. } => {
            stream.context().bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
            // SAFETY: the caller's destination of `len` bytes, on this context, its earlier work
            // done; the pinned source stays untouched until the synchronize below.
            unsafe { cudarc::driver::result::memcpy_htod_async(ptr, &pinned.as_slice()[..len], stream.cu_stream()) }
                .map_err(GpuError::cuda("copying to the device"))?;
            None
        }
    };
    stream.synchronize().map_err(GpuError::cuda("waiting for the copy to the device"))?;
    context.give_pinned(pinned);
    let peak_device_bytes = if out.is_some() { len as u64 } else { 0 };
    let count = chunks.iter().map(Vec::len).sum();
    Ok((out, RetrieveReport { host_reason, peak_device_bytes, ..RetrieveReport::new(DecodePath::Host, count) }))
}
