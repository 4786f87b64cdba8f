//! Device retrieval compared with zarrs' own host retrieval, byte for byte.
//!
//! GPU tests are `#[ignore = "needs a CUDA GPU"]`: run them on a GPU host (`../shared/gpu/stage`,
//! then `bash .gpu/run`). The planning tests run everywhere.

use std::error::Error;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use zarrs::array::codec::{TransposeCodec, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, ArraySubset, DataType, ElementOwned, FillValue};
use zarrs::filesystem::FilesystemStore;
use zarrs_gpu::zarrs_gpu_codecs::plan::plan_chunks;
use zarrs_gpu::{
    with_gpu_config, ArrayDeviceExt, ArrayDeviceWriteExt, DecodePath, DeviceArray, DeviceBytes, GdsStore, GpuConfig,
    GpuError, IoBackend, IoPath,
};
use zarrs_storage::{ReadableStorageTraits, ReadableWritableListableStorageTraits, WritableStorageTraits};

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

/// Random chunk bytes valid for `data_type` (bool: 0 or 1).
fn random_bytes(rng: &mut StdRng, n: usize, data_type: &DataType) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
    if data_type.to_string() == "bool" {
        for b in &mut bytes {
            *b &= 1;
        }
    }
    if data_type.to_string().contains("utf32") {
        // Code points below the surrogates: every one a char.
        for word in bytes.chunks_exact_mut(4) {
            let c = u32::from_ne_bytes(word.try_into().unwrap()) % 0xd800;
            word.copy_from_slice(&c.to_ne_bytes());
        }
    }
    bytes
}

/// Write every chunk with random bytes, then erase about one in five (they read as fill value).
fn fill_random<S: ReadableWritableListableStorageTraits + ?Sized + 'static>(array: &Array<S>, seed: u64) -> Result {
    let mut rng = StdRng::seed_from_u64(seed);
    let elem = array.data_type().fixed_size().unwrap();
    let chunks = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
    for (n, indices) in chunks.indices().into_iter().enumerate() {
        if n % 5 == 3 {
            continue; // never written: missing
        }
        let len = array.chunk_subset(&indices)?.num_elements_usize() * elem;
        array.store_chunk(&indices, ArrayBytes::new_flen(random_bytes(&mut rng, len, array.data_type())))?;
    }
    Ok(())
}

fn v3_array(
    dir: &std::path::Path,
    data_type: DataType,
    fill: FillValue,
    shape: &[u64],
    chunks: &[u64],
) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let array = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type, fill)
        .bytes_to_bytes_codecs(vec![])
        .build(store, "/arr")?;
    array.store_metadata()?;
    fill_random(&array, 11)?;
    Ok(array)
}

fn v2_array(
    dir: &std::path::Path,
    dtype: &str,
    fill: &str,
    shape: &[u64],
    chunks: &[u64],
    order: &str,
) -> Result<Array<GdsStore>> {
    let meta = format!(
        r#"{{"zarr_format": 2, "shape": {shape:?}, "chunks": {chunks:?}, "dtype": "{dtype}", "compressor": null,
            "fill_value": {fill}, "order": "{order}", "filters": null, "dimension_separator": "."}}"#
    );
    std::fs::create_dir_all(dir.join("arr"))?;
    std::fs::write(dir.join("arr/.zarray"), meta)?;
    let array = Array::open(Arc::new(GdsStore::new(dir)?), "/arr")?;
    fill_random(&array, 12)?;
    Ok(array)
}

