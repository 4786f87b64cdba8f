//! zlib chunks (numcodecs' `zlib`: zarr v2 `{"id": "zlib"}`, v3 `numcodecs.zlib`) decoded on the
//! device with nvCOMP's deflate decoder, their Adler-32 verified by our kernel, compared with
//! zarrs' host retrieval byte for byte. GPU tests are `#[ignore = "needs a CUDA GPU"]`.

use std::borrow::Cow;
use std::io::Write;
use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{Crc32cCodec, ZlibCodec};
use zarrs::array::{data_type, Array, ArrayBytes, ArraySubset, BytesToBytesCodecTraits, CodecOptions, FillValue};
use zarrs_gpu::zarrs_gpu_codecs::host_decode_reason;
use zarrs_gpu::{sample, DecodePath, DecodeTrust, GdsStore, GpuConfig, GpuError};
use zarrs_storage::{Bytes, ReadableStorageTraits, WritableStorageTraits};

use super::{check, check_chunk, posix, scheduled, subsets, Result};
use zarrs_gpu::ArrayDeviceExt;

pub(crate) fn zlib(level: u32) -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(ZlibCodec::new(level.try_into().expect("a zlib level")))
}

fn crc32c() -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(Crc32cCodec::new())
}

/// A zarr v2 array with numcodecs' zlib compressor at `level` (dtype `|u1` or `<f4`), its
/// chunks written by zarrs (smooth values for float32, random nibbles for bytes), every fifth
/// never written.
fn v2_zlib(dir: &std::path::Path, dtype: &str, shape: &[u64], chunks: &[u64], level: u32) -> Result<Array<GdsStore>> {
    let fill = if dtype == "|u1" { "7" } else { "-1.5" };
    let meta = format!(
        r#"{{"zarr_format": 2, "shape": {shape:?}, "chunks": {chunks:?}, "dtype": "{dtype}",
            "compressor": {{"id": "zlib", "level": {level}}}, "fill_value": {fill}, "order": "C",
            "filters": null, "dimension_separator": "."}}"#
    );
    std::fs::create_dir_all(dir.join("v2"))?;
    std::fs::write(dir.join("v2/.zarray"), meta)?;
    let array = Array::open(Arc::new(GdsStore::new(dir)?), "/v2")?;
    let mut rng = StdRng::seed_from_u64(u64::from(level) + 40);
    let grid = array.chunks_in_array_subset(&array.subset_all())?.expect("a grid");
    for (n, indices) in grid.indices().into_iter().enumerate() {
        if n % 5 == 3 {
            continue;
        }
        let count = array.chunk_subset(&indices)?.num_elements();
        let bytes: Vec<u8> = if dtype == "|u1" {
            (0..count).map(|_| rng.random::<u8>() & 0x0F).collect()
        } else {
            (0..count).flat_map(|i| sample::sample_value(i + n as u64 * 977, shape).to_ne_bytes()).collect()
        };
        array.store_chunk(&indices, ArrayBytes::new_flen(bytes))?;
    }
    Ok(array)
}

/// A zarr v3 float32 array with `codecs` (numcodecs.zlib, crc32c after it or not), written as
/// [`v2_zlib`]'s.
fn v3_zlib(
    dir: &std::path::Path,
    shape: &[u64],
    chunks: &[u64],
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
) -> Result<Array<GdsStore>> {
    super::compressed::make_array(dir, data_type::float32(), FillValue::from(2.5f32), shape, chunks, codecs)
}

/// Where nvCOMP loads, zlib arrays plan for the device; where it does not, the reason says so
/// (no longer "no device implementation").
#[test]
fn zlib_arrays_have_a_device_plan() -> Result {
    let nvcomp = zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok();
    let dir = tempfile::tempdir()?;
    let v2 = v2_zlib(dir.path(), "<f4", &[20, 30], &[10, 16], 4)?;
    let v3 = v3_zlib(dir.path(), &[20, 30], &[10, 16], vec![zlib(4), crc32c()])?;
    for array in [&v2, &v3] {
        let reason = host_decode_reason(array);
        if nvcomp {
            assert_eq!(reason, None);
        } else {
            assert!(reason.as_deref().is_some_and(|r| r.contains("nvCOMP")), "{reason:?}");
        }
    }
    Ok(())
}

