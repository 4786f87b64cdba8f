//! Zarr v3 metadata written as JSON, for arrays zarrs' builder is not asked to make (hostile
//! shapes and chunk grids). Shared by the test binaries that include it with `#[path]`.

use std::error::Error;
use std::path::Path;

/// Write the `zarr.json` of a float32 array (no chunks) into the directory `node`.
pub(crate) fn write_float32(
    node: &Path,
    shape: &[u64],
    chunks: &[u64],
    fill: f64,
    codecs: &serde_json::Value,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    std::fs::create_dir_all(node)?;
    let metadata = serde_json::json!({
        "zarr_format": 3,
        "node_type": "array",
        "shape": shape,
        "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": fill,
        "codecs": codecs,
    });
    std::fs::write(node.join("zarr.json"), serde_json::to_vec(&metadata)?)?;
    Ok(())
}
