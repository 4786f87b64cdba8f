//! Opening arrays by path or URL, as the command line and the Python package do.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zarrs::array::{Array, ArrayCreateError};
use zarrs::filesystem::FilesystemStoreCreateError;
use zarrs::group::{Group, GroupCreateError};
use zarrs::metadata::NodeMetadata;
use zarrs_gds_store::{AnyStore, GdsStore};
use zarrs_storage::StorageError;

/// At most this many array paths in a message: a group may hold thousands.
const LISTED: usize = 16;

/// Why [`open_array`] (or [`store_at`]) could not open an array.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The store's path is not a directory.
    #[error("{} is not a directory (a Zarr filesystem store)", path.display())]
    NotADirectory {
        /// The store's path.
        path: PathBuf,
    },
    /// The directory could not be opened as a store.
    #[error("opening {}: {source}", path.display())]
    Store {
        /// The store's path.
        path: PathBuf,
        /// The filesystem store's error.
        source: FilesystemStoreCreateError,
    },
    /// An object store's URL or its options cannot be used (the message names the URL, never
    /// its credentials).
    #[error("opening {location}: {source}")]
    Remote {
        /// The URL, without credentials.
        location: String,
        /// The store's error.
        source: StorageError,
    },
    /// The node is a group: the message names its arrays and how to pick one.
    #[error("{node:?} in {} is a group, not an array; {}", path.display(), group_text(arrays, levels, pick))]
    IsAGroup {
        /// The store's path or URL.
        path: PathBuf,
        /// The group's node path.
        node: String,
        /// Every array under the group.
        arrays: Vec<String>,
        /// The arrays of its OME-Zarr multiscale levels (its `multiscales` attributes).
        levels: Vec<String>,
        /// How the caller picks an array (`--array`, `array=...`).
        pick: String,
    },
    /// Neither an array nor a group is at the node (no `zarr.json`, `.zarray` or `.zgroup`).
    #[error(
        "no array or group at {node:?} in {}{}",
        path.display(),
        nearest_text(nearest_group.as_deref(), array_above.as_deref(), arrays, levels, pick)
    )]
    NodeNotFound {
        /// The store's path or URL.
        path: PathBuf,
        /// The node path asked for.
        node: String,
        /// The nearest group above the node, if any.
        nearest_group: Option<String>,
        /// The array above the node, where the nearest node above it is an array.
        array_above: Option<String>,
        /// Every array under that group.
        arrays: Vec<String>,
        /// The arrays of that group's OME-Zarr multiscale levels.
        levels: Vec<String>,
        /// How the caller picks an array.
        pick: String,
    },
    /// The node's metadata is there but zarrs refuses it (or the store cannot be read).
    #[error("opening array {node:?} in {}: {source}", path.display())]
    Array {
        /// The store's path or URL.
        path: PathBuf,
        /// The node path.
        node: String,
        /// zarrs' error.
        source: ArrayCreateError,
    },
}

/// `paths` joined, the first [`LISTED`] of them and how many more.
fn listed(paths: &[String]) -> String {
    let mut text = paths.iter().take(LISTED).map(String::as_str).collect::<Vec<_>>().join(", ");
    if paths.len() > LISTED {
        let _ = write!(text, " and {} more", paths.len() - LISTED);
    }
    text
}

fn group_text(arrays: &[String], levels: &[String], pick: &str) -> String {
    let mut text =
        if arrays.is_empty() { "it holds no arrays".to_string() } else { format!("its arrays: {}", listed(arrays)) };
    if !levels.is_empty() {
        let _ = write!(text, "; OME-Zarr multiscale levels: {}", listed(levels));
    }
    if !arrays.is_empty() {
        let _ = write!(text, " (pick one with {pick})");
    }
    text
}

fn nearest_text(group: Option<&str>, array: Option<&str>, arrays: &[String], levels: &[String], pick: &str) -> String {
    match (group, array) {
        (Some(group), _) => format!("; the nearest group, {group:?}: {}", group_text(arrays, levels, pick)),
        (None, Some(array)) => format!("; {array:?} above it is an array (pick it with {pick})"),
        (None, None) => " (no zarr.json, .zarray or .zgroup there, nor a group above it)".to_string(),
    }
}

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