/// v2 zlib arrays (float32 and uint8, levels 0 to 9, partial edge chunks, missing chunks): by
/// default (no crc32c) on host threads; trusted, every stream decoded by nvCOMP; both as zarrs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn v2_zlib_arrays_match_zarrs() -> Result {
    let shape = [40u64, 70, 33];
    let chunks = [16u64, 32, 16];
    let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
    for (dtype, level) in [("<f4", 1), ("<f4", 6), ("<f4", 9), ("<f4", 0), ("|u1", 4), ("|u1", 0)] {
        let dir = tempfile::tempdir()?;
        let array = v2_zlib(dir.path(), dtype, &shape, &chunks, level)?;
        assert_eq!(host_decode_reason(&array), None, "{dtype} {level}");
        let whole = array.subset_all();
        let read = |subset: &ArraySubset, config: &GpuConfig| {
            if dtype == "|u1" {
                check::<u8>(&array, subset, config)
            } else {
                check::<f32>(&array, subset, config)
            }
        };
        let report = read(&whole, &posix())?;
        let present = report.chunks - report.missing_chunks;
        assert!(report.missing_chunks > 0, "{report:?}");
        assert_eq!(report.host_decoded_chunks, present, "{dtype} {level}: {report:?}");
        // Trusted: nvCOMP decodes every stream, the device verifies every Adler-32.
        let report = read(&whole, &trusted)?;
        assert_eq!(report.decode, DecodePath::Device, "{dtype} {level}: {report:?}");
        assert_eq!(report.host_decoded_chunks, 0, "{dtype} {level}: {report:?}");
        for subset in subsets(&shape, u64::from(level) + 20) {
            read(&subset, &trusted)?;
        }
        // Whole chunks: an inner one, an edge one, a missing one.
        for indices in [[1u64, 1, 1], [2, 2, 2], [0, 1, 0]] {
            let report = if dtype == "|u1" {
                check_chunk::<u8>(&array, &indices, &trusted)?
            } else {
                check_chunk::<f32>(&array, &indices, &trusted)?
            };
            assert_eq!(report.decode, DecodePath::Device, "{indices:?}: {report:?}");
        }
    }
    Ok(())
}

/// v3 `numcodecs.zlib` followed by crc32c: verified first, so nvCOMP decodes by default and under
/// `Verified`; without crc32c, `Verified` keeps the streams on host threads.
#[test]
#[ignore = "needs a CUDA GPU"]
fn zlib_with_crc32c_decodes_on_nvcomp_by_default() -> Result {
    let shape = [37u64, 50, 20];
    let chunks = [16u64, 16, 16];
    for (codecs, verified) in [(vec![zlib(5), crc32c()], true), (vec![zlib(5)], false)] {
        let dir = tempfile::tempdir()?;
        let array = v3_zlib(dir.path(), &shape, &chunks, codecs)?;
        for trust in [DecodeTrust::Checked, DecodeTrust::Verified] {
            let config = posix().with_decode_trust(trust);
            let report = check::<f32>(&array, &array.subset_all(), &config)?;
            let present = report.chunks - report.missing_chunks;
            assert_eq!(report.host_decoded_chunks, if verified { 0 } else { present }, "{trust:?}: {report:?}");
            for subset in subsets(&shape, 3) {
                check::<f32>(&array, &subset, &config)?;
            }
        }
    }
    Ok(())
}

/// Larger chunks (1 MiB decoded, so the Adler-32 kernel's threads sum many words each), many
/// small batches (the scratch shared between them), and the scheduler's split between host
/// threads and nvCOMP: the same bytes as zarrs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn large_zlib_chunks_and_small_batches_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let array = v3_zlib(dir.path(), &[48, 512, 512], &[16, 128, 128], vec![zlib(1), crc32c()])?;
    let report = check::<f32>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.host_decoded_chunks, 0, "{report:?}");
    check::<f32>(&array, &array.subset_all(), &posix().with_staging_bytes(3 << 20))?;
    check::<f32>(&array, &array.subset_all(), &scheduled())?;
    Ok(())
}

/// A zlib stream of `raw` at `level`.
fn zlib_stream(raw: &[u8], level: u32) -> Result<Vec<u8>> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(level));
    encoder.write_all(raw)?;
    Ok(encoder.finish()?)
}

