//! The device retrieval pipeline: plan, fetch into device staging (or straight into the output),
//! place with strided device copies, fill missing chunks; or, for codec chains with no device
//! implementation yet, decode on the host into pinned memory and copy once.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use zarrs::array::codec::TransposeCodecConfiguration;
use zarrs::array::{
    Array, ArrayBytesDecodeIntoTarget, ArrayBytesFixedDisjointView, ArrayMetadata, ArraySubset, CodecMetadataOptions,
    ElementOwned,
};
use zarrs::plugin::ExtensionName;
use zarrs_gds_store::{read_store_to_device, DeviceReadRequest, GdsStore, IoStatus};
use zarrs_storage::ReadableStorageTraits;

use crate::context::{copy_dtod, fill_pattern, DeviceBuffer, GpuContext};
use crate::device_array::check_element;
use crate::place::GATHER_DIMS;
use crate::plan::{checked_bytes, plan_chunks, ChunkPlacement};
use crate::shard::ShardLevel;
use crate::trace::Trace;
use crate::{gpu_config, DecodeTrust, DeviceArray, GpuConfig, GpuError};

/// Where a read's chunks were decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodePath {
    /// Chunk bytes went from storage to the device and were placed there (codec chain `bytes`).
    Device,
    /// Decoded by zarrs on the host into pinned memory, then copied to the device once.
    Host,
}

impl std::fmt::Display for DecodePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Device => "device",
            Self::Host => "host decode + one copy",
        })
    }
}

/// What a device retrieval did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetrieveReport {
    /// Where the chunks were decoded.
    pub decode: DecodePath,
    /// The I/O path of the device reads (None when zarrs read on the host).
    pub io: Option<IoStatus>,
    /// Chunks that met the subset.
    pub chunks: usize,
    /// Of those, chunks that do not exist (filled with the fill value).
    pub missing_chunks: usize,
    /// Bytes read from storage (stored bytes: compressed for compressed chunks).
    pub bytes_read: u64,
    /// Chunks decoded on host threads beside the device (large frames, frames nvCOMP cannot take).
    pub host_decoded_chunks: usize,
    /// Why zarrs decoded the whole read on the host, when it did.
    pub host_reason: Option<String>,
}

/// The codecs of a chunk the device pipeline decodes: an optional transpose, the `bytes` codec
/// in either byte order, then zstd or gzip, and crc32c.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceChain {
    /// The compression nvCOMP decodes, if any.
    pub(crate) compression: Option<Compression>,
    /// crc32c after everything else (nvCOMP CRC32C).
    pub(crate) crc32c: bool,
    /// Bytes per word to reverse when the stored byte order is not the platform's (a complex
    /// number's parts are swapped one by one); 0 when nothing is swapped.
    pub(crate) swap: u64,
    /// The transpose codec's order: a chunk is stored as its C-order transpose by this
    /// permutation (v2 order F is the reversal).
    pub(crate) transpose: Option<Vec<usize>>,
}

/// A bytes-to-bytes compression codec nvCOMP decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    /// `zstd`: one frame per chunk, checked block by block on the host first.
    Zstd,
    /// `gzip`: one plain member per chunk, its CRC-32 checked on the device after decoding (to
    /// nvCOMP only when verified by `crc32c` first or trusted: see [`crate::DecodeTrust`]).
    Gzip,
}

impl Compression {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Gzip => "gzip",
        }
    }

    /// nvCOMP's decompressor. gzip: the naive algorithm, which takes members at any byte (the
    /// look-ahead one wants 4-byte aligned input and decoded 4096 members of 1 MiB at 0.9 GiB/s
    /// on the H200, the naive one at 16).
    pub(crate) fn decompressor(self) -> nvcomp_sys::Decompressor {
        match self {
            Self::Zstd => nvcomp_sys::Decompressor::Zstd,
            Self::Gzip => nvcomp_sys::Decompressor::Gzip { lookahead: false },
        }
    }
}

impl DeviceChain {
    /// Chunk bytes are the elements in C order: copied as they are.
    pub(crate) fn is_raw(&self) -> bool {
        !self.needs_nvcomp() && !self.needs_gather()
    }

    /// Compression or crc32c: nvCOMP runs.
    pub(crate) fn needs_nvcomp(&self) -> bool {
        self.compression.is_some() || self.crc32c
    }

