//! What a read did ([`RetrieveReport`]: where its chunks were decoded, its I/O path, its bytes),
//! and its stage timings: kept in its report ([`RetrieveReport::stages`]), and printed to
//! stderr when the configuration asks (`GpuConfig::with_trace`, `ZARRS_GPU_TRACE`): where the
//! time of a read goes, without a profiler. A mark costs a clock read, a few per batch.

use std::time::{Duration, Instant};

use zarrs_gds_store::IoStatus;

/// Where a read's chunks were decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodePath {
    /// Chunk bytes went from storage to the device and were placed there (codec chain `bytes`).
    Device,
    /// Decoded by zarrs on the host into pinned memory, then copied to the device once.
    Host,
}

impl std::fmt::Display for DecodePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Device => "device",
            Self::Host => "host decode + one copy",
        })
    }
}

/// How a write's chunks were encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WritePath {
    /// Assembled and encoded on the device (nvCOMP), written by the store.
    Device,
    /// Copied to the host and written by zarrs (the report's `reason` says why).
    Host,
}

/// What a write from the device did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct WriteReport {
    /// How the chunks were encoded.
    pub path: WritePath,
    /// Why they were encoded on the host, where they were.
    pub reason: Option<String>,
    /// Chunks the subset meets.
    pub chunks: usize,
    /// Chunks stored (device path).
    pub written: usize,
    /// Chunks erased because they are all fill value (device path).
    pub erased: usize,
    /// Chunks the subset covers in part: read, modified and encoded again (device path; a shard
    /// covered in part encodes again only the inner chunks the subset meets, and keeps the
    /// others' stored bytes).
    pub modified: usize,
    /// Raw chunk bytes encoded (device path; of a shard covered in part, its inner chunks encoded
    /// again).
    pub bytes_encoded: u64,
    /// Bytes stored, checksums included (device path).
    pub bytes_stored: u64,
    /// Seconds the write took, storing included.
    pub seconds: f64,
    /// Seconds spent assembling chunks, encoding them and copying them to the host (device path),
    /// `read_seconds` included.
    pub encode_seconds: f64,
    /// Of `encode_seconds`, those spent reading the old values of chunks covered in part (device
    /// path).
    pub read_seconds: f64,
    /// Seconds spent storing them (device path): on another thread, overlapping the next batch's
    /// encode.
    pub store_seconds: f64,
}

impl WriteReport {
    pub(crate) fn new(path: WritePath, chunks: usize) -> Self {
        Self {
            path,
            reason: None,
            chunks,
            written: 0,
            erased: 0,
            modified: 0,
            bytes_encoded: 0,
            bytes_stored: 0,
            seconds: 0.0,
            encode_seconds: 0.0,
            read_seconds: 0.0,
            store_seconds: 0.0,
        }
    }

    /// Raw bytes over stored bytes of the chunks stored (device path; None before any). Of a
    /// write that keeps inner chunks of shards it covers in part, less than the codecs' ratio.
    #[must_use]
    pub fn ratio(&self) -> Option<f64> {
        (self.bytes_stored > 0).then(|| self.bytes_encoded as f64 / self.bytes_stored as f64)
    }
}

/// What a device retrieval did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetrieveReport {
    /// Where the chunks were decoded.
    pub decode: DecodePath,
    /// The I/O path of the device reads (None when zarrs read on the host).
    pub io: Option<IoStatus>,
    /// Chunks that met the subset.
    pub chunks: usize,
    /// Of those, chunks that do not exist (filled with the fill value).
    pub missing_chunks: usize,
    /// Bytes read from storage (stored bytes: compressed for compressed chunks).
    pub bytes_read: u64,
    /// Chunks decoded on host threads beside the device (large frames, frames nvCOMP cannot take).
    pub host_decoded_chunks: usize,
    /// Why zarrs decoded the whole read on the host, when it did.
    pub host_reason: Option<String>,
    /// How the scheduler split the last batch between host threads and nVCOMP, and why.
    pub schedule: Option<String>,
    /// Time in each stage of the device pipeline (empty when zarrs decoded on the host).
    pub stages: Vec<StageTime>,
    /// The most device memory the read held at once: the output it allocated (not a caller's
    /// destination), its staging, the decoder's scratch and its tables.
    pub peak_device_bytes: u64,
    /// Reads of other threads served by the same request, this one included (1: read alone; see
    /// [`CoalescedReads`](crate::CoalescedReads)).
    pub coalesced_reads: usize,
    /// The device decoder of the chain's compression where the device decoded ("zstd: ours",
    /// "zstd: nvCOMP", ...); None for chains without one and for reads zarrs decoded on the host.
    pub device_decoder: Option<String>,
}

impl RetrieveReport {
    /// This report (a request's) for each of `results`, the request's reads, each saying how
    /// many reads the request served ([`RetrieveReport::coalesced_reads`]).
    #[must_use]
    pub fn shared_by<A>(mut self, results: Vec<A>) -> Vec<(A, Self)> {
        self.coalesced_reads = results.len();
        results.into_iter().map(|a| (a, self.clone())).collect()
    }

    /// A report of `chunks` chunks before anything was read.
    pub(crate) fn new(decode: DecodePath, chunks: usize) -> Self {
        Self {
            decode,
            io: None,
            chunks,
            missing_chunks: 0,
            bytes_read: 0,
            host_decoded_chunks: 0,
            host_reason: None,
            schedule: None,
            stages: Vec::new(),
            peak_device_bytes: 0,
            coalesced_reads: 1,
            device_decoder: None,
        }
    }
}

/// The time a read spent in one of its stages, summed over its batches.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StageTime {
    /// The stage (`plan`, `read`, `check`, `decode`, `place`, `final sync`, ...).
    pub stage: &'static str,
    /// Time spent in it, on the host's clock (device work shows where the host waits for it).
    pub time: Duration,
    /// How many times the stage ran (once per batch for most).
    pub count: usize,
}

pub(crate) struct Trace {
    start: Instant,
    last: Instant,
    print: bool,
    stages: Vec<StageTime>,
}

impl Trace {
    pub(crate) fn new(print: bool) -> Self {
        let now = Instant::now();
        Self { start: now, last: now, print, stages: Vec::new() }
    }

    /// Close the stage that ends now (summed with earlier ones of the same name).
    pub(crate) fn mark(&mut self, stage: &'static str) {
        let now = Instant::now();
        let time = now - self.last;
        self.last = now;
        match self.stages.iter_mut().find(|s| s.stage == stage) {
            Some(s) => {
                s.time += time;
                s.count += 1;
            }
            None => self.stages.push(StageTime { stage, time, count: 1 }),
        }
    }

    /// The stages, printed first when asked.
    pub(crate) fn finish(self, what: &str) -> Vec<StageTime> {
        if self.print {
            let stages: Vec<String> = self
                .stages
                .iter()
                .map(|s| format!("{} {:.2} ms (x{})", s.stage, s.time.as_secs_f64() * 1e3, s.count))
                .collect();
            eprintln!(
                "[zarrs_gpu trace] {what}: {:.2} ms: {}",
                self.start.elapsed().as_secs_f64() * 1e3,
                stages.join(", ")
            );
        }
        self.stages
    }
}
