//! Blosc chunks (c-blosc 1.x, as zarr-python 2 and the v3 `blosc` codec write them) decoded on the
//! device: every stream one item of a batched decoder (ours or nvCOMP's), the blocks assembled
//! and unshuffled by a kernel; compared with zarrs' host retrieval (c-blosc) byte for byte. GPU
//! tests are `#[ignore = "needs a CUDA GPU"]`.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::array::codec::{BloscCodec, BloscCompressor, BloscShuffleMode, ShardingIndexLocation};
use zarrs::array::{data_type, ArraySubset, BytesToBytesCodecTraits, FillValue};
use zarrs_gpu::{ArrayDeviceExt, DecodePath, DecodeTrust};
use zarrs_storage::{ReadableStorageTraits, WritableStorageTraits};

use super::compressed::make_array;
use super::sharding::{make_sharded, sharding};
use super::{check, posix, scheduled, subsets, Result};

pub(crate) fn blosc(
    compressor: BloscCompressor,
    level: u8,
    shuffle: BloscShuffleMode,
    typesize: usize,
    blocksize: Option<usize>,
) -> Arc<dyn BytesToBytesCodecTraits> {
    let level = level.try_into().expect("a blosc level");
    Arc::new(BloscCodec::new(compressor, level, blocksize, shuffle, Some(typesize)).expect("a blosc codec"))
}

const SHUFFLES: [BloscShuffleMode; 3] =
    [BloscShuffleMode::NoShuffle, BloscShuffleMode::Shuffle, BloscShuffleMode::BitShuffle];

/// lz4, lz4hc and zstd, every shuffle, typesizes 1 to 8, default and small blocks: the device
/// decodes every chunk (none on host threads), equal to zarrs' c-blosc, partial edge chunks and
/// missing chunks included: our kernels under the default trust, and for zstd streams nvCOMP's
/// when trusted.
#[test]
#[ignore = "needs a CUDA GPU"]
fn blosc_compressors_shuffles_and_typesizes_decode_on_the_device_as_zarrs() -> Result {
    macro_rules! case {
        ($t:ty, $dt:expr, $fill:expr, $size:expr, $shape:expr, $chunks:expr) => {{
            for compressor in [BloscCompressor::LZ4, BloscCompressor::LZ4HC, BloscCompressor::Zstd] {
                for shuffle in SHUFFLES {
                    for blocksize in [None, Some(16_384)] {
                        let dir = tempfile::tempdir()?;
                        let codec = blosc(compressor, 5, shuffle, $size, blocksize);
                        let array =
                            make_array(dir.path(), $dt, FillValue::from($fill), &$shape, &$chunks, vec![codec])?;
                        let what = format!("{compressor:?} {shuffle:?} typesize {} blocksize {blocksize:?}", $size);
                        let report = check::<$t>(&array, &array.subset_all(), &posix())?;
                        assert_eq!(report.decode, DecodePath::Device, "{what}: {report:?}");
                        assert!(report.missing_chunks > 0, "{what}: {report:?}");
                        assert_eq!(report.host_decoded_chunks, 0, "{what}: {report:?}");
                        assert_eq!(report.device_decoder.as_deref(), Some("blosc: ours"), "{what}");
                        if compressor == BloscCompressor::Zstd {
                            let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
                            let report = check::<$t>(&array, &array.subset_all(), &trusted)?;
                            assert_eq!(report.device_decoder.as_deref(), Some("blosc: nvCOMP"), "{what}");
                            assert_eq!(report.host_decoded_chunks, 0, "{what}: {report:?}");
                        }
                        for subset in subsets(&$shape, 3) {
                            check::<$t>(&array, &subset, &posix())?;
                        }
                    }
                }
            }
        }};
    }
    case!(f32, data_type::float32(), 1.5f32, 4, [70u64, 96, 50], [32u64, 64, 32]); // 256 KiB chunks
    case!(u8, data_type::uint8(), 3u8, 1, [300u64, 700], [128u64, 512]);
    case!(i16, data_type::int16(), -2i16, 2, [50u64, 61, 70], [16u64, 32, 64]);
    case!(f64, data_type::float64(), 0.5f64, 8, [64u64, 64, 20], [32u64, 32, 16]);
    Ok(())
}