/// Subsets: whole, one edge chunk, a slab, a single element, and random boxes.
fn subsets(shape: &[u64], chunks: &[u64], rng: &mut StdRng, n: usize) -> Vec<ArraySubset> {
    let mut out = vec![ArraySubset::new_with_shape(shape.to_vec())];
    let edge: Vec<_> = shape.iter().zip(chunks).map(|(&s, &c)| ((s - 1) / c * c)..s).collect();
    out.push(ArraySubset::new_with_ranges(&edge));
    let mut slab: Vec<_> = shape.iter().map(|&s| 0..s).collect();
    slab[0] = 0..chunks[0].min(shape[0]);
    out.push(ArraySubset::new_with_ranges(&slab));
    out.push(ArraySubset::new_with_ranges(&shape.iter().map(|&s| (s / 2)..(s / 2 + 1)).collect::<Vec<_>>()));
    out.extend((0..n).map(|_| crate::boxes::random_box(shape, rng)));
    out
}

/// Device retrieval of `subset` equals zarrs' host retrieval, byte for byte.
fn check_subset<T: ElementOwned, S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    subset: &ArraySubset,
    config: &GpuConfig,
) -> Result<zarrs_gpu::RetrieveReport>
where
    Array<S>: ArrayDeviceExt,
{
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(subset)?.into_fixed()?.into_owned();
    let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<T>>(subset, config)?;
    assert_eq!(device.shape(), subset.shape());
    let got = device.to_host_bytes()?;
    assert!(got == want, "subset {:?}: device bytes differ from zarrs' ({report:?})", subset.to_ranges());
    // The untyped read: the same bytes, with the array's data type.
    let (bytes, _) = array.retrieve_array_subset_device_opt::<DeviceBytes>(subset, config)?;
    assert_eq!((bytes.shape(), bytes.num_bytes()), (subset.shape(), want.len()));
    assert_eq!(bytes.data_type().to_string(), array.data_type().to_string());
    assert!(bytes.to_host_bytes()? == want, "subset {:?}: untyped bytes differ from zarrs'", subset.to_ranges());
    Ok(report)
}

fn check_all<T: ElementOwned, S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    config: &GpuConfig,
    seed: u64,
) -> Result
where
    Array<S>: ArrayDeviceExt,
{
    let mut rng = StdRng::seed_from_u64(seed);
    let chunks: Vec<u64> = array.chunk_shape(&vec![0; array.dimensionality()])?.iter().map(|c| c.get()).collect();
    for subset in subsets(array.shape(), &chunks, &mut rng, 12) {
        check_subset::<T, S>(array, &subset, config)?;
    }
    Ok(())
}

