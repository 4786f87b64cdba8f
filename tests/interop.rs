//! Arrays written by zarr-python and tensorstore (v2 and v3; many codecs, data types, byte orders,
//! sharding with the index at either end and missing inner chunks, partial edge chunks, chunks
//! never written) read identically, element for element, to what zarr-python reads back: through
//! zarrs on the host (everywhere) and through the device pipeline (on a GPU host).
//!
//! The matrix is written by `tests/interop/write_matrix.py` into `INTEROP_DIR` (CI does it, see
//! `.ci/run`); without `INTEROP_DIR` the tests write it themselves with `python3` (with zarr). They
//! are `#[ignore]`d, so that a machine without zarr-python names them as not run: CI runs them
//! with `--ignored`, the GPU host with `--include-ignored`.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zarrs::array::{Array, ArrayBytes, ElementOwned};
use zarrs_gpu::{
    host_decode_reason, ArrayDeviceExt, DecodePath, DecodeTrust, GdsStore, GpuConfig, IoBackend, RetrieveReport,
};

type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

struct Case {
    name: String,
    path: PathBuf,
    dtype: String,
    expected: Vec<u8>,
}

/// The matrix directory, written on demand.
fn matrix() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("INTEROP_DIR") {
            return PathBuf::from(dir);
        }
        let dir = std::env::temp_dir().join(format!("zarrs-gpu-interop-{}", std::process::id()));
        // Staged test binaries run on another machine, from the repository root.
        let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/write_matrix.py");
        let script = if built.exists() { built } else { PathBuf::from("tests/interop/write_matrix.py") };
        let ok = std::process::Command::new("python3").arg(&script).arg(&dir).status().is_ok_and(|s| s.success());
        assert!(ok, "could not write the interop matrix with {} (needs python3 with zarr)", script.display());
        dir
    })
    .clone()
}

/// The data bytes of a .npy file (C order, native byte order as written by the script).
fn npy_data(path: &Path) -> Result<Vec<u8>> {
    let file = std::fs::read(path)?;
    if !file.starts_with(b"\x93NUMPY") {
        return Err(format!("{} is not a .npy file", path.display()).into());
    }
    let (header_len, start) = match file[6] {
        1 => (usize::from(u16::from_le_bytes([file[8], file[9]])), 10),
        _ => (u32::from_le_bytes(file[8..12].try_into()?) as usize, 12),
    };
    let header = std::str::from_utf8(&file[start..start + header_len])?;
    if header.contains("'fortran_order': True") {
        return Err(format!("{} is in Fortran order", path.display()).into());
    }
    Ok(file[start + header_len..].to_vec())
}

fn cases(dir: &Path) -> Result<Vec<Case>> {
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json"))?)?;
    let cases = manifest["cases"].as_array().ok_or("manifest without cases")?;
    assert!(cases.len() >= 60, "the matrix has {} cases", cases.len());
    cases
        .iter()
        .map(|c| {
            Ok(Case {
                name: c["name"].as_str().ok_or("name")?.to_string(),
                path: dir.join(c["path"].as_str().ok_or("path")?),
                dtype: c["dtype"].as_str().ok_or("dtype")?.to_string(),
                expected: npy_data(&dir.join(c["expected"].as_str().ok_or("expected")?))?,
            })
        })
        .collect()
}

fn open(case: &Case) -> Result<Array<GdsStore>> {
    Ok(Array::open(Arc::new(GdsStore::new(&case.path)?), "/")?)
}

/// Whether a case's codecs have no device plan: blosc and zlib decode on the host; everything
/// else in the matrix (zstd, gzip, crc32c, transpose and F order, either byte order, sharding)
/// decodes on the device.
fn expects_host(name: &str) -> bool {
    ["blosc", "zlib"].iter().any(|codec| name.contains(codec))
}

#[test]
#[ignore = "needs the interop matrix from zarr-python (INTEROP_DIR, or python3 with zarr); CI runs it"]
fn the_decode_plan_follows_the_codecs() -> Result {
    let dir = matrix();
    let nvcomp = zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok();
    for case in cases(&dir)? {
        let reason = host_decode_reason(&open(&case)?);
        // Without a loadable nvCOMP compressed chains decode on the host too, and say why.
        if !nvcomp && reason.as_deref().is_some_and(|r| r.contains("nvCOMP")) {
            continue;
        }
        assert_eq!(reason.is_some(), expects_host(&case.name), "{}: host reason {reason:?}", case.name);
    }
    Ok(())
}

#[test]
#[ignore = "needs the interop matrix from zarr-python (INTEROP_DIR, or python3 with zarr); CI runs it"]
fn zarrs_reads_zarr_python_arrays_identically() -> Result {
    let dir = matrix();
    for case in cases(&dir)? {
        let array = open(&case)?;
        let got = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?.into_owned();
        assert!(got == case.expected, "{}: zarrs' host read differs from zarr-python's", case.name);
    }
    Ok(())
}

fn device_bytes<T: ElementOwned>(array: &Array<GdsStore>) -> Result<(Vec<u8>, RetrieveReport)> {
    // The matrix is trusted data: gzip members without crc32c go to nvCOMP too.
    let config = GpuConfig::default().with_backend(IoBackend::Posix).with_decode_trust(DecodeTrust::Trusted);
    let (data, report) = array.retrieve_array_subset_device_opt::<T>(&array.subset_all(), &config)?;
    Ok((data.to_host_bytes()?, report))
}

#[test]
#[ignore = "needs a CUDA GPU and the interop matrix from zarr-python"]
fn device_reads_zarr_python_arrays_identically() -> Result {
    let dir = matrix();
    for case in cases(&dir)? {
        let array = open(&case)?;
        let (got, report) = match case.dtype.trim_start_matches(['<', '>', '|', '=']) {
            "b1" => device_bytes::<bool>(&array)?,
            "i1" => device_bytes::<i8>(&array)?,
            "i2" => device_bytes::<i16>(&array)?,
            "i4" => device_bytes::<i32>(&array)?,
            "i8" => device_bytes::<i64>(&array)?,
            "u1" => device_bytes::<u8>(&array)?,
            "u2" => device_bytes::<u16>(&array)?,
            "u4" => device_bytes::<u32>(&array)?,
            "u8" => device_bytes::<u64>(&array)?,
            "f2" => device_bytes::<half::f16>(&array)?,
            "f4" => device_bytes::<f32>(&array)?,
            "f8" => device_bytes::<f64>(&array)?,
            "c8" => device_bytes::<num_complex::Complex32>(&array)?,
            "c16" => device_bytes::<num_complex::Complex64>(&array)?,
            other => return Err(format!("{}: unexpected dtype {other}", case.name).into()),
        };
        assert!(got == case.expected, "{}: the device read differs from zarr-python's", case.name);
        let want = if expects_host(&case.name) { DecodePath::Host } else { DecodePath::Device };
        assert_eq!(report.decode, want, "{}", case.name);
        eprintln!("{}: {:?}, {} chunks decoded on host threads", case.name, report.decode, report.host_decoded_chunks);
        // Every writer's gzip members are the plain kind nvCOMP takes: none falls back to the host.
        if case.name.contains("gzip") {
            assert_eq!(report.host_decoded_chunks, 0, "{}", case.name);
        }
    }
    Ok(())
}