/// What nvCOMP does not decode goes to host threads, chunk by chunk, and still equals zarrs:
/// blosclz streams; zlib ones (not without crc32c, as gzip); chunks stored as they are (level 0)
/// are copies on the device whatever their compressor.
#[test]
#[ignore = "needs a CUDA GPU"]
fn blosc_chunks_the_device_does_not_take_decode_on_host_threads() -> Result {
    let (shape, chunks) = ([40u64, 70, 33], [16u64, 32, 16]);
    for (compressor, level, host) in [
        (BloscCompressor::BloscLZ, 5, true),
        (BloscCompressor::BloscLZ, 0, false),
        (BloscCompressor::Zlib, 5, true),
        (BloscCompressor::LZ4, 0, false),
    ] {
        let dir = tempfile::tempdir()?;
        let codec = blosc(compressor, level, BloscShuffleMode::Shuffle, 4, None);
        let array =
            make_array(dir.path(), data_type::float32(), FillValue::from(2.5f32), &shape, &chunks, vec![codec])?;
        let report = check::<f32>(&array, &array.subset_all(), &posix())?;
        let present = report.chunks - report.missing_chunks;
        assert_eq!(report.decode, DecodePath::Device, "{compressor:?} {level}: {report:?}");
        assert_eq!(report.host_decoded_chunks, if host { present } else { 0 }, "{compressor:?} {level}: {report:?}");
        // Trusted, zlib streams go to nvCOMP too (their Adler-32 verified on the device).
        let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
        let report = check::<f32>(&array, &array.subset_all(), &trusted)?;
        let host = host && compressor != BloscCompressor::Zlib;
        assert_eq!(report.host_decoded_chunks, if host { present } else { 0 }, "{compressor:?} {level}: {report:?}");
        for subset in subsets(&shape, 4) {
            check::<f32>(&array, &subset, &trusted)?;
        }
    }
    // zlib with every shuffle and large chunks (aligned copies of the deflate streams, the
    // Adler-32 of each), trusted.
    for shuffle in SHUFFLES {
        let dir = tempfile::tempdir()?;
        let codec = blosc(BloscCompressor::Zlib, 5, shuffle, 4, None);
        let array = make_array(
            dir.path(),
            data_type::float32(),
            FillValue::from(0f32),
            &[64, 256, 256],
            &[32, 64, 64],
            vec![codec],
        )?;
        let report = check::<f32>(&array, &array.subset_all(), &posix().with_decode_trust(DecodeTrust::Trusted))?;
        assert_eq!(report.host_decoded_chunks, 0, "zlib {shuffle:?}: {report:?}");
    }
    Ok(())
}

/// Reads of many batches and large ones (the scratch sized from the streams themselves), the
/// scheduler's split, and sharded arrays with Blosc inner chunks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn large_and_sharded_blosc_arrays_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    for (compressor, shuffle) in
        [(BloscCompressor::LZ4, BloscShuffleMode::Shuffle), (BloscCompressor::Zstd, BloscShuffleMode::BitShuffle)]
    {
        let codec = blosc(compressor, 5, shuffle, 4, None);
        // 96 MiB of float32 in 1 MiB chunks.
        let array = make_array(
            dir.path(),
            data_type::float32(),
            FillValue::from(0f32),
            &[96, 512, 512],
            &[64, 64, 64],
            vec![codec],
        )?;
        let report = check::<f32>(&array, &array.subset_all(), &posix())?;
        assert_eq!(report.host_decoded_chunks, 0, "{report:?}");
        check::<f32>(&array, &array.subset_all(), &posix().with_staging_bytes(8 << 20))?;
        check::<f32>(&array, &array.subset_all(), &scheduled())?;
        check::<f32>(&array, &ArraySubset::new_with_ranges(&[10..75, 100..400, 3..500]), &scheduled())?;
        array.storage().erase_prefix(&"z/".try_into()?)?;
    }
    // Shards of Blosc inner chunks, the index at either end.
    for location in [ShardingIndexLocation::Start, ShardingIndexLocation::End] {
        let dir = tempfile::tempdir()?;
        let inner = blosc(BloscCompressor::LZ4, 5, BloscShuffleMode::Shuffle, 4, None);
        let array = make_sharded(
            dir.path(),
            &[60, 80, 40],
            &[32, 32, 32],
            &[16, 16, 8],
            sharding(&[16, 16, 8], vec![inner], location),
        )?;
        for subset in subsets(&[60, 80, 40], 6) {
            let report = check::<f32>(&array, &subset, &posix())?;
            assert_eq!(report.decode, DecodePath::Device, "{report:?}");
        }
    }
    Ok(())
}

