//! The configuration of device retrieval ([`GpuConfig`], from code and the environment) and
//! which stored chunks nvCOMP may decode ([`DecodeTrust`]). GPU mode, a configuration scoped to
//! the thread that runs a closure (and `GpuConfig::current`, which reads it), is `gpu_mode.rs`.

use std::sync::Arc;
use std::time::Duration;

use zarrs_gds_store::IoBackend;

use crate::env;
use crate::error::GpuError;
use crate::schedule::DecodeRates;
use crate::shard_index_cache::ShardIndexCache;

/// How device retrieval runs: which device, which I/O path, how much device memory to stage in.
/// Its settings come in five groups (below); `with_*` sets one, and the getter of the same name
/// reads it. The default: device 0, the store's own I/O backend, 1 GiB of device staging per
/// batch (batches of compressed chunks are sized to free device memory unless a budget is set),
/// [`DecodeTrust::Checked`], the host's share of large chunks estimated, row reads, no trace; the
/// environment is not read (see [`GpuConfig::from_env`]).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct GpuConfig {
    device: DeviceSettings,
    memory: MemorySettings,
    io: IoSettings,
    schedule: ScheduleSettings,
    observe: Observation,
}

/// Which device decodes, what it may be given, and how long a batch may take.
#[derive(Clone, Debug, Default, PartialEq)]
struct DeviceSettings {
    ordinal: usize,
    trust: DecodeTrust,
    batch_timeout: Option<Duration>,
}

/// Device and pinned memory: the staging budget, a hard cap, what the pools keep idle.
#[derive(Clone, Debug, PartialEq)]
struct MemorySettings {
    staging_bytes: usize,
    /// Whether the staging budget was chosen (here or by the environment) rather than defaulted.
    staging_set: bool,
    device_memory_cap: Option<u64>,
    pool_keep: Option<u64>,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self { staging_bytes: 1 << 30, staging_set: false, device_memory_cap: None, pool_keep: None }
    }
}

/// How stored bytes are read: the backend, row reads, object-store batches, coalescing, the
/// shard index cache.
#[derive(Clone, Debug, PartialEq)]
struct IoSettings {
    /// None: the store's own option (which `ZARRS_GDS_BACKEND` overrides).
    backend: Option<IoBackend>,
    row_reads: bool,
    /// The most decoded bytes of a batch read from an object store (0: no bound of its own).
    remote_batch_bytes: u64,
    coalesce_window: Option<Duration>,
    shard_index_cache: Option<CacheHandle>,
}

impl Default for IoSettings {
    fn default() -> Self {
        Self {
            backend: None,
            row_reads: true,
            remote_batch_bytes: DEFAULT_REMOTE_BATCH_BYTES,
            coalesce_window: None,
            shard_index_cache: None,
        }
    }
}

/// How work is split between the device and host threads, reads and writes.
#[derive(Clone, Debug, Default, PartialEq)]
struct ScheduleSettings {
    host_decode_fraction: Option<f64>,
    host_encode_fraction: Option<f64>,
    host_encode_level: Option<i32>,
    decode_rates: Option<DecodeRates>,
}

/// What the caller sees of a read and how it stops it: trace, progress, cancel (and, for tests,
/// an injected fault).
#[derive(Clone, Debug, Default, PartialEq)]
struct Observation {
    trace: bool,
    progress: Option<ProgressHandle>,
    cancel: Option<Cancel>,
    #[cfg(feature = "fault-injection")]
    injected_fault: Option<InjectedFault>,
}

/// A read's stop switch, shared by its caller and the read ([`GpuConfig::with_cancel`]): once
/// [`Cancel::cancel`] is called, the read ends at its next stage (before it reads a batch from
/// storage, before it writes a batch into its output) with [`GpuError::Cancelled`], and writes
/// nothing into its output after that. Configurations are equal when they share one.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<std::sync::atomic::AtomicBool>);

