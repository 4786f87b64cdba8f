//! Device-side retrieval of Zarr arrays for [zarrs](https://docs.rs/zarrs): chunk bytes go from
//! storage into CUDA device memory and are decoded and placed there.
//!
//! - [`DeviceArray`]: a typed device buffer with its shape.
//! - [`ArrayDeviceExt`]: `retrieve_array_subset_device`, `retrieve_chunk_device` and
//!   `retrieve_chunks_device` on any `zarrs::array::Array`.
//! - [`ReadAhead`] over [`tile_subsets`], and [`read_async`]: reads kept in flight on a background
//!   thread while the caller uses earlier results.
//! - GPU mode: [`with_gpu_config`] scopes a [`GpuConfig`]; inside it zarrs' own generic retrieval
//!   into [`DeviceArray`] (`array.retrieve_array_subset::<DeviceArray<f32>>(&subset)`) lands on that
//!   device.
//! - [`ArrayDeviceWriteExt`]: `store_array_subset_device` and `store_chunk_device`, device arrays
//!   written back, their chunks (or shards) assembled and encoded on the device.
//!
//! Arrays whose codec chain is only `bytes` (Zarr v3) or have no compressor and no filters (Zarr
//! v2) are read straight to the device and placed there (partial edge chunks, missing chunks
//! filled with the fill value on the device). Chains of `transpose`, `bytes` (either byte order),
//! `zstd`, `gzip`, `zlib` or `blosc`, and `crc32c`, sharded or not, are decoded on the device with
//! nvCOMP and this crate's kernels in batches (which chunks nvCOMP may decode: [`DecodeTrust`]);
//! device codecs are plugins ([`DeviceCodec`], [`DeviceCodecPlugin`]). Other codec chains are
//! decoded by zarrs on the host into pinned memory and copied once. Any zarrs store works, the
//! `zarrs_gds_store` ones (files, object stores) the fastest.

//! The CUDA driver is loaded at run time: this crate builds on machines without CUDA, and a
//! missing driver or device is an error ([`GpuError::NoCuda`]), not a panic.
//!
//! ```no_run
//! use std::sync::Arc;
//! use zarrs::array::{Array, ArraySubset};
//! use zarrs_gds_store::GdsStore;
//! use zarrs_gpu_codecs::{with_gpu_config, ArrayDeviceExt, DeviceArray, GpuConfig, ShardIndexCache};
//!
//! let array = Array::open(Arc::new(GdsStore::new("volume.zarr")?), "/")?;
//! // Settings from the environment (each bad value an error naming its variable), shard indexes
//! // kept between reads of this array.
//! let config = GpuConfig::from_env()?.with_shard_index_cache(Some(Arc::new(ShardIndexCache::new())));
//! let subset = ArraySubset::new_with_ranges(&[0..64, 0..2048, 0..2048]);
//! let (slab, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &config)?;
//! println!("{:?} on the GPU; {} chunks, {} bytes read", slab.shape(), report.chunks, report.bytes_read);
//!
//! // GPU mode: zarrs' own retrieval yields device arrays (decoded on the host, copied once).
//! let whole: DeviceArray<f32> = with_gpu_config(config, || array.retrieve_array_subset(&array.subset_all()))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Licence
//! `zarrs_gpu_codecs` is licensed under either of the Apache License, Version 2.0 or the MIT
//! license, at your option.

mod coalesce;
mod codecs;
mod config;
mod device;
mod device_array;
mod dlpack;
pub mod element;
pub mod env;
mod error;
mod gpu_mode;
mod pipeline;
mod read_ahead;
pub mod reader;
mod report;
mod retrieve;
mod schedule;
mod shard_index_cache;
mod write;

// Public modules defined deeper in the tree: the host checks of stored chunks, the chunk plan.
pub use codecs::blosc::header as blosc_header;
pub use codecs::deflate as deflate_stream;
pub use codecs::gzip::member as gzip_member;
pub use codecs::lz4::block as lz4_block;
pub use codecs::lz4::decode as lz4_decode;
pub use codecs::zlib::stream as zlib_stream;
pub use codecs::zstd::decode as zstd_decode;
pub use codecs::zstd::frame as zstd_frame;
pub use pipeline::plan;

pub use coalesce::{CoalescedReads, Coalescer};
pub use codecs::delta::{delta_device_text, delta_type_of, DeltaCodec, DeltaType, DELTA_NAME};
pub use codecs::{BoxError, DeviceBatch, DeviceCodec, DeviceCodecPlugin, HostCheck, HostCodecV2, HostCodecV3};
#[cfg(feature = "fault-injection")]
pub use config::InjectedFault;
pub use config::{Cancel, DecodeTrust, GpuConfig, Progress, DEFAULT_REMOTE_BATCH_BYTES};
pub use device::context::{empty_cache, memory_in_use, MemoryInUse};
pub use device::current_context::CurrentContextGuard;
pub use device::pool::{default_pinned_keep, default_pool_keep};
pub use device_array::{set_release_wait_wrapper, DeviceArray, DeviceBytes, FromDeviceBytes, RELEASE_WAIT};
pub use dlpack::DlpackStream;
pub use dlpark;
pub use error::GpuError;
pub use gpu_mode::{gpu_config, with_gpu_config, GpuModeCodec};
pub use inventory;
pub use pipeline::route::host_decode_reason;
pub use read_ahead::{
    random_crops, read_async, tile_subsets, CropStarts, PendingRead, ReadAhead, TileOrder, TileRead,
    READ_AHEAD_REQUEST_BYTES,
};
pub use report::{DecodePath, RetrieveReport, StageTime, WritePath, WriteReport};
pub use retrieve::ArrayDeviceExt;
pub use schedule::DecodeRates;
pub use shard_index_cache::ShardIndexCache;
pub use write::{lock_chunks, store_array_subset_host, ArrayDeviceWriteExt};

// For the fuzz targets only (`fuzz/`); hidden, not part of the API.
#[doc(hidden)]
pub use pipeline::shard::{fuzz_shard_index_entry, fuzz_shard_index_len};
