//! The `zarrs-gpu` command line: its error paths (everywhere) and its reads (on a GPU host).

use std::error::Error;
use std::process::{Command, Output};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use zarrs::array::codec::{GzipCodec, ZlibCodec, ZstdCodec};
use zarrs::array::{data_type, ArrayBuilder, ArrayBytes, ArraySubset};
use zarrs_gpu::{sample, GdsStore};

#[path = "common/metadata.rs"]
mod metadata;

type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

fn zarrs_gpu(args: &[&str]) -> Result<(Output, String)> {
    zarrs_gpu_with(args, &[])
}

/// Run the program with `env` added to its environment.
fn zarrs_gpu_with(args: &[&str], env: &[(&str, &str)]) -> Result<(Output, String)> {
    // Staged test binaries run on another machine, with the program on PATH instead.
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_zarrs-gpu"));
    let program = if built.exists() { built.as_os_str() } else { std::ffi::OsStr::new("zarrs-gpu") };
    let output = Command::new(program).args(args).envs(env.iter().copied()).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!text.contains("panicked"), "{text}");
    Ok((output, text))
}

fn gpu_present() -> bool {
    zarrs_gpu::zarrs_gpu_codecs::reader::cuda_context(0).is_ok()
}

#[test]
fn errors_are_plain_messages() -> Result {
    let (out, text) = zarrs_gpu(&["read", "/nonexistent/volume.zarr"])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    // The Python package's words for it too.
    assert!(text.contains("zarrs-gpu: error: /nonexistent/volume.zarr: no such directory"), "{text}");

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    // numpy users' slices: a step says it is not supported, an integer outside the array that it
    // is out of bounds, negative indices count from the end.
    let (_, text) = zarrs_gpu(&["read", p, "--subset", "0:10:2"])?;
    assert!(text.contains("steps are not supported"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--subset", "-11"])?;
    assert_eq!(out.status.code(), Some(2), "a usage error: {text}");
    assert!(text.contains("index -11 is out of bounds for axis 0 with size 10"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--array", "/missing"])?;
    assert_eq!(out.status.code(), Some(1));
    assert!(text.contains("no array or group at \"/missing\""), "{text}");
    assert!(text.contains("\"/\" above it is an array (pick it with --array)"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--backend", "fastest"])?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("unknown I/O backend"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--decode-trust", "always"])?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("verified, checked or trusted"), "{text}");
    if !gpu_present() {
        let (out, text) = zarrs_gpu(&["read", p])?;
        assert_eq!(out.status.code(), Some(1));
        assert!(text.contains("no CUDA device available"), "{text}");
    }
    Ok(())
}

/// Without a GPU, `read` with no path says so before it writes its 256 MiB sample array.
#[test]
fn read_without_a_path_checks_the_device_before_writing_the_sample() -> Result {
    if gpu_present() {
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let (out, text) = zarrs_gpu_with(&["read"], &[("TMPDIR", tmp.path().to_str().unwrap())])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("no CUDA device available"), "{text}");
    // Where a sample comes from without a GPU.
    assert!(text.contains("`zarrs-gpu sample DIR` writes the sample array without one"), "{text}");
    assert!(!text.contains("writing a sample"), "the sample was written first: {text}");
    assert_eq!(std::fs::read_dir(tmp.path())?.count(), 0, "the sample's directory is left behind or was made");
    // For scripts, the kind it has with a PATH: no_cuda (it was "error").
    let (out, text) = zarrs_gpu_with(&["read", "--json"], &[("TMPDIR", tmp.path().to_str().unwrap())])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {text}"))?;
    assert_eq!(
        (&json["kind"], &json["command"], &json["path"]),
        (&"no_cuda".into(), &"read".into(), &None::<String>.into())
    );
    assert_eq!(std::fs::read_dir(tmp.path())?.count(), 0);
    Ok(())
}

/// `sample DIR` writes the sample array with no device asked for, so that a CPU machine has
/// something for `info` (and a GPU one for `read`): the values are `sample_value`'s, and nothing
/// is written over.
#[test]
fn sample_writes_an_array_without_a_gpu() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("s.zarr");
    let p = path.to_str().unwrap();
    let (out, text) = zarrs_gpu(&["sample", p, "--shape", "20,30,7", "--chunks", "8,16,7"])?;
    assert!(out.status.success(), "{text}");
    assert!(text.contains("wrote a sample float32 array [20, 30, 7] (chunks [8, 16, 7]") && text.contains(p), "{text}");
    let array = zarrs::array::Array::open(Arc::new(GdsStore::new(&path)?), "/")?;
    assert_eq!((array.shape(), array.data_type()), (&[20u64, 30, 7][..], &data_type::float32()));
    let got: Vec<f32> = array.retrieve_array_subset(&ArraySubset::new_with_shape(vec![20, 30, 7]))?;
    let wanted: Vec<f32> = (0..20 * 30 * 7).map(|i| sample::sample_value(i, &[20, 30, 7])).collect();
    assert!(got == wanted, "the sample's values differ from sample_value's");
    assert!(got.iter().map(|v| v.to_bits()).collect::<std::collections::HashSet<_>>().len() > 16, "a constant sample");
    // info works on it, GPU or not, and says the chunks go straight to the device.
    let (out, text) = zarrs_gpu(&["info", p])?;
    assert!(out.status.success(), "{text}");
    assert!(text.contains("shape [20, 30, 7]") && text.contains("read straight to the device"), "{text}");
    // Not over an array, nor into a directory with files; the array is left as it was.
    let (out, text) = zarrs_gpu(&["sample", p, "--shape", "4"])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert_eq!(zarrs::array::Array::open(Arc::new(GdsStore::new(&path)?), "/")?.shape(), [20, 30, 7]);
    assert!(text.contains("a Zarr node is there already"), "{text}");
    let full = dir.path().join("full");
    std::fs::create_dir(&full)?;
    std::fs::write(full.join("notes.txt"), b"mine")?;
    let (out, text) = zarrs_gpu(&["sample", full.to_str().unwrap()])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("the directory is not empty"), "{text}");
    assert_eq!(std::fs::read_dir(&full)?.count(), 1);
    // Other dimensions: chunks of at most 64 by default.
    let flat = dir.path().join("flat.zarr");
    let (out, text) = zarrs_gpu(&["sample", flat.to_str().unwrap(), "--shape", "100,9"])?;
    assert!(out.status.success(), "{text}");
    assert!(text.contains("[100, 9] (chunks [64, 9]"), "{text}");
    // Bad shapes are usage errors (2), before anything is made.
    let fresh = dir.path().join("fresh.zarr");
    let f = fresh.to_str().unwrap();
    for (args, wanted) in [
        (vec!["--shape", "4,0"], "--shape 4,0: sizes of at least 1"),
        (vec!["--shape", "4,4", "--chunks", "2"], "--chunks 2: 1 sizes for an array of 2 dimensions"),
        (vec!["--shape", "x"], "--shape x: sizes of at least 1"),
    ] {
        let mut all = vec!["sample", f];
        all.extend(args);
        let (out, text) = zarrs_gpu(&all)?;
        assert_eq!(out.status.code(), Some(2), "{all:?}: {text}");
        assert!(text.contains(wanted), "{all:?}: {text}");
        assert!(!fresh.exists(), "{all:?}");
    }
    Ok(())
}

/// Usage errors exit 2, as clap's own do; `--codec` exited 1. `--subset`'s help showed
/// `[default: ""]`.
#[test]
fn bad_arguments_exit_2_and_help_shows_no_empty_default() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    let out_dir = dir.path().join("b.zarr");
    let o = out_dir.to_str().unwrap();
    for args in [
        vec!["convert", p, o, "--codec", "lz4"],
        // The codec's form is checked before the source is opened.
        vec!["convert", "/nonexistent/src.zarr", o, "--codec", "lz4"],
        vec!["convert", p, o, "--chunks", "4,0"],
        vec!["convert", p, o, "--shard", "6,5"],
        vec!["convert", p, o, "--crc32c", "--no-checksum"],
        vec!["read", p, "--subset", "0:10:2"],
        vec!["read", p, "--no-such-flag"],
        vec!["sample", o, "--shape", "0"],
    ] {
        let (out, text) = zarrs_gpu(&args)?;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(!out_dir.exists(), "{args:?}");
    }
    let (_, text) = zarrs_gpu(&["convert", p, o, "--shard", "6,5"])?;
    assert!(text.contains("--shard [6, 5] is not a multiple of the chunks [4, 5]"), "{text}");
    let (_, text) = zarrs_gpu(&["convert", p, o, "--crc32c", "--no-checksum"])?;
    assert!(text.contains("cannot be used with"), "{text}");
    // Work that fails is 1.
    let (out, text) = zarrs_gpu(&["convert", "/nonexistent/src.zarr", o])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (out, help) = zarrs_gpu(&["read", "--help"])?;
    assert!(out.status.success() && help.contains("--subset <SUBSET>"), "{help}");
    assert!(!help.contains("[default: ]") && !help.contains("[default: \"\"]"), "{help}");
    // Every place says what the device encodes: gzip, zlib and Blosc too (they said zstd,
    // crc32c, none).
    for args in [vec!["--help"], vec!["convert", "--help"]] {
        let (_, help) = zarrs_gpu(&args)?;
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("zstd, gzip, zlib, Blosc lz4 or zstd, crc32c, none"), "{args:?}: {help}");
    }
    Ok(())
}

