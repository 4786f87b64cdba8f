//! Blosc's kernels: the assembly of decoded blocks (their streams gathered, byte or bit shuffle
//! undone), the fold of its streams' results into one status per chunk, and for writes the
//! shuffle (the assembly's inverse).

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// Mode of a [`Task`] or [`ShuffleTask`]: the bytes as they are, byte (un)shuffle, bit
/// (un)shuffle.
pub(super) const COPY: u32 = 0;
pub(crate) const BYTE: u32 = 1;
pub(crate) const BIT: u32 = 2;

/// A chunk whose streams nvCOMP failed or decoded to another length gets this status (or
/// nvCOMP's own, which is lower); one whose zlib stream's Adler-32 differs, [`ADLER_MISMATCH`].
pub(super) const SIZE_MISMATCH: u32 = 0x1000_0000;
pub(super) const ADLER_MISMATCH: u32 = 0x2000_0000;

/// Bytes of a block one thread block assembles at most, and at least (grid's y dimension:
/// 65,535 spans of the largest block).
const SPAN: u32 = 1 << 16;
const SPAN_MIN: u32 = 1 << 12;

pub(crate) const SOURCE: &str = r#"
struct BloscTask {
    unsigned long long dst;
    unsigned long long first;
    unsigned int len;
    unsigned int stream_len;
    unsigned int typesize;
    unsigned int mode;
};

// Byte q of a block whose streams (stream_len bytes each, the last possibly shorter) start at src.
__device__ __forceinline__ unsigned char blosc_byte(const unsigned char* const* src, unsigned int stream_len,
                                                    unsigned int q) {
    return src[q / stream_len][q % stream_len];
}

// One block per task (grid x), a span of it per thread block (grid y): output byte p is the
// shuffled byte c-blosc's unshuffle reads for it. Byte shuffle: byte j of element i is at
// j * n + i; bit shuffle (n a multiple of 8): bit b of byte j of element i is bit i % 8 of
// byte i / 8 of row j * 8 + b, rows n / 8 bytes long; bytes past the last element as they are.
extern "C" __global__ void blosc_assemble(const struct BloscTask* tasks, const unsigned long long* sources,
                                          unsigned int span) {
    const struct BloscTask t = tasks[blockIdx.x];
    const unsigned int begin = blockIdx.y * span;
    if (begin >= t.len) return;
    const unsigned int end = min(t.len - begin, span) + begin;
    const unsigned char* const* src = (const unsigned char* const*)(sources + t.first);
    unsigned char* dst = (unsigned char*)t.dst;
    const unsigned int T = t.typesize;
    const unsigned int n = t.len / T;
    const unsigned int whole = n * T;
    if (t.mode == 1 && t.stream_len == n && n > 0) {
        // Each stream one byte plane (byte j of element i at src[j][i]): a thread an element
        // whose first byte is in the span, no division a byte; the bytes past the last element
        // below, as they are.
        const unsigned int last = min(end / T + (end % T != 0), n);
        for (unsigned int i = begin / T + (begin % T != 0) + threadIdx.x; i < last; i += blockDim.x) {
            for (unsigned int j = 0; j < T; ++j) dst[i * T + j] = src[j][i];
        }
    }
    const unsigned int from = t.mode == 1 && t.stream_len == n && n > 0 ? max(begin, whole) : begin;
    for (unsigned int p = from + threadIdx.x; p < end; p += blockDim.x) {
        unsigned char v;
        if (t.mode == 1 && p < whole) {
            const unsigned int i = p / T, j = p - i * T;
            v = blosc_byte(src, t.stream_len, j * n + i);
        } else if (t.mode == 2 && p < whole) {
            const unsigned int i = p / T, j = p - i * T;
            const unsigned int row = n >> 3, at = i >> 3, bit = i & 7;
            v = 0;
            for (unsigned int b = 0; b < 8; ++b) {
                v |= ((blosc_byte(src, t.stream_len, (j * 8 + b) * row + at) >> bit) & 1) << b;
            }
        } else {
            v = blosc_byte(src, t.stream_len, p);
        }
        dst[p] = v;
    }
}

struct BloscShuffleTask {
    unsigned long long src;
    unsigned long long dst;
    unsigned int len;
    unsigned int typesize;
    unsigned int mode;
    unsigned int pad;
};

