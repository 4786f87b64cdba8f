//! The device's part of a batch: its stored bytes in the slot's staging, crc32c there before
//! anything is decoded, nvCOMP's batched decode and the digests of the decoded bytes.

use std::ffi::c_void;

use cudarc::driver::{sys, CudaStream};
use nvcomp_sys::{sys as nv, Crc32, NvcompLibrary};

use super::budget::table_room;
use super::check::learned_rates;
use super::job::{Item, Job, Route, Staging};
use super::memory::{ReadMemory, Staged};
use super::read::Batch;
use crate::codecs::DeviceBatch;
use crate::error::GpuError;
use crate::pipeline::layout::MetaLayout;
use crate::pipeline::unit::Unit;

/// Batches whose decoder scratch may reach this many bytes (nvCOMP's bound, which assumes the
/// worst frame everywhere) ask the codec what their stored bytes need
/// ([`DeviceCodec::scratch_for`](crate::codecs::DeviceCodec::scratch_for)): for zstd about 45% of the bound, 7 GiB less for a batch of
/// 4096 frames of 1 MiB, memory that a bounded pool would map again for every read. Smaller
/// batches skip the query, which waits for the copy stream.
const EXACT_SCRATCH_FROM: u64 = 256 << 20;

impl Batch {
    /// The device's part of the batch: its stored bytes in the slot's staging, crc32c verified
    /// there before anything is decoded, then the device codec's decode and the digests of the
    /// decoded bytes (gzip CRC-32, zstd XXH64) on the read's stream.
    /// With the decode's timing, when it is long enough to teach the scheduler.
    pub(super) fn launch_device(
        &self,
        job: &Job<'_>,
        memory: &mut ReadMemory<'_>,
    ) -> Result<(Layout, Option<DecodeTiming>), GpuError> {
        let on_device = self.on_device();
        let (layout, staging) = self.verify_stored(job, memory, &on_device)?;
        let timed = self.decode_on_device(job, memory, &layout, &staging, &on_device)?;
        Ok((layout, timed))
    }

