//! Adler-32 (RFC 1950) of decoded buffers on the device: a zlib stream ends with the Adler-32 of
//! its decoded bytes, which nvCOMP's deflate decoder does not verify, so this kernel does, before
//! any data is returned (zlib chunks here; Blosc's zlib streams too).
//!
//! # The arithmetic
//!
//! Over bytes `b_0 .. b_{L-1}`, with `M = 65521`: `A = 1 + Σ b_k` and `B = L + Σ (L - k) b_k`,
//! both mod `M`; the Adler-32 is `B << 16 | A`. (`B` sums `A` after each byte: byte `k` is counted
//! in it `L - k` times, the initial 1 `L` times.) Split the bytes into segments; for a segment of
//! `m` bytes `c_0 .. c_{m-1}` followed by `after` more bytes of the buffer, byte `j` lies
//! `(m - j) + after` bytes from the end, so it contributes
//!
//! ```text
//! s1 = Σ c_j,   s2 = Σ (m - j) c_j,   and to B:  s2 + after · s1
//! ```
//!
//! and `A = 1 + Σ s1`, `B = L + Σ (s2 + after · s1)` over all segments, in any order, each term
//! reduced mod `M`. The kernel takes a thread block per buffer: the unaligned bytes before the
//! first 16-byte boundary and those after the last are a segment each (thread 0), every 16-byte
//! word between is a segment of its own, and thread `t` takes words `t, t + T, t + 2T, ...`
//! (coalesced loads). A thread keeps `after mod M` for its next word (it drops by `16 T` a word),
//! accumulates in 64 bits (a word adds less than `2^28.1` to its `B` sum) and reduces mod `M`
//! every 4096 words, long before either sum nears `2^64`. The threads' sums, each below `M`, are
//! added in shared memory. `adler32_as_the_kernel` (in the tests) is the same computation on the host,
//! tested against `adler2` in CI; the kernel itself runs in the GPU tests.

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// Adler-32's modulus, the largest prime below 2^16.
#[cfg(test)]
const MOD: u64 = 65_521;
/// Threads per block (the kernel's shared arrays have this many entries).
const THREADS: u32 = 256;
/// Words a thread sums between reductions mod `MOD`.
#[cfg(test)]
const REDUCE_EVERY: u64 = 4096;

/// The kernel: `adler32_buffers(ptrs, lens, n, out)`, one block of 256 threads per buffer (grid
/// stride), any alignment, any length.
pub(crate) const SOURCE: &str = r#"
#define ADLER_MOD 65521ULL
#define ADLER_THREADS 256
#define ADLER_REDUCE_EVERY 4096

/// s1 and s2 of one 4-byte part of a 16-byte word: bytes weighted w, w - 1, w - 2, w - 3.
__device__ __forceinline__ void adler_part(unsigned int x, unsigned int w, unsigned int* s1, unsigned int* s2) {
    const unsigned int b0 = x & 255u, b1 = (x >> 8) & 255u, b2 = (x >> 16) & 255u, b3 = x >> 24;
    *s1 += b0 + b1 + b2 + b3;
    *s2 += w * b0 + (w - 1u) * b1 + (w - 2u) * b2 + (w - 3u) * b3;
}

/// A short segment (fewer than 16 bytes) followed by `after` bytes, added to the sums.
__device__ void adler_bytes(const unsigned char* p, unsigned long long m, unsigned long long after,
                            unsigned long long* a, unsigned long long* b) {
    unsigned long long s1 = 0, s2 = 0;
    for (unsigned long long j = 0; j < m; ++j) {
        s1 += p[j];
        s2 += (m - j) * p[j];
    }
    *a += s1;
    *b += s2 + s1 * (after % ADLER_MOD);
}