    /// Whether nvCOMP may decode this chain's chunks under `trust` (checked ones; the rest decode
    /// on host threads): crc32c verifies them before decoding, or the trust allows the rest.
    pub(crate) fn nvcomp_may_decode(&self, trust: DecodeTrust) -> bool {
        match self.compression {
            None => false,
            Some(_) if self.crc32c => true,
            Some(Compression::Zstd) => trust != DecodeTrust::Verified,
            Some(Compression::Gzip) => trust == DecodeTrust::Trusted,
        }
    }

    /// Elements are placed one by one (transposed or byte-swapped), not by strided copies.
    pub(crate) fn needs_gather(&self) -> bool {
        self.swap > 1 || self.transpose.is_some()
    }
}

impl RetrieveReport {
    /// A report of `chunks` chunks before anything was read.
    pub(crate) fn new(decode: DecodePath, chunks: usize) -> Self {
        Self { decode, io: None, chunks, missing_chunks: 0, bytes_read: 0, host_decoded_chunks: 0, host_reason: None }
    }
}

/// How the device reads an array: the sharding levels to open (outermost first, none for
/// unsharded arrays) and the codecs of the innermost chunks.
#[derive(Clone, Debug)]
pub(crate) struct DevicePlan {
    pub(crate) shards: Vec<ShardLevel>,
    pub(crate) chain: DeviceChain,
}

/// The device plan of an array's codecs, or why it decodes on the host.
pub(crate) fn device_plan<S: ?Sized>(array: &Array<S>) -> Result<DevicePlan, String> {
    if let ArrayMetadata::V3(metadata) = array.metadata() {
        if !metadata.storage_transformers.is_empty() {
            return Err("storage transformers are read on the host".into());
        }
    }
    let Some(size) = array.data_type().fixed_size() else {
        return Err(format!("data type {} has no fixed size", array.data_type()));
    };
    let mut shards = Vec::new();
    let mut codecs = array.codecs();
    loop {
        let a2a = codecs.array_to_array_codecs();
        let transpose = match a2a {
            [] => None,
            [codec] if name(codec.as_ref()) == "transpose" => {
                let configuration: TransposeCodecConfiguration = codec
                    .configuration_v3(&CodecMetadataOptions::default())
                    .ok_or("transpose without a configuration")?
                    .to_typed()
                    .map_err(|e| format!("transpose configuration: {e}"))?;
                let TransposeCodecConfiguration::V1(c) = configuration else {
                    return Err("this transpose configuration version is not supported".into());
                };
                // zarrs opens an order of another length than the array's dimensionality (and
                // refuses it when decoding): the gather kernel must never index by it.
                if c.order.0.len() != array.dimensionality() {
                    return Err(format!(
                        "transpose order {:?} does not fit {} dimensions",
                        c.order.0,
                        array.dimensionality()
                    ));
                }
                if c.order.0.len() > GATHER_DIMS {
                    return Err(format!("transposes of more than {GATHER_DIMS} dimensions are done on the host"));
                }
                Some(c.order.0)
            }
            _ => {
                let names: Vec<String> = a2a.iter().map(|c| name(c.as_ref())).collect();
                return Err(format!("array-to-array codecs [{}] have no device implementation yet", names.join(", ")));
            }
        };
        let a2b = codecs.array_to_bytes_codec();
        let names: Vec<String> = codecs.bytes_to_bytes_codecs().iter().map(|c| name(c.as_ref())).collect();
        match name(a2b.as_ref()).as_str() {
            "sharding_indexed" => {
                if !names.is_empty() || transpose.is_some() {
                    return Err("codecs over whole shards (before or after sharding) run on the host".into());
                }
                let configuration = a2b
                    .configuration_v3(&CodecMetadataOptions::default())
                    .ok_or("sharding_indexed without a configuration")?
                    .to_typed()
                    .map_err(|e| format!("sharding_indexed configuration: {e}"))?;
                let (level, inner) = ShardLevel::new(&configuration)?;
                shards.push(level);
                codecs = Arc::new(inner);
            }
            "bytes" => {
                let big = a2b
                    .configuration_v3(&CodecMetadataOptions::default())
                    .and_then(|c| c.get("endian").and_then(|e| e.as_str().map(|e| e == "big")))
                    .unwrap_or(false);
                // A complex number's byte order applies to each of its two parts.
                let word = if array.data_type().to_string().starts_with("complex") { size / 2 } else { size };
                let swap = if size > 1 && (big == cfg!(target_endian = "little")) { word as u64 } else { 0 };
                if swap > 0 && array.dimensionality() > GATHER_DIMS {
                    return Err(format!("byte swaps of more than {GATHER_DIMS} dimensions are done on the host"));
                }
                let compression = |name: &str| match name {
                    "zstd" => Some(Compression::Zstd),
                    "gzip" => Some(Compression::Gzip),
                    _ => None,
                };
                let (compression, crc32c) = match names.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
                    [] => (None, false),
                    ["crc32c"] => (None, true),
                    [c] if compression(c).is_some() => (compression(c), false),
                    [c, "crc32c"] if compression(c).is_some() => (compression(c), true),
                    _ => {
                        return Err(format!(
                            "bytes-to-bytes codecs [{}] have no device implementation yet",
                            names.join(", ")
                        ))
                    }
                };
                return Ok(DevicePlan { shards, chain: DeviceChain { compression, crc32c, swap, transpose } });
            }
            other => return Err(format!("array-to-bytes codec {other} has no device implementation yet")),
        }
    }
}

