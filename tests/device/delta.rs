//! numcodecs' delta filter decoded on the device (the running sum of each chunk in staging,
//! before placement), compared element for element with zarrs' host retrieval (our host codec):
//! every integer and float type, zstd and uncompressed, either byte order, sharded, partial edge
//! chunks, missing chunks, subsets, chunks of many scan tiles and batches of many launches; an
//! astype of another width goes to the host route. GPU tests are `#[ignore = "needs a CUDA GPU"]`.

use std::num::NonZeroU64;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{BytesCodec, ShardingCodecBuilder, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, ArraySubset, DataType, Endianness, FillValue};
use zarrs::metadata::Configuration;
use zarrs_gpu::zarrs_gpu_codecs::host_decode_reason;
use zarrs_gpu::zarrs_gpu_codecs::DeltaCodec;
use zarrs_gpu::{DecodePath, GdsStore, RetrieveReport};

use super::{check, check_chunk, posix, scheduled, subsets, Result};

fn delta(dtype: &str, astype: Option<&str>) -> Arc<DeltaCodec> {
    let mut map = serde_json::Map::new();
    map.insert("dtype".into(), dtype.into());
    if let Some(astype) = astype {
        map.insert("astype".into(), astype.into());
    }
    Arc::new(DeltaCodec::new_with_configuration(&Configuration::from(map)).expect("a delta configuration"))
}

/// How a case's chunks are stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Chain {
    /// [delta, bytes, zstd]
    Zstd,
    /// [delta, bytes]: read straight into staging.
    Raw,
    /// [delta, bytes (the other byte order), zstd]
    Swapped,
    /// sharding_indexed with inner chunks of [delta, bytes, zstd]
    Sharded,
}

/// An array of `data_type` (numpy `dtype` for delta) whose chunks are random (every seventh
/// never written, so missing), with `chain`.
#[allow(clippy::too_many_arguments)]
fn make(
    dir: &std::path::Path,
    node: &str,
    data_type: &DataType,
    dtype: &str,
    astype: Option<&str>,
    shape: &[u64],
    chunks: &[u64],
    chain: Chain,
) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let fill = FillValue::new(vec![3u8; data_type.fixed_size().unwrap()]);
    let zstd = || Arc::new(ZstdCodec::new(3, false));
    let other = if cfg!(target_endian = "little") { Endianness::Big } else { Endianness::Little };
    let mut b = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type.clone(), fill);
    match chain {
        Chain::Zstd => {
            b.array_to_array_codecs(vec![delta(dtype, astype)]).bytes_to_bytes_codecs(vec![zstd()]);
        }
        Chain::Raw => {
            b.array_to_array_codecs(vec![delta(dtype, astype)]);
        }
        Chain::Swapped => {
            b.array_to_array_codecs(vec![delta(dtype, astype)])
                .array_to_bytes_codec(Arc::new(BytesCodec::new(Some(other))))
                .bytes_to_bytes_codecs(vec![zstd()]);
        }
        Chain::Sharded => {
            let inner: Vec<NonZeroU64> = chunks.iter().map(|&c| NonZeroU64::new(c.div_ceil(2)).unwrap()).collect();
            b.array_to_bytes_codec(
                ShardingCodecBuilder::new(inner, data_type)
                    .array_to_array_codecs(vec![delta(dtype, astype)])
                    .bytes_to_bytes_codecs(vec![zstd()])
                    .build_arc(),
            );
        }
    }
    let array = b.build(store, node)?;
    array.store_metadata()?;
    let elem = data_type.fixed_size().unwrap();
    let float = dtype.contains('f');
    let mut rng = StdRng::seed_from_u64(shape.iter().sum::<u64>() + elem as u64);
    let grid = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
    for (n, indices) in grid.indices().into_iter().enumerate() {
        if n % 7 == 5 {
            continue;
        }
        let subset = array.chunk_subset(&indices)?;
        // Floats: every byte below 0x40 keeps them finite (no NaN, whose bits a sum may change).
        let mut bytes: Vec<u8> = (0..subset.num_elements_usize() * elem)
            .map(|_| if float { rng.random::<u8>() & 0x3F } else { rng.random() })
            .collect();
        // Unsigned values stored as signed differences: numpy refuses a first element past the
        // signed type's range, so every value keeps its top bit clear (the differences still wrap).
        if dtype.contains('u') && astype.is_some_and(|a| a.contains('i')) {
            let top = if cfg!(target_endian = "little") { elem - 1 } else { 0 };
            bytes.chunks_exact_mut(elem).for_each(|e| e[top] &= 0x7F);
        }
        array.store_chunk(&indices, ArrayBytes::new_flen(bytes))?;
    }
    Ok(array)
}

