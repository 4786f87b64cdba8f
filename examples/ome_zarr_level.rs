//! Read one level of an OME-Zarr multiscale image into GPU memory: the levels are listed in the
//! group's `multiscales` attribute (OME-Zarr 0.4; under `ome` in 0.5), each an array of the group.
//!
//! ```text
//! cargo run --release --example ome_zarr_level -- [IMAGE_GROUP [LEVEL]]
//! ```
//! Without IMAGE_GROUP a two-level sample image is written to a temporary directory first, and
//! level 1 is read.

use std::error::Error;
use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::group::{Group, GroupBuilder};
use zarrs_gpu::{sample, ArrayDeviceExt, GdsStore, GpuConfig};

/// A two-level image: level 0 and level 1 at half the resolution in each dimension.
fn write_sample(path: &std::path::Path) -> Result<(), Box<dyn Error + Send + Sync>> {
    sample::create_sample_array(&path.join("0"), &[64, 512, 512], &[32, 128, 128])?;
    sample::create_sample_array(&path.join("1"), &[32, 256, 256], &[32, 128, 128])?;
    let attributes = serde_json::json!({
        "multiscales": [{ "version": "0.4", "name": "sample", "datasets": [{ "path": "0" }, { "path": "1" }] }]
    });
    let serde_json::Value::Object(attributes) = attributes else { unreachable!("an object") };
    GroupBuilder::new().attributes(attributes).build(Arc::new(GdsStore::new(path)?), "/")?.store_metadata()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (path, _sample) = sample::given_or_sample(args.first().map(std::path::Path::new), "image.zarr", write_sample)?;
    let level: usize = args.get(1).map_or(Ok(1), |l| l.parse())?;
    let store = zarrs_gpu::store_at(&path)?;
    let group = Group::open(store, "/").map_err(|e| format!("opening the group at {}: {e}", path.display()))?;
    let attributes = group.attributes();
    let multiscales = attributes
        .get("multiscales")
        .or_else(|| attributes.get("ome").and_then(|ome| ome.get("multiscales")))
        .and_then(|m| m.get(0))
        .ok_or("the group has no OME-Zarr multiscales attribute")?;
    let datasets = multiscales.get("datasets").and_then(serde_json::Value::as_array).ok_or("no datasets")?;
    let dataset = datasets.get(level).ok_or_else(|| format!("level {level} of {} does not exist", datasets.len()))?;
    let node =
        format!("/{}", dataset.get("path").and_then(serde_json::Value::as_str).ok_or("a dataset without a path")?);

    let array = zarrs_gpu::open_array(&path, &node, "the LEVEL argument")?;
    let (subset, config) = (array.subset_all(), GpuConfig::from_env()?);
    // Microscopy levels are mostly 8 or 16-bit integers or float32.
    let (shape, report) = match array.data_type().to_string().split(' ').next().unwrap_or_default() {
        "uint8" => array
            .retrieve_array_subset_device_opt::<DeviceArray<u8>>(&subset, &config)
            .map(|(d, r)| (d.shape().to_vec(), r))?,
        "uint16" => array
            .retrieve_array_subset_device_opt::<DeviceArray<u16>>(&subset, &config)
            .map(|(d, r)| (d.shape().to_vec(), r))?,
        _ => array
            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &config)
            .map(|(d, r)| (d.shape().to_vec(), r))?,
    };
    println!(
        "level {level} ({node}) of {} levels: {shape:?} {} on the GPU, {} chunks, decoded: {}",
        datasets.len(),
        array.data_type(),
        report.chunks,
        report.decode
    );
    Ok(())
}