extern "C" __global__ void adler32_buffers(const unsigned char* const* ptrs, const unsigned long long* lens,
                                           unsigned long long n, unsigned int* out) {
    __shared__ unsigned int sum_a[ADLER_THREADS];
    __shared__ unsigned int sum_b[ADLER_THREADS];
    const unsigned int t = threadIdx.x;
    for (unsigned long long u = blockIdx.x; u < n; u += gridDim.x) {
        const unsigned char* p = ptrs[u];
        const unsigned long long len = lens[u];
        const unsigned long long misaligned = (unsigned long long)p & 15ULL;
        unsigned long long head = misaligned == 0 ? 0 : 16 - misaligned;
        if (head > len) head = len;
        const unsigned long long words = (len - head) / 16;
        const unsigned long long tail_at = head + 16 * words;
        unsigned long long a = 0, b = 0;
        if (t == 0) {
            adler_bytes(p, head, len - head, &a, &b);
            adler_bytes(p + tail_at, len - tail_at, 0, &a, &b);
        }
        if (t < words) {
            const uint4* w = (const uint4*)(p + head);
            const unsigned long long step = (16ULL * ADLER_THREADS) % ADLER_MOD;
            unsigned long long after = (len - head - 16 * (t + 1)) % ADLER_MOD;
            unsigned long long since = 0;
            for (unsigned long long k = t; k < words; k += ADLER_THREADS) {
                const uint4 v = w[k];
                unsigned int s1 = 0, s2 = 0;
                adler_part(v.x, 16u, &s1, &s2);
                adler_part(v.y, 12u, &s1, &s2);
                adler_part(v.z, 8u, &s1, &s2);
                adler_part(v.w, 4u, &s1, &s2);
                a += s1;
                b += s2 + (unsigned long long)s1 * after;
                after = after >= step ? after - step : after + ADLER_MOD - step;
                if (++since == ADLER_REDUCE_EVERY) {
                    a %= ADLER_MOD;
                    b %= ADLER_MOD;
                    since = 0;
                }
            }
        }
        sum_a[t] = (unsigned int)(a % ADLER_MOD);
        sum_b[t] = (unsigned int)(b % ADLER_MOD);
        __syncthreads();
        for (unsigned int half = ADLER_THREADS / 2; half > 0; half >>= 1) {
            if (t < half) {
                sum_a[t] += sum_a[t + half];
                sum_b[t] += sum_b[t + half];
            }
            __syncthreads();
        }
        if (t == 0) {
            const unsigned long long A = (1 + sum_a[0]) % ADLER_MOD;
            const unsigned long long B = (len % ADLER_MOD + sum_b[0]) % ADLER_MOD;
            out[u] = (unsigned int)(B << 16 | A);
        }
        __syncthreads();
    }
}
"#;

/// Enqueue the Adler-32 of `count` device buffers (addresses at `ptrs`, lengths at `lens`, u64
/// each) on `stream`, writing each to `values` (u32 each). Any alignment and length.
///
/// # Safety
/// `ptrs` and `lens` must be device arrays of `count` entries describing readable device buffers;
/// `values` device memory for `count` u32; all ordered on `stream`.
pub(crate) unsafe fn launch_adler32(
    kernels: &Kernels,
    stream: &CudaStream,
    ptrs: u64,
    lens: u64,
    count: usize,
    values: u64,
) -> Result<(), GpuError> {
    if count == 0 {
        return Ok(());
    }
    // A block per buffer, at most 65536 blocks (each then takes several buffers in turn).
    let blocks = count.min(1 << 16) as u32;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let count = count as u64;
    let function = kernels.function("adler32_buffers")?;
    let mut launch = stream.launch_builder(&function);
    launch.arg(&ptrs).arg(&lens).arg(&count).arg(&values);
    // SAFETY: the kernel takes three device addresses and a count, as pushed; the buffers are the
    // caller's contract.
    unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the Adler-32 kernel"))?;
    Ok(())
}

/// A segment's sums (see the module docs): `(s1, s2)`, unreduced.
#[cfg(test)]
fn segment_sums(bytes: &[u8]) -> (u64, u64) {
    let m = bytes.len() as u64;
    bytes.iter().enumerate().fold((0, 0), |(s1, s2), (j, &c)| (s1 + u64::from(c), s2 + (m - j as u64) * u64::from(c)))
}

/// The Adler-32 of a buffer of `len` bytes from its segments' sums `(s1, s2, after)`, in any
/// order (each term reduced mod `MOD` as it is added).
#[cfg(test)]
fn combine(len: u64, segments: impl IntoIterator<Item = (u64, u64, u64)>) -> u32 {
    let (mut a, mut b) = (1u64, len % MOD);
    for (s1, s2, after) in segments {
        a = (a + s1 % MOD) % MOD;
        b = (b + s2 % MOD + (s1 % MOD) * (after % MOD)) % MOD;
    }
    (b << 16 | a) as u32
}