/// Read subsets of `array` (and two whole chunks) on the device as its element type, each
/// compared with zarrs' host read; the reports.
fn check_all(array: &Array<GdsStore>, dtype: &str, seed: u64) -> Result<Vec<RetrieveReport>> {
    let shape = array.shape().to_vec();
    let mut reports = Vec::new();
    let grid = array.chunk_grid_shape().to_vec();
    let last: Vec<u64> = grid.iter().map(|n| n - 1).collect();
    macro_rules! run {
        ($t:ty) => {{
            for subset in subsets(&shape, seed) {
                reports.push(check::<$t>(array, &subset, &posix())?);
            }
            // A scheduled read too (host threads may take the zstd frames; the sum stays on the device).
            reports.push(check::<$t>(array, &array.subset_all(), &scheduled())?);
            reports.push(check_chunk::<$t>(array, &vec![0; shape.len()], &posix())?);
            reports.push(check_chunk::<$t>(array, &last, &posix())?);
        }};
    }
    match dtype.trim_start_matches(['<', '>', '|']) {
        "i1" => run!(i8),
        "i2" => run!(i16),
        "i4" => run!(i32),
        "i8" => run!(i64),
        "u1" => run!(u8),
        "u2" => run!(u16),
        "u4" => run!(u32),
        "u8" => run!(u64),
        "f2" => run!(half::f16),
        "f4" => run!(f32),
        "f8" => run!(f64),
        other => return Err(format!("unexpected dtype {other}").into()),
    }
    Ok(reports)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn delta_chunks_decode_on_the_device_as_zarrs_decodes_them() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [37u64, 20, 11];
    let chunks = [16u64, 8, 4];
    let cases: Vec<(&str, DataType, &str, Chain)> = vec![
        ("/i8_zstd", data_type::int8(), "|i1", Chain::Zstd),
        ("/i16_swapped", data_type::int16(), "<i2", Chain::Swapped),
        ("/i32_zstd", data_type::int32(), "<i4", Chain::Zstd),
        ("/i64_raw", data_type::int64(), "<i8", Chain::Raw),
        ("/u8_raw", data_type::uint8(), "|u1", Chain::Raw),
        ("/u16_zstd", data_type::uint16(), "<u2", Chain::Zstd),
        ("/u32_sharded", data_type::uint32(), "<u4", Chain::Sharded),
        ("/u64_swapped", data_type::uint64(), "<u8", Chain::Swapped),
        ("/f16_raw", data_type::float16(), "<f2", Chain::Raw),
        ("/f32_zstd", data_type::float32(), "<f4", Chain::Zstd),
        ("/f32_sharded", data_type::float32(), "<f4", Chain::Sharded),
        ("/f64_swapped", data_type::float64(), "<f8", Chain::Swapped),
    ];
    for (k, (node, dt, dtype, chain)) in cases.into_iter().enumerate() {
        let array = make(dir.path(), node, &dt, dtype, None, &shape, &chunks, chain)?;
        assert_eq!(host_decode_reason(&array), None, "{node}");
        for report in check_all(&array, dtype, k as u64)? {
            assert_eq!(report.decode, DecodePath::Device, "{node}: {report:?}");
        }
    }
    Ok(())
}

/// A node, its data type, delta's dtype, the shape and the chunk shape.
type LongCase<'a> = (&'a str, DataType, &'a str, Vec<u64>, Vec<u64>);

