//! The fault matrix: damaged stored chunks and shards for every chain on the device path,
//! unreadable values, a chunk deleted between planning and reading, missing libraries, and
//! device memory running out in the middle of a read. Each outcome is compared with zarrs' own
//! host read of the same bytes: where zarrs refuses, so must we (an error naming the chunk);
//! where we return data it is exactly zarrs'. After every fault the same process reads correctly.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{
    BloscCompressor, BloscShuffleMode, BytesCodec, Crc32cCodec, GzipCodec, ShardingCodecBuilder, ShardingIndexLocation,
    TransposeCodec, TransposeOrder, ZstdCodec,
};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, BytesToBytesCodecTraits, Endianness};
use zarrs::filesystem::FilesystemStore;
use zarrs_gpu::{ArrayDeviceExt, DecodePath, GdsStore, GpuConfig, GpuError};
use zarrs_gpu_codecs::blosc_header::{check_chunk, BloscVerdict};
use zarrs_storage::byte_range::ByteRangeIterator;
use zarrs_storage::{
    Bytes, MaybeBytes, MaybeBytesIterator, ReadableStorageTraits, StorageError, StoreKey, WritableStorageTraits,
};

use super::{check, child_command, posix, Result};

const SHAPE: [u64; 2] = [32, 96];
const CHUNKS: [u64; 2] = [16, 32];

fn zstd() -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(ZstdCodec::new(3, false))
}
fn crc() -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(Crc32cCodec::new())
}
fn gzip() -> Arc<dyn BytesToBytesCodecTraits> {
    Arc::new(GzipCodec::new(5).unwrap())
}

/// A chain by name, and how an array builder gets its codecs.
type Chain = (&'static str, Box<dyn Fn(&mut ArrayBuilder)>);

/// Every chain of the device path.
fn chains() -> Vec<Chain> {
    let sharded = |codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>| {
        let inner = [8u64, 16].map(|n| std::num::NonZeroU64::new(n).unwrap());
        ShardingCodecBuilder::new(inner.to_vec(), &data_type::float32())
            .bytes_to_bytes_codecs(codecs)
            .index_location(ShardingIndexLocation::End)
            .build_arc()
    };
    let transpose = || Arc::new(TransposeCodec::new(TransposeOrder::new(&[1, 0]).unwrap()));
    vec![
        ("raw", Box::new(|_: &mut ArrayBuilder| {})),
        (
            "big-endian",
            Box::new(|b: &mut ArrayBuilder| {
                b.array_to_bytes_codec(Arc::new(BytesCodec::new(Some(Endianness::Big))));
            }),
        ),
        (
            "zstd",
            Box::new(|b: &mut ArrayBuilder| {
                b.bytes_to_bytes_codecs(vec![zstd()]);
            }),
        ),
        (
            "zstd+crc32c",
            Box::new(|b: &mut ArrayBuilder| {
                b.bytes_to_bytes_codecs(vec![zstd(), crc()]);
            }),
        ),
        (
            "transpose+zstd",
            Box::new(move |b: &mut ArrayBuilder| {
                b.array_to_array_codecs(vec![transpose()]).bytes_to_bytes_codecs(vec![zstd()]);
            }),
        ),
        (
            "gzip",
            Box::new(|b: &mut ArrayBuilder| {
                b.bytes_to_bytes_codecs(vec![gzip()]);
            }),
        ),
        (
            "gzip+crc32c",
            Box::new(|b: &mut ArrayBuilder| {
                b.bytes_to_bytes_codecs(vec![gzip(), crc()]);
            }),
        ),
        (
            "crc32c",
            Box::new(|b: &mut ArrayBuilder| {
                b.bytes_to_bytes_codecs(vec![crc()]);
            }),
        ),
        (
            "shard(raw)",
            Box::new(move |b: &mut ArrayBuilder| {
                b.array_to_bytes_codec(sharded(vec![]));
            }),
        ),
        (
            "shard(zstd)",
            Box::new(move |b: &mut ArrayBuilder| {
                b.array_to_bytes_codec(sharded(vec![zstd()]));
            }),
        ),
        (
            "shard(gzip+crc32c)",
            Box::new(move |b: &mut ArrayBuilder| {
                b.array_to_bytes_codec(sharded(vec![gzip(), crc()]));
            }),
        ),
    ]
}

/// A float32 array of [`SHAPE`] at `node` with every chunk written.
fn make<S: WritableStorageTraits + ReadableStorageTraits + 'static>(
    store: Arc<S>,
    node: &str,
    codecs: &dyn Fn(&mut ArrayBuilder),
) -> Result<Array<S>> {
    let mut builder = ArrayBuilder::new(SHAPE.to_vec(), CHUNKS.to_vec(), data_type::float32(), -1f32);
    codecs(&mut builder);
    let array = builder.build(store, node)?;
    array.store_metadata()?;
    let values: Vec<f32> = (0..SHAPE[0] * SHAPE[1]).map(|i| ((i * 7919) % 613) as f32 * 0.25).collect();
    array.store_array_subset(&array.subset_all(), values)?;
    Ok(array)
}

