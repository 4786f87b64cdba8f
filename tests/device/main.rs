//! Device retrieval compared with zarrs' host retrieval, byte for byte: one test binary (GPU
//! test binaries travel to the GPU host, so there are few). GPU tests are
//! `#[ignore = "needs a CUDA GPU"]`.

mod batch;
mod blosc;
#[path = "../common/boxes.rs"]
mod boxes;
mod compress;
mod compressed;
mod delta;
mod dlpack;
mod faults;
mod hostile;
mod integrity;
mod load;
mod memory;
#[path = "../common/metadata.rs"]
mod metadata;
mod multi_gpu;
mod plugin;
mod read_ahead;
mod reader;
mod remote;
mod retrieval;
#[path = "../common/servers.rs"]
mod servers;
mod sharding;
mod sweep;
mod write;
mod zlib;

use std::error::Error;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::SeedableRng;
use zarrs::array::{Array, ArrayBytes, ArraySubset, ElementOwned};
use zarrs_gpu::{ArrayDeviceExt, GdsStore, GpuConfig, IoBackend, RetrieveReport};

/// Test results: any error, sendable.
type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// Read `subset` to the device as `T` and require zarrs' host bytes; the device read's report.
fn check<T: ElementOwned>(array: &Array<GdsStore>, subset: &ArraySubset, config: &GpuConfig) -> Result<RetrieveReport> {
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(subset)?.into_fixed()?.into_owned();
    let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<T>>(subset, config)?;
    let got = device.to_host_bytes()?;
    assert!(got == want, "subset {:?}: device bytes differ from zarrs' ({report:?})", subset.to_ranges());
    Ok(report)
}

/// Read the chunk at `indices` (its full shape, past the array's edge too) to the device as `T`
/// and require zarrs' `retrieve_chunk` bytes; the device read's report.
fn check_chunk<T: ElementOwned>(
    array: &Array<GdsStore>,
    indices: &[u64],
    config: &GpuConfig,
) -> Result<RetrieveReport> {
    let want = array.retrieve_chunk::<ArrayBytes<'static>>(indices)?.into_fixed()?.into_owned();
    let (device, report) = array.retrieve_chunk_device_opt::<DeviceArray<T>>(indices, config)?;
    let got = device.to_host_bytes()?;
    assert!(got == want, "chunk {indices:?}: device bytes differ from zarrs' ({report:?})");
    Ok(report)
}

/// The whole of `shape` and six random subsets of it.
fn subsets(shape: &[u64], seed: u64) -> Vec<ArraySubset> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = vec![ArraySubset::new_with_shape(shape.to_vec())];
    out.extend((0..6).map(|_| boxes::random_box(shape, &mut rng)));
    out
}

/// This test binary again, running only `test` (its full path) with `env` changed (`None`
/// removes a variable): faults the parent must survive, or settings it must not take, happen in
/// the child.
fn child_command(test: &str, env: &[(&str, Option<&str>)]) -> Result<std::process::Command> {
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command.args([test, "--exact", "--include-ignored", "--nocapture", "--test-threads=1"]);
    for &(name, value) in env {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    Ok(command)
}

/// The pread path forced (the host has no native GDS).
fn posix() -> GpuConfig {
    // nvCOMP decodes every chunk it may: the scheduler would send these tests' small reads to
    // host threads (`scheduled()` keeps its split), and they are about the device's decode.
    scheduled().with_host_decode_fraction(Some(0.0))
}

/// The pread backend with the scheduler's split between host threads and nvCOMP.
fn scheduled() -> GpuConfig {
    GpuConfig::default().with_backend(IoBackend::Posix)
}
