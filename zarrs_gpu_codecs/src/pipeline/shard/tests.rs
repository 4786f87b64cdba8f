use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::codec::{ShardingCodec, ShardingCodecConfiguration};
use zarrs::array::{ArraySubset, FillValue};
use zarrs_storage::StoreKey;

use super::encode::*;
use super::fuzz::*;
use super::index::*;
use super::level::*;
use super::read::*;
use crate::pipeline::unit::Source;
use crate::reader::ReadSource;

fn level(inner: &[u64]) -> ShardLevel {
    let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
        "chunk_shape": inner,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
    }))
    .unwrap();
    ShardLevel::new(&configuration).unwrap().0
}

/// Shards laid out by `encode_shard` read back by zarrs' own sharding codec: inner chunks
/// raw and zstd-compressed, some missing, the index (with crc32c) at either end, an edge shard.
#[test]
fn encoded_shards_read_back_by_zarrs() {
    use zarrs::array::{ArrayBuilder, FillValue};
    use zarrs_storage::WritableStorageTraits;
    for location in ["start", "end"] {
        for compressed in [false, true] {
            let inner_codecs = if compressed {
                serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "zstd", "configuration": {"level": 3, "checksum": false}}])
            } else {
                serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}])
            };
            let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
                "chunk_shape": [4, 8],
                "codecs": inner_codecs,
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": location,
            }))
            .unwrap();
            let (level, _) = ShardLevel::new(&configuration).unwrap();
            let store = Arc::new(zarrs::storage::store::MemoryStore::new());
            let a2b = Arc::new(ShardingCodec::new_with_configuration(&configuration).unwrap());
            // 12 x 24 in shards of 8 x 16: the shards of the last row and column reach past
            // the edge.
            let array = ArrayBuilder::new(
                vec![12, 24],
                vec![8, 16],
                zarrs::array::data_type::float32(),
                FillValue::from(0.0f32),
            )
            .array_to_bytes_codec(a2b)
            .build(store.clone(), "/")
            .unwrap();
            let mut want = vec![0.0f32; 12 * 24];
            for (shard_index, shard_origin) in [([0u64, 0u64], [0u64, 0u64]), ([1, 1], [8, 16])] {
                // Inner chunks in C order of the 2 x 2 grid; [0, 1] missing (fill value).
                let mut chunks = Vec::new();
                for k in 0..4u64 {
                    if k == 1 {
                        chunks.push(None);
                        continue;
                    }
                    let (row, col) = (shard_origin[0] + (k / 2) * 4, shard_origin[1] + (k % 2) * 8);
                    let values: Vec<f32> = (0..32u64).map(|e| (row * 100 + col + e) as f32 + 0.5).collect();
                    for e in 0..32u64 {
                        let (r, c) = (row + e / 8, col + e % 8);
                        if r < 12 && c < 24 {
                            want[(r * 24 + c) as usize] = values[e as usize];
                        }
                    }
                    let raw: Vec<u8> = bytemuck::cast_slice(&values).to_vec();
                    chunks.push(Some(if compressed { zstd::bulk::compress(&raw, 3).unwrap() } else { raw }));
                }
                let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| c.as_deref()).collect();
                let shard = level.encode_shard(&[8, 16], &parts).unwrap().expect("not all missing");
                store.set(&array.chunk_key(&shard_index), shard.into()).unwrap();
            }
            let got: Vec<f32> = array.retrieve_array_subset(&array.subset_all()).unwrap();
            assert_eq!(got, want, "index at the {location}, compressed {compressed}");
            // Every inner chunk missing: no shard at all.
            assert_eq!(level.encode_shard(&[8, 16], &[None; 4]).unwrap(), None);
            assert!(level.encode_shard(&[8, 16], &[None; 3]).is_err(), "one entry per inner chunk");
        }
    }
}