/// The kernel's computation on the host, step for step: `data` at an address `misaligned` bytes
/// past a 16-byte boundary, summed by `threads` threads.
#[cfg(test)]
fn adler32_as_the_kernel(data: &[u8], misaligned: usize, threads: usize) -> u32 {
    let len = data.len() as u64;
    let head = if misaligned.is_multiple_of(16) { 0 } else { (16 - misaligned % 16).min(data.len()) };
    let words = (data.len() - head) / 16;
    let tail_at = head + 16 * words;
    let bytes = |p: &[u8], after: u64, a: &mut u64, b: &mut u64| {
        let (s1, s2) = segment_sums(p);
        *a += s1;
        *b += s2 + s1 * (after % MOD);
    };
    let part = |x: u32, w: u32, s1: &mut u32, s2: &mut u32| {
        let [b0, b1, b2, b3] = x.to_le_bytes().map(u32::from);
        *s1 += b0 + b1 + b2 + b3;
        *s2 += w * b0 + (w - 1) * b1 + (w - 2) * b2 + (w - 3) * b3;
    };
    let (mut sum_a, mut sum_b) = (0u64, 0u64);
    for t in 0..threads {
        let (mut a, mut b) = (0u64, 0u64);
        if t == 0 {
            bytes(&data[..head], len - head as u64, &mut a, &mut b);
            bytes(&data[tail_at..], 0, &mut a, &mut b);
        }
        if t < words {
            let step = (16 * threads as u64) % MOD;
            let mut after = (len - head as u64 - 16 * (t as u64 + 1)) % MOD;
            let mut since = 0;
            for k in (t..words).step_by(threads) {
                let word = &data[head + 16 * k..][..16];
                let x = |i: usize| u32::from_le_bytes(word[4 * i..4 * i + 4].try_into().expect("4 bytes"));
                let (mut s1, mut s2) = (0u32, 0u32);
                part(x(0), 16, &mut s1, &mut s2);
                part(x(1), 12, &mut s1, &mut s2);
                part(x(2), 8, &mut s1, &mut s2);
                part(x(3), 4, &mut s1, &mut s2);
                a += u64::from(s1);
                b += u64::from(s2) + u64::from(s1) * after;
                after = if after >= step { after - step } else { after + MOD - step };
                since += 1;
                if since == REDUCE_EVERY {
                    (a, b, since) = (a % MOD, b % MOD, 0);
                }
            }
        }
        sum_a += a % MOD;
        sum_b += b % MOD;
    }
    let a = (1 + sum_a) % MOD;
    let b = (len % MOD + sum_b) % MOD;
    (b << 16 | a) as u32
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random()).collect()
    }

    /// Sizes around zlib's own reduction interval (5552), the word and block sizes, and larger.
    const SIZES: &[usize] =
        &[0, 1, 2, 15, 16, 17, 31, 33, 255, 256, 4095, 4096, 4097, 5551, 5552, 5553, 65_535, 65_536, 65_537, 100_003];

    #[test]
    fn the_kernels_arithmetic_is_adler32() {
        for (i, &n) in SIZES.iter().enumerate() {
            for data in [bytes(n, i as u64), vec![0xFF; n], vec![0; n]] {
                let want = adler2::adler32_slice(&data);
                for misaligned in [0, 1, 3, 8, 15] {
                    for threads in [1, 3, 256] {
                        assert_eq!(
                            adler32_as_the_kernel(&data, misaligned, threads),
                            want,
                            "{n} bytes at +{misaligned}, {threads} threads"
                        );
                    }
                }
            }
        }
    }

    /// All 0xFF, long enough that a thread reduces its sums between words (every 4096 words of
    /// 16 bytes: 64 KiB for one thread, 16 MiB for the kernel's 256).
    #[test]
    fn the_periodic_reduction_keeps_the_sums_exact() {
        let data = vec![0xFF; (REDUCE_EVERY as usize * 16) * 2 + 123];
        let want = adler2::adler32_slice(&data);
        for threads in [1, 2, 7] {
            assert_eq!(adler32_as_the_kernel(&data, 5, threads), want, "{threads} threads");
        }
    }

    #[test]
    fn segments_of_any_length_combine_in_any_order() {
        let data = bytes(20_000, 9);
        let want = adler2::adler32_slice(&data);
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        for _ in 0..200 {
            let mut cuts: Vec<usize> = (0..rng.random_range(0..20)).map(|_| rng.random_range(0..=data.len())).collect();
            cuts.extend([0, data.len()]);
            cuts.sort_unstable();
            let mut segments: Vec<(u64, u64, u64)> = cuts
                .windows(2)
                .map(|w| {
                    let (s1, s2) = segment_sums(&data[w[0]..w[1]]);
                    (s1, s2, (data.len() - w[1]) as u64)
                })
                .collect();
            segments.reverse();
            assert_eq!(combine(data.len() as u64, segments), want, "{cuts:?}");
        }
        assert_eq!(combine(0, []), 1);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_alignment_and_thread_count(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..3000),
            misaligned in 0..16usize,
            threads in 1..40usize,
        ) {
            proptest::prop_assert_eq!(adler32_as_the_kernel(&data, misaligned, threads), adler2::adler32_slice(&data));
        }
    }
}
