//! Placement of many decoded chunks into the output with one kernel launch per batch. The copy
//! engines (`cuMemcpy3DAsync`) take tens of microseconds per copy and crawl on short rows (1 MiB
//! chunks of 64^3 float32 have 256-byte rows): thousands of copies per read are a kernel's job.
//! The placement and gather kernels' sources are here, their launches and the tables they read;
//! they are compiled with NVRTC once per process with the other kernels and loaded once per
//! device context (`device/kernels.rs`). Without NVRTC, placement falls back to the copy engines
//! ([`copy_dtod`]). Missing chunks are placed from a block holding the fill value
//! (`ReadMemory::fill` in the decode stages), with the same copies as present ones.

use std::ffi::c_void;

use cudarc::driver::{sys, CudaStream, LaunchConfig, PushKernelArg};

use crate::device::kernels::Kernels;
use crate::error::GpuError;
use crate::pipeline::plan::Copy3D;

/// The placement (`place_copies`) and gather (`gather_elements`) kernels.
pub(crate) const SOURCE: &str = r#"
struct Copy3D {
    unsigned long long src_offset, dst_offset, width, height, depth, src_pitch, src_height, dst_pitch, dst_height;
};

// Block x: one copy (its source base in srcs); block y: parts of its slices, strided, each part
// PLACE_PART moves of one slice (so that a one-slice copy, a whole chunk, is not one block's).
// 16-byte moves when every address and pitch allows, bytes otherwise.
#define PLACE_PART 2048ull
extern "C" __global__ void place_copies(const Copy3D* copies, const unsigned long long* srcs, unsigned char* dst) {
    const Copy3D c = copies[blockIdx.x];
    const unsigned char* src = (const unsigned char*)srcs[blockIdx.x] + c.src_offset;
    unsigned char* out = dst + c.dst_offset;
    const unsigned long long src_slice = c.src_height * c.src_pitch, dst_slice = c.dst_height * c.dst_pitch;
    const bool vec = ((c.width | c.src_pitch | c.dst_pitch | src_slice | dst_slice | (unsigned long long)src |
                       (unsigned long long)out) & 15) == 0;
    const unsigned long long w = vec ? c.width / 16 : c.width, n = c.height * w;
    const unsigned long long parts = (n + PLACE_PART - 1) / PLACE_PART, tasks = c.depth * parts;
    for (unsigned long long t = blockIdx.y; t < tasks; t += gridDim.y) {
        const unsigned long long z = t / parts, end = n < (t - z * parts + 1) * PLACE_PART ? n : (t - z * parts + 1) * PLACE_PART;
        const unsigned char* s = src + z * src_slice;
        unsigned char* d = out + z * dst_slice;
        for (unsigned long long i = (t - z * parts) * PLACE_PART + threadIdx.x; i < end; i += blockDim.x) {
            const unsigned long long y = i / w, x = i - y * w;
            if (vec) ((uint4*)(d + y * c.dst_pitch))[x] = ((const uint4*)(s + y * c.src_pitch))[x];
            else d[y * c.dst_pitch + x] = s[y * c.src_pitch + x];
        }
    }
}

// Element-wise placement for chunks whose layout differs from the output's: a transposed chunk
// (transpose codec, v2 order F) has per-dimension strides of its own, a big-endian one needs its
// words swapped. Block x: one job; threads stride over the job's elements.
struct Gather {
    unsigned long long src, dst, count, ndim, elem, swap;
    unsigned long long extent[8], src_stride[8], dst_stride[8];
};

extern "C" __global__ void gather_elements(const Gather* jobs, unsigned char* out) {
    const Gather* g = jobs + blockIdx.x;
    const unsigned long long count = g->count, ndim = g->ndim, elem = g->elem, swap = g->swap;
    for (unsigned long long i = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.y * blockDim.x) {
        unsigned long long rest = i, s = 0, d = 0;
        for (int k = (int)ndim - 1; k >= 0; --k) {
            const unsigned long long n = g->extent[k];
            const unsigned long long x = rest % n;
            rest /= n;
            s += x * g->src_stride[k];
            d += x * g->dst_stride[k];
        }
        const unsigned char* from = (const unsigned char*)g->src + s;
        unsigned char* to = out + g->dst + d;
        if (swap > 1) {
            for (unsigned long long w = 0; w < elem; w += swap)
                for (unsigned long long b = 0; b < swap; ++b) to[w + b] = from[w + swap - 1 - b];
        } else {
            for (unsigned long long b = 0; b < elem; ++b) to[b] = from[b];
        }
    }
}
"#;

/// Dimensions a gather job can have.
pub(crate) const GATHER_DIMS: usize = 8;

