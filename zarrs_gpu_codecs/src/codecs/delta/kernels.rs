//! The device's delta decode: each whole decoded chunk, in place in the batch's staging, replaced
//! by its running sum in C order before placement (one thread block per chunk).
//!
//! Integers: the sum wraps, so any order of additions gives numpy's result: a block scans tiles
//! of 1024 elements (4 consecutive per thread, warp shuffles, then the warps' totals), carrying
//! each tile's total into the next; the arithmetic is 64-bit, truncated to the element on store
//! (truncation commutes with wrapping addition). Floats: numpy adds one element after another,
//! and float addition is not associative, so one thread of the block sums each tile in order
//! (the others load and store it); `float16` sums round to half after every addition, as numpy
//! does (`float` arithmetic, then `cvt.rn`). Stored words in the other byte order are swapped
//! as they are read, so the sums are native for the placement copies. Chunks at any alignment.

use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use super::host::DeltaType;
use super::DeviceDelta;
use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// Chunks per launch: their table is passed by value, within the 4 KiB of kernel parameters.
pub(crate) const CHUNKS_PER_LAUNCH: usize = 240;

/// Threads per block (the kernel's `DELTA_THREADS`).
const THREADS: u32 = 256;

/// The kernel's parameter: chunk addresses and element counts, and how many.
#[repr(C)]
#[derive(Clone, Copy)]
struct DeltaChunks {
    ptr: [u64; CHUNKS_PER_LAUNCH],
    len: [u64; CHUNKS_PER_LAUNCH],
    count: u64,
}

// SAFETY: plain old data laid out as the kernel's `DeltaChunks` (repr(C), u64 fields only).
unsafe impl DeviceRepr for DeltaChunks {}

/// The kernel: `delta_scan(chunks, kind, swap)`, a block per chunk; `kind` 0 to 3: integers of
/// 1, 2, 4, 8 bytes; 4, 5, 6: float16, float32, float64.
pub(crate) const SOURCE: &str = r#"
#define DELTA_THREADS 256
#define DELTA_PER_THREAD 4
#define DELTA_TILE (DELTA_THREADS * DELTA_PER_THREAD)
#define DELTA_CHUNKS 240
struct DeltaChunks {
    unsigned long long ptr[DELTA_CHUNKS];
    unsigned long long len[DELTA_CHUNKS];
    unsigned long long count;
};
/// Element `i` of a chunk of `size`-byte words at `p`, as an integer (native after the swap).
__device__ __forceinline__ unsigned long long delta_load(const unsigned char* p, unsigned long long i,
                                                         unsigned int size, bool aligned, bool swap) {
    const unsigned char* q = p + i * size;
    unsigned long long v = 0;
    if (aligned) {
        switch (size) {
            case 1: v = *q; break;
            case 2: v = *(const unsigned short*)q; break;
            case 4: v = *(const unsigned int*)q; break;
            default: v = *(const unsigned long long*)q; break;
        }
    } else {
        for (unsigned int b = 0; b < size; ++b) v |= (unsigned long long)q[b] << (8 * b);
    }
    if (swap) {
        unsigned long long r = 0;
        for (unsigned int b = 0; b < size; ++b) r = (r << 8) | ((v >> (8 * b)) & 0xffULL);
        v = r;
    }
    return v;
}
/// Store the low `size` bytes of `v` (native order) as element `i`.
__device__ __forceinline__ void delta_store(unsigned char* p, unsigned long long i, unsigned int size,
                                            bool aligned, unsigned long long v) {
    unsigned char* q = p + i * size;
    if (aligned) {
        switch (size) {
            case 1: *q = (unsigned char)v; break;
            case 2: *(unsigned short*)q = (unsigned short)v; break;
            case 4: *(unsigned int*)q = (unsigned int)v; break;
            default: *(unsigned long long*)q = v; break;
        }
    } else {
        for (unsigned int b = 0; b < size; ++b) q[b] = (unsigned char)(v >> (8 * b));
    }
}
__device__ __forceinline__ float delta_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short delta_f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
/// The wrapping running sum of `n` integers of `size` bytes.
__device__ void delta_scan_int(unsigned char* p, unsigned long long n, unsigned int size, bool aligned, bool swap) {
    __shared__ unsigned long long warp_total[DELTA_THREADS / 32];
    const unsigned int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    unsigned long long carry = 0;
    for (unsigned long long base = 0; base < n; base += DELTA_TILE) {
        unsigned long long v[DELTA_PER_THREAD];
        unsigned long long local = 0;
        for (unsigned int k = 0; k < DELTA_PER_THREAD; ++k) {
            const unsigned long long i = base + (unsigned long long)t * DELTA_PER_THREAD + k;
            local += i < n ? delta_load(p, i, size, aligned, swap) : 0;
            v[k] = local;
        }
        // Inclusive scan of the threads' totals within the warp.
        unsigned long long incl = local;
        for (unsigned int d = 1; d < 32; d <<= 1) {
            const unsigned long long up = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += up;
        }
        if (lane == 31) warp_total[warp] = incl;
        __syncthreads();
        unsigned long long before = carry, tile = 0;
        for (unsigned int w = 0; w < DELTA_THREADS / 32; ++w) {
            if (w < warp) before += warp_total[w];
            tile += warp_total[w];
        }
        before += incl - local;
        for (unsigned int k = 0; k < DELTA_PER_THREAD; ++k) {
            const unsigned long long i = base + (unsigned long long)t * DELTA_PER_THREAD + k;
            if (i < n) delta_store(p, i, size, aligned, v[k] + before);
        }
        carry += tile;
        __syncthreads();
    }
}
/// The in-order running sum of `n` floats (`kind` 4, 5, 6: float16, float32, float64).
__device__ void delta_scan_float(unsigned char* p, unsigned long long n, unsigned int kind, bool aligned, bool swap) {
    __shared__ unsigned long long tile[DELTA_TILE];
    const unsigned int size = kind == 4 ? 2 : kind == 5 ? 4 : 8;
    const unsigned int t = threadIdx.x;
    unsigned long long acc = 0;
    for (unsigned long long base = 0; base < n; base += DELTA_TILE) {
        const unsigned long long m = n - base < DELTA_TILE ? n - base : DELTA_TILE;
        for (unsigned int k = t; k < m; k += DELTA_THREADS) tile[k] = delta_load(p, base + k, size, aligned, swap);
        __syncthreads();
        if (t == 0) {
            // numpy: out[0] = in[0] (so -0.0 stays), then out[i] = out[i - 1] + in[i].
            for (unsigned long long k = 0; k < m; ++k) {
                const unsigned long long x = tile[k];
                const bool first = base == 0 && k == 0;
                if (kind == 4) {
                    acc = first ? x : delta_f2h(delta_h2f((unsigned short)acc) + delta_h2f((unsigned short)x));
                } else if (kind == 5) {
                    const float s = first ? __uint_as_float((unsigned int)x)
                                          : __fadd_rn(__uint_as_float((unsigned int)acc), __uint_as_float((unsigned int)x));
                    acc = __float_as_uint(s);
                } else {
                    const double s = first ? __longlong_as_double((long long)x)
                                           : __dadd_rn(__longlong_as_double((long long)acc), __longlong_as_double((long long)x));
                    acc = (unsigned long long)__double_as_longlong(s);
                }
                tile[k] = acc;
            }
        }
        __syncthreads();
        for (unsigned int k = t; k < m; k += DELTA_THREADS) delta_store(p, base + k, size, aligned, tile[k]);
        __syncthreads();
    }
}
extern "C" __global__ void delta_scan(DeltaChunks chunks, unsigned int kind, unsigned int swap) {
    const unsigned long long c = blockIdx.x;
    if (c >= chunks.count) return;
    unsigned char* p = (unsigned char*)chunks.ptr[c];
    const unsigned long long n = chunks.len[c];
    const unsigned int size = kind == 0 ? 1 : kind == 1 || kind == 4 ? 2 : kind == 2 || kind == 5 ? 4 : 8;
    const bool aligned = ((unsigned long long)p % size) == 0;
    if (kind < 4) {
        delta_scan_int(p, n, size, aligned, swap != 0);
    } else {
        delta_scan_float(p, n, kind, aligned, swap != 0);
    }
}
"#;

