//! Sharded arrays (`sharding_indexed`) decoded on the device, compared with zarrs' host
//! retrieval byte for byte: index at the start and the end, inner chains with zstd, crc32c or
//! neither, nested sharding, missing shards and missing inner chunks, edge shards, subsets.

use std::num::NonZeroU64;
use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{Crc32cCodec, GzipCodec, ShardingCodecBuilder, ShardingIndexLocation, ZlibCodec, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayToBytesCodecTraits, BytesToBytesCodecTraits};
use zarrs_gpu::zarrs_gpu_codecs::host_decode_reason;
use zarrs_gpu::{
    ArrayDeviceExt, DecodePath, DecodeTrust, GdsStore, GpuConfig, GpuError, IoBackend, IoPath, RetrieveReport,
    ShardIndexCache,
};
use zarrs_storage::{Bytes, ReadableStorageTraits, WritableStorageTraits};

use super::{check, check_chunk, posix, subsets, Result};

fn shape_of(s: &[u64]) -> Vec<NonZeroU64> {
    s.iter().map(|&n| NonZeroU64::new(n).unwrap()).collect()
}

pub(crate) fn sharding(
    inner: &[u64],
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
    location: ShardingIndexLocation,
) -> Arc<dyn ArrayToBytesCodecTraits> {
    ShardingCodecBuilder::new(shape_of(inner), &data_type::float32())
        .bytes_to_bytes_codecs(codecs)
        .index_location(location)
        .build_arc()
}

/// A float32 array with chunks (shards) of `shard` whose codec is `a2b`: every fourth shard never
/// written; in the others, inner chunks of `inner` whose position hashes to 1 mod 3 hold only the
/// fill value (so zarrs leaves them out of the shard).
pub(crate) fn make_sharded(
    dir: &std::path::Path,
    shape: &[u64],
    shard: &[u64],
    inner: &[u64],
    a2b: Arc<dyn ArrayToBytesCodecTraits>,
) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let fill = -3.25f32;
    let array = ArrayBuilder::new(shape.to_vec(), shard.to_vec(), data_type::float32(), fill)
        .array_to_bytes_codec(a2b)
        .build(store, "/s")?;
    array.store_metadata()?;
    let mut rng = StdRng::seed_from_u64(11);
    let grid = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
    for (n, indices) in grid.indices().into_iter().enumerate() {
        if n % 4 == 2 {
            continue;
        }
        let subset = array.chunk_subset(&indices)?;
        let values: Vec<f32> = subset
            .indices()
            .into_iter()
            .map(|p| {
                let cell: u64 =
                    p.iter().zip(inner).map(|(x, c)| x / c).fold(0, |a, c| a.wrapping_mul(31).wrapping_add(c));
                if cell % 3 == 1 {
                    fill
                } else {
                    (p.iter().sum::<u64>() as f32 * 0.25).round() + f32::from(rng.random::<u8>() & 7)
                }
            })
            .collect();
        array.store_chunk(&indices, values)?;
    }
    Ok(array)
}

