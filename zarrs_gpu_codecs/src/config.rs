//! GPU mode: a scoped configuration that zarrs retrieval honours, on the caller's thread and on
//! zarrs' rayon workers alike.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use zarrs_gds_store::IoBackend;

/// How device retrieval runs: which device, which I/O path, how much device memory to stage in.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct GpuConfig {
    device: usize,
    backend: IoBackend,
    staging_bytes: usize,
    /// Whether the staging budget was chosen (here or by the environment) rather than defaulted.
    staging_set: bool,
    host_decode_fraction: Option<f64>,
    decode_trust: DecodeTrust,
    batch_timeout: Option<Duration>,
    device_memory_cap: Option<u64>,
    #[cfg(feature = "fault-injection")]
    injected_fault: Option<InjectedFault>,
}

/// A fault a device batch suffers on purpose, for the tests of fault containment (feature
/// `fault-injection`).
#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InjectedFault {
    /// The first batch's decode stream runs a kernel that never ends.
    Hang,
    /// The first batch's decode stream runs a kernel that writes to an unmapped address (a sticky
    /// fault: every later CUDA call on the device fails).
    IllegalAddress,
    /// The read runs as without NVRTC: none of our kernels (placement by the copy engines, zstd
    /// frames with content checksums on host threads, transposed chunks refused).
    NoKernels,
}

/// Which stored chunks nvCOMP may decode. nvCOMP's decoders are defined only on valid input: a
/// corrupted zstd frame hung its kernel on the GPU host, a corrupted gzip member faulted the CUDA
/// context (an illegal address, after which every CUDA call of the process fails). Chunks nvCOMP
/// may not take are decoded on host threads by the zstd crate or flate2, with their own checks,
/// then copied to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecodeTrust {
    /// Only chunks whose stored bytes are verified before decoding: a `crc32c` after the
    /// compressor, checked on the device first.
    Verified,
    /// As `Verified`, and zstd frames whose structure checks out on the host (every block header,
    /// the recorded size): a corrupted entropy-coded payload can still reach nvCOMP. gzip members
    /// without `crc32c`, which nothing short of decoding can check, decode on the host.
    #[default]
    Checked,
    /// Every chunk nvCOMP can decode, gzip without `crc32c` too: for stored data you trust.
    Trusted,
}

impl std::str::FromStr for DecodeTrust {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "verified" => Ok(Self::Verified),
            "checked" => Ok(Self::Checked),
            "trusted" => Ok(Self::Trusted),
            other => Err(format!("unknown decode trust {other:?}: verified, checked or trusted")),
        }
    }
}

/// The environment variable that sets the default [`DecodeTrust`] (`verified`, `checked` or
/// `trusted`).
pub const DECODE_TRUST_ENV: &str = "ZARRS_GPU_DECODE_TRUST";

/// The environment variable that sets the default device staging budget per batch, in bytes.
pub const STAGING_BYTES_ENV: &str = "ZARRS_GPU_STAGING_BYTES";

impl Default for GpuConfig {
    /// Device 0, backend auto, 1 GiB of device staging per batch (`ZARRS_GPU_STAGING_BYTES`
    /// overrides); batches of compressed chunks are sized to free device memory unless a budget
    /// is set; [`DecodeTrust::Checked`] (`ZARRS_GPU_DECODE_TRUST` overrides).
    fn default() -> Self {
        let staging = std::env::var(STAGING_BYTES_ENV).ok().and_then(|v| v.trim().parse::<usize>().ok());
        let decode_trust = std::env::var(DECODE_TRUST_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or_default();
        Self {
            device: 0,
            backend: IoBackend::Auto,
            staging_bytes: staging.unwrap_or(1 << 30).max(1 << 20),
            staging_set: staging.is_some(),
            host_decode_fraction: None,
            decode_trust,
            batch_timeout: None,
            device_memory_cap: None,
            #[cfg(feature = "fault-injection")]
            injected_fault: None,
        }
    }
}

impl GpuConfig {
    /// Use CUDA device `ordinal`.
    #[must_use]
    pub fn with_device(mut self, ordinal: usize) -> Self {
        self.device = ordinal;
        self
    }

    /// Prefer this I/O backend for `GdsStore` reads (`ZARRS_GDS_BACKEND` overrides it).
    #[must_use]
    pub fn with_backend(mut self, backend: IoBackend) -> Self {
        self.backend = backend;
        self
    }

