//! Opening arrays by path or URL, as the command line and the Python package do.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zarrs::array::{Array, ArrayCreateError};
use zarrs::filesystem::FilesystemStoreCreateError;
use zarrs::group::{Group, GroupCreateError};
use zarrs::metadata::NodeMetadata;
use zarrs_gds_store::{AnyStore, GdsStore};
use zarrs_storage::{ReadableStorageTraits, StorageError, StoreKey};

/// At most this many array paths in a message: a group may hold thousands.
const LISTED: usize = 16;

/// Why [`open_array`] (or [`store_at`]) could not open an array.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Nothing is at the store's path (the Python package says the same).
    #[error("{}: no such directory", path.display())]
    NoSuchDirectory {
        /// The store's path.
        path: PathBuf,
    },
    /// The store's path is not a directory.
    #[error("{}: not a directory (a Zarr filesystem store is one)", path.display())]
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
    /// The node's metadata file lacks a field an array needs, or holds one of the wrong kind.
    #[error("opening array {node:?} in {}: {file}: {problem}", path.display())]
    Metadata {
        /// The store's path or URL.
        path: PathBuf,
        /// The node path.
        node: String,
        /// The metadata file's key in the store (`zarr.json`, `0/.zarray`).
        file: String,
        /// The field and what is wrong with it.
        problem: String,
        /// zarrs' error (which names no field).
        source: ArrayCreateError,
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
/// [`OpenError::NoSuchDirectory`] when nothing is at `path`, [`OpenError::NotADirectory`] when
/// it is not a directory, [`OpenError::Store`] when it cannot be opened, [`OpenError::Remote`]
/// for a URL that cannot be used.
#[allow(clippy::result_large_err)] // once per opening, and callers match on it
pub fn store_at(path: &Path) -> Result<Arc<AnyStore>, OpenError> {
    match path.to_str() {
        Some(url) if AnyStore::is_url(url) => store_with_options(url, &[]),
        _ => {
            if !path.exists() {
                return Err(OpenError::NoSuchDirectory { path: path.to_path_buf() });
            }
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
/// [`OpenError::IsAGroup`], [`OpenError::NodeNotFound`], [`OpenError::Metadata`] for metadata
/// that lacks a field or holds a bad one, [`OpenError::Array`] for other metadata zarrs refuses,
/// and [`store_at`]'s errors; each names the path and the node.
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
        // zarrs' serde errors name a line and column, never the field: name it where we can.
        if let Some((file, problem)) = metadata_problem(store.as_ref(), &node) {
            return Err(OpenError::Metadata { path, node, file, problem, source: err });
        }
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

/// The fields a Zarr v3 array's `zarr.json` must have.
const V3_FIELDS: [&str; 8] =
    ["zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding", "fill_value", "codecs"];
/// The fields a Zarr v2 array's `.zarray` must have.
const V2_FIELDS: [&str; 8] =
    ["zarr_format", "shape", "chunks", "dtype", "compressor", "fill_value", "order", "filters"];

/// What is wrong with the array metadata at `node` of `store`, where a field is missing or of
/// the wrong kind: the metadata file's key and the problem. None where the file is absent, is
/// not a JSON object, or its fields look right (zarrs' own error says more then).
fn metadata_problem<S: ReadableStorageTraits + ?Sized>(store: &S, node: &str) -> Option<(String, String)> {
    let prefix = node.trim_matches('/');
    let key = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
    for (name, version) in [("zarr.json", 3), (".zarray", 2)] {
        let file = key(name);
        let Ok(Some(bytes)) = store.get(&StoreKey::new(file.clone()).ok()?) else { continue };
        let serde_json::Value::Object(fields) = serde_json::from_slice(&bytes).ok()? else { return None };
        return fields_problem(&fields, version).map(|problem| (file, problem));
    }
    None
}

/// A field, what it should hold, and whether a value does.
type FieldRule<'a> = (&'static str, &'static str, &'a dyn Fn(&serde_json::Value) -> bool);

/// The first missing or ill-kinded field of a Zarr `version` array's metadata `fields`.
fn fields_problem(fields: &serde_json::Map<String, serde_json::Value>, version: u8) -> Option<String> {
    use serde_json::Value;
    let required: &[&str] = if version == 3 { &V3_FIELDS } else { &V2_FIELDS };
    let missing: Vec<&str> = required.iter().copied().filter(|f| !fields.contains_key(*f)).collect();
    if !missing.is_empty() {
        let (what, verb) = if missing.len() == 1 { ("field", "is") } else { ("fields", "are") };
        return Some(format!(
            "the {what} {} {verb} missing (a Zarr v{version} array's metadata has {})",
            missing.iter().map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(", "),
            required.join(", ")
        ));
    }
    let sizes = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(|n| n.as_u64().is_some()));
    let named = |v: &Value| v.is_string() || v.get("name").is_some_and(Value::is_string);
    let expected: &[FieldRule<'_>] = if version == 3 {
        &[
            ("zarr_format", "3", &|v| v.as_u64() == Some(3)),
            ("node_type", "\"array\"", &|v| v.as_str() == Some("array")),
            ("shape", "a list of non-negative integers", &sizes),
            ("data_type", "a name, or an object with a \"name\"", &named),
            ("chunk_grid", "an object with a \"name\"", &|v| v.is_object() && named(v)),
            ("chunk_key_encoding", "an object with a \"name\"", &|v| v.is_object() && named(v)),
            ("codecs", "a list of codecs, each a name or an object with a \"name\"", &|v| {
                v.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(&named))
            }),
        ]
    } else {
        &[
            ("zarr_format", "2", &|v| v.as_u64() == Some(2)),
            ("shape", "a list of non-negative integers", &sizes),
            ("chunks", "a list of positive integers", &|v| {
                v.as_array().is_some_and(|a| a.iter().all(|n| n.as_u64().is_some_and(|n| n > 0)))
            }),
            ("dtype", "a numpy type string or a list of fields", &|v| v.is_string() || v.is_array()),
            ("compressor", "null or an object with an \"id\"", &|v| v.is_null() || v.get("id").is_some()),
            ("order", "\"C\" or \"F\"", &|v| matches!(v.as_str(), Some("C" | "F"))),
            ("filters", "null or a list of objects with an \"id\"", &|v| {
                v.is_null() || v.as_array().is_some_and(|a| a.iter().all(|f| f.get("id").is_some()))
            }),
        ]
    };
    let value = |field: &str| fields.get(field).unwrap_or(&Value::Null);
    expected.iter().find(|(field, _, ok)| !ok(value(field))).map(|(field, wanted, _)| {
        let mut shown = value(field).to_string();
        if shown.len() > 60 {
            shown = format!("{}...", shown.chars().take(60).collect::<String>());
        }
        format!("the field \"{field}\" is {shown}: expected {wanted}")
    })
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

    /// zarrs said `Expected metadata "<name>" or {"name":"<name>"} ... at line 1 column 55` for a
    /// zarr.json without its codecs: the error names the field, and a field of the wrong kind.
    #[test]
    fn metadata_errors_name_the_missing_or_bad_field() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(GdsStore::new(dir.path()).unwrap());
        ArrayBuilder::new(vec![6, 4], vec![3, 4], data_type::float32(), 0f32)
            .build(store, "/a")
            .unwrap()
            .store_metadata()
            .unwrap();
        let file = dir.path().join("a/zarr.json");
        let whole: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert!(open_array(dir.path(), "a", "--array").is_ok());
        let with = |edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
            let mut fields = whole.as_object().unwrap().clone();
            edit(&mut fields);
            std::fs::write(&file, serde_json::to_vec(&fields).unwrap()).unwrap();
            let err = open_array(dir.path(), "/a", "--array").unwrap_err();
            assert!(matches!(err, OpenError::Metadata { ref file, .. } if file == "a/zarr.json"), "{err:?}");
            err.to_string()
        };
        for field in V3_FIELDS.iter().filter(|f| **f != "node_type") {
            let text = with(&|f| {
                f.remove(*field);
            });
            assert!(text.contains(&format!("a/zarr.json: the field \"{field}\" is missing")), "{field}: {text}");
            assert!(text.contains("opening array \"/a\" in") && text.contains("fill_value, codecs"), "{text}");
        }
        let text = with(&|f| {
            f.remove("codecs");
            f.remove("chunk_grid");
        });
        assert!(text.contains("the fields \"chunk_grid\", \"codecs\" are missing"), "{text}");
        let text = with(&|f| {
            f.insert("shape".into(), serde_json::json!("six by four"));
        });
        assert!(text.contains("the field \"shape\" is \"six by four\": expected a list of non-negative"), "{text}");
        let text = with(&|f| {
            f.insert("codecs".into(), serde_json::json!([]));
        });
        assert!(text.contains("the field \"codecs\" is []: expected a list of codecs"), "{text}");
        // Without node_type zarrs cannot tell an array: still named.
        let text = with(&|f| {
            f.remove("node_type");
        });
        assert!(text.contains("the field \"node_type\" is missing"), "{text}");
        // Metadata whose fields look right but that zarrs refuses keeps zarrs' error.
        let mut fields = whole.as_object().unwrap().clone();
        fields.insert("data_type".into(), serde_json::json!("float1024"));
        std::fs::write(&file, serde_json::to_vec(&fields).unwrap()).unwrap();
        let err = open_array(dir.path(), "/a", "--array").unwrap_err();
        assert!(matches!(err, OpenError::Array { .. }), "{err:?}");
        assert!(err.to_string().contains("float1024") && !err.to_string().contains("the field"), "{err}");
    }

    /// A v2 array's .zarray: its fields named the same way.
    #[test]
    fn v2_metadata_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let zarray = serde_json::json!({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<f4",
            "compressor": null, "fill_value": 0, "order": "C", "filters": null});
        std::fs::write(dir.path().join(".zarray"), zarray.to_string()).unwrap();
        assert!(open_array(dir.path(), "/", "--array").is_ok());
        let mut bad = zarray.clone();
        bad.as_object_mut().unwrap().remove("dtype");
        std::fs::write(dir.path().join(".zarray"), bad.to_string()).unwrap();
        let text = open_array(dir.path(), "/", "--array").unwrap_err().to_string();
        assert!(text.contains(".zarray: the field \"dtype\" is missing (a Zarr v2 array's metadata has"), "{text}");
        bad = zarray;
        bad["order"] = "K".into();
        std::fs::write(dir.path().join(".zarray"), bad.to_string()).unwrap();
        let text = open_array(dir.path(), "/", "--array").unwrap_err().to_string();
        assert!(text.contains("the field \"order\" is \"K\": expected \"C\" or \"F\""), "{text}");
    }

    /// Nothing at the path: "no such directory", as the Python package says; a file: not one.
    #[test]
    fn a_missing_store_and_a_file_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent.zarr");
        let err = open_array(&absent, "/", "--array").unwrap_err();
        assert_eq!(err.to_string(), format!("{}: no such directory", absent.display()));
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = open_array(&file, "/", "--array").unwrap_err();
        assert!(matches!(err, OpenError::NotADirectory { .. }), "{err:?}");
        assert!(err.to_string().ends_with(": not a directory (a Zarr filesystem store is one)"), "{err}");
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