/// A Blosc zlib chunk whose last stream's Adler-32 is damaged: an error naming the chunk on the
/// device (trusted, so nvCOMP decodes it), as in zarrs; the next read works.
#[test]
#[ignore = "needs a CUDA GPU"]
fn blosc_zlib_streams_with_a_wrong_adler32_are_errors() -> Result {
    let dir = tempfile::tempdir()?;
    let codec = blosc(BloscCompressor::Zlib, 5, BloscShuffleMode::Shuffle, 4, None);
    let array = make_array(dir.path(), data_type::float32(), FillValue::from(0f32), &[64, 64], &[64, 64], vec![codec])?;
    let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
    let key: zarrs_storage::StoreKey = "z/c/0/0".try_into()?;
    let good = array.storage().get(&key)?.ok_or("chunk 0 missing")?.to_vec();
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 1] ^= 0x01;
    array.storage().set(&key, bad.into())?;
    assert!(array.retrieve_array_subset::<Vec<f32>>(&array.subset_all()).is_err(), "zarrs read a wrong Adler-32");
    let err = array
        .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &trusted)
        .map(|_| ())
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("c/0/0") && message.contains("Adler-32"), "{message}");
    array.storage().set(&key, good.into())?;
    let report = check::<f32>(&array, &array.subset_all(), &trusted)?;
    assert_eq!(report.host_decoded_chunks, 0, "{report:?}");
    Ok(())
}

/// Damaged Blosc chunks are errors naming the chunk, never data, and the next read works.
#[test]
#[ignore = "needs a CUDA GPU"]
fn corrupt_blosc_chunks_are_errors_never_wrong_data() -> Result {
    let dir = tempfile::tempdir()?;
    let (shape, chunks) = ([64u64, 64], [64u64, 64]);
    let codec = blosc(BloscCompressor::LZ4, 5, BloscShuffleMode::Shuffle, 4, Some(4096));
    let array = make_array(dir.path(), data_type::float32(), FillValue::from(0f32), &shape, &chunks, vec![codec])?;
    let key: zarrs_storage::StoreKey = "z/c/0/0".try_into()?;
    let good = array.storage().get(&key)?.ok_or("chunk 0 missing")?.to_vec();
    let corruptions: Vec<(&str, Vec<u8>)> = vec![
        ("truncated header", good[..10].to_vec()),
        ("nbytes", {
            let mut b = good.clone();
            b[4] ^= 0x40;
            b
        }),
        ("blocksize", {
            let mut b = good.clone();
            b[8] = 0;
            b[9] ^= 0x20;
            b
        }),
        ("cbytes", {
            let mut b = good.clone();
            b[12] ^= 1;
            b
        }),
        ("block start", {
            let mut b = good.clone();
            b[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
            b
        }),
        ("stream bytes", {
            let mut b = good.clone();
            let n = b.len();
            b[n / 2] ^= 0xff;
            b[n / 2 + 1] ^= 0x5a;
            b
        }),
        ("truncated", good[..good.len() - 9].to_vec()),
    ];
    for (what, bytes) in corruptions {
        array.storage().set(&key, bytes.into())?;
        let host = array.retrieve_array_subset::<Vec<f32>>(&array.subset_all());
        match array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix()) {
            Ok((device, _)) => {
                // Damage c-blosc decodes too (a literal byte changed): then the bytes are zarrs'.
                let host = host.map_err(|e| format!("{what}: the device read a chunk zarrs refuses: {e}"))?;
                let got: Vec<u8> = device.to_host_bytes()?;
                let host: Vec<u8> = host.iter().flat_map(|v| v.to_ne_bytes()).collect();
                assert!(got == host, "{what}: device data differ from zarrs'");
            }
            Err(err) => assert!(err.to_string().contains("c/0/0"), "{what}: {err}"),
        }
        array.storage().set(&key, good.clone().into())?;
        check::<f32>(&array, &array.subset_all(), &posix())?;
    }
    Ok(())
}