/// Why an array's chunks cannot be read and decoded on the device, or None when they can.
#[must_use]
pub fn host_decode_reason<S: ?Sized>(array: &Array<S>) -> Option<String> {
    device_plan(array).err()
}

/// A chunk meeting a subset: its grid indices, key and (unbounded) subset.
pub(crate) type ChunkRef = (Vec<u64>, zarrs_storage::StoreKey, ArraySubset);

/// Every chunk meeting `subset` (which lies within the array, or is one whole chunk). Costs what
/// the chunks meeting it cost, never the whole grid.
pub(crate) fn chunks_meeting<S: ?Sized>(array: &Array<S>, subset: &ArraySubset) -> Result<Vec<ChunkRef>, GpuError> {
    let grid = array.chunks_in_array_subset(subset).map_err(|e| GpuError::Array(e.into()))?;
    let Some(grid) = grid else { return Ok(Vec::new()) };
    // zarrs' index iterator multiplies the extents unchecked. Each chunk meeting a subset holds
    // at least one of its elements, so for a subset whose bytes fit this cannot overflow.
    if grid.shape().iter().try_fold(1u64, |acc, &n| acc.checked_mul(n)).is_none() {
        return Err(GpuError::Overflow(format!("the subset meets more than 2^64 chunks ({:?})", grid.shape())));
    }
    grid.indices()
        .into_iter()
        .map(|indices| Ok((indices.to_vec(), array.chunk_key(&indices), chunk_subset(array, &indices)?)))
        .collect()
}

/// The (unbounded) subset of the chunk at `indices` (within the grid), its end checked: zarrs'
/// `chunk_subset` adds unchecked, and the last chunk of a grid may end past 2^64.
pub(crate) fn chunk_subset<S: ?Sized>(array: &Array<S>, indices: &[u64]) -> Result<ArraySubset, GpuError> {
    let origin = array.chunk_origin(indices)?;
    let shape: Vec<u64> = array.chunk_shape(indices)?.iter().map(|n| n.get()).collect();
    if origin.iter().zip(&shape).any(|(&o, &n)| o.checked_add(n).is_none()) {
        return Err(GpuError::Overflow(format!("chunk {indices:?} at {origin:?} of shape {shape:?} ends past 2^64")));
    }
    ArraySubset::new_with_start_shape(origin, shape).map_err(|e| GpuError::Array(e.into()))
}

/// Whether `indices` (a box of `shape` from `start`) lies within `bound`, checked: zarrs'
/// `inbounds_shape` adds unchecked.
fn within(start: &[u64], shape: &[u64], bound: &[u64]) -> bool {
    start.len() == bound.len()
        && shape.len() == bound.len()
        && start.iter().zip(shape).zip(bound).all(|((&a, &n), &b)| a.checked_add(n).is_some_and(|end| end <= b))
}

fn name(codec: &dyn ExtensionName) -> String {
    codec.name_v3().map_or_else(|| "(unnamed)".to_string(), |n| n.to_string())
}