/// A zarr.json without a field said `Expected metadata "<name>" or {"name":"<name>"} ... at line
/// 1 column 55`: `info` and `read` name the file and the field.
#[test]
fn metadata_errors_name_the_field() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    let file = path.join("zarr.json");
    let mut metadata: serde_json::Value = serde_json::from_slice(&std::fs::read(&file)?)?;
    metadata.as_object_mut().ok_or("an object")?.remove("codecs");
    std::fs::write(&file, metadata.to_string())?;
    for command in ["info", "read"] {
        let (out, text) = zarrs_gpu(&[command, p])?;
        assert_eq!(out.status.code(), Some(1), "{command}: {text}");
        assert!(
            text.contains("zarr.json: the field \"codecs\" is missing (a Zarr v3 array's metadata has"),
            "{command}: {text}"
        );
        assert!(!text.contains("Expected metadata"), "{command}: {text}");
    }
    metadata["codecs"] = serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    metadata["chunk_grid"] = serde_json::json!("regular");
    std::fs::write(&file, metadata.to_string())?;
    let (out, text) = zarrs_gpu(&["read", p, "--json"])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(json["kind"], "open", "{json}");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(error.contains("the field \"chunk_grid\" is \"regular\": expected an object with a \"name\""), "{json}");
    Ok(())
}