/// Chunks of many scan tiles (8192 and 12000 elements: the carry from tile to tile, a short last
/// tile), and batches of more chunks than one launch takes (400 chunks of 4 elements).
#[test]
#[ignore = "needs a CUDA GPU"]
fn long_chunks_and_many_chunks_sum_across_tiles_and_launches() -> Result {
    let dir = tempfile::tempdir()?;
    let cases: Vec<LongCase> = vec![
        ("/long_i32", data_type::int32(), "<i4", vec![100, 70, 3], vec![64, 64, 2]),
        ("/long_u16", data_type::uint16(), "<u2", vec![30, 12_000], vec![1, 12_000]),
        ("/long_f64", data_type::float64(), "<f8", vec![100, 70, 3], vec![64, 64, 2]),
        ("/long_f16", data_type::float16(), "<f2", vec![5, 5000], vec![2, 3000]),
        ("/many_i16", data_type::int16(), "<i2", vec![40, 40], vec![2, 2]),
        ("/many_f32", data_type::float32(), "<f4", vec![40, 40], vec![2, 2]),
    ];
    for (k, (node, dt, dtype, shape, chunks)) in cases.into_iter().enumerate() {
        let array = make(dir.path(), node, &dt, dtype, None, &shape, &chunks, Chain::Zstd)?;
        let reports = check_all(&array, dtype, 10 + k as u64)?;
        assert!(reports.iter().all(|r| r.decode == DecodePath::Device), "{node}: {reports:?}");
        // The whole array (the first read) met every chunk, some of them missing.
        assert!(
            reports[0].missing_chunks > 0 && reports[0].chunks > reports[0].missing_chunks,
            "{node}: {:?}",
            reports[0]
        );
    }
    Ok(())
}

/// An astype of another width, delta outside a shard, and dtypes of one width but another
/// signedness: the first two decode on the host (and say why), the last on the device.
#[test]
#[ignore = "needs a CUDA GPU"]
fn delta_the_device_does_not_take_goes_to_the_host_route() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [20u64, 9];
    let chunks = [8u64, 4];
    let narrow = make(dir.path(), "/narrow", &data_type::int32(), "<i4", Some("<i8"), &shape, &chunks, Chain::Zstd)?;
    let reason = host_decode_reason(&narrow).expect("an astype of another width has no device plan");
    assert!(reason.contains("numcodecs.delta") && reason.contains("int64"), "{reason}");
    let report = check::<i32>(&narrow, &narrow.subset_all(), &posix())?;
    assert_eq!(report.decode, DecodePath::Host, "{report:?}");
    // delta over whole shards: the shard is one running sum, decoded by zarrs.
    let store = Arc::new(GdsStore::new(dir.path())?);
    let inner: Vec<NonZeroU64> = [4u64, 2].iter().map(|&c| NonZeroU64::new(c).unwrap()).collect();
    let outer = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type::int16(), FillValue::from(0i16))
        .array_to_array_codecs(vec![delta("<i2", None)])
        .array_to_bytes_codec(ShardingCodecBuilder::new(inner, &data_type::int16()).build_arc())
        .build(store, "/outer")?;
    outer.store_metadata()?;
    let values: Vec<i16> = (0..180).map(|i| (i * 331 % 1000) as i16).collect();
    outer.store_array_subset(&outer.subset_all(), values.clone())?;
    assert!(host_decode_reason(&outer).is_some_and(|r| r.contains("whole shards")));
    let report = check::<i16>(&outer, &ArraySubset::new_with_ranges(&[3..17, 2..9]), &posix())?;
    assert_eq!(report.decode, DecodePath::Host, "{report:?}");
    // uint32 stored as int32 differences: one width, the device's wrapping sum.
    let signs = make(dir.path(), "/signs", &data_type::uint32(), "<u4", Some("<i4"), &shape, &chunks, Chain::Zstd)?;
    assert_eq!(host_decode_reason(&signs), None);
    for report in check_all(&signs, "<u4", 30)? {
        assert_eq!(report.decode, DecodePath::Device, "{report:?}");
    }
    Ok(())
}
