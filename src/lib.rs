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

pub mod open;
pub mod sample;
pub mod subset;

pub use open::{multiscale_levels, open_array, open_array_in, store_at, Multiscale, OpenError};

pub use nvcomp_sys;
pub use subset::{parse_subset, Selection};
pub use zarrs_gds_store::{self, AnyStore, GdsStore, GdsStoreOptions, IoBackend, IoPath, RemoteStore};
pub use zarrs_gpu_codecs::{
    self, element, empty_cache, gpu_config, memory_in_use, read_async, with_gpu_config, ArrayDeviceExt,
    ArrayDeviceWriteExt, CoalescedReads, DecodePath, DecodeTrust, DeviceArray, DeviceBytes, FromDeviceBytes, GpuConfig,
    GpuError, MemoryInUse, PendingRead, ReadAhead, RetrieveReport, ShardIndexCache, WritePath, WriteReport,
};

#[cfg(test)]
mod readme_tests {
    use std::path::Path;

    const README: &str = include_str!("../README.md");

    #[test]
    fn the_readme_opens_with_the_commands_and_ci_runs_its_test_command() {
        assert!(README.lines().count() <= 200, "README.md has {} lines: depth goes to docs/", README.lines().count());
        let head: String = README.lines().take(40).collect::<Vec<_>>().join("\n");
        for command in [
            "cargo run --release -- read",
            "cargo test --workspace",
            "pip install './python[test]'",
            "zarrs-gpu read",
            "-- info",
        ] {
            assert!(head.contains(command), "{command:?} not in the README's first 40 lines");
        }
        let ci = include_str!("../.ci/run");
        assert!(
            ci.lines().any(|l| l.starts_with("cargo test --workspace")),
            ".ci/run must run the README's test command"
        );
    }

    /// Every relative link of the README and of docs/ names a file that is there.
    #[test]
    fn links_in_the_readme_and_docs_resolve() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut pages = vec![(root.join("README.md"), README.to_string())];
        for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&path).expect("a page");
                pages.push((path, text));
            }
        }
        assert!(pages.len() > 5, "docs/ pages: {}", pages.len() - 1);
        for (page, text) in &pages {
            for (at, _) in text.match_indices("](") {
                let target = &text[at + 2..];
                let target = &target[..target.find(')').unwrap_or(target.len())];
                if target.contains("://") || target.starts_with('#') {
                    continue;
                }
                let file = target.split('#').next().unwrap_or_default();
                let resolved = page.parent().expect("a directory").join(file);
                assert!(resolved.exists(), "{}: link {target:?} names nothing", page.display());
            }
        }
    }
}
