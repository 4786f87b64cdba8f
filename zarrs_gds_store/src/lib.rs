//! A GPUDirect Storage backed filesystem store for [zarrs](https://docs.rs/zarrs).
//!
//! [`GdsStore`] implements zarrs' readable, writable and listable storage traits over a directory
//! laid out as the [Zarr filesystem store](https://zarr-specs.readthedocs.io/en/latest/v3/stores/filesystem/index.html),
//! and opens values for reads by byte range, many at a time, into host memory or straight into
//! CUDA device memory through cuFile (native GPUDirect Storage) where it works for a file (the
//! nvidia-fs driver is loaded and the file registers).
//!
//! Any part of a value can be read into host memory or, where cuFile registered its file,
//! straight into device memory ([`GdsStore::open_for_device`] gives the [`GdsRanges`] of a read,
//! each file opened once; registered files stay open between reads). Every device read says which
//! path it can take and why ([`IoStatus`]); [`IoBackend`] forces one, also through the
//! `ZARRS_GDS_BACKEND` environment variable (`auto`, `gds`, `posix`).
//!
//! Every write replaces its value whole and atomically (a temporary file beside it, renamed over
//! it): a reader, or a writer killed mid-write, sees the old value or the new one, never a mix.
//! [`Durability`] (a [`GdsStoreOptions`] setting) says whether a write is flushed to the disk
//! before it returns (the default) or left to the operating system.
//!
//! The store does not schedule reads: a device read engine (`zarrs_gpu_codecs`' reader: many
//! preads in flight on a thread pool into reused pinned buffers, async copies to the device on a
//! stream per thread) reads the ranges in parallel pieces. The CUDA driver and cuFile are loaded
//! at run time: this crate builds and its host side works on machines with neither.
//!
//! ```no_run
//! use zarrs_gds_store::{GdsStore, ValueRange};
//! use zarrs_storage::StoreKey;
//!
//! /// The first MiB of a chunk.
//! struct Head(StoreKey);
//! impl ValueRange for Head {
//!     fn key(&self) -> &StoreKey { &self.0 }
//!     fn offset(&self) -> u64 { 0 }
//!     fn len(&self) -> usize { 1 << 20 }
//! }
//!
//! let store = GdsStore::new("volume.zarr")?;
//! let ranges = [Head(StoreKey::new("c/0/0/0")?)];
//! let files = store.open_for_device(&ranges, None)?;
//! println!("device reads: {}; direct (cuFile): {}", files.status(), files.is_direct(0));
//! let mut head = vec![0u8; 1 << 20];
//! let found = files.read_host(0, 0, &mut head)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`RemoteStore`] is the store for arrays in object stores (S3 and S3-compatible servers,
//! HTTP(S), any `object_store` or async zarrs store): zarrs' synchronous traits over them, and
//! [`RemoteStore::fetch_many`], many ranged GETs in flight, for the device reader. [`AnyStore`]
//! is either store, chosen from a path or a URL ([`AnyStore::open`]).
//!
//! ## Licence
//! `zarrs_gds_store` is licensed under either of the Apache License, Version 2.0 or the MIT
//! license, at your option.

// Each module imports a name from the module that defines it; this file only re-exports (no
// module reaches a name through here, which would hide a loop between it and this file).
mod advise;
mod aws_profile;
mod backend;
mod body_buffers;
mod cufile;
mod error;
mod file;
mod http_client;
mod remote;
mod store;
mod stores;
mod version;
mod write;

pub use backend::{IoBackend, IoPath, IoStatus, BACKEND_ENV};
pub use cufile::CUFILE_LIBRARY_ENV;
pub use error::ReadError;
pub use remote::{
    object_store_options, redact_url, ObjectStamp, RemoteRange, RemoteStore, ValueBatches, DEFAULT_CONCURRENCY,
    DEFAULT_KEPT_BODY_BYTES, DEFAULT_MAX_VALUE_BYTES,
};
pub use store::{DeviceReadOutcome, GdsRanges, GdsStore, GdsStoreOptions, ValueRange};
pub use stores::AnyStore;
pub use version::{ValueChanged, ValueVersion};
pub use write::{Durability, Expected, FileVersion, KeyLockGuard, KeyLocks, LockId};

/// The cudarc version this crate is built with, for callers that share CUDA objects with it.
pub use cudarc;

#[cfg(test)]
mod tests {
    /// The modules and their sources: every `crate::` path in them starts with a module's name.
    #[test]
    fn modules_import_from_the_defining_module_not_through_lib() {
        let modules = [
            ("advise", include_str!("advise.rs")),
            ("aws_profile", include_str!("aws_profile.rs")),
            ("backend", include_str!("backend.rs")),
            ("body_buffers", include_str!("body_buffers.rs")),
            ("cufile", include_str!("cufile.rs")),
            ("error", include_str!("error.rs")),
            ("file", include_str!("file.rs")),
            ("http_client", include_str!("http_client.rs")),
            ("remote", include_str!("remote.rs")),
            ("store", include_str!("store.rs")),
            ("stores", include_str!("stores.rs")),
            ("version", include_str!("version.rs")),
            ("write", include_str!("write.rs")),
        ];
        for (name, source) in modules {
            for (at, _) in source.match_indices("crate::") {
                let rest = &source[at + "crate::".len()..];
                let first: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                assert!(
                    modules.iter().any(|(m, _)| *m == first),
                    "{name}.rs imports crate::{first} through lib.rs: import it from its module"
                );
            }
        }
    }
}