#[test]
fn sharded_arrays_with_device_inner_chains_plan_for_the_device() -> Result {
    // The route a read takes: without a loadable nvCOMP the chains that need it decode on the
    // host, and the reason says so.
    let nvcomp = zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok();
    let on_device = |array: &Array<GdsStore>| {
        let reason = host_decode_reason(array);
        if nvcomp {
            assert_eq!(reason, None);
        } else {
            assert!(reason.as_deref().is_some_and(|r| r.contains("nvCOMP")), "{reason:?}");
        }
    };
    let dir = tempfile::tempdir()?;
    let zstd: Arc<dyn BytesToBytesCodecTraits> = Arc::new(ZstdCodec::new(3, false));
    let array =
        make_sharded(dir.path(), &[8, 8], &[8, 8], &[4, 4], sharding(&[4, 4], vec![zstd], ShardingIndexLocation::End))?;
    // zstd frames nothing verifies decode on ours, nvCOMP or not.
    assert_eq!(host_decode_reason(&array), None);
    let gzip: Arc<dyn BytesToBytesCodecTraits> = Arc::new(zarrs::array::codec::GzipCodec::new(5)?);
    let array =
        make_sharded(dir.path(), &[8, 8], &[8, 8], &[4, 4], sharding(&[4, 4], vec![gzip], ShardingIndexLocation::End))?;
    on_device(&array);
    let zlib: Arc<dyn BytesToBytesCodecTraits> = Arc::new(ZlibCodec::new(5u32.try_into().expect("a zlib level")));
    let array =
        make_sharded(dir.path(), &[8, 8], &[8, 8], &[4, 4], sharding(&[4, 4], vec![zlib], ShardingIndexLocation::End))?;
    on_device(&array);
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sharded_arrays_match_zarrs() -> Result {
    let shape = [70u64, 45, 33];
    let shard = [32u64, 32, 16];
    let inner = [8u64, 16, 8];
    let chains: Vec<Vec<Arc<dyn BytesToBytesCodecTraits>>> = vec![
        vec![Arc::new(ZstdCodec::new(3, false))],
        vec![Arc::new(ZstdCodec::new(1, true)), Arc::new(Crc32cCodec::new())],
        vec![Arc::new(Crc32cCodec::new())],
        vec![],
        // gzip members lie at any byte of a shard: nvCOMP's naive gzip algorithm.
        vec![Arc::new(GzipCodec::new(5)?)],
        vec![Arc::new(GzipCodec::new(1)?), Arc::new(Crc32cCodec::new())],
        // zlib streams too: their deflate streams, 2 bytes in, copied to aligned places first.
        // (Not level 1: zlib-rs' fastest level can write more than zlib's compressBound, by
        // which zarrs 0.23 sizes a shard's buffer, and the write fails.)
        vec![Arc::new(ZlibCodec::new(5u32.try_into().expect("a zlib level")))],
        vec![Arc::new(ZlibCodec::new(6u32.try_into().expect("a zlib level"))), Arc::new(Crc32cCodec::new())],
    ];
    for (c, codecs) in chains.into_iter().enumerate() {
        for location in [ShardingIndexLocation::End, ShardingIndexLocation::Start] {
            let dir = tempfile::tempdir()?;
            let array = make_sharded(dir.path(), &shape, &shard, &inner, sharding(&inner, codecs.clone(), location))?;
            // Trusted: gzip members without crc32c go to nvCOMP too (the default decodes them
            // on host threads, tested with the unsharded ones).
            let config = posix().with_decode_trust(DecodeTrust::Trusted);
            let report = check::<f32>(&array, &array.subset_all(), &config)?;
            assert_eq!(report.decode, DecodePath::Device, "chain {c} {location:?}: {report:?}");
            assert_eq!(report.host_decoded_chunks, 0, "chain {c} {location:?}: {report:?}");
            assert!(report.missing_chunks > 0, "chain {c}: {report:?}");
            for subset in subsets(&shape, c as u64) {
                check::<f32>(&array, &subset, &config)?;
            }
            // Again, in small batches, reading the indexes each time; then with a cache, whose
            // second read reads no index bytes.
            let small = config.clone().with_staging_bytes(1 << 20);
            let again = check::<f32>(&array, &array.subset_all(), &small)?;
            assert_eq!(again.bytes_read, report.bytes_read, "chain {c}: no cache, the indexes are read again");
            let cache = Arc::new(ShardIndexCache::new());
            let cached = small.with_shard_index_cache(Some(cache.clone()));
            // Files written in the last seconds are never cached (a rewrite within one tick of
            // the clock would look the same): these were written long ago.
            settle();
            let first = check::<f32>(&array, &array.subset_all(), &cached)?;
            assert!(!cache.is_empty(), "chain {c}: the first read fills the cache");
            let second = check::<f32>(&array, &array.subset_all(), &cached)?;
            assert!(second.bytes_read < first.bytes_read, "chain {c}: {second:?} after {first:?}");
            // A shard rewritten after its index was cached (other inner chunks present now): its
            // index is read again, never the old one used.
            let rewritten = [1u64, 0, 1];
            let count = array.chunk_subset(&rewritten)?.num_elements_usize();
            let values: Vec<f32> = (0..count).map(|i| i as f32 * 0.5 - 7.0).collect();
            array.store_chunk(&rewritten, values)?;
            let third = check::<f32>(&array, &array.subset_all(), &cached)?;
            assert!(third.bytes_read > second.bytes_read, "chain {c}: the rewritten shard's index is read again");
            // Whole shards decode on the device: an inner one, the edge one, a missing one.
            for indices in [[1u64, 0, 1], [2, 1, 2], [0, 0, 2]] {
                let report = check_chunk::<f32>(&array, &indices, &config)?;
                assert_eq!(report.decode, DecodePath::Device, "chain {c}, shard {indices:?}: {report:?}");
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nested_sharding_matches_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let zstd: Arc<dyn BytesToBytesCodecTraits> = Arc::new(ZstdCodec::new(3, false));
    let innermost = sharding(&[4, 8], vec![zstd], ShardingIndexLocation::End);
    let middle = ShardingCodecBuilder::new(shape_of(&[16, 16]), &data_type::float32())
        .array_to_bytes_codec(innermost)
        .index_location(ShardingIndexLocation::Start)
        .build_arc();
    let shape = [50u64, 70];
    let array = make_sharded(dir.path(), &shape, &[32, 32], &[4, 8], middle)?;
    let report = check::<f32>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.decode, DecodePath::Device, "{report:?}");
    for subset in subsets(&shape, 3) {
        check::<f32>(&array, &subset, &posix())?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn corrupt_shards_are_errors_naming_the_shard_and_the_next_read_works() -> Result {
    let dir = tempfile::tempdir()?;
    let codecs: Vec<Arc<dyn BytesToBytesCodecTraits>> =
        vec![Arc::new(ZstdCodec::new(3, false)), Arc::new(Crc32cCodec::new())];
    let shape = [32u64, 32];
    let array =
        make_sharded(dir.path(), &shape, &[16, 32], &[8, 8], sharding(&[8, 8], codecs, ShardingIndexLocation::End))?;
    let store = array.storage();
    let key = array.chunk_key(&[0, 0]);
    let good = store.get(&key)?.unwrap();
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let n = good.len();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("flipped byte in an inner chunk (its crc32c catches it)", {
            let mut b = good.to_vec();
            b[n / 4] ^= 0x55;
            b
        }),
        ("flipped byte in the index (the index crc32c catches it)", {
            let mut b = good.to_vec();
            b[n - 10] ^= 0x01;
            b
        }),
        ("shorter than its index", good[..8].to_vec()),
        ("truncated: the index points past the end", good[n / 2..].to_vec()),
    ];
    for (what, bytes) in cases {
        store.set(&key, Bytes::from(bytes))?;
        let err =
            array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, GpuError::Chunk { .. } | GpuError::Read(_)) && text.contains(&key.to_string()),
            "{what}: {text}"
        );
        store.set(&key, good.clone())?;
        check::<f32>(&array, &array.subset_all(), &posix())?;
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn inner_chunks_transposed_and_big_endian_match_zarrs() -> Result {
    use zarrs::array::codec::{BytesCodec, TransposeCodec, TransposeOrder};
    use zarrs::array::Endianness;
    let dir = tempfile::tempdir()?;
    let inner = [8u64, 16, 8];
    let a2b = ShardingCodecBuilder::new(shape_of(&inner), &data_type::float32())
        .array_to_array_codecs(vec![Arc::new(TransposeCodec::new(TransposeOrder::new(&[2, 1, 0])?))])
        .array_to_bytes_codec(Arc::new(BytesCodec::new(Some(Endianness::Big))))
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
        .build_arc();
    let shape = [40u64, 33, 20];
    let array = make_sharded(dir.path(), &shape, &[16, 32, 16], &inner, a2b)?;
    let report = check::<f32>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.decode, DecodePath::Device, "{report:?}");
    for subset in subsets(&shape, 8) {
        check::<f32>(&array, &subset, &posix())?;
    }
    Ok(())
}

/// Uncompressed inner chunks have nothing to check on the host: they are read straight to the
/// device (pread + pinned + async copy here; cuFile where native GDS works), from a `GdsStore`
/// and from any other store alike, and a shard that is too short is still an error.
#[test]
#[ignore = "needs a CUDA GPU"]
fn uncompressed_inner_chunks_are_read_straight_to_the_device() -> Result {
    use zarrs::filesystem::FilesystemStore;
    let dir = tempfile::tempdir()?;
    let shape = [40u64, 50, 12];
    let array = make_sharded(
        dir.path(),
        &shape,
        &[16, 32, 12],
        &[8, 8, 4],
        sharding(&[8, 8, 4], vec![], ShardingIndexLocation::Start),
    )?;
    for subset in subsets(&shape, 5) {
        let report = check::<f32>(&array, &subset, &posix())?;
        let io = report.io.expect("a read");
        assert!(io.path == IoPath::Posix && !io.reason.contains("host memory"), "{io:?}");
    }
    let fs = Arc::new(FilesystemStore::new(dir.path())?);
    let other = zarrs::array::Array::open(fs, "/s")?;
    let want = array.retrieve_array_subset::<Vec<f32>>(&other.subset_all())?;
    let (got, report) = other.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&other.subset_all(), &posix())?;
    assert_eq!(got.to_host()?, want);
    assert_eq!(report.io.map(|s| s.path), Some(IoPath::Staged));
    // A shard cut short: its index (at the start) points past the end.
    let key = array.chunk_key(&[0, 0, 0]);
    let good = array.storage().get(&key)?.unwrap();
    array.storage().set(&key, Bytes::from(good[..good.len() - 100].to_vec()))?;
    let err = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix()).unwrap_err();
    assert!(err.to_string().contains(&key.to_string()), "{err}");
    Ok(())
}

/// Tiles whose part of an uncompressed chunk (or inner chunk) is at most half of the bytes between
/// its first and last are read row by row, packed: equal to zarrs, and only their bytes read.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tiles_of_uncompressed_chunks_read_only_their_rows_and_match_zarrs() -> Result {
    let (dir, dir2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let shape = [40u64, 150, 600];
    let store = Arc::new(GdsStore::new(dir.path())?);
    let plain =
        ArrayBuilder::new(shape.to_vec(), vec![16, 64, 256], data_type::float32(), -2.5f32).build(store, "/p")?;
    plain.store_metadata()?;
    let mut rng = StdRng::seed_from_u64(23);
    let grid = plain.chunks_in_array_subset(&plain.subset_all())?.expect("a regular grid");
    for (n, indices) in grid.indices().into_iter().enumerate() {
        if n % 5 == 3 {
            continue; // never written: read as the fill value
        }
        let len = plain.chunk_subset(&indices)?.num_elements_usize();
        plain.store_chunk(&indices, (0..len).map(|_| rng.random::<f32>()).collect::<Vec<f32>>())?;
    }
    // Inside chunk 0: 8 x 35 x 180 elements, rows of 720 bytes 1 KiB apart.
    let tile = zarrs::array::ArraySubset::new_with_ranges(&[2..10, 5..40, 20..200]);
    let report = check::<f32>(&plain, &tile, &posix())?;
    assert_eq!(report.bytes_read, 8 * 35 * 180 * 4, "only the tile's bytes: {report:?}");
    assert!(rows_read(&report), "{report:?}");
    // Row reads are preads: a forced GDS backend reads ranges through cuFile, or is an error
    // where GDS is not usable, never preads that succeed.
    match check::<f32>(&plain, &tile, &GpuConfig::default().with_backend(IoBackend::Gds)) {
        Ok(report) => assert!(report.io.as_ref().is_some_and(|s| s.path == IoPath::Gds) && !rows_read(&report)),
        Err(err) => assert!(err.to_string().contains("GPUDirect Storage"), "{err}"),
    }
    let inner = [16u64, 64, 256];
    let sharded = make_sharded(
        dir2.path(),
        &shape,
        &[32, 128, 512],
        &inner,
        sharding(&inner, vec![], ShardingIndexLocation::End),
    )?;
    for array in [&plain, &sharded] {
        // Random tiles over chunk edges and missing chunks, and one in the partial edge chunks.
        let mut tiles: Vec<Vec<std::ops::Range<u64>>> = (0..20)
            .map(|_| {
                [(40, 12), (150, 40), (600, 200)]
                    .iter()
                    .map(|&(s, t)| {
                        let a = rng.random_range(0..=s - t);
                        a..a + t
                    })
                    .collect()
            })
            .collect();
        tiles.push(vec![28..40, 110..150, 400..600]);
        // Every tile equal to zarrs with row reads on and off; on, no tile reads more bytes, and
        // the tiles together read fewer (units whose rows are short or dense still read ranges).
        let (mut on, mut off, mut by_rows) = (0, 0, 0);
        for ranges in tiles {
            let tile = zarrs::array::ArraySubset::new_with_ranges(&ranges);
            let with_rows = check::<f32>(array, &tile, &posix())?;
            let without = check::<f32>(array, &tile, &posix().with_row_reads(false))?;
            assert!(!rows_read(&without), "{without:?}");
            assert!(with_rows.bytes_read <= without.bytes_read, "{ranges:?}: {with_rows:?} against {without:?}");
            (on, off) = (on + with_rows.bytes_read, off + without.bytes_read);
            by_rows += usize::from(rows_read(&with_rows));
        }
        assert!(on < off && by_rows > 10, "{on} bytes with rows, {off} without; {by_rows} of 21 tiles by rows");
    }
    Ok(())
}

/// Whether a read's report says rows of uncompressed chunks were read.
fn rows_read(report: &RetrieveReport) -> bool {
    report.io.as_ref().is_some_and(|s| s.reason.contains("rows of uncompressed chunks"))
}

/// Wait until every file written so far is older than the cache's racy window: shard indexes
/// of files changed (mtime or ctime) in the last two seconds are never cached, these tests need
/// the cache in use, and a file's ctime cannot be set back as its mtime can.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(2_100));
}