/// zarrs' host read of the whole array, or its error.
fn zarrs_read<S: ReadableStorageTraits + ?Sized + 'static>(array: &Array<S>) -> std::result::Result<Vec<u8>, String> {
    array
        .retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())
        .and_then(|b| Ok(b.into_fixed()?.into_owned()))
        .map_err(|e| e.to_string())
}

/// Our outcome for `array` as it is stored now, checked against zarrs': "error" or "data".
fn outcome(array: &Array<GdsStore>, key: &StoreKey, config: &GpuConfig) -> Result<String> {
    let host = zarrs_read(array);
    match array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), config) {
        Err(err) => {
            let text = err.to_string();
            assert!(text.contains(key.as_str()), "the error does not name {key}: {text}");
            assert!(!matches!(err, GpuError::ContextLost { .. }), "{text}");
            Ok(format!("error ({})", text.replace(key.as_str(), "KEY")))
        }
        Ok((data, report)) => {
            let got = data.to_host_bytes()?;
            match host {
                Ok(want) => assert!(got == want, "{key}: our bytes differ from zarrs' ({report:?})"),
                Err(e) => panic!("{key}: we returned data where zarrs refuses ({e}); {report:?}"),
            }
            Ok("the same data as zarrs".into())
        }
    }
}

/// Truncated, empty, oversized and garbage values for the chunk (or shard) at [1, 1] of every
/// device chain, under the default trust: each an error naming the key wherever zarrs refuses
/// it, and the next read correct.
#[test]
#[ignore = "needs a CUDA GPU"]
fn damaged_chunks_and_shards_of_every_device_chain() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let mut rng = StdRng::seed_from_u64(99);
    let mut table = Vec::new();
    for (name, codecs) in chains() {
        let node = format!("/{}", name.replace(['(', ')', '+'], "_"));
        let array = make(store.clone(), &node, codecs.as_ref())?;
        let report = check::<f32>(&array, &array.subset_all(), &posix())?;
        assert_eq!(report.decode, DecodePath::Device, "{name}: {report:?}");
        let key = array.chunk_key(&[1, 1]);
        let good = store.get(&key)?.unwrap().to_vec();
        let mut garbage = vec![0u8; good.len()];
        rng.fill(&mut garbage[..]);
        let mut oversized = good.clone();
        oversized.extend((0..64).map(|_| rng.random::<u8>()));
        let cases = [
            ("truncated", good[..good.len() / 2].to_vec()),
            ("empty", Vec::new()),
            ("oversized", oversized),
            ("garbage", garbage),
        ];
        for (what, bytes) in cases {
            store.set(&key, Bytes::from(bytes))?;
            let ours = outcome(&array, &key, &posix())?;
            let host = zarrs_read(&array).map_or("error", |_| "data");
            table.push(format!("| {name} | {what} | {host} | {ours} |"));
            store.set(&key, Bytes::from(good.clone()))?;
            check::<f32>(&array, &array.subset_all(), &posix())?;
        }
    }
    println!("| chain | stored value | zarrs | ours |\n| --- | --- | --- | --- |\n{}", table.join("\n"));
    Ok(())
}