/// The store at `path`: an existing directory (a [`GdsStore`] would create it), or an object
/// store's URL (`s3://bucket/prefix`, `https://host/prefix`: see [`store_with_options`]).
///
/// # Errors
/// [`OpenError::NotADirectory`] when `path` is not a directory, [`OpenError::Store`] when it
/// cannot be opened, [`OpenError::Remote`] for a URL that cannot be used.
#[allow(clippy::result_large_err)] // once per opening, and callers match on it
pub fn store_at(path: &Path) -> Result<Arc<AnyStore>, OpenError> {
    match path.to_str() {
        Some(url) if AnyStore::is_url(url) => store_with_options(url, &[]),
        _ => {
            if !path.is_dir() {
                return Err(OpenError::NotADirectory { path: path.to_path_buf() });
            }
            let store = GdsStore::new(path).map_err(|source| OpenError::Store { path: path.to_path_buf(), source })?;
            Ok(Arc::new(AnyStore::Gds(store)))
        }
    }
}

/// The store at `location` (a directory's path or an object store's URL) with `options` (an
/// object store's, as [`zarrs_gds_store::RemoteStore::from_url`] takes them; none for a
/// directory).
///
/// # Errors
/// As [`store_at`], and [`OpenError::Remote`] for options a directory or the URL's store does
/// not take.
#[allow(clippy::result_large_err)] // once per opening, and callers match on it
pub fn store_with_options(location: &str, options: &[(String, String)]) -> Result<Arc<AnyStore>, OpenError> {
    if !AnyStore::is_url(location) {
        if let Some((key, _)) = options.first() {
            let source = StorageError::Other(format!("a directory takes no storage options ({key} given)"));
            return Err(OpenError::Remote { location: location.to_string(), source });
        }
        return store_at(Path::new(location));
    }
    AnyStore::open(location, options.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map(Arc::new)
        .map_err(|source| OpenError::Remote { location: zarrs_gds_store::redact_url(location), source })
}

/// The array at `node` (with or without its leading `/`) of the store at `path` (a directory or
/// an object store's URL, as [`store_at`]). A group, or a node that is not there, is an error
/// that names the arrays there are (those of the nearest group above the node, and its OME-Zarr
/// multiscale levels) and how to pick one (`pick`: the caller's option, as `--array`).
///
/// # Errors
/// [`OpenError::IsAGroup`], [`OpenError::NodeNotFound`], [`OpenError::Array`] for metadata zarrs
/// refuses, and [`store_at`]'s errors; each names the path and the node.
#[allow(clippy::result_large_err)] // once per opening, and callers match on it
pub fn open_array(path: &Path, node: &str, pick: &str) -> Result<Array<AnyStore>, OpenError> {
    open_array_in(&store_at(path)?, path, node, pick)
}

/// The array at `node` of `store` (opened from `path`, which messages name), as [`open_array`].
///
/// # Errors
/// As [`open_array`].
#[allow(clippy::result_large_err)] // once per opening, and callers match on it
pub fn open_array_in(store: &Arc<AnyStore>, path: &Path, node: &str, pick: &str) -> Result<Array<AnyStore>, OpenError> {
    let node = node_path(node);
    let err = match Array::open(store.clone(), &node) {
        Ok(array) => return Ok(array),
        Err(err) => err,
    };
    let (path, pick) = (path.to_path_buf(), pick.to_string());
    if let Ok(group) = Group::open(store.clone(), &node) {
        let (arrays, levels) = group_contents(&group);
        return Err(OpenError::IsAGroup { path, node, arrays, levels, pick });
    }
    if !matches!(err, ArrayCreateError::MissingMetadata) {
        return Err(OpenError::Array { path, node, source: err });
    }
    let (mut nearest_group, mut array_above, mut arrays, mut levels) = (None, None, Vec::new(), Vec::new());
    for p in ancestors(&node) {
        match Group::open(store.clone(), &p) {
            Ok(group) => {
                (arrays, levels) = group_contents(&group);
                nearest_group = Some(p);
            }
            Err(_) if Array::open(store.clone(), &p).is_ok() => array_above = Some(p),
            Err(GroupCreateError::MissingMetadata) => continue,
            // Metadata there that zarrs refuses: nothing to point to.
            Err(_) => {}
        }
        break;
    }
    Err(OpenError::NodeNotFound { path, node, nearest_group, array_above, arrays, levels, pick })
}

/// The node paths above `node` (a path with its leading `/`), nearest first, the root last.
fn ancestors(node: &str) -> impl Iterator<Item = String> + '_ {
    let trimmed = node.trim_end_matches('/');
    trimmed.match_indices('/').rev().map(move |(i, _)| if i == 0 { "/".to_string() } else { trimmed[..i].to_string() })
}