/// Device retrieval for zarrs arrays: results land in CUDA device memory as [`DeviceArray`]s.
///
/// Uses the GPU mode in force ([`with_gpu_config`](crate::with_gpu_config)), else the default
/// [`GpuConfig`]. Arrays on a [`GdsStore`] are read with GPUDirect Storage or its pread fallback;
/// other stores are staged through pinned memory.
pub trait ArrayDeviceExt {
    /// Retrieve `subset` of the array into device memory, and say how.
    ///
    /// # Errors
    /// Returns an error when the subset is out of bounds, `T` is not the array's element type,
    /// storage or decoding fails, or there is no usable CUDA device.
    fn retrieve_array_subset_device_opt<T: ElementOwned>(
        &self,
        subset: &ArraySubset,
        config: &GpuConfig,
    ) -> Result<(DeviceArray<T>, RetrieveReport), GpuError>;

    /// Retrieve `subset` of the array into device memory.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`].
    fn retrieve_array_subset_device<T: ElementOwned>(&self, subset: &ArraySubset) -> Result<DeviceArray<T>, GpuError> {
        Ok(self.retrieve_array_subset_device_opt(subset, &gpu_config().unwrap_or_default())?.0)
    }

    /// Retrieve the chunk at `chunk_indices` into device memory: its full shape as stored, like
    /// zarrs' `retrieve_chunk` (an edge chunk includes the part beyond the array's shape).
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`], and for invalid chunk indices.
    fn retrieve_chunk_device<T: ElementOwned>(&self, chunk_indices: &[u64]) -> Result<DeviceArray<T>, GpuError>;

    /// Retrieve the region of the array that the chunks in `chunks` (a subset of the chunk grid)
    /// cover, bounded by the array's shape, into device memory.
    ///
    /// # Errors
    /// As [`Self::retrieve_array_subset_device_opt`], and for invalid chunk indices.
    fn retrieve_chunks_device<T: ElementOwned>(&self, chunks: &ArraySubset) -> Result<DeviceArray<T>, GpuError>;
}

macro_rules! impl_array_device_ext {
    ($gds:expr) => {
        fn retrieve_array_subset_device_opt<T: ElementOwned>(
            &self,
            subset: &ArraySubset,
            config: &GpuConfig,
        ) -> Result<(DeviceArray<T>, RetrieveReport), GpuError> {
            let storage = self.storage();
            let gds: Option<&GdsStore> = ($gds)(&storage);
            contained(config, || retrieve(self, subset, gds, config, false))
        }

        fn retrieve_chunk_device<T: ElementOwned>(&self, chunk_indices: &[u64]) -> Result<DeviceArray<T>, GpuError> {
            let grid = self.chunk_grid_shape();
            if chunk_indices.len() != grid.len() || chunk_indices.iter().zip(grid).any(|(i, n)| i >= n) {
                return Err(zarrs::array::ArrayError::InvalidChunkGridIndicesError(chunk_indices.to_vec()).into());
            }
            let subset = chunk_subset(self, chunk_indices)?;
            let storage = self.storage();
            let gds: Option<&GdsStore> = ($gds)(&storage);
            let config = gpu_config().unwrap_or_default();
            Ok(contained(&config, || retrieve(self, &subset, gds, &config, true))?.0)
        }

        fn retrieve_chunks_device<T: ElementOwned>(&self, chunks: &ArraySubset) -> Result<DeviceArray<T>, GpuError> {
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
    };
}

/// Run a retrieval on `config`'s device: fail fast when an earlier fault lost the device's
/// context, and record such a loss when this retrieval causes it.
fn contained<R>(config: &GpuConfig, read: impl FnOnce() -> Result<R, GpuError>) -> Result<R, GpuError> {
    // Only a device some read has set up can be lost; requests refused on the host (overflowing
    // sizes) never touch the driver.
    if let Some(context) = GpuContext::existing(config.device()) {
        context.check_alive()?;
    }
    read().map_err(|err| match GpuContext::existing(config.device()) {
        Some(context) => context.contain(err),
        None => err,
    })
}

fn as_gds<S: 'static>(storage: &Arc<S>) -> Option<&GdsStore> {
    (storage.as_ref() as &dyn Any).downcast_ref::<GdsStore>()
}

fn not_gds(_: &Arc<dyn ReadableStorageTraits>) -> Option<&GdsStore> {
    None
}

impl<S: ReadableStorageTraits + 'static> ArrayDeviceExt for Array<S> {
    impl_array_device_ext!(as_gds::<S>);
}

/// Type-erased storage is staged through pinned memory: a `GdsStore` behind `dyn` is not
/// recognised (keep the concrete `Array<GdsStore>` for GPUDirect reads).
impl ArrayDeviceExt for Array<dyn ReadableStorageTraits> {
    impl_array_device_ext!(not_gds);
}

fn retrieve<S: ReadableStorageTraits + ?Sized + 'static, T: ElementOwned>(
    array: &Array<S>,
    subset: &ArraySubset,
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    whole_chunk: bool,
) -> Result<(DeviceArray<T>, RetrieveReport), GpuError> {
    check_element::<T>(array.data_type())?;
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
    // Pure arithmetic before any CUDA call: a request whose size overflows is refused as such.
    let elem = std::mem::size_of::<T>() as u64;
    let out_bytes = checked_bytes(subset.shape(), elem)
        .ok_or_else(|| GpuError::bytes_overflow("the subset of shape", subset.shape(), elem))?;
    let context = GpuContext::get(config.device())?;
    // A result larger than the device's free memory fails now, before any planning.
    context.check_free(out_bytes)?;
    let stream = context.new_stream()?;
    let chunks = chunks_meeting(array, subset)?;
    let route = device_plan(array).and_then(|plan| {
        if !plan.chain.needs_nvcomp() {
            return Ok((plan, None));
        }
        nvcomp_sys::NvcompLibrary::get().map(|lib| (plan, Some(lib))).map_err(|e| e.to_string())
    });
    let (out, report) = match route {
        Ok((plan, None)) if plan.shards.is_empty() && plan.chain.is_raw() => {
            retrieve_raw(array, subset, chunks, gds, config, &context, &stream, out_bytes)?
        }
        Ok((plan, nvcomp)) if !whole_chunk => {
            crate::decode::retrieve_decoded(array, subset, chunks, gds, config, &context, &stream, &plan, nvcomp)?
        }
        Ok(_) => retrieve_host(array, subset, &chunks, &context, &stream, out_bytes, whole_chunk, None)?,
        Err(reason) => retrieve_host(array, subset, &chunks, &context, &stream, out_bytes, whole_chunk, Some(reason))?,
    };
    // SAFETY: every byte of `out` was written by the pipeline, synchronized on `stream`.
    let device = unsafe { DeviceArray::from_device_bytes(out, subset.shape().to_vec(), array.data_type().clone()) }?;
    Ok((device, report))
}

/// Host decode by zarrs into pinned memory from the pool, then one copy.
#[allow(clippy::too_many_arguments)]
fn retrieve_host<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    chunks: &[ChunkRef],
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    out_bytes: u64,
    whole_chunk: bool,
    host_reason: Option<String>,
) -> Result<(CudaSlice<u8>, RetrieveReport), GpuError> {
    // zarrs decodes whole chunks on the host: a chunk shape that overflows, or one larger than
    // the device could ever take, is refused rather than handed to zarrs' allocations.
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
    let mut largest = 0u64;
    for (_, key, chunk) in chunks {
        let bytes = checked_bytes(chunk.shape(), elem)
            .ok_or_else(|| GpuError::bytes_overflow(&format!("chunk {key} of shape"), chunk.shape(), elem))?;
        largest = largest.max(bytes);
    }
    context.check_free(out_bytes.saturating_add(largest))?;
    let len = out_bytes as usize;
    let mut pinned = context.take_pinned(len)?;
    if whole_chunk {
        // The full stored chunk, as zarrs' retrieve_chunk decodes it.
        let chunk_indices: Vec<u64> = subset.start().iter().zip(subset.shape()).map(|(s, n)| s / n).collect();
        let bytes = array.retrieve_chunk::<zarrs::array::ArrayBytes<'static>>(&chunk_indices)?;
        let bytes = bytes.into_fixed().map_err(|e| GpuError::Array(zarrs::array::ArrayError::Other(e.to_string())))?;
        if bytes.len() != len {
            let reason = format!("zarrs decoded {} bytes, {len} expected", bytes.len());
            return Err(GpuError::Array(zarrs::array::ArrayError::Other(reason)));
        }
        pinned.as_mut_slice()[..len].copy_from_slice(&bytes);
    } else {
        let bytes = unsafe_cell_slice::UnsafeCellSlice::new(&mut pinned.as_mut_slice()[..len]);
        let shape = subset.shape().to_vec();
        let elem = array.data_type().fixed_size().expect("checked by check_element");
        // SAFETY: the view covers the whole buffer; nothing else writes it meanwhile.
        let mut view = unsafe {
            ArrayBytesFixedDisjointView::new(bytes, elem, &shape, ArraySubset::new_with_shape(shape.clone()))
        }
        .map_err(|e| GpuError::Array(e.into()))?;
        array.retrieve_array_subset_into(subset, ArrayBytesDecodeIntoTarget::Fixed(&mut view))?;
    }
    let mut out = context.alloc(stream, len)?;
    stream.memcpy_htod(&pinned.as_slice()[..len], &mut out).map_err(GpuError::cuda("copying to the device"))?;
    stream.synchronize().map_err(GpuError::cuda("waiting for the copy to the device"))?;
    context.give_pinned(pinned);
    Ok((out, RetrieveReport { host_reason, ..RetrieveReport::new(DecodePath::Host, chunks.len()) }))
}

/// Offsets in staging are aligned so cuFile and the copy engines get aligned addresses.
const STAGING_ALIGN: u64 = 4096;

struct Batch {
    /// Placements of this batch (indices into the plan).
    items: Vec<usize>,
    /// Staging offset per item (None: read straight into the output).
    staging: Vec<Option<u64>>,
    staging_bytes: u64,
}

fn make_batches(placements: &[ChunkPlacement], budget: u64) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut current = Batch { items: Vec::new(), staging: Vec::new(), staging_bytes: 0 };
    for (i, p) in placements.iter().enumerate() {
        let staged = !p.is_direct();
        // Saturating: a read near 2^64 bytes stays larger than any budget and any free memory.
        let need = if staged { p.read_len().checked_next_multiple_of(STAGING_ALIGN).unwrap_or(u64::MAX) } else { 0 };
        if !current.items.is_empty() && current.staging_bytes.saturating_add(need) > budget {
            batches.push(std::mem::replace(
                &mut current,
                Batch { items: Vec::new(), staging: Vec::new(), staging_bytes: 0 },
            ));
        }
        current.items.push(i);
        current.staging.push(staged.then_some(current.staging_bytes));
        current.staging_bytes = current.staging_bytes.saturating_add(need);
    }
    if !current.items.is_empty() {
        batches.push(current);
    }
    batches
}

/// Codec chain `bytes`: chunk bytes go from storage to device staging (or straight into the
/// output) and are placed with device copies; two staging buffers alternate so placement of one
/// batch overlaps the reads of the next.
#[allow(clippy::too_many_arguments)]
fn retrieve_raw<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    chunks: Vec<ChunkRef>,
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    out_bytes: u64,
) -> Result<(CudaSlice<u8>, RetrieveReport), GpuError> {
    let mut trace = Trace::new();
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
    let placements = plan_chunks(elem, subset, chunks)?;
    let batches = make_batches(&placements, config.staging_bytes() as u64);
    let max_staging = batches.iter().map(|b| b.staging_bytes).max().unwrap_or(0);
    let buffers_needed = if batches.len() > 1 { 2 } else { 1 };
    // The fill block covers the largest read (a missing chunk is placed from it).
    let fill_len = placements.iter().map(ChunkPlacement::read_len).max().unwrap_or(0);
    // Saturating: a sum past 2^64 is more than any device has free, and refused as such.
    context.check_free(out_bytes.saturating_add(max_staging.saturating_mul(buffers_needed)))?;
    trace.mark("plan");

    let (out, out_ptr) = context.alloc_output(stream, out_bytes as usize)?;
    trace.mark("alloc output");

    let mut staging: Vec<(DeviceBuffer, Option<CudaEvent>)> = Vec::new();
    for _ in 0..buffers_needed.min(batches.len() as u64) {
        staging.push((context.take_staging(max_staging.max(1) as usize)?, None));
    }
    trace.mark("staging");
    let mut fill: Option<DeviceBuffer> = None;
    let mut report = RetrieveReport::new(DecodePath::Device, placements.len());
    let result = (|| -> Result<(), GpuError> {
        for (b, batch) in batches.iter().enumerate() {
            let (buffer, event) = &mut staging[b % buffers_needed as usize];
            if let Some(event) = event.take() {
                event.synchronize().map_err(GpuError::cuda("waiting for placement copies"))?;
                trace.mark("wait staging");
            }
            let requests: Vec<DeviceReadRequest> = batch
                .items
                .iter()
                .zip(&batch.staging)
                .map(|(&i, staged)| {
                    let p = &placements[i];
                    let dst = match staged {
                        Some(offset) => buffer.ptr() + offset,
                        None => out_ptr + p.direct_output_offset(),
                    };
                    // The stored chunk is its elements: of any other size it is not this chunk.
                    let value_len = Some(p.chunk_bytes);
                    DeviceReadRequest {
                        key: p.key.clone(),
                        offset: p.byte_start,
                        len: p.read_len() as usize,
                        dst,
                        value_len,
                    }
                })
                .collect();
            // SAFETY: staging offsets lie within the buffer (sized for the largest batch) and do
            // not overlap; direct reads land on disjoint runs of `out`, which is allocated.
            let outcome = unsafe {
                match gds {
                    Some(store) => {
                        store.read_to_device(context.reader(), &requests, Some(config.backend()), Some(stream))
                    }
                    None => read_store_to_device(array.storage().as_ref(), context.reader(), &requests, Some(stream)),
                }
            }?;
            trace.mark("read");
            report.io = Some(outcome.status);
            for ((&i, staged), found) in batch.items.iter().zip(&batch.staging).zip(&outcome.found) {
                let p = &placements[i];
                let src = if *found {
                    report.bytes_read += p.read_len();
                    match staged {
                        Some(offset) => buffer.ptr() + offset,
                        None => continue,
                    }
                } else {
                    report.missing_chunks += 1;
                    fill_source(&mut fill, context, array, fill_len, stream)?
                };
                for copy in &p.copies {
                    // SAFETY: the copy reads within the bytes read (or the fill block, sized for
                    // the largest read) and writes within `out` (planned from the subset).
                    unsafe { copy_dtod(copy, src, out_ptr, stream) }?;
                }
            }
            *event = Some(stream.record_event(None).map_err(GpuError::cuda("recording an event"))?);
            trace.mark("place");
        }
        let synced = stream.synchronize().map_err(GpuError::cuda("placing chunk data on the device"));
        trace.mark("final sync");
        synced
    })();
    // Buffers go back to the pools only once nothing uses them.
    let synced = stream.synchronize();
    if synced.is_ok() {
        for (buffer, _) in staging {
            context.give_staging(buffer);
        }
        if let Some(buffer) = fill {
            context.give_staging(buffer);
        }
    }
    result?;
    trace.finish(&format!("{} bytes, {} chunks, {} batches", out_bytes, report.chunks, batches.len()));
    Ok((out, report))
}

/// A device block holding the fill value repeated over the largest read, made on first need.
pub(crate) fn fill_source<S: ?Sized>(
    fill: &mut Option<DeviceBuffer>,
    context: &GpuContext,
    array: &Array<S>,
    len: u64,
    stream: &CudaStream,
) -> Result<u64, GpuError> {
    if let Some(buffer) = fill {
        return Ok(buffer.ptr());
    }
    let len = len as usize;
    let buffer = context.take_staging(len)?;
    let pattern = array.fill_value().as_ne_bytes();
    // SAFETY: the buffer holds at least len bytes, len is a whole number of elements.
    unsafe { fill_pattern(pattern, buffer.ptr(), len, stream) }?;
    Ok(fill.insert(buffer).ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_trust_decides_what_nvcomp_decodes() {
        let chain = |compression, crc32c| DeviceChain { compression, crc32c, ..DeviceChain::default() };
        let (zstd, gzip) = (Some(Compression::Zstd), Some(Compression::Gzip));
        let all = [DecodeTrust::Verified, DecodeTrust::Checked, DecodeTrust::Trusted];
        for trust in all {
            // crc32c verifies before decoding: always; nothing to decode: never.
            assert!(chain(zstd, true).nvcomp_may_decode(trust) && chain(gzip, true).nvcomp_may_decode(trust));
            assert!(!chain(None, true).nvcomp_may_decode(trust) && !chain(None, false).nvcomp_may_decode(trust));
        }
        let zstd_alone: Vec<bool> = all.iter().map(|&t| chain(zstd, false).nvcomp_may_decode(t)).collect();
        let gzip_alone: Vec<bool> = all.iter().map(|&t| chain(gzip, false).nvcomp_may_decode(t)).collect();
        assert_eq!(zstd_alone, [false, true, true]);
        assert_eq!(gzip_alone, [false, false, true]);
    }
}