/// A shard laid out by `encode_shard` (and one by zarrs) gives back each inner chunk's bytes;
/// a damaged index or an entry past the end is an error.
#[test]
fn stored_chunks_are_what_encode_shard_laid_out() {
    for location in ["start", "end"] {
        let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
            "chunk_shape": [4, 8],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": location,
        }))
        .unwrap();
        let (level, _) = ShardLevel::new(&configuration).unwrap();
        let chunks: Vec<Option<Vec<u8>>> =
            (0..4u8).map(|k| (k != 2).then(|| (0..(10 + k)).map(|b| b * 3 + k).collect())).collect();
        let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| c.as_deref()).collect();
        let shard = level.encode_shard(&[8, 16], &parts).unwrap().unwrap();
        let ranges = level.stored_chunks(&[8, 16], &shard).unwrap();
        let back: Vec<Option<&[u8]>> = ranges.iter().map(|r| r.clone().map(|r| &shard[r])).collect();
        assert_eq!(back, parts, "index at the {location}");
        // zarrs' own shard of the same chunks.
        let store = Arc::new(zarrs::storage::store::MemoryStore::new());
        let a2b = Arc::new(ShardingCodec::new_with_configuration(&configuration).unwrap());
        let array = zarrs::array::ArrayBuilder::new(
            vec![8, 16],
            vec![8, 16],
            zarrs::array::data_type::uint8(),
            FillValue::from(0u8),
        )
        .array_to_bytes_codec(a2b)
        .build(store.clone(), "/")
        .unwrap();
        let values: Vec<u8> = (0..128u32).map(|i| if i < 64 { 0 } else { (i % 7) as u8 + 1 }).collect();
        array.store_chunk(&[0, 0], values.clone()).unwrap();
        let stored = zarrs_storage::ReadableStorageTraits::get(&*store, &array.chunk_key(&[0, 0])).unwrap().unwrap();
        let ranges = level.stored_chunks(&[8, 16], &stored).unwrap();
        // Rows 0..4 (inner chunks 0 and 1) are fill value: zarrs leaves them out.
        assert_eq!(ranges.iter().map(Option::is_some).collect::<Vec<_>>(), [false, false, true, true]);
        for (k, range) in ranges.iter().enumerate().skip(2) {
            let (row, col) = (4 * (k / 2), 8 * (k % 2));
            let want: Vec<u8> = (0..32).map(|e| values[(row + e / 8) * 16 + col + e % 8]).collect();
            assert_eq!(&stored[range.clone().unwrap()], &want[..], "zarrs' inner chunk {k}");
        }
        // A damaged index (its crc32c fails), a truncated shard: errors.
        let mut damaged = shard.clone();
        let at = if location == "start" { 3 } else { damaged.len() - 7 };
        damaged[at] ^= 0x40;
        assert!(level.stored_chunks(&[8, 16], &damaged).is_err(), "index at the {location}");
        assert!(level.stored_chunks(&[8, 16], &shard[..20]).is_err());
    }
}

/// Nested shards laid out by `encode_shards` (innermost chunks in `nested_origins`' order)
/// read back by zarrs: an outer shard of 8 x 16 in inner shards of 4 x 8, each of 2 x 4
/// chunks; one inner shard all missing, single chunks missing in others.
#[test]
fn nested_shards_read_back_by_zarrs() {
    use zarrs::array::{ArrayBuilder, FillValue};
    use zarrs_storage::WritableStorageTraits;
    let inner_json = serde_json::json!({
        "name": "sharding_indexed",
        "configuration": {
            "chunk_shape": [2, 4],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "start",
        },
    });
    let outer: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
        "chunk_shape": [4, 8],
        "codecs": [inner_json],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_location": "end",
    }))
    .unwrap();
    let (outer_level, middle) = ShardLevel::new(&outer).unwrap();
    let middle_configuration: ShardingCodecConfiguration = middle
        .array_to_bytes_codec()
        .configuration_v3(&zarrs::array::CodecMetadataOptions::default())
        .unwrap()
        .to_typed()
        .unwrap();
    let (middle_level, _) = ShardLevel::new(&middle_configuration).unwrap();
    let levels = [outer_level, middle_level];
    let origins = nested_origins(&[8, 16], &[&[4, 8], &[2, 4]]);
    assert_eq!(origins.len(), 16);
    assert_eq!(&origins[..5], &[vec![0, 0], vec![0, 4], vec![2, 0], vec![2, 4], vec![0, 8]]);
    let mut want = vec![0.0f32; 8 * 16];
    let chunks: Vec<Option<Vec<u8>>> = origins
        .iter()
        .enumerate()
        // Inner shard 3 (origins 12..16) all missing; chunk 5 missing.
        .map(|(k, o)| {
            if k >= 12 || k == 5 {
                return None;
            }
            let values: Vec<f32> = (0..8u64).map(|e| (k as u64 * 10 + e) as f32 + 0.25).collect();
            for e in 0..8u64 {
                want[((o[0] + e / 4) * 16 + o[1] + e % 4) as usize] = values[e as usize];
            }
            Some(bytemuck::cast_slice(&values).to_vec())
        })
        .collect();
    let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| c.as_deref()).collect();
    let shard = encode_shards(&levels, &[8, 16], &parts).unwrap().unwrap();
    let store = Arc::new(zarrs::storage::store::MemoryStore::new());
    let a2b = Arc::new(ShardingCodec::new_with_configuration(&outer).unwrap());
    let array =
        ArrayBuilder::new(vec![8, 16], vec![8, 16], zarrs::array::data_type::float32(), FillValue::from(0.0f32))
            .array_to_bytes_codec(a2b)
            .build(store.clone(), "/")
            .unwrap();
    store.set(&array.chunk_key(&[0, 0]), shard.into()).unwrap();
    let got: Vec<f32> = array.retrieve_array_subset(&array.subset_all()).unwrap();
    assert_eq!(got, want);
    assert_eq!(encode_shards(&levels, &[8, 16], &[None; 16]).unwrap(), None);
    assert!(encode_shards(&levels, &[8, 16], &[None; 15]).is_err());
}

