//! DLPack: a read's device array handed over without a copy (ordered on the consumer's stream),
//! and wrapped back, compared with zarrs' host read; refusals of what cannot be wrapped.

use zarrs::array::codec::{TransposeCodec, TransposeOrder};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, ArraySubset, FillValue};
use zarrs_gpu::zarrs_gpu_codecs::dlpark::ffi::{DataType as DlType, DeviceType};
use zarrs_gpu::zarrs_gpu_codecs::dlpark::traits::TensorView;
use zarrs_gpu::zarrs_gpu_codecs::DlpackStream;
use zarrs_gpu::{ArrayDeviceExt, DecodePath, DeviceArray, GdsStore};

use crate::compressed::{make_array, zstd};
use crate::{child_command, posix, Result};

/// A zstd array with edge chunks and missing ones (the fill value), a subset meeting both, and
/// zarrs' host bytes of it.
fn zstd_subset(dir: &std::path::Path) -> Result<(Array<GdsStore>, ArraySubset, Vec<u8>)> {
    let (shape, chunks) = ([37u64, 70, 33], [16u64, 32, 16]);
    let array = make_array(dir, data_type::float32(), FillValue::from(-7.5f32), &shape, &chunks, vec![zstd(3, false)])?;
    let subset = ArraySubset::new_with_ranges(&[3..37, 5..70, 0..31]);
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned();
    Ok((array, subset, want))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_arrays_go_out_and_come_back_through_dlpack() -> Result {
    let dir = tempfile::tempdir()?;
    let (array, subset, want) = zstd_subset(dir.path())?;
    for (round, how) in ["consumer stream", "synchronize", "legacy", "no sync"].into_iter().enumerate() {
        let (device, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &posix())?;
        let ptr = device.device_ptr();
        let consumer = device.stream().context().new_stream()?;
        let order = match how {
            "consumer stream" | "legacy" => DlpackStream::Stream(consumer.cu_stream()),
            "synchronize" => DlpackStream::Synchronize,
            _ => DlpackStream::NoSync,
        };
        if how == "legacy" {
            let tensor = device.into_dlpack_legacy(order)?;
            assert_eq!(tensor.shape(), &[34, 65, 31]);
            assert_eq!(tensor.data_ptr() as u64, ptr, "no copy");
            continue;
        }
        let tensor = device.into_dlpack(order)?;
        assert_eq!(tensor.shape(), &[34, 65, 31], "round {round}");
        assert!(tensor.strides().is_none(), "C order");
        assert_eq!(*tensor.data_type(), DlType::F32);
        assert_eq!(tensor.dl_tensor().device.device_type, DeviceType::Cuda);
        assert_eq!(tensor.data_ptr() as u64, ptr, "no copy");
        assert!(!tensor.read_only());
        consumer.synchronize()?;
        // Wrapped back (another library's tensor): the same memory, zarrs' elements.
        let back = DeviceArray::<f32>::from_dlpack(tensor, data_type::float32())?;
        assert_eq!(back.device_ptr(), ptr);
        assert_eq!(back.shape(), &[34, 65, 31]);
        assert!(back.as_cuda_slice().is_none(), "another library's memory is not ours to free");
        assert!(back.to_host_bytes()? == want, "{how}: the elements differ from zarrs'");
        // Handed back, then dropped: that releases the tensor, whose deleter frees the read's memory.
        assert!(back.into_parts().is_err(), "wrapped memory is not ours to hand out");
    }
    // Wrapped as another element type: refused.
    let (device, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &posix())?;
    let tensor = device.into_dlpack(DlpackStream::Synchronize)?;
    let err = DeviceArray::<u32>::from_dlpack(tensor, data_type::uint32()).unwrap_err();
    assert!(err.to_string().contains("not uint32"), "{err}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn progress_is_reported_batch_by_batch() -> Result {
    use std::sync::{Arc, Mutex};
    use zarrs_gpu::zarrs_gpu_codecs::Progress;
    let dir = tempfile::tempdir()?;
    // 64 chunks of 256 KiB decoded, staged 1 MiB at a time: many batches.
    let (shape, chunks) = ([64u64, 256, 256], [16u64, 64, 64]);
    let array =
        make_array(dir.path(), data_type::float32(), FillValue::from(1.5f32), &shape, &chunks, vec![zstd(3, false)])?;
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let log = seen.clone();
    let config = posix().with_staging_bytes(1 << 20).with_progress(move |p| log.lock().unwrap().push(p));
    let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &config)?;
    let want = array.retrieve_array_subset::<ArrayBytes<'static>>(&array.subset_all())?.into_fixed()?.into_owned();
    assert!(device.to_host_bytes()? == want);
    let seen = seen.lock().unwrap();
    assert!(seen.len() >= 4, "one report per batch: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0].done < w[1].done && w[0].total == w[1].total), "{seen:?}");
    let last = seen.last().ok_or("no progress")?;
    assert_eq!((last.done, last.total), (report.chunks, report.chunks), "{seen:?}");
    Ok(())
}

/// A read's `Cancel` thrown between batches (here from its progress callback) ends it with
/// `Cancelled`, the batches placed before kept and nothing written after; one thrown before the
/// read writes nothing.
#[test]
#[ignore = "needs a CUDA GPU"]
#[allow(clippy::float_cmp)] // exact values: each element is the read's or the old one
fn a_cancelled_read_stops_writing_its_output() -> Result {
    use zarrs_gpu::zarrs_gpu_codecs::Cancel;
    use zarrs_gpu::GpuError;
    let dir = tempfile::tempdir()?;
    let (shape, chunks) = ([64u64, 256, 256], [16u64, 64, 64]);
    let array =
        make_array(dir.path(), data_type::float32(), FillValue::from(1.5f32), &shape, &chunks, vec![zstd(3, false)])?;
    let values: Vec<f32> = (0..shape.iter().product::<u64>()).map(|i| (i % 1013) as f32 * 0.5).collect();
    array.store_array_subset(&array.subset_all(), values.clone())?;
    // The destination starts as -1 everywhere (an array with no chunks and that fill value).
    let blank = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type::float32(), FillValue::from(-1f32))
        .build(std::sync::Arc::new(zarrs::storage::store::MemoryStore::new()), "/")?;
    let all = array.subset_all();
    // Thrown before the read: nothing is written.
    let (mut out, _) = blank.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&all, &posix())?;
    let cancel = Cancel::new();
    cancel.cancel();
    let err = array.retrieve_array_subset_into_device_opt(&all, &mut out, &posix().with_cancel(cancel)).unwrap_err();
    assert!(matches!(err, GpuError::Cancelled), "{err}");
    assert!(out.to_host()?.iter().all(|&v| v == -1.0), "a read cancelled before it began wrote its output");
    // Thrown after the first batch: the read stops, some of the output never written.
    let cancel = Cancel::new();
    let thrower = cancel.clone();
    let config = posix().with_staging_bytes(1 << 20).with_cancel(cancel).with_progress(move |_| thrower.cancel());
    let err = array.retrieve_array_subset_into_device_opt(&all, &mut out, &config).unwrap_err();
    assert!(matches!(err, GpuError::Cancelled), "{err}");
    let got = out.to_host()?;
    let written = got.iter().zip(&values).filter(|(g, v)| g == v).count();
    let untouched = got.iter().filter(|&&g| g == -1.0).count();
    assert_eq!(written + untouched, got.len(), "only the read's values or the old ones");
    assert!(untouched >= got.len() / 2, "the read went on after it was cancelled: {written} of {} written", got.len());
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_land_in_memory_the_caller_holds() -> Result {
    use zarrs_gpu::GpuError;
    let dir = tempfile::tempdir()?;
    let (shape, chunks) = ([37u64, 70, 33], [16u64, 32, 16]);
    let want_of = |array: &zarrs::array::Array<zarrs_gpu::GdsStore>, subset: &ArraySubset| -> Result<Vec<u8>> {
        Ok(array.retrieve_array_subset::<ArrayBytes<'static>>(subset)?.into_fixed()?.into_owned())
    };
    let zstd_array =
        make_array(dir.path(), data_type::float32(), FillValue::from(-7.5f32), &shape, &chunks, vec![zstd(3, false)])?;
    let host_dir = tempfile::tempdir()?;
    // Two transposes in a row have no device plan: zarrs decodes on the host, then one copy into
    // the destination.
    let transpose = |order: &[usize]| -> Result<std::sync::Arc<TransposeCodec>> {
        Ok(std::sync::Arc::new(TransposeCodec::new(TransposeOrder::new(order)?)))
    };
    let host_array = ArrayBuilder::new(shape.to_vec(), chunks.to_vec(), data_type::float32(), 2.0f32)
        .array_to_array_codecs(vec![transpose(&[2, 1, 0])?, transpose(&[2, 1, 0])?])
        .bytes_to_bytes_codecs(vec![zstd(3, false)])
        .build(std::sync::Arc::new(GdsStore::new(host_dir.path())?), "/z")?;
    host_array.store_metadata()?;
    let values: Vec<f32> = (0..shape.iter().product::<u64>()).map(|i| (i % 1013) as f32 * 0.5).collect();
    host_array.store_array_subset(&host_array.subset_all(), values)?;
    let a = ArraySubset::new_with_ranges(&[3..20, 5..70, 0..31]);
    let b = ArraySubset::new_with_ranges(&[20..37, 0..65, 2..33]);
    let (_, report) = host_array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&a, &posix())?;
    assert_eq!(report.decode, DecodePath::Host, "{report:?}");
    for (name, array) in [("zstd (device decode)", &zstd_array), ("two transposes (host decode)", &host_array)] {
        // Into an array of ours: subset a's result, overwritten by subset b (the same size).
        let (mut out, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&a, &posix())?;
        let report = array.retrieve_array_subset_into_device_opt(&b, &mut out, &posix())?;
        assert!(out.to_host_bytes()? == want_of(array, &b)?, "{name}: into our array ({report:?})");
        // Into another library's memory (a DLPack tensor), with one dimension of extent 1 dropped.
        let plane = ArraySubset::new_with_ranges(&[7..8, 0..70, 0..33]);
        let (mine, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(
            &ArraySubset::new_with_ranges(&[0..1, 0..70, 0..33]),
            &posix(),
        )?;
        let mine = mine.reshape(vec![70, 33])?;
        let ptr = mine.device_ptr();
        let mut foreign =
            DeviceArray::<f32>::from_dlpack(mine.into_dlpack(DlpackStream::Synchronize)?, data_type::float32())?;
        array.retrieve_array_subset_into_device_opt(&plane, &mut foreign, &posix())?;
        assert_eq!(foreign.device_ptr(), ptr, "{name}: in place");
        assert!(foreign.to_host_bytes()? == want_of(array, &plane)?, "{name}: into a DLPack tensor");
        // A destination of another size: refused, naming both sizes.
        let err = array.retrieve_array_subset_into_device_opt(&a, &mut foreign, &posix()).unwrap_err();
        assert!(matches!(err, GpuError::Unsupported(_)) && err.to_string().contains("expected"), "{name}: {err}");
    }
    Ok(())
}

/// Reads, copies back, DLPack export and import, the deleter and drops leave the calling thread's
/// current CUDA context as it was (cudarc binds the device's context and never restores the
/// caller's, which sent PyTorch's and CuPy's next allocations to the read's device). Shown with a
/// context of the test's own current (not the primary context reads use), then with none.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_callers_current_context_is_left_as_it_was() -> Result {
    use cudarc::driver::{result, sys};
    let dir = tempfile::tempdir()?;
    let (array, subset, want) = zstd_subset(dir.path())?;
    result::init()?;
    let mut ours: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a fresh context of device 0 (made current by the call), destroyed at the end.
    unsafe { sys::cuCtxCreate_v4(&raw mut ours, std::ptr::null_mut(), 0, result::device::get(0)?) }.result()?;
    let current = || -> Result<sys::CUcontext> { Ok(result::ctx::get_current()?.unwrap_or(std::ptr::null_mut())) };
    for before in [ours, std::ptr::null_mut()] {
        // SAFETY: our live context, or none.
        unsafe { result::ctx::set_current(before) }?;
        let same = |what: &str| -> Result {
            assert_eq!(current()?, before, "{what} changed the current context");
            Ok(())
        };
        let (device, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &posix())?;
        same("a read")?;
        assert!(device.to_host_bytes()? == want, "the elements differ from zarrs'");
        same("a copy to the host")?;
        let tensor = device.into_dlpack(DlpackStream::Synchronize)?;
        same("a DLPack export")?;
        let back = DeviceArray::<f32>::from_dlpack(tensor, data_type::float32())?;
        same("a DLPack import")?;
        drop(back);
        same("the DLPack deleter")?;
        let (device, _) = array.retrieve_chunk_device_opt::<DeviceArray<f32>>(&[1, 1, 1], &posix())?;
        drop(device);
        same("a chunk read and its drop")?;
        zarrs_gpu::memory_in_use(0)?;
        same("memory_in_use")?;
    }
    // SAFETY: the test's context, current nowhere now.
    unsafe { sys::cuCtxDestroy_v2(ours) }.result()?;
    Ok(())
}

/// The variable that makes this test binary a child running the release during a hung batch.
const RELEASE_CHILD: &str = "ZARRS_GPU_TEST_RELEASE_CHILD";

/// A DLPack deleter (a consumer dropping its tensor) while a batch of another read never ends:
/// the release waits for the device only as long as the context lives; once the hung read times
/// out and the context is lost, it returns and leaves the memory leaked. It waited on the host
/// for the device without bound (and, from Python, holding the interpreter lock): `del t` never
/// returned. In a child process, since the context stays lost.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_release_during_a_hung_batch_returns() -> Result {
    use std::time::{Duration, Instant};
    if std::env::var_os(RELEASE_CHILD).is_some() {
        return release_child();
    }
    let mut child = child_command("dlpack::a_release_during_a_hung_batch_returns", &[(RELEASE_CHILD, Some("1"))])?
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > Duration::from_mins(2) {
            child.kill()?;
            return Err("the child process hung: the release never returned".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed ({:?}):\n{text}", out.status);
    let released = text.lines().find_map(|l| l.split_once("RELEASED ").map(|(_, s)| s)).ok_or(text.clone())?;
    let secs: f64 = released.trim_end_matches('s').parse()?;
    // The hung read's bound is 3 s; the release started 1 s into it.
    assert!(secs < 20.0, "the release took {secs} s:\n{text}");
    assert!(text.contains("READ ") && text.contains("did not finish"), "{text}");
    Ok(())
}

fn release_child() -> Result {
    use std::time::{Duration, Instant};
    use zarrs_gpu::zarrs_gpu_codecs::InjectedFault;
    let dir = tempfile::tempdir()?;
    let array = make_array(
        dir.path(),
        data_type::float32(),
        FillValue::from(0f32),
        &[64, 256],
        &[32, 128],
        vec![zstd(3, false)],
    )?;
    let (exported, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &posix())?;
    let tensor = exported.into_dlpack(DlpackStream::NoSync)?;
    let hung = posix().with_batch_timeout(Some(Duration::from_secs(3))).with_injected_fault(Some(InjectedFault::Hang));
    std::thread::scope(|scope| -> Result {
        let read = scope.spawn(|| {
            array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &hung).map(|_| ())
        });
        // Long enough for the read to launch its never-ending kernel, well before its bound.
        std::thread::sleep(Duration::from_secs(1));
        let start = Instant::now();
        drop(tensor);
        println!("RELEASED {:.1}s", start.elapsed().as_secs_f64());
        let err = read.join().map_err(|_| "the hung read panicked")?.err().ok_or("the hung read succeeded")?;
        println!("READ {err}");
        Ok(())
    })?;
    // Leave at once: a kernel that never ends may keep the driver's exit handlers waiting.
    std::io::Write::flush(&mut std::io::stdout())?;
    // SAFETY: ends the process without running exit handlers; nothing is left to flush.
    unsafe { libc::_exit(0) }
}

/// A kernel that spins for a given time on the GPU's clock. Loaded once, before any launch:
/// loading a module waits for the context's work, so a second load would wait out the first
/// spin.
fn spinner(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> Result<cudarc::driver::CudaFunction> {
    const SPIN: &str = r#"
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start >= ns) break;
    }
}"#;
    let ptx = cudarc::nvrtc::compile_ptx(SPIN)?;
    Ok(ctx.load_module(ptx)?.load_function("spin")?)
}

