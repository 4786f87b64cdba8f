//! Writes from the device (`ArrayDeviceWriteExt`): device arrays stored into arrays of several
//! codec chains, whole and in unaligned tiles (edge chunks and partial chunks included), read back
//! by zarrs on the host and compared element for element with the same writes made on the host.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::array::codec::{
    BloscCompressor, BloscShuffleMode, BytesCodec, Crc32cCodec, GzipCodec, ShardingIndexLocation, TransposeCodec,
    TransposeOrder,
};
use zarrs::array::{
    data_type, Array, ArrayBuilder, ArraySubset, ArrayToBytesCodecTraits, BytesToBytesCodecTraits, Endianness,
    FillValue,
};
use zarrs_gpu::{ArrayDeviceExt, ArrayDeviceWriteExt, GdsStore, WritePath};
use zarrs_storage::ReadableStorageTraits;

use super::blosc::blosc;
use super::compressed::zstd;
use super::sharding::{nested, sharding};
use super::zlib::zlib;
use super::{posix, Result};

/// Values of a smooth field with a zero block (a chunk of the destination all fill value).
fn values(shape: &[u64], seed: u32) -> Vec<f32> {
    let (ny, nx) = (shape[1], shape[2]);
    (0..shape.iter().product::<u64>())
        .map(|i| {
            let (z, y, x) = (i / (ny * nx), i / nx % ny, i % nx);
            if z < 16 && y < 32 && x < 32 {
                0.0
            } else {
                ((z * 3 + y * 7 + x * 11 + u64::from(seed)) % 1000) as f32 * 0.5 + (x as f32 * 0.01).sin()
            }
        })
        .collect()
}

type Codecs = Vec<Arc<dyn BytesToBytesCodecTraits>>;

/// An empty array of shape 40 x 70 x 90 with chunks of 16 x 32 x 32 and `codecs`, fill value 0.
fn empty(dir: &std::path::Path, name: &str, codecs: Codecs) -> Result<Array<GdsStore>> {
    empty_with(dir, name, Layout::default(), codecs)
}

/// A chunk layout: a transpose order, big-endian bytes.
#[derive(Clone, Copy, Default)]
struct Layout {
    transpose: Option<&'static [usize]>,
    big: bool,
}

/// As [`empty`], with chunks laid out by `layout`.
fn empty_with(dir: &std::path::Path, name: &str, layout: Layout, codecs: Codecs) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let mut builder =
        ArrayBuilder::new(vec![40, 70, 90], vec![16, 32, 32], data_type::float32(), FillValue::from(0.0f32));
    builder.bytes_to_bytes_codecs(codecs);
    if let Some(order) = layout.transpose {
        builder.array_to_array_codecs(vec![Arc::new(TransposeCodec::new(TransposeOrder::new(order)?))]);
    }
    if layout.big {
        builder.array_to_bytes_codec(Arc::new(BytesCodec::new(Some(Endianness::Big))));
    }
    let array = builder.build(store, &format!("/{name}"))?;
    array.store_metadata()?;
    Ok(array)
}

/// An empty array of shape 40 x 70 x 90 in shards of 16 x 32 x 64 whose codec is `a2b`.
fn empty_sharded(dir: &std::path::Path, name: &str, a2b: Arc<dyn ArrayToBytesCodecTraits>) -> Result<Array<GdsStore>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let array = ArrayBuilder::new(vec![40, 70, 90], vec![16, 32, 64], data_type::float32(), FillValue::from(0.0f32))
        .array_to_bytes_codec(a2b)
        .build(store, &format!("/{name}"))?;
    array.store_metadata()?;
    Ok(array)
}

/// What the write tests write: the values of an uncompressed array read whole to the device, and
/// a tile of other values at an unaligned place (meeting partial and edge chunks) on the device.
struct Sources {
    shape: [u64; 3],
    all: ArraySubset,
    source: Array<GdsStore>,
    on_device: zarrs_gpu::DeviceArray<f32>,
    tile: ArraySubset,
    tile_source: Array<GdsStore>,
    tile_data: zarrs_gpu::DeviceArray<f32>,
}