/// A group's arrays (all of them, under it at any depth; none where it cannot be listed) and
/// its multiscale levels' arrays.
fn group_contents(group: &Group<AnyStore>) -> (Vec<String>, Vec<String>) {
    let arrays = group.traverse().map_or_else(
        |_| Vec::new(),
        |nodes| {
            nodes
                .iter()
                .filter(|(_, m)| matches!(m, NodeMetadata::Array(_)))
                .map(|(p, _)| p.as_str().to_string())
                .collect()
        },
    );
    let levels = multiscale_levels(group).into_iter().flat_map(|m| m.levels).collect();
    (arrays, levels)
}

/// One OME-Zarr multiscale image of a group's attributes: its name and its levels' node paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Multiscale {
    /// The image's `name` (empty when it has none).
    pub name: String,
    /// Each dataset's `path`, as a node path under the group, finest level first.
    pub levels: Vec<String>,
}

/// The OME-Zarr multiscale images a group's attributes describe: `multiscales` (OME-Zarr 0.4,
/// in `.zattrs` or `zarr.json`'s attributes) or `ome` → `multiscales` (0.5). Datasets without a
/// `path` are left out; a group without such attributes has none.
#[must_use]
pub fn multiscale_levels<S: ?Sized>(group: &Group<S>) -> Vec<Multiscale> {
    use serde_json::Value;
    let attributes = group.attributes();
    let multiscales = attributes
        .get("multiscales")
        .or_else(|| attributes.get("ome").and_then(|ome| ome.get("multiscales")))
        .and_then(Value::as_array);
    let base = group.path().as_str().trim_end_matches('/');
    multiscales
        .into_iter()
        .flatten()
        .map(|multiscale| Multiscale {
            name: multiscale.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
            levels: multiscale
                .get("datasets")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|d| d.get("path").and_then(Value::as_str))
                .map(|p| format!("{base}/{}", p.trim_start_matches('/')))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use zarrs::array::{data_type, ArrayBuilder};
    use zarrs::group::GroupBuilder;

    use super::*;

    #[test]
    fn a_missing_array_names_the_path_and_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_array(dir.path(), "0", "--array").unwrap_err();
        assert!(matches!(err, OpenError::NodeNotFound { nearest_group: None, .. }), "{err:?}");
        let err = err.to_string();
        assert!(err.contains(&dir.path().display().to_string()) && err.contains("\"/0\""), "{err}");
        assert!(err.contains("no array or group at"), "{err}");
    }

    /// An OME-Zarr image group at `/image` of a new store, levels `s0` and `s1`, its attributes
    /// as OME-Zarr `version` writes them.
    fn ome_zarr(version: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(GdsStore::new(dir.path()).unwrap());
        GroupBuilder::new().build(store.clone(), "/").unwrap().store_metadata().unwrap();
        let multiscales = serde_json::json!([{"name": "cells", "datasets": [{"path": "s0"}, {"path": "s1"}]}]);
        let attributes = if version == "0.5" {
            serde_json::json!({"ome": {"version": "0.5", "multiscales": multiscales}})
        } else {
            serde_json::json!({"multiscales": multiscales})
        };
        let serde_json::Value::Object(attributes) = attributes else { unreachable!("an object") };
        GroupBuilder::new().attributes(attributes).build(store.clone(), "/image").unwrap().store_metadata().unwrap();
        for (p, n) in [("/image/s0", 8u64), ("/image/s1", 4)] {
            ArrayBuilder::new(vec![n, n], vec![4, 4], data_type::uint8(), 0u8)
                .build(store.clone(), p)
                .unwrap()
                .store_metadata()
                .unwrap();
        }
        dir
    }

    /// zarrs said only "array metadata is missing": the error names what is there instead.
    #[test]
    fn a_missing_node_names_the_nearest_groups_arrays_and_levels() {
        for version in ["0.4", "0.5"] {
            let dir = ome_zarr(version);
            let err = open_array(dir.path(), "image/0", "--array").unwrap_err();
            let OpenError::NodeNotFound { nearest_group, arrays, levels, .. } = &err else {
                panic!("{version}: {err:?}")
            };
            assert_eq!(nearest_group.as_deref(), Some("/image"), "{version}");
            assert_eq!(arrays, &["/image/s0", "/image/s1"], "{version}");
            assert_eq!(levels, &["/image/s0", "/image/s1"], "{version}");
            let text = err.to_string();
            assert!(
                text.contains("no array or group at \"/image/0\"")
                    && text.contains("the nearest group, \"/image\": its arrays: /image/s0, /image/s1")
                    && text.contains("OME-Zarr multiscale levels: /image/s0, /image/s1")
                    && text.contains("(pick one with --array)"),
                "{text}"
            );
            assert!(!text.contains("metadata is missing"), "{text}");
            // Deeper and at the root: the nearest group found by walking up.
            let err = open_array(dir.path(), "/image/0/1/2", "--array").unwrap_err();
            assert!(matches!(&err, OpenError::NodeNotFound { nearest_group: Some(g), .. } if g == "/image"), "{err}");
            let err = open_array(dir.path(), "/0", "--array").unwrap_err();
            assert!(matches!(&err, OpenError::NodeNotFound { nearest_group: Some(g), .. } if g == "/"), "{err}");
            // The group itself: its arrays and levels, not found.
            let err = open_array(dir.path(), "image", "--array").unwrap_err();
            assert!(matches!(&err, OpenError::IsAGroup { levels, .. } if levels.len() == 2), "{err}");
            assert!(err.to_string().contains("is a group, not an array; its arrays: /image/s0, /image/s1"), "{err}");
        }
    }

    #[test]
    fn long_lists_are_cut() {
        let paths: Vec<String> = (0..20).map(|i| format!("/{i}")).collect();
        let text = listed(&paths);
        assert!(text.starts_with("/0, /1,") && text.ends_with("/15 and 4 more"), "{text}");
    }

    #[test]
    fn ancestors_walk_up_to_the_root() {
        assert_eq!(ancestors("/a/b/c").collect::<Vec<_>>(), ["/a/b", "/a", "/"]);
        assert_eq!(ancestors("/a").collect::<Vec<_>>(), ["/"]);
        assert_eq!(ancestors("/").count(), 0);
    }

    /// Metadata zarrs refuses is reported as such, not as a missing node.
    #[test]
    fn refused_metadata_is_not_a_missing_node() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/zarr.json"), b"{not json").unwrap();
        let err = open_array(dir.path(), "a", "--array").unwrap_err();
        assert!(matches!(err, OpenError::Array { .. }), "{err:?}");
    }

    /// A node under an array: the array is named, as what to pick.
    #[test]
    fn a_node_under_an_array_names_the_array() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(GdsStore::new(dir.path()).unwrap());
        ArrayBuilder::new(vec![4], vec![4], data_type::uint8(), 0u8)
            .build(store, "/")
            .unwrap()
            .store_metadata()
            .unwrap();
        let err = open_array(dir.path(), "0", "--array").unwrap_err();
        assert!(matches!(&err, OpenError::NodeNotFound { array_above: Some(a), .. } if a == "/"), "{err:?}");
        assert!(err.to_string().contains("\"/\" above it is an array (pick it with --array)"), "{err}");
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
