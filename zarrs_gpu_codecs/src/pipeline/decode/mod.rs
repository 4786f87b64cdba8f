//! Device decoding of compressed chunks (and of every inner chunk of sharded arrays): stored
//! bytes are read into pinned host memory (where zstd frames, gzip headers and trailers and
//! crc32c trailers are checked), copied to the device in one transfer per batch on a copy stream
//! (overlapping the previous batch's decode), checked with nvCOMP CRC32C when the chain has
//! `crc32c`, decoded by nvCOMP's batched zstd or gzip (large chunks partly on host threads at the
//! same time; gzip's CRC-32 of the decoded bytes checked after), then placed into the output by
//! one kernel launch per batch.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaStream};
use nvcomp_sys::{sys as nv, Crc32, NvcompLibrary};
use rayon::prelude::*;
use zarrs::array::Array;
use zarrs_gds_store::GdsStore;
use zarrs_storage::{ReadableStorageTraits, StoreKey};

use crate::codecs::{self, DeviceBatch, HostCheck};
use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device::kernels::{Kernels, FAULT_SOURCE};
use crate::device::pool::DeviceBuffer;
use crate::error::GpuError;
use crate::pipeline::batch::{
    batch_budget, batches_by_size, coalesce, ensure, host_fraction, COALESCE_GAP, DECODED_ALIGN, LARGE_CHUNK,
    STORED_ALIGN,
};
use crate::pipeline::layout::MetaLayout;
use crate::pipeline::output::{Output, OutputAddress, OutputBuffer};
use crate::pipeline::place::{self, copy_dtod, fill_source};
use crate::pipeline::plan::{plan_chunks, PlacementPart};
use crate::pipeline::request::{merge_placements, merge_units, Request};
use crate::pipeline::route::{ChunkRef, DeviceChain, DevicePlan};
use crate::pipeline::shard::{sharded_units, ShardSource};
use crate::pipeline::unit::{Source, Unit};
use crate::reader::{DeviceMirror, DeviceReadRequest, DeviceRowsRequest, HostReadRequest, PinnedBuffer};
use crate::report::{DecodePath, RetrieveReport, Trace};
use crate::schedule::{DecodeRates, Learned};

mod host;
use host::{decode_on_host, HostRing};

/// How one unit of a batch is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Missing: filled with the fill value.
    Missing,
    /// nvCOMP on the device (or, with no compression in the chain, the stored bytes themselves).
    Device,
    /// zstd or flate2 on a host thread (chunks nvCOMP cannot take, or the host's share of large
    /// chunks), then one copy.
    Host,
}

/// A unit's device decode result, checked once the batches are done: where its decoded size
/// (u64) and status (u32) lie in the results buffer, and for a chunk carrying a digest, the
/// stored value and where the computed one and its status (u32 each) lie.
struct DecodeCheck {
    unit: usize,
    size: usize,
    status: usize,
    digest: Option<(u32, usize, usize)>,
}

struct Item {
    /// Index into the units.
    unit: usize,
    stored_len: u64,
    /// Bytes of the stored chunk that are the zstd frame, gzip member or data: without the crc32c.
    data_len: u64,
    host_offset: u64,
    decoded_offset: u64,
    route: Route,
    /// The crc32c stored after the data, when the chain has crc32c.
    crc: Option<u32>,
    /// The digest of the decoded bytes the stored data carries (gzip CRC-32, zstd XXH64).
    digest: Option<u32>,
}

/// Decode the subsets of `request` on the device: their chunks (`chunks`, each subset's; or,
/// for sharded arrays, the inner chunks meeting them) are stored as `plan` says. A chunk met by
/// several subsets is read and decoded once.
#[allow(clippy::too_many_arguments)]
pub(crate) fn retrieve_decoded<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    request: &Request,
    chunks: Vec<Vec<ChunkRef>>,
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    plan: &DevicePlan,
    nvcomp: Option<&NvcompLibrary>,
    output: Output,
) -> Result<(Option<CudaSlice<u8>>, RetrieveReport), GpuError> {
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
    // Rows of uncompressed chunks are read with preadv on a GdsStore's files: only where its
    // device reads would go through preads anyway (a forced GDS backend errs, and native GDS is
    // never skipped). Asked only for raw chains (checked ones read to host memory, whatever the
    // backend; asking would open cuFile's driver for nothing).
    let rows = match gds {
        Some(store) if config.row_reads() && plan.chain.is_raw() => {
            store.pread_reason(config.backend()).map_err(crate::reader::DeviceReadError::from)?.is_some()
        }
        _ => false,
    };
    let out_bytes = request.out_bytes;
    if plan.shards.is_empty() {
        let mut placements = Vec::new();
        for ((subset, base), chunks) in request.parts().zip(chunks) {
            for mut placement in plan_chunks(elem, subset, chunks)? {
                placement.shift_output(base)?;
                placements.push(placement);
            }
        }
        let unit = if plan.chain.is_raw() { Unit::raw } else { Unit::whole };
        let mut units: Vec<Unit> = merge_placements(placements)?.into_iter().map(unit).collect();
        if rows {
            units.iter_mut().for_each(Unit::read_as_rows);
        }
        return decode_units(array, &units, gds, config, context, stream, out_bytes, &plan.chain, nvcomp, output);
    }
    let storage = array.storage();
    // A request of several subsets reads each shard's index once: through the caller's cache,
    // else one of its own.
    let own_cache;
    let cache = match config.shard_index_cache() {
        Some(cache) => Some(cache),
        None if request.subsets.len() > 1 => {
            own_cache = crate::shard_index_cache::ShardIndexCache::new();
            Some(&own_cache)
        }
        None => None,
    };
    if let Some(cache) = cache {
        cache.bind(&storage);
    }
    let source = ShardSource { storage: storage.as_ref(), gds, cache };
    let mut units = Vec::new();
    let mut index_bytes = 0;
    for ((subset, base), shards) in request.parts().zip(chunks) {
        let (part, read) = sharded_units(&source, context.reader(), &plan.shards, elem, subset, shards)?;
        index_bytes += read;
        for mut unit in part {
            unit.placement.shift_output(base)?;
            units.push(unit);
        }
    }
    let mut units = if request.subsets.len() > 1 { merge_units(units)? } else { units };
    if plan.chain.is_raw() {
        narrow_raw(&mut units)?;
        if rows {
            units.iter_mut().for_each(Unit::read_as_rows);
        }
    }
    let (out, mut report) =
        decode_units(array, &units, gds, config, context, stream, out_bytes, &plan.chain, nvcomp, output)?;
    report.bytes_read += index_bytes;
    Ok((out, report))
}

/// Read, check, decode and place `units` (chunks or inner chunks, all stored as `chain` says)
/// into an output of `out_bytes` (the request's). Per batch: stored sizes, read, host check and
/// routing, device decode (with the content checks), host decode of the host's share, results
/// queued, placement; then the results checked and the buffers released.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_units<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    units: &[Unit],
    gds: Option<&GdsStore>,
    config: &GpuConfig,
    context: &GpuContext,
    stream: &Arc<CudaStream>,
    out_bytes: u64,
    chain: &DeviceChain,
    nvcomp: Option<&NvcompLibrary>,
    output: Output,
) -> Result<(Option<CudaSlice<u8>>, RetrieveReport), GpuError> {
    let mut trace = Trace::new(config.trace());
    let elem = array.data_type().fixed_size().expect("checked by check_element") as u64;
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
    let (batches, shrunk) =
        plan_batches(units, chain, config, free, nvcomp, output.allocated(out_bytes).saturating_add(fill_len))?;
    let slots = if batches.len() > 1 { 2 } else { 1 };
    trace.mark("plan");

    // A large new output is allocated meanwhile, unless a read lands in it at once.
    let meanwhile = units.iter().all(|u| u.direct.is_none());
    std::thread::scope(|scope| {
        let out = OutputBuffer::start(scope, output, context, stream, out_bytes, meanwhile)?;
        // Host-to-device copies of stored and host-decoded bytes run on their own stream, so
        // that a batch's copy overlaps the previous batch's decode.
        let copy_stream = context.new_stream()?;
        let kernels = context.kernels(&[&[place::SOURCE, FAULT_SOURCE], codecs::KERNEL_SOURCES]);
        #[cfg(feature = "fault-injection")]
        let kernels = kernels.filter(|_| config.injected_fault() != Some(crate::config::InjectedFault::NoKernels));
        let job = Job {
            array,
            gds,
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
        let mut buffers = Buffers {
            slots: (0..slots).map(|_| Slot::default()).collect(),
            results: ResultLog::new(context, units.len())?,
            fill: None,
            scratch: None,
            // The caller's destination is not this read's memory.
            taken: Taken::new(output.allocated(out_bytes)),
            host_ring: HostRing::default(),
        };
        trace.mark("buffers");

        let mut report = RetrieveReport::new(DecodePath::Device, units.len());
        report.io = Some(zarrs_gds_store::IoStatus::new(
            if gds.is_some() { zarrs_gds_store::IoPath::Posix } else { zarrs_gds_store::IoPath::Staged },
            "stored chunks are read to host memory, where they are checked",
        ));
        let mut run = BatchRun {
            deadline: Instant::now(),
            bound: config.batch_timeout(0),
            done: 0,
            report,
            trace,
            timed: Vec::new(),
        };
        let result = (|| -> Result<(), GpuError> {
            for b in 0..batches.len() {
                run.batch(&job, &mut buffers, &batches, b)?;
            }
            run.finish(&job, &mut buffers, &batches)
        })();
        out.order_free_after(stream);
        // After an ordinary error (a corrupt chunk, a failed read), what is in flight gets a
        // batch's bound from now: only work that never ends marks the context lost.
        let deadline = if result.is_err() { run.deadline.max(after(run.bound)) } else { run.deadline };
        let peak = buffers.taken.peak.get();
        release(context, buffers, &result, &[stream.as_ref(), copy_stream.as_ref()], deadline)?;
        result?;
        let BatchRun { mut report, trace, .. } = run;
        report.peak_device_bytes = peak;
        report.stages = trace.finish(&format!(
            "{out_bytes} bytes decoded on the device, {} chunks, {} batches",
            report.chunks,
            batches.len()
        ));
        Ok((out.into_buffer()?, report))
    })
}

/// Batches whose decoder scratch may reach this many bytes (nvCOMP's bound, which assumes the
/// worst frame everywhere) ask the codec what their stored bytes need
/// ([`DeviceCodec::scratch_for`]): for zstd about 45% of the bound, 7 GiB less for a batch of
/// 4096 frames of 1 MiB, memory that a bounded pool would map again for every read. Smaller
/// batches skip the query, which waits for the copy stream.
const EXACT_SCRATCH_FROM: u64 = 256 << 20;

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
}