/// A value that cannot be read (a directory where the chunk file should be; and, where the test
/// does not run as root, a file without read permission) is an error naming it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn unreadable_values_are_errors_naming_them() -> Result {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    for (name, codecs) in chains().into_iter().filter(|(n, _)| ["raw", "zstd", "shard(zstd)"].contains(n)) {
        let node = format!("/{}", name.replace(['(', ')', '+'], "_"));
        let array = make(store.clone(), &node, codecs.as_ref())?;
        let key = array.chunk_key(&[1, 2]);
        let path = dir.path().join(key.as_str());
        let good = std::fs::read(&path)?;
        std::fs::remove_file(&path)?;
        std::fs::create_dir(&path)?;
        let err = array
            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix())
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains(key.as_str()), "{name}, a directory: {err}");
        std::fs::remove_dir(&path)?;
        std::fs::write(&path, &good)?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000))?;
            let err = array
                .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix())
                .map(|_| ())
                .unwrap_err();
            assert!(err.to_string().contains(key.as_str()), "{name}, no permission: {err}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
        check::<f32>(&array, &array.subset_all(), &posix())?;
    }
    Ok(())
}

/// A filesystem store whose `victim` disappears right after its size is asked: the chunk is
/// deleted between planning and reading.
struct Vanishing {
    inner: FilesystemStore,
    victim: StoreKey,
    root: std::path::PathBuf,
}

impl ReadableStorageTraits for Vanishing {
    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> std::result::Result<MaybeBytesIterator<'a>, StorageError> {
        self.inner.get_partial_many(key, byte_ranges)
    }

    fn size_key(&self, key: &StoreKey) -> std::result::Result<Option<u64>, StorageError> {
        let size = self.inner.size_key(key)?;
        if key == &self.victim {
            let _ = std::fs::remove_file(self.root.join(key.as_str()));
        }
        Ok(size)
    }

    fn supports_get_partial(&self) -> bool {
        true
    }

    fn get(&self, key: &StoreKey) -> std::result::Result<MaybeBytes, StorageError> {
        self.inner.get(key)
    }
}

/// A compressed chunk deleted after the read was planned (its size known) reads as missing: the
/// fill value, as zarrs reads the store as it is now; nothing else changes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_chunk_deleted_between_planning_and_reading_is_missing() -> Result {
    let dir = tempfile::tempdir()?;
    let writer = Arc::new(FilesystemStore::new(dir.path())?);
    let array = make(writer, "/v", &|b: &mut ArrayBuilder| {
        b.bytes_to_bytes_codecs(vec![zstd()]);
    })?;
    let victim = array.chunk_key(&[0, 2]);
    let vanishing = Arc::new(Vanishing {
        inner: FilesystemStore::new(dir.path())?,
        victim: victim.clone(),
        root: dir.path().into(),
    });
    let reader = Array::open(vanishing, "/v")?;
    let (data, report) = reader.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&reader.subset_all(), &posix())?;
    assert!(!dir.path().join(victim.as_str()).exists(), "the victim was never sized");
    assert_eq!((report.decode, report.missing_chunks), (DecodePath::Device, 1), "{report:?}");
    let want = zarrs_read(&Array::open(Arc::new(FilesystemStore::new(dir.path())?), "/v")?)?;
    assert!(data.to_host_bytes()? == want, "the deleted chunk is not the fill value");
    Ok(())
}

/// Device memory running out in the middle of a read (a cap below what the read needs, enforced
/// as its staging is allocated): an out-of-memory error with the sizes, nothing leaked, and the
/// next read correct. Repeated, the memory held stays the same.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_memory_running_out_mid_read() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let array = ArrayBuilder::new(vec![64, 512, 512], vec![8, 128, 128], data_type::float32(), 0f32)
        .bytes_to_bytes_codecs(vec![zstd()])
        .build(store, "/m")?;
    array.store_metadata()?;
    let values: Vec<f32> = (0..64 * 512 * 512u64).map(|i| (i % 1013) as f32).collect();
    array.store_array_subset(&array.subset_all(), values)?;
    // 64 MiB of output; batches of 16 MiB staged: the cap lets the output and one batch in.
    let capped = posix().with_staging_bytes(16 << 20).with_device_memory_cap(Some(80 << 20));
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let before = zarrs_gpu::memory_in_use(0)?;
    for _ in 0..3 {
        let err = array
            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &capped)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(err, GpuError::OutOfMemory { free, .. } if free == 80 << 20), "{err}");
        check::<f32>(&array, &array.subset_all(), &posix())?;
    }
    let after = zarrs_gpu::memory_in_use(0)?;
    let used = |m: &zarrs_gpu::MemoryInUse| m.device_total - m.device_free;
    assert!(used(&after) <= used(&before) + (64 << 20), "{before:?} -> {after:?}");
    Ok(())
}