fn posix() -> GpuConfig {
    GpuConfig::default().with_backend(IoBackend::Posix)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn v3_float32_subsets_match_zarrs_on_both_io_paths() -> Result {
    let dir = tempfile::tempdir()?;
    let array = v3_array(dir.path(), data_type::float32(), FillValue::from(1.5f32), &[37, 45, 29], &[8, 16, 7])?;
    check_all::<f32, _>(&array, &posix(), 1)?;
    let report = check_subset::<f32, _>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.decode, DecodePath::Device);
    assert_eq!(report.io.as_ref().map(|s| s.path), Some(IoPath::Posix));
    assert!(report.missing_chunks > 0 && report.missing_chunks < report.chunks, "{report:?}");
    check_all::<f32, _>(&array, &GpuConfig::default(), 2)?; // auto
                                                            // Forced native GDS: works where GDS is up, else a clear error (never a wrong result).
    match check_subset::<f32, _>(&array, &array.subset_all(), &GpuConfig::default().with_backend(IoBackend::Gds)) {
        Ok(report) => assert_eq!(report.io.map(|s| s.path), Some(IoPath::Gds)),
        Err(err) => assert!(err.to_string().contains("GPUDirect Storage"), "{err}"),
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn untyped_arrays_carry_their_data_type_through_reads_views_and_writes() -> Result {
    let (shape, chunks) = ([19u64, 13], [6u64, 5]);
    for (dt, fill) in [
        (data_type::bfloat16(), FillValue::from(half::bf16::from_f32(-2.5))),
        (data_type::complex64(), FillValue::from(num_complex::Complex32::new(1.0, -2.0))),
        (data_type::int16(), FillValue::from(-300i16)),
    ] {
        let dir = tempfile::tempdir()?;
        let array = v3_array(dir.path(), dt.clone(), fill.clone(), &shape, &chunks)?;
        let all = array.subset_all();
        let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&all)?.into_fixed()?.into_owned();
        let bytes: DeviceBytes = array.retrieve_array_subset_device(&all)?;
        assert_eq!(bytes.len() as u64, all.num_elements());
        assert!(bytes.to_host_bytes()? == want, "{dt}");
        // A typed view only where the element type is the data type's.
        match DeviceArray::<f32>::try_from(bytes) {
            Err(GpuError::ElementType { .. }) => {}
            other => panic!("{dt} viewed as f32: {other:?}"),
        }
        // Written back from the untyped array into a new array of the same type: zarrs reads
        // the same values; into an array of another type: refused before anything is written.
        let bytes: DeviceBytes = array.retrieve_array_subset_device(&all)?;
        let out = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), dt.clone(), fill.clone())
            .bytes_to_bytes_codecs(vec![])
            .build(array.storage(), "/arr2")?;
        out.store_metadata()?;
        out.store_array_subset_device(&all, &bytes)?;
        let back = out.retrieve_array_subset::<ArrayBytes<'static>>(&all)?.into_fixed()?.into_owned();
        assert!(back == want, "{dt}: written back from the untyped array");
        let other = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type::float64(), FillValue::from(0f64))
            .bytes_to_bytes_codecs(vec![])
            .build(out.storage(), "/other")?;
        assert!(other.store_array_subset_device(&all, &bytes).is_err(), "{dt} written into float64");
        // Views of one request, untyped.
        let halves = [ArraySubset::new_with_ranges(&[0..10, 0..13]), ArraySubset::new_with_ranges(&[10..19, 0..13])];
        let views = array.retrieve_array_subsets_device::<DeviceBytes>(&halves)?;
        let got: Vec<u8> =
            views.iter().map(DeviceBytes::to_host_bytes).collect::<std::result::Result<Vec<_>, _>>()?.concat();
        assert!(got == want, "{dt}: the views of one request");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn data_types_v3_and_v2_match_zarrs() -> Result {
    let shape = [23u64, 17, 10];
    let chunks = [6u64, 5, 4];
    macro_rules! v3 {
        ($t:ty, $dt:expr, $fill:expr) => {{
            let dir = tempfile::tempdir()?;
            let array = v3_array(dir.path(), $dt, FillValue::from($fill), &shape, &chunks)?;
            check_all::<$t, _>(&array, &posix(), 3)?;
        }};
    }
    v3!(bool, data_type::bool(), true);
    v3!(i8, data_type::int8(), -3i8);
    v3!(u8, data_type::uint8(), 7u8);
    v3!(i16, data_type::int16(), -300i16);
    v3!(u16, data_type::uint16(), 0x1234u16);
    v3!(i32, data_type::int32(), -70000i32);
    v3!(u32, data_type::uint32(), 0xDEAD_BEEFu32);
    v3!(i64, data_type::int64(), -5i64);
    v3!(u64, data_type::uint64(), 0x0102_0304_0506_0708u64);
    v3!(half::f16, data_type::float16(), half::f16::from_f32(2.5));
    v3!(half::bf16, data_type::bfloat16(), half::bf16::from_f32(-2.5));
    v3!(f64, data_type::float64(), 3.25f64);
    v3!(num_complex::Complex32, data_type::complex64(), num_complex::Complex32::new(1.0, -2.0));
    v3!(num_complex::Complex64, data_type::complex128(), num_complex::Complex64::new(0.5, 4.0));
    for (dtype, fill) in [("<f4", "2.5"), ("<u2", "9"), ("<i8", "-1"), ("|u1", "0")] {
        let dir = tempfile::tempdir()?;
        let array = v2_array(dir.path(), dtype, fill, &shape, &chunks, "C")?;
        match dtype {
            "<f4" => check_all::<f32, _>(&array, &posix(), 4)?,
            "<u2" => check_all::<u16, _>(&array, &posix(), 4)?,
            "<i8" => check_all::<i64, _>(&array, &posix(), 4)?,
            _ => check_all::<u8, _>(&array, &posix(), 4)?,
        }
    }
    // v2 in F order and big-endian: transposed and swapped on the device.
    let dir = tempfile::tempdir()?;
    let array = v2_array(dir.path(), "<f4", "1.0", &shape, &chunks, "F")?;
    let report = check_subset::<f32, _>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.decode, DecodePath::Device);
    check_all::<f32, _>(&array, &posix(), 5)?;
    let dir = tempfile::tempdir()?;
    let array = v2_array(dir.path(), ">i4", "5", &shape, &chunks, "C")?;
    check_all::<i32, _>(&array, &posix(), 6)?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn other_codec_chains_decode_on_host_correctly() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    // Two array-to-array codecs in a row have no device plan: zarrs decodes, one copy follows.
    let transpose = |order: &[usize]| -> Result<Arc<TransposeCodec>> {
        Ok(Arc::new(TransposeCodec::new(zarrs::array::codec::TransposeOrder::new(order)?)))
    };
    let array = ArrayBuilder::new(vec![30, 41], vec![8, 16], data_type::float32(), 0.25f32)
        .array_to_array_codecs(vec![transpose(&[1, 0])?, transpose(&[1, 0])?])
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, true))])
        .build(store, "/z")?;
    array.store_metadata()?;
    fill_random(&array, 21)?;
    let report = check_subset::<f32, _>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.decode, DecodePath::Host);
    check_all::<f32, _>(&array, &posix(), 7)?;
    for indices in [[0u64, 0], [3, 2]] {
        let want: Vec<f32> = array.retrieve_chunk(&indices)?;
        let got = array.retrieve_chunk_device::<DeviceArray<f32>>(&indices)?.to_host()?;
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()) && got.len() == want.len());
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn other_stores_are_staged_through_pinned_memory() -> Result {
    let dir = tempfile::tempdir()?;
    v3_array(dir.path(), data_type::uint16(), FillValue::from(77u16), &[19, 33], &[5, 8])?;
    let fs = Arc::new(FilesystemStore::new(dir.path())?);
    let array = Array::open(fs.clone(), "/arr")?;
    let report = check_subset::<u16, _>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.io.map(|s| s.path), Some(IoPath::Staged));
    check_all::<u16, _>(&array, &posix(), 8)?;
    // Type-erased storage, even a GdsStore behind it, takes the staged path too.
    let erased: Arc<dyn ReadableStorageTraits> = Arc::new(GdsStore::new(dir.path())?);
    let array = Array::open(erased, "/arr")?;
    check_all::<u16, _>(&array, &posix(), 9)?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn small_staging_budget_runs_many_batches() -> Result {
    let dir = tempfile::tempdir()?;
    let array = v3_array(dir.path(), data_type::float64(), FillValue::from(-1.0f64), &[64, 96, 80], &[16, 32, 16])?;
    // 1 MiB of staging: each batch holds a few 64 KiB chunks, so buffers alternate many times.
    let config = posix().with_staging_bytes(1 << 20);
    check_all::<f64, _>(&array, &config, 10)?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunk_retrieval_and_gpu_mode() -> Result {
    let dir = tempfile::tempdir()?;
    let array = v3_array(dir.path(), data_type::int32(), FillValue::from(-9i32), &[20, 30], &[6, 7])?;
    for indices in [[0u64, 0], [3, 4], [2, 1]] {
        let want: Vec<i32> = array.retrieve_chunk(&indices)?;
        let got = array.retrieve_chunk_device::<DeviceArray<i32>>(&indices)?;
        assert_eq!(got.to_host()?, want, "chunk {indices:?}");
    }
    let chunks = ArraySubset::new_with_ranges(&[1..4, 2..5]);
    let want: Vec<i32> = array.retrieve_array_subset(&array.chunks_subset_bounded(&chunks)?)?;
    assert_eq!(array.retrieve_chunks_device::<DeviceArray<i32>>(&chunks)?.to_host()?, want);
    let edge = ArraySubset::new_with_ranges(&[2..4, 3..5]);
    let want: Vec<i32> = array.retrieve_array_subset(&array.chunks_subset_bounded(&edge)?)?;
    assert_eq!(array.retrieve_chunks_device::<DeviceArray<i32>>(&edge)?.to_host()?, want);
    assert!(array.retrieve_chunk_device::<DeviceArray<i32>>(&[4, 0]).is_err(), "chunk indices beyond the grid");
    // GPU mode: zarrs' generic retrieval yields device arrays; on rayon workers too, which take
    // the scope's config along (a scope is its thread's own).
    let subset = ArraySubset::new_with_ranges(&[3..17, 5..29]);
    let want: Vec<i32> = array.retrieve_array_subset(&subset)?;
    with_gpu_config(GpuConfig::default(), || -> Result {
        let device: DeviceArray<i32> = array.retrieve_array_subset(&subset)?;
        assert_eq!(device.to_host()?, want);
        let config = zarrs_gpu::gpu_config().ok_or("the scope is this thread's")?;
        (0..8).into_par_iter().try_for_each(|_| -> std::result::Result<(), String> {
            with_gpu_config(config.clone(), || {
                let device: DeviceArray<i32> = array.retrieve_array_subset(&subset).map_err(|e| e.to_string())?;
                (device.to_host().map_err(|e| e.to_string())? == want)
                    .then_some(())
                    .ok_or_else(|| "differs".to_string())
            })
        })?;
        Ok(())
    })?;
    // Wrong element type: a clear error, no panic.
    let err = array.retrieve_array_subset_device::<DeviceArray<f32>>(&subset).unwrap_err();
    assert!(matches!(err, GpuError::ElementType { .. }), "{err}");
    let err = array
        .retrieve_array_subset_device::<DeviceArray<i32>>(&ArraySubset::new_with_ranges(&[0..21, 0..3]))
        .unwrap_err();
    assert!(err.to_string().contains("subset"), "{err}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn empty_subsets_are_empty_arrays_without_reads() -> Result {
    // numpy's `a[3:3]`: an array of no elements and the selection's shape, no chunk read; on the
    // device route and on the host route (two transposes: decoded by zarrs).
    let dir = tempfile::tempdir()?;
    let array = v3_array(dir.path(), data_type::int32(), FillValue::from(-9i32), &[20, 30], &[6, 7])?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let transpose = || -> Result<Arc<TransposeCodec>> {
        Ok(Arc::new(TransposeCodec::new(zarrs::array::codec::TransposeOrder::new(&[1, 0])?)))
    };
    let host = ArrayBuilder::new(vec![20, 30], vec![6, 7], data_type::int32(), FillValue::from(0i32))
        .array_to_array_codecs(vec![transpose()?, transpose()?])
        .build(store, "/host")?;
    host.store_metadata()?;
    for a in [&array, &host] {
        for ranges in [[3..3, 0..30], [0..20, 30..30], [20..20, 0..0]] {
            let subset = ArraySubset::new_with_ranges(&ranges);
            let (got, report) = a.retrieve_array_subset_device_opt::<DeviceArray<i32>>(&subset, &posix())?;
            assert_eq!(got.shape(), subset.shape(), "{ranges:?}");
            assert!(got.is_empty() && got.num_bytes() == 0, "{ranges:?}");
            assert_eq!((report.chunks, report.bytes_read), (0, 0), "{ranges:?}");
            assert!(got.to_host()?.is_empty());
            // Into an empty destination: nothing to write, no error.
            let mut out = got;
            let report = a.retrieve_array_subset_into_device_opt(&subset, &mut out, &posix())?;
            assert_eq!(report.chunks, 0);
            // Handed on through DLPack with its shape.
            let tensor = out.into_dlpack(zarrs_gpu::zarrs_gpu_codecs::DlpackStream::Synchronize)?;
            let shape: Vec<u64> = ranges.iter().map(|r| r.end - r.start).collect();
            let got_shape = zarrs_gpu::zarrs_gpu_codecs::dlpark::traits::TensorView::shape(&tensor);
            assert_eq!(got_shape.iter().map(|&n| n as u64).collect::<Vec<_>>(), shape);
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn concurrent_reads_from_several_threads() -> Result {
    let dir = tempfile::tempdir()?;
    let array =
        Arc::new(v3_array(dir.path(), data_type::float32(), FillValue::from(0.5f32), &[48, 64, 40], &[16, 16, 8])?);
    let handles: Vec<_> = (0..6)
        .map(|t| {
            let array = array.clone();
            std::thread::spawn(move || -> std::result::Result<(), String> {
                let config = if t % 2 == 0 { posix() } else { GpuConfig::default() };
                check_all::<f32, _>(&array, &config, 100 + t).map_err(|e| e.to_string())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("no panic")?;
    }
    Ok(())
}

/// The read plan (which chunks, which bytes, where each lands) applied on the host reproduces
/// zarrs' own retrieval: no GPU needed.
#[test]
fn read_plan_reproduces_zarrs_retrieval() -> Result {
    let dir = tempfile::tempdir()?;
    for (shape, chunks) in
        [(vec![37u64, 45, 29], vec![8u64, 16, 7]), (vec![50], vec![7]), (vec![9, 8, 7, 6], vec![4, 3, 5, 2])]
    {
        let array = v3_array(dir.path(), data_type::uint16(), FillValue::from(0xABCDu16), &shape, &chunks)?;
        let store = array.storage();
        let mut rng = StdRng::seed_from_u64(42);
        for subset in subsets(&shape, &chunks, &mut rng, 20) {
            let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned();
            let grid = array.chunks_in_array_subset(&subset)?.unwrap();
            let listed: Vec<_> = grid
                .indices()
                .into_iter()
                .map(|i| (i.to_vec(), array.chunk_key(&i), array.chunk_subset(&i).unwrap()))
                .collect();
            assert_eq!(listed.len() as u64, grid.num_elements());
            let plan = plan_chunks(2, &subset, listed)?;
            let mut got = vec![0u8; want.len()];
            let fill = 0xABCDu16.to_ne_bytes().repeat(1 << 16);
            for p in &plan {
                let src = match store.get(&p.key)? {
                    Some(bytes) => bytes[p.byte_start as usize..p.byte_end as usize].to_vec(),
                    None => fill[..p.read_len() as usize].to_vec(),
                };
                for c in &p.copies {
                    c.apply_host(&src, &mut got);
                }
            }
            assert!(got == want, "shape {shape:?} subset {:?}", subset.to_ranges());
        }
        store.erase_prefix(&"arr/".try_into()?)?;
    }
    Ok(())
}

/// Without a CUDA driver or device, device retrieval is an error that says so, never a panic.
#[test]
fn no_gpu_is_a_clear_error() -> Result {
    if zarrs_gpu::zarrs_gpu_codecs::reader::cuda_context(0).is_ok() {
        return Ok(()); // a GPU host: the ignored tests cover it
    }
    let dir = tempfile::tempdir()?;
    let array = v3_array(dir.path(), data_type::float32(), FillValue::from(0f32), &[8, 8], &[4, 4])?;
    let err = array.retrieve_array_subset_device::<DeviceArray<f32>>(&array.subset_all()).unwrap_err();
    assert!(matches!(err, GpuError::NoCuda(_)), "{err}");
    Ok(())
}

/// Big-endian raw bits (`r16`, `r32`, `r64`: bytes, which zarrs never swaps) and fixed-length
/// UTF-32 (zarrs swaps each 4-byte code point, not the whole string), plain and zstd-compressed:
/// zarrs' bytes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn big_endian_raw_bits_and_utf32_match_zarrs() -> Result {
    use zarrs::array::codec::BytesCodec;
    let (shape, chunks) = ([23u64, 17], [6u64, 5]);
    let build = |dir: &std::path::Path, data_type: DataType, zstd: bool| -> Result<Array<GdsStore>> {
        let size = data_type.fixed_size().unwrap();
        // A fill value zarrs accepts: code points for UTF-32 ("abc"), distinct bytes otherwise.
        let fill = if data_type.to_string().contains("utf32") {
            FillValue::new("abc".chars().flat_map(|c| u32::from(c).to_ne_bytes()).collect())
        } else {
            FillValue::new((0..size).map(|i| i as u8 + 1).collect())
        };
        let mut builder = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type, fill);
        builder.array_to_bytes_codec(Arc::new(BytesCodec::big()));
        builder.bytes_to_bytes_codecs(if zstd { vec![Arc::new(ZstdCodec::new(3, false))] } else { vec![] });
        let array = builder.build(Arc::new(GdsStore::new(dir)?), "/arr")?;
        array.store_metadata()?;
        fill_random(&array, 21)?;
        Ok(array)
    };
    for zstd in [false, true] {
        macro_rules! case {
            ($t:ty, $dt:expr) => {{
                let dir = tempfile::tempdir()?;
                let array = build(dir.path(), $dt, zstd)?;
                let report = check_subset::<$t, _>(&array, &array.subset_all(), &posix())?;
                assert_eq!(report.decode, DecodePath::Device, "{}: {report:?}", array.data_type());
                check_all::<$t, _>(&array, &posix(), 7)?;
            }};
        }
        case!([u8; 2], data_type::raw_bits(2));
        case!([u8; 4], data_type::raw_bits(4));
        case!([u8; 8], data_type::raw_bits(8));
        case!([char; 3], data_type::fixed_length_utf32(std::num::NonZeroU64::new(12).unwrap())?);
    }
    Ok(())
}

/// Every chunk file of `dir` dropped from the page cache (clean pages of a disk's filesystem).
fn evict(dir: &std::path::Path) -> Result {
    use std::os::unix::io::AsRawFd;
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry?;
        if entry.file_type().is_dir() {
            continue;
        }
        let file = std::fs::File::open(entry.path())?;
        file.sync_all()?;
        // SAFETY: a valid descriptor; advice only.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cold_reads_in_many_batches_equal_zarrs_reads() -> Result {
    // 192 MiB raw (straight to the device) and zstd (checked on the host) in batches of 32 MiB,
    // read after the files left the page cache: where a batch comes at a disk's rate the next
    // ones are advised to the kernel before their reads; the bytes are zarrs' either way.
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    for (name, codecs) in [
        ("raw", vec![]),
        ("zstd", vec![Arc::new(ZstdCodec::new(1, false)) as Arc<dyn zarrs::array::BytesToBytesCodecTraits>]),
    ] {
        let array = ArrayBuilder::new(vec![192, 512, 512], vec![16, 512, 512], data_type::float32(), 0.0f32)
            .bytes_to_bytes_codecs(codecs)
            .build(store.clone(), &format!("/{name}"))?;
        array.store_metadata()?;
        let mut rng = StdRng::seed_from_u64(41);
        let values: Vec<f32> = (0..192 * 512 * 512).map(|i| (i % 4099) as f32 + rng.random::<f32>()).collect();
        array.store_array_subset(&array.subset_all(), &values)?;
        evict(&dir.path().join(name))?;
        let config = GpuConfig::default().with_staging_bytes(32 << 20);
        let (device, report) =
            array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &config)?;
        assert!(device.to_host()? == values, "{name}: the cold read differs ({report:?})");
        eprintln!("{name}: {}", report.io.map(|io| io.to_string()).unwrap_or_default());
    }
    Ok(())
}