/// An outer index entry `(u64::MAX, 0)` (half the missing marker) in a store of unknown
/// size: an error naming the shard, not a nested shard read as fill values (it was, while a
/// missing nested shard was marked by a base of `u64::MAX`).
#[test]
fn a_corrupt_nested_shard_entry_is_an_error_naming_the_shard() {
    use zarrs_storage::{ReadableStorageTraits, WritableStorageTraits};
    let inner = |location: &str| {
        serde_json::json!({
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [2, 4],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_location": location,
            },
        })
    };
    for location in ["start", "end"] {
        let outer: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
            "chunk_shape": [4, 8],
            "codecs": [inner(location)],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end",
        }))
        .unwrap();
        let (outer_level, middle) = ShardLevel::new(&outer).unwrap();
        let middle: ShardingCodecConfiguration = middle
            .array_to_bytes_codec()
            .configuration_v3(&zarrs::array::CodecMetadataOptions::default())
            .unwrap()
            .to_typed()
            .unwrap();
        let levels = [outer_level, ShardLevel::new(&middle).unwrap().0];
        let chunks: Vec<Vec<u8>> = (0..16u8).map(|k| (0..32).map(|b| b ^ k.wrapping_mul(37)).collect()).collect();
        let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| Some(&c[..])).collect();
        let mut shard = encode_shards(&levels, &[8, 16], &parts).unwrap().unwrap();
        // The outer index (4 entries of 16 bytes, at the end): inner shard 0's entry.
        let at = shard.len() - 64;
        shard[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        shard[at + 8..at + 16].copy_from_slice(&0u64.to_le_bytes());
        let store = zarrs::storage::store::MemoryStore::new();
        let key = StoreKey::new("arr/c/0/0").unwrap();
        store.set(&key, shard.into()).unwrap();
        let source = ShardSource { source: ReadSource::Store(&store as &dyn ReadableStorageTraits), cache: None };
        let all = ArraySubset::new_with_shape(vec![8, 16]);
        let err = sharded_units(&source, &levels, 4, &all, vec![(vec![0, 0], key.clone(), all.clone())])
            .err()
            .unwrap_or_else(|| panic!("read as fill values (index at the {location})"));
        let message = err.to_string();
        assert!(message.contains("arr/c/0/0") && message.contains("inner chunk [0, 0]"), "{message}");
        // Inner shard 1 alone (columns 8..16) reads, its chunks where they are.
        let right = ArraySubset::new_with_ranges(&[0..4, 8..16]);
        let (units, _) = sharded_units(&source, &levels, 4, &right, vec![(vec![0, 0], key, all)]).unwrap();
        assert_eq!(units.len(), 4);
        assert!(units.iter().all(|u| matches!(u.source, Source::Range { len: 32, .. })));
    }
}

#[test]
fn inner_chunks_meeting_a_subset() {
    let level = level(&[4, 8]);
    let shard = ArraySubset::new_with_ranges(&[8..16, 16..32]);
    // Rows 9..13 meet inner rows 0 and 1; columns 20..21 inner column 0 only.
    let got: Vec<Vec<u64>> = inner_chunks_meeting(&level, &shard, &ArraySubset::new_with_ranges(&[9..13, 20..21]))
        .unwrap()
        .into_iter()
        .map(|(idx, sub)| {
            assert_eq!(sub.shape(), &[4, 8]);
            idx
        })
        .collect();
    assert_eq!(got, vec![vec![0, 0], vec![1, 0]]);
    // A subset covering the shard meets all four; one outside it meets none.
    assert_eq!(
        inner_chunks_meeting(&level, &shard, &ArraySubset::new_with_ranges(&[0..100, 0..100])).unwrap().len(),
        4
    );
    assert!(inner_chunks_meeting(&level, &shard, &ArraySubset::new_with_ranges(&[0..8, 0..100])).unwrap().is_empty());
    // Another dimensionality than the inner chunks' is an error, never an index out of bounds.
    assert!(inner_chunks_meeting(&level, &ArraySubset::new_with_shape(vec![8]), &shard).is_err());
    assert_eq!(ravel(&[1, 1], &[NonZeroU64::new(2).unwrap(), NonZeroU64::new(2).unwrap()]), 3);
}

#[test]
fn index_size_and_shape_checks() {
    let level = level(&[4, 8]);
    let per = level.chunks_per_shard(&[8, 16]).unwrap();
    // 2 x 2 entries of two u64, then the crc32c.
    assert_eq!(level.index_len(&per).unwrap(), 4 * 16 + 4);
    assert!(level.chunks_per_shard(&[8, 12]).unwrap_err().contains("does not divide"));
}

