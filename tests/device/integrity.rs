//! Integrity and containment on the device: every check the stored data carries is verified
//! before data is returned (zstd content checksums by an XXH64 kernel), and a batch that never
//! finishes or faults the CUDA context is an error, after which the device fails fast. The fault
//! tests run in a child process (this test binary again), since a lost context stays lost.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{ShardingCodecBuilder, ShardingIndexLocation, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, BytesToBytesCodecTraits, DataType, FillValue};
use zarrs_gpu::{ArrayDeviceExt, DecodePath, DecodeTrust, GdsStore, GpuConfig, GpuError};
use zarrs_gpu_codecs::InjectedFault;
use zarrs_storage::{Bytes, ReadableStorageTraits, WritableStorageTraits};

use super::{check, child_command, posix, subsets, Result};

fn zstd(level: i32, checksum: bool) -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(ZstdCodec::new(level, checksum))
}

/// An array of `data_type` with chunks of random (half compressible) bytes, every chunk written.
fn make(
    dir: &std::path::Path,
    data_type: DataType,
    fill: FillValue,
    shape: &[u64],
    chunks: &[u64],
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
) -> Result<Array<GdsStore>> {
    let array = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type, fill)
        .bytes_to_bytes_codecs(codecs)
        .build(Arc::new(GdsStore::new(dir)?), "/x")?;
    array.store_metadata()?;
    let mut rng = StdRng::seed_from_u64(shape.iter().product::<u64>() ^ chunks[0]);
    let elem = array.data_type().fixed_size().unwrap();
    let grid = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
    for indices in grid.indices() {
        let n = array.chunk_subset(&indices)?.num_elements_usize() * elem;
        let bytes: Vec<u8> = (0..n).map(|i| if i % 3 == 0 { rng.random() } else { (i / 64) as u8 }).collect();
        array.store_chunk(&indices, ArrayBytes::new_flen(bytes))?;
    }
    Ok(array)
}

/// Frames with content checksums decode on the device and their XXH64 is verified there: chunk
/// sizes around the hash's 32-byte stripes and 8- and 4-byte tails, levels, data types; none goes
/// to host threads, and every read equals zarrs'.
#[test]
#[ignore = "needs a CUDA GPU"]
fn zstd_content_checksums_verified_on_the_device() -> Result {
    let dir = tempfile::tempdir()?;
    for (chunk, level) in [(1u64, 3), (3, 1), (7, 3), (31, 3), (32, 19), (33, 3), (63, 3), (100, 9), (4097, 3)] {
        let shape = [chunk * 5 + chunk / 2 + 1];
        let array =
            make(dir.path(), data_type::uint8(), FillValue::from(0u8), &shape, &[chunk], vec![zstd(level, true)])?;
        let report = check::<u8>(&array, &array.subset_all(), &posix())?;
        assert_eq!((report.decode, report.host_decoded_chunks), (DecodePath::Device, 0), "{chunk}: {report:?}");
        array.storage().erase_prefix(&"x/".try_into()?)?;
    }
    let shape = [40u64, 300, 70];
    let array =
        make(dir.path(), data_type::float32(), FillValue::from(1.5f32), &shape, &[16, 128, 70], vec![zstd(3, true)])?;
    for subset in subsets(&shape, 4) {
        let report = check::<f32>(&array, &subset, &posix())?;
        assert_eq!((report.decode, report.host_decoded_chunks), (DecodePath::Device, 0), "{report:?}");
    }
    let trusted = posix().with_decode_trust(DecodeTrust::Trusted);
    check::<f32>(&array, &array.subset_all(), &trusted)?;
    Ok(())
}

/// Read the whole array with `stored` in place of `key`'s value: an error naming `key`, or (a
/// flip that changes nothing decoded) exactly zarrs' bytes. Whether it was an error.
fn refused_or_right(
    array: &Array<GdsStore>,
    key: &zarrs_storage::StoreKey,
    stored: Vec<u8>,
    config: &GpuConfig,
) -> Result<bool> {
    let good = array.storage().get(key)?.unwrap();
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?.into_owned();
    array.storage().set(key, Bytes::from(stored))?;
    let outcome = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), config);
    array.storage().set(key, good)?;
    match outcome {
        Err(err) => {
            assert!(matches!(err, GpuError::Chunk { .. }) && err.to_string().contains(key.as_str()), "{err}");
            Ok(true)
        }
        Ok((data, report)) => {
            assert!(data.to_host_bytes()? == want, "wrong data returned without an error ({report:?})");
            Ok(false)
        }
    }
}

