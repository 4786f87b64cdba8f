//! Placement of many decoded chunks into the output with one kernel launch per batch. The copy
//! engines (`cuMemcpy3DAsync`) take tens of microseconds per copy and crawl on short rows (1 MiB
//! chunks of 64^3 float32 have 256-byte rows): thousands of copies per read are a kernel's job.
//! The kernel is compiled once per process with NVRTC; without NVRTC, placement falls back to the
//! copy engines.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use crate::plan::Copy3D;
use crate::GpuError;

const SOURCE: &str = r#"
struct Copy3D {
    unsigned long long src_offset, dst_offset, width, height, depth, src_pitch, src_height, dst_pitch, dst_height;
};

// Block x: one copy (its source base in srcs); block y: slices, strided. 16-byte moves when
// every address and pitch allows, bytes otherwise.
extern "C" __global__ void place_copies(const Copy3D* copies, const unsigned long long* srcs, unsigned char* dst) {
    const Copy3D c = copies[blockIdx.x];
    const unsigned char* src = (const unsigned char*)srcs[blockIdx.x];
    for (unsigned long long z = blockIdx.y; z < c.depth; z += gridDim.y) {
        const unsigned char* s = src + c.src_offset + z * c.src_height * c.src_pitch;
        unsigned char* d = dst + c.dst_offset + z * c.dst_height * c.dst_pitch;
        bool vec = ((c.width | c.src_pitch | c.dst_pitch | (unsigned long long)s | (unsigned long long)d) & 15) == 0;
        if (vec) {
            unsigned int w = (unsigned int)(c.width / 16);
            unsigned long long n = c.height * w;
            for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
                unsigned long long y = i / w, x = i - y * w;
                ((uint4*)(d + y * c.dst_pitch))[x] = ((const uint4*)(s + y * c.src_pitch))[x];
            }
        } else {
            unsigned long long n = c.height * c.width;
            for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) {
                unsigned long long y = i / c.width, x = i - y * c.width;
                d[y * c.dst_pitch + x] = s[y * c.src_pitch + x];
            }
        }
    }
}
"#;

/// The compiled placement kernel of a context, or why there is none.
pub(crate) struct Placer {
    function: CudaFunction,
}

impl Placer {
    /// The process's kernel for `ctx` (compiled on first use); None where NVRTC is missing.
    pub(crate) fn get(ctx: &Arc<CudaContext>) -> Option<&'static Placer> {
        static PLACER: OnceLock<Option<Placer>> = OnceLock::new();
        PLACER.get_or_init(|| Self::compile(ctx).ok()).as_ref()
    }

    fn compile(ctx: &Arc<CudaContext>) -> Result<Self, String> {
        // SAFETY: only probes whether libnvrtc can be loaded (cudarc panics when it cannot).
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err("NVRTC not found".into());
        }
        let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(|e| e.to_string())?;
        let module = ctx.load_module(ptx).map_err(|e| e.to_string())?;
        let function = module.load_function("place_copies").map_err(|e| e.to_string())?;
        Ok(Self { function })
    }

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
        let max_depth = copies.iter().map(|c| c.depth).max().unwrap_or(1).min(65_535) as u32;
        let srcs = table + (copies.len() * COPY_BYTES) as u64;
        let config =
            LaunchConfig { grid_dim: (copies.len() as u32, max_depth, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut launch = stream.launch_builder(&self.function);
        launch.arg(&table).arg(&srcs).arg(&dst);
        // SAFETY: the kernel's parameters are three device addresses, as pushed; bounds are the
        // caller's contract.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda("launching the placement kernel"))?;
        Ok(())
    }
}

const COPY_BYTES: usize = 9 * 8;

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