/// The variable that makes this binary a child without nvCOMP, NVRTC and cuFile on its paths.
const CHILD: &str = "ZARRS_GPU_TEST_NO_LIBRARIES";

/// Without nvCOMP (and, where the host's loader cannot find them either, NVRTC and cuFile),
/// reads still return zarrs' data: zstd chains through our decoder (or host threads without
/// NVRTC), transposed chunks through the copy engines or the host, raw reads through preads.
#[test]
#[ignore = "needs a CUDA GPU"]
fn missing_libraries_fall_back_with_a_reason() -> Result {
    if std::env::var_os(CHILD).is_some() {
        return no_libraries_child();
    }
    let env = [
        (CHILD, Some("1")),
        ("NVCOMP_LIBRARY_PATH", None),
        ("PYTHONPATH", None),
        ("LD_LIBRARY_PATH", Some("")),
        ("CUFILE_LIBRARY_PATH", Some("/nonexistent/libcufile.so.0")),
    ];
    let out = child_command("faults::missing_libraries_fall_back_with_a_reason", &env)?.output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("NVCOMP missing"), "the child still loaded nvCOMP:\n{text}");
    println!("{text}");
    Ok(())
}

fn no_libraries_child() -> Result {
    let nvcomp = nvcomp_sys_present();
    // SAFETY: only probes whether libnvrtc loads.
    let nvrtc = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    println!(
        "NVCOMP {} NVRTC {}",
        if nvcomp { "present" } else { "missing" },
        if nvrtc { "present" } else { "missing" }
    );
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    for (name, codecs) in
        chains().into_iter().filter(|(n, _)| ["raw", "zstd", "transpose+zstd", "shard(zstd)"].contains(n))
    {
        let node = format!("/{}", name.replace(['(', ')', '+'], "_"));
        let array = make(store.clone(), &node, codecs.as_ref())?;
        let report = check::<f32>(&array, &array.subset_all(), &GpuConfig::default())?;
        println!(
            "{name}: {:?}, host reason {:?}, io {:?}",
            report.decode,
            report.host_reason,
            report.io.as_ref().map(ToString::to_string)
        );
        // zstd needs no nvCOMP: our decoder takes the frames nothing verifies (on host threads
        // where NVRTC is missing too).
        if name != "raw" && !nvcomp {
            assert_eq!(report.decode, DecodePath::Device, "{name}: {report:?}");
            let ours = report.device_decoder.as_deref() == Some("zstd: ours");
            assert!(ours || report.host_decoded_chunks == report.chunks - report.missing_chunks, "{name}: {report:?}");
        }
    }
    Ok(())
}

fn nvcomp_sys_present() -> bool {
    zarrs_gpu::nvcomp_sys::NvcompLibrary::get().is_ok()
}

/// Without NVRTC (simulated: the read gets none of our kernels; NVRTC itself is on the GPU host's
/// loader path): placement falls back to the copy engines, zstd frames with content checksums
/// decode on host threads (where libzstd verifies them), and transposed or byte-swapped chunks,
/// which only the gather kernel places, are refused with the reason. Every read that returns
/// data returns zarrs' data.
#[test]
#[ignore = "needs a CUDA GPU"]
fn without_kernels_reads_fall_back_or_say_why() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let config = posix().with_injected_fault(Some(zarrs_gpu_codecs::InjectedFault::NoKernels));
    for (name, codecs) in chains() {
        let node = format!("/{}", name.replace(['(', ')', '+'], "_"));
        let array = make(store.clone(), &node, codecs.as_ref())?;
        if ["big-endian", "transpose+zstd"].contains(&name) {
            let err = array
                .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &config)
                .map(|_| ())
                .unwrap_err();
            assert!(matches!(err, GpuError::NoNvrtc(_)), "{name}: {err}");
            assert!(err.to_string().contains("NVRTC is not available: placing transposed"), "{name}: {err}");
            continue;
        }
        let report = check::<f32>(&array, &array.subset_all(), &config)?;
        assert_eq!(report.decode, DecodePath::Device, "{name}: {report:?}");
    }
    let array = make(store.clone(), "/checksummed", &|b: &mut ArrayBuilder| {
        b.bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, true))]);
    })?;
    let report = check::<f32>(&array, &array.subset_all(), &config)?;
    assert_eq!(report.host_decoded_chunks, report.chunks, "{report:?}");
    Ok(())
}