/// One element-wise placement: `extent` elements of `elem` bytes from `src` (a device address,
/// strides in bytes per dimension) to offset `dst` of the output (strides likewise), each
/// element's `swap`-byte words reversed when `swap` > 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gather {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) elem: u64,
    pub(crate) swap: u64,
    pub(crate) extent: Vec<u64>,
    pub(crate) src_stride: Vec<u64>,
    pub(crate) dst_stride: Vec<u64>,
}

/// Byte strides of a chunk of `shape` (elements of `elem` bytes) as stored: C order, or the C order
/// of its transpose by `order` (stored dimension j is chunk dimension order[j]). Reads gather from
/// these strides, writes to them.
pub(crate) fn stored_strides(order: Option<&[usize]>, shape: &[u64], elem: u64) -> Vec<u64> {
    let c_strides = |shape: &[u64]| -> Vec<u64> {
        let mut strides = vec![elem; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        strides
    };
    match order {
        Some(order) => {
            let stored: Vec<u64> = order.iter().map(|&d| shape[d]).collect();
            let stored_strides = c_strides(&stored);
            let mut strides = vec![0; shape.len()];
            for (j, &d) in order.iter().enumerate() {
                strides[d] = stored_strides[j];
            }
            strides
        }
        None => c_strides(shape),
    }
}

const GATHER_WORDS: usize = 6 + 3 * GATHER_DIMS;

/// Bytes of the device table for `n` gather jobs.
pub(crate) fn gather_table_bytes(n: usize) -> usize {
    n * GATHER_WORDS * 8
}

/// The device table of `jobs` (the kernel's `Gather` layout).
pub(crate) fn encode_gather(jobs: &[Gather]) -> Vec<u64> {
    let mut words = Vec::with_capacity(jobs.len() * GATHER_WORDS);
    for g in jobs {
        let pad = |v: &[u64]| (0..GATHER_DIMS).map(|k| v.get(k).copied().unwrap_or(1)).collect::<Vec<_>>();
        words.extend([g.src, g.dst, g.extent.iter().product(), g.extent.len() as u64, g.elem, g.swap]);
        words.extend(pad(&g.extent));
        words.extend(pad(&g.src_stride));
        words.extend(pad(&g.dst_stride));
    }
    words
}

/// Moves of one slice a placement block takes at a time (`PLACE_PART` in the kernel).
const PLACE_PART: u64 = 2048;

/// Blocks a copy's slices split into (grid y): as many as its parts of [`PLACE_PART`] moves
/// (16 bytes each where aligned), the largest copy's, at most 65,535. A whole chunk placed as one
/// slice was one block's 4,096 moves a thread: 77 us for 1 MiB on an H100, a tenth of a B1
/// chunk's read (benches/RESULTS.md run DT1).
fn place_grid_y(copies: &[Copy3D]) -> u32 {
    let tasks =
        |c: &Copy3D| c.depth.saturating_mul((c.height.saturating_mul(c.width.div_ceil(16))).div_ceil(PLACE_PART));
    copies.iter().map(tasks).max().unwrap_or(1).clamp(1, 65_535) as u32
}

impl Kernels {
    /// Enqueue `copies` (each from `srcs[i]`) into `dst`; `table` is device memory holding the
    /// copies then the sources, as [`encode`] lays them out.
    ///
    /// # Safety
    /// Every copy must stay within its source and within `dst`; `table` must hold `encode`'s bytes.
    pub(crate) unsafe fn launch(
        &self,
        stream: &CudaStream,
        table: u64,
        copies: &[Copy3D],
        dst: u64,
    ) -> Result<(), GpuError> {
        if copies.is_empty() {
            return Ok(());
        }
        let blocks = grid_x(copies.len(), "placement copies")?;
        let srcs = table + (copies.len() * COPY_BYTES) as u64;
        let config =
            LaunchConfig { grid_dim: (blocks, place_grid_y(copies), 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut launch = stream.launch_builder(&self.function);
        launch.arg(&table).arg(&srcs).arg(&dst);
        // SAFETY: the kernel's parameters are three device addresses, as pushed; bounds are the
        // caller's contract.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the placement kernel"))?;
        Ok(())
    }
}

impl Kernels {
    /// Enqueue the gather `jobs` whose table (from [`encode_gather`]) is at `table`, into `dst`.
    ///
    /// # Safety
    /// Every job must stay within its source and within `dst`; `table` must hold the jobs.
    pub(crate) unsafe fn launch_gather(
        &self,
        stream: &CudaStream,
        table: u64,
        jobs: &[Gather],
        dst: u64,
    ) -> Result<(), GpuError> {
        if jobs.is_empty() {
            return Ok(());
        }
        let most = jobs.iter().map(|g| g.extent.iter().product::<u64>()).max().unwrap_or(1);
        let blocks = most.div_ceil(256).clamp(1, 256) as u32;
        let config = LaunchConfig {
            grid_dim: (grid_x(jobs.len(), "gather jobs")?, blocks, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.gather);
        launch.arg(&table).arg(&dst);
        // SAFETY: the kernel's parameters are two device addresses, as pushed; bounds are the
        // caller's contract.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the gather kernel"))?;
        Ok(())
    }
}

/// A launch's grid width for `n` blocks (one per entry), or an error past what a grid takes
/// (2^31 - 1) rather than a truncated cast.
fn grid_x(n: usize, what: &str) -> Result<u32, GpuError> {
    i32::try_from(n)
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| GpuError::Unsupported(format!("{n} {what} in one batch, more than a launch takes")))
}

const COPY_BYTES: usize = 9 * 8;

/// The widest row one entry of the placement table copies: wider rows become several entries,
/// column ranges of this width (a multiple of 16: 16-byte moves stay aligned). One block copies
/// an entry, so a long contiguous run is spread over many blocks, and no count in the kernel
/// comes near 32 bits.
pub(crate) const MAX_ROW: u64 = 1 << 30;

/// Table entries `copy` takes (see [`split_rows`]).
pub(crate) fn row_pieces(copy: &Copy3D) -> usize {
    copy.width.div_ceil(MAX_ROW).max(1) as usize
}

/// `copies` (each from `srcs[i]`) as placement table entries: a copy whose rows are wider than
/// `max_row` (a multiple of 16) becomes one copy per column range of `max_row` bytes, with the
/// same pitches, heights and depth.
pub(crate) fn split_rows(copies: &[Copy3D], srcs: &[u64], max_row: u64) -> (Vec<Copy3D>, Vec<u64>) {
    debug_assert!(max_row > 0 && max_row.is_multiple_of(16), "rows split at {max_row} bytes");
    let mut out = Vec::with_capacity(copies.len());
    let mut out_srcs = Vec::with_capacity(srcs.len());
    for (c, &src) in copies.iter().zip(srcs) {
        let mut at = 0;
        loop {
            let width = (c.width - at).min(max_row);
            out.push(Copy3D { src_offset: c.src_offset + at, dst_offset: c.dst_offset + at, width, ..*c });
            out_srcs.push(src);
            at += width;
            if at >= c.width {
                break;
            }
        }
    }
    (out, out_srcs)
}

/// Bytes of the device table for `n` copies.
pub(crate) fn table_bytes(n: usize) -> usize {
    n * (COPY_BYTES + 8)
}

/// The device table of `copies` (the kernel's `Copy3D` layout) followed by their sources.
pub(crate) fn encode(copies: &[Copy3D], srcs: &[u64]) -> Vec<u64> {
    let mut words = Vec::with_capacity(copies.len() * 10);
    for c in copies {
        words.extend([
            c.src_offset,
            c.dst_offset,
            c.width,
            c.height,
            c.depth,
            c.src_pitch,
            c.src_height,
            c.dst_pitch,
            c.dst_height,
        ]);
    }
    words.extend_from_slice(srcs);
    words
}

/// Enqueue a device-to-device strided copy on `stream`.
///
/// # Safety
/// Both bases plus the copy's extents must lie in valid device memory of the stream's context.
pub(crate) unsafe fn copy_dtod(
    copy: &Copy3D,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
    stream: &CudaStream,
) -> Result<(), GpuError> {
    let what = GpuError::cuda("placing chunk data on the device");
    let status = if copy.is_contiguous() {
        // SAFETY: the caller's contract.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst + copy.dst_offset,
                src + copy.src_offset,
                copy.width as usize,
                stream.cu_stream(),
            )
        }
    } else {
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        let p = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: device,
            srcHost: std::ptr::null::<c_void>(),
            srcDevice: src + copy.src_offset,
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: copy.src_pitch as usize,
            srcHeight: copy.src_height as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: device,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst + copy.dst_offset,
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: copy.dst_pitch as usize,
            dstHeight: copy.dst_height as usize,
            WidthInBytes: copy.width as usize,
            Height: copy.height as usize,
            Depth: copy.depth as usize,
        };
        // SAFETY: a device-to-device copy within the caller's buffers.
        unsafe { sys::cuMemcpy3DAsync_v2(&raw const p, stream.cu_stream()) }
    };
    status.result().map_err(what)
}