impl BatchRun {
    /// One batch, stage by stage: its slot freed, its stored sizes, read, host check and routing,
    /// device decode, the host's share, results queued, placement; then its event.
    fn batch<S: ReadableStorageTraits + ?Sized + 'static>(
        &mut self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
        batches: &[Vec<usize>],
        b: usize,
    ) -> Result<(), GpuError> {
        let slot = b % buffers.slots.len();
        if self.settle_slot(job, buffers, slot, batches)? {
            self.trace.mark("wait slot");
        }
        let mut batch = Batch::plan(job, &batches[b], b, slot)?;
        self.bound = job.config.batch_timeout(batch.decoded_total);
        self.trace.mark("sizes");
        let stored_bytes = batch.read(job, buffers, &mut self.report)?;
        self.trace.mark("read");
        if let Some(schedule) = batch.route(job, stored_bytes, batches.len() == 1 || job.shrunk)? {
            self.report.schedule = Some(schedule);
        }
        self.trace.mark("check");
        let (layout, timed) = batch.launch_device(job, buffers)?;
        self.timed.extend(timed);
        self.trace.mark("launch");
        // Meanwhile the host decodes its chunks, each copied to the device as soon as it is done.
        self.report.host_decoded_chunks += batch.decode_host_share(job, buffers, &layout)?;
        self.trace.mark("decode");
        batch.queue_results(job, &layout, &mut buffers.results)?;
        let had_fill = buffers.fill.is_some();
        batch.place(job, &layout, &mut buffers.fill, &mut self.report)?;
        if let (false, Some(fill)) = (had_fill, &buffers.fill) {
            buffers.taken.add(fill.len() as u64); // made at the first missing unit
        }
        let event = job.stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
        // The bound covers the device's work only: it starts once the batch is enqueued,
        // after its storage reads and host checks (slow storage is no device fault).
        let batch_deadline = after(self.bound);
        self.deadline = self.deadline.max(batch_deadline);
        buffers.slots[slot].pending =
            Some(Pending { event, deadline: batch_deadline, bound: self.bound, batch: batch.index });
        self.trace.mark("place");
        Ok(())
    }

    /// Wait for the batch in flight in `slot`, if any (until its deadline), and report
    /// progress; whether there was one.
    fn settle_slot<S: ?Sized>(
        &mut self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
        slot: usize,
        batches: &[Vec<usize>],
    ) -> Result<bool, GpuError> {
        let Some(pending) = buffers.slots[slot].pending.take() else { return Ok(false) };
        let batch = pending.batch;
        pending.wait(&batches[batch], job.units)?;
        self.done += batches[batch].len();
        job.config.report_progress(self.done, job.units.len());
        Ok(true)
    }

    /// After the last batch: every batch in flight awaited, oldest first, then the results
    /// checked (nvCOMP's statuses and sizes, the content checks).
    fn finish<S: ?Sized>(
        &mut self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
        batches: &[Vec<usize>],
    ) -> Result<(), GpuError> {
        let slots = buffers.slots.len();
        // Oldest first: the slot after the last batch's holds the batch before it.
        for k in 1..=slots {
            self.settle_slot(job, buffers, (batches.len() + k) % slots, batches)?;
        }
        job.stream.synchronize().map_err(GpuError::cuda("decoding on the device"))?;
        self.trace.mark("final sync");
        buffers.results.check(job)?;
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

/// What every stage of one decoded read shares.
struct Job<'a, S: ?Sized> {
    /// The array read (its storage, its fill value).
    array: &'a Array<S>,
    /// The array's store as a GdsStore, when it is one.
    gds: Option<&'a GdsStore>,
    units: &'a [Unit],
    chain: &'a DeviceChain,
    config: &'a GpuConfig,
    context: &'a GpuContext,
    stream: &'a Arc<CudaStream>,
    /// Host-to-device copies and crc32c checks, overlapping the previous batch's decode.
    copy_stream: &'a Arc<CudaStream>,
    nvcomp: Option<&'a NvcompLibrary>,
    /// Our kernels (placement, gather, XXH64); None without NVRTC.
    kernels: Option<&'a Kernels>,
    elem: u64,
    /// Bytes of the fill block for missing units: the longest read.
    fill_len: u64,
    /// The output (reads of units with `direct` land in it).
    out: &'a dyn OutputAddress,
    /// A batch of this read went wholly to host threads because of nvCOMP's learned slowness
    /// (`DeviceSlowness::sends_all_to_host`): the factor relaxes once, when the read has succeeded.
    relax: std::sync::atomic::AtomicBool,
    /// The batches were shrunk to fit the free device memory: each is split between host threads
    /// and nvCOMP by cost, as a read of one batch is (nvCOMP's fixed cost per call weighs on
    /// many small batches, and host threads need no scratch).
    shrunk: bool,
    /// What this device's reads have shown of the chain's codec (None without one).
    learned: Option<Arc<Learned>>,
}

impl<S: ?Sized> Job<'_, S> {
    fn decoded_len(&self, u: usize) -> u64 {
        self.units[u].decoded_len()
    }

    /// Where a batch lies in a slot's staging when `on_device` decode there: stored bytes,
    /// decoded bytes, the decoder's scratch, metadata.
    fn staging<'i>(
        &self,
        on_device: impl Iterator<Item = &'i Item>,
        stored_total: u64,
        decoded_total: u64,
        meta_bytes: u64,
    ) -> Result<Staging, GpuError> {
        let (n_dec, max_decoded) =
            on_device.fold((0usize, 0u64), |(n, max), it| (n + 1, max.max(self.decoded_len(it.unit))));
        let temp_bytes = match &self.chain.compression {
            Some(codec) if n_dec > 0 => {
                codec.temp_bytes(self.nvcomp, n_dec, max_decoded as usize, decoded_total as usize)?
            }
            _ => 0,
        };
        let decoded = stored_total.next_multiple_of(DECODED_ALIGN);
        let meta = decoded + if self.chain.compression.is_some() { decoded_total } else { 0 };
        Ok(Staging { decoded, temp_bytes, meta, len: meta + meta_bytes, max_decoded })
    }
}

/// Offsets in a slot's staging (see [`Job::staging`]) and its length, and the decoder's scratch
/// (one buffer of the read's, [`ensure_scratch`]).
struct Staging {
    decoded: u64,
    temp_bytes: usize,
    meta: u64,
    len: u64,
    /// The largest unit decoded on the device.
    max_decoded: u64,
}

/// One of the (two) places batches alternate in: its buffers, and the batch whose device work
/// still uses them (its event). A slot's buffers are reused only after that event.
#[derive(Default)]
struct Slot {
    /// Device staging: stored bytes, decoded bytes, the decoder's scratch, metadata.
    staging: Option<DeviceBuffer>,
    /// Pinned stored chunks, then the mirror of the metadata for async copies.
    host: Option<PinnedBuffer>,
    /// The batch in flight here.
    pending: Option<Pending>,
}

/// A read's buffers: its slots, and what the whole read shares.
struct Buffers {
    slots: Vec<Slot>,
    /// What nvCOMP reports back, batch after batch, and the checks to make of it.
    results: ResultLog,
    /// The fill value block for missing units.
    fill: Option<DeviceBuffer>,
    /// The decoder's scratch, one for both slots: every batch decodes on the read's stream, so
    /// batch k+1's decode starts after batch k's has finished with it (nvCOMP's zstd scratch is
    /// about 3 times a batch's decoded bytes: two of them doubled a read's working set).
    scratch: Option<DeviceBuffer>,
    taken: Taken,
    /// Chunks decoded on host threads, batch after batch, on their way to the device.
    host_ring: HostRing,
}

/// Device memory a read has taken (its output where it allocates it, staging, scratch), against
/// `GpuConfig::with_device_memory_cap`, and the most it held at once (its report's peak).
struct Taken {
    now: std::cell::Cell<u64>,
    peak: std::cell::Cell<u64>,
}

impl Taken {
    fn new(bytes: u64) -> Self {
        Self { now: bytes.into(), peak: bytes.into() }
    }

    /// What the read would hold with `len` more bytes.
    fn with(&self, len: u64) -> u64 {
        self.now.get().saturating_add(len)
    }

    fn add(&self, len: u64) {
        self.now.set(self.with(len));
        self.peak.set(self.peak.get().max(self.now.get()));
    }

    fn sub(&self, len: u64) {
        self.now.set(self.now.get().saturating_sub(len));
    }
}

/// The decoder's scratch ([`Buffers::scratch`]) of at least `len` bytes (its address), within the
/// read's device memory cap. A scratch too small is replaced only after the decodes queued on the
/// read's stream, which may still use it, have finished.
fn ensure_scratch<S: ?Sized>(
    scratch: &mut Option<DeviceBuffer>,
    taken: &Taken,
    job: &Job<'_, S>,
    len: usize,
) -> Result<u64, GpuError> {
    if scratch.as_ref().is_some_and(|b| b.len() < len) {
        job.stream.synchronize().map_err(GpuError::cuda("waiting for a decode's scratch"))?;
    }
    Ok(ensure_counted(taken, job, scratch, len as u64)?.0.ptr())
}

/// [`ensure`] a device buffer from the context's pool, counted in `taken` against the read's
/// device memory cap (a replaced buffer no longer counts): the buffer, and whether it is new.
fn ensure_counted<'b, S: ?Sized>(
    taken: &Taken,
    job: &Job<'_, S>,
    buffer: &'b mut Option<DeviceBuffer>,
    len: u64,
) -> Result<(&'b mut DeviceBuffer, bool), GpuError> {
    let take = |len: usize| -> Result<DeviceBuffer, GpuError> {
        let cap = job.config.device_memory_cap();
        let over = |now: u64| cap.filter(|&cap| now > cap).map(|cap| (now, cap));
        if let Some((needed, free)) = over(taken.with(len as u64)) {
            return Err(GpuError::OutOfMemory { needed, free, device: job.config.device() });
        }
        // A pooled buffer may be larger than asked: what the read holds is its whole length.
        let buffer = job.context.take_staging(len)?;
        if let Some((needed, free)) = over(taken.with(buffer.len() as u64)) {
            job.context.give_staging(buffer);
            return Err(GpuError::OutOfMemory { needed, free, device: job.config.device() });
        }
        taken.add(buffer.len() as u64);
        Ok(buffer)
    };
    // A buffer outgrown is freed, not pooled: kept, it and its larger successor would both
    // hold device memory, and the successor's allocation could fail for want of it.
    let give = |old: DeviceBuffer| {
        taken.sub(old.len() as u64);
        drop(old);
    };
    ensure(buffer, len, DeviceBuffer::len, take, give)
}

/// Device memory a batch's metadata takes: its [`MetaLayout`] with every unit checked, decoded
/// and digested, the most any routing of the batch takes.
fn meta_len(units: &[Unit], chain: &DeviceChain, batch: &[usize]) -> u64 {
    let (gather, copies) = table_room(units, chain, batch.iter().copied());
    MetaLayout::new(batch.len(), batch.len(), true, gather, copies).len()
}

/// Room for a batch's placement tables: a gather job per part of each unit (chains that gather;
/// a unit several subsets of a request meet has a part for each) and every unit's strided
/// copies, as table entries (rows wider than `place::MAX_ROW` take several).
fn table_room(units: &[Unit], chain: &DeviceChain, batch: impl Iterator<Item = usize>) -> (usize, usize) {
    let pieces = |u: usize| units[u].placement.copies.iter().map(place::row_pieces).sum::<usize>();
    let (parts, copies) = batch.fold((0, 0), |(n, c), u| (n + units[u].placement.parts.len(), c + pieces(u)));
    (if chain.needs_gather() { parts } else { 0 }, copies)
}

/// The batches of `units`, after checking that the output this read allocates (`out_bytes`:
/// none for a caller's destination) and two slots of the largest batch (stored bytes at most
/// about the decoded bytes, decoded bytes, nvCOMP's temp space, metadata) fit the `free` device
/// memory, before anything is allocated. Where they do not, the batches shrink (down to the
/// largest unit alone) until they fit with [`HEADROOM`] to spare: a device filled by PyTorch or
/// CuPy still reads, in more batches, what fits beside its output. The flag: whether they shrank.
fn plan_batches(
    units: &[Unit],
    chain: &DeviceChain,
    config: &GpuConfig,
    free: u64,
    nvcomp: Option<&NvcompLibrary>,
    out_bytes: u64,
) -> Result<(Vec<Vec<usize>>, bool), GpuError> {
    let staged_len = |u: usize| staged_len(&units[u], chain);
    let largest = (0..units.len()).map(staged_len).max().unwrap_or(0);
    // Every unit is staged whole (decoded, or the bytes read of an uncompressed one): one that
    // (with the output) exceeds the free memory is refused before any batch is planned, which
    // also keeps the batch arithmetic (and nvCOMP's sizes) far from overflow.
    let refuse = |needed: u64| -> Result<(), GpuError> {
        if needed > free {
            return Err(GpuError::OutOfMemory { needed, free, device: config.device() });
        }
        Ok(())
    };
    refuse(out_bytes.saturating_add(largest))?;
    let small_free = chain.compression.as_ref().filter(|c| c.prefers_large_batches()).map(|_| free);
    let mut budget =
        batch_budget(config.staging_bytes() as u64, config.staging_is_set(), largest, small_free, out_bytes);
    let floor = largest.next_multiple_of(DECODED_ALIGN).max(DECODED_ALIGN);
    let mut temps = std::collections::HashMap::new();
    let room = free.saturating_sub(out_bytes).saturating_sub(HEADROOM);
    let mut shrunk = false;
    loop {
        let batches = batches_by_size((0..units.len()).map(staged_len), budget);
        let set = working_set(units, chain, config, nvcomp, &batches, &mut temps)?;
        if set <= room || budget <= floor {
            refuse(set.saturating_add(out_bytes))?;
            return Ok((batches, shrunk));
        }
        // The working set grows about linearly with the budget: aim at what fits, and shrink by
        // an eighth at least, so that batches whose shape does not change still end.
        let aim = (budget as f64 * room as f64 / set as f64) as u64;
        budget = aim.min(budget - budget / 8).max(floor);
        shrunk = true;
    }
}

