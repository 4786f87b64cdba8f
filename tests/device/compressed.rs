//! zstd, gzip (and crc32c) chunks decoded on the device with nvCOMP, compared with zarrs' host
//! retrieval byte for byte. GPU tests are `#[ignore = "needs a CUDA GPU"]`.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{Crc32cCodec, GzipCodec, ZstdCodec};
use zarrs::array::BytesToBytesCodecTraits;
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, ArraySubset, DataType, FillValue};
use zarrs_gpu::zarrs_gpu_codecs::zstd_frame::FrameError;
use zarrs_gpu::zarrs_gpu_codecs::DecodeRates;
use zarrs_gpu::{sample, ArrayDeviceExt, DecodePath, DecodeTrust, GdsStore, GpuError};
use zarrs_storage::{Bytes, ReadableStorageTraits, WritableStorageTraits};

use super::{check, check_chunk, posix, scheduled, subsets, Result};

pub(crate) fn zstd(level: i32, checksum: bool) -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(ZstdCodec::new(level, checksum))
}

fn gzip(level: u32) -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(GzipCodec::new(level).expect("a gzip level"))
}

/// A compressed array with smooth float data (or random bytes for other types), every fifth
/// chunk never written.
pub(crate) fn make_array(
    dir: &std::path::Path,
    data_type: DataType,
    fill: FillValue,
    shape: &[u64],
    chunks: &[u64],
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let array = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type, fill)
        .bytes_to_bytes_codecs(codecs)
        .build(store, "/z")?;
    array.store_metadata()?;
    let mut rng = StdRng::seed_from_u64(5);
    let elem = array.data_type().fixed_size().unwrap();
    let is_f32 = array.data_type().to_string().starts_with("float32");
    let grid = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
    for (n, indices) in grid.indices().into_iter().enumerate() {
        if n % 5 == 3 {
            continue;
        }
        let subset = array.chunk_subset(&indices)?;
        let bytes: Vec<u8> = if is_f32 {
            let values: Vec<f32> =
                (0..subset.num_elements()).map(|i| sample::sample_value(i + n as u64 * 977, shape)).collect();
            bytemuck_cast(&values)
        } else {
            let mut b: Vec<u8> = (0..subset.num_elements_usize() * elem).map(|_| rng.random::<u8>() & 0x0F).collect();
            if array.data_type().to_string() == "bool" {
                for x in &mut b {
                    *x &= 1;
                }
            }
            b
        };
        array.store_chunk(&indices, ArrayBytes::new_flen(bytes))?;
    }
    Ok(array)
}

fn bytemuck_cast(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

/// The scheduler: a small read's chunks decode on host threads, a large one's mostly on nvCOMP,
/// every split the same bytes as zarrs', and the report says how it split and why.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_scheduler_splits_reads_between_host_threads_and_nvcomp() -> Result {
    let dir = tempfile::tempdir()?;
    // 64 x 512 x 512 float32 in chunks of 1 MiB (every fifth missing), zstd with and without
    // crc32c.
    for (n, codecs) in
        [vec![zstd(3, false)], vec![zstd(3, true), Arc::new(Crc32cCodec::new()) as _]].into_iter().enumerate()
    {
        let array = make_array(
            dir.path(),
            data_type::float32(),
            FillValue::from(1.5f32),
            &[64, 512, 512],
            &[16, 128, 128],
            codecs,
        )?;
        // One tile of 18 chunks: all on host threads at the default rates. Set, so that what
        // earlier tests of this process taught the scheduler (the host rate, nvCOMP's slowness)
        // cannot flip the split.
        let tile = ArraySubset::new_with_ranges(&[5..37, 100..300, 200..400]);
        let report = check::<f32>(&array, &tile, &scheduled().with_decode_rates(Some(DecodeRates::default())))?;
        let present = report.chunks - report.missing_chunks;
        assert_eq!(report.host_decoded_chunks, present, "{n}: {report:?}");
        let why = report.schedule.as_deref().unwrap_or_default();
        assert!(why.contains(&format!("{present} of {present} chunks on host threads")), "{why}");
        // With what this process has learned, any split, but the report says the one made.
        let report = check::<f32>(&array, &tile, &scheduled())?;
        let why = report.schedule.as_deref().unwrap_or_default();
        assert!(why.contains(&format!("{} of {present} chunks on host threads", report.host_decoded_chunks)), "{why}");
        // Odd subsets and the whole array, whichever way they split.
        for subset in subsets(array.shape(), 40 + n as u64) {
            check::<f32>(&array, &subset, &scheduled())?;
        }
        // Set rates that make host threads slow: all on nvCOMP.
        let slow_host = DecodeRates::default().with_host_thread_rate(1.0);
        let report = check::<f32>(&array, &tile, &scheduled().with_decode_rates(Some(slow_host)))?;
        assert_eq!(report.host_decoded_chunks, 0, "{n}: {report:?}");
        array.storage().erase_prefix(&"z/".try_into()?)?;
    }
    Ok(())
}