/// Enqueue a fill of `len` bytes at `dst` with the repeating `pattern` (1 to 16 bytes; patterns
/// of 1, 2 or 4 bytes are memsets, longer ones copy a seeded block that doubles).
///
/// # Safety
/// `dst..dst + len` must be valid device memory of the stream's context, `len` a multiple of
/// the pattern's length.
pub(crate) unsafe fn fill_pattern(
    pattern: &[u8],
    dst: sys::CUdeviceptr,
    len: usize,
    stream: &CudaStream,
) -> Result<(), GpuError> {
    let n = pattern.len();
    let what = GpuError::cuda("filling with the fill value");
    if len == 0 {
        return Ok(());
    }
    let s = stream.cu_stream();
    // SAFETY (all arms): within the caller's buffer.
    let status = unsafe {
        if pattern.iter().all(|&b| b == pattern[0]) {
            sys::cuMemsetD8Async(dst, pattern[0], len, s)
        } else if n == 2 {
            sys::cuMemsetD16Async(dst, u16::from_ne_bytes([pattern[0], pattern[1]]), len / 2, s)
        } else if n == 4 {
            sys::cuMemsetD32Async(dst, u32::from_ne_bytes(pattern.try_into().expect("4 bytes")), len / 4, s)
        } else {
            // Seed one element from the host (pageable: the driver copies it before returning),
            // then double the filled prefix with device copies.
            let status = sys::cuMemcpyHtoDAsync_v2(dst, pattern.as_ptr().cast(), n, s);
            if status != sys::CUresult::CUDA_SUCCESS {
                return status.result().map_err(what);
            }
            let mut filled = n;
            while filled < len {
                let step = filled.min(len - filled);
                let status = sys::cuMemcpyDtoDAsync_v2(dst + filled as u64, dst, step, s);
                if status != sys::CUresult::CUDA_SUCCESS {
                    return status.result().map_err(what);
                }
                filled += step;
            }
            sys::CUresult::CUDA_SUCCESS
        }
    };
    status.result().map_err(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(width: u64, height: u64, depth: u64) -> Copy3D {
        Copy3D {
            src_offset: 48,
            dst_offset: 16,
            width,
            height,
            depth,
            src_pitch: width + 32,
            src_height: height + 1,
            dst_pitch: width + 64,
            dst_height: height,
        }
    }

    #[test]
    fn rows_of_64_gib_and_more_split_into_entries_the_kernel_takes() {
        // 2^36 bytes divided by 16 is 2^32: the kernel's old 32-bit row count was 0 there.
        for width in [1u64 << 36, (1 << 36) + 48, (1 << 36) - 16, 5 << 36, MAX_ROW, MAX_ROW + 1, 16, 3] {
            let c = copy(width, 3, 2);
            let (pieces, srcs) = split_rows(&[c], &[1000], MAX_ROW);
            assert_eq!(pieces.len(), row_pieces(&c), "width {width}");
            assert_eq!(srcs, vec![1000; pieces.len()]);
            let mut at = 0;
            for p in &pieces {
                assert!(p.width > 0 && p.width <= MAX_ROW && p.width / 16 < 1 << 32, "width {width}: {p:?}");
                assert_eq!((p.src_offset, p.dst_offset), (c.src_offset + at, c.dst_offset + at));
                assert_eq!(
                    (p.height, p.depth, p.src_pitch, p.src_height),
                    (c.height, c.depth, c.src_pitch, c.src_height)
                );
                assert_eq!((p.dst_pitch, p.dst_height), (c.dst_pitch, c.dst_height));
                // Column ranges start at multiples of the split: 16-byte alignment is kept.
                assert_eq!(at % 16, 0);
                at += p.width;
            }
            assert_eq!(at, width);
        }
        assert_eq!(row_pieces(&copy(1 << 36, 1, 1)), 64);
    }

    #[test]
    fn launches_wider_than_a_grid_are_errors() {
        assert_eq!(grid_x(5, "copies").unwrap(), 5);
        assert_eq!(grid_x((1 << 31) - 1, "copies").unwrap(), (1 << 31) - 1);
        assert!(grid_x(1 << 31, "copies").unwrap_err().to_string().contains("2147483648 copies"));
    }

    #[test]
    fn split_rows_copy_what_the_whole_rows_copy() {
        // The same split at a width a test can hold: every byte lands where the unsplit copy puts it.
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        for width in [1u64, 16, 31, 32, 33, 100, 160] {
            let c = copy(width, 3, 2);
            let (mut whole, mut split) = (vec![0u8; 4096], vec![0u8; 4096]);
            c.apply_host(&src, &mut whole);
            let (pieces, _) = split_rows(&[c], &[0], 32);
            assert_eq!(pieces.len(), width.div_ceil(32) as usize);
            for p in &pieces {
                p.apply_host(&src, &mut split);
            }
            assert!(whole == split, "width {width}");
        }
    }
}