/// Device memory a read leaves free beyond its plan: for what it does not plan (the fill block,
/// streams and events), and the driver's granularity.
const HEADROOM: u64 = 16 << 20;

/// What a unit takes in a slot's staging: its decoded bytes (and stored ones as many at most),
/// the bytes read for an uncompressed one, nothing when read straight into the output.
fn staged_len(unit: &Unit, chain: &DeviceChain) -> u64 {
    match unit {
        unit if unit.direct.is_some() => 0,
        unit if !chain.is_checked() => unit.raw_len(),
        unit => unit.decoded_len(),
    }
}

/// The device memory `batches` take beside the output: two slots of the largest batch (one when
/// there is one batch) and one decoder scratch. nvCOMP's temp sizes are asked once per batch
/// shape (`temps`: most batches of a read have the same).
fn working_set(
    units: &[Unit],
    chain: &DeviceChain,
    config: &GpuConfig,
    nvcomp: Option<&NvcompLibrary>,
    batches: &[Vec<usize>],
    temps: &mut std::collections::HashMap<(usize, u64, u64), u64>,
) -> Result<u64, GpuError> {
    let staged_len = |u: usize| staged_len(&units[u], chain);
    let slots = if batches.len() > 1 { 2 } else { 1 };
    let (mut largest_slot, mut largest_temp) = (0u64, 0u64);
    for batch in batches {
        // Saturating: a sum past 2^64 (a huge staging budget) is refused by the caller.
        let decoded = batch.iter().fold(0u64, |a, &u| a.saturating_add(staged_len(u).next_multiple_of(DECODED_ALIGN)));
        let max_chunk = batch.iter().map(|&u| units[u].decoded_len()).max().unwrap_or(0);
        let temp = match &chain.compression {
            Some(codec) if chain.device_may_decode(config.decode_trust()) => {
                let key = (batch.len(), max_chunk, decoded);
                if let Some(&temp) = temps.get(&key) {
                    temp
                } else {
                    let temp = codec.temp_bytes(nvcomp, batch.len(), max_chunk as usize, decoded as usize)? as u64;
                    *temps.entry(key).or_insert(temp)
                }
            }
            _ => 0,
        };
        let slot = decoded.saturating_mul(2).saturating_add(meta_len(units, chain, batch));
        largest_slot = largest_slot.max(slot);
        // One scratch serves both slots (`Buffers::scratch`).
        largest_temp = largest_temp.max(temp);
    }
    // A buffer that a later, larger batch outgrows is replaced by one a quarter larger than asked
    // (`ensure`): each may reach that.
    let grown = |bytes: u64| bytes.saturating_add(bytes / 4);
    Ok(grown(largest_slot).saturating_mul(slots).saturating_add(grown(largest_temp)))
}

/// The stored (offset, length) of each unit of `batch`, None when missing: whole values are
/// sized here, batch by batch, so that later batches' queries overlap the device's work on
/// earlier ones.
fn stored_spans<S: ReadableStorageTraits + ?Sized>(
    job: &Job<'_, S>,
    storage: &S,
    batch: &[usize],
) -> Result<Vec<Option<(u64, u64)>>, GpuError> {
    let units = job.units;
    job.context.reader().install(|| {
        batch
            .par_iter()
            .map(|&u| match units[u].source {
                Source::Whole => {
                    let size = storage.size_key(&units[u].placement.key).map_err(|e| GpuError::Array(e.into()))?;
                    size.map(|len| whole_span(&units[u], len)).transpose()
                }
                Source::Range { offset, len } => Ok(Some((offset, len))),
                Source::Missing => Ok(None),
            })
            .collect()
    })
}

/// The span of `unit`'s whole value of `len` bytes, its size checked as soon as it is learned,
/// before any buffer is sized to it.
fn whole_span(unit: &Unit, len: u64) -> Result<(u64, u64), GpuError> {
    crate::pipeline::unit::check_stored_len(len, unit.decoded_len()).map_err(|reason| unit.error(reason))?;
    Ok((0, len))
}

/// A batch in progress, stage by stage: its units' reads and items, where it lies in its slot.
struct Batch {
    /// Its place among the read's batches.
    index: usize,
    /// The slot whose buffers it uses.
    slot: usize,
    /// Its reads: the first `staged` land in the slot's staging at their `at`, the rest straight
    /// into the output at theirs.
    requests: Vec<HostReadRequest>,
    staged: usize,
    /// Per stored unit in batch order, its read and staging offset.
    at: Vec<(ReadOf, u64)>,
    /// The rows of units read as rows ([`Reads::rows`]).
    rows: Vec<DeviceRowsRequest>,
    stored_total: u64,
    decoded_total: u64,
    items: Vec<Item>,
    /// Device memory its metadata may take ([`meta_len`]).
    meta_bytes: u64,
    /// Where the metadata staging starts in the slot's pinned buffer; set by [`Batch::read`].
    host_meta_at: u64,
}

impl Batch {
    /// The batch of `units` (`index`, in `slot`): its stored sizes and its reads.
    fn plan<S: ReadableStorageTraits + ?Sized>(
        job: &Job<'_, S>,
        units: &[usize],
        index: usize,
        slot: usize,
    ) -> Result<Self, GpuError> {
        let spans = stored_spans(job, job.array.storage().as_ref(), units)?;
        let Reads { requests, staged, at, rows, stored_total, items, decoded_total } =
            plan_reads(job.units, units, &spans);
        let meta_bytes = meta_len(job.units, job.chain, units);
        Ok(Batch {
            index,
            slot,
            requests,
            staged,
            at,
            rows,
            stored_total,
            decoded_total,
            items,
            meta_bytes,
            host_meta_at: 0,
        })
    }