/// Batches large enough that the decoder's scratch is computed from their frames (nvCOMP's
/// bound for a hundred frames of 1 MiB passes 256 MiB), in one batch and in several (the shared
/// scratch grown between them), and an output large enough to be allocated while the first
/// batch is read: against zarrs, twice each (the second read reuses what the pools keep).
#[test]
#[ignore = "needs a CUDA GPU"]
fn large_batches_size_their_scratch_from_their_frames_and_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    // 80 x 1024 x 1024 float32 (320 MiB) in chunks of 1 MiB, every fifth never written.
    let (shape, chunks) = ([80u64, 1024, 1024], [8u64, 128, 256]);
    let array =
        make_array(dir.path(), data_type::float32(), FillValue::from(-7.5f32), &shape, &chunks, vec![zstd(3, false)])?;
    // 290 MiB of output, no chunk whole.
    let subset = ArraySubset::new_with_ranges(&[3..77, 5..1020, 3..1000]);
    for config in [posix(), posix().with_staging_bytes(96 << 20)] {
        for _ in 0..2 {
            let report = check::<f32>(&array, &subset, &config)?;
            assert_eq!(report.decode, DecodePath::Device, "{report:?}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn zstd_levels_checksums_and_crc32c_match_zarrs() -> Result {
    let shape = [40u64, 70, 33];
    let chunks = [16u64, 32, 16];
    let chains: Vec<Vec<Arc<dyn BytesToBytesCodecTraits>>> = vec![
        vec![zstd(1, false)],
        vec![zstd(3, false)],
        vec![zstd(19, false)],
        vec![zstd(3, true)],
        vec![zstd(3, false), Arc::new(Crc32cCodec::new())],
        vec![Arc::new(Crc32cCodec::new())],
    ];
    for (c, codecs) in chains.into_iter().enumerate() {
        let dir = tempfile::tempdir()?;
        let array = make_array(dir.path(), data_type::float32(), FillValue::from(-7.5f32), &shape, &chunks, codecs)?;
        let report = check::<f32>(&array, &array.subset_all(), &posix())?;
        assert_eq!(report.decode, DecodePath::Device, "chain {c}: {report:?}");
        assert!(report.missing_chunks > 0, "{report:?}");
        for subset in subsets(&shape, c as u64) {
            check::<f32>(&array, &subset, &posix())?;
        }
        // Whole chunks decode on the device too: an inner one, an edge one, a missing one.
        for indices in [[1u64, 1, 1], [2, 2, 2], [0, 1, 0]] {
            let report = check_chunk::<f32>(&array, &indices, &posix())?;
            assert_eq!(report.decode, DecodePath::Device, "chain {c}, chunk {indices:?}: {report:?}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn data_types_and_chunk_sizes() -> Result {
    let dir = tempfile::tempdir()?;
    macro_rules! case {
        ($t:ty, $dt:expr, $fill:expr, $shape:expr, $chunks:expr) => {{
            let array = make_array(dir.path(), $dt, FillValue::from($fill), &$shape, &$chunks, vec![zstd(3, false)])?;
            for subset in subsets(&$shape, 9) {
                check::<$t>(&array, &subset, &posix())?;
            }
            array.storage().erase_prefix(&"z/".try_into()?)?;
        }};
    }
    case!(u8, data_type::uint8(), 3u8, [100u64, 90], [64u64, 64]); // 4 KiB chunks
    case!(i16, data_type::int16(), -2i16, [50u64, 61, 7], [8u64, 16, 7]);
    case!(u64, data_type::uint64(), 9u64, [33u64, 20], [10u64, 10]);
    case!(f64, data_type::float64(), 0.5f64, [64u64, 64, 20], [32u64, 32, 16]);
    case!(bool, data_type::bool(), true, [77u64, 13], [20u64, 5]);
    // Large chunks: 16 MiB and 64 MiB decoded, on the device and, given a share, on host threads.
    let array = make_array(
        dir.path(),
        data_type::float32(),
        FillValue::from(0f32),
        &[96, 512, 512],
        &[16, 512, 512],
        vec![zstd(3, false)],
    )?;
    // (The scheduler's split as its rates say: our zstd decoder's take all six on the device,
    // run DT6; a share given splits them.)
    check::<f32>(&array, &array.subset_all(), &scheduled())?;
    let split = check::<f32>(&array, &array.subset_all(), &posix().with_host_decode_fraction(Some(0.5)))?;
    assert!(split.host_decoded_chunks > 0 && split.host_decoded_chunks < 6, "{split:?}");
    check::<f32>(&array, &array.subset_all(), &posix().with_host_decode_fraction(Some(0.0)))?;
    check::<f32>(&array, &array.subset_all(), &posix().with_host_decode_fraction(Some(1.0)))?;
    array.storage().erase_prefix(&"z/".try_into()?)?;
    let array = make_array(
        dir.path(),
        data_type::float32(),
        FillValue::from(0f32),
        &[70, 512, 512],
        &[64, 512, 512],
        vec![zstd(1, false)],
    )?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    check::<f32>(&array, &ArraySubset::new_with_ranges(&[60..70, 3..300, 0..512]), &posix())?;
    // Many small batches.
    check::<f32>(&array, &array.subset_all(), &posix().with_staging_bytes(1 << 20))?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn corrupt_chunks_are_errors_naming_the_key_and_the_next_read_works() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [32u64, 64];
    let array = make_array(
        dir.path(),
        data_type::float32(),
        FillValue::from(0f32),
        &shape,
        &[16, 32],
        vec![zstd(3, false), Arc::new(Crc32cCodec::new())],
    )?;
    let store = array.storage();
    let key = array.chunk_key(&[0, 1]);
    let good = store.get(&key)?.unwrap();
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("flipped payload byte (crc32c catches it)", {
            let mut b = good.to_vec();
            let mid = b.len() / 2;
            b[mid] ^= 0x55;
            b
        }),
        ("bad magic", {
            let mut b = good.to_vec();
            b[0] ^= 0xFF;
            b
        }),
        ("empty", Vec::new()),
    ];
    for (what, bytes) in cases {
        store.set(&key, Bytes::from(bytes))?;
        let err =
            array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix()).unwrap_err();
        assert!(matches!(err, GpuError::Chunk { .. }) && err.to_string().contains(&key.to_string()), "{what}: {err}");
        if what == "bad magic" {
            // The host check's typed cause is kept.
            let cause = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<FrameError>());
            assert!(cause.is_some(), "{what}: {err:?}");
        }
        // The context still works: another array reads fine.
        store.set(&key, good.clone())?;
        check::<f32>(&array, &array.subset_all(), &posix())?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn frames_nvcomp_cannot_take_decode_on_the_host() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [20u64, 30];
    let array =
        make_array(dir.path(), data_type::float32(), FillValue::from(0f32), &shape, &[10, 30], vec![zstd(3, false)])?;
    let store = array.storage();
    // Chunk (0, 0) rewritten as two frames, chunk (1, 0) without a recorded content size.
    let raw: Vec<u8> = array.retrieve_chunk::<ArrayBytes<'static>>(&[0, 0])?.into_fixed()?.into_owned();
    let mut two = zstd::bulk::compress(&raw[..600], 3)?;
    two.extend(zstd::bulk::compress(&raw[600..], 3)?);
    store.set(&array.chunk_key(&[0, 0]), Bytes::from(two))?;
    let raw1: Vec<u8> = array.retrieve_chunk::<ArrayBytes<'static>>(&[1, 0])?.into_fixed()?.into_owned();
    let mut streamed = Vec::new();
    {
        let mut encoder = zstd::stream::Encoder::new(&mut streamed, 3)?;
        encoder.include_contentsize(false)?;
        std::io::Write::write_all(&mut encoder, &raw1)?;
        encoder.finish()?;
    }
    store.set(&array.chunk_key(&[1, 0]), Bytes::from(streamed))?;
    let report = check::<f32>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.host_decoded_chunks, 2, "{report:?}");
    Ok(())
}

/// A float32 (or `T`) array with these codecs, every chunk written with varied values.
fn make_with_codecs(
    dir: &std::path::Path,
    node: &str,
    data_type: DataType,
    fill: FillValue,
    shape: &[u64],
    chunks: &[u64],
    builder: impl FnOnce(&mut ArrayBuilder),
) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let mut b = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type, fill);
    builder(&mut b);
    let array = b.build(store, node)?;
    array.store_metadata()?;
    let elem = array.data_type().fixed_size().unwrap();
    let mut rng = StdRng::seed_from_u64(21);
    let grid = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
    for (n, indices) in grid.indices().into_iter().enumerate() {
        if n % 6 == 4 {
            continue;
        }
        let subset = array.chunk_subset(&indices)?;
        let bytes: Vec<u8> = (0..subset.num_elements_usize() * elem).map(|_| rng.random::<u8>() & 0x3F).collect();
        array.store_chunk(&indices, ArrayBytes::new_flen(bytes))?;
    }
    Ok(array)
}