impl Sources {
    fn new(dir: &std::path::Path) -> Result<Self> {
        let shape = [40u64, 70, 90];
        let all = ArraySubset::new_with_shape(shape.to_vec());
        let source = empty(dir, "source", vec![])?;
        source.store_array_subset(&all, values(&shape, 1))?;
        let on_device = source.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&all, &posix())?.0;
        let tile = ArraySubset::new_with_ranges(&[5..37, 20..70, 33..90]);
        let tile_source = empty(dir, "tile_source", vec![])?;
        tile_source.store_array_subset(&all, values(&shape, 2))?;
        let tile_data = tile_source.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&tile, &posix())?.0;
        Ok(Self { shape, all, source, on_device, tile, tile_source, tile_data })
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_writes_equal_host_writes_for_every_chain_tile_and_edge() -> Result {
    let dir = tempfile::tempdir()?;
    let Sources { shape, all, source, on_device, tile, tile_source: _, tile_data } = Sources::new(dir.path())?;
    let mut want = values(&shape, 1);
    let tile_values = values(&shape, 2);
    for z in 5..37u64 {
        for y in 20..70u64 {
            for x in 33..90u64 {
                let i = ((z * 70 + y) * 90 + x) as usize;
                want[i] = tile_values[i];
            }
        }
    }
    let plain = Layout::default();
    let (t201, big) = (Layout { transpose: Some(&[2, 0, 1]), big: false }, Layout { transpose: None, big: true });
    let both = Layout { transpose: Some(&[1, 2, 0]), big: true };
    let crc = || -> Arc<dyn BytesToBytesCodecTraits> { Arc::new(Crc32cCodec::new()) };
    let b = |compressor, level, shuffle, blocksize| blosc(compressor, level, shuffle, 4, blocksize);
    let (lz4, bzstd) = (BloscCompressor::LZ4, BloscCompressor::Zstd);
    let chains: Vec<(&str, Layout, Codecs, WritePath)> = vec![
        ("raw", plain, vec![], WritePath::Device),
        ("zstd", plain, vec![zstd(3, false)], WritePath::Device),
        ("zstd_crc", plain, vec![zstd(1, false), crc()], WritePath::Device),
        ("zstd_checksum", plain, vec![zstd(3, true)], WritePath::Device),
        ("gzip", plain, vec![Arc::new(GzipCodec::new(5)?)], WritePath::Device),
        ("gzip9_crc", plain, vec![Arc::new(GzipCodec::new(9)?), crc()], WritePath::Device),
        ("zlib", plain, vec![zlib(1)], WritePath::Device),
        ("zlib6", plain, vec![zlib(6)], WritePath::Device),
        ("blosc_lz4_bit", plain, vec![b(lz4, 5, BloscShuffleMode::BitShuffle, None)], WritePath::Device),
        ("blosc_zstd_byte_crc", plain, vec![b(bzstd, 3, BloscShuffleMode::Shuffle, None), crc()], WritePath::Device),
        ("blosc_lz4_none", plain, vec![b(lz4, 9, BloscShuffleMode::NoShuffle, None)], WritePath::Device),
        ("blosc_level0", plain, vec![b(lz4, 0, BloscShuffleMode::Shuffle, None)], WritePath::Device),
        ("blosc_blocksize", plain, vec![b(lz4, 5, BloscShuffleMode::Shuffle, Some(4096))], WritePath::Host),
        ("blosc_lz4hc", plain, vec![b(BloscCompressor::LZ4HC, 5, BloscShuffleMode::Shuffle, None)], WritePath::Host),
        ("t201_raw", t201, vec![], WritePath::Device),
        ("t201_gzip", t201, vec![Arc::new(GzipCodec::new(5)?)], WritePath::Device),
        ("be_zstd", big, vec![zstd(3, false)], WritePath::Device),
        ("be_blosc_bit", big, vec![b(lz4, 5, BloscShuffleMode::BitShuffle, None)], WritePath::Device),
        ("t120_be_raw_crc", both, vec![crc()], WritePath::Device),
    ];
    // Chunks all by nvCOMP, half by host threads, and as the split chooses (here: all on host
    // threads, for so few chunks).
    let splits = [(Some(0.0), "nvcomp"), (Some(0.5), "half"), (None, "auto")];
    for ((name, layout, codecs, path), (fraction, split)) in
        chains.into_iter().flat_map(|chain| splits.iter().map(move |s| (chain.clone(), *s)))
    {
        let name = &format!("{name}_{split}");
        let config = posix().with_host_encode_fraction(fraction);
        let array = empty_with(dir.path(), name, layout, codecs)?;
        let report = array.store_array_subset_device_opt(&all, &on_device, &config)?;
        assert_eq!(report.path, path, "{name}: {report:?}");
        let first: Vec<f32> = array.retrieve_array_subset(&all)?;
        assert!(first == values(&shape, 1), "{name}: the whole write differs from the values");
        let report_tile = array.store_array_subset_device_opt(&tile, &tile_data, &config)?;
        let got: Vec<f32> = array.retrieve_array_subset(&all)?;
        assert!(got == want, "{name}: the tile write differs from the same write on the host");
        if path == WritePath::Device {
            // The zero block is a whole chunk of fill value: erased (never stored).
            let zero_chunk = array.chunk_key(&[0, 0, 0]);
            assert!(array.storage().get(&zero_chunk)?.is_none(), "{name}: an all-fill chunk was stored");
            // 3 x 3 x 3 chunks; the tile meets 3 x 3 x 2 of them, all but [1, 1, 2] and
            // [1, 2, 2] (their parts within the array covered) in part.
            assert_eq!((report.chunks, report.written, report.erased), (27, 26, 1), "{name}: {report:?}");
            assert_eq!((report_tile.chunks, report_tile.modified), (18, 16), "{name}: {report_tile:?}");
            // Every chunk the tile meets is encoded again, whole (18 of 16 x 32 x 32).
            assert_eq!(report_tile.bytes_encoded, 18 * 16 * 32 * 32 * 4, "{name}: {report_tile:?}");
            eprintln!("{name}: ratio {:?}, {:.1} ms whole", report.ratio(), report.seconds * 1e3);
        } else {
            assert!(report.reason.is_some(), "{name}: {report:?}");
        }
    }
    // The level option: zstd level 9 asked for, every chunk on host threads (libzstd at 9) even
    // where the share says nvCOMP: smaller than nvCOMP's chunks, the same values.
    let nvcomp_only = posix().with_host_encode_fraction(Some(0.0));
    let on_nvcomp = empty(dir.path(), "level_nvcomp", vec![zstd(9, false)])?;
    let by_nvcomp = on_nvcomp.store_array_subset_device_opt(&all, &on_device, &nvcomp_only)?;
    let on_host = empty(dir.path(), "level_host", vec![zstd(9, false)])?;
    let by_host =
        on_host.store_array_subset_device_opt(&all, &on_device, &nvcomp_only.with_host_encode_level(Some(5)))?;
    assert_eq!(by_host.path, WritePath::Device, "{by_host:?}");
    // libzstd at level 9 wrote the chunk: its bytes are libzstd's at 9, nvCOMP's are not.
    let interior: Vec<f32> = source.retrieve_chunk(&[1, 1, 1])?;
    let raw: Vec<u8> = interior.iter().flat_map(|v| v.to_le_bytes()).collect();
    let at_nine = zstd::bulk::compress(&raw, 9)?;
    let stored = |array: &Array<GdsStore>| -> Result<Vec<u8>> {
        Ok(array.storage().get(&array.chunk_key(&[1, 1, 1]))?.expect("chunk [1, 1, 1] stored").to_vec())
    };
    assert!(stored(&on_host)? == at_nine, "level 9 not written by libzstd at 9: {by_host:?}");
    assert!(stored(&on_nvcomp)? != at_nine, "nvCOMP's chunk is libzstd's: {by_nvcomp:?}");
    let got: Vec<f32> = on_host.retrieve_array_subset(&all)?;
    assert!(got == values(&shape, 1), "the level-9 write differs from the values");
    // A chunk stored whole (an edge chunk: its part within the array is what is kept).
    let array = empty(dir.path(), "chunk", vec![zstd(3, false)])?;
    let chunk_source = source.retrieve_chunk_device_opt::<DeviceArray<f32>>(&[2, 2, 2], &posix())?.0;
    array.store_chunk_device(&[2, 2, 2], &chunk_source)?;
    let edge = ArraySubset::new_with_ranges(&[32..40, 64..70, 64..90]);
    let got: Vec<f32> = array.retrieve_array_subset(&edge)?;
    let want_edge: Vec<f32> = source.retrieve_array_subset(&edge)?;
    assert!(got == want_edge, "an edge chunk stored from the device differs");
    // Wrong shape, type and bounds: errors before anything is written.
    let wrong = ArraySubset::new_with_ranges(&[0..4, 0..4, 0..4]);
    assert!(array.store_array_subset_device(&wrong, &on_device).is_err());
    let past = ArraySubset::new_with_ranges(&[30..70, 0..70, 0..90]);
    assert!(array.store_array_subset_device(&past, &on_device).is_err());
    let as_u32 = source.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&wrong, &posix())?.0;
    let int_array = {
        let store = Arc::new(GdsStore::new(dir.path())?);
        let a = ArrayBuilder::new(vec![8, 8, 8], vec![4, 4, 4], data_type::uint32(), FillValue::from(0u32))
            .build(store, "/int")?;
        a.store_metadata()?;
        a
    };
    assert!(int_array.store_array_subset_device(&wrong, &as_u32).is_err(), "f32 data into a uint32 array");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn sharded_device_writes_equal_host_writes_with_the_index_at_either_end() -> Result {
    let dir = tempfile::tempdir()?;
    // The tile meets partial shards (read, modified, written again) and edge ones.
    let Sources { shape, all, source: _, on_device, tile, tile_source, tile_data } = Sources::new(dir.path())?;
    let zstd_crc = || -> Codecs { vec![zstd(1, false), Arc::new(Crc32cCodec::new())] };
    let inner = [8u64, 16, 32];
    let chains: Vec<(&str, Arc<dyn ArrayToBytesCodecTraits>)> = vec![
        ("raw_end", sharding(&inner, vec![], ShardingIndexLocation::End)),
        ("raw_start", sharding(&inner, vec![], ShardingIndexLocation::Start)),
        ("zstd_end", sharding(&inner, vec![zstd(3, false)], ShardingIndexLocation::End)),
        ("zstd_crc_start", sharding(&inner, zstd_crc(), ShardingIndexLocation::Start)),
        // Shards of shards of 4 x 8 x 16 chunks: encoded whole again where covered in part.
        (
            "nested_zstd",
            nested(
                &[(&inner, ShardingIndexLocation::End), (&[4, 8, 16], ShardingIndexLocation::Start)],
                &[zstd(3, false)],
            ),
        ),
    ];
    for (name, a2b) in chains {
        let array = empty_sharded(dir.path(), name, a2b.clone())?;
        let host = empty_sharded(dir.path(), &format!("{name}_host"), a2b)?;
        let report = array.store_array_subset_device(&all, &on_device)?;
        assert_eq!(report.path, WritePath::Device, "{name}: {report:?}");
        // 3 x 3 x 2 shards, none all fill value.
        assert_eq!((report.chunks, report.written, report.erased), (18, 18, 0), "{name}: {report:?}");
        host.store_array_subset(&all, values(&shape, 1))?;
        let got: Vec<f32> = array.retrieve_array_subset(&all)?;
        assert!(got == values(&shape, 1), "{name}: the whole write differs from the values");
        // Shard [0, 0, 0] holds the zero block: 4 of its 8 inner chunks are fill value and left out
        // (uncompressed: 4 chunks of 16 KiB, and the index of 8 entries with its crc32c, the
        // default index codecs).
        let first = array.storage().get(&array.chunk_key(&[0, 0, 0]))?.expect("shard [0, 0, 0] stored");
        if name.starts_with("raw") {
            assert_eq!(first.len(), 4 * 8 * 16 * 32 * 4 + 8 * 16 + 4, "{name}: shard [0, 0, 0]");
        }
        let report_tile = array.store_array_subset_device(&tile, &tile_data)?;
        host.store_array_subset(&tile, tile_source.retrieve_array_subset::<Vec<f32>>(&tile)?)?;
        let got: Vec<f32> = array.retrieve_array_subset(&all)?;
        let want: Vec<f32> = host.retrieve_array_subset(&all)?;
        assert!(got == want, "{name}: the tile write differs from the same write on the host");
        // The tile meets 3 x 3 x 2 shards; it covers the parts within the array of [1, 1, 1] and
        // [1, 2, 1] whole, the others in part.
        assert_eq!((report_tile.chunks, report_tile.modified), (18, 16), "{name}: {report_tile:?}");
        // Only the inner chunks the tile meets are encoded again (40, and the 4 + 6 past the edge
        // of the two shards it covers whole), not all 144 of the 18 shards: the rest keep their
        // stored bytes.
        // Nested shards covered in part are encoded whole again (18 shards of 16 x 32 x 64).
        let encoded = if name.starts_with("nested") { 18 * 16 * 32 * 64 * 4 } else { 50 * 8 * 16 * 32 * 4 };
        assert_eq!(report_tile.bytes_encoded, encoded, "{name}: {report_tile:?}");
        // A shard that becomes all fill value is erased, as zarrs erases it.
        let blank = empty(dir.path(), &format!("{name}_blank"), vec![])?;
        let first_shard = ArraySubset::new_with_ranges(&[0..16, 0..32, 0..64]);
        let zero_data = blank.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&first_shard, &posix())?.0;
        let report_zero = array.store_chunk_device(&[0, 0, 0], &zero_data)?;
        assert_eq!(report_zero.erased, 1, "{name}: {report_zero:?}");
        assert!(array.storage().get(&array.chunk_key(&[0, 0, 0]))?.is_none(), "{name}: an all-fill shard was stored");
        let got: Vec<f32> = array.retrieve_array_subset(&all)?;
        host.store_chunk(&[0, 0, 0], vec![0.0f32; 16 * 32 * 64])?;
        let want: Vec<f32> = host.retrieve_array_subset(&all)?;
        assert!(got == want, "{name}: erasing a shard changed other values");
        eprintln!(
            "{name}: ratio {:?}, {:.1} ms whole, {:.1} ms tile",
            report.ratio(),
            report.seconds * 1e3,
            report_tile.seconds * 1e3
        );
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn zstd_with_content_checksums_is_encoded_on_the_device_and_every_frame_verifies() -> Result {
    use zarrs_storage::WritableStorageTraits;
    let dir = tempfile::tempdir()?;
    let Sources { shape, all, source, on_device, .. } = Sources::new(dir.path())?;
    let want = values(&shape, 1);
    // Every chunk by nvCOMP (its frames given their checksums from the XXH64 kernel), and half
    // on host threads (libzstd's own).
    for (fraction, split) in [(Some(0.0), "nvcomp"), (Some(0.5), "half")] {
        let name = format!("zstd_checksum_{split}");
        let array = empty(dir.path(), &name, vec![zstd(3, true)])?;
        let config = posix().with_host_encode_fraction(fraction);
        let report = array.store_array_subset_device_opt(&all, &on_device, &config)?;
        assert_eq!((report.path, report.reason.as_deref()), (WritePath::Device, None), "{name}: {report:?}");
        // The all-fill chunk is found so by libzstd's decode, which checks the checksum.
        assert_eq!((report.written, report.erased), (26, 1), "{name}: {report:?}");
        let got: Vec<f32> = array.retrieve_array_subset(&all)?;
        assert!(got == want, "{name}: zarrs reads other values");
        // Each stored chunk is one frame with the Content_Checksum_flag, which libzstd verifies
        // and decodes to the chunk's values.
        for (z, y, x) in (0..3u64).flat_map(|z| (0..3u64).flat_map(move |y| (0..3u64).map(move |x| (z, y, x)))) {
            let key = array.chunk_key(&[z, y, x]);
            let Some(frame) = array.storage().get(&key)? else { continue };
            assert!(frame.len() > 6 && frame[4] & 4 != 0, "{name} {key}: no checksum flag: {:02x?}", &frame[..6]);
            let chunk: Vec<f32> = source.retrieve_chunk(&[z, y, x])?;
            let raw: Vec<u8> = chunk.iter().flat_map(|v| v.to_ne_bytes()).collect();
            assert!(zstd::stream::decode_all(&frame[..])? == raw, "{name} {key}: libzstd decodes other bytes");
            if (z, y, x) == (1, 1, 1) {
                eprintln!("{name}: chunk {key} frame header {:02x?}", &frame[..frame.len().min(14)]);
            }
        }
        // The device read verifies every checksum (the XXH64 kernel) and equals zarrs' read.
        super::check::<f32>(&array, &all, &posix())?;
        // A checksum changed: zarrs and the device both refuse the chunk.
        let key = array.chunk_key(&[1, 1, 1]);
        let mut bad = array.storage().get(&key)?.expect("chunk [1, 1, 1] stored").to_vec();
        *bad.last_mut().expect("a frame") ^= 0x5A;
        array.storage().set(&key, bad.into())?;
        assert!(array.retrieve_chunk::<Vec<f32>>(&[1, 1, 1]).is_err(), "{name}: zarrs read a wrong checksum");
        let read = array.retrieve_chunk_device_opt::<DeviceArray<f32>>(&[1, 1, 1], &posix());
        let text = read.err().ok_or("the device read a wrong checksum")?.to_string();
        assert!(text.contains(&key.to_string()) && text.contains("XXH64) mismatch"), "{name}: {text}");
    }
    // Sharded: the inner chunks' frames, by nvCOMP.
    let a2b = sharding(&[8, 16, 32], vec![zstd(5, true)], ShardingIndexLocation::End);
    let array = empty_sharded(dir.path(), "zstd_checksum_sharded", a2b)?;
    let report =
        array.store_array_subset_device_opt(&all, &on_device, &posix().with_host_encode_fraction(Some(0.0)))?;
    assert_eq!((report.path, report.reason.as_deref()), (WritePath::Device, None), "sharded: {report:?}");
    let got: Vec<f32> = array.retrieve_array_subset(&all)?;
    assert!(got == want, "sharded: zarrs reads other values");
    super::check::<f32>(&array, &all, &posix())?;
    Ok(())
}

/// `values` (of `shape`) on the device: stored in an uncompressed array of `name`, read back.
fn to_device(
    dir: &std::path::Path,
    name: &str,
    shape: &[u64],
    values: Vec<f32>,
) -> Result<zarrs_gpu::DeviceArray<f32>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let array = ArrayBuilder::new(shape.to_vec(), shape.to_vec(), data_type::float32(), FillValue::from(0.0f32))
        .build(store, &format!("/{name}"))?;
    array.store_metadata()?;
    let all = ArraySubset::new_with_shape(shape.to_vec());
    array.store_array_subset(&all, values)?;
    Ok(array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&all, &posix())?.0)
}