    /// Read the batch's stored bytes: into the slot's pinned buffer, where they are checked, each
    /// piece copied on to the slot's device staging as soon as it is read (the copy stream waits
    /// for those copies), or (chains with nothing to check) straight into the device staging
    /// (GdsStore: cuFile where native GDS works). Units whose value disappeared since it was
    /// sized become missing. Returns the slot's pinned buffer (the stored bytes, when checked).
    fn read<'b, S: ReadableStorageTraits + ?Sized + 'static>(
        &mut self,
        job: &Job<'_, S>,
        buffers: &'b mut Buffers,
        report: &mut RetrieveReport,
    ) -> Result<&'b [u8], GpuError> {
        let (chain, config) = (job.chain, job.config);
        let (stored_total, meta_bytes) = (self.stored_total, self.meta_bytes);
        // Room for the batch as if every stored unit decoded on the device: the stored bytes
        // are copied to the staging while they are read, before the host check routes them.
        let may_decode = chain.device_may_decode(config.decode_trust());
        let stored = self.items.iter().filter(|it| it.route != Route::Missing && may_decode);
        let staging = job.staging(stored, stored_total, self.decoded_total, meta_bytes)?.len;
        let (context, requests, staged) = (job.context, self.requests.as_slice(), self.staged);
        let storage = job.array.storage();
        let direct = !chain.is_checked();
        // The host keeps only the metadata staging when the bytes go straight to the device.
        let host_meta_at = if direct { 0 } else { stored_total.next_multiple_of(STORED_ALIGN) };
        let Buffers { slots, taken, .. } = buffers;
        let Slot { host, staging: device, .. } = &mut slots[self.slot];
        let (hbuf, _) = ensure(
            host,
            host_meta_at + meta_bytes,
            PinnedBuffer::len,
            |len| context.take_pinned(len),
            |old| context.give_pinned(old),
        )?;
        let cbase = ensure_counted(taken, job, device, staging)?.0.ptr();
        let found = if direct {
            let out_ptr = if staged < requests.len() { job.out.ptr()? } else { 0 };
            let base = |i: usize| if i < staged { cbase } else { out_ptr };
            let requests: Vec<DeviceReadRequest> = requests
                .iter()
                .enumerate()
                .map(|(i, r)| DeviceReadRequest {
                    key: r.key.clone(),
                    offset: r.offset,
                    len: r.len,
                    dst: base(i) + r.at as u64,
                    value_len: r.value_len,
                })
                .collect();
            // SAFETY: each staged request lands at its offset below stored_total in the slot's
            // staging, which has room for stored_total bytes; coalesced requests do not overlap; the
            // slot's previous batch has finished (its event, awaited before this batch). The others
            // land on the disjoint runs of the output their chunks' placements name.
            let outcome = unsafe {
                match job.gds {
                    Some(store) => context.reader().read_gds_to_device(
                        store,
                        &requests,
                        job.config.backend(),
                        Some(job.copy_stream),
                    )?,
                    None => {
                        context.reader().read_store_to_device(storage.as_ref(), &requests, Some(job.copy_stream))?
                    }
                }
            };
            report.io = Some(outcome.status);
            outcome.found
        } else {
            debug_assert!(self.rows.is_empty(), "checked chains read no units as rows");
            debug_assert_eq!(staged, requests.len(), "checked chains read nothing straight into the output");
            let hbuf = &mut hbuf.as_mut_slice()[..stored_total as usize];
            // SAFETY: the slot's staging starts with room for stored_total bytes, and its previous
            // batch has finished (its event, awaited before this batch); the pinned host buffer is
            // reused only after this batch's event, which follows the copy stream's wait for the copies.
            let mirror = Some(unsafe { DeviceMirror::new(cbase, stored_total as usize, job.copy_stream) });
            match job.gds {
                Some(store) => context.reader().read_gds_to_host(store, requests, hbuf, mirror)?,
                None => context.reader().read_store_to_host(storage.as_ref(), requests, hbuf, mirror)?,
            }
        };
        report.bytes_read += requests.iter().zip(&found).filter(|(_, &f)| f).map(|(r, _)| r.len as u64).sum::<u64>();
        let rows_found = Self::read_rows(&mut self.rows, job, cbase)?;
        if !self.rows.is_empty() {
            // Rows are read only where the store's device reads take preads: the path is that, and
            // the reason names both kinds of read when there were ranges too.
            const ROWS: &str = "rows of uncompressed chunks read with preadv into pinned memory, copied to the device";
            let reason = match report.io.take() {
                Some(io) if !requests.is_empty() => format!("{ROWS}; other ranges: {}", io.reason),
                _ => ROWS.to_string(),
            };
            report.io = Some(zarrs_gds_store::IoStatus::new(zarrs_gds_store::IoPath::Posix, reason));
        }
        report.bytes_read +=
            self.rows.iter().zip(&rows_found).filter(|(_, &f)| f).map(|(r, _)| r.packed_len()).sum::<u64>();
        let mut next_span = self.at.iter();
        for it in self.items.iter_mut().filter(|it| it.route != Route::Missing) {
            let present = match &next_span.next().expect("one per span").0 {
                ReadOf::Request(r) => found[*r],
                ReadOf::Rows(rows) => {
                    let found = &rows_found[rows.clone()];
                    if found.iter().any(|&f| f != found[0]) {
                        return Err(job.units[it.unit].error("its value disappeared while its rows were read"));
                    }
                    found.first().copied().unwrap_or(true)
                }
            };
            if !present {
                it.route = Route::Missing; // deleted between the size query and the read
            }
        }
        self.host_meta_at = host_meta_at;
        Ok(hbuf.as_slice())
    }

    /// Read `rows` (the batch's units read as rows) into the slot's staging at `cbase`, packed
    /// (after the coalesced reads; their `dst`, staging offsets, become addresses), ordered before
    /// the copy stream's later work like the other reads. Per row read, whether its value exists.
    fn read_rows<S: ?Sized>(
        rows: &mut [DeviceRowsRequest],
        job: &Job<'_, S>,
        cbase: u64,
    ) -> Result<Vec<bool>, GpuError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let store = job.gds.ok_or_else(|| GpuError::Unsupported("rows are read from a GdsStore only".into()))?;
        for r in rows.iter_mut() {
            r.dst += cbase;
        }
        // SAFETY: each row read lands at its packed offset in the slot's staging, below
        // stored_total (which the staging holds), after the coalesced reads and disjoint from
        // them and from each other; the slot's previous batch has finished (its event).
        let found = unsafe { job.context.reader().read_gds_rows_to_device(store, rows, Some(job.copy_stream)) }?;
        Ok(found)
    }

    /// The host check of every stored unit of the batch (`stored`: its bytes as read), then its
    /// route: nvCOMP, or host threads (what nvCOMP cannot or may not take, the host's share the
    /// scheduler gives it, inputs at an alignment nvCOMP cannot take). `only`: the read's one batch.
    fn route<S: ?Sized>(&mut self, job: &Job<'_, S>, stored: &[u8], only: bool) -> Result<Option<String>, GpuError> {
        let items = &mut self.items;
        check_stored(job, items, stored)?;
        let schedule = route_by_cost(job, items, only);
        if let Some(codec) = &job.chain.compression {
            // 1 today: zstd and naive gzip take any byte; staging itself is 256-byte aligned.
            let align = codec.input_alignment(job.nvcomp)? as u64;
            for it in items.iter_mut().filter(|it| it.route == Route::Device && it.host_offset % align.max(1) != 0) {
                it.route = Route::Host;
            }
        }
        Ok(schedule)
    }

    /// The units nvCOMP decodes.
    fn on_device(&self) -> Vec<&Item> {
        self.items.iter().filter(|it| it.route == Route::Device).collect()
    }

    /// The device's part of the batch: its stored bytes in the slot's staging, crc32c verified
    /// there before anything is decoded, then the device codec's decode and the digests of the
    /// decoded bytes (gzip CRC-32, zstd XXH64) on the read's stream.
    /// With the decode's timing, when it is long enough to teach the scheduler.
    fn launch_device<S: ?Sized>(
        &self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
    ) -> Result<(Layout, Option<DecodeTiming>), GpuError> {
        let on_device = self.on_device();
        let (layout, staging) = self.verify_stored(job, buffers, &on_device)?;
        let timed = self.decode_on_device(job, buffers, &layout, &staging, &on_device)?;
        Ok((layout, timed))
    }

    /// The batch's layout in its slot's staging (replaced when it is too small for `on_device`),
    /// where its stored bytes are, crc32c verified (see [`copy_and_verify`]).
    fn verify_stored<S: ?Sized>(
        &self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
        on_device: &[&Item],
    ) -> Result<(Layout, Staging), GpuError> {
        let chain = job.chain;
        let (items, stored_total, decoded_total, meta_bytes) =
            (&self.items, self.stored_total, self.decoded_total, self.meta_bytes);
        let direct = !chain.is_checked();
        let with_crc: Vec<&Item> = items.iter().filter(|it| it.crc.is_some()).collect();
        let n_dec = if chain.compression.is_some() { on_device.len() } else { 0 };
        let n_crc = with_crc.len();
        let staging = job.staging(on_device.iter().copied(), stored_total, decoded_total, meta_bytes)?;
        let Buffers { slots, taken, .. } = buffers;
        let Slot { host, staging: device, .. } = &mut slots[self.slot];
        // The stored bytes are already in this slot's staging (copied as they were read), which was
        // sized for every stored unit on the device. Should nvCOMP ask for more temp space for fewer
        // chunks, the staging is replaced once its copies are done, and the bytes copied again.
        if device.as_ref().is_none_or(|b| (b.len() as u64) < staging.len) {
            job.copy_stream.synchronize().map_err(GpuError::cuda("waiting for copies to the device"))?;
        }
        let (device, replaced) = ensure_counted(taken, job, device, staging.len)?;
        let cbase = device.ptr();
        // Direct reads' staging had exactly this size (no decoded bytes, no temp): never replaced.
        debug_assert!(!direct || !replaced, "direct reads' staging was replaced");
        // A new buffer (even at the old address) holds none of the bytes copied as they were read.
        let copy_stored = !direct && replaced;
        let (dbase, meta) = (cbase + staging.decoded, cbase + staging.meta);
        let hbuf = host.as_mut().expect("ensured");
        let host_meta = hbuf.as_mut_slice()[self.host_meta_at as usize..].as_mut_ptr() as usize;
        let stored_bytes = hbuf.as_slice();
        let (gather, copies) = table_room(job.units, chain, items.iter().map(|it| it.unit));
        let digests = on_device.iter().any(|it| it.digest.is_some());
        let arrays = MetaLayout::new(n_crc, n_dec, digests, gather, copies);
        debug_assert!(arrays.len() <= meta_bytes, "a batch's layout outgrew its bound");
        let layout = Layout { cbase, dbase, meta, host_meta, arrays };

        copy_and_verify(job, &layout, copy_stored.then_some(stored_bytes), stored_total, &with_crc)?;
        Ok((layout, staging))
    }

    /// The device codec's decode of `on_device` (laid out by `layout`, `staging`), and the digests
    /// of the decoded bytes, on the read's stream once it has waited for the batch's copies.
    fn decode_on_device<S: ?Sized>(
        &self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
        layout: &Layout,
        staging: &Staging,
        on_device: &[&Item],
    ) -> Result<Option<DecodeTiming>, GpuError> {
        let (chain, nvcomp, stream) = (job.chain, job.nvcomp, job.stream);
        let (cbase, dbase, arrays) = (layout.cbase, layout.dbase, &layout.arrays);
        let n_dec = if chain.compression.is_some() { on_device.len() } else { 0 };
        let digests = on_device.iter().any(|it| it.digest.is_some());
        let Buffers { taken, scratch, slots, .. } = buffers;
        let stored_bytes = slots[self.slot].host.as_ref().map_or(&[][..], PinnedBuffer::as_slice);
        let host_inputs: Vec<&[u8]> = if n_dec > 0 {
            on_device
                .iter()
                .map(|it| &stored_bytes[it.host_offset as usize..(it.host_offset + it.data_len) as usize])
                .collect()
        } else {
            Vec::new()
        };
        // The decode's arrays go to the device on the copy stream, where the scratch the batch
        // needs can be asked of its stored bytes before the read's stream waits for the copies.
        let mut words: Vec<u64> = Vec::with_capacity(4 * n_dec);
        words.extend(on_device.iter().map(|it| cbase + it.host_offset));
        words.extend(on_device.iter().map(|it| it.data_len));
        words.extend(on_device.iter().map(|it| job.decoded_len(it.unit)));
        words.extend(on_device.iter().map(|it| dbase + it.decoded_offset));
        if n_dec > 0 {
            layout.stage(arrays.dec_arrays(), &words, job.copy_stream.as_ref())?;
        }
        let ptr = |k: usize| layout.at(arrays.dec_arrays()) + 8 * k as u64;
        let query = DeviceBatch {
            stream: job.copy_stream.as_ref(),
            count: n_dec,
            inputs: ptr(0),
            input_sizes: ptr(n_dec),
            capacities: ptr(2 * n_dec),
            outputs: ptr(3 * n_dec),
            decoded_sizes: layout.at(arrays.results()),
            statuses: layout.at(arrays.statuses()),
            temp: 0,
            temp_bytes: 0,
            max_decoded: staging.max_decoded as usize,
            host_arrays: &words,
            host_inputs: &host_inputs,
            nvcomp,
            kernels: job.kernels,
            uploads: Some(job.context.uploads()),
        };
        let temp_bytes = match &chain.compression {
            Some(codec) if n_dec > 0 && staging.temp_bytes as u64 >= EXACT_SCRATCH_FROM => {
                // SAFETY: the arrays just staged on the copy stream describe the batch's stored
                // bytes there, checked on the host and (crc32c) on the device; statuses has n_dec
                // entries, overwritten by the decode.
                unsafe { codec.scratch_for(&query, self.decoded_total as usize) }?.unwrap_or(staging.temp_bytes)
            }
            _ => staging.temp_bytes,
        };
        // The decode and placement wait for every copy of the batch (staged, checked, or read
        // straight into the output).
        let copies_done = job.copy_stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
        stream.wait(&copies_done).map_err(GpuError::cuda("ordering a copy before decoding"))?;
        #[cfg(feature = "fault-injection")]
        if let (0, Some(fault), Some(kernels)) = (self.index, job.config.injected_fault(), job.kernels) {
            kernels.launch_fault(stream, fault)?;
        }
        let mut timed = None;
        if let (Some(codec), true) = (&chain.compression, n_dec > 0) {
            let temp = if temp_bytes > 0 { ensure_scratch(scratch, taken, job, temp_bytes)? } else { 0 };
            let batch = DeviceBatch { stream: stream.as_ref(), temp, temp_bytes, ..query };
            timed = DecodeTiming::around(stream, predicted_device_s(job, on_device), || {
                // SAFETY: every chunk was checked on the host by the codec (a zstd frame walked,
                // its recorded size that of the output buffer; a plain gzip member whose trailer
                // records that size) and its crc32c, where the chain has one, on the device;
                // arrays of n_dec entries in device memory, staged on the copy stream, which this
                // stream waited for; outputs 8-byte aligned (decoded offsets are multiples of
                // DECODED_ALIGN in 256-byte aligned staging); inputs aligned as the codec asked;
                // temp sized by it (its bound, or what it computed for these frames).
                unsafe { codec.decode(&batch) }
            })?;
            if digests {
                let (values, statuses) = (layout.at(arrays.digest_values()), layout.at(arrays.digest_statuses()));
                job.context.bind()?;
                // SAFETY: n_dec u32 statuses in this batch's metadata, ordered on the stream.
                unsafe { sys::cuMemsetD32Async(statuses, 0, n_dec, stream.cu_stream()) }
                    .result()
                    .map_err(GpuError::cuda("clearing digest statuses"))?;
                // SAFETY: as for the decode, which ran before on this stream; n_dec u32 values and
                // statuses in the layout.
                unsafe { codec.digest(&batch, values, statuses) }?;
            }
        }
        Ok(timed)
    }

    /// The host's share of the batch (items routed to host threads), decoded into the slot's host
    /// buffer and copied to the slot's decoded region (`layout.dbase`); the read's stream waits
    /// for the copies. Returns how many.
    fn decode_host_share<S: ?Sized>(
        &self,
        job: &Job<'_, S>,
        buffers: &mut Buffers,
        layout: &Layout,
    ) -> Result<usize, GpuError> {
        let host_items: Vec<&Item> = self.items.iter().filter(|it| it.route == Route::Host).collect();
        if host_items.is_empty() {
            return Ok(0);
        }
        // Only a codec's check routes units to host threads.
        let codec = job
            .chain
            .compression
            .as_deref()
            .ok_or_else(|| GpuError::Unsupported("host decoding without a codec".into()))?;
        let Buffers { slots, host_ring, .. } = buffers;
        let stored_bytes = slots[self.slot].host.as_ref().expect("ensured").as_slice();
        // SAFETY: dbase is the slot's decoded region, which holds every item's decoded bytes and
        // is reused only after this batch's event, which follows the copies queued here.
        unsafe { decode_on_host(job, codec, &host_items, stored_bytes, host_ring, layout.dbase) }?;
        let copied = job.copy_stream.record_event(None).map_err(GpuError::cuda("recording an event"))?;
        job.stream.wait(&copied).map_err(GpuError::cuda("ordering host-decoded chunks before placement"))?;
        Ok(host_items.len())
    }

    /// The batch's decode results queued to `results` (see [`ResultLog::queue`]).
    fn queue_results<S: ?Sized>(
        &self,
        job: &Job<'_, S>,
        layout: &Layout,
        results: &mut ResultLog,
    ) -> Result<(), GpuError> {
        results.queue(job, layout, &self.on_device())
    }

    /// Placement: every copy of the batch in one kernel launch (or by the copy engines without
    /// NVRTC); transposed or byte-swapped chunks element by element, by the gather kernel; missing
    /// units from the fill block (`fill`, made at the first).
    fn place<S: ?Sized>(
        &self,
        job: &Job<'_, S>,
        layout: &Layout,
        fill: &mut Option<DeviceBuffer>,
        report: &mut RetrieveReport,
    ) -> Result<(), GpuError> {
        let out_ptr = job.out.ptr()?;
        let (units, chain, stream) = (job.units, job.chain, job.stream);
        if let Some(delta) = &chain.delta {
            // numcodecs' delta: each whole decoded chunk (never narrowed: not raw) summed in place.
            let chunks: Vec<(u64, u64)> = (self.items.iter().filter(|it| it.route != Route::Missing))
                .map(|it| match chain.compression {
                    Some(_) => (layout.dbase + it.decoded_offset, job.decoded_len(it.unit)),
                    None => (layout.cbase + it.host_offset, job.decoded_len(it.unit)),
                })
                .collect();
            // SAFETY: the chunks' decoded bytes in this batch's staging, ordered on the stream.
            unsafe { codecs::delta::kernels::launch_delta_scan(job.kernels, stream, *delta, &chunks) }?;
        }
        let mut copies = Vec::new();
        let mut srcs = Vec::new();
        let mut jobs = Vec::new();
        for it in &self.items {
            let p = &units[it.unit].placement;
            let base = if chain.compression.is_some() {
                layout.dbase + it.decoded_offset
            } else {
                layout.cbase + it.host_offset
            };
            let src = match it.route {
                Route::Missing => {
                    report.missing_chunks += 1;
                    fill_source(fill, job.context, job.array, job.fill_len, stream)?
                }
                // Read straight into the output: placed already.
                _ if units[it.unit].direct.is_some() => continue,
                _ if chain.needs_gather() => {
                    jobs.extend(p.parts.iter().map(|part| gather_job(chain, job.elem, &p.chunk_shape, part, base)));
                    continue;
                }
                // A narrowed read starts at byte_start.
                _ if units[it.unit].narrowed => base,
                _ => base + p.byte_start,
            };
            copies.extend_from_slice(&p.copies);
            srcs.extend(std::iter::repeat_n(src, p.copies.len()));
        }
        // Planned from the same units (`table_room`); a miss here is this crate's bug, refused
        // before it could write past the tables.
        // Rows past MAX_ROW become several entries (the table has room: `table_room`).
        let split = job.kernels.map(|_| place::split_rows(&copies, &srcs, place::MAX_ROW));
        let entries = split.as_ref().map_or(0, |(entries, _)| entries.len());
        if !layout.arrays.holds_tables(jobs.len(), entries) {
            return Err(GpuError::Unsupported(format!(
                "a batch's placement needs {} gather jobs and {entries} copies, more than its metadata was planned for",
                jobs.len()
            )));
        }
        if !jobs.is_empty() {
            let placer = job
                .kernels
                .ok_or_else(|| GpuError::NoNvrtc("placing transposed or byte-swapped chunks needs it".into()))?;
            let at = layout.arrays.gather();
            layout.stage(at, &place::encode_gather(&jobs), stream.as_ref())?;
            // SAFETY: each job stays within its decoded chunk and `out` (planned from both shapes).
            unsafe { placer.launch_gather(stream, layout.at(at), &jobs, out_ptr) }?;
        }
        if let (Some(placer), Some((copies, srcs))) = (job.kernels, split) {
            let table = place::encode(&copies, &srcs);
            let at = layout.arrays.copies();
            layout.stage(at, &table, stream.as_ref())?;
            // SAFETY: copies stay within their decoded chunks (or the fill block) and `out`.
            unsafe { placer.launch(stream, layout.at(at), &copies, out_ptr) }?;
        } else {
            for (copy, &src) in copies.iter().zip(&srcs) {
                // SAFETY: as above.
                unsafe { copy_dtod(copy, src, out_ptr, stream) }?;
            }
        }
        Ok(())
    }
}