/// A filesystem store that takes `delay` for every size query and read: storage slower than the
/// device's batch bound (a network filesystem, many small files).
struct Slow {
    inner: FilesystemStore,
    delay: std::time::Duration,
}

impl ReadableStorageTraits for Slow {
    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> std::result::Result<MaybeBytesIterator<'a>, StorageError> {
        std::thread::sleep(self.delay);
        self.inner.get_partial_many(key, byte_ranges)
    }

    fn size_key(&self, key: &StoreKey) -> std::result::Result<Option<u64>, StorageError> {
        std::thread::sleep(self.delay);
        self.inner.size_key(key)
    }

    fn supports_get_partial(&self) -> bool {
        true
    }

    fn get(&self, key: &StoreKey) -> std::result::Result<MaybeBytes, StorageError> {
        std::thread::sleep(self.delay);
        self.inner.get(key)
    }
}

/// The variable that makes this binary the child of the slow storage test.
const SLOW_CHILD: &str = "ZARRS_GPU_TEST_SLOW_STORAGE";

/// Storage slower than the batch bound: the bound covers the device's work only, so reads (one
/// batch and several) return zarrs' data; a corrupt chunk found after a slow read is the chunk's
/// error, the context stays usable and the next read is correct. In a child process: before the
/// bound started at enqueue, the context was marked lost for the whole process.
#[test]
#[ignore = "needs a CUDA GPU"]
fn slow_storage_is_no_device_timeout() -> Result {
    if std::env::var_os(SLOW_CHILD).is_some() {
        return slow_storage_child();
    }
    let out = child_command("faults::slow_storage_is_no_device_timeout", &[(SLOW_CHILD, Some("1"))])?.output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    Ok(())
}

fn slow_storage_child() -> Result {
    let dir = tempfile::tempdir()?;
    let writer = Arc::new(FilesystemStore::new(dir.path())?);
    // Twelve zstd chunks of 256 KiB: one batch, or three at 1 MiB of staging.
    let array = ArrayBuilder::new(vec![192, 4096], vec![32, 2048], data_type::float32(), -1f32)
        .bytes_to_bytes_codecs(vec![zstd()])
        .build(writer.clone(), "/slow")?;
    array.store_metadata()?;
    let values: Vec<f32> = (0..192 * 4096u64).map(|i| ((i * 7919) % 613) as f32 * 0.25).collect();
    array.store_array_subset(&array.subset_all(), values)?;
    let want = zarrs_read(&array)?;
    let slow =
        Arc::new(Slow { inner: FilesystemStore::new(dir.path())?, delay: std::time::Duration::from_millis(600) });
    let reader = Array::open(slow, "/slow")?;
    // Set up the device (context, nvCOMP, kernels) at the default bound.
    let (data, _) =
        array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &GpuConfig::default())?;
    assert!(data.to_host_bytes()? == want);
    // Each batch's reads take 600 ms at least, twice its bound.
    let bound = GpuConfig::default().with_batch_timeout(Some(std::time::Duration::from_millis(300)));
    for config in [bound.clone(), bound.with_staging_bytes(1 << 20)] {
        let (data, report) =
            reader.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&reader.subset_all(), &config)?;
        assert_eq!(report.decode, DecodePath::Device, "{report:?}");
        assert!(data.to_host_bytes()? == want, "slow storage: our bytes differ from zarrs' ({report:?})");
        // A corrupt chunk after a slow read: its own error, never a lost context.
        let key = array.chunk_key(&[2, 1]);
        let good = writer.get(&key)?.unwrap();
        writer.set(&key, Bytes::from(vec![0x55u8; good.len()]))?;
        let err = reader
            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&reader.subset_all(), &config)
            .map(|_| ())
            .unwrap_err();
        let lost = matches!(err, GpuError::ContextLost { .. } | GpuError::Timeout { .. });
        assert!(err.to_string().contains(key.as_str()) && !lost, "{err}");
        writer.set(&key, good)?;
        let (data, _) = reader.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&reader.subset_all(), &config)?;
        assert!(data.to_host_bytes()? == want, "the read after a corrupt chunk differs from zarrs'");
    }
    Ok(())
}