/// `convert` writes checks by default (zstd's content checksum, else a crc32c), and none with
/// `--no-checksum`. An array without elements needs no device, so this runs anywhere: the
/// converted array's metadata says what its chunks carry.
#[test]
fn convert_adds_checks_unless_told_not_to() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("empty.zarr");
    ArrayBuilder::new(vec![0, 12], vec![4, 6], data_type::int16(), 0i16)
        .build(Arc::new(GdsStore::new(&path)?), "/")?
        .store_metadata()?;
    let p = path.to_str().unwrap();
    // The bytes-to-bytes codecs of the converted array's chunks (its inner chunks where sharded).
    let codecs_of = |args: &[&str]| -> Result<(Vec<serde_json::Value>, String)> {
        let out_dir = dir.path().join(format!("out{}.zarr", args.join("").replace([':', '-', ','], "")));
        let mut all = vec!["convert", p, out_dir.to_str().unwrap()];
        all.extend(args);
        let (out, text) = zarrs_gpu(&all)?;
        assert!(out.status.success(), "{all:?}: {text}");
        assert!(text.contains("no elements: the metadata alone"), "{text}");
        let metadata: serde_json::Value = serde_json::from_slice(&std::fs::read(out_dir.join("zarr.json"))?)?;
        assert_eq!(metadata["shape"], serde_json::json!([0, 12]), "{metadata}");
        let mut codecs = metadata["codecs"].as_array().ok_or("codecs")?.clone();
        if codecs[0]["name"] == "sharding_indexed" {
            codecs = codecs[0]["configuration"]["codecs"].as_array().ok_or("inner codecs")?.clone();
        }
        assert_eq!(codecs[0]["name"], "bytes", "{metadata}");
        Ok((codecs[1..].to_vec(), text))
    };
    let names = |codecs: &[serde_json::Value]| codecs.iter().map(|c| c["name"].clone()).collect::<Vec<_>>();
    // zstd (the default codec): its content checksum.
    let (codecs, text) = codecs_of(&[])?;
    assert_eq!(names(&codecs), ["zstd"], "{codecs:?}");
    assert_eq!(codecs[0]["configuration"]["checksum"], true, "{codecs:?}");
    assert!(text.contains("checked by zstd's content checksums"), "{text}");
    let (codecs, text) = codecs_of(&["--no-checksum"])?;
    assert_eq!((names(&codecs), &codecs[0]["configuration"]["checksum"]), (vec!["zstd".into()], &false.into()));
    assert!(text.contains("no checks (--no-checksum)"), "{text}");
    let (codecs, _) = codecs_of(&["--crc32c", "--codec", "zstd:1"])?;
    assert_eq!(
        (names(&codecs), &codecs[0]["configuration"]["checksum"]),
        (vec!["zstd".into(), "crc32c".into()], &false.into())
    );
    // Every other codec, none too: a crc32c after it, unless --no-checksum.
    for codec in ["none", "gzip:3", "zlib", "blosc-lz4-bitshuffle"] {
        let (codecs, text) = codecs_of(&["--codec", codec])?;
        assert_eq!(names(&codecs).last(), Some(&"crc32c".into()), "{codec}: {codecs:?}");
        assert!(text.contains("checked by crc32c"), "{codec}: {text}");
        let (codecs, _) = codecs_of(&["--codec", codec, "--no-checksum"])?;
        assert!(!names(&codecs).contains(&"crc32c".into()), "{codec}: {codecs:?}");
        assert_eq!(codecs.len(), usize::from(codec != "none"), "{codec}: {codecs:?}");
    }
    // Sharded: the checks on the inner chunks.
    let (codecs, _) = codecs_of(&["--chunks", "2,3", "--shard", "4,6"])?;
    assert_eq!((names(&codecs), &codecs[0]["configuration"]["checksum"]), (vec!["zstd".into()], &true.into()));
    let (codecs, _) = codecs_of(&["--chunks", "2,3", "--shard", "4,6", "--codec", "gzip"])?;
    assert_eq!(names(&codecs), ["gzip", "crc32c"], "{codecs:?}");
    Ok(())
}

#[test]
fn subsets_clamp_as_numpy_slices_do() -> Result {
    // `a[0:1000]` of 10 rows is the 10 rows and `a[5:2]` none, in numpy, zarr-python and the
    // Python package alike: the command line reads them (empty: no chunk), never refuses them.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    for (subset, shape) in [("0:1000", [10, 12]), ("-100:3,5:", [3, 7]), ("5:2", [0, 12]), ("3:3,:", [0, 12])] {
        let (out, text) = zarrs_gpu(&["read", p, "--subset", subset, "--repeat", "1", "--json"])?;
        assert!(!text.contains("outside") && !text.contains("selects nothing"), "{subset}: {text}");
        if gpu_present() {
            assert!(out.status.success(), "{subset}: {text}");
            let line = text.lines().find(|l| l.starts_with('{')).ok_or("no JSON line")?;
            let json: serde_json::Value = serde_json::from_str(line)?;
            assert_eq!(json["shape"], serde_json::json!(shape), "{subset}");
            if shape.contains(&0) {
                assert_eq!((json["chunks"].as_u64(), json["bytes"].as_u64()), (Some(0), Some(0)), "{json}");
            }
        } else {
            // Past the subset's parsing: up to the device, which is missing here.
            assert_eq!(out.status.code(), Some(1), "{subset}: {text}");
            assert!(text.contains("no CUDA device available"), "{subset}: {text}");
        }
    }
    Ok(())
}

#[test]
fn bad_environment_values_are_errors_naming_the_variable() -> Result {
    let cases = [
        ("ZARRS_GPU_DECODE_TRUST", "always", "verified, checked or trusted"),
        ("ZARRS_GPU_STAGING_BYTES", "1G", "a byte count of at least 1048576"),
        ("ZARRS_GPU_STAGING_BYTES", "4096", "a byte count of at least 1048576"),
        ("ZARRS_GPU_HOST_DECODE_FRACTION", "1.5", "a number from 0 to 1"),
        ("ZARRS_GPU_HOST_ENCODE_LEVEL", "high", "a codec level (an integer)"),
        ("ZARRS_GPU_TRACE", "maybe", "1, true, on, yes, 0, false, off or no"),
        ("ZARRS_GPU_ROW_READS", "sometimes", "1, true, on, yes, 0, false, off or no"),
        ("ZARRS_GDS_BACKEND", "fastest", "auto, gds or posix"),
        ("ZARRS_GDS_NTHREADS", "0", "a thread count from 1 to 256"),
        ("ZARRS_GDS_TASK_SIZE", "4k", "a byte count of at least 4096"),
        ("ZARRS_GPU_POOL_KEEP_BYTES", "-1", "a byte count"),
    ];
    for (variable, value, expected) in cases {
        // Refused before anything is written or read (no GPU needed).
        let (out, text) = zarrs_gpu_with(&["read", "/nonexistent/volume.zarr"], &[(variable, value)])?;
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(&format!("{variable}=\"{value}\"")) && text.contains(expected), "{text}");
    }
    Ok(())
}