    /// Bytes of device memory a batch of chunks is staged in before placement (at least 1 MiB);
    /// a chunk larger than this is staged alone. Set, it also caps batches of small compressed
    /// chunks, which otherwise grow to 4 GiB decoded where device memory allows.
    #[must_use]
    pub fn with_staging_bytes(mut self, bytes: usize) -> Self {
        self.staging_bytes = bytes.max(1 << 20);
        self.staging_set = true;
        self
    }

    /// The share (0 to 1) of large zstd chunks (4 MiB and more decoded) decoded on host threads
    /// while the device decodes the rest; `None` (the default) splits each batch so that both
    /// finish together, from the chunk count, size and thread count: none with hundreds of
    /// chunks, all with a handful (`ZARRS_GPU_HOST_DECODE_FRACTION` overrides the estimate).
    /// Smaller chunks all go to the device.
    #[must_use]
    pub fn with_host_decode_fraction(mut self, fraction: Option<f64>) -> Self {
        self.host_decode_fraction = fraction;
        self
    }

    /// Which stored chunks nvCOMP may decode (see [`DecodeTrust`]); the rest decode on host
    /// threads beside the device.
    #[must_use]
    pub fn with_decode_trust(mut self, trust: DecodeTrust) -> Self {
        self.decode_trust = trust;
        self
    }

    /// How long a device batch may take before the read fails with [`GpuError::Timeout`]
    /// naming its chunks and the device is marked lost (its kernels may still be running).
    /// `None`, the default, allows a generous bound from the batch's size: 60 s plus 20 ms per
    /// MiB decoded (nvCOMP's slowest case, one 16 MiB zstd frame, decodes at about 55 MiB/s).
    ///
    /// [`GpuError::Timeout`]: crate::GpuError::Timeout
    #[must_use]
    pub fn with_batch_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.batch_timeout = timeout;
        self
    }

    /// The time bound of a device batch that decodes `decoded_bytes`.
    #[must_use]
    pub fn batch_timeout(&self, decoded_bytes: u64) -> Duration {
        self.batch_timeout.unwrap_or_else(|| Duration::from_mins(1) + Duration::from_millis(20 * (decoded_bytes >> 20)))
    }

    /// The most device memory one decoded read's output and staging may take: an allocation
    /// past it fails with [`GpuError::OutOfMemory`] as if the device had run out, in the middle of
    /// the read (the up-front check uses the device's free memory). For reproducing memory
    /// exhaustion, and for a hard bound on a shared device.
    ///
    /// [`GpuError::OutOfMemory`]: crate::GpuError::OutOfMemory
    #[must_use]
    pub fn with_device_memory_cap(mut self, cap: Option<u64>) -> Self {
        self.device_memory_cap = cap;
        self
    }

    /// The device memory cap of a read, if set.
    #[must_use]
    pub fn device_memory_cap(&self) -> Option<u64> {
        self.device_memory_cap
    }

    /// Make the first device batch of each read suffer `fault` (tests of fault containment).
    #[cfg(feature = "fault-injection")]
    #[must_use]
    pub fn with_injected_fault(mut self, fault: Option<InjectedFault>) -> Self {
        self.injected_fault = fault;
        self
    }

    /// The fault injected into the first device batch, if any.
    #[cfg(feature = "fault-injection")]
    #[must_use]
    pub fn injected_fault(&self) -> Option<InjectedFault> {
        self.injected_fault
    }

    /// Which stored chunks nvCOMP may decode.
    #[must_use]
    pub fn decode_trust(&self) -> DecodeTrust {
        self.decode_trust
    }

    /// The share of large zstd chunks decoded on host threads, if set.
    #[must_use]
    pub fn host_decode_fraction(&self) -> Option<f64> {
        self.host_decode_fraction
    }

    /// The CUDA device ordinal.
    #[must_use]
    pub fn device(&self) -> usize {
        self.device
    }

    /// The I/O backend preference.
    #[must_use]
    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    /// The device staging budget per batch, in bytes.
    #[must_use]
    pub fn staging_bytes(&self) -> usize {
        self.staging_bytes
    }