    /// The batch's layout in its slot's staging (replaced when it is too small for `on_device`),
    /// where its stored bytes are, crc32c verified (see [`copy_and_verify`]).
    fn verify_stored(
        &self,
        job: &Job<'_>,
        memory: &mut ReadMemory<'_>,
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
        // The stored bytes are already in this slot's staging (copied as they were read), which was
        // sized for every stored unit on the device. Should nvCOMP ask for more temp space for fewer
        // chunks, the staging is replaced once its copies are done, and the bytes copied again.
        if !memory.staging_holds(self.slot, staging.len) {
            job.copy_stream.synchronize().map_err(GpuError::cuda("waiting for copies to the device"))?;
        }
        let Staged { ptr: cbase, new: replaced } = memory.staging(self.slot, staging.len)?;
        // Direct reads' staging had exactly this size (no decoded bytes, no temp): never replaced.
        debug_assert!(!direct || !replaced, "direct reads' staging was replaced");
        // A new buffer (even at the old address) holds none of the bytes copied as they were read.
        let copy_stored = !direct && replaced;
        let (dbase, meta) = (cbase + staging.decoded, cbase + staging.meta);
        let host_meta = memory.pinned_meta(self.slot, self.host_meta_at);
        let stored_bytes = memory.stored(self.slot);
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
    fn decode_on_device(
        &self,
        job: &Job<'_>,
        memory: &mut ReadMemory<'_>,
        layout: &Layout,
        staging: &Staging,
        on_device: &[&Item],
    ) -> Result<Option<DecodeTiming>, GpuError> {
        let (chain, stream) = (job.chain, job.stream);
        let (cbase, dbase, arrays) = (layout.cbase, layout.dbase, &layout.arrays);
        let n_dec = if chain.compression.is_some() { on_device.len() } else { 0 };
        let digests = on_device.iter().any(|it| it.digest.is_some());
        let (stored_bytes, scratch) = memory.decode_buffers(self.slot);
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
            scratch: 0,
            scratch_bytes: 0,
            max_decoded: staging.max_decoded as usize,
            host_arrays: &words,
            host_inputs: &host_inputs,
            kernels: job.kernels,
            uploads: Some(job.context.uploads()),
            host_decodes: self.items.iter().any(|it| it.route == Route::Host),
        };
        let scratch_bytes = match &chain.compression {
            Some(codec) if n_dec > 0 && staging.scratch_bytes as u64 >= EXACT_SCRATCH_FROM => {
                // SAFETY: the arrays just staged on the copy stream describe the batch's stored
                // bytes there, checked on the host and (crc32c) on the device; statuses has n_dec
                // entries, overwritten by the decode.
                unsafe { codec.scratch_for(&query, self.decoded_total as usize) }?.unwrap_or(staging.scratch_bytes)
            }
            _ => staging.scratch_bytes,
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
            let at = if scratch_bytes > 0 { scratch.ensure(scratch_bytes, stream)? } else { 0 };
            let batch = DeviceBatch { stream: stream.as_ref(), scratch: at, scratch_bytes, ..query };
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
}

/// Where a batch lies in its slot's device staging: stored bytes at `cbase`, decoded bytes at
/// `dbase`, metadata at `meta` (laid out by `arrays`), mirrored in pinned memory at `host_meta`.
pub(super) struct Layout {
    pub(super) cbase: u64,
    pub(super) dbase: u64,
    pub(super) meta: u64,
    /// The pinned mirror of the metadata region, for async copies.
    pub(super) host_meta: usize,
    pub(super) arrays: MetaLayout,
}

impl Layout {
    /// Copy `words` through the pinned metadata mirror to the metadata region, both at `at`, on
    /// `on`.
    pub(super) fn stage(&self, at: u64, words: &[u64], on: &CudaStream) -> Result<(), GpuError> {
        debug_assert!(at + 8 * words.len() as u64 <= self.arrays.len(), "staged past the metadata region");
        // SAFETY: the slot's metadata region (and its mirror) holds the batch's bound layout,
        // which holds this one; `at` and the words are one of its arrays; the region is reused
        // only after this batch's event.
        unsafe { stage_words(self.host_meta, at, words, self.meta + at, on) }
    }

    /// The device address of the metadata array at `at`.
    pub(super) fn at(&self, at: u64) -> u64 {
        self.meta + at
    }
}

/// The batch's stored bytes on the device (copied as they were read; `copy`: once more, when
/// the staging was replaced), then crc32c there too, awaited before anything is decoded: a corrupt frame must never reach nvCOMP (undefined
/// behaviour; a kernel that never ends at worst). The wait overlaps the previous batch's decode
/// on the other stream, which waits for the copy.
fn copy_and_verify(
    job: &Job<'_>,
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

/// What the rates predict of nvCOMP decoding `on_device`, before its slowness, when the timing
/// can teach it (see [`DeviceSlowness`](crate::schedule::DeviceSlowness)): long enough (at least
/// `MIN_PREDICTED_S`), no other read on the device meanwhile (it would share the GPU). What it
/// teaches is the codec's alone ([`Learned`](crate::schedule::Learned)). None with rates set in the config: nothing is learned then.
fn predicted_device_s(job: &Job<'_>, on_device: &[&Item]) -> Option<f64> {
    if job.config.decode_rates().is_some() || on_device.is_empty() || job.context.reads_in_flight() > 1 {
        return None;
    }
    let sizes = on_device.iter().map(|it| job.decoded_len(it.unit));
    let (bytes, largest) = sizes.fold((0u64, 0u64), |(sum, max), len| (sum.saturating_add(len), max.max(len)));
    let rates = learned_rates(job)?;
    // A batch the rates do not split teaches nothing of them (our zstd decoder's small frames).
    if !rates.splits(largest) {
        return None;
    }
    let predicted_s = rates.predict(on_device.len(), 0, bytes, largest, 1).2;
    (predicted_s >= crate::schedule::DeviceSlowness::MIN_PREDICTED_S).then_some(predicted_s)
}

/// A batch's decode on the device between two timing events, and what the rates predicted of it
/// (see [`DeviceSlowness`](crate::schedule::DeviceSlowness)).
pub(super) struct DecodeTiming {
    pub(super) start: cudarc::driver::CudaEvent,
    pub(super) end: cudarc::driver::CudaEvent,
    pub(super) predicted_s: f64,
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

fn nvcomp_err(err: nvcomp_sys::NvcompError) -> GpuError {
    GpuError::Nvcomp(err)
}