#[test]
fn info_on_a_group_lists_its_arrays_and_multiscale_levels() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    // An OME-Zarr 0.4 style image: two levels and a label array in a subgroup.
    let attributes: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(r#"{"multiscales": [{"name": "cells", "datasets": [{"path": "0"}, {"path": "1"}]}]}"#)?;
    zarrs::group::GroupBuilder::new().attributes(attributes).build(store.clone(), "/")?.store_metadata()?;
    for (path, shape) in [("/0", vec![64u64, 64]), ("/1", vec![32, 32])] {
        ArrayBuilder::new(shape, vec![16, 16], data_type::uint16(), 0u16)
            .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
            .build(store.clone(), path)?
            .store_metadata()?;
    }
    zarrs::group::GroupBuilder::new().build(store.clone(), "/labels")?.store_metadata()?;
    ArrayBuilder::new(vec![64, 64], vec![32, 32], data_type::uint8(), 0u8)
        .bytes_to_bytes_codecs(vec![Arc::new(ZlibCodec::new(5u32.try_into().expect("a zlib level")))])
        .build(store.clone(), "/labels/mask")?
        .store_metadata()?;
    let p = dir.path().to_str().unwrap();
    let (out, text) = zarrs_gpu(&["info", p])?;
    assert!(out.status.success(), "{text}");
    assert!(text.contains("OME-Zarr multiscale 0 cells"), "{text}");
    assert!(text.contains("level 0: /0 shape [64, 64]") && text.contains("level 1: /1 shape [32, 32]"), "{text}");
    assert!(text.contains("3 arrays:"), "{text}");
    // One array: singular.
    let (out, one) = zarrs_gpu(&["info", p, "--array", "labels"])?;
    assert!(out.status.success(), "{one}");
    assert!(one.contains("group /labels\n1 array:\n  /labels/mask shape [64, 64]"), "{one}");
    assert!(!one.contains("1 arrays"), "{one}");
    let line = |name: &str| text.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_default().to_string();
    let level1 = line("/1 ");
    assert!(level1.contains("shape [32, 32] uint16") && level1.contains("chunks [16, 16]"), "{text}");
    // zlib: on the device where nvCOMP loads, else the host route naming nvCOMP.
    let mask = line("/labels/mask ");
    let route =
        if zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok() { "decoded on the device" } else { "host route" };
    assert!(mask.contains("uint8") && mask.contains(&format!("chunks [32, 32]: {route}")), "{text}");
    // Node paths with or without the leading slash; a group given to read names its arrays.
    let (out, text) = zarrs_gpu(&["info", p, "--array", "labels/mask"])?;
    assert!(out.status.success() && text.contains("zlib"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--array", "labels"])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("is a group, not an array; its arrays: /labels/mask"), "{text}");
    Ok(())
}

/// `info` on a group and `info --array` on one of its arrays tell the same route: a gzip array
/// with nvCOMP not loadable decodes on the host, and both say so (the group's line said "decoded
/// on the device"). `NVCOMP_LIBRARY_PATH` set is the only place nvCOMP is looked for.
#[test]
fn info_on_a_group_and_on_an_array_agree_without_nvcomp() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    zarrs::group::GroupBuilder::new().build(store.clone(), "/")?.store_metadata()?;
    ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::uint16(), 0u16)
        .bytes_to_bytes_codecs(vec![Arc::new(GzipCodec::new(5)?)])
        .build(store.clone(), "/g")?
        .store_metadata()?;
    ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::uint16(), 0u16)
        .bytes_to_bytes_codecs(vec![Arc::new(GzipCodec::new(5)?)])
        .build(store, "/h")?
        .store_metadata()?;
    let p = dir.path().to_str().unwrap();
    let missing = [("NVCOMP_LIBRARY_PATH", "/nonexistent/libnvcomp.so.6")];
    let (out, group) = zarrs_gpu_with(&["info", p], &missing)?;
    assert!(out.status.success(), "{group}");
    let line = group.lines().find(|l| l.trim_start().starts_with("/g ")).unwrap_or_default();
    assert!(line.contains("host route") && line.contains("nvCOMP could not be loaded (below)"), "{group}");
    // Where it looked, said once for the group (it was repeated on every array's line).
    assert!(group.contains("/nonexistent/libnvcomp.so.6"), "{group}");
    assert_eq!(group.matches("could not be loaded; tried").count(), 1, "{group}");
    let (out, array) = zarrs_gpu_with(&["info", p, "--array", "/g"], &missing)?;
    assert!(out.status.success(), "{array}");
    assert!(array.contains("decoded by zarrs on the host") && array.contains("/nonexistent/libnvcomp.so.6"), "{array}");
    // Where nvCOMP loads (CI names it), both say the device.
    if zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok() {
        let (_, group) = zarrs_gpu(&["info", p])?;
        let (_, array) = zarrs_gpu(&["info", p, "--array", "/g"])?;
        assert!(group.contains("/g ") && group.contains("decoded on the device"), "{group}");
        assert!(array.contains("decoded and placed on the device"), "{array}");
    }
    Ok(())
}

