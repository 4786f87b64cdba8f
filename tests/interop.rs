//! Arrays written by zarr-python and tensorstore (v2 and v3; many codecs, data types, byte orders,
//! sharding with the index at either end and missing inner chunks, partial edge chunks, chunks
//! never written) read identically, element for element, to what zarr-python reads back: through
//! zarrs on the host (everywhere) and through the device pipeline (on a GPU host). On a GPU host
//! every case is also written again from the device and read back by zarrs, zarr-python and
//! tensorstore (`tests/interop/read_back.py`).
//!
//! The matrix is written by `tests/interop/write_matrix.py` into `INTEROP_DIR` (CI does it, see
//! `.ci/run`); without `INTEROP_DIR` the tests write it themselves with `python3` (with zarr). They
//! are `#[ignore]`d, so that a machine without zarr-python names them as not run: CI runs them
//! with `--ignored`, the GPU host with `--include-ignored`.

#[path = "common/servers.rs"]
mod servers;

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::array::{Array, ArrayBytes, ElementOwned};
use zarrs_gpu::zarrs_gpu_codecs::host_decode_reason;
use zarrs_gpu::{
    ArrayDeviceExt, ArrayDeviceWriteExt, DecodePath, DecodeTrust, GdsStore, GpuConfig, IoBackend, IoPath, RemoteStore,
    RetrieveReport, WriteReport,
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
    assert!(cases.len() >= 130, "the matrix has {} cases", cases.len());
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

/// The codecs of the matrix whose chains have no device plan: numcodecs' delta with an astype of
/// another width (`delta_astype_`). Everything else in the matrix (zstd, gzip, zlib, blosc,
/// crc32c, transpose and F order, delta, either byte order, sharding) decodes on the device.
const HOST_CODECS: &[&str] = &["delta_astype_"];

/// Whether a case's codecs have no device plan. A blosc chain always has one, whatever its
/// streams' compressor (a blosc case's name carries it: `v2_blosc_zlib_...`); which chunks the
/// device decodes is [`BLOSC_HOST_CNAMES`]' business.
fn expects_host(name: &str) -> bool {
    !name.contains("blosc") && HOST_CODECS.iter().any(|codec| name.contains(codec))
}

/// The compressors of Blosc streams the device leaves to host threads, chunk by chunk (the chain
/// still has a device plan): blosclz and snappy, which nvCOMP does not decode. lz4, lz4hc and
/// zstd chunks decode on the device, and zlib ones under `Trusted` (as the device read below
/// asks), their Adler-32 verified there.
const BLOSC_HOST_CNAMES: &[&str] = &["blosclz", "snappy"];

/// The compressor of a blosc array's streams (`cname` in its metadata, v2 or v3), None for
/// other arrays.
fn blosc_cname(array: &Array<GdsStore>) -> Option<String> {
    fn find(value: &serde_json::Value) -> Option<String> {
        match value {
            serde_json::Value::Object(map) => match map.get("cname") {
                Some(cname) => cname.as_str().map(str::to_string),
                None => map.values().find_map(find),
            },
            serde_json::Value::Array(items) => items.iter().find_map(find),
            _ => None,
        }
    }
    find(&serde_json::to_value(array.metadata()).ok()?)
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

fn device_bytes<T: ElementOwned>(
    array: &Array<impl zarrs_storage::ReadableStorageTraits + 'static>,
    config: &GpuConfig,
) -> Result<(Vec<u8>, RetrieveReport)> {
    let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<T>>(&array.subset_all(), config)?;
    Ok((data.to_host_bytes()?, report))
}

/// `$f::<T>($args)` for the element type `T` of numpy dtype `$dtype` (a case's).
macro_rules! by_dtype {
    ($case:expr, $f:ident($($arg:expr),*)) => {
        match $case.dtype.trim_start_matches(['<', '>', '|', '=']) {
            "b1" => $f::<bool>($($arg),*),
            "i1" => $f::<i8>($($arg),*),
            "i2" => $f::<i16>($($arg),*),
            "i4" => $f::<i32>($($arg),*),
            "i8" => $f::<i64>($($arg),*),
            "u1" => $f::<u8>($($arg),*),
            "u2" => $f::<u16>($($arg),*),
            "u4" => $f::<u32>($($arg),*),
            "u8" => $f::<u64>($($arg),*),
            "f2" => $f::<half::f16>($($arg),*),
            "f4" => $f::<f32>($($arg),*),
            "f8" => $f::<f64>($($arg),*),
            "c8" => $f::<num_complex::Complex32>($($arg),*),
            "c16" => $f::<num_complex::Complex64>($($arg),*),
            other => Err(format!("{}: unexpected dtype {other}", $case.name).into()),
        }
    };
}

/// The device read of the whole array as its element type.
fn device_read(case: &Case, array: &Array<GdsStore>, config: &GpuConfig) -> Result<(Vec<u8>, RetrieveReport)> {
    by_dtype!(case, device_bytes(array, config))
}

/// `src` read whole to the device and written from there into `dst`.
fn device_copy<T: ElementOwned>(
    src: &Array<GdsStore>,
    dst: &Array<GdsStore>,
    config: &GpuConfig,
) -> Result<WriteReport> {
    let all = src.subset_all();
    let (data, _) = src.retrieve_array_subset_device_opt::<DeviceArray<T>>(&all, config)?;
    Ok(dst.store_array_subset_device_opt(&all, &data, config)?)
}

/// Every case written again from the device: its metadata copied into a fresh array, zarr-python's
/// values (read to the device) stored whole with `store_array_subset_device` (chains the device
/// encodes there, the others by zarrs: both are checked), then read back by zarrs on the host
/// here and by zarr-python and tensorstore (`tests/interop/read_back.py`), element for element.
/// Chunks that come out all fill value are erased, as zarr-python leaves them.
#[test]
#[ignore = "needs a CUDA GPU, the interop matrix, and python3 with zarr and tensorstore"]
fn device_writes_of_every_chain_read_back_by_zarrs_zarr_python_and_tensorstore() -> Result {
    let dir = matrix();
    let out = tempfile::tempdir()?;
    let config = GpuConfig::default().with_backend(IoBackend::Posix).with_decode_trust(DecodeTrust::Trusted);
    let mut written = Vec::new();
    let mut on_device = 0;
    for case in cases(&dir)? {
        let target = out.path().join(&case.name);
        std::fs::create_dir_all(&target)?;
        for name in ["zarr.json", ".zarray", ".zattrs"] {
            if case.path.join(name).exists() {
                std::fs::copy(case.path.join(name), target.join(name))?;
            }
        }
        let src = open(&case)?;
        let dst = Array::open(Arc::new(GdsStore::new(&target)?), "/")?;
        let report = by_dtype!(case, device_copy(&src, &dst, &config))?;
        on_device += usize::from(report.path == zarrs_gpu::WritePath::Device);
        eprintln!("{}: {:?} {}", case.name, report.path, report.reason.as_deref().unwrap_or(""));
        let got = dst.retrieve_array_subset::<ArrayBytes<'static>>(&dst.subset_all())?.into_fixed()?.into_owned();
        assert!(got == case.expected, "{}: the device write read back by zarrs differs from the values", case.name);
        written.push(serde_json::json!({
            "name": case.name,
            "path": target,
            "expected": dir.join(format!("{}.npy", case.name)),
            "source": case.path,
        }));
    }
    // Most of the matrix is encoded on the device (what is not: delta, Blosc's other compressors
    // and set block sizes, zstd checksums).
    assert!(on_device * 2 > written.len(), "{on_device} of {} cases written on the device", written.len());
    let list = out.path().join("written.json");
    std::fs::write(&list, serde_json::to_vec(&written)?)?;
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/read_back.py");
    let script = if built.exists() { built } else { PathBuf::from("tests/interop/read_back.py") };
    let status = std::process::Command::new("python3").arg(&script).arg(&list).status()?;
    assert!(status.success(), "zarr-python or tensorstore read a device write differently (see above)");
    Ok(())
}

/// Every case read on the device twice: as the scheduler splits it (a read this small goes to
/// host threads where the codec gives decode rates), then with nvCOMP taking every chunk the
/// codecs' checks let it, so that `host_decoded_chunks` counts only the chunks those checks send
/// to host threads. The matrix is trusted data: gzip members without crc32c, and blosc's zlib
/// streams, go to nvCOMP too.
#[test]
#[ignore = "needs a CUDA GPU and the interop matrix from zarr-python"]
fn device_reads_zarr_python_arrays_identically() -> Result {
    let dir = matrix();
    let scheduled = GpuConfig::default().with_backend(IoBackend::Posix).with_decode_trust(DecodeTrust::Trusted);
    let nvcomp_first = scheduled.clone().with_host_decode_fraction(Some(0.0));
    for case in cases(&dir)? {
        let array = open(&case)?;
        let read = |how: &str, config: &GpuConfig| -> Result<RetrieveReport> {
            let (got, report) = device_read(&case, &array, config)?;
            assert!(got == case.expected, "{} ({how}): the device read differs from zarr-python's", case.name);
            let want = if expects_host(&case.name) { DecodePath::Host } else { DecodePath::Device };
            assert_eq!(report.decode, want, "{} ({how})", case.name);
            eprintln!(
                "{} ({how}): {:?}, {} of {} stored chunks decoded on host threads",
                case.name,
                report.decode,
                report.host_decoded_chunks,
                report.chunks - report.missing_chunks
            );
            // Every writer's gzip members and zlib streams are the plain kind nvCOMP takes: none
            // falls back to the host (trusted: no crc32c needed) when nvCOMP goes first.
            let deflate = case.name.contains("gzip") || (case.name.contains("zlib") && !case.name.contains("blosc"));
            if deflate && how == "nvCOMP first" {
                assert_eq!(report.host_decoded_chunks, 0, "{} ({how})", case.name);
            }
            Ok(report)
        };
        read("scheduled", &scheduled)?;
        let report = read("nvCOMP first", &nvcomp_first)?;
        let stored = report.chunks - report.missing_chunks;
        // Blosc: chunks of streams nvCOMP decodes reach it (but for blocks under 4 KiB: more
        // streams than the device takes for a chunk's size, on host threads); the others go to
        // host threads, all but those stored as they are, which need no decoder.
        let tiny_blocks = case
            .name
            .rsplit_once("_block")
            .and_then(|(_, size)| size.parse::<u32>().ok())
            .is_some_and(|size| size < 4096);
        match blosc_cname(&array) {
            Some(cname) if BLOSC_HOST_CNAMES.contains(&cname.as_str()) => {
                assert!(report.host_decoded_chunks > 0, "{}: no chunk decoded on host threads: {report:?}", case.name);
            }
            Some(_) if !tiny_blocks => {
                assert!(
                    report.host_decoded_chunks < stored,
                    "{}: no chunk decoded on the device: {report:?}",
                    case.name
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// The matrix uploaded through S3 PUTs to a fresh S3 server on loopback: the server, and each case's
/// store there.
fn matrix_in_s3(dir: &Path) -> Result<(servers::Server, Vec<(Case, RemoteStore)>)> {
    let server = servers::Server::s3();
    let uploaded = server.upload(dir, "matrix")?;
    assert!(uploaded > 500, "{uploaded} files uploaded");
    let cases = cases(dir)?
        .into_iter()
        .map(|case| {
            let prefix = format!("matrix/{}", case.path.strip_prefix(dir)?.to_string_lossy());
            let store = server.s3_store(&prefix);
            Ok((case, store))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((server, cases))
}

#[test]
#[ignore = "needs the interop matrix from zarr-python and an S3 server; CI runs it"]
fn zarrs_reads_zarr_python_arrays_through_s3_identically() -> Result {
    let dir = matrix();
    let (_server, cases) = matrix_in_s3(&dir)?;
    for (case, store) in cases {
        let array = Array::open(Arc::new(store), "/")?;
        let got = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?.into_owned();
        assert!(got == case.expected, "{}: zarrs' host read through S3 differs from zarr-python's", case.name);
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU, the interop matrix from zarr-python and an S3 server"]
fn device_reads_zarr_python_arrays_through_s3_identically() -> Result {
    let dir = matrix();
    let (_server, cases) = matrix_in_s3(&dir)?;
    let config = GpuConfig::default().with_decode_trust(DecodeTrust::Trusted);
    for (case, store) in cases {
        let array = Array::open(Arc::new(store), "/")?;
        let (got, report) = by_dtype!(case, device_bytes(&array, &config))?;
        assert!(got == case.expected, "{}: the device read through S3 differs from zarr-python's", case.name);
        if report.decode == DecodePath::Device {
            assert_eq!(report.io.as_ref().map(|io| io.path), Some(IoPath::Remote), "{}", case.name);
        }
    }
    Ok(())
}
