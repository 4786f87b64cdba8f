//! Device memory beside another allocator: reads on a device that PyTorch or CuPy has filled, as a
//! training job does, fit their batches to what is free and use what our own pools hold idle;
//! every result compared with zarrs' host read.

use std::sync::Arc;

use cudarc::driver::{result, CudaContext};
use zarrs::array::{data_type, ArraySubset, FillValue};
use zarrs_gpu::zarrs_gpu_codecs::reader::cuda_context;
use zarrs_gpu::{empty_cache, memory_in_use};

use super::compressed::{make_array, zstd};
use super::{check, posix, Result};

/// Device memory held by someone else (the other allocator of the process), freed on drop.
struct Filler {
    ptr: u64,
    ctx: Arc<CudaContext>,
}

impl Filler {
    /// Take all of device 0's free memory but `leave` bytes.
    fn leaving(leave: u64) -> Result<Self> {
        let ctx = cuda_context(0)?;
        ctx.bind_to_thread()?;
        let (free, _) = result::mem_get_info()?;
        let take = (free as u64).checked_sub(leave).ok_or(format!("{free} bytes free, fewer than {leave}"))?;
        // SAFETY: a plain allocation, freed on drop.
        let ptr = unsafe { result::malloc_sync(take as usize) }?;
        Ok(Self { ptr, ctx })
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated in leaving(); nothing uses it.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// 128 MiB of float32 in zstd chunks of 1 MiB (every fifth missing), all on nvCOMP: the read
/// that wants the most device memory for its output (nvCOMP's scratch is about three times a
/// batch's decoded bytes).
fn array(dir: &std::path::Path) -> Result<zarrs::array::Array<zarrs_gpu::GdsStore>> {
    make_array(
        dir,
        data_type::float32(),
        FillValue::from(1.5f32),
        &[128, 512, 512],
        &[32, 64, 128],
        vec![zstd(3, false)],
    )
}

/// With the device filled but for the output and half as much again, the read shrinks its
/// batches (it took more than three times its output unconstrained), stays within what was
/// free, and returns zarrs' values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_read_on_a_filled_device_fits_its_batches_to_what_is_free() -> Result {
    let dir = tempfile::tempdir()?;
    let array = array(dir.path())?;
    let all = array.subset_all();
    let out = all.num_elements() * 4;
    empty_cache()?;
    let roomy = check::<f32>(&array, &all, &posix())?;
    assert!(roomy.peak_device_bytes > 3 * out, "unconstrained, the read took {}", roomy.peak_device_bytes);
    empty_cache()?;
    let leave = out + out / 2;
    let filler = Filler::leaving(leave)?;
    let tight = check::<f32>(&array, &all, &posix())?;
    assert!(tight.peak_device_bytes <= leave, "{} bytes taken of {leave} free", tight.peak_device_bytes);
    assert!(tight.peak_device_bytes > out && tight.chunks == roomy.chunks, "{tight:?}");
    // A subset too, with its partial chunks.
    let part = ArraySubset::new_with_ranges(&[3..120, 17..500, 5..509]);
    check::<f32>(&array, &part, &posix())?;
    drop(filler);
    Ok(())
}

/// Our pools hold hundreds of MiB idle after a large read; another allocator then takes all
/// the rest. A small read, whose staging no pooled buffer serves (each is far larger), must get
/// its memory from the pools rather than fail with CUDA_ERROR_OUT_OF_MEMORY.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_read_on_a_full_device_takes_what_our_pools_hold_idle() -> Result {
    let dir = tempfile::tempdir()?;
    let array = array(dir.path())?;
    empty_cache()?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let pooled = memory_in_use(0)?;
    assert!(pooled.staging_pooled >= 256 << 20, "{pooled:?}");
    let filler = Filler::leaving(1 << 20)?;
    // 4 chunks of 1 MiB, two of them partial.
    let tile = ArraySubset::new_with_ranges(&[30..34, 60..68, 0..128]);
    let report = check::<f32>(&array, &tile, &posix())?;
    assert!(report.peak_device_bytes > 0, "{report:?}");
    drop(filler);
    Ok(())
}