/// A node, its data type and fill value, and how its codecs are built.
type Case<'a> = (&'a str, DataType, FillValue, Box<dyn FnOnce(&mut ArrayBuilder) + 'a>);

#[test]
#[ignore = "needs a CUDA GPU"]
fn transposed_and_big_endian_chunks_match_zarrs() -> Result {
    use zarrs::array::codec::{BytesCodec, TransposeCodec, TransposeOrder};
    use zarrs::array::Endianness;
    let dir = tempfile::tempdir()?;
    let shape = [37u64, 20, 11];
    let chunks = [16u64, 8, 4];
    let transpose =
        |order: &[usize]| -> Arc<TransposeCodec> { Arc::new(TransposeCodec::new(TransposeOrder::new(order).unwrap())) };
    let big = || Arc::new(BytesCodec::new(Some(Endianness::Big)));
    let cases: Vec<Case> = vec![
        (
            "/t_zstd",
            data_type::float32(),
            FillValue::from(0.5f32),
            Box::new(|b| {
                b.array_to_array_codecs(vec![transpose(&[2, 0, 1])]).bytes_to_bytes_codecs(vec![zstd(3, false)]);
            }),
        ),
        (
            "/be_raw",
            data_type::uint16(),
            FillValue::from(7u16),
            Box::new(|b| {
                b.array_to_bytes_codec(big());
            }),
        ),
        (
            "/be_complex_crc",
            data_type::complex64(),
            FillValue::from(num_complex::Complex32::new(1.0, -2.0)),
            Box::new(|b| {
                b.array_to_bytes_codec(big()).bytes_to_bytes_codecs(vec![zstd(1, false), Arc::new(Crc32cCodec::new())]);
            }),
        ),
        (
            "/t_be_f64",
            data_type::float64(),
            FillValue::from(-1.0f64),
            Box::new(|b| {
                b.array_to_array_codecs(vec![transpose(&[1, 0, 2])]).array_to_bytes_codec(big());
            }),
        ),
    ];
    for (node, dt, fill, builder) in cases {
        let array = make_with_codecs(dir.path(), node, dt.clone(), fill, &shape, &chunks, builder)?;
        assert_eq!(zarrs_gpu::zarrs_gpu_codecs::host_decode_reason(&array), None, "{node}");
        for subset in subsets(&shape, 4) {
            let report = match dt.to_string().as_str() {
                s if s.starts_with("float32") => check::<f32>(&array, &subset, &posix())?,
                s if s.starts_with("uint16") => check::<u16>(&array, &subset, &posix())?,
                s if s.starts_with("complex64") => check::<num_complex::Complex32>(&array, &subset, &posix())?,
                _ => check::<f64>(&array, &subset, &posix())?,
            };
            assert_eq!(report.decode, DecodePath::Device, "{node}: {report:?}");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gzip_levels_data_types_and_crc32c_match_zarrs() -> Result {
    let shape = [40u64, 70, 33];
    let chunks = [16u64, 32, 16];
    let chains: Vec<Vec<Arc<dyn BytesToBytesCodecTraits>>> =
        vec![vec![gzip(1)], vec![gzip(6)], vec![gzip(9)], vec![gzip(0)], vec![gzip(5), Arc::new(Crc32cCodec::new())]];
    let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
    for (c, codecs) in chains.into_iter().enumerate() {
        let verified = codecs.len() == 2;
        let dir = tempfile::tempdir()?;
        let array = make_array(dir.path(), data_type::float32(), FillValue::from(2.5f32), &shape, &chunks, codecs)?;
        // By default members nvCOMP cannot be shown valid first (no crc32c) decode on host threads.
        let report = check::<f32>(&array, &array.subset_all(), &posix())?;
        assert_eq!(report.decode, DecodePath::Device, "chain {c}: {report:?}");
        let present = report.chunks - report.missing_chunks;
        assert!(report.missing_chunks > 0, "{report:?}");
        assert_eq!(report.host_decoded_chunks, if verified { 0 } else { present }, "chain {c}: {report:?}");
        // Trusted, every member goes to nvCOMP.
        let report = check::<f32>(&array, &array.subset_all(), &trusted)?;
        assert_eq!(report.host_decoded_chunks, 0, "chain {c}: {report:?}");
        for subset in subsets(&shape, 10 + c as u64) {
            check::<f32>(&array, &subset, &trusted)?;
            check::<f32>(&array, &subset, &posix().with_decode_trust(DecodeTrust::Verified))?;
        }
    }
    let dir = tempfile::tempdir()?;
    let array =
        make_array(dir.path(), data_type::int16(), FillValue::from(-3i16), &[50, 61, 7], &[8, 16, 7], vec![gzip(4)])?;
    for subset in subsets(&[50, 61, 7], 2) {
        check::<i16>(&array, &subset, &trusted)?;
    }
    // 16 MiB chunks: nvCOMP and host threads share them; every share decodes the same.
    let array = make_array(
        dir.path(),
        data_type::float32(),
        FillValue::from(0f32),
        &[48, 512, 512],
        &[16, 512, 512],
        vec![gzip(1)],
    )?;
    for fraction in [None, Some(0.0), Some(1.0)] {
        check::<f32>(&array, &array.subset_all(), &trusted.clone().with_host_decode_fraction(fraction))?;
    }
    Ok(())
}

/// A gzip member of `raw` with the file name field set (valid gzip that the device leaves to the
/// host).
fn gzip_named(raw: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new().filename("chunk").write(Vec::new(), flate2::Compression::new(5));
    std::io::Write::write_all(&mut encoder, raw)?;
    Ok(encoder.finish()?)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gzip_members_nvcomp_cannot_take_decode_on_the_host() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [20u64, 30];
    let array = make_array(dir.path(), data_type::float32(), FillValue::from(0f32), &shape, &[10, 30], vec![gzip(5)])?;
    let store = array.storage();
    // Chunk (0, 0) with a file name in its header, chunk (1, 0) with bytes after the member
    // (which zarrs' gzip codec ignores).
    let raw: Vec<u8> = array.retrieve_chunk::<ArrayBytes<'static>>(&[0, 0])?.into_fixed()?.into_owned();
    store.set(&array.chunk_key(&[0, 0]), Bytes::from(gzip_named(&raw)?))?;
    let key = array.chunk_key(&[1, 0]);
    let mut trailing = store.get(&key)?.unwrap().to_vec();
    trailing.extend_from_slice(b"trailing bytes");
    store.set(&key, Bytes::from(trailing))?;
    let report = check::<f32>(&array, &array.subset_all(), &posix().with_decode_trust(DecodeTrust::Trusted))?;
    assert_eq!(report.host_decoded_chunks, 2, "{report:?}");
    Ok(())
}

/// Corrupt gzip members never reach nvCOMP by default (one faulted the CUDA context with an
/// illegal address on the GPU host): without crc32c they decode on host threads, whose CRC-32
/// check refuses them; with crc32c the device refuses them before decoding. Either way the read is
/// an error naming the chunk, never wrong data, and the next read works.
#[test]
#[ignore = "needs a CUDA GPU"]
fn corrupt_gzip_members_are_errors_never_wrong_data() -> Result {
    let shape = [64u64, 256];
    for codecs in [vec![gzip(6)], vec![gzip(6), Arc::new(Crc32cCodec::new()) as Arc<dyn BytesToBytesCodecTraits>]] {
        let dir = tempfile::tempdir()?;
        let with_crc = codecs.len() == 2;
        let array = make_array(dir.path(), data_type::float32(), FillValue::from(0f32), &shape, &[32, 128], codecs)?;
        let store = array.storage();
        let key = array.chunk_key(&[0, 1]);
        let good = store.get(&key)?.unwrap();
        let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?.into_owned();
        let mut rng = StdRng::seed_from_u64(77);
        let n = good.len();
        // Flipped bytes all over the deflate stream, the trailer's CRC-32, garbage for the payload.
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for _ in 0..24 {
            let mut b = good.to_vec();
            let at = rng.random_range(10..n - 12);
            b[at] ^= rng.random_range(1..=255u8);
            cases.push(b);
        }
        let mut crc = good.to_vec();
        crc[n - 8 - if with_crc { 4 } else { 0 }] ^= 1;
        cases.push(crc);
        let mut garbage = good.to_vec();
        rng.fill(&mut garbage[10..n - 12]);
        cases.push(garbage);
        let tries = cases.len();
        let mut errors = 0;
        for (k, bytes) in cases.into_iter().enumerate() {
            store.set(&key, Bytes::from(bytes))?;
            match array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix()) {
                Err(err) => {
                    assert!(
                        matches!(err, GpuError::Chunk { .. }) && err.to_string().contains(&key.to_string()),
                        "{err}"
                    );
                    errors += 1;
                }
                // A flip in bits deflate never reads (the last byte's padding) changes nothing.
                Ok((data, _)) => assert!(data.to_host_bytes()? == want, "case {k}: wrong data without an error"),
            }
        }
        assert!(errors * 10 >= tries * 9, "{errors} of {tries} refused");
        if with_crc {
            assert_eq!(errors, tries, "crc32c refuses every corrupted member");
        }
        store.set(&key, good)?;
        check::<f32>(&array, &array.subset_all(), &posix())?;
    }
    Ok(())
}