/// `info --array 0` on an OME-Zarr group (levels s0, s1) said only "array metadata is missing".
#[test]
fn a_missing_node_names_what_is_there() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    // OME-Zarr 0.5: the multiscales under "ome".
    let attributes: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        r#"{"ome": {"version": "0.5", "multiscales": [{"datasets": [{"path": "s0"}, {"path": "s1"}]}]}}"#,
    )?;
    zarrs::group::GroupBuilder::new().attributes(attributes).build(store.clone(), "/")?.store_metadata()?;
    for (path, n) in [("/s0", 16u64), ("/s1", 8)] {
        ArrayBuilder::new(vec![n, n], vec![8, 8], data_type::uint8(), 0u8)
            .build(store.clone(), path)?
            .store_metadata()?;
    }
    let p = dir.path().to_str().unwrap();
    for command in ["info", "read"] {
        let (out, text) = zarrs_gpu(&[command, p, "--array", "0"])?;
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(!text.contains("metadata is missing"), "{command}: {text}");
        assert!(
            text.contains("no array or group at \"/0\"")
                && text
                    .contains("the nearest group, \"/\": its arrays: /s0, /s1; OME-Zarr multiscale levels: /s0, /s1")
                && text.contains("(pick one with --array)"),
            "{command}: {text}"
        );
    }
    // And for scripts, the same as fields of the JSON error.
    let (out, text) = zarrs_gpu(&["read", p, "--array", "0", "--json"])?;
    assert_eq!(out.status.code(), Some(1), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(json["kind"], "node_not_found", "{json}");
    assert_eq!(json["nearest_group"], "/", "{json}");
    assert_eq!(json["levels"], serde_json::json!(["/s0", "/s1"]), "{json}");
    Ok(())
}

/// With `--json`, every error is one JSON object on stdout (nothing on stderr), with the exit
/// code it had: they printed as plain text.
#[test]
fn json_errors_are_json_objects() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    let error = |args: &[&str], code: i32, kind: &str| -> Result<serde_json::Value> {
        let (out, text) = zarrs_gpu(args)?;
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        assert!(out.stderr.is_empty(), "{args:?}: {text}");
        let json: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("{args:?}: {e}: {text}"))?;
        assert_eq!(json["kind"], kind, "{args:?}: {json}");
        assert!(json["error"].as_str().is_some_and(|e| !e.is_empty() && !e.contains("zarrs-gpu: error")), "{json}");
        Ok(json)
    };
    let json = error(&["read", "/nonexistent/volume.zarr", "--json"], 1, "open")?;
    assert!(json["error"].as_str().unwrap_or_default().contains("no such directory"), "{json}");
    assert_eq!((&json["command"], &json["path"]), (&"read".into(), &"/nonexistent/volume.zarr".into()), "{json}");
    let json = error(&["read", p, "--json", "--subset", "0:1,,:"], 2, "subset")?;
    assert!(json["error"].as_str().unwrap_or_default().contains("index part 1 of \"0:1,,:\" is empty"), "{json}");
    assert_eq!(json["subset"], "0:1,,:", "{json}");
    let json = error(&["read", p, "--json", "--npy", "/nonexistent/dir/out.npy"], 2, "npy")?;
    assert!(json["error"].as_str().unwrap_or_default().contains("does not exist"), "{json}");
    let json = error(&["read", p, "--json", "--array", "labels"], 1, "node_not_found")?;
    assert_eq!(json["array"], "/labels", "{json}");
    // clap's own errors (exit code 2) too.
    let json = error(&["read", p, "--json", "--backend", "fastest"], 2, "usage")?;
    assert!(json["error"].as_str().unwrap_or_default().contains("unknown I/O backend"), "{json}");
    let json = error(&["read", p, "--json", "--no-such-flag"], 2, "usage")?;
    assert!(json["error"].as_str().unwrap_or_default().contains("--no-such-flag"), "{json}");
    error(&["read", p, "--json", "--subset", "0:10:2"], 2, "subset")?;
    let (_, text) = zarrs_gpu_with(&["read", p, "--json"], &[("ZARRS_GPU_TRACE", "maybe")])?;
    assert!(text.contains("\"kind\":\"config\"") && text.contains("ZARRS_GPU_TRACE"), "{text}");
    if !gpu_present() {
        let json = error(&["read", p, "--json"], 1, "no_cuda")?;
        assert!(json["error"].as_str().unwrap_or_default().contains("no CUDA device available"), "{json}");
    }
    // Without --json, plain text on stderr as before.
    let (out, text) = zarrs_gpu(&["read", p, "--subset", "0:1,,:"])?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(out.stdout.is_empty() && text.starts_with("zarrs-gpu: error: index part 1"), "{text}");
    Ok(())
}

/// `--npy` into a directory that is not there failed only after the read (minutes, for a large one).
#[test]
fn npy_into_a_missing_directory_is_refused_before_reading() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    let npy = dir.path().join("no/such/dir/out.npy");
    let (out, text) = zarrs_gpu(&["read", p, "--npy", npy.to_str().unwrap()])?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("the directory {} does not exist", dir.path().join("no/such/dir").display())),
        "{text}"
    );
    // Before the device is asked for (no GPU here) or anything is read.
    assert!(!text.contains("no CUDA device") && !text.contains("GiB/s"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--npy", dir.path().to_str().unwrap()])?;
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("is a directory (give a file name)"), "{text}");
    Ok(())
}

/// numpy refuses `a[,]` and `a[0:1,,:]` (syntax errors); they were read as whole dimensions.
/// `a[0:1,]` is numpy's `a[0:1]`.
#[test]
fn empty_subset_parts_are_refused() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let p = path.to_str().unwrap();
    for (subset, at) in [(",", 0), ("0:1,,:", 1), (",:", 0)] {
        let text = refused_with(&["read", p, "--subset", subset], 2)?;
        assert!(text.contains(&format!("index part {at} of {subset:?} is empty")), "{subset}: {text}");
        assert!(text.contains("write : for a whole dimension"), "{text}");
    }
    for subset in ["0:1,", "...", ":", "...,0:2", ":,:"] {
        let (out, text) = zarrs_gpu(&["read", p, "--subset", subset, "--repeat", "1"])?;
        assert!(!text.contains("is empty"), "{subset}: {text}");
        if gpu_present() {
            assert!(out.status.success(), "{subset}: {text}");
        } else {
            assert!(text.contains("no CUDA device available"), "{subset}: {text}");
        }
    }
    Ok(())
}

