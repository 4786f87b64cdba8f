//! The deflate streams inside a batch's zlib streams, where nvCOMP can read them.
//!
//! nvCOMP's deflate decoder takes raw deflate: the bytes after a stream's 2-byte header and
//! before its 4-byte Adler-32. It wants each input 4-byte aligned (nvCOMP 6 asks 4 of deflate
//! inputs, `nvcompBatchedDeflateDecompressGetRequiredAlignments`), and a stored chunk starts at a
//! 256-byte boundary of the staging (an inner chunk of a shard wherever the shard puts it), so
//! the deflate stream 2 bytes in is never aligned for whole chunks. Sending those to host threads
//! would send all of them; instead a kernel copies every deflate stream to a 16-byte aligned
//! slot in the codec's scratch (one read and one write of the stored bytes, far less than
//! decoding them) and writes the pointer and size arrays nvCOMP reads, all on the batch's stream:
//! nothing goes through host memory, so nothing waits for the stream. Were nvCOMP to take inputs
//! at any byte, the kernel would only write the arrays, pointing into the stored bytes.
//!
//! The scratch: the two arrays, the slots (one per unit, each as long as the batch's longest
//! deflate stream, rounded to 16), then nvCOMP's own scratch. Before the batch's streams are seen
//! the slots are sized by the longest stream the host check lets through for the batch's largest
//! unit ([`payload_bound`]); `scratch_for` sizes them from the streams themselves.

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use super::stream::{payload_bound, HEADER, TRAILER};
use crate::device::kernels::Kernels;
use crate::error::GpuError;

/// What a stored unit holds around its deflate stream.
const WRAPPING: u64 = (HEADER + TRAILER) as u64;
/// Alignment of the arrays and of nvCOMP's scratch in the codec's scratch.
const ALIGN: usize = 256;
/// Alignment of each slot.
const SLOT_ALIGN: usize = 16;

/// The kernel: `zlib_payloads(inputs, sizes, n, slots, stride, out_ptrs, out_sizes)`, a block per
/// unit (grid stride). Unit `u`'s deflate stream (`inputs[u] + 2`, `sizes[u] - 6` bytes) is copied
/// to `slots + u * stride` (16-byte aligned) with aligned 4-byte loads shifted into place, or,
/// when `stride` is 0, left where it is; `out_ptrs[u]` and `out_sizes[u]` say where and how long.
/// Every load is of an aligned word holding a byte of the unit's stream or header, so none leaves
/// the buffer the unit lies in.
pub(crate) const SOURCE: &str = r#"
extern "C" __global__ void zlib_payloads(const unsigned char* const* inputs, const unsigned long long* sizes,
                                         unsigned long long n, unsigned char* slots, unsigned long long stride,
                                         unsigned long long* out_ptrs, unsigned long long* out_sizes) {
    for (unsigned long long u = blockIdx.x; u < n; u += gridDim.x) {
        const unsigned char* src = inputs[u] + 2;
        const unsigned long long len = sizes[u] - 6;
        unsigned char* dst = stride == 0 ? (unsigned char*)src : slots + u * stride;
        if (threadIdx.x == 0) {
            out_ptrs[u] = (unsigned long long)dst;
            out_sizes[u] = len;
        }
        if (stride == 0) continue;
        const unsigned int shift = (unsigned int)((unsigned long long)src & 3ULL);
        const unsigned int* words = (const unsigned int*)(src - shift);
        unsigned int* out = (unsigned int*)dst;
        const unsigned long long whole = len / 4;
        for (unsigned long long k = threadIdx.x; k < whole; k += blockDim.x) {
            unsigned int v = words[k];
            if (shift != 0) {
                const unsigned long long pair = (unsigned long long)words[k + 1] << 32 | v;
                v = (unsigned int)(pair >> (8 * shift));
            }
            out[k] = v;
        }
        for (unsigned long long j = 4 * whole + threadIdx.x; j < len; j += blockDim.x) dst[j] = src[j];
    }
}
"#;

/// Where a batch's arrays, slots and nvCOMP's scratch lie in the codec's scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Units.
    count: usize,
    /// Bytes from one slot to the next (0: nvCOMP reads the streams in place).
    pub(crate) stride: usize,
    /// Where the slots start.
    pub(crate) slots_at: usize,
    /// Where nvCOMP's scratch starts.
    pub(crate) nvcomp_at: usize,
}

impl Layout {
    /// The layout for `count` units whose longest deflate stream is `longest` bytes; `in_place`:
    /// nvCOMP takes the streams where they are (its input alignment is 1).
    pub(crate) fn new(count: usize, longest: u64, in_place: bool) -> Self {
        let stride =
            if in_place { 0 } else { usize::try_from(longest).unwrap_or(usize::MAX).saturating_add(SLOT_ALIGN - 1) };
        let stride = stride / SLOT_ALIGN * SLOT_ALIGN;
        let slots_at = round_up(count.saturating_mul(16));
        let nvcomp_at = round_up(slots_at.saturating_add(count.saturating_mul(stride)));
        Self { count, stride, slots_at, nvcomp_at }
    }