/// The Blosc arrays of the fault rows: lz4 byte shuffled (blocks of 64 KiB, each split into four
/// streams of LZ4 blocks) and zstd bit shuffled (blocks of 16 KiB, one zstd frame each).
const BLOSC_FAULT_ARRAYS: [(&str, BloscCompressor, BloscShuffleMode); 2] = [
    ("/blosc_lz4", BloscCompressor::LZ4, BloscShuffleMode::Shuffle),
    ("/blosc_zstd", BloscCompressor::Zstd, BloscShuffleMode::BitShuffle),
];

/// A float32 Blosc array at `node`: [96, 2048] in chunks of [64, 1024] (256 KiB, several blocks;
/// c-blosc enlarges the set 16 KiB to 64 KiB for lz4, whose blocks it splits), every chunk written.
fn make_blosc<S: WritableStorageTraits + ReadableStorageTraits + 'static>(
    store: Arc<S>,
    node: &str,
    compressor: BloscCompressor,
    shuffle: BloscShuffleMode,
) -> Result<Array<S>> {
    let codec = super::blosc::blosc(compressor, 5, shuffle, 4, Some(16 << 10));
    let array = ArrayBuilder::new(vec![96, 2048], vec![64, 1024], data_type::float32(), -1f32)
        .bytes_to_bytes_codecs(vec![codec])
        .build(store, node)?;
    array.store_metadata()?;
    // A wave and a little hashed noise: compressible, not periodic.
    let values: Vec<f32> =
        (0..96 * 2048u64).map(|i| (i as f32 * 1e-3).sin() * 100.0 + ((i * 2_654_435_761) % 97) as f32 * 0.01).collect();
    array.store_array_subset(&array.subset_all(), values)?;
    Ok(array)
}

fn le32(bytes: &[u8], at: usize) -> usize {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
}

fn set_le32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Where the first compressed stream of block 0 of `good` lies, a Blosc chunk of several
/// compressed blocks.
fn first_compressed_stream(good: &[u8]) -> std::ops::Range<usize> {
    // The header: flags at 2, then nbytes, blocksize and cbytes; the block starts after it.
    let (nbytes, blocksize, cbytes) = (le32(good, 4), le32(good, 8), le32(good, 12));
    assert_eq!(cbytes, good.len(), "cbytes");
    assert!(nbytes > 2 * blocksize && good[2] & 0x02 == 0, "a chunk of compressed blocks");
    // Block 0's streams (four of a quarter block each where split, typesize 4), each its 4-byte
    // size and its bytes: the first one compressed (shorter than what it decodes to).
    let streams = if good[2] & 0x10 == 0 { 4 } else { 1 };
    let mut at = le32(good, 16) + 4;
    for _ in 0..streams {
        if le32(good, at - 4) < blocksize / streams {
            break;
        }
        at += le32(good, at - 4) + 4;
    }
    let len = le32(good, at - 4);
    assert!(len < blocksize / streams, "a compressed stream in block 0");
    at..at + len
}