/// A transpose is placed on the device (the gather kernel): its plan line said `host`.
#[test]
fn info_shows_a_transpose_on_the_device() -> Result {
    use zarrs::array::codec::{TransposeCodec, TransposeOrder};
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    ArrayBuilder::new(vec![8, 6], vec![4, 3], data_type::float32(), 0f32)
        .array_to_array_codecs(vec![Arc::new(TransposeCodec::new(TransposeOrder::new(&[1, 0])?))])
        .build(store, "/")?
        .store_metadata()?;
    let (out, text) = zarrs_gpu(&["info", dir.path().to_str().unwrap()])?;
    assert!(out.status.success(), "{text}");
    let plan = text.split("decode plan:").nth(1).unwrap_or_default();
    let line = plan.lines().find(|l| l.trim_start().starts_with("transpose")).unwrap_or_default();
    assert!(line.contains("device (elements gathered into C order"), "{text}");
    assert!(!plan.contains("()"), "{text}");
    Ok(())
}

#[test]
fn info_shows_the_decode_plan() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let (out, text) = zarrs_gpu(&["info", path.to_str().unwrap()])?;
    assert!(out.status.success(), "{text}");
    assert!(text.contains("\"shape\"") && text.contains("float32"), "{text}");
    assert!(text.contains("chunks are read straight to the device"), "{text}");
    // Sharded: the inner chain is shown under the sharding codec.
    let sharded = dir.path().join("s.zarr");
    sample::create_sharded_sample_array(
        &sharded,
        &[16, 16],
        &[8, 16],
        &[4, 4],
        vec![Arc::new(ZstdCodec::new(3, false))],
    )?;
    let (out, text) = zarrs_gpu(&["info", sharded.to_str().unwrap()])?;
    assert!(out.status.success(), "{text}");
    let plan = text.split("decode plan:").nth(1).unwrap_or_default();
    assert!(plan.contains("sharding_indexed") && plan.contains("index [bytes, crc32c]"), "{text}");
    assert!(plan.contains("\n    bytes") && plan.contains("\n    zstd"), "inner codecs indented: {text}");

    let store = Arc::new(GdsStore::new(dir.path())?);
    let array = ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::uint16(), 0u16)
        .bytes_to_bytes_codecs(vec![Arc::new(ZlibCodec::new(5u32.try_into().expect("a zlib level")))])
        .build(store.clone(), "/l")?;
    array.store_metadata()?;
    let (out, text) = zarrs_gpu(&["info", dir.path().to_str().unwrap(), "--array", "/l"])?;
    assert!(out.status.success(), "{text}");
    if zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok() {
        assert!(text.contains("nvCOMP batched deflate") && text.contains("Adler-32"), "{text}");
    } else {
        assert!(text.contains("zlib") && text.contains("decoded by zarrs on the host"), "{text}");
    }
    let array = ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::uint16(), 0u16)
        .bytes_to_bytes_codecs(vec![Arc::new(GzipCodec::new(5)?)])
        .build(store.clone(), "/g")?;
    array.store_metadata()?;
    let (out, text) = zarrs_gpu(&["info", dir.path().to_str().unwrap(), "--array", "/g"])?;
    assert!(out.status.success(), "{text}");
    if zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok() {
        assert!(text.contains("nvCOMP batched gzip") && text.contains("CRC-32"), "{text}");
    }
    let array = ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::uint16(), 0u16)
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, true))])
        .build(store, "/z")?;
    array.store_metadata()?;
    let (out, text) = zarrs_gpu(&["info", dir.path().to_str().unwrap(), "--array", "/z"])?;
    assert!(out.status.success(), "{text}");
    // Our zstd decoder needs no nvCOMP: the plan is the same with or without its library.
    assert!(
        text.contains("then our decoder")
            && text.contains("verified on the device (XXH64)")
            && text.contains("decoded and placed on the device"),
        "{text}"
    );
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn read_digest_and_npy_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    let array = sample::create_sample_array(&path, &[33, 70, 41], &[8, 16, 16])?;
    let subset = ArraySubset::new_with_ranges(&[3..30, 5..70, 0..41]);
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned();
    let npy = dir.path().join("out.npy");
    let (out, text) = zarrs_gpu(&[
        "read",
        path.to_str().unwrap(),
        "--subset",
        "3:30,5:,",
        "--digest",
        "--npy",
        npy.to_str().unwrap(),
    ])?;
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("sha256: {:x}", Sha256::digest(&want))), "{text}");
    assert!(text.contains("GiB/s") && text.contains("io: posix"), "{text}");
    let file = std::fs::read(&npy)?;
    assert!(file.starts_with(b"\x93NUMPY\x01\x00"));
    let header_len = u16::from_le_bytes([file[8], file[9]]) as usize;
    let header = std::str::from_utf8(&file[10..10 + header_len])?;
    assert!(header.contains("'descr': '<f4'") && header.contains("'shape': (27, 65, 41)"), "{header}");
    assert!(file[10 + header_len..] == want[..]);
    // With no path: a sample array is written and read.
    let (out, text) = zarrs_gpu(&["read", "--repeat", "1"])?;
    assert!(out.status.success() && text.contains("GiB/s"), "{text}");
    // gzip: host threads by default; when trusted, as the scheduler splits it (a read this small
    // goes to host threads), or all on nvCOMP; the same bytes every way.
    let path = dir.path().join("g.zarr");
    let array = sample::create_sample_array_with_codecs(
        &path,
        &[16, 40, 40],
        &[8, 16, 16],
        vec![Arc::new(GzipCodec::new(5)?)],
    )?;
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?.into_owned();
    let digest = format!("sha256: {:x}", Sha256::digest(&want));
    let p = path.to_str().unwrap();
    let (out, text) = zarrs_gpu(&["read", p, "--repeat", "1", "--digest"])?;
    assert!(out.status.success() && text.contains(&digest) && text.contains("18 decoded on host threads"), "{text}");
    let (out, text) = zarrs_gpu(&["read", p, "--repeat", "1", "--digest", "--decode-trust", "trusted"])?;
    assert!(out.status.success() && text.contains(&digest) && text.contains("18 decoded on host threads"), "{text}");
    let all_device = [("ZARRS_GPU_HOST_DECODE_FRACTION", "0")];
    let (out, text) =
        zarrs_gpu_with(&["read", p, "--repeat", "1", "--digest", "--decode-trust", "trusted"], &all_device)?;
    assert!(out.status.success() && text.contains(&digest) && text.contains("0 decoded on host threads"), "{text}");
    // For people: the stages of the last read; for scripts: one JSON object with the same figures.
    let (out, text) = zarrs_gpu(&["read", p, "--repeat", "2", "--stats"])?;
    assert!(out.status.success() && text.contains("stages of the last read"), "{text}");
    for stage in ["plan", "read", "check", "decode", "place", "final sync"] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(stage) && l.contains(" ms")), "{stage}: {text}");
    }
    let (out, text) =
        zarrs_gpu_with(&["read", p, "--repeat", "2", "--digest", "--json", "--decode-trust", "trusted"], &all_device)?;
    assert!(out.status.success(), "{text}");
    let line = text.lines().find(|l| l.starts_with('{')).ok_or("no JSON line")?;
    let json: serde_json::Value = serde_json::from_str(line)?;
    assert_eq!(json["shape"], serde_json::json!([16, 40, 40]));
    assert_eq!(json["bytes"], 16 * 40 * 40 * 4);
    assert_eq!(json["seconds"].as_array().map(Vec::len), Some(2));
    assert_eq!(json["decode"], "device", "{json}");
    assert_eq!(json["host_decoded_chunks"], 0);
    assert_eq!(json["io_path"], "posix", "{json}");
    assert_eq!(json["sha256"], format!("{:x}", Sha256::digest(&want)));
    let stages = json["stages"].as_array().ok_or("stages")?;
    assert!(stages.iter().any(|s| s["stage"] == "decode" && s["seconds"].as_f64().is_some_and(|t| t > 0.0)), "{json}");
    Ok(())
}