/// Where a batch lies in its slot's device staging: stored bytes at `cbase`, decoded bytes at
/// `dbase`, metadata at `meta` (laid out by `arrays`), mirrored in pinned memory at `host_meta`.
struct Layout {
    cbase: u64,
    dbase: u64,
    meta: u64,
    /// The pinned mirror of the metadata region, for async copies.
    host_meta: usize,
    arrays: MetaLayout,
}

impl Layout {
    /// Copy `words` through the pinned metadata mirror to the metadata region, both at `at`, on
    /// `on`.
    fn stage(&self, at: u64, words: &[u64], on: &CudaStream) -> Result<(), GpuError> {
        debug_assert!(at + 8 * words.len() as u64 <= self.arrays.len(), "staged past the metadata region");
        // SAFETY: the slot's metadata region (and its mirror) holds the batch's bound layout,
        // which holds this one; `at` and the words are one of its arrays; the region is reused
        // only after this batch's event.
        unsafe { stage_words(self.host_meta, at, words, self.meta + at, on) }
    }

    /// The device address of the metadata array at `at`.
    fn at(&self, at: u64) -> u64 {
        self.meta + at
    }
}

/// The batch's stored bytes on the device (copied as they were read; `copy`: once more, when
/// the staging was replaced), then crc32c there too, awaited before anything is decoded: a corrupt frame must never reach nvCOMP (undefined
/// behaviour; a kernel that never ends at worst). The wait overlaps the previous batch's decode
/// on the other stream, which waits for the copy.
fn copy_and_verify<S: ?Sized>(
    job: &Job<'_, S>,
    layout: &Layout,
    copy: Option<&[u8]>,
    stored_total: u64,
    with_crc: &[&Item],
) -> Result<(), GpuError> {
    let (cbase, copy_stream) = (layout.cbase, job.copy_stream);
    job.context.bind()?;
    if let Some(stored_bytes) = copy.filter(|_| stored_total > 0) {
        // SAFETY: the host buffer holds stored_total bytes; cbase has room for them; both are
        // reused only after this batch's event, which follows this copy.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                cbase,
                stored_bytes.as_ptr().cast(),
                stored_total as usize,
                copy_stream.cu_stream(),
            )
        }
        .result()
        .map_err(GpuError::cuda("copying chunks to the device"))?;
    }
    if let (Some(nvcomp), false) = (job.nvcomp, with_crc.is_empty()) {
        let mut words: Vec<u64> = with_crc.iter().map(|it| cbase + it.host_offset).collect();
        words.extend(with_crc.iter().map(|it| it.data_len));
        layout.stage(MetaLayout::CRC_INPUTS, &words, copy_stream.as_ref())?;
        // SAFETY: the arrays just staged at `meta` describe stored bytes at cbase, copied before
        // on the same stream; results go to the metadata regions after them.
        unsafe { verify_crc32c(nvcomp, job.units, with_crc, layout, copy_stream) }?;
    }
    Ok(())
}

/// What nvCOMP reports back, batch after batch, in one pinned buffer: per batch its decoded sizes
/// (u64) and statuses (u32), and the content checks' values (and statuses): at most 20 bytes a
/// chunk; and where each device-decoded unit's lie, to check once every batch is done.
struct ResultLog {
    buffer: PinnedBuffer,
    /// Where the next batch's results go in the buffer.
    at: usize,
    /// The content checks to make once every batch is done.
    checks: Vec<DecodeCheck>,
}

impl ResultLog {
    /// Room for the results of `units` units, digests included (see `MetaLayout::result_bytes`).
    fn new(context: &GpuContext, units: usize) -> Result<Self, GpuError> {
        let len = MetaLayout::new(0, units.max(1), true, 0, 0).result_bytes() as usize;
        Ok(ResultLog { buffer: context.take_pinned(len)?, at: 0, checks: Vec::new() })
    }

