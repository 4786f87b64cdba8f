//! Opening arrays by path, as the command line and the Python package do.

use std::path::Path;
use std::sync::Arc;

use zarrs::array::Array;
use zarrs::group::Group;
use zarrs::metadata::NodeMetadata;
use zarrs_gds_store::GdsStore;

/// A node path as zarrs wants it: with its leading `/`.
#[must_use]
pub fn node_path(node: &str) -> String {
    let node = node.trim();
    if node.starts_with('/') {
        node.to_string()
    } else {
        format!("/{node}")
    }
}

/// The store at `path`, which must be an existing directory (a [`GdsStore`] would create it).
///
/// # Errors
/// Returns a message when `path` is not a directory.
pub fn store_at(path: &Path) -> Result<Arc<GdsStore>, String> {
    if !path.is_dir() {
        return Err(format!("{} is not a directory (a Zarr filesystem store)", path.display()));
    }
    GdsStore::new(path).map(Arc::new).map_err(|e| format!("opening {}: {e}", path.display()))
}

/// The array at `node` (with or without its leading `/`) of the store at `path`. A group is an
/// error that names its arrays and how to pick one (`pick`: the caller's option, as `--array`).
///
/// # Errors
/// Returns a message naming the path and the node when there is no such array.
pub fn open_array(path: &Path, node: &str, pick: &str) -> Result<Array<GdsStore>, String> {
    let store = store_at(path)?;
    let node = node_path(node);
    Array::open(store.clone(), &node).map_err(|e| {
        let nodes = Group::open(store, &node).ok().and_then(|g| g.traverse().ok());
        match nodes {
            Some(nodes) => {
                let arrays: Vec<String> = nodes
                    .iter()
                    .filter(|(_, m)| matches!(m, NodeMetadata::Array(_)))
                    .map(|(p, _)| p.as_str().to_string())
                    .collect();
                format!(
                    "{node:?} in {} is a group, not an array; its arrays: {} (pick one with {pick})",
                    path.display(),
                    arrays.join(", ")
                )
            }
            None => format!("opening array {node:?} in {}: {e}", path.display()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_array_names_the_path_and_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_array(dir.path(), "0", "--array").unwrap_err();
        assert!(err.contains(&dir.path().display().to_string()) && err.contains("\"/0\""), "{err}");
    }

    /// zarrs' `Array::open` errors name neither path nor node (`Error: MissingMetadata`): the
    /// examples open through [`open_array`].
    #[test]
    fn the_examples_open_arrays_with_errors_naming_the_path() {
        let examples = [
            ("read_to_gpu", include_str!("../examples/read_to_gpu.rs")),
            ("dlpack", include_str!("../examples/dlpack.rs")),
            ("gpu_mode", include_str!("../examples/gpu_mode.rs")),
            ("ome_zarr_level", include_str!("../examples/ome_zarr_level.rs")),
        ];
        for (name, source) in examples {
            assert!(!source.contains("Array::open("), "examples/{name}.rs opens with zarrs' Array::open");
            assert!(source.contains("open_array("), "examples/{name}.rs");
        }
    }
}
