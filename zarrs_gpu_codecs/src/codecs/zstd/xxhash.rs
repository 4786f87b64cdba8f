//! XXH64 (seed 0) of decoded chunks on the device. A zstd frame whose header sets the checksum
//! flag ends with the low 32 bits of the XXH64 of its content; nvCOMP does not verify it (and
//! reports success on damaged frames), so this kernel does, before any data is returned.

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// Four threads per chunk, one per accumulator of XXH64's 32-byte stripes (the four are
/// independent until the merge), so that a warp reads whole stripes; the first of the four
/// merges them and hashes the tail. Inputs must be 8-byte aligned (decoded chunks are).
pub(crate) const SOURCE: &str = r#"
#define XXH_P1 11400714785074694791ULL
#define XXH_P2 14029467366897019727ULL
#define XXH_P3 1609587929392839161ULL
#define XXH_P4 9650029242287828579ULL
#define XXH_P5 2870177450012600261ULL

__device__ __forceinline__ unsigned long long xxh_rotl(unsigned long long x, int r) {
    return (x << r) | (x >> (64 - r));
}
__device__ __forceinline__ unsigned long long xxh_round(unsigned long long acc, unsigned long long input) {
    return xxh_rotl(acc + input * XXH_P2, 31) * XXH_P1;
}
__device__ __forceinline__ unsigned long long xxh_merge(unsigned long long h, unsigned long long v) {
    return (h ^ xxh_round(0, v)) * XXH_P1 + XXH_P4;
}

extern "C" __global__ void xxh64_chunks(const unsigned char* const* ptrs, const unsigned long long* sizes,
                                        unsigned long long n, unsigned int* out) {
    const unsigned long long chunk = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 2;
    const unsigned int lane = threadIdx.x & 3;
    const bool active = chunk < n;
    const unsigned char* p = active ? ptrs[chunk] : 0;
    const unsigned long long len = active ? sizes[chunk] : 0;
    const unsigned long long stripes = len / 32;
    unsigned long long v = lane == 0 ? XXH_P1 + XXH_P2 : lane == 1 ? XXH_P2 : lane == 2 ? 0 : 0 - XXH_P1;
    const unsigned long long* w = (const unsigned long long*)p + lane;
    unsigned long long s = 0;
    // Loads first, then the dependent rounds: four stripes in flight per thread.
    for (; s + 4 <= stripes; s += 4) {
        const unsigned long long a = w[4 * s], b = w[4 * s + 4], c = w[4 * s + 8], d = w[4 * s + 12];
        v = xxh_round(v, a);
        v = xxh_round(v, b);
        v = xxh_round(v, c);
        v = xxh_round(v, d);
    }
    for (; s < stripes; ++s) v = xxh_round(v, w[4 * s]);
    // Every thread of the warp takes part in the shuffles, inactive ones too.
    const unsigned int first = (threadIdx.x & 31) & ~3u;
    const unsigned long long v1 = __shfl_sync(0xffffffffu, v, first);
    const unsigned long long v2 = __shfl_sync(0xffffffffu, v, first + 1);
    const unsigned long long v3 = __shfl_sync(0xffffffffu, v, first + 2);
    const unsigned long long v4 = __shfl_sync(0xffffffffu, v, first + 3);
    if (!active || lane != 0) return;
    unsigned long long h;
    if (len >= 32) {
        h = xxh_rotl(v1, 1) + xxh_rotl(v2, 7) + xxh_rotl(v3, 12) + xxh_rotl(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = XXH_P5;
    }
    h += len;
    const unsigned char* q = p + stripes * 32;
    unsigned long long rest = len - stripes * 32;
    for (; rest >= 8; rest -= 8, q += 8) {
        h ^= xxh_round(0, *(const unsigned long long*)q);
        h = xxh_rotl(h, 27) * XXH_P1 + XXH_P4;
    }
    if (rest >= 4) {
        h ^= (unsigned long long)(*(const unsigned int*)q) * XXH_P1;
        h = xxh_rotl(h, 23) * XXH_P2 + XXH_P3;
        rest -= 4;
        q += 4;
    }
    for (; rest > 0; --rest, ++q) {
        h ^= (unsigned long long)(*q) * XXH_P5;
        h = xxh_rotl(h, 11) * XXH_P1;
    }
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    out[chunk] = (unsigned int)h;
}
"#;

impl Kernels {
    /// Enqueue the XXH64 of `n` device buffers (addresses at `ptrs`, lengths at `sizes`, u64 each)
    /// on `stream`, writing the low 32 bits of each to `out` (u32 each).
    ///
    /// # Safety
    /// `ptrs` and `sizes` must be device arrays of `n` entries describing readable, 8-byte aligned
    /// device buffers; `out` device memory for `n` u32; all ordered on `stream`.
    pub(crate) unsafe fn launch_xxh64(
        &self,
        stream: &CudaStream,
        ptrs: u64,
        sizes: u64,
        n: usize,
        out: u64,
    ) -> Result<(), GpuError> {
        if n == 0 {
            return Ok(());
        }
        // A batch holds far fewer than 2^30 chunks.
        let blocks = (n * 4).div_ceil(256) as u32;
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let n = n as u64;
        let mut launch = stream.launch_builder(&self.xxh64);
        launch.arg(&ptrs).arg(&sizes).arg(&n).arg(&out);
        // SAFETY: the kernel takes three device addresses and a count, as pushed; the buffers are
        // the caller's contract.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the XXH64 kernel"))?;
        Ok(())
    }
}