/// Two writers of one shard (different inner chunks) or one chunk (its two halves) at once, 20
/// rounds: two device writes, then a device write beside a host write holding `lock_chunks` (as
/// Python's host values write). Each writer opens the array on its own store of the directory.
/// Before the locks, one writer's update was lost in every round.
#[test]
#[ignore = "needs a CUDA GPU"]
fn two_writers_of_one_shard_or_one_chunk_both_land() -> Result {
    let dir = tempfile::tempdir()?;
    let inner = [8u64, 16, 32];
    let cases: Vec<(&str, Arc<dyn ArrayToBytesCodecTraits>, [ArraySubset; 2])> = vec![
        (
            "shard",
            sharding(&inner, vec![zstd(1, false)], ShardingIndexLocation::End),
            [
                ArraySubset::new_with_ranges(&[0..8, 0..16, 0..32]),
                ArraySubset::new_with_ranges(&[8..16, 16..32, 32..64]),
            ],
        ),
        (
            "chunk",
            Arc::new(BytesCodec::new(Some(Endianness::Little))),
            [ArraySubset::new_with_ranges(&[0..8, 0..32, 0..64]), ArraySubset::new_with_ranges(&[8..16, 0..32, 0..64])],
        ),
    ];
    for (name, a2b, parts) in cases {
        empty_sharded(dir.path(), name, a2b)?;
        let path = dir.path().to_path_buf();
        let open =
            || -> Result<Array<GdsStore>> { Ok(Array::open(Arc::new(GdsStore::new(&path)?), &format!("/{name}"))?) };
        let check = open()?;
        for host_writer in [false, true] {
            for round in 0..20u32 {
                let data: Vec<Vec<f32>> = (0..2u32)
                    .map(|w| {
                        (0..parts[w as usize].num_elements())
                            .map(|j| (round * 4 + w + 1) as f32 + j as f32 * 1e-3)
                            .collect()
                    })
                    .collect();
                let on_device: Vec<_> = (0..2)
                    .map(|w| to_device(dir.path(), &format!("{name}_src{w}"), parts[w].shape(), data[w].clone()))
                    .collect::<Result<_>>()?;
                let start = std::sync::Barrier::new(2);
                std::thread::scope(|scope| -> Result {
                    let writers: Vec<_> = (0..2usize)
                        .map(|w| {
                            let (start, open, parts, data, on_device) = (&start, &open, &parts, &data, &on_device);
                            scope.spawn(move || -> Result {
                                let array = open()?;
                                start.wait();
                                if host_writer && w == 1 {
                                    let _locked = zarrs_gpu::zarrs_gpu_codecs::lock_chunks(&array, &parts[w])?;
                                    array.store_array_subset(&parts[w], data[w].clone())?;
                                } else {
                                    array.store_array_subset_device_opt(&parts[w], &on_device[w], &posix())?;
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    writers.into_iter().try_for_each(|w| w.join().expect("a writer panicked"))
                })?;
                for w in 0..2 {
                    let got: Vec<f32> = check.retrieve_array_subset(&parts[w])?;
                    assert!(
                        got == data[w],
                        "{name}, host writer {host_writer}, round {round}: writer {w}'s update was lost"
                    );
                }
            }
        }
    }
    Ok(())
}

/// A device write that fails midway (one chunk's directory is a file): an error naming that
/// chunk; the chunks stored before it hold their new values, the others their old ones, each
/// whole; no temporary file is left.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_device_write_that_fails_midway_leaves_every_chunk_old_or_new() -> Result {
    let dir = tempfile::tempdir()?;
    let Sources { shape, all, source: _, on_device, .. } = Sources::new(dir.path())?;
    let array = empty(dir.path(), "midway", vec![zstd(1, false)])?;
    array.store_array_subset(&all, values(&shape, 7))?;
    // Chunk [2, 1, x]'s directory replaced by a file: its chunks cannot be stored.
    let blocked = dir.path().join("midway/c/2/1");
    std::fs::remove_dir_all(&blocked)?;
    std::fs::write(&blocked, b"not a directory")?;
    let err = array.store_array_subset_device_opt(&all, &on_device, &posix()).unwrap_err().to_string();
    assert!(err.contains("c/2/1/"), "the error names a chunk under c/2/1: {err}");
    let (new, old) = (values(&shape, 1), values(&shape, 7));
    let (mut were_new, mut were_old) = (0, 0);
    for z in 0..3u64 {
        for y in 0..3u64 {
            for x in 0..3u64 {
                if (z, y) == (2, 1) {
                    continue;
                }
                let region = ArraySubset::new_with_ranges(&[
                    z * 16..(z * 16 + 16).min(40),
                    y * 32..(y * 32 + 32).min(70),
                    x * 32..(x * 32 + 32).min(90),
                ]);
                let got: Vec<f32> = array.retrieve_array_subset(&region)?;
                let pick = |all: &[f32]| -> Vec<f32> {
                    region.indices().into_iter().map(|i| all[((i[0] * 70 + i[1]) * 90 + i[2]) as usize]).collect()
                };
                if got == pick(&new) {
                    were_new += 1;
                } else {
                    assert!(got == pick(&old), "chunk [{z}, {y}, {x}] is neither old nor new");
                    were_old += 1;
                }
            }
        }
    }
    eprintln!("{were_new} chunks new, {were_old} old");
    let temps = walkdir::WalkDir::new(dir.path())
        .into_iter()
        .filter_map(std::result::Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".zarrs-tmp"))
        .count();
    assert_eq!(temps, 0, "temporary files left");
    Ok(())
}

/// With zarrs' `store_empty_chunks` on, the device writer stores a chunk of fill value (and a
/// shard of fill value, as its index of missing entries) as zarrs' host write does; off, it
/// erases them. Before, it erased them whatever the setting.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_device_writer_follows_store_empty_chunks() -> Result {
    // Put zarrs' global setting back however the test ends (an assert panics out of it).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            zarrs::config::global_config_mut().set_store_empty_chunks(self.0);
        }
    }
    let dir = tempfile::tempdir()?;
    let zeros = to_device(dir.path(), "zeros", &[16, 32, 64], vec![0.0; 16 * 32 * 64])?;
    let first = ArraySubset::new_with_ranges(&[0..16, 0..32, 0..64]);
    let _restore = Restore(zarrs::config::global_config().store_empty_chunks());
    for store_empty in [false, true] {
        zarrs::config::global_config_mut().set_store_empty_chunks(store_empty);
        let chains: Vec<(&str, Arc<dyn ArrayToBytesCodecTraits>)> = vec![
            ("plain", Arc::new(BytesCodec::new(Some(Endianness::Little)))),
            ("shard", sharding(&[8, 16, 32], vec![zstd(1, false)], ShardingIndexLocation::End)),
        ];
        for (name, a2b) in chains {
            let name = format!("{name}_{store_empty}");
            let array = empty_sharded(dir.path(), &name, a2b.clone())?;
            let host = empty_sharded(dir.path(), &format!("{name}_host"), a2b)?;
            let report = array.store_array_subset_device_opt(&first, &zeros, &posix())?;
            assert_eq!(report.path, WritePath::Device, "{name}: {report:?}");
            // zarrs' own write with the global setting (its plain `store_*` methods take
            // `CodecOptions::default()`, which does not read it).
            let options = zarrs::config::global_config().codec_options();
            host.store_array_subset_opt(&first, vec![0.0f32; 16 * 32 * 64], &options)?;
            let key = array.chunk_key(&[0, 0, 0]);
            let (got, want) = (array.storage().get(&key)?, host.storage().get(&host.chunk_key(&[0, 0, 0]))?);
            assert_eq!(got.is_some(), store_empty, "{name}: {report:?}");
            assert_eq!(got, want, "{name}: the device's value differs from zarrs'");
            let read: Vec<f32> = array.retrieve_array_subset(&first)?;
            assert!(read.iter().all(|&v| v == 0.0), "{name}");
        }
    }
    Ok(())
}