/// Damaged values of `good`, a Blosc chunk of `compressor` streams (several blocks), each one
/// c-blosc refuses: the header's fields, a block start, and the first compressed stream of block
/// 0 (an LZ4 block or a zstd frame).
fn blosc_damage(good: &[u8], compressor: BloscCompressor) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let (nbytes, blocksize, cbytes) = (le32(good, 4), le32(good, 8), le32(good, 12));
    let stream = first_compressed_stream(good);
    let at = stream.start;
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.to_vec();
        f(&mut bytes);
        bytes
    };
    let mut rows = vec![
        ("a truncated header", good[..10].to_vec()),
        ("nbytes 4 short", edit(&|b| set_le32(b, 4, nbytes as u32 - 4))),
        ("cbytes 1 long", edit(&|b| set_le32(b, 12, cbytes as u32 + 1))),
        ("blocksize halved", edit(&|b| set_le32(b, 8, blocksize as u32 / 2))),
        ("block 1 starting past the end", edit(&|b| set_le32(b, 20, cbytes as u32 + 100))),
        ("block 1 starting at -1", edit(&|b| set_le32(b, 20, u32::MAX))),
    ];
    if compressor == BloscCompressor::Zstd {
        // The frame header: magic, descriptor, window descriptor unless single segment, the
        // dictionary id and content size fields; then the first block's 3-byte header.
        let s = &good[stream.clone()];
        assert_eq!(&s[..4], &[0x28, 0xB5, 0x2F, 0xFD], "a zstd frame");
        let fhd = s[4];
        let single = fhd & 0x20 != 0;
        let fcs = match fhd >> 6 {
            0 => usize::from(single),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let header = 5 + usize::from(!single) + [0, 1, 2, 4][usize::from(fhd & 3)] + fcs;
        let block = at + header;
        let word = u32::from(good[block]) | u32::from(good[block + 1]) << 8 | u32::from(good[block + 2]) << 16;
        let past = u32::try_from(stream.end - (block + 3) + 1)?;
        let set_block = move |b: &mut Vec<u8>, word: u32| b[block..block + 3].copy_from_slice(&word.to_le_bytes()[..3]);
        rows.push(("zstd block of the reserved type", edit(&|b| set_block(b, word | 0b110))));
        rows.push(("zstd block running past its frame", edit(&|b| set_block(b, word & 0b111 | past << 3))));
    } else {
        // The first sequence: a token (literal length in its high nibble, 15 and more continued
        // in the bytes after it), the literals, then the match's 2-byte offset.
        let s = &good[stream.clone()];
        let (mut pos, mut literals) = (1, usize::from(s[0] >> 4));
        if literals == 15 {
            loop {
                literals += usize::from(s[pos]);
                pos += 1;
                if s[pos - 1] != 255 {
                    break;
                }
            }
        }
        let offset = at + pos + literals;
        assert!(literals < 0xFFFF && offset + 2 < stream.end, "a first sequence with a match");
        rows.push(("LZ4 match offset before the block", edit(&|b| b[offset..offset + 2].fill(0xFF))));
        // Literals of 15 + 255 x (all but the stream's last 2 bytes) + 16: past the stream's end
        // and the block's.
        let ext = at + 1..stream.end - 2;
        assert!(15 + 255 * ext.len() + 16 > blocksize, "a stream long enough");
        rows.push((
            "LZ4 literal length past the end",
            edit(&|b| {
                b[at] |= 0xF0;
                b[ext.clone()].fill(0xFF);
                b[ext.end] = 16;
            }),
        ));
    }
    Ok(rows)
}

/// The Blosc rows of the fault matrix on the host alone: zarrs (c-blosc) refuses every damaged
/// chunk, so the device rows below ask for errors; and none reaches nvCOMP (undefined on malformed
/// input): the host check refuses it, or would leave it to c-blosc on a host thread.
#[test]
fn zarrs_refuses_the_damaged_blosc_chunks() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(FilesystemStore::new(dir.path())?);
    for (node, compressor, shuffle) in BLOSC_FAULT_ARRAYS {
        let array = make_blosc(store.clone(), node, compressor, shuffle)?;
        let key = array.chunk_key(&[0, 1]);
        let good = store.get(&key)?.ok_or("chunk [0, 1] missing")?.to_vec();
        for (what, bytes) in blosc_damage(&good, compressor)? {
            let verdict = check_chunk(&bytes, 256 << 10);
            assert!(!matches!(verdict, Ok(BloscVerdict::Device(_))), "{node}, {what}: {verdict:?}");
            store.set(&key, Bytes::from(bytes))?;
            assert!(zarrs_read(&array).is_err(), "{node}, {what}: zarrs decodes it");
        }
        store.set(&key, Bytes::from(good))?;
        zarrs_read(&array)?;
    }
    Ok(())
}

