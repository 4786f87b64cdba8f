//! The kernels of a device context, compiled with NVRTC once per process and loaded once per
//! device context (a module loaded in one device's context cannot launch in another's). Their
//! sources come from their owners (placement and gather: the pipeline's `place.rs`; zstd's
//! XXH64: `codecs/zstd/xxhash.rs`; the injected faults of the containment tests: here), and each
//! owner launches its own. Without NVRTC there are none (placement falls back to the copy
//! engines).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

#[cfg(feature = "fault-injection")]
use crate::config::InjectedFault;
use crate::error::GpuError;

/// The compiled kernels of one device context: placement, gather, XXH64.
pub(crate) struct Kernels {
    pub(crate) function: CudaFunction,
    pub(crate) gather: CudaFunction,
    pub(crate) xxh64: CudaFunction,
    #[cfg(feature = "fault-injection")]
    pub(crate) faults: (CudaFunction, CudaFunction),
    /// The module, for the kernels codecs look up by name ([`Kernels::function`]).
    module: Arc<CudaModule>,
}

impl Kernels {
    /// The kernels loaded into `ctx`, or why there are none (NVRTC missing, most often).
    /// `sources` are the kernels' sources in groups (the pipeline's placement and gather kernels
    /// and the injected faults, then the codecs' kernels: `codecs::KERNEL_SOURCES`), compiled
    /// into one module; the PTX is compiled once per process, so every call passes the same.
    pub(crate) fn load(ctx: &Arc<CudaContext>, sources: &[&[&str]]) -> Result<Self, String> {
        static PTX: std::sync::OnceLock<Result<cudarc::nvrtc::Ptx, String>> = std::sync::OnceLock::new();
        let ptx = PTX.get_or_init(|| {
            // SAFETY: only probes whether libnvrtc can be loaded (cudarc panics when it cannot).
            if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Err("NVRTC not found".into());
            }
            let source = sources.concat().concat();
            cudarc::nvrtc::compile_ptx(source).map_err(|e| e.to_string())
        });
        let module = ctx.load_module(ptx.clone()?).map_err(|e| e.to_string())?;
        let load = |name: &str| module.load_function(name).map_err(|e| format!("loading {name}: {e}"));
        Ok(Self {
            function: load("place_copies")?,
            gather: load("gather_elements")?,
            xxh64: load("xxh64_chunks")?,
            #[cfg(feature = "fault-injection")]
            faults: (load("fault_spin")?, load("fault_illegal_address")?),
            module,
        })
    }

    /// The kernel `name` of the module (one a codec's `KERNEL_SOURCES` entry defines), so that a
    /// codec family adds kernels without a field here.
    pub(crate) fn function(&self, name: &str) -> Result<CudaFunction, GpuError> {
        self.module.load_function(name).map_err(GpuError::cuda("loading a kernel"))
    }

    /// Enqueue the kernel `name` on `stream` with `args`, each one of its `unsigned long long`
    /// parameters in order (device addresses and counts); `what` names the launch in an error.
    ///
    /// # Safety
    /// The kernel takes exactly these parameters, and the memory they address holds what it
    /// reads and has room for what it writes, ordered on `stream`.
    pub(crate) unsafe fn launch_u64(
        &self,
        stream: &CudaStream,
        name: &str,
        config: LaunchConfig,
        args: &[u64],
        what: &'static str,
    ) -> Result<(), GpuError> {
        let function = self.function(name)?;
        let mut launch = stream.launch_builder(&function);
        for arg in args {
            launch.arg(arg);
        }
        // SAFETY: the caller's contract.
        unsafe { launch.launch(config) }.map_err(GpuError::cuda(what))?;
        Ok(())
    }
}

/// Kernels that break a batch on purpose, for the tests of fault containment: one never ends,
/// one writes to an address no allocation holds (a sticky context fault).
pub(crate) const FAULT_SOURCE: &str = r#"
extern "C" __global__ void fault_spin(volatile unsigned int* flag) {
    while (*flag == 0) { __nanosleep(1000); }
}
extern "C" __global__ void fault_illegal_address(unsigned long long* nowhere) {
    *nowhere = 1;
}
"#;

#[cfg(feature = "fault-injection")]
impl Kernels {
    /// Enqueue `fault` on `stream`: a kernel that never ends (waiting on a flag nothing sets), or
    /// one that writes to an unmapped address.
    pub(crate) fn launch_fault(&self, stream: &CudaStream, fault: InjectedFault) -> Result<(), GpuError> {
        use cudarc::driver::sys;
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        let (function, target) = match fault {
            InjectedFault::Hang => {
                let mut flag = 0;
                // SAFETY: a fresh 4-byte allocation, zeroed on the stream before the kernel reads
                // it; deliberately never freed (the kernel never ends).
                unsafe {
                    sys::cuMemAlloc_v2(&raw mut flag, 4).result().map_err(GpuError::cuda("allocating a flag"))?;
                    sys::cuMemsetD32Async(flag, 0, 1, stream.cu_stream())
                        .result()
                        .map_err(GpuError::cuda("clearing a flag"))?;
                }
                (&self.faults.0, flag)
            }
            InjectedFault::IllegalAddress => (&self.faults.1, 8u64),
            InjectedFault::NoKernels => return Ok(()),
        };
        let mut launch = stream.launch_builder(function);
        launch.arg(&target);
        // SAFETY: both kernels take one device address; that they misbehave is the point.
        unsafe { launch.launch(one) }.map_err(GpuError::cuda("launching an injected fault"))?;
        Ok(())
    }
}
