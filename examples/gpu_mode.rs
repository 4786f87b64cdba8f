//! GPU mode: zarrs' own retrieval API yields device arrays inside `with_gpu_config`, so code
//! written against zarrs gets `DeviceArray`s without changes beyond the element type. The
//! device route (`retrieve_array_subset_device`) reads the same subset much faster; both are
//! compared here, element for element.
//!
//! ```text
//! cargo run --release --example gpu_mode -- [PATH [NODE]]
//! ```
//! Without PATH a zstd-compressed sample array is written to a temporary directory first.

use std::error::Error;
use std::sync::Arc;
use std::time::Instant;

use zarrs::array::codec::ZstdCodec;
use zarrs::array::ArraySubset;
use zarrs_gpu::{sample, with_gpu_config, ArrayDeviceExt, DeviceArray, GpuConfig};

fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, _sample) = sample::given_or_sample(args.first().map(std::path::Path::new), "sample.zarr", |p| {
        let zstd = Arc::new(ZstdCodec::new(3, false));
        sample::create_sample_array_with_codecs(p, &[128, 512, 512], &[64, 64, 64], vec![zstd])?;
        Ok(())
    })?;
    let node = args.get(1).map_or("/", String::as_str).to_string();
    let config = GpuConfig::from_env()?;

    let (ordinary, seconds) = with_gpu_config(config.clone(), || -> Result<_, Box<dyn Error + Send + Sync>> {
        // Opened inside the scope: its codecs are GPU mode's (zarrs' own, carrying device codecs).
        let array = zarrs_gpu::open_array(&path, &node, "the NODE argument")?;
        let start = Instant::now();
        let data: DeviceArray<f32> = array.retrieve_array_subset(&array.subset_all())?;
        // A chunk, the same way.
        let chunk: DeviceArray<f32> = array.retrieve_chunk(&vec![0; array.dimensionality()])?;
        println!("chunk 0 on the GPU: {:?}", chunk.shape());
        Ok((data, start.elapsed().as_secs_f64()))
    })?;
    let gib = ordinary.num_bytes() as f64 / f64::from(1u32 << 30);
    println!("zarrs' retrieval in GPU mode: {:?} in {seconds:.3} s ({:.2} GiB/s)", ordinary.shape(), gib / seconds);

    // Errors name the store's path and the node (zarrs' own say only what is missing).
    let array = zarrs_gpu::open_array(&path, &node, "the NODE argument")?;
    let start = Instant::now();
    let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(
        &ArraySubset::new_with_shape(array.shape().to_vec()),
        &config,
    )?;
    let seconds = start.elapsed().as_secs_f64();
    println!("the device route: {seconds:.3} s ({:.2} GiB/s), decoded: {}", gib / seconds, report.decode);
    assert!(device.to_host_bytes()? == ordinary.to_host_bytes()?, "both routes give the same elements");
    println!("both routes give the same elements");
    Ok(())
}