/// A chunk whose Adler-32 does not match its decoded bytes (a flipped trailer byte; a valid
/// deflate stream of other bytes under the original Adler-32) is an error naming the chunk, never
/// data: on the device (trusted, or crc32c recomputed so that it passes) and on host threads; the
/// next read of the repaired array works.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_wrong_adler32_is_an_error_naming_the_chunk() -> Result {
    let shape = [32u64, 64];
    for with_crc in [false, true] {
        let dir = tempfile::tempdir()?;
        let codecs = if with_crc { vec![zlib(6), crc32c()] } else { vec![zlib(6)] };
        let array = v3_zlib(dir.path(), &shape, &[16, 32], codecs)?;
        let store = array.storage();
        let key = array.chunk_key(&[0, 1]);
        let good = store.get(&key)?.expect("a stored chunk");
        let stream = if with_crc { &good[..good.len() - 4] } else { &good[..] };
        // crc32c over the new stream, as zarrs writes it, so that it passes.
        let seal = |stream: Vec<u8>| -> Result<Vec<u8>> {
            if !with_crc {
                return Ok(stream);
            }
            Ok(crc32c().encode(Cow::Owned(stream), &CodecOptions::default())?.into_owned())
        };
        // The trailer's last byte flipped.
        let mut flipped = stream.to_vec();
        *flipped.last_mut().expect("bytes") ^= 0x01;
        // Other bytes, compressed again, under the original Adler-32.
        let mut raw: Vec<u8> = array.retrieve_chunk::<ArrayBytes<'static>>(&[0, 1])?.into_fixed()?.into_owned();
        raw[100] ^= 0x40;
        let mut other = zlib_stream(&raw, 6)?;
        let n = other.len();
        other[n - 4..].copy_from_slice(&stream[stream.len() - 4..]);
        for (what, bytes) in [("flipped Adler-32", flipped), ("other bytes", other)] {
            store.set(&key, Bytes::from(seal(bytes)?))?;
            let trusts = if with_crc {
                vec![DecodeTrust::Checked, DecodeTrust::Trusted]
            } else {
                vec![DecodeTrust::Trusted, DecodeTrust::Checked]
            };
            for trust in trusts {
                let config = posix().with_decode_trust(trust);
                let err = array
                    .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &config)
                    .unwrap_err();
                assert!(
                    matches!(err, GpuError::Chunk { .. }) && err.to_string().contains(&key.to_string()),
                    "{what}, {trust:?}: {err}"
                );
                // On the device (with crc32c or trusted) the kernel's Adler-32 tells.
                if with_crc || trust == DecodeTrust::Trusted {
                    assert!(err.to_string().contains("Adler-32"), "{what}, {trust:?}: {err}");
                }
            }
            store.set(&key, good.clone())?;
            check::<f32>(&array, &array.subset_all(), &posix().with_decode_trust(DecodeTrust::Trusted))?;
        }
    }
    Ok(())
}

/// A bad header is an error naming the chunk from the host check (before any device sees it);
/// a stream nvCOMP cannot take (empty bytes after it, level-0 stored blocks of another size)
/// decodes on host threads, where zlib decides.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bad_headers_are_errors_and_odd_streams_decode_on_the_host() -> Result {
    let dir = tempfile::tempdir()?;
    let array = v3_zlib(dir.path(), &[20, 30], &[10, 30], vec![zlib(0)])?;
    let store = array.storage();
    let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
    let key = array.chunk_key(&[0, 0]);
    let good = store.get(&key)?.expect("a stored chunk");
    let mut bad = good.to_vec();
    bad[1] ^= 0x01;
    store.set(&key, Bytes::from(bad))?;
    let err = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &trusted).unwrap_err();
    assert!(err.to_string().contains(&key.to_string()) && err.to_string().contains("zlib header"), "{err}");
    // A stored (level 0) stream with bytes after it: zlib ignores them, so does the host route.
    let mut after = good.to_vec();
    after.extend_from_slice(b"after");
    store.set(&key, Bytes::from(after))?;
    let report = check::<f32>(&array, &array.subset_all(), &trusted)?;
    assert_eq!(report.host_decoded_chunks, 1, "{report:?}");
    store.set(&key, good)?;
    let report = check::<f32>(&array, &array.subset_all(), &trusted)?;
    assert_eq!(report.host_decoded_chunks, 0, "{report:?}");
    Ok(())
}