// The shuffle c-blosc applies before compressing a block, blosc_assemble's inverse: one block
// per task (grid x), a span of it per thread block (grid y); output byte q is computed from the
// element bytes it takes. Byte shuffle: q = j * n + i takes byte j of element i; bit shuffle
// (n a multiple of 8): bit k of byte `at` of row j * 8 + b is bit b of byte j of element
// at * 8 + k; bytes past the last element as they are.
extern "C" __global__ void blosc_shuffle(const struct BloscShuffleTask* tasks, unsigned int span) {
    const struct BloscShuffleTask t = tasks[blockIdx.x];
    const unsigned int begin = blockIdx.y * span;
    if (begin >= t.len) return;
    const unsigned int end = min(t.len - begin, span) + begin;
    const unsigned char* src = (const unsigned char*)t.src;
    unsigned char* dst = (unsigned char*)t.dst;
    const unsigned int T = t.typesize;
    const unsigned int n = t.len / T;
    const unsigned int whole = n * T;
    for (unsigned int q = begin + threadIdx.x; q < end; q += blockDim.x) {
        unsigned char v;
        if (t.mode == 1 && q < whole) {
            const unsigned int j = q / n, i = q - j * n;
            v = src[i * T + j];
        } else if (t.mode == 2 && q < whole) {
            const unsigned int row_len = n >> 3;
            const unsigned int r = q / row_len, at = q - r * row_len;
            const unsigned int j = r >> 3, b = r & 7;
            v = 0;
            for (unsigned int k = 0; k < 8; ++k) {
                v |= ((src[(at * 8 + k) * T + j] >> b) & 1) << k;
            }
        } else {
            v = src[q];
        }
        dst[q] = v;
    }
}

// A stream's result into its chunk's status: nvCOMP's status, else a length other than the
// stream's, else (zlib) an Adler-32 other than the stored one. The largest code wins.
extern "C" __global__ void blosc_fold(const unsigned int* statuses, const unsigned long long* actual,
                                      const unsigned long long* capacities, const unsigned int* unit_of,
                                      const unsigned int* adler, const unsigned int* adler_expected,
                                      const unsigned int* tags, unsigned long long n,
                                      unsigned int* unit_status) {
    const unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    unsigned int code = statuses[k];
    if (code == 0 && actual[k] != capacities[k]) code = 0x10000000u;
    if (code == 0 && adler != 0 && adler[k] != adler_expected[k]) code = 0x20000000u;
    if (code != 0 && code < 256u && tags != 0) code |= tags[k];
    if (code != 0) atomicMax(unit_status + unit_of[k], code);
}
"#;

/// One block to assemble (the kernel's `BloscTask`, 32 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(super) struct Task {
    /// Where the block's bytes go.
    pub(super) dst: u64,
    /// Index of the block's first stream address in the sources table.
    pub(super) first: u64,
    /// Bytes of the block.
    pub(super) len: u32,
    /// Bytes of each of its streams (the block's length when it is one stream).
    pub(super) stream_len: u32,
    /// Element size of the shuffle (1 when there is none).
    pub(super) typesize: u32,
    /// [`COPY`], [`BYTE`] or [`BIT`].
    pub(super) mode: u32,
}

/// Enqueue the assembly of `count` tasks (a device array at `tasks`; stream addresses at
/// `sources`), the longest `max_len` bytes, on `stream`.
///
/// # Safety
/// Each task's sources hold its block's bytes, and its destination room for them; the tables
/// are device memory ordered on `stream`.
pub(super) unsafe fn launch_assemble(
    kernels: &Kernels,
    stream: &CudaStream,
    tasks: u64,
    sources: u64,
    count: usize,
    max_len: u32,
) -> Result<(), GpuError> {
    if count == 0 || max_len == 0 {
        return Ok(());
    }
    let function = kernels.function("blosc_assemble")?;
    let grid_x =
        u32::try_from(count).map_err(|_| GpuError::Unsupported(format!("{count} Blosc blocks in one batch")))?;
    let span = assembly_span(count, max_len);
    let config =
        LaunchConfig { grid_dim: (grid_x, max_len.div_ceil(span), 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&function);
    launch.arg(&tasks).arg(&sources).arg(&span);
    // SAFETY: two device tables and the span, as the kernel takes them; the rest is the
    // caller's contract.
    unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching Blosc's block assembly"))?;
    Ok(())
}

/// The bytes of a block each thread block assembles: about a thousand thread blocks over the
/// batch (a B1 chunk's two blocks were 16 spans of 64 KiB, 112 us on an H100: benches/RESULTS.md
/// run DT1), from [`SPAN_MIN`] to [`SPAN`], and enough for the largest block in 65,535 spans.
fn assembly_span(count: usize, max_len: u32) -> u32 {
    let per = (count as u64 * u64::from(max_len) / 1024).clamp(u64::from(SPAN_MIN), u64::from(SPAN)) as u32;
    per.next_power_of_two().max(max_len.div_ceil(65_535))
}

/// One chunk to shuffle (the kernel's `BloscShuffleTask`, 32 bytes): `len` bytes from `src` to
/// `dst` in [`COPY`], [`BYTE`] or [`BIT`] mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct ShuffleTask {
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) len: u32,
    pub(crate) typesize: u32,
    pub(crate) mode: u32,
    pub(crate) pad: u32,
}