impl Cancel {
    /// A switch not yet thrown.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the reads that hold this switch to stop.
    pub fn cancel(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Self::cancel`] was called.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl PartialEq for Cancel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How far a device read has got: chunks (or inner chunks) whose batch has finished, of all the
/// read meets. Reported after each batch to [`GpuConfig::with_progress`]'s callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Units done.
    pub done: usize,
    /// Units in the read.
    pub total: usize,
}

/// The caller's progress callback; configurations are equal when they share one.
#[derive(Clone)]
struct ProgressHandle(Arc<dyn Fn(Progress) + Send + Sync>);

impl std::fmt::Debug for ProgressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressHandle(..)")
    }
}

// A configuration stays usable across `catch_unwind` (as it was before callbacks): the callback
// only observes progress, so state a panic left half-updated cannot make a read wrong.
impl std::panic::RefUnwindSafe for ProgressHandle {}
impl std::panic::UnwindSafe for ProgressHandle {}

impl PartialEq for ProgressHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The caller's shard index cache; configurations are equal when they share one.
#[derive(Clone, Debug)]
struct CacheHandle(Arc<ShardIndexCache>);

impl PartialEq for CacheHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
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

/// Which stored chunks the device may decode. nvCOMP's decoders are defined only on valid input: a
/// corrupted zstd frame hung its kernel on the GPU host, a corrupted gzip member faulted the CUDA
/// context (an illegal address, after which every CUDA call of the process fails); our decoders
/// (zstd, LZ4) end any input as an error. Chunks the device may not take are decoded on host
/// threads by the zstd crate, flate2 or c-blosc, with their own checks, then copied to the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecodeTrust {
    /// Only chunks whose stored bytes are verified before decoding: a `crc32c` after the
    /// compressor, checked on the device first.
    Verified,
    /// As `Verified`, and zstd frames whose structure checks out on the host (every block header,
    /// the recorded size), decoded by our zstd decoder, which ends any damaged frame as an error
    /// (nvCOMP's takes them only under `ZARRS_GPU_ZSTD_DECODER=nvcomp`, where a corrupted
    /// entropy-coded payload can hang it); Blosc chunks, their LZ4 streams by our decoder, their
    /// zstd streams (frames walked) still by nvCOMP's. gzip members and zlib streams (Blosc's
    /// too) without `crc32c`, which nothing short of decoding checks, decode on the host.
    #[default]
    Checked,
    /// Every chunk nvCOMP can decode, gzip and zlib without `crc32c` too: for stored data you
    /// trust.
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

/// The most decoded bytes of a batch read from an object store, by default: its GETs take several
/// times its decode, so a read is cut into batches whose decode overlaps the next one's fetch (a
/// batch of Z2's chunks, about 70 MB stored, takes about 40 ms to fetch at 64 GETs in flight).
pub const DEFAULT_REMOTE_BATCH_BYTES: u64 = 256 << 20;

impl GpuConfig {
    /// The defaults, then every variable of [`ENVIRONMENT`](crate::env::ENVIRONMENT) that sets a
    /// configuration (its decode trust, staging, scheduling, trace, row reads, coalescing,
    /// object-store batches, pool bounds and I/O backend). Settings made in code after this call
    /// win over the environment. The variables read once per device or process (reader threads
    /// and tasks, pinned pages) are checked too; the decoder variables are read where a codec is
    /// made (another value sends the codec's chunks to the host, the report naming it).
    ///
    /// # Errors
    /// Returns [`GpuError::Config`] naming the first variable whose value cannot be used.
    pub fn from_env() -> Result<Self, GpuError> {
        let mut config = Self::default();
        if let Some(bytes) = env::STAGING_BYTES.parse(|v| v.parse().ok().filter(|&b: &usize| b >= 1 << 20))? {
            config = config.with_staging_bytes(bytes);
        }
        if let Some(trust) = env::DECODE_TRUST.parse(|v| v.parse().ok())? {
            config.device.trust = trust;
        }
        config.schedule.host_decode_fraction =
            env::HOST_DECODE_FRACTION.parse(|v| v.parse().ok().filter(|f: &f64| (0.0..=1.0).contains(f)))?;
        config.schedule.host_encode_level = env::HOST_ENCODE_LEVEL.parse(|v| v.parse().ok())?;
        config.observe.trace = env::TRACE.parse(env::switch)?.unwrap_or(config.observe.trace);
        config.io.row_reads = env::ROW_READS.parse(env::switch)?.unwrap_or(config.io.row_reads);
        config.io.coalesce_window = env::COALESCE_WINDOW_US
            .parse(|v| v.parse().ok().filter(|&us: &u64| us <= 1_000_000).map(Duration::from_micros))?;
        if let Some(bytes) = env::REMOTE_BATCH_BYTES.parse(|v| v.parse().ok())? {
            config.io.remote_batch_bytes = bytes;
        }
        config.io.backend = env::GDS_BACKEND.parse(|v| v.parse().ok())?;
        config.memory.pool_keep = env::pool_keep()?;
        // Read when each device is first used (its reader), checked here too, so that a bad value
        // is refused before any device work.
        env::reader_threads()?;
        env::reader_task_size()?;
        env::pinned_alloc()?;
        Ok(config)
    }

    /// Use CUDA device `ordinal`.
    #[must_use]
    pub fn with_device(mut self, ordinal: usize) -> Self {
        self.device.ordinal = ordinal;
        self
    }

    /// Use this I/O backend for `GdsStore` reads (by default a store's own option, which
    /// `ZARRS_GDS_BACKEND` overrides).
    #[must_use]
    pub fn with_backend(mut self, backend: IoBackend) -> Self {
        self.io.backend = Some(backend);
        self
    }

    /// Bytes of device memory a batch of chunks is staged in before placement (at least 1 MiB);
    /// a chunk larger than this is staged alone. Set, it also caps batches of small compressed
    /// chunks, which otherwise grow to 4 GiB decoded where device memory allows.
    #[must_use]
    pub fn with_staging_bytes(mut self, bytes: usize) -> Self {
        self.memory.staging_bytes = bytes.max(1 << 20);
        self.memory.staging_set = true;
        self
    }

    /// The share (0 to 1) of large zstd chunks (4 MiB and more decoded) decoded on host threads
    /// while the device decodes the rest, smaller ones all on the device; `None` (the default)
    /// lets the scheduler split each batch so that both finish together, from the chunk count,
    /// sizes, thread count and [`DecodeRates`]: all on host threads for a
    /// handful of chunks, most on the device for thousands. Set, a fraction is clamped to 0..=1.
    #[must_use]
    pub fn with_host_decode_fraction(mut self, fraction: Option<f64>) -> Self {
        self.schedule.host_decode_fraction = fraction.map(|f| f.clamp(0.0, 1.0));
        self
    }

    /// The rates the scheduler splits batches between nvCOMP and host threads by (see
    /// [`DecodeRates`]); `None` (the default): an H200's, with the host
    /// thread rate learned from the host's own decodes.
    #[must_use]
    pub fn with_decode_rates(mut self, rates: Option<DecodeRates>) -> Self {
        self.schedule.decode_rates = rates;
        self
    }

    /// Which stored chunks nvCOMP may decode (see [`DecodeTrust`]); the rest decode on host
    /// threads beside the device.
    #[must_use]
    pub fn with_decode_trust(mut self, trust: DecodeTrust) -> Self {
        self.device.trust = trust;
        self
    }

    /// How long a device batch may take before the read fails with [`GpuError::Timeout`]
    /// naming its chunks and the device is marked lost (its kernels may still be running),
    /// counted from when its device work is enqueued: its storage reads and host checks (slow
    /// storage) do not count.
    /// `None`, the default, allows a generous bound from the batch's size: 60 s plus 20 ms per
    /// MiB decoded (nvCOMP's slowest case, one 16 MiB zstd frame, decodes at about 55 MiB/s).
    ///
    /// [`GpuError::Timeout`]: crate::GpuError::Timeout
    #[must_use]
    pub fn with_batch_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.device.batch_timeout = timeout;
        self
    }

    /// The time bound of a device batch that decodes `decoded_bytes`.
    #[must_use]
    pub fn batch_timeout(&self, decoded_bytes: u64) -> Duration {
        self.device
            .batch_timeout
            .unwrap_or_else(|| Duration::from_mins(1) + Duration::from_millis(20 * (decoded_bytes >> 20)))
    }

    /// The most device memory one decoded read's output, staging, scratch and fill block may take: an allocation
    /// past it fails with [`GpuError::OutOfMemory`] as if the device had run out, in the middle of
    /// the read (the up-front check uses the device's free memory). For reproducing memory
    /// exhaustion, and for a hard bound on a shared device.
    ///
    /// [`GpuError::OutOfMemory`]: crate::GpuError::OutOfMemory
    #[must_use]
    pub fn with_device_memory_cap(mut self, cap: Option<u64>) -> Self {
        self.memory.device_memory_cap = cap;
        self
    }

    /// Keep at most `bytes` of idle device memory in this library's pools when this read ends
    /// (freed results and staging buffers together), and at most `bytes` of pinned host buffers.
    /// None: the device's bounds, `ZARRS_GPU_POOL_KEEP_BYTES` for both, or
    /// [`default_pool_keep`](crate::default_pool_keep) (the larger of 1 GiB and 2% of the
    /// device) and [`default_pinned_keep`](crate::default_pinned_keep) (that or a sixteenth of
    /// the host's memory up to 8 GiB, whichever is larger). A larger bound spares repeated large
    /// reads the mapping of their memory (about 1.5 ms per GiB of device memory, 0.47 s per GiB
    /// pinned); 0 gives everything back after each read.
    #[must_use]
    pub fn with_pool_keep_bytes(mut self, bytes: Option<u64>) -> Self {
        self.memory.pool_keep = bytes;
        self
    }

    /// The idle memory bound set for this read, if any.
    #[must_use]
    pub fn pool_keep_bytes(&self) -> Option<u64> {
        self.memory.pool_keep
    }

    /// Call `progress` after each batch of a device read (on the reading thread), for progress
    /// bars on long reads.
    #[must_use]
    pub fn with_progress(mut self, progress: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        self.observe.progress = Some(ProgressHandle(Arc::new(progress)));
        self
    }

    /// Let `cancel` stop the reads made with this configuration ([`Cancel`]).
    #[must_use]
    pub fn with_cancel(mut self, cancel: Cancel) -> Self {
        self.observe.cancel = Some(cancel);
        self
    }

    /// [`GpuError::Cancelled`] once the read's [`Cancel`] is thrown: checked between a read's
    /// stages.
    pub(crate) fn check_cancelled(&self) -> Result<(), GpuError> {
        match &self.observe.cancel {
            Some(cancel) if cancel.is_cancelled() => Err(GpuError::Cancelled),
            _ => Ok(()),
        }
    }

    /// Tell the progress callback, if any, that `done` of `total` units are done.
    pub(crate) fn report_progress(&self, done: usize, total: usize) {
        if let Some(ProgressHandle(progress)) = &self.observe.progress {
            progress(Progress { done, total });
        }
    }

    /// Print each decoded read's phase timings to stderr.
    #[must_use]
    pub fn with_trace(mut self, trace: bool) -> Self {
        self.observe.trace = trace;
        self
    }

    /// Read an uncompressed chunk's part of a tile row by row (on by default), where its rows
    /// are at most half the bytes between its first and last needed byte and each row is at
    /// least 256 bytes: fewer bytes read and copied, more reads. Off: one range per chunk.
    /// Applies to [`GdsStore`](zarrs_gds_store::GdsStore)s.
    #[must_use]
    pub fn with_row_reads(mut self, on: bool) -> Self {
        self.io.row_reads = on;
        self
    }

    /// Gather reads of one array made from many threads into requests (see
    /// [`CoalescedReads`](crate::CoalescedReads)): reads that arrive while a request is in flight
    /// become the next one, and a read that arrives within `window` of a request's end (reads are
    /// streaming in) waits that long for others first. A lone read never waits. None (the
    /// default): [`CoalescedReads`](crate::CoalescedReads) takes a zero window, and the Python
    /// package's `Array` reads each read alone.
    #[must_use]
    pub fn with_coalesce_window(mut self, window: Option<Duration>) -> Self {
        self.io.coalesce_window = window;
        self
    }

    /// The most decoded bytes of a batch read from an object store (default
    /// [`DEFAULT_REMOTE_BATCH_BYTES`]; at least the largest chunk; `0`: no bound of its own,
    /// batches as any read's, up to 4 GiB of small chunks, so that a smaller read is one batch,
    /// fetched whole before it is decoded). A read of several batches fetches their values as one
    /// stream of GETs, one batch ahead of the decode.
    #[must_use]
    pub fn with_remote_batch_bytes(mut self, bytes: u64) -> Self {
        self.io.remote_batch_bytes = bytes;
        self
    }

    /// The bound set by [`GpuConfig::with_remote_batch_bytes`] (None: none).
    #[must_use]
    pub fn remote_batch_bytes(&self) -> Option<u64> {
        (self.io.remote_batch_bytes > 0).then_some(self.io.remote_batch_bytes)
    }

    /// The window set by [`GpuConfig::with_coalesce_window`].
    #[must_use]
    pub fn coalesce_window(&self) -> Option<Duration> {
        self.io.coalesce_window
    }

    /// Whether uncompressed tiles may be read row by row.
    #[must_use]
    pub fn row_reads(&self) -> bool {
        self.io.row_reads
    }

    /// Whether phase timings are printed.
    #[must_use]
    pub fn trace(&self) -> bool {
        self.observe.trace
    }

    /// Keep the shard indexes that reads with this configuration decode in `cache` (the caller's,
    /// for one array: see [`ShardIndexCache`]), and take them from it. Without one, every read
    /// reads the indexes it needs.
    #[must_use]
    pub fn with_shard_index_cache(mut self, cache: Option<Arc<ShardIndexCache>>) -> Self {
        self.io.shard_index_cache = cache.map(CacheHandle);
        self
    }

    /// The shard index cache, if one is set.
    #[must_use]
    pub fn shard_index_cache(&self) -> Option<&ShardIndexCache> {
        self.io.shard_index_cache.as_ref().map(|c| c.0.as_ref())
    }

    /// The device memory cap of a read, if set.
    #[must_use]
    pub fn device_memory_cap(&self) -> Option<u64> {
        self.memory.device_memory_cap
    }

    /// Make the first device batch of each read suffer `fault` (tests of fault containment).
    #[cfg(feature = "fault-injection")]
    #[must_use]
    pub fn with_injected_fault(mut self, fault: Option<InjectedFault>) -> Self {
        self.observe.injected_fault = fault;
        self
    }

    /// The fault injected into the first device batch, if any.
    #[cfg(feature = "fault-injection")]
    #[must_use]
    pub fn injected_fault(&self) -> Option<InjectedFault> {
        self.observe.injected_fault
    }

    /// Which stored chunks nvCOMP may decode.
    #[must_use]
    pub fn decode_trust(&self) -> DecodeTrust {
        self.device.trust
    }

    /// The decode rates set for the scheduler, if any.
    #[must_use]
    pub fn decode_rates(&self) -> Option<DecodeRates> {
        self.schedule.decode_rates
    }

    /// The share (0 to 1) of the chunks of a write from the device encoded on host threads (by
    /// libzstd, zlib-rs or c-blosc at the codec's level: a better ratio than nvCOMP's, which has
    /// no levels) while nvCOMP encodes the rest; `None` (the default): host threads for batches
    /// of fewer than 64 chunks (nvCOMP's zstd takes over 100 ms for any batch on the GPU host),
    /// nvCOMP for larger ones (twice libzstd's rate on the GPU host's 16 cores). Set, a fraction
    /// is clamped to 0..=1. [`Self::with_host_encode_level`] sends whole writes to host threads.
    #[must_use]
    pub fn with_host_encode_fraction(mut self, fraction: Option<f64>) -> Self {
        self.schedule.host_encode_fraction = fraction.map(|f| f.clamp(0.0, 1.0));
        self
    }

    /// The share of a write's chunks encoded on host threads, if set.
    #[must_use]
    pub fn host_encode_fraction(&self) -> Option<f64> {
        self.schedule.host_encode_fraction
    }

    /// Encode on host threads every chunk of a write whose codec asks for at least `level` (zstd's
    /// level, gzip's or zlib's, Blosc's clevel): nvCOMP has no levels, and its ratio is that of a
    /// fast one (zstd: 2.88 on the benchmark's float32 against libzstd level 3's 3.62), so an
    /// array asking for more gets it, at the host's rate. `None` (the default): the level does
    /// not decide (`ZARRS_GPU_HOST_ENCODE_LEVEL` sets it from the environment).
    #[must_use]
    pub fn with_host_encode_level(mut self, level: Option<i32>) -> Self {
        self.schedule.host_encode_level = level;
        self
    }

    /// The codec level from which writes are encoded on host threads, if set.
    #[must_use]
    pub fn host_encode_level(&self) -> Option<i32> {
        self.schedule.host_encode_level
    }

    /// The share of large zstd chunks decoded on host threads, if set.
    #[must_use]
    pub fn host_decode_fraction(&self) -> Option<f64> {
        self.schedule.host_decode_fraction
    }

    /// The CUDA device ordinal.
    #[must_use]
    pub fn device(&self) -> usize {
        self.device.ordinal
    }

    /// The I/O backend asked for, if any (None: the store's own option).
    #[must_use]
    pub fn backend(&self) -> Option<IoBackend> {
        self.io.backend
    }

    /// The device staging budget per batch, in bytes.
    #[must_use]
    pub fn staging_bytes(&self) -> usize {
        self.memory.staging_bytes
    }

    /// Whether the staging budget was set (by `with_staging_bytes` or the environment).
    #[must_use]
    pub fn staging_is_set(&self) -> bool {
        self.memory.staging_set
    }
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
}
