//! Device decoding of compressed chunks (and of every inner chunk of sharded arrays): stored
//! bytes are read into pinned host memory (where zstd frames, gzip headers and trailers and
//! crc32c trailers are checked), copied to the device in one transfer per batch on a copy stream
//! (overlapping the previous batch's decode), checked with nvCOMP CRC32C when the chain has
//! `crc32c`, decoded by nvCOMP's batched zstd or gzip (large chunks partly on host threads at the
//! same time; gzip's CRC-32 of the decoded bytes checked after), then placed into the output by
//! one kernel launch per batch.
//!
//! The stages, one to a module, each a part of [`Batch`]'s work: [`read`] (stored sizes and
//! reads), [`check`] (the host check and each unit's route, set there only), [`device`] (crc32c,
//! nvCOMP, digests), [`host`] (the host's share), [`placement`], [`finish`] (results, the wait
//! for each batch). [`budget`] plans the batches to the free memory; [`memory`] owns every
//! buffer. This module drives them, batch after batch.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};
use nvcomp_sys::NvcompLibrary;
use zarrs::array::Array;

use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::error::GpuError;
use crate::pipeline::output::{Destination, OutputBuffer};
use crate::pipeline::route::DeviceChain;
use crate::pipeline::unit::{Source, Unit};
use crate::reader::ReadSource;
use crate::report::{DecodePath, RetrieveReport, Trace};

mod budget;
mod check;
mod device;
mod finish;
mod host;
mod job;
mod memory;
mod placement;
mod read;

use budget::plan_batches;
use device::DecodeTiming;
use finish::{after, Pending, ResultLog};
use job::Job;
use memory::ReadMemory;
use read::Batch;

/// Where a read decodes: the device's context, the read's stream, and nvCOMP where it is loaded.
#[derive(Clone, Copy)]
pub(crate) struct OnDevice<'a> {
    pub(crate) context: &'a GpuContext,
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) nvcomp: Option<&'a NvcompLibrary>,
}

/// Read, check, decode and place `units` (chunks or inner chunks, all stored as `chain` says)
/// into `output`, of `out_bytes` (the request's). Per batch: stored sizes, read, host check and
/// routing, device decode (with the content checks), host decode of the host's share, results
/// queued, placement; then the results checked and the buffers released.
pub(crate) fn decode_units<S: ?Sized>(
    array: &Array<S>,
    units: &[Unit],
    source: ReadSource<'_>,
    config: &GpuConfig,
    device: OnDevice<'_>,
    chain: &DeviceChain,
    destination: Destination,
) -> Result<(Option<CudaSlice<u8>>, RetrieveReport), GpuError> {
    let OnDevice { context, stream, nvcomp } = device;
    let mut trace = Trace::new(config.trace());
    let elem = array.data_type().fixed_size().expect("checked before the read (element_size)") as u64;
    let nvcomp = match nvcomp {
        Some(nvcomp) => Some(nvcomp),
        None if !chain.needs_nvcomp() => None,
        None => return Err(GpuError::NoNvcomp("this codec chain needs it".into())),
    };
    // Free device memory, asked once (each query is a driver call). Not the read's cap: that
    // reproduces memory running out in the middle of a read, which a plan within it never would.
    let free = context.free_bytes()?;
    // The fill block is uniform and as long as the longest read; planned beside the output (any
    // unit may turn out missing when its value is sized).
    let fill_len = units.iter().map(|u| u.placement.read_len()).max().unwrap_or(0);
    let (batches, shrunk) = plan_batches(
        units,
        chain,
        config,
        (free, source.remote().is_some()),
        destination.allocated().saturating_add(fill_len),
    )?;
    let slots = if batches.len() > 1 { 2 } else { 1 };
    // A remote store's whole values stream in ahead of the batches that take them, so that one
    // batch is copied and decoded while the next is fetched. One batch is fetched as it is read,
    // and a sharded array's inner chunks (ranges, not whole values) in each batch's read.
    let whole = |batch: &Vec<usize>| read::whole_values(units, batch).into_iter().map(|(k, l)| (k.clone(), l));
    let ahead = source
        .remote()
        .filter(|_| batches.len() > 1 && units.iter().any(|u| u.source == Source::Whole))
        .map(|store| store.fetch_value_batches(batches.iter().map(|b| whole(b).collect()).collect(), 1));
    trace.mark("plan");

    // A large new output is allocated meanwhile, unless a read lands in it at once.
    let meanwhile = units.iter().all(|u| u.direct.is_none());
    std::thread::scope(|scope| {
        let out = OutputBuffer::start(scope, destination, context, stream, meanwhile)?;
        // Host-to-device copies of stored and host-decoded bytes run on their own stream, so
        // that a batch's copy overlaps the previous batch's decode.
        let copy_stream = context.new_stream()?;
        let kernels = context.kernels(crate::pipeline::KERNELS);
        #[cfg(feature = "fault-injection")]
        let kernels = kernels.filter(|_| config.injected_fault() != Some(crate::config::InjectedFault::NoKernels));
        let job = Job {
            source,
            fill_value: array.fill_value().as_ne_bytes(),
            units,
            chain,
            config,
            context,
            stream,
            copy_stream: &copy_stream,
            nvcomp,
            kernels,
            elem,
            fill_len,
            out: &out,
            relax: std::sync::atomic::AtomicBool::new(false),
            shrunk,
            learned: chain
                .compression
                .as_ref()
                .map(|c| context.learned(c.name(), &c.decode_rates().unwrap_or_default())),
        };
        // The caller's destination is not this read's memory.
        let results_len = ResultLog::buffer_len(units.len());
        let mut memory = ReadMemory::new(context, config, slots, results_len, destination.allocated())?;
        trace.mark("buffers");

        let mut report = RetrieveReport::new(DecodePath::Device, units.len());
        report.device_decoder = chain.compression.as_ref().map(|c| format!("{}: {}", c.name(), c.decoder()));
        report.io = Some(zarrs_gds_store::IoStatus::new(
            source.host_path(),
            "stored chunks are read to host memory, where they are checked",
        ));
        let mut run = BatchRun {
            deadline: Instant::now(),
            bound: config.batch_timeout(0),
            done: 0,
            report,
            trace,
            timed: Vec::new(),
            pending: (0..slots).map(|_| None).collect(),
            results: ResultLog::default(),
            cold: false,
            advised_batches: 0,
            ahead,
        };
        let result = (|| -> Result<(), GpuError> {
            for b in 0..batches.len() {
                run.batch(&job, &mut memory, &batches, b)?;
            }
            run.finish(&job, &mut memory, &batches)
        })();
        out.order_free_after(stream);
        // After an ordinary error (a corrupt chunk, a failed read), what is in flight gets a
        // batch's bound from now: only work that never ends marks the context lost.
        let deadline = if result.is_err() { run.deadline.max(after(run.bound)) } else { run.deadline };
        let peak = memory.peak();
        memory.release(&result, &[stream.as_ref(), copy_stream.as_ref()], deadline)?;
        result?;
        let BatchRun { mut report, trace, advised_batches, .. } = run;
        if advised_batches > 0 {
            if let Some(io) = report.io.as_mut() {
                let _ = write!(
                    io.reason,
                    "; the data was cold: {advised_batches} batches' values advised to the kernel (read ahead) before their reads"
                );
            }
        }
        report.peak_device_bytes = peak;
        report.stages = trace.finish(&format!(
            "{} bytes decoded on the device, {} chunks, {} batches",
            destination.bytes,
            report.chunks,
            batches.len()
        ));
        Ok((out.into_buffer()?, report))
    })
}