/// Enqueue the shuffle of `count` tasks (a device array at `tasks`), the longest `max_len`
/// bytes, on `stream`.
///
/// # Safety
/// Each task's source holds `len` readable bytes and its destination room for them, not
/// overlapping; the table is device memory ordered on `stream`.
pub(crate) unsafe fn launch_shuffle(
    kernels: &Kernels,
    stream: &CudaStream,
    tasks: u64,
    count: usize,
    max_len: u32,
) -> Result<(), GpuError> {
    if count == 0 || max_len == 0 {
        return Ok(());
    }
    let function = kernels.function("blosc_shuffle")?;
    let grid_x =
        u32::try_from(count).map_err(|_| GpuError::Unsupported(format!("{count} Blosc chunks in one batch")))?;
    let config =
        LaunchConfig { grid_dim: (grid_x, max_len.div_ceil(SPAN), 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&function);
    launch.arg(&tasks).arg(&SPAN);
    // SAFETY: a device table and the span, as the kernel takes them; the rest is the caller's
    // contract.
    unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching Blosc's shuffle"))?;
    Ok(())
}

/// The device arrays [`launch_fold`] reads, `n` entries each.
pub(super) struct FoldArrays {
    pub(super) statuses: u64,
    pub(super) actual: u64,
    pub(super) capacities: u64,
    pub(super) unit_of: u64,
    /// Adler-32 values and the stored ones (zlib streams), or 0 for none.
    pub(super) adler: u64,
    pub(super) adler_expected: u64,
    /// What a decoder's own code (below 256) gets or-ed in: its stream's tag; or 0 for none.
    pub(super) tags: u64,
}

/// Enqueue the fold of `n` streams' results into their units' statuses (`unit_status`, zeroed
/// before) on `stream`.
///
/// # Safety
/// The arrays are device memory of `n` entries (`unit_status`: one per unit any `unit_of`
/// names), ordered on `stream`.
pub(super) unsafe fn launch_fold(
    kernels: &Kernels,
    stream: &CudaStream,
    arrays: &FoldArrays,
    n: usize,
    unit_status: u64,
) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(n.div_ceil(256)).map_err(|_| GpuError::Unsupported(format!("{n} Blosc streams")))?;
    let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let a = arrays;
    let args =
        [a.statuses, a.actual, a.capacities, a.unit_of, a.adler, a.adler_expected, a.tags, n as u64, unit_status];
    // SAFETY: eight device addresses and a count, as the kernel takes them.
    unsafe { kernels.launch_u64(stream, "blosc_fold", config, &args, "launching Blosc's result fold") }
}

/// The host's version of the assembly of one block (the kernel's formula), for the tests that
/// compare it with c-blosc.
#[cfg(test)]
pub(super) fn assemble_on_host(task: &Task, streams: &[&[u8]], out: &mut [u8]) {
    let byte = |q: usize| streams[q / task.stream_len as usize][q % task.stream_len as usize];
    let t = task.typesize as usize;
    let n = task.len as usize / t;
    for (p, o) in out.iter_mut().enumerate().take(task.len as usize) {
        let (i, j) = (p / t, p % t);
        *o = match task.mode {
            BYTE if p < n * t => byte(j * n + i),
            BIT if p < n * t => {
                (0..8).fold(0u8, |v, b| v | (((byte((j * 8 + b) * (n / 8) + i / 8) >> (i % 8)) & 1) << b))
            }
            _ => byte(p),
        };
    }
}