    /// Before the streams are seen: slots for the longest stream the host check passes for units
    /// of `max_decoded` bytes.
    pub(crate) fn bound(count: usize, max_decoded: usize, in_place: bool) -> Self {
        Self::new(count, payload_bound(max_decoded as u64), in_place)
    }

    /// From the batch's input sizes (host copies, one per unit: whole zlib streams).
    pub(crate) fn of_streams(stream_sizes: &[u64], in_place: bool) -> Self {
        let longest = stream_sizes.iter().map(|&s| s.saturating_sub(WRAPPING)).max().unwrap_or(0);
        Self::new(stream_sizes.len(), longest, in_place)
    }

    /// The scratch it takes with `nvcomp_temp` bytes for nvCOMP.
    pub(crate) fn bytes(&self, nvcomp_temp: usize) -> usize {
        self.nvcomp_at.saturating_add(nvcomp_temp)
    }

    /// Enqueue the kernel on `stream` for units at `inputs` (`sizes`: device arrays of `count`
    /// u64), with the scratch at `scratch`; returns the device arrays of the deflate streams'
    /// pointers and sizes.
    ///
    /// # Safety
    /// `inputs` and `sizes` describe `count` zlib streams of at least 8 bytes each and at most
    /// the longest this layout was made for, in device memory whose first byte is 4-byte aligned;
    /// `scratch` holds [`bytes`](Self::bytes) bytes (256-byte aligned); all ordered on `stream`.
    pub(crate) unsafe fn launch(
        &self,
        kernels: &Kernels,
        stream: &CudaStream,
        inputs: u64,
        sizes: u64,
        scratch: u64,
    ) -> Result<(u64, u64), GpuError> {
        let (ptrs, lens) = (scratch, scratch + 8 * self.count as u64);
        if self.count == 0 {
            return Ok((ptrs, lens));
        }
        let blocks = self.count.min(1 << 16) as u32;
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (n, slots, stride) = (self.count as u64, scratch + self.slots_at as u64, self.stride as u64);
        let function = kernels.function("zlib_payloads")?;
        let mut launch = stream.launch_builder(&function);
        launch.arg(&inputs).arg(&sizes).arg(&n).arg(&slots).arg(&stride).arg(&ptrs).arg(&lens);
        // SAFETY: the kernel takes two device arrays, a count, the slots' address, their stride
        // and two device arrays, as pushed; the memory is the caller's contract.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the zlib payload kernel"))?;
        Ok((ptrs, lens))
    }
}

fn round_up(n: usize) -> usize {
    n.saturating_add(ALIGN - 1) / ALIGN * ALIGN
}

/// The kernel's copy on the host, word for word: the deflate stream of the zlib stream at
/// `buffer[at..at + size]`, `buffer` starting at a 4-byte boundary.
#[cfg(test)]
fn copy_as_the_kernel(buffer: &[u8], at: usize, size: usize) -> Vec<u8> {
    let src = at + 2;
    let len = size - 6;
    let shift = src % 4;
    let word = |k: usize| u32::from_le_bytes(buffer[src - shift + 4 * k..][..4].try_into().expect("4 bytes"));
    let mut out = Vec::with_capacity(len);
    for k in 0..len / 4 {
        let mut v = word(k);
        if shift != 0 {
            v = ((u64::from(word(k + 1)) << 32 | u64::from(v)) >> (8 * shift)) as u32;
        }
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&buffer[src + 4 * (len / 4)..src + len]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_copy_is_the_deflate_stream_at_every_offset() {
        // Units packed one after another from every offset, as inner chunks of a shard lie; the
        // buffer ends right after the last (every word read holds one of its bytes).
        for size in [8usize, 9, 10, 11, 12, 13, 100, 1001] {
            for at in 0..8 {
                let buffer: Vec<u8> = (0..at + size).map(|i| (i * 37 + 11) as u8).collect();
                let copy = copy_as_the_kernel(&buffer, at, size);
                assert_eq!(copy, &buffer[at + 2..at + size - 4], "{size} bytes at {at}");
            }
        }
    }

    #[test]
    fn layouts_keep_slots_and_scratch_aligned_and_apart() {
        for (count, longest) in [(1usize, 2u64), (3, 17), (4096, 1 << 20), (1000, 12_345)] {
            let layout = Layout::new(count, longest, false);
            assert!(layout.stride as u64 >= longest && layout.stride.is_multiple_of(16), "{layout:?}");
            assert!(layout.slots_at >= 16 * count && layout.slots_at.is_multiple_of(256), "{layout:?}");
            assert!(
                layout.nvcomp_at >= layout.slots_at + count * layout.stride && layout.nvcomp_at.is_multiple_of(256)
            );
            assert_eq!(layout.bytes(1000), layout.nvcomp_at + 1000);
            let in_place = Layout::new(count, longest, true);
            assert_eq!((in_place.stride, in_place.nvcomp_at), (0, in_place.slots_at));
        }
        // The bound covers every stream the host check passes; the streams' own layout is smaller.
        let sizes = [1006u64, 506, 8];
        assert_eq!(Layout::of_streams(&sizes, false).stride, 1008);
        assert!(Layout::bound(3, 1000, false).stride >= Layout::of_streams(&sizes, false).stride);
    }
}
