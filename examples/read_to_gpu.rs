//! Read a Zarr array (or a subset of it) into GPU memory and run a kernel on it: the mean of the
//! elements, computed on the device, beside the same mean from zarrs' host read.
//!
//! ```text
//! cargo run --release --example read_to_gpu -- [PATH [NODE [SUBSET]]]
//! cargo run --release --example read_to_gpu -- volume.zarr /0 0:64,:,:
//! ```
//! Without PATH a float32 sample array is written to a temporary directory first. Needs an
//! NVIDIA GPU, its driver, NVRTC (for the kernel) and, for compressed arrays, nvCOMP
//! (`pip install nvidia-libnvcomp-cu13`).

use std::error::Error;
use zarrs_gpu::DeviceArray;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use zarrs_gpu::{parse_subset, sample, ArrayDeviceExt, GpuConfig};

/// Each thread sums a grid-strided share, then adds it to the total once.
const MEAN_SOURCE: &str = r#"
extern "C" __global__ void sum(const float* x, unsigned long long n, double* total) {
    double s = 0.0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        s += x[i];
    }
    atomicAdd(total, s);
}
"#;

fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, _sample) = sample::given_or_sample(args.first().map(std::path::Path::new), "sample.zarr", |p| {
        sample::create_sample_array(p, &[128, 512, 512], &[64, 128, 128])?;
        Ok(())
    })?;
    let node = args.get(1).map_or("/", String::as_str);
    // Errors name the store's path and the node (zarrs' own say only what is missing).
    let array = zarrs_gpu::open_array(&path, node, "the NODE argument")?;
    let subset = parse_subset(args.get(2).map_or("", String::as_str), array.shape())?;

    let config = GpuConfig::from_env()?;
    let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &config)?;
    println!(
        "{:?} float32 on the GPU: {} chunks, {} bytes read, decoded: {}",
        data.shape(),
        report.chunks,
        report.bytes_read,
        report.decode
    );

    let stream = data.stream().clone();
    let module = stream.context().load_module(cudarc::nvrtc::compile_ptx(MEAN_SOURCE)?)?;
    let sum = module.load_function("sum")?;
    let mut total = stream.alloc_zeros::<f64>(1)?;
    let n = data.len() as u64;
    let mut launch = stream.launch_builder(&sum);
    let slice = data.as_cuda_slice().ok_or("a read's array owns its memory")?;
    launch.arg(&slice).arg(&n).arg(&mut total);
    // SAFETY: `sum` takes a float array of n elements, n, and one double, as pushed.
    unsafe { launch.launch(LaunchConfig { grid_dim: (1024, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }) }?;
    let device_mean = stream.clone_dtoh(&total)?[0] / n.max(1) as f64;

    let host: Vec<f32> = array.retrieve_array_subset(&subset)?;
    let host_mean = host.iter().map(|&v| f64::from(v)).sum::<f64>() / host.len().max(1) as f64;
    println!("mean on the device {device_mean:.6}, from zarrs' host read {host_mean:.6}");
    Ok(())
}