/// Write a float32 Zarr v3 `zarr.json` (no chunks) with these codecs at `dir/name`.
fn hostile_array(
    dir: &std::path::Path,
    name: &str,
    shape: &[u64],
    chunks: &[u64],
    codecs: &serde_json::Value,
) -> Result<String> {
    let path = dir.join(name);
    metadata::write_float32(&path, shape, chunks, 0.0, codecs)?;
    Ok(path.to_str().ok_or("a UTF-8 path")?.to_string())
}

/// Run the command line on `args`: it must fail with exit code 1 (an error message, never a
/// panic's 101) within a few seconds; its output.
fn refused(args: &[&str]) -> Result<String> {
    refused_with(args, 1)
}

/// As [`refused`], with exit code `code` (2: a usage error, as a subset the array refuses).
fn refused_with(args: &[&str], code: i32) -> Result<String> {
    let start = std::time::Instant::now();
    let (out, text) = zarrs_gpu(args)?;
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
    assert!(text.contains("zarrs-gpu: error:"), "{args:?}: {text}");
    assert!(took < std::time::Duration::from_secs(5), "{args:?} took {took:?}: {text}");
    Ok(text)
}

#[test]
fn hostile_metadata_and_subsets_are_refused_without_panics() -> Result {
    let dir = tempfile::tempdir()?;
    let bytes = serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    let tb = 1u64 << 40;
    // The issue's arrays: 2^80 and 2^69 elements; refused as such, GPU or not.
    let big = hostile_array(dir.path(), "big.zarr", &[tb, tb], &[1024, 1024], &bytes)?;
    let text = refused(&["read", &big])?;
    assert!(text.contains("2^80 elements of 4 bytes overflow u64"), "{text}");
    let tall = hostile_array(dir.path(), "tall.zarr", &[1 << 63, 64], &[1024, 64], &bytes)?;
    let text = refused(&["read", &tall])?;
    assert!(text.contains("2^69 elements of 4 bytes overflow u64"), "{text}");
    let text = refused_with(&["read", &tall, "--subset", "18446744073709551615,:"], 2)?;
    assert!(
        text.contains("index 18446744073709551615 is out of bounds for axis 0 with size 9223372036854775808"),
        "{text}"
    );
    // A stop past the end clamps (numpy's rule): the whole array, refused for its size.
    let text = refused(&["read", &tall, "--subset", "0:18446744073709551615"])?;
    assert!(text.contains("2^69 elements of 4 bytes overflow u64"), "{text}");
    let edge = hostile_array(dir.path(), "edge.zarr", &[u64::MAX], &[1 << 63], &bytes)?;
    let text = refused_with(&["read", &edge, "--subset", "18446744073709551615"], 2)?;
    assert!(
        text.contains("index 18446744073709551615 is out of bounds for axis 0 with size 18446744073709551615"),
        "{text}"
    );
    // Sizes that fit u64 but not the device (or no device here): refused at once too.
    let wide = hostile_array(dir.path(), "wide.zarr", &[4, 4], &[tb, tb], &bytes)?;
    // Shards of 2^80 inner chunks: an index no 64-bit size holds.
    let huge_index = serde_json::json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3, "checksum": false}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end",
    }}]);
    let shards = hostile_array(dir.path(), "shards.zarr", &[tb, tb], &[tb, tb], &huge_index)?;
    for (path, subset) in
        [(&big, "0:1099511627776,0:4"), (&wide, "0,0"), (&shards, "1099511627775,0"), (&edge, "9223372036854775809")]
    {
        let text = refused(&["read", path, "--subset", subset, "--repeat", "1"])?;
        if !gpu_present() {
            assert!(text.contains("no CUDA device available"), "{subset}: {text}");
        } else if path == &wide {
            assert!(text.contains("2^80 elements of 4 bytes overflow u64"), "{text}");
        } else if path == &shards {
            // The device route reads the index; without nvCOMP zarrs would decode the whole shard.
            assert!(text.contains("index too large for 64-bit sizes") || text.contains("overflow u64"), "{text}");
        } else if path == &edge {
            assert!(text.contains("ends past 2^64"), "{text}");
        } else if subset.contains(':') {
            assert!(text.contains("the read needs 17592186044416 bytes of device memory"), "{text}");
        }
    }
    // info never walks the grid.
    for path in [&big, &tall, &wide, &shards, &edge] {
        let start = std::time::Instant::now();
        let (out, text) = zarrs_gpu(&["info", path])?;
        assert!(out.status.success(), "{text}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{text}");
    }
    Ok(())
}