/// A sharding codec nesting `levels` (inner chunk shape and index location, outermost first)
/// around innermost chunks encoded with `codecs`.
pub(crate) fn nested(
    levels: &[(&[u64], ShardingIndexLocation)],
    codecs: &[Arc<dyn BytesToBytesCodecTraits>],
) -> Arc<dyn ArrayToBytesCodecTraits> {
    let (&(inner, location), outer) = levels.split_last().expect("a level");
    let mut codec = sharding(inner, codecs.to_vec(), location);
    for &(inner, location) in outer.iter().rev() {
        codec = ShardingCodecBuilder::new(shape_of(inner), &data_type::float32())
            .array_to_bytes_codec(codec)
            .index_location(location)
            .build_arc();
    }
    codec
}

/// Nested shards at two and three levels, every index location, inner chunks raw or zstd, read
/// without a cache, with a cache filled by the first read, and with that cache again: each read
/// equal to zarrs'. An outer shard and the first shard nested in it begin at the same byte when
/// the outer index is at the end, and have as many inner chunks when the shapes say so: a cache
/// that told them apart by key and start alone gave the inner read the outer index.
#[test]
#[ignore = "needs a CUDA GPU"]
fn nested_shards_at_two_and_three_levels_with_and_without_a_cache_match_zarrs() -> Result {
    use ShardingIndexLocation::{End, Start};
    let zstd: Arc<dyn BytesToBytesCodecTraits> = Arc::new(ZstdCodec::new(3, false));
    // Chunks per shard equal at every level (2 x 2), so outer and inner keys would collide.
    let two: [&[u64]; 2] = [&[8, 8], &[4, 4]];
    let three: [&[u64]; 3] = [&[16, 16], &[8, 8], &[4, 4]];
    let shapes: [&[&[u64]]; 2] = [&two, &three];
    let mut case = 0u64;
    for shapes in shapes {
        let chunk: Vec<u64> = shapes[0].iter().map(|n| n * 2).collect();
        let shape: Vec<u64> = chunk.iter().map(|n| n * 2 + n / 2 + 1).collect();
        for locations in [[End, End, End], [Start, End, Start], [End, Start, End], [Start, Start, Start]] {
            for codecs in [vec![], vec![zstd.clone()]] {
                case += 1;
                let levels: Vec<_> = shapes.iter().copied().zip(locations).collect();
                let dir = tempfile::tempdir()?;
                let innermost = shapes[shapes.len() - 1];
                let array = make_sharded(dir.path(), &shape, &chunk, innermost, nested(&levels, &codecs))?;
                settle();
                let cache = Arc::new(ShardIndexCache::new());
                let cached = posix().with_shard_index_cache(Some(cache.clone()));
                let what = format!("case {case}: {levels:?}, {} codecs", codecs.len());
                for config in [posix(), cached.clone(), cached.clone()] {
                    let report =
                        check::<f32>(&array, &array.subset_all(), &config).map_err(|e| format!("{what}: {e}"))?;
                    assert_eq!(report.decode, DecodePath::Device, "{what}: {report:?}");
                    for subset in subsets(&shape, case) {
                        check::<f32>(&array, &subset, &config).map_err(|e| format!("{what}: {e}"))?;
                    }
                    // As one request: inner chunks of different nested shards keep their own
                    // sources (their indices within their own shards are alike).
                    let many = subsets(&shape, case);
                    let (got, _) = array.retrieve_array_subsets_device_opt::<DeviceArray<f32>>(&many, &config)?;
                    for (got, subset) in got.iter().zip(&many) {
                        let want: Vec<f32> = array.retrieve_array_subset(subset)?;
                        assert!(
                            got.to_host_bytes()? == want.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
                            "{what}: {subset:?}"
                        );
                    }
                }
                assert!(!cache.is_empty(), "{what}: the cache was used");
            }
        }
    }
    Ok(())
}