/// The case reported: a frame with a content checksum, one byte of its payload flipped, was read
/// without an error. Now the checksum is verified: a flipped checksum byte is a mismatch naming
/// the chunk, and flips all over the frame are errors (or change nothing), under every trust.
#[test]
#[ignore = "needs a CUDA GPU"]
fn damaged_frames_with_checksums_are_errors_never_wrong_data() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [64u64, 256];
    let array = make(dir.path(), data_type::float32(), FillValue::from(0f32), &shape, &[32, 128], vec![zstd(3, true)])?;
    let key = array.chunk_key(&[1, 0]);
    let good = array.storage().get(&key)?.unwrap().to_vec();
    let n = good.len();
    for trust in [DecodeTrust::Checked, DecodeTrust::Trusted] {
        let config = posix().with_decode_trust(trust);
        let mut flipped = good.clone();
        flipped[n - 2] ^= 0x10;
        array.storage().set(&key, Bytes::from(flipped))?;
        let err = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &config).unwrap_err();
        array.storage().set(&key, Bytes::from(good.clone()))?;
        let text = err.to_string();
        assert!(text.contains(key.as_str()) && text.contains("XXH64") && text.contains("mismatch"), "{text}");
        let mut rng = StdRng::seed_from_u64(3);
        let (mut refused, tries) = (0, 40);
        for _ in 0..tries {
            let mut b = good.clone();
            b[rng.random_range(6..n)] ^= rng.random_range(1..=255u8);
            refused += usize::from(refused_or_right(&array, &key, b, &config)?);
        }
        assert!(refused * 10 >= tries * 9, "{trust:?}: {refused} of {tries} refused");
    }
    check::<f32>(&array, &array.subset_all(), &posix())?;
    Ok(())
}

/// Inner chunks of shards carry their checksums too: one flipped in a shard is an error naming
/// the shard and the inner chunk.
#[test]
#[ignore = "needs a CUDA GPU"]
fn inner_chunk_checksums_are_verified() -> Result {
    let dir = tempfile::tempdir()?;
    let inner = [8u64, 32].map(|n| std::num::NonZeroU64::new(n).unwrap());
    let sharding = ShardingCodecBuilder::new(inner.to_vec(), &data_type::float32())
        .bytes_to_bytes_codecs(vec![zstd(3, true)])
        .index_location(ShardingIndexLocation::End)
        .build_arc();
    let array = ArrayBuilder::new(vec![32, 64], vec![32, 64], data_type::float32(), 0f32)
        .array_to_bytes_codec(sharding)
        .build(Arc::new(GdsStore::new(dir.path())?), "/s")?;
    array.store_metadata()?;
    let values: Vec<f32> = (0..32 * 64).map(|i| (i % 97) as f32 * 0.5 + (i / 64) as f32).collect();
    array.store_chunk(&[0, 0], values)?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let key = array.chunk_key(&[0, 0]);
    let good = array.storage().get(&key)?.unwrap().to_vec();
    // Inner chunks are whole zstd frames one after another: the last byte before the second
    // frame's magic is the first frame's checksum.
    let magic = [0x28, 0xB5, 0x2F, 0xFD];
    let second = good.windows(4).enumerate().filter(|(_, w)| *w == magic).nth(1).map(|(i, _)| i).unwrap();
    let mut flipped = good.clone();
    flipped[second - 1] ^= 0x01;
    array.storage().set(&key, Bytes::from(flipped))?;
    let err = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix()).unwrap_err();
    array.storage().set(&key, Bytes::from(good))?;
    let text = err.to_string();
    assert!(text.contains(key.as_str()) && text.contains("inner chunk") && text.contains("XXH64"), "{text}");
    check::<f32>(&array, &array.subset_all(), &posix())?;
    Ok(())
}