#[test]
fn convert_checks_its_arguments_and_its_target_before_any_device_work() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("a.zarr");
    sample::create_sample_array(&path, &[10, 12], &[4, 5])?;
    let (p, out) = (path.to_str().unwrap(), dir.path().join("b.zarr"));
    let o = out.to_str().unwrap();
    for (args, wanted) in [
        (vec!["--codec", "lz4"], "--codec lz4: none, zstd[:LEVEL], gzip[:LEVEL], zlib[:LEVEL] or blosc-"),
        (vec!["--codec", "blosc-snappy"], "--codec blosc-snappy: none,"),
        (vec!["--codec", "zstd:99"], "the level lies in"),
        (vec!["--chunks", "4,0"], "--chunks 4,0: sizes of at least 1"),
        (vec!["--chunks", "4,4,4"], "3 sizes for an array of 2 dimensions"),
        (vec!["--shard", "8"], "--shard 8: 1 sizes for an array of 2 dimensions"),
    ] {
        let mut all = vec!["convert", p, o];
        all.extend(args);
        let (status, text) = zarrs_gpu(&all)?;
        assert_eq!(status.status.code(), Some(2), "a usage error: {text}");
        assert!(text.contains(wanted), "{all:?}: {text}");
        assert!(!out.exists(), "{all:?}: nothing is made before the arguments are checked");
    }
    // A Zarr node at the target already: refused, left as it was.
    let (status, text) = zarrs_gpu(&["convert", p, p])?;
    assert_eq!(status.status.code(), Some(1), "{text}");
    assert!(text.contains("a Zarr node is there already"), "{text}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn convert_reencodes_arrays_that_read_back_equal() -> Result {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("src.zarr");
    let store = Arc::new(GdsStore::new(&path)?);
    let array = ArrayBuilder::new(vec![70, 90, 33], vec![16, 32, 32], data_type::float32(), 0.0f32)
        .bytes_to_bytes_codecs(vec![Arc::new(GzipCodec::new(5)?)])
        .build(store, "/")?;
    array.store_metadata()?;
    let values: Vec<f32> = (0..70 * 90 * 33).map(|i| ((i % 977) as f32).sin() * 100.0).collect();
    let all = ArraySubset::new_with_shape(vec![70, 90, 33]);
    array.store_array_subset(&all, values.clone())?;
    let p = path.to_str().unwrap();
    for (name, args) in [
        ("zstd", vec!["--codec", "zstd", "--chunks", "20,32,16"]),
        ("zstd_bare", vec!["--codec", "zstd", "--no-checksum"]),
        ("zstd_crc", vec!["--codec", "zstd:1", "--crc32c"]),
        ("raw", vec!["--codec", "none", "--chunks", "64,64,64"]),
        ("sharded", vec!["--codec", "zstd", "--chunks", "16,32,11", "--shard", "32,64,33"]),
        ("gzip", vec!["--codec", "gzip:6"]),
        ("zlib_crc", vec!["--codec", "zlib", "--crc32c", "--chunks", "32,32,33"]),
        ("blosc", vec!["--codec", "blosc-lz4-bitshuffle", "--chunks", "16,32,16"]),
        ("blosc_sharded", vec!["--codec", "blosc-zstd:3", "--chunks", "16,32,11", "--shard", "32,64,33"]),
    ] {
        let out = dir.path().join(format!("{name}.zarr"));
        let mut all_args = vec!["convert", p, out.to_str().unwrap()];
        all_args.extend(args.iter().copied());
        let (status, text) = zarrs_gpu(&all_args)?;
        assert!(status.status.success(), "{name}: {text}");
        let converted = zarrs::array::Array::open(Arc::new(GdsStore::new(&out)?), "/")?;
        let got: Vec<f32> = converted.retrieve_array_subset(&all)?;
        assert!(got == values, "{name}: the converted array differs");
        // Checks by default: zstd's content checksum, else a crc32c; none with --no-checksum.
        let metadata = serde_json::to_string(converted.metadata())?;
        let default_zstd = args[1] == "zstd" && !args.contains(&"--crc32c") && !args.contains(&"--no-checksum");
        assert_eq!(metadata.contains("\"checksum\":true"), default_zstd, "{name}: {metadata}");
        let crc32c = !default_zstd && !args.contains(&"--no-checksum");
        assert_eq!(metadata.contains("crc32c"), crc32c || args.contains(&"--shard"), "{name}: {metadata}");
        // Sharded targets too (the device lays out each shard), zstd's content checksums too.
        assert!(text.contains("encoded on the device"), "{name}: {text}");
    }
    Ok(())
}