/// The report that found it (zarr-python 3.4.2's layout): `[16]` in one chunk, shards of 4 inner
/// shards of 1 raw element, elements 4..8 left at the fill value. Every single element and the
/// whole, with a cache, equal to zarrs'.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_dimensional_nested_shards_with_a_missing_inner_shard_match_zarrs() -> Result {
    use zarrs::array::ArraySubset;
    for location in [ShardingIndexLocation::End, ShardingIndexLocation::Start] {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(GdsStore::new(dir.path())?);
        let codec = nested(&[(&[4], location), (&[1], location)], &[]);
        let array = ArrayBuilder::new(vec![16], vec![16], data_type::float32(), 0.0f32)
            .array_to_bytes_codec(codec)
            .build(store, "/n")?;
        array.store_metadata()?;
        let values: Vec<f32> = (1..=16).map(|v| if (5..=8).contains(&v) { 0.0 } else { v as f32 }).collect();
        array.store_chunk(&[0], values)?;
        settle();
        let config = posix().with_shard_index_cache(Some(Arc::new(ShardIndexCache::new())));
        for _ in 0..2 {
            check::<f32>(&array, &array.subset_all(), &config)?;
            for i in 0..16 {
                check::<f32>(&array, &ArraySubset::new_with_start_shape(vec![i], vec![1])?, &config)?;
            }
        }
    }
    Ok(())
}

