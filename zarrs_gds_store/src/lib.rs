//! A GPUDirect Storage backed filesystem store for [zarrs](https://docs.rs/zarrs).
//!
//! [`GdsStore`] implements zarrs' readable, writable and listable storage traits over a directory
//! laid out as the [Zarr filesystem store](https://zarr-specs.readthedocs.io/en/latest/v3/stores/filesystem/index.html),
//! and adds reads of keys and byte ranges straight into CUDA device memory, many at a time:
//! - native GPUDirect Storage through cuFile where it works for a file (the nvidia-fs driver is
//!   loaded and the file registers);
//! - otherwise the fallback: many preads in flight on a thread pool into pinned buffers that are
//!   allocated once and reused, with async copies to the device on a stream per thread.
//!
//! Every read says which path ran and why ([`IoStatus`]); [`IoBackend`] forces one, also through the
//! `ZARRS_GDS_BACKEND` environment variable (`auto`, `gds`, `posix`). Any other zarrs store can be
//! read to the device too, staged through pinned memory ([`read_store_to_device`]).
//!
//! The CUDA driver and cuFile are loaded at run time: this crate builds and its host side works on
//! machines with neither.
//!
//! ```no_run
//! use zarrs_gds_store::cudarc::driver::DevicePtrMut;
//! use zarrs_gds_store::{DeviceReadRequest, DeviceReader, GdsStore};
//! use zarrs_storage::StoreKey;
//!
//! let store = GdsStore::new("volume.zarr")?;
//! // One reader per device: its threads, streams and pinned buffers are made once.
//! let reader = DeviceReader::shared(0)?;
//! let stream = reader.context().default_stream();
//! let mut chunk = stream.alloc_zeros::<u8>(1 << 20)?;
//! let (dst, _sync) = chunk.device_ptr_mut(&stream);
//! let requests = [DeviceReadRequest { key: StoreKey::new("c/0/0/0")?, offset: 0, len: 1 << 20, dst, value_len: None }];
//! // SAFETY: `dst` is device memory of the reader's context with room for the 1 MiB read.
//! let outcome = unsafe { store.read_to_device(&reader, &requests, None, None)? };
//! println!("found: {}, path: {}", outcome.found[0], outcome.status);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Licence
//! `zarrs_gds_store` is licensed under either of the Apache License, Version 2.0 or the MIT
//! license, at your option.

mod backend;
mod cufile;
mod engine;
mod error;
mod staged;
mod store;

pub use backend::{IoBackend, IoPath, IoStatus, BACKEND_ENV};
pub use cufile::CUFILE_LIBRARY_ENV;
pub use engine::{
    cuda_context, DeviceMirror, DevicePtr, DeviceReader, DeviceReaderOptions, DeviceTransfer, HostTransfer,
    PieceSource, PinnedBuffer, NTHREADS_ENV, TASK_SIZE_ENV,
};
pub use error::DeviceReadError;
pub use staged::{read_store_to_device, read_store_to_host};
pub use store::{DeviceReadOutcome, DeviceReadRequest, GdsStore, GdsStoreOptions, HostReadRequest};

/// The cudarc version this crate is built with, for callers that share CUDA objects with it.
pub use cudarc;