/// The kernel's `kind` of a type.
fn kind(dtype: DeltaType) -> u32 {
    match dtype {
        DeltaType::I8 | DeltaType::U8 => 0,
        DeltaType::I16 | DeltaType::U16 => 1,
        DeltaType::I32 | DeltaType::U32 => 2,
        DeltaType::I64 | DeltaType::U64 => 3,
        DeltaType::F16 => 4,
        DeltaType::F32 => 5,
        DeltaType::F64 => 6,
    }
}

/// Enqueue on `stream` the running sum of each decoded chunk of `chunks` (device address, bytes:
/// whole chunks of `delta.dtype`, in staging the placement copies from next). Without NVRTC
/// (`kernels` None) there is no device delta: an error.
///
/// # Safety
/// Each chunk's bytes are device memory of that length, ordered on `stream` (decoded, or copied
/// there from the host, before this), used by nothing else until the placement that follows.
///
/// # Errors
/// No kernels, a chunk not a whole number of elements, or a launch that fails.
pub(crate) unsafe fn launch_delta_scan(
    kernels: Option<&Kernels>,
    stream: &CudaStream,
    delta: DeviceDelta,
    chunks: &[(u64, u64)],
) -> Result<(), GpuError> {
    if chunks.is_empty() {
        return Ok(());
    }
    let kernels =
        kernels.ok_or_else(|| GpuError::NoNvrtc("numcodecs.delta's running sum on the device needs it".into()))?;
    let size = delta.dtype.size() as u64;
    let function = kernels.function("delta_scan")?;
    let (kind, swap) = (kind(delta.dtype), u32::from(delta.swap));
    for group in chunks.chunks(CHUNKS_PER_LAUNCH) {
        let mut table = DeltaChunks { ptr: [0; CHUNKS_PER_LAUNCH], len: [0; CHUNKS_PER_LAUNCH], count: 0 };
        for (k, &(ptr, bytes)) in group.iter().enumerate() {
            if bytes % size != 0 {
                return Err(GpuError::Unsupported(format!(
                    "numcodecs.delta: a decoded chunk of {bytes} bytes is not whole {} elements",
                    delta.dtype
                )));
            }
            table.ptr[k] = ptr;
            table.len[k] = bytes / size;
        }
        table.count = group.len() as u64;
        let config =
            LaunchConfig { grid_dim: (group.len() as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut launch = stream.launch_builder(&function);
        launch.arg(&table).arg(&kind).arg(&swap);
        // SAFETY: the kernel takes the table by value and two u32, as pushed; each block touches
        // only its chunk's `len` elements, device memory the caller vouches for.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the delta scan kernel"))?;
    }
    Ok(())
}