/// The variable that makes this test binary a child running one injected fault.
const CHILD: &str = "ZARRS_GPU_TEST_FAULT_CHILD";

/// In the child: a zstd array read with `fault` injected into its first batch must fail within
/// the time bound, and every read after it must fail fast saying the context is lost. Prints one
/// line per outcome for the parent.
fn child(fault: InjectedFault) -> Result {
    let dir = tempfile::tempdir()?;
    let array =
        make(dir.path(), data_type::float32(), FillValue::from(0f32), &[64, 256], &[32, 128], vec![zstd(3, false)])?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let faulty = posix().with_batch_timeout(Some(Duration::from_secs(3))).with_injected_fault(Some(fault));
    let start = Instant::now();
    let first = array
        .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &faulty)
        .map(|_| ())
        .unwrap_err();
    println!("FIRST {:.1}s {first}", start.elapsed().as_secs_f64());
    for _ in 0..2 {
        let start = Instant::now();
        let later = array
            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix())
            .map(|_| ())
            .unwrap_err();
        println!("LATER {:.3}s {}", start.elapsed().as_secs_f64(), matches!(later, GpuError::ContextLost { .. }));
        println!("MESSAGE {later}");
    }
    // Leave at once: a kernel that never ends may keep the driver's exit handlers waiting.
    std::io::Write::flush(&mut std::io::stdout())?;
    // SAFETY: ends the process without running exit handlers; nothing is left to flush.
    unsafe { libc::_exit(0) }
}

/// Run `fault` in a child process (this test, again); its output once it exits, within 120 s.
fn run_child(fault: &str, test_name: &str) -> Result<String> {
    let mut child =
        child_command(test_name, &[(CHILD, Some(fault))])?.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > Duration::from_mins(2) {
            child.kill()?;
            return Err("the child process hung".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed or aborted ({:?}):\n{text}", out.status);
    Ok(text)
}

/// What the child printed after `tag` on each line holding it (the test harness's own words may
/// precede the first).
fn lines<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    text.lines().filter_map(|l| l.split_once(tag).map(|(_, rest)| rest)).collect()
}

/// A batch that never finishes (a kernel spinning forever) is an error naming its chunks once its
/// bound passes; the device is then lost, and later reads say so at once. Never a hang.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_batch_that_never_finishes_times_out() -> Result {
    if std::env::var(CHILD).as_deref() == Ok("hang") {
        return child(InjectedFault::Hang);
    }
    let text = run_child("hang", "integrity::a_batch_that_never_finishes_times_out")?;
    let first = lines(&text, "FIRST ");
    assert!(first.len() == 1 && first[0].contains("did not finish within 3 s") && first[0].contains("x/c/"), "{text}");
    let secs: f64 = first[0].split('s').next().unwrap().parse()?;
    assert!((2.9..10.0).contains(&secs), "timed out after {secs} s: {text}");
    check_later(&text)
}

/// A kernel writing to an unmapped address faults the context (sticky: every later CUDA call of
/// the process on the device fails): the read is an error, later reads fail fast saying the
/// context is lost and the process must restart. Never an abort.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_context_fault_is_contained() -> Result {
    if std::env::var(CHILD).as_deref() == Ok("fault") {
        return child(InjectedFault::IllegalAddress);
    }
    let text = run_child("fault", "integrity::a_context_fault_is_contained")?;
    let first = lines(&text, "FIRST ");
    assert!(first.len() == 1 && first[0].contains("lost"), "{text}");
    check_later(&text)
}

fn check_later(text: &str) -> Result {
    let later = lines(text, "LATER ");
    assert_eq!(later.len(), 2, "{text}");
    for line in later {
        let (secs, lost) = line.split_once("s ").unwrap();
        assert!(secs.parse::<f64>()? < 0.5 && lost == "true", "{text}");
    }
    assert!(lines(text, "MESSAGE ").iter().all(|m| m.contains("restart the process")), "{text}");
    Ok(())
}