/// What a decoded read carries from batch to batch.
struct BatchRun {
    /// When the work enqueued so far must be done by (see `GpuConfig::batch_timeout`).
    deadline: Instant,
    /// The bound of the batch last planned: after an ordinary error, the work in flight gets
    /// that long from then.
    bound: std::time::Duration,
    /// Units whose batch has finished, for the progress callback.
    done: usize,
    report: RetrieveReport,
    trace: Trace,
    /// Decodes timed on the device, compared with their prediction once the read is done.
    timed: Vec<DecodeTiming>,
    /// Per slot, the batch in flight there: the slot's buffers are reused only after its event.
    pending: Vec<Option<Pending>>,
    /// Where each batch's results lie in the read's results buffer, and the checks to make.
    results: ResultLog,
    /// A batch was read at a disk's rate: the next ones are advised before they are read.
    cold: bool,
    /// Batches whose values the store was told of ahead of their reads.
    advised_batches: usize,
    /// A remote store's whole values, batch by batch, fetched ahead of the batches.
    ahead: Option<zarrs_gds_store::ValueBatches>,
}

/// A batch of at least this many stored bytes read slower than [`COLD_READ_RATE`] came from a
/// disk, not the page cache (smaller ones are dominated by latency).
const COLD_BATCH_BYTES: u64 = 32 << 20;
/// Bytes per second below which a batch's read is a disk's: page-cache reads into pinned memory
/// run at tens of GiB/s on a GPU host, local disks at a few.
const COLD_READ_RATE: f64 = 4.0 * (1u64 << 30) as f64;