    /// Whether the staging budget was set (by `with_staging_bytes` or the environment).
    #[must_use]
    pub fn staging_is_set(&self) -> bool {
        self.staging_set
    }
}

thread_local! {
    static THREAD_SCOPES: RefCell<Vec<GpuConfig>> = const { RefCell::new(Vec::new()) };
}
/// Scopes open in the process, newest last: what threads without a scope of their own (zarrs'
/// rayon workers) see.
static PROCESS_SCOPES: Mutex<Vec<(u64, GpuConfig)>> = Mutex::new(Vec::new());
static NEXT_SCOPE: AtomicU64 = AtomicU64::new(0);

struct ScopeGuard(u64);

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        crate::codec::scope_closed();
        THREAD_SCOPES.with(|s| s.borrow_mut().pop());
        let mut scopes = PROCESS_SCOPES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = scopes.iter().rposition(|(id, _)| *id == self.0) {
            scopes.remove(i);
        }
    }
}

/// Run `f` in GPU mode with `config`: device retrieval inside uses it, zarrs' generic retrieval
/// into [`DeviceArray`](crate::DeviceArray) places its result on that device, and arrays opened
/// inside get [`GpuModeCodec`](crate::GpuModeCodec)s for "zstd" and "gzip" (zarrs' codecs
/// carrying their device codecs, registered with zarrs as runtime codec plugins while any scope
/// is open). Scopes nest (the inner one wins, the outer
/// one is restored on exit) and end also when `f` panics.
///
/// Threads with no scope of their own (such as zarrs' rayon workers) see the newest scope open in
/// the process.
pub fn with_gpu_config<R>(config: GpuConfig, f: impl FnOnce() -> R) -> R {
    let id = NEXT_SCOPE.fetch_add(1, Ordering::Relaxed);
    THREAD_SCOPES.with(|s| s.borrow_mut().push(config.clone()));
    PROCESS_SCOPES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((id, config));
    crate::codec::scope_opened();
    let _guard = ScopeGuard(id);
    f()
}

/// The GPU mode configuration in force on this thread: its own innermost scope, else the newest
/// scope open in the process, else `None`.
#[must_use]
pub fn gpu_config() -> Option<GpuConfig> {
    THREAD_SCOPES.with(|s| s.borrow().last().cloned()).or_else(|| {
        PROCESS_SCOPES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).last().map(|(_, c)| c.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_trust_parses_its_names() {
        assert_eq!(" Trusted ".parse::<DecodeTrust>(), Ok(DecodeTrust::Trusted));
        assert_eq!("verified".parse::<DecodeTrust>(), Ok(DecodeTrust::Verified));
        assert_eq!("checked".parse::<DecodeTrust>(), Ok(DecodeTrust::Checked));
        assert!("yes".parse::<DecodeTrust>().unwrap_err().contains("verified, checked or trusted"));
        let config = GpuConfig::default().with_decode_trust(DecodeTrust::Verified);
        assert_eq!(config.decode_trust(), DecodeTrust::Verified);
    }

    #[test]
    fn scopes_nest_restore_and_survive_panics() {
        assert_eq!(gpu_config(), None);
        let outer = GpuConfig::default().with_device(1);
        let inner = GpuConfig::default().with_device(2).with_backend(IoBackend::Posix);
        with_gpu_config(outer.clone(), || {
            assert_eq!(gpu_config(), Some(outer.clone()));
            with_gpu_config(inner.clone(), || assert_eq!(gpu_config(), Some(inner.clone())));
            assert_eq!(gpu_config(), Some(outer.clone()));
            let caught = std::panic::catch_unwind(|| with_gpu_config(inner.clone(), || panic!("boom")));
            assert!(caught.is_err());
            assert_eq!(gpu_config(), Some(outer.clone()));
            // Another thread with no scope of its own (like a rayon worker) sees the open scope.
            let seen = std::thread::spawn(gpu_config).join().unwrap();
            assert_eq!(seen, Some(outer.clone()));
            // rayon workers too.
            let seen: Vec<_> = {
                use rayon::prelude::*;
                (0..64).into_par_iter().map(|_| gpu_config()).collect()
            };
            assert!(seen.iter().all(|c| c.as_ref() == Some(&outer)));
        });
        assert_eq!(gpu_config(), None);
        assert_eq!(std::thread::spawn(gpu_config).join().unwrap(), None);
    }
}
