//! Load Zarr arrays (v2 and v3) straight into NVIDIA GPU memory with [zarrs](https://docs.rs/zarrs).
//!
//! This facade re-exports the project's crates and holds what the `zarrs-gpu` command line, the
//! examples and the benchmarks share:
//! - [`zarrs_gds_store`]: [`GdsStore`], a filesystem store whose values open for reads into host
//!   memory or, through cuFile (GPUDirect Storage), straight into device memory;
//! - [`zarrs_gpu_codecs`]: [`DeviceArray`], [`ArrayDeviceExt`] (device retrieval on any zarrs
//!   array), GPU mode ([`with_gpu_config`]) and the device read engine
//!   ([`zarrs_gpu_codecs::reader`]: parallel preads into pinned memory and async copies, or cuFile);
//! - [`nvcomp_sys`]: run-time loading of NVIDIA nvCOMP.
//!
//! ```no_run
//! use std::sync::Arc;
//! use zarrs::array::Array;
//! use zarrs_gpu::{ArrayDeviceExt, DeviceArray, GdsStore};
//!
//! let store = Arc::new(GdsStore::new("volume.zarr")?);
//! let array = Array::open(store, "/")?;
//! let data: DeviceArray<f32> = array.retrieve_array_subset_device(&array.subset_all())?;
//! println!("{:?} on the GPU", data.shape());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Licence
//! Licensed under either of the Apache License, Version 2.0 or the MIT license, at your option.

mod element;
mod open;
pub mod sample;
mod subset;

pub use element::{element_type, ELEMENT_TYPES};
pub use open::{multiscale_levels, node_path, open_array, store_at, Multiscale, OpenError};
// For `by_element_type!` in other crates.
#[doc(hidden)]
pub use {half, num_complex};

pub use nvcomp_sys;
pub use subset::{parse_index, parse_subset, select, IndexItem, Selection};
pub use zarrs_gds_store::{self, GdsStore, GdsStoreOptions, IoBackend, IoPath, IoStatus};
pub use zarrs_gpu_codecs::{
    self, default_pool_keep, empty_cache, gpu_config, host_decode_reason, memory_in_use, read_async, tile_subsets,
    with_gpu_config, ArrayDeviceExt, DecodePath, DecodeRates, DecodeTrust, DeviceArray, GpuConfig, GpuError,
    MemoryInUse, PendingRead, ReadAhead, RetrieveReport, ShardIndexCache, TileOrder, TileRead,
};