impl BatchRun {
    /// One batch, stage by stage: its slot freed, its stored sizes, read, host check and routing,
    /// device decode, the host's share, results queued, placement; then its event.
    fn batch(
        &mut self,
        job: &Job<'_>,
        memory: &mut ReadMemory<'_>,
        batches: &[Vec<usize>],
        b: usize,
    ) -> Result<(), GpuError> {
        // A cancelled read stops here, before its next storage reads and output writes (the
        // batches in flight finish, as after any error).
        job.config.check_cancelled()?;
        let slot = b % self.pending.len();
        if self.settle_slot(job, slot, batches)? {
            self.trace.mark("wait slot");
        }
        let fetched = self
            .ahead
            .as_mut()
            .and_then(zarrs_gds_store::ValueBatches::next_batch)
            .transpose()
            .map_err(|e| GpuError::Array(e.into()))?;
        let mut batch = Batch::plan(job, &batches[b], (b, slot), fetched)?;
        self.bound = job.config.batch_timeout(batch.decoded_total);
        self.trace.mark("sizes");
        let (read_start, read_before) = (Instant::now(), self.report.bytes_read);
        let stored_bytes = batch.read(job, memory, &mut self.report)?;
        self.trace.mark("read");
        self.advise_next(job, batches, b, self.report.bytes_read - read_before, read_start.elapsed());
        if let Some(schedule) = batch.route(job, stored_bytes, batches.len() == 1 || job.shrunk)? {
            self.report.schedule = Some(schedule);
        }
        self.trace.mark("check");
        let (layout, timed) = batch.launch_device(job, memory)?;
        self.timed.extend(timed);
        self.trace.mark("launch");
        // Meanwhile the host decodes its chunks, each copied to the device as soon as it is done.
        self.report.host_decoded_chunks += batch.decode_host_share(job, memory, &layout)?;
        self.trace.mark("decode");
        batch.queue_results(job, &layout, &mut self.results, memory)?;
        job.config.check_cancelled()?;
        batch.place(job, &layout, memory, &mut self.report)?;
        let event = job.stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
        // The bound covers the device's work only: it starts once the batch is enqueued,
        // after its storage reads and host checks (slow storage is no device fault).
        let batch_deadline = after(self.bound);
        self.deadline = self.deadline.max(batch_deadline);
        self.pending[slot] = Some(Pending { event, deadline: batch_deadline, bound: self.bound, batch: batch.index });
        self.trace.mark("place");
        Ok(())
    }

    /// After batch `b`'s read of `bytes` in `took`: where that ran at a disk's rate rather than
    /// the page cache's (at least [`COLD_BATCH_BYTES`] below [`COLD_READ_RATE`]), the data is
    /// cold, and from then on the store is told of each next batch's values, so that the disk
    /// reads them while this one is checked and decoded (a `GdsStore` advises the kernel).
    fn advise_next(&mut self, job: &Job<'_>, batches: &[Vec<usize>], b: usize, bytes: u64, took: Duration) {
        // The first batch of each slot also allocates its buffers (the first read of a
        // process): judged from the batches after those.
        let judged = b >= self.pending.len();
        let cold = judged && bytes >= COLD_BATCH_BYTES && (bytes as f64) < COLD_READ_RATE * took.as_secs_f64();
        self.cold |= cold;
        let Some(next) = batches.get(b + 1).filter(|_| self.cold) else { return };
        // One piece of advice per value: the span of its ranges (a shard's inner chunks), or all
        // of it (0, 0).
        let mut spans: BTreeMap<&zarrs_storage::StoreKey, (u64, u64)> = BTreeMap::new();
        for &u in next {
            let unit = &job.units[u];
            let (start, end) = match unit.source {
                Source::Whole => (0, 0),
                Source::Range { offset, len } => (offset, offset.saturating_add(len)),
                Source::Missing => continue,
            };
            spans
                .entry(&unit.placement.key)
                .and_modify(|span| {
                    *span = if span.1 == 0 || end == 0 { (0, 0) } else { (span.0.min(start), span.1.max(end)) };
                })
                .or_insert((start, end));
        }
        let ranges = spans.into_iter().map(|(key, (start, end))| (key, start, end - start));
        if job.source.advise(ranges) {
            self.advised_batches += 1;
        }
    }

    /// Wait for the batch in flight in `slot`, if any (until its deadline), and report
    /// progress; whether there was one.
    fn settle_slot(&mut self, job: &Job<'_>, slot: usize, batches: &[Vec<usize>]) -> Result<bool, GpuError> {
        let Some(pending) = self.pending[slot].take() else { return Ok(false) };
        let batch = pending.batch;
        pending.wait(&batches[batch], job.units)?;
        self.done += batches[batch].len();
        job.config.report_progress(self.done, job.units.len());
        Ok(true)
    }

    /// After the last batch: every batch in flight awaited, oldest first, then the results
    /// checked (nvCOMP's statuses and sizes, the content checks).
    fn finish(&mut self, job: &Job<'_>, memory: &mut ReadMemory<'_>, batches: &[Vec<usize>]) -> Result<(), GpuError> {
        let slots = self.pending.len();
        // Oldest first: the slot after the last batch's holds the batch before it.
        for k in 1..=slots {
            self.settle_slot(job, (batches.len() + k) % slots, batches)?;
        }
        job.stream.synchronize().map_err(GpuError::cuda("decoding on the device"))?;
        self.trace.mark("final sync");
        self.results.check(job, memory.results().as_slice())?;
        // Only decodes that succeeded teach the scheduler.
        for t in self.timed.drain(..) {
            // Both events are done (the stream is): the query does not wait. Learning is a
            // hint: a failed query costs the read nothing.
            if let (Ok(seen_ms), Some(learned)) = (t.start.elapsed_ms(&t.end), &job.learned) {
                learned.slowness.observe(t.predicted_s, f64::from(seen_ms) * 1e-3);
            }
        }
        if let (true, Some(learned)) = (job.relax.load(std::sync::atomic::Ordering::Relaxed), &job.learned) {
            learned.slowness.relax();
        }
        Ok(())
    }
}