/// A NaN fill value: a chunk of that NaN is erased (or left out of its shard), as zarrs erases
/// it (bit for bit: a NaN of another payload is a value, stored); values read back equal.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_nan_fill_value_erases_chunks_of_that_nan_only() -> Result {
    let dir = tempfile::tempdir()?;
    let other_nan = f32::from_bits(f32::NAN.to_bits() | 1);
    let chunk = 16 * 32 * 64;
    // Chunk [0, 0, 0] holds the fill value's NaN (x < 64), chunk [0, 0, 1] the other NaN.
    let data: Vec<f32> = (0..chunk * 2).map(|i| if i % 128 < 64 { f32::NAN } else { other_nan }).collect();
    let on_device = to_device(dir.path(), "nan_src", &[16, 32, 128], data.clone())?;
    let whole = ArraySubset::new_with_ranges(&[0..16, 0..32, 0..128]);
    let chains: Vec<(&str, Arc<dyn ArrayToBytesCodecTraits>)> = vec![
        ("plain", Arc::new(BytesCodec::new(Some(Endianness::Little)))),
        ("shard", sharding(&[8, 16, 32], vec![zstd(1, false)], ShardingIndexLocation::End)),
    ];
    for (name, a2b) in chains {
        let make = |name: &str| -> Result<Array<GdsStore>> {
            let store = Arc::new(GdsStore::new(dir.path())?);
            let array =
                ArrayBuilder::new(vec![40, 70, 128], vec![16, 32, 64], data_type::float32(), FillValue::from(f32::NAN))
                    .array_to_bytes_codec(a2b.clone())
                    .build(store, &format!("/{name}"))?;
            array.store_metadata()?;
            Ok(array)
        };
        let array = make(name)?;
        let host = make(&format!("{name}_host"))?;
        let report = array.store_array_subset_device_opt(&whole, &on_device, &posix())?;
        assert_eq!(report.path, WritePath::Device, "{name}: {report:?}");
        host.store_array_subset(&whole, data.clone())?;
        for indices in [[0u64, 0, 0], [0, 0, 1]] {
            let got = array.storage().get(&array.chunk_key(&indices))?;
            let want = host.storage().get(&host.chunk_key(&indices))?;
            assert_eq!(got.is_some(), indices[2] == 1, "{name} {indices:?}: {report:?}");
            assert_eq!(got.is_some(), want.is_some(), "{name} {indices:?}: zarrs differs");
        }
        let got: Vec<f32> = array.retrieve_array_subset(&whole)?;
        assert!(got.iter().zip(&data).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: values differ bit for bit");
    }
    Ok(())
}