/// A shard rewritten in place with the same size within the same modification time (as a fast
/// writer does within one clock tick) is never served from an index cached before: files modified
/// in the last two seconds are not cached.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_shard_rewritten_in_place_within_one_clock_tick_is_read_again() -> Result {
    use std::io::Write;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    // Raw inner chunks, every one present, and an index without crc32c: two versions of the
    // shard of the same size differ only in where the index says each inner chunk is.
    let codec = ShardingCodecBuilder::new(shape_of(&[4, 4]), &data_type::float32())
        .index_bytes_to_bytes_codecs(vec![])
        .index_location(ShardingIndexLocation::End)
        .build_arc();
    let array = ArrayBuilder::new(vec![16, 16], vec![16, 16], data_type::float32(), -1.0f32)
        .array_to_bytes_codec(codec)
        .build(store, "/r")?;
    array.store_metadata()?;
    array.store_chunk(&[0, 0], (0..256).map(|v| v as f32).collect::<Vec<f32>>())?;
    let key = array.chunk_key(&[0, 0]);
    let path = array.storage().key_to_fspath(&key);
    let cache = Arc::new(ShardIndexCache::new());
    let config = posix().with_shard_index_cache(Some(cache.clone()));
    // Modified just now, however long the writing took: the first read comes within the tick.
    std::fs::File::options().write(true).open(&path)?.set_modified(std::time::SystemTime::now())?;
    check::<f32>(&array, &array.subset_all(), &config)?;
    // The other version: the first and the last inner chunks' index entries exchanged, written
    // over the file in place, its modification time set back to what it was.
    let mut other = std::fs::read(&path)?;
    let index = other.len() - 16 * 16;
    let (first, last) = (index, index + 15 * 16);
    let entry = other[first..first + 16].to_vec();
    other.copy_within(last..last + 16, first);
    other[last..last + 16].copy_from_slice(&entry);
    let mtime = std::fs::metadata(&path)?.modified()?;
    let mut file = std::fs::File::options().write(true).open(&path)?;
    file.write_all(&other)?;
    file.set_modified(mtime)?;
    drop(file);
    assert_eq!(std::fs::metadata(&path)?.modified()?, mtime);
    check::<f32>(&array, &array.subset_all(), &config)?;
    Ok(())
}

