//! Two GPUs in one process: reads on each device in turn and on both at once, compared with
//! zarrs' host reads. Kernels are loaded per device context (a module loaded in device 0's
//! context failed to launch on device 1 with `CUDA_ERROR_INVALID_HANDLE`).

use std::sync::Arc;

use zarrs::array::codec::{GzipCodec, ZstdCodec};
use zarrs::array::{data_type, ArrayBuilder, BytesToBytesCodecTraits};
use zarrs_gpu::{DecodeTrust, GdsStore};

use super::{check, posix, subsets, Result};

#[test]
#[ignore = "needs two CUDA GPUs"]
fn two_gpus_read_in_turn_and_at_once() -> Result {
    let devices = cudarc::driver::CudaContext::device_count()?;
    assert!(devices >= 2, "this test needs two CUDA GPUs; this host has {devices}");
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
    // In turn: device 0 first, then device 1, then back.
    for device in [0, 1, 0, 1] {
        for array in &arrays {
            check::<f32>(array, &array.subset_all(), &on(device))?;
        }
    }
    // At once: a thread per device, several subsets each.
    std::thread::scope(|scope| -> Result {
        let handles: Vec<_> = (0..2)
            .map(|device| {
                let arrays = &arrays;
                scope.spawn(move || -> Result {
                    for array in arrays {
                        for subset in subsets(&shape, 40 + device as u64) {
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