/// Spin `ms` milliseconds on `stream`.
fn spin(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    function: &cudarc::driver::CudaFunction,
    ms: u32,
) -> Result {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let ns = u64::from(ms) * 1_000_000;
    let mut launch = stream.launch_builder(function);
    launch.arg(&ns);
    // SAFETY: the kernel takes one u64 and touches no memory.
    unsafe { launch.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }?;
    Ok(())
}

/// Releasing a tensor handed out on a consumer's stream waits for neither the device nor that
/// stream on the host: a long kernel on another stream (and one on the consumer's own) is still
/// running when the release returns.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_release_waits_for_the_consumers_stream_not_the_device() -> Result {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir()?;
    let (array, subset, _) = zstd_subset(dir.path())?;
    let (device, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &posix())?;
    let ctx = device.stream().context().clone();
    let (other, consumer) = (ctx.new_stream()?, ctx.new_stream()?);
    let function = spinner(&ctx)?;
    let tensor = device.into_dlpack(DlpackStream::Stream(consumer.cu_stream()))?;
    spin(&other, &function, 3000)?;
    spin(&consumer, &function, 2000)?;
    let (other_done, consumer_done) = (other.record_event(None)?, consumer.record_event(None)?);
    let start = Instant::now();
    drop(tensor);
    let took = start.elapsed();
    assert!(took < Duration::from_millis(500), "the release waited {took:?}");
    assert!(!other_done.is_complete() && !consumer_done.is_complete(), "the kernels ended before the release");
    other.synchronize()?;
    consumer.synchronize()?;
    // Undeclared streams: the whole device, as before (the other stream's kernel is waited for).
    let (device, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &posix())?;
    let tensor = device.into_dlpack(DlpackStream::NoSync)?;
    spin(&other, &function, 1000)?;
    let other_done = other.record_event(None)?;
    drop(tensor);
    assert!(other_done.is_complete(), "an undeclared consumer's release waits for the device");
    Ok(())
}