    /// Copy a batch's decode results back to the host in one copy (sizes, statuses and content
    /// checks lie together on the device) after the results queued before, and note where each
    /// device-decoded unit's lie, for [`ResultLog::check`] after the last batch.
    fn queue<S: ?Sized>(&mut self, job: &Job<'_, S>, layout: &Layout, on_device: &[&Item]) -> Result<(), GpuError> {
        let results_at = self.at;
        let arrays = &layout.arrays;
        let result_bytes = arrays.result_bytes() as usize;
        if result_bytes > 0 {
            let results_base = self.buffer.as_mut_slice().as_mut_ptr();
            // SAFETY: results holds every unit's results with digests; the source is this batch's
            // contiguous results.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    (results_base as usize + results_at) as *mut c_void,
                    layout.at(arrays.results()),
                    result_bytes,
                    job.stream.cu_stream(),
                )
            }
            .result()
            .map_err(GpuError::cuda("reading decode results"))?;
        }
        let at = |array: u64, k: usize, width: usize| results_at + (array - arrays.results()) as usize + k * width;
        for (k, it) in on_device.iter().enumerate().take(arrays.dec) {
            let digest = it.digest.map(|d| (d, at(arrays.digest_values(), k, 4), at(arrays.digest_statuses(), k, 4)));
            let (size, status) = (at(arrays.results(), k, 8), at(arrays.statuses(), k, 4));
            self.checks.push(DecodeCheck { unit: it.unit, size, status, digest });
        }
        self.at += result_bytes;
        Ok(())
    }

    /// Every device-decoded unit's status and size, and the check of its decoded bytes it carries
    /// (gzip CRC-32, zstd XXH64; crc32c was checked before decoding), once the device is done.
    fn check<S: ?Sized>(&self, job: &Job<'_, S>) -> Result<(), GpuError> {
        let (units, results) = (job.units, self.buffer.as_slice());
        let Some(codec) = job.chain.compression.as_deref() else { return Ok(()) };
        let name = codec.name();
        let status_string = |s: u32| codec.status_string(s, job.nvcomp);
        let word = |at: usize| u32::from_ne_bytes(results[at..at + 4].try_into().expect("4 bytes"));
        for &DecodeCheck { unit, size, status, digest } in &self.checks {
            let status = word(status);
            if status != 0 {
                return Err(units[unit].error(format!("{name} on the device: {}", status_string(status))));
            }
            let size = u64::from_ne_bytes(results[size..size + 8].try_into().expect("8 bytes"));
            let expected = job.decoded_len(unit);
            if size != expected {
                return Err(units[unit].error(format!("{name} decoded {size} bytes, {expected} expected")));
            }
            if let Some((stored, value, status)) = digest {
                let digest_name = codec.digest_name();
                if word(status) != 0 {
                    return Err(
                        units[unit].error(format!("{digest_name} on the device: {}", status_string(word(status))))
                    );
                }
                if word(value) != stored {
                    return Err(units[unit].error(format!(
                        "{digest_name} mismatch: stored {stored:#010x}, decoded bytes give {:#010x}",
                        word(value)
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Buffers go back to the pools only once the device is done with them. A batch that never
/// finishes (or, after an error, work in flight that does not finish in time) leaves them to
/// kernels that may still write them: they are leaked, and the context is lost for later reads.
fn release(
    context: &GpuContext,
    mut buffers: Buffers,
    result: &Result<(), GpuError>,
    streams: &[&CudaStream],
    deadline: Instant,
) -> Result<(), GpuError> {
    // The checks are host memory no device work uses: dropped, whatever becomes of the buffers.
    drop(std::mem::take(&mut buffers.results.checks));
    let settled = match result {
        Err(GpuError::Timeout { .. }) => Ok(false),
        _ => settle(streams, deadline),
    };
    match (settled, result) {
        (Ok(true), _) => {
            let Buffers { slots, results, fill, scratch, host_ring, .. } = buffers;
            let ResultLog { buffer: results, .. } = results;
            for slot in slots {
                if let Some(staging) = slot.staging {
                    context.give_staging(staging);
                }
                if let Some(buffer) = slot.host {
                    context.give_pinned(buffer);
                }
            }
            for buffer in fill.into_iter().chain(scratch) {
                context.give_staging(buffer);
            }
            context.give_pinned(results);
            if let Some(buffer) = host_ring.into_buffer() {
                context.give_ring(buffer);
            }
        }
        (Ok(false), result) => {
            let cause = result.as_ref().err().map_or_else(String::new, ToString::to_string);
            context.mark_lost(format!("a device batch did not finish: {cause}"));
            std::mem::forget(buffers);
        }
        (Err(err), Ok(())) => {
            std::mem::forget(buffers);
            return Err(GpuError::Cuda { what: "finishing a read", source: err });
        }
        (Err(_), Err(_)) => std::mem::forget(buffers),
    }
    Ok(())
}

/// `bound` from now (a bound too large for the clock: a year, which no wait reaches).
fn after(bound: std::time::Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(bound).unwrap_or_else(|| now + std::time::Duration::from_hours(365 * 24))
}

/// A batch enqueued on the device: the event after its last work, and when it must be done by.
struct Pending {
    event: CudaEvent,
    deadline: Instant,
    bound: std::time::Duration,
    batch: usize,
}

impl Pending {
    /// Wait for the batch (whose units are `batch`) until its deadline; past it, an error naming
    /// its first chunks.
    fn wait(self, batch: &[usize], units: &[Unit]) -> Result<(), GpuError> {
        if GpuContext::wait_until(self.event, self.deadline).map_err(GpuError::cuda("waiting for a batch"))? {
            return Ok(());
        }
        let mut chunks: Vec<String> = batch.iter().take(3).map(|&u| units[u].label()).collect();
        if batch.len() > 3 {
            chunks.push("...".into());
        }
        Err(GpuError::Timeout { count: batch.len(), chunks: chunks.join(", "), seconds: self.bound.as_secs_f64() })
    }
}

/// Wait for everything enqueued on `streams` until `deadline`: Ok(false) when it passes first.
fn settle(streams: &[&CudaStream], deadline: Instant) -> Result<bool, cudarc::driver::DriverError> {
    for stream in streams {
        let done = stream.record_event(None)?;
        if !GpuContext::wait_until(done, deadline)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Copy `words` through the pinned metadata region at `host_meta + at` to `device` on `on`:
/// pinned, so that the copy does not wait for the stream (a pageable copy would, serialising the
/// next batch's reads behind this one's decode).
///
/// # Safety
/// `host_meta + at` must be pinned memory for the words, not in use by an earlier copy; `device`
/// device memory for them.
unsafe fn stage_words(host_meta: usize, at: u64, words: &[u64], device: u64, on: &CudaStream) -> Result<(), GpuError> {
    let bytes = words.len() * 8;
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(words.as_ptr().cast::<u8>(), (host_meta + at as usize) as *mut u8, bytes);
        sys::cuMemcpyHtoDAsync_v2(device, (host_meta + at as usize) as *const c_void, bytes, on.cu_stream())
    }
    .result()
    .map_err(GpuError::cuda("copying decode metadata"))
}

/// nvCOMP CRC32C of `items` on `copy_stream`, awaited and checked here, before anything is
/// decoded: a corrupt frame must never reach nvCOMP's decoder (undefined behaviour; a kernel
/// that never ends at worst). The wait overlaps the previous batch's decode on the other stream.
///
/// # Safety
/// The layout's crc32c input pointers and sizes must be staged on `copy_stream`; its values and
/// statuses come back to the same offsets of the pinned mirror.
unsafe fn verify_crc32c(
    nvcomp: &NvcompLibrary,
    units: &[Unit],
    items: &[&Item],
    layout: &Layout,
    copy_stream: &CudaStream,
) -> Result<(), GpuError> {
    let n = items.len();
    let arrays = &layout.arrays;
    let (values, statuses) = (layout.at(arrays.crc_values()), layout.at(arrays.crc_statuses()));
    let host_values = layout.host_meta + arrays.crc_values() as usize;
    let longest = items.iter().map(|it| it.data_len as usize).max().unwrap_or(0);
    // SAFETY: pointer and size arrays of n entries in device memory, outputs as many (the
    // caller's contract); the results come back to the same offsets of the host region.
    unsafe {
        nvcomp
            .crc32_async(
                Crc32::Castagnoli,
                layout.at(MetaLayout::CRC_INPUTS) as *const *const c_void,
                layout.at(arrays.crc_sizes()) as *const usize,
                n,
                longest,
                values as *mut u32,
                statuses as *mut nv::nvcompStatus_t,
                copy_stream.cu_stream() as nv::cudaStream_t,
            )
            .map_err(nvcomp_err)?;
        // Values then statuses: contiguous in the layout.
        sys::cuMemcpyDtoHAsync_v2(host_values as *mut c_void, values, 8 * n, copy_stream.cu_stream())
            .result()
            .map_err(GpuError::cuda("reading crc32c results"))?;
    }
    copy_stream.synchronize().map_err(GpuError::cuda("computing crc32c checksums"))?;
    // SAFETY: the copy above wrote 8 * n bytes there and has completed.
    let got = unsafe { std::slice::from_raw_parts(host_values as *const u32, 2 * n) };
    for (k, it) in items.iter().enumerate() {
        let unit = &units[it.unit];
        let (crc, status) = (got[k], got[n + k]);
        if status != nv::nvcompSuccess {
            return Err(unit.error(format!("nvCOMP crc32c: {}", nvcomp.status_string(status))));
        }
        let expected = it.crc.expect("with crc");
        if crc != expected {
            return Err(unit.error(format!("crc32c checksum mismatch: stored {expected:#010x}, computed {crc:#010x}")));
        }
    }
    Ok(())
}

/// Uncompressed inner chunks in the platform's byte order are their elements: read only the bytes
/// a subset needs (`byte_start..byte_end` of each) rather than whole inner chunks. An index entry
/// of another length than the chunk's is an error.
fn narrow_raw(units: &mut [Unit]) -> Result<(), GpuError> {
    for unit in units {
        if let Source::Range { offset, len } = unit.source {
            let full = unit.decoded_len();
            if len != full {
                return Err(unit.error(format!("{len} bytes stored, {full} expected")));
            }
            unit.source = Source::Range { offset: offset + unit.placement.byte_start, len: unit.placement.read_len() };
            unit.narrowed = true;
        }
    }
    Ok(())
}

/// A batch's reads: the requests (the first `staged` land in the slot's staging at their `at`,
/// the rest straight into the output at theirs), per stored unit in batch order its request and
/// staging offset, the staged bytes, the batch's items and its decoded bytes.
struct Reads {
    requests: Vec<HostReadRequest>,
    staged: usize,
    at: Vec<(ReadOf, u64)>,
    /// The rows of units read as rows, packed in the staging after the coalesced reads (`dst`:
    /// the staging offset).
    rows: Vec<DeviceRowsRequest>,
    stored_total: u64,
    items: Vec<Item>,
    decoded_total: u64,
}

/// Plan a batch's reads from its units' stored spans: ranges of one value close together are
/// coalesced into one staged read; a unit read straight into the output has a read of its own.
fn plan_reads(units: &[Unit], batch: &[usize], spans: &[Option<(u64, u64)>]) -> Reads {
    let staged_spans: Vec<(&StoreKey, u64, u64)> = batch
        .iter()
        .zip(spans)
        .filter(|(&u, _)| units[u].direct.is_none() && units[u].rows.is_none())
        .filter_map(|(&u, s)| s.map(|(offset, len)| (&units[u].placement.key, offset, len)))
        .collect();
    let (mut requests, staged_at, mut stored_total) = coalesce(&staged_spans, COALESCE_GAP);
    let staged = requests.len();
    let mut rows = Vec::new();
    let mut next_staged = staged_at.into_iter();
    let mut at = Vec::with_capacity(batch.len());
    let mut items = Vec::with_capacity(batch.len());
    let mut decoded_at = 0u64;
    for (&u, span) in batch.iter().zip(spans) {
        let unit = &units[u];
        let (route, stored_len, host_offset) = match (span, unit.direct) {
            (None, _) => (Route::Missing, 0, 0),
            (Some((offset, len)), Some(out)) => {
                let key = unit.placement.key.clone();
                let (offset, len) = (*offset, *len as usize);
                requests.push(HostReadRequest { key, offset, len, at: out as usize, value_len: unit.value_len });
                at.push((ReadOf::Request(requests.len() - 1), 0));
                (Route::Device, len as u64, 0)
            }
            (Some((offset, _)), None) if unit.rows.is_some() => {
                let start = stored_total.next_multiple_of(STORED_ALIGN);
                let first = rows.len();
                let packed = plan_rows(unit, *offset, start, &mut rows);
                stored_total = start + packed;
                at.push((ReadOf::Rows(first..rows.len()), start));
                (Route::Device, packed, start)
            }
            (Some((_, len)), None) => {
                let (request, offset) = next_staged.next().expect("one per staged span");
                // A value whose size the chain fixes is read alone (one span per key).
                if unit.value_len.is_some() {
                    requests[request].value_len = unit.value_len;
                }
                at.push((ReadOf::Request(request), offset));
                (Route::Device, *len, offset)
            }
        };
        items.push(Item {
            unit: u,
            stored_len,
            data_len: stored_len,
            host_offset,
            decoded_offset: decoded_at,
            route,
            crc: None,
            digest: None,
        });
        // Saturating: sizes past 2^64 are refused by the planner before any allocation.
        decoded_at =
            decoded_at.saturating_add(unit.decoded_len().checked_next_multiple_of(DECODED_ALIGN).unwrap_or(u64::MAX));
    }
    Reads { requests, staged, at, rows, stored_total, items, decoded_total: decoded_at }
}

/// Which read brings a stored unit's bytes: a request, or the rows of a unit read as rows.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ReadOf {
    Request(usize),
    Rows(std::ops::Range<usize>),
}

/// The row reads of `unit` (read as rows, its bytes from `offset` of its value), packed from
/// staging offset `start`: one per slice of each of its copies, appended to `rows`. Returns the
/// packed bytes.
fn plan_rows(unit: &Unit, offset: u64, start: u64, rows: &mut Vec<DeviceRowsRequest>) -> u64 {
    let mut at = start;
    // Offsets within the chunk's bytes, checked by `plan_chunks`, and so within its value.
    for c in unit.rows.as_deref().unwrap_or_default() {
        for z in 0..c.depth {
            rows.push(DeviceRowsRequest {
                key: unit.placement.key.clone(),
                offset: offset + c.src_offset + z * c.src_height * c.src_pitch,
                rows: c.height,
                width: c.width,
                pitch: c.src_pitch,
                dst: at,
                value_len: unit.value_len,
            });
            at += c.width * c.height;
        }
    }
    at - start
}

/// Check every stored chunk on the host before the device sees it: the crc32c trailer split off,
/// the zstd frame's structure and recorded size, or the gzip member's header and trailer, or the
/// raw size. A broken chunk is an error naming it; chunks nvCOMP cannot take, or may not under
/// the read's decode trust, are routed to the host, as are zstd frames carrying a content checksum
/// when the device cannot hash (`can_hash`: no NVRTC), since libzstd there verifies it.
fn check_stored<S: ?Sized>(job: &Job<'_, S>, items: &mut [Item], stored: &[u8]) -> Result<(), GpuError> {
    let (units, chain, reader) = (job.units, job.chain, job.context.reader());
    let (trust, can_hash) = (job.config.decode_trust(), job.kernels.is_some());
    if !chain.is_checked() {
        // Only the length to check (the bytes themselves were read straight to the device).
        return items.iter().filter(|it| it.route != Route::Missing).try_for_each(|it| {
            let expected = units[it.unit].raw_len();
            if it.stored_len == expected {
                Ok(())
            } else {
                Err(units[it.unit].error(format!("{} bytes stored, {expected} expected", it.stored_len)))
            }
        });
    }
    let may_decode = chain.device_may_decode(trust);
    reader.install(|| {
        items.par_iter_mut().filter(|it| it.route != Route::Missing).try_for_each(|it| {
            let unit = &units[it.unit];
            let bytes = &stored[it.host_offset as usize..][..it.stored_len as usize];
            if chain.crc32c {
                if bytes.len() < 4 {
                    return Err(unit.error(format!("{} bytes cannot hold a crc32c checksum", bytes.len())));
                }
                it.data_len -= 4;
                it.crc = Some(u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().expect("4 bytes")));
            }
            let data = &bytes[..it.data_len as usize];
            let expected = unit.decoded_len();
            match &chain.compression {
                // crc32c, where the chain has it, is verified on the device before decoding.
                Some(codec) => match codec.check(data, expected).map_err(|e| unit.error_from(e))? {
                    HostCheck::Device { digest } if may_decode && (digest.is_none() || codec.can_digest(can_hash)) => {
                        it.digest = digest;
                    }
                    _ => it.route = Route::Host,
                },
                None if data.len() as u64 != expected => {
                    return Err(unit.error(format!("{} bytes stored, {expected} expected", data.len())));
                }
                None => {}
            }
            Ok(())
        })
    })
}

/// Send the host's share of a batch's device-bound units to host threads. A set fraction takes
/// that share of the large ones (4 MiB and more decoded). Otherwise the scheduler splits a read
/// of one batch (`only`) so that host threads and nvCOMP finish together, and any batch of
/// large frames (one decodes for a third of a second on the device). A batch of a longer read
/// leaves the host threads to read the next batch while the device decodes; its rates are the
/// set ones, else the codec's ([`DeviceCodec::decode_rates`]; large frames without any: the
/// defaults), with the host thread rate this device's reads have shown.
fn route_by_cost<S: ?Sized>(job: &Job<'_, S>, items: &mut [Item], only: bool) -> Option<String> {
    job.chain.compression.as_ref()?; // no codec: nothing to schedule
    let units = job.units;
    let size = |it: &Item| units[it.unit].decoded_len();
    let mut device: Vec<usize> = (0..items.len()).filter(|&k| items[k].route == Route::Device).collect();
    let (share, why) = if let Some(fraction) = host_fraction(job.config) {
        device.retain(|&k| size(&items[k]) >= LARGE_CHUNK);
        ((device.len() as f64 * fraction).round() as usize, format!("the set fraction {fraction} of large chunks"))
    } else {
        let largest = device.iter().map(|&k| size(&items[k])).max().unwrap_or(0);
        let large = largest >= LARGE_CHUNK;
        if device.is_empty() || !(only || large) {
            return None;
        }
        let slowness = &job.learned.as_ref()?.slowness;
        let bytes = device.iter().map(|&k| size(&items[k])).sum();
        // Reads in flight together share the reader's threads: each plans with its share.
        let threads = (job.context.reader().options().threads / job.context.reads_in_flight().max(1)).max(1);
        let rates = if let Some(set) = job.config.decode_rates() {
            set
        } else {
            let rates = learned_rates(job, large)?;
            if slowness.sends_all_to_host(&rates, device.len(), bytes, largest, threads) {
                job.relax.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            rates.device_slower(slowness.get())
        };
        let k = rates.host_share(device.len(), bytes, largest, threads);
        let (host_s, device_s, alone_s) = rates.predict(device.len(), k, bytes, largest, threads);
        let why = format!(
            "predicted {:.1} ms on {threads} host threads and {:.1} ms on nvCOMP (nvCOMP alone {:.1} ms)",
            host_s * 1e3,
            device_s * 1e3,
            alone_s * 1e3
        );
        (k, why)
    };
    for &k in device.iter().rev().take(share) {
        items[k].route = Route::Host;
    }
    Some(format!("{share} of {} chunks on host threads: {why}", device.len()))
}

/// The rates a batch is scheduled by when none are set: the codec's (large frames without any:
/// the defaults) with the host thread rate this device's reads have shown of the codec, before
/// nvCOMP's slowness, which a timed decode is compared with. None: no codec, or no rates for
/// small frames.
fn learned_rates<S: ?Sized>(job: &Job<'_, S>, large: bool) -> Option<DecodeRates> {
    let (codec, learned) = (job.chain.compression.as_ref()?, job.learned.as_ref()?);
    let rates = match codec.decode_rates() {
        Some(rates) => rates,
        None if large => DecodeRates::default(),
        None => return None,
    };
    Some(DecodeRates { host_thread_rate: learned.host.get(), ..rates })
}

/// What the rates predict of nvCOMP decoding `on_device`, before its slowness, when the timing
/// can teach it (see [`DeviceSlowness`](crate::schedule::DeviceSlowness)): long enough (at least
/// `MIN_PREDICTED_S`), no other read on the device meanwhile (it would share the GPU). What it
/// teaches is the codec's alone ([`Learned`]). None with rates set in the config: nothing is learned then.
fn predicted_device_s<S: ?Sized>(job: &Job<'_, S>, on_device: &[&Item]) -> Option<f64> {
    if job.config.decode_rates().is_some() || on_device.is_empty() || job.context.reads_in_flight() > 1 {
        return None;
    }
    let sizes = on_device.iter().map(|it| job.decoded_len(it.unit));
    let (bytes, largest) = sizes.fold((0u64, 0u64), |(sum, max), len| (sum.saturating_add(len), max.max(len)));
    let rates = learned_rates(job, largest >= LARGE_CHUNK)?;
    let predicted_s = rates.predict(on_device.len(), 0, bytes, largest, 1).2;
    (predicted_s >= crate::schedule::DeviceSlowness::MIN_PREDICTED_S).then_some(predicted_s)
}

/// A batch's decode on the device between two timing events, and what the rates predicted of it
/// (see [`DeviceSlowness`](crate::schedule::DeviceSlowness)).
struct DecodeTiming {
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
    predicted_s: f64,
}

impl DecodeTiming {
    /// Enqueue `decode` on `stream`, between two timing events when there is a prediction to
    /// compare it with.
    fn around(
        stream: &CudaStream,
        predicted_s: Option<f64>,
        decode: impl FnOnce() -> Result<(), GpuError>,
    ) -> Result<Option<Self>, GpuError> {
        let event = || {
            stream
                .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(GpuError::cuda("recording a timing event"))
        };
        let start = predicted_s.map(|_| event()).transpose()?;
        decode()?;
        match (start, predicted_s) {
            (Some(start), Some(predicted_s)) => Ok(Some(Self { start, end: event()?, predicted_s })),
            _ => Ok(None),
        }
    }
}

/// The gather job placing `part` of a chunk of `shape` decoded at `base` (its elements in the
/// chunk's stored layout: C order of its transpose, if any) into its subset's output.
fn gather_job(chain: &DeviceChain, elem: u64, shape: &[u64], part: &PlacementPart, base: u64) -> place::Gather {
    let c_strides = |shape: &[u64]| -> Vec<u64> {
        let mut strides = vec![elem; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        strides
    };
    // Stored as the transpose by `order`: stored dimension j is chunk dimension order[j].
    let src_stride = match &chain.transpose {
        Some(order) => {
            let stored: Vec<u64> = order.iter().map(|&d| shape[d]).collect();
            let stored_strides = c_strides(&stored);
            let mut strides = vec![0; shape.len()];
            for (j, &d) in order.iter().enumerate() {
                strides[d] = stored_strides[j];
            }
            strides
        }
        None => c_strides(shape),
    };
    let dst_stride = c_strides(&part.output_shape);
    let dot = |start: &[u64], strides: &[u64]| start.iter().zip(strides).map(|(a, b)| a * b).sum::<u64>();
    place::Gather {
        src: base + dot(part.chunk_region.start(), &src_stride),
        dst: part.output_base + dot(part.output_region.start(), &dst_stride),
        elem,
        swap: chain.swap,
        extent: part.chunk_region.shape().to_vec(),
        src_stride,
        dst_stride,
    }
}

fn nvcomp_err(err: nvcomp_sys::NvcompError) -> GpuError {
    GpuError::Nvcomp(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::plan::plan_chunks;
    use zarrs::array::ArraySubset;

    #[test]
    fn reads_of_a_batch_coalesce_ranges_and_skip_missing_units() {
        let key = StoreKey::new("s/c/0").unwrap();
        let other = StoreKey::new("z/c/1").unwrap();
        let unit = |key: &StoreKey, source: Source| {
            let chunk = ArraySubset::new_with_start_shape(vec![0], vec![100]).unwrap();
            let placement = plan_chunks(4, &chunk, [(vec![0], key.clone(), chunk.clone())]).unwrap().pop().unwrap();
            Unit { source, ..Unit::whole(placement) }
        };
        let units = vec![
            unit(&key, Source::Range { offset: 40, len: 30 }),
            unit(&key, Source::Missing),
            unit(&key, Source::Range { offset: 10, len: 30 }),
            unit(&other, Source::Whole),
        ];
        // The sizes as the pipeline learns them: ranges as they are, the whole value asked.
        let spans = [Some((40, 30)), None, Some((10, 30)), Some((0, 55))];
        let Reads { requests, staged, at, stored_total: stored, items, decoded_total: decoded, .. } =
            plan_reads(&units, &[0, 1, 2, 3], &spans);
        assert_eq!(staged, requests.len());
        let got: Vec<(&str, u64, usize, u64)> =
            requests.iter().map(|r| (r.key.as_str(), r.offset, r.len, r.at as u64)).collect();
        // The two ranges of s/c/0 touch: one read of 60 bytes; the whole value apart.
        assert_eq!(got, vec![("s/c/0", 10, 60, 0), ("z/c/1", 0, 55, 256)]);
        assert_eq!(at, vec![(ReadOf::Request(0), 30), (ReadOf::Request(0), 0), (ReadOf::Request(1), 256)]);
        assert_eq!(stored, 311);
        let routes: Vec<Route> = items.iter().map(|it| it.route).collect();
        assert_eq!(routes, vec![Route::Device, Route::Missing, Route::Device, Route::Device]);
        let host: Vec<u64> = items.iter().map(|it| it.host_offset).collect();
        assert_eq!(host, vec![30, 0, 0, 256]);
        // 400 decoded bytes each, aligned: every unit has its place, missing ones too.
        let offsets: Vec<u64> = items.iter().map(|it| it.decoded_offset).collect();
        assert_eq!(offsets, vec![0, 4096, 8192, 12288]);
        assert_eq!(decoded, 16384);
    }

    #[test]
    fn uncompressed_chunks_whose_bytes_are_one_run_of_the_output_are_read_straight_into_it() {
        // Rows 1..3 of a 4 x 8 chunk, all columns: one run of the output; columns 2..6: not.
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![4, 8]).unwrap();
        let key = StoreKey::new("c/0/0").unwrap();
        let plan = |subset: ArraySubset| plan_chunks(4, &subset, [(vec![0, 0], key.clone(), chunk.clone())]).unwrap();
        let rows = Unit::raw(plan(ArraySubset::new_with_ranges(&[1..3, 0..8])).pop().unwrap());
        let cols = Unit::raw(plan(ArraySubset::new_with_ranges(&[1..3, 2..6])).pop().unwrap());
        assert_eq!((rows.direct, rows.source.clone()), (Some(0), Source::Range { offset: 32, len: 64 }));
        assert_eq!(cols.direct, None);
        let units = vec![cols, rows];
        let spans = [Some((40, 48)), Some((32, 64))];
        let Reads { requests, staged, at, stored_total, items, .. } = plan_reads(&units, &[0, 1], &spans);
        assert_eq!(staged, 1, "one staged read, then the direct one");
        let got: Vec<(u64, usize, u64, Option<u64>)> =
            requests.iter().map(|r| (r.offset, r.len, r.at as u64, r.value_len)).collect();
        // Both check the value's size (the chunk's 128 bytes); the direct one lands at output 0.
        assert_eq!(got, vec![(40, 48, 0, Some(128)), (32, 64, 0, Some(128))]);
        assert_eq!(at, vec![(ReadOf::Request(0), 0), (ReadOf::Request(1), 0)]);
        assert_eq!(stored_total, 48, "nothing staged for the direct read");
        assert!(items.iter().all(|it| it.route == Route::Device));
    }

    #[test]
    fn tiles_of_uncompressed_chunks_read_only_their_rows_and_place_the_same_bytes() {
        // (chunk shape, subset) in u32: rows of 384 bytes 1 KiB apart over two slices; whole rows
        // of a few rows per slice; a subset meeting the chunk's corner, of shape 3 x 5 x 70.
        let cases: [(Vec<u64>, Vec<std::ops::Range<u64>>); 3] = [
            (vec![4, 8, 256], vec![1..3, 2..6, 32..128]),
            (vec![8, 16, 64], vec![2..6, 3..7, 0..64]),
            (vec![6, 9, 100], vec![3..9, 4..9, 30..100]),
        ];
        for (shape, ranges) in cases {
            let chunk = ArraySubset::new_with_start_shape(vec![0; 3], shape.clone()).unwrap();
            let key = StoreKey::new("c/0/0/0").unwrap();
            let subset = ArraySubset::new_with_ranges(&ranges);
            let placement = plan_chunks(4, &subset, [(vec![0; 3], key, chunk)]).unwrap().pop().unwrap();
            let data: Vec<u8> = (0..placement.chunk_bytes as u32).map(|i| (i * 31 + i / 257) as u8).collect();
            let plain = Unit::raw(placement);
            let mut unit = plain.clone();
            unit.read_as_rows();
            assert!(unit.rows.is_some(), "{shape:?} {ranges:?}");
            let out_len = subset.num_elements_usize() * 4;
            // As before: the narrowed range, its copies.
            let Source::Range { offset, len } = plain.source else { panic!("a range") };
            let mut expected = vec![0u8; out_len];
            for c in &plain.placement.copies {
                c.apply_host(&data[offset as usize..][..len as usize], &mut expected);
            }
            // Read as rows: after 100 coalesced bytes, each row read lands packed in the staging,
            // and the rewritten copies place the same bytes.
            let mut units = vec![
                Unit { source: Source::Range { offset: 0, len: 100 }, ..Unit::whole(plain.placement.clone()) },
                unit,
            ];
            units[0].placement.key = StoreKey::new("c/9").unwrap();
            let Reads { requests, rows, at, stored_total, items, .. } =
                plan_reads(&units, &[0, 1], &[Some((0, 100)), Some((offset, len))]);
            assert_eq!(requests.len(), 1, "only the other unit is coalesced");
            assert_eq!(at[1], (ReadOf::Rows(0..rows.len()), 256), "rows packed from the next aligned offset");
            let packed: u64 = rows.iter().map(DeviceRowsRequest::packed_len).sum();
            assert!(2 * packed <= len && stored_total == 256 + packed, "{packed} of {len}");
            let mut staging = vec![0xEEu8; stored_total as usize];
            for r in &rows {
                assert_eq!(r.value_len, Some(data.len() as u64));
                for k in 0..r.rows {
                    let from = (r.offset + k * r.pitch) as usize;
                    let to = (r.dst + k * r.width) as usize;
                    staging[to..to + r.width as usize].copy_from_slice(&data[from..from + r.width as usize]);
                }
            }
            assert_eq!((items[1].host_offset, items[1].stored_len), (256, packed));
            assert_eq!(units[1].raw_len(), packed, "what the host check expects of it");
            let mut got = vec![0u8; out_len];
            for c in &units[1].placement.copies {
                c.apply_host(&staging[items[1].host_offset as usize..], &mut got);
            }
            assert_eq!(got, expected, "{shape:?} {ranges:?}");
        }
        // Left as they are: rows narrower than MIN_ROW, a range mostly needed, a direct read.
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![16, 512]).unwrap();
        let key = StoreKey::new("c/0/0").unwrap();
        for ranges in [[2..9, 0..60], [2..9, 0..400], [2..9, 0..512]] {
            let subset = ArraySubset::new_with_ranges(&ranges);
            let placement = plan_chunks(4, &subset, [(vec![0, 0], key.clone(), chunk.clone())]).unwrap().pop().unwrap();
            let mut unit = Unit::raw(placement);
            unit.read_as_rows();
            assert!(unit.rows.is_none(), "{ranges:?}");
        }
    }

    #[test]
    fn uncompressed_inner_chunks_read_only_the_bytes_a_subset_needs() {
        // Inner chunk [4, 8] of u32 at offset 1000 of its shard; the subset wants rows 1..3.
        let key = StoreKey::new("s/c/0").unwrap();
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![4, 8]).unwrap();
        let subset = ArraySubset::new_with_ranges(&[1..3, 0..8]);
        let placement = plan_chunks(4, &subset, [(vec![0, 0], key, chunk)]).unwrap().pop().unwrap();
        let unit = |len| Unit { source: Source::Range { offset: 1000, len }, ..Unit::whole(placement.clone()) };
        let mut units = vec![unit(128), Unit { source: Source::Missing, ..unit(128) }];
        narrow_raw(&mut units).unwrap();
        assert_eq!(units[0].source, Source::Range { offset: 1032, len: 64 });
        assert!(units[0].narrowed && units[0].raw_len() == 64);
        assert_eq!(units[1].source, Source::Missing);
        // An index entry of another length than the chunk's.
        let err = narrow_raw(&mut [unit(100)]).unwrap_err();
        assert!(err.to_string().contains("100 bytes stored, 128 expected"), "{err}");
    }

    #[test]
    fn whole_values_far_longer_than_any_encoding_are_refused_when_sized() {
        // A 1 MiB chunk whose file is a sparse 64 GiB.
        let chunk = ArraySubset::new_with_shape(vec![256, 1024]);
        let key = StoreKey::new("a/c/0/1").unwrap();
        let placement = plan_chunks(4, &chunk, [(vec![0, 1], key, chunk.clone())]).unwrap().pop().unwrap();
        let unit = Unit::whole(placement);
        assert_eq!(whole_span(&unit, 900 << 10).unwrap(), (0, 900 << 10));
        let err = whole_span(&unit, 64 << 30).unwrap_err().to_string();
        assert!(err.contains("a/c/0/1") && err.contains("68719476736 stored bytes for 1048576 decoded"), "{err}");
    }

    #[test]
    fn placement_tables_have_room_for_every_part_of_a_chunk_several_subsets_meet() {
        // A chunk three crops meet is one unit with three parts: a gather job each (the first
        // GPU run of requests sized one per unit, and the gather table ran past its room).
        let key = StoreKey::new("c/0/0").unwrap();
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![8, 8]).unwrap();
        let crops = [[0..4, 0..4], [2..6, 3..8], [0..8, 5..6]].map(|r| ArraySubset::new_with_ranges(&r));
        let mut placements = Vec::new();
        for (i, crop) in crops.iter().enumerate() {
            let mut p = plan_chunks(2, crop, [(vec![0, 0], key.clone(), chunk.clone())]).unwrap().pop().unwrap();
            p.shift_output(i as u64 * 1024).unwrap();
            placements.push(p);
        }
        let merged = crate::pipeline::request::merge_placements(placements).unwrap();
        assert_eq!(merged.len(), 1);
        let units: Vec<Unit> = merged.into_iter().map(Unit::whole).collect();
        let gather = DeviceChain { swap: 2, ..DeviceChain::default() };
        let (jobs, copies) = table_room(&units, &gather, 0..1);
        assert_eq!(jobs, 3);
        assert_eq!(copies, units[0].placement.copies.len());
        let layout = MetaLayout::new(1, 1, false, jobs, copies);
        assert!(
            layout.holds_tables(3, copies) && !layout.holds_tables(4, copies) && !layout.holds_tables(3, copies + 1)
        );
        assert_eq!(table_room(&units, &DeviceChain::default(), 0..1).0, 0);
    }

    #[test]
    fn a_callers_destination_is_not_counted_against_free_memory() {
        // 16 chunks of 1 MiB (rows of 16 KiB, none one run of the output): 16 MiB of output,
        // staged one chunk a batch.
        let array = ArraySubset::new_with_shape(vec![64, 65536]);
        let chunks = (0..16u64).map(|c| {
            let subset = ArraySubset::new_with_start_shape(vec![0, c * 4096], vec![64, 4096]).unwrap();
            (vec![0, c], StoreKey::new(format!("c/0/{c}")).unwrap(), subset)
        });
        let units: Vec<Unit> = plan_chunks(4, &array, chunks).unwrap().into_iter().map(Unit::whole).collect();
        let (chain, config) = (DeviceChain::default(), GpuConfig::default().with_staging_bytes(1 << 20));
        let out_bytes = 16 << 20;
        // Less free memory than the output, room for two slots of staging (about 4 MiB).
        let free = 6 << 20;
        let new = plan_batches(&units, &chain, &config, free, None, Output::New.allocated(out_bytes));
        assert!(matches!(new, Err(GpuError::OutOfMemory { .. })), "{new:?}");
        // Into a caller's destination of 16 MiB, which exists already: only staging counts.
        let into = Output::Into { ptr: 0, len: out_bytes as usize };
        let (batches, _) = plan_batches(&units, &chain, &config, free, None, into.allocated(out_bytes)).unwrap();
        assert_eq!(batches.len(), 16);
        // Staging alone still has to fit.
        let tight = plan_batches(&units, &chain, &config, 3 << 20, None, into.allocated(out_bytes));
        assert!(matches!(tight, Err(GpuError::OutOfMemory { .. })), "{tight:?}");
    }

    /// With the default staging budget (1 GiB) the 64 chunks of 1 MiB are one batch, whose
    /// slot takes twice their bytes; with less free memory the batches shrink until two slots
    /// fit beside the output, rather than the read being refused; only when one chunk a batch
    /// does not fit is it refused.
    #[test]
    fn batches_shrink_to_the_free_memory_before_a_read_is_refused() {
        let array = ArraySubset::new_with_shape(vec![64, 1 << 20]);
        let chunks = (0..64u64).map(|c| {
            let subset = ArraySubset::new_with_start_shape(vec![0, c * 16384], vec![64, 16384]).unwrap();
            (vec![0, c], StoreKey::new(format!("c/0/{c}")).unwrap(), subset)
        });
        let units: Vec<Unit> = plan_chunks(1, &array, chunks).unwrap().into_iter().map(Unit::whole).collect();
        let (chain, config) = (DeviceChain::default(), GpuConfig::default());
        let out_bytes = 64 << 20;
        let (roomy, shrunk) = plan_batches(&units, &chain, &config, 1 << 30, None, out_bytes).unwrap();
        assert!(roomy.len() == 1 && !shrunk);
        // Output plus 48 MiB, less the headroom: two slots of at most 16 MiB, so batches of at
        // most 8 chunks.
        let (tight, shrunk) = plan_batches(&units, &chain, &config, (64 << 20) + (48 << 20), None, out_bytes).unwrap();
        assert!(shrunk);
        assert!(
            tight.len() >= 8 && tight.iter().all(|b| b.len() <= 8),
            "{:?}",
            tight.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert_eq!(tight.concat(), (0..64).collect::<Vec<_>>(), "every unit once, in order");
        let mut temps = std::collections::HashMap::new();
        let set = working_set(&units, &chain, &config, None, &tight, &mut temps).unwrap();
        assert!(set <= 32 << 20, "{set}");
        // Room for the output and a chunk but not for two slots of one: refused, with the sizes.
        let none = plan_batches(&units, &chain, &config, (64 << 20) + (3 << 20), None, out_bytes);
        assert!(matches!(none, Err(GpuError::OutOfMemory { needed, .. }) if needed > (67 << 20)), "{none:?}");
    }

    /// What the gather kernel does, on the host.
    fn apply_gather(job: &place::Gather, src: &[u8], out: &mut [u8]) {
        let count: u64 = job.extent.iter().product();
        for i in 0..count {
            let (mut rest, mut s, mut d) = (i, job.src, job.dst);
            for k in (0..job.extent.len()).rev() {
                let x = rest % job.extent[k];
                rest /= job.extent[k];
                s += x * job.src_stride[k];
                d += x * job.dst_stride[k];
            }
            for w in (0..job.elem).step_by(job.swap.max(1) as usize) {
                let word = job.swap.max(1);
                for b in 0..word {
                    let from = if job.swap > 1 { w + word - 1 - b } else { w + b };
                    out[(d + w + b) as usize] = src[(s + from) as usize];
                }
            }
        }
    }

    #[test]
    fn gather_jobs_undo_transposes_and_byte_order() {
        // A 2 x 3 x 4 chunk of u16 at [4, 0, 0] of the array, stored transposed by [2, 0, 1]
        // and big-endian; the subset [5..6, 1..3, 1..4] of an output of shape [2, 3, 4] at [4, 0, 0].
        let shape = [2u64, 3, 4];
        let value = |z: u64, y: u64, x: u64| (z * 100 + y * 10 + x) as u16 + 0x0100;
        let mut stored = Vec::new();
        for x in 0..4 {
            for z in 0..2 {
                for y in 0..3 {
                    stored.extend(value(z, y, x).to_be_bytes());
                }
            }
        }
        let subset = ArraySubset::new_with_ranges(&[5..6, 1..3, 1..4]);
        let out_subset = ArraySubset::new_with_ranges(&[4..6, 0..3, 0..4]);
        let chunk = ArraySubset::new_with_start_shape(vec![4, 0, 0], shape.to_vec()).unwrap();
        let key = StoreKey::new("c").unwrap();
        let p = plan_chunks(2, &out_subset, [(vec![0, 0, 0], key, chunk)]).unwrap().pop().unwrap();
        let part = PlacementPart {
            chunk_region: subset.relative_to(&[4, 0, 0]).unwrap(),
            output_region: subset.relative_to(&[4, 0, 0]).unwrap(),
            ..p.parts[0].clone()
        };
        let chain = DeviceChain { swap: 2, transpose: Some(vec![2, 0, 1]), ..DeviceChain::default() };
        let job = gather_job(&chain, 2, &p.chunk_shape, &part, 0);
        let mut out = vec![0u8; 2 * 24];
        apply_gather(&job, &stored, &mut out);
        for z in 0..2u64 {
            for y in 0..3u64 {
                for x in 0..4u64 {
                    let i = ((z * 3 + y) * 4 + x) as usize * 2;
                    let got = u16::from_ne_bytes([out[i], out[i + 1]]);
                    let inside = z == 1 && (1..3).contains(&y) && (1..4).contains(&x);
                    assert_eq!(got, if inside { value(z, y, x) } else { 0 }, "at {z} {y} {x}");
                }
            }
        }
    }
}
