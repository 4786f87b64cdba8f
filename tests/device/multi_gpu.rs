//! Every GPU of the host in one process: reads on each device in turn and on all at once, compared
//! with zarrs' host reads. Kernels are loaded per device context (a module loaded in device 0's
//! context failed to launch on device 1 with `CUDA_ERROR_INVALID_HANDLE`).
//!
//! A test cannot skip itself at run time, and the GPU runs take every ignored test: so the test
//! reads on the GPUs the host has (one: from two threads at once) and says which; a run that must
//! cover two (a two-GPU host) sets `ZARRS_GPU_REQUIRE_MULTI_GPU=1`, and fewer is then a failure.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::array::codec::{GzipCodec, ZstdCodec};
use zarrs::array::{data_type, ArrayBuilder, BytesToBytesCodecTraits};
use zarrs_gpu::{ArrayDeviceExt, DecodeTrust, GdsStore};

use super::{check, posix, subsets, Result};

/// Set to 1 where the run must read on two GPUs at least.
const REQUIRE: &str = "ZARRS_GPU_REQUIRE_MULTI_GPU";

#[test]
#[ignore = "needs a CUDA GPU (two for the two-device reads; ZARRS_GPU_REQUIRE_MULTI_GPU=1 requires them)"]
fn every_gpu_reads_in_turn_and_at_once() -> Result {
    let devices = usize::try_from(cudarc::driver::CudaContext::device_count()?)?;
    let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
    assert!(devices >= 1, "no CUDA GPU");
    assert!(devices >= 2 || !required, "{REQUIRE}=1, but this host has {devices} CUDA GPU(s)");
    if devices < 2 {
        eprintln!(
            "multi_gpu: this host has {devices} CUDA GPU: reads on two devices NOT tested ({REQUIRE}=1 requires them)"
        );
    }
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let chains: Vec<(&str, Vec<Arc<dyn BytesToBytesCodecTraits>>)> = vec![
        ("raw", vec![]),
        ("zstd", vec![Arc::new(ZstdCodec::new(3, true))]),
        ("gzip", vec![Arc::new(GzipCodec::new(5)?)]),
    ];
    let shape = [24u64, 200, 130];
    let mut arrays = Vec::new();
    for (name, codecs) in chains {
        let array = ArrayBuilder::new(shape.to_vec(), vec![8, 64, 64], data_type::float32(), 2.5f32)
            .bytes_to_bytes_codecs(codecs)
            .build(store.clone(), &format!("/{name}"))?;
        array.store_metadata()?;
        let values: Vec<f32> = (0..shape.iter().product::<u64>()).map(|i| ((i * 13) % 1009) as f32 - 17.0).collect();
        array.store_array_subset(&array.subset_all(), values)?;
        arrays.push(array);
    }
    let on = |device: usize| posix().with_device(device).with_decode_trust(DecodeTrust::Trusted);
    // A device the host lacks: an error naming it, never a read elsewhere.
    let err =
        arrays[0].retrieve_array_subset_device_opt::<DeviceArray<f32>>(&arrays[0].subset_all(), &on(devices)).err();
    let err = err.ok_or("a read on a device the host lacks succeeded")?.to_string();
    assert!(err.contains(&format!("device {devices}")), "{err}");
    // In turn: each device, then each again.
    for device in (0..devices).chain(0..devices) {
        for array in &arrays {
            check::<f32>(array, &array.subset_all(), &on(device))?;
        }
    }
    // At once: a thread per device (two on one device), several subsets each.
    std::thread::scope(|scope| -> Result {
        let handles: Vec<_> = (0..devices.max(2))
            .map(|thread| {
                let device = thread % devices;
                let arrays = &arrays;
                scope.spawn(move || -> Result {
                    for array in arrays {
                        for subset in subsets(&shape, 40 + thread as u64) {
                            check::<f32>(array, &subset, &on(device))?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a reader thread panicked")??;
        }
        Ok(())
    })
}