#[test]
fn index_entries_are_checked_before_any_read() {
    assert_eq!(inner_source((u64::MAX, u64::MAX), Some(10), Some(100)), Ok(Source::Missing));
    assert_eq!(inner_source((4, 6), Some(10), Some(100)), Ok(Source::Range { offset: 4, len: 6 }));
    assert_eq!(inner_source((4, 6), None, Some(100)), Ok(Source::Range { offset: 4, len: 6 }));
    assert!(inner_source((4, 7), Some(10), Some(100)).unwrap_err().contains("outside its shard of 10 bytes"));
    assert!(inner_source((u64::MAX - 1, 5), None, None).unwrap_err().contains("overflows"));
    // Half the missing marker is neither missing nor a range.
    for entry in [(u64::MAX, 0), (u64::MAX, 7), (0, u64::MAX)] {
        assert!(inner_source(entry, None, None).unwrap_err().contains("neither"), "{entry:?}");
    }
    // Incompressible data grows a little under zstd; a corrupt index claims far more.
    assert!(inner_source((0, 1 << 20), None, Some(1 << 20)).is_ok());
    assert!(inner_source((0, 3 << 20), None, Some(1 << 20)).unwrap_err().contains("stored bytes for"));
    // A nested shard (its own index inside) has no such bound.
    assert!(inner_source((0, 3 << 20), None, None).is_ok());
}

#[test]
fn fuzzing_wrappers_match_the_checks() {
    assert_eq!(fuzz_shard_index_len(&[4, 8], &[8, 16]), Ok(4 * 16 + 4));
    assert!(fuzz_shard_index_len(&[0, 8], &[8, 16]).unwrap_err().contains("zero extent"));
    assert!(fuzz_shard_index_len(&[1, 1], &[1 << 40, 1 << 40]).unwrap_err().contains("too large"));
    assert_eq!(fuzz_shard_index_entry(u64::MAX, u64::MAX, Some(10), None), Ok(None));
    assert_eq!(fuzz_shard_index_entry(4, 6, Some(10), Some(100)), Ok(Some((4, 6))));
    assert!(fuzz_shard_index_entry(u64::MAX - 1, 5, None, None).is_err());
    assert!(fuzz_shard_index_entry(u64::MAX, 0, None, None).is_err());
}

#[test]
fn huge_shards_are_refused_before_zarrs_sizes_their_index() {
    // 2^40 x 2^40 inner chunks of 1 x 1: 2^80 entries.
    let level = level(&[1, 1]);
    let per = level.chunks_per_shard(&[1 << 40, 1 << 40]).unwrap();
    assert!(level.index_len(&per).unwrap_err().contains("too large for 64-bit sizes"));
    // 2^59 entries (2^63 bytes) are refused too; 2^50 fit (then too large for any shard).
    let per = level.chunks_per_shard(&[1 << 59, 1]).unwrap();
    assert!(level.index_len(&per).is_err());
    let per = level.chunks_per_shard(&[1 << 50, 1]).unwrap();
    assert_eq!(level.index_len(&per).unwrap(), (1 << 54) + 4);
    assert!(level.chunks_per_shard(&[8]).unwrap_err().contains("dimensionality"));
}

proptest::proptest! {
    /// Index entries are hostile input: any (offset, len) with any shard length and decoded
    /// size is missing, a range inside the shard, or an error; never a panic.
    #[test]
    fn index_entries_never_panic(
        offset in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::prelude::any::<u64>(), 0..1024u64],
        len in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::prelude::any::<u64>(), 0..1024u64],
        shard_len in proptest::option::of(proptest::prelude::any::<u64>()),
        decoded in proptest::option::of(proptest::prop_oneof![proptest::prelude::any::<u64>(), 0..4096u64]),
    ) {
        if let Ok(Source::Range { offset: o, len: l }) = inner_source((offset, len), shard_len, decoded) {
            proptest::prop_assert_eq!((o, l), (offset, len));
            let end = o.checked_add(l);
            proptest::prop_assert!(end.is_some());
            proptest::prop_assert!(shard_len.is_none_or(|s| end.is_some_and(|e| e <= s)));
        }
    }

    /// Shard and inner chunk shapes from metadata: the index size is a number or an error.
    #[test]
    fn index_sizes_never_panic(
        shard in proptest::collection::vec(proptest::prop_oneof![proptest::prelude::any::<u64>(), 1..64u64], 1..4),
    ) {
        let level = level(&vec![1; shard.len()]);
        if let Ok(per) = level.chunks_per_shard(&shard) {
            let _ = level.index_len(&per);
        }
    }
}