/// One thread replaces a shard again and again (zarrs' writes: each a new file renamed over the
/// old) while two read it on the device, one through preads and one as the store's backend
/// decides, the whole shard and its second inner chunk alone: every read is one version of the
/// shard exactly (both inner chunks of one version), or, replaced during the read and again
/// during its second plan, an error naming the shard. The inner chunks are zstd-compressed and
/// the first one's size changes from version to version, so that one version's offsets fall
/// elsewhere in the next; before reads checked the file's version, a CPU test of the same race
/// read inner chunk 0's bytes as inner chunk 1 in 76 of 44,984 reads.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_during_shard_replacements_are_each_one_version() -> Result {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use zarrs::array::ArraySubset;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let zstd: Arc<dyn BytesToBytesCodecTraits> = Arc::new(ZstdCodec::new(3, false));
    let array = ArrayBuilder::new(vec![64, 64], vec![64, 64], data_type::float32(), 0.0f32)
        .array_to_bytes_codec(sharding(&[32, 64], vec![zstd], ShardingIndexLocation::End))
        .build(store, "/r")?;
    array.store_metadata()?;
    // Version v: inner chunk 1 all v plus a step pattern; inner chunk 0 constant in odd versions
    // (a few bytes compressed), noisy in even ones (kilobytes).
    let version = |v: u32| -> Vec<f32> {
        (0..64 * 64u32)
            .map(|i| match (i < 32 * 64, v % 2) {
                (true, 1) => v as f32,
                (true, _) => v as f32 + ((i.wrapping_mul(2_654_435_761) >> 20) % 64) as f32 * 0.125,
                (false, _) => v as f32 + (i % 7) as f32 * 0.125,
            })
            .collect()
    };
    array.store_chunk(&[0, 0], version(0))?;
    let stop = &AtomicBool::new(false);
    let counts = [(); 4].map(|()| AtomicU64::new(0));
    let [reads, wrong, twice, other] = &counts;
    let first = std::sync::Mutex::new(None::<String>);
    let whole = array.subset_all();
    let second = ArraySubset::new_with_ranges(&[32..64, 0..64]);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut v = 1;
            while !stop.load(Ordering::Relaxed) {
                array.store_chunk(&[0, 0], version(v)).expect("a write");
                v += 1;
            }
        });
        for config in [posix(), GpuConfig::default()] {
            let (array, whole, second, first) = (&array, &whole, &second, &first);
            scope.spawn(move || {
                for n in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                    let subset = if n % 2 == 0 { whole } else { second };
                    match array
                        .retrieve_array_subset_device_opt::<DeviceArray<f32>>(subset, &config)
                        .and_then(|(d, _)| d.to_host())
                    {
                        Ok(got) => {
                            // The version of inner chunk 1's first element; the whole read (or
                            // inner chunk 1) must be that version exactly.
                            let v = got[got.len() - 32 * 64] as u32;
                            let want = version(v);
                            if got[..] != want[want.len() - got.len()..] {
                                wrong.fetch_add(1, Ordering::Relaxed);
                                first.lock().unwrap().get_or_insert_with(|| format!("{subset:?}: not version {v}"));
                            }
                        }
                        Err(err) if err.to_string().contains("replaced while it was read, twice") => {
                            twice.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => {
                            other.fetch_add(1, Ordering::Relaxed);
                            first.lock().unwrap().get_or_insert_with(|| err.to_string());
                        }
                    }
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_secs(5));
        stop.store(true, Ordering::Relaxed);
    });
    let [reads, wrong, twice, other] = counts.map(AtomicU64::into_inner);
    let first = first.into_inner().unwrap();
    eprintln!("{reads} reads: {wrong} wrong, {twice} replaced twice, {other} other errors; first: {first:?}");
    assert_eq!((wrong, other), (0, 0), "of {reads} reads; the first: {first:?}");
    assert!(reads > 100 && twice < reads / 10, "{reads} reads, {twice} replaced twice");
    Ok(())
}