/// Damaged Blosc chunks (lz4 and zstd streams, on the device path): a header truncated, its
/// sizes lying, a block starting outside the chunk, a damaged LZ4 block or zstd frame. Each is
/// an error naming the chunk, as zarrs refuses it, and the next read is zarrs' data.
#[test]
#[ignore = "needs a CUDA GPU"]
fn damaged_blosc_chunks_are_errors_as_in_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let mut table = Vec::new();
    for (node, compressor, shuffle) in BLOSC_FAULT_ARRAYS {
        let array = make_blosc(store.clone(), node, compressor, shuffle)?;
        let report = check::<f32>(&array, &array.subset_all(), &posix())?;
        assert_eq!((report.decode, report.host_decoded_chunks), (DecodePath::Device, 0), "{node}: {report:?}");
        let key = array.chunk_key(&[0, 1]);
        let good = store.get(&key)?.ok_or("chunk [0, 1] missing")?.to_vec();
        for (what, bytes) in blosc_damage(&good, compressor)? {
            store.set(&key, Bytes::from(bytes))?;
            let host = zarrs_read(&array).map_or("error", |_| "data");
            let ours = outcome(&array, &key, &posix())?;
            assert!(host == "error" && ours.starts_with("error"), "{node}, {what}: zarrs {host}, ours {ours}");
            table.push(format!("| {node} | {what} | {host} | {ours} |"));
            store.set(&key, Bytes::from(good.clone()))?;
            check::<f32>(&array, &array.subset_all(), &posix())?;
        }
    }
    println!("| array | stored value | zarrs | ours |\n| --- | --- | --- | --- |\n{}", table.join("\n"));
    Ok(())
}

/// Blosc's zstd streams damaged within their blocks, where the host's walk of the frame's
/// headers cannot see it, under the default trust: our zstd kernels decode them (nvCOMP's may
/// hang on such input and lose the context), and each read is an error wherever zarrs (c-blosc,
/// libzstd) refuses the chunk, else zarrs' very data. The next read is zarrs' data.
#[test]
#[ignore = "needs a CUDA GPU"]
fn damaged_blosc_zstd_streams_are_errors_on_our_decoder() -> Result {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(GdsStore::new(dir.path())?);
    let array = make_blosc(store.clone(), "/blosc_zstd", BloscCompressor::Zstd, BloscShuffleMode::BitShuffle)?;
    let report = check::<f32>(&array, &array.subset_all(), &posix())?;
    assert_eq!(report.device_decoder.as_deref(), Some("blosc: ours"), "{report:?}");
    assert_eq!((report.decode, report.host_decoded_chunks), (DecodePath::Device, 0), "{report:?}");
    let key = array.chunk_key(&[0, 1]);
    let good = store.get(&key)?.ok_or("chunk [0, 1] missing")?.to_vec();
    let stream = first_compressed_stream(&good);
    let mut rng = StdRng::seed_from_u64(47);
    let (mut errors, mut data) = (0, 0);
    for k in 0..48 {
        // Past the frame's header (at most 18 bytes), into its blocks: bytes flipped, or runs
        // of zeros or ones.
        let at = rng.random_range(stream.start + 18..stream.end);
        let mut bytes = good.clone();
        match k % 3 {
            0 => bytes[at] ^= 1 << rng.random_range(0..8),
            1 => bytes[at..(at + 8).min(stream.end)].fill(0),
            _ => bytes[at..(at + 8).min(stream.end)].fill(0xFF),
        }
        store.set(&key, Bytes::from(bytes))?;
        let ours = outcome(&array, &key, &posix())?;
        if ours.starts_with("error") {
            errors += 1;
        } else {
            data += 1;
        }
    }
    println!("48 damaged zstd streams: {errors} errors, {data} reads of zarrs' data");
    assert!(errors > 0, "no damage was found");
    store.set(&key, Bytes::from(good))?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    Ok(())
}
