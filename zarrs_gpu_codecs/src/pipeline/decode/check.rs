//! The host check of a batch's stored bytes, and each unit's route (nvCOMP or host threads),
//! set here only: what nvCOMP cannot or may not take, the scheduler's host share, alignment.

use rayon::prelude::*;

use super::job::{Item, Job, Route};
use super::read::Batch;
use crate::codecs::HostCheck;
use crate::error::GpuError;
use crate::pipeline::batch::host_fraction;
use crate::schedule::DecodeRates;
use crate::schedule::LARGE_CHUNK;

impl Batch {
    /// The host check of every stored unit of the batch (`stored`: its bytes as read), then its
    /// route: nvCOMP, or host threads (what nvCOMP cannot or may not take, the host's share the
    /// scheduler gives it, inputs at an alignment nvCOMP cannot take). `only`: the read's one batch.
    pub(super) fn route(&mut self, job: &Job<'_>, stored: &[u8], only: bool) -> Result<Option<String>, GpuError> {
        let items = &mut self.items;
        check_stored(job, items, stored)?;
        let schedule = route_by_cost(job, items, only);
        if let Some(codec) = &job.chain.compression {
            // 1 today: zstd and naive gzip take any byte; staging itself is 256-byte aligned.
            let align = codec.input_alignment()? as u64;
            for it in items.iter_mut().filter(|it| it.route == Route::Device && it.host_offset % align.max(1) != 0) {
                it.route = Route::Host;
            }
        }
        Ok(schedule)
    }
}

/// Check every stored chunk on the host before the device sees it: the crc32c trailer split off,
/// the zstd frame's structure and recorded size, or the gzip member's header and trailer, or the
/// raw size. A broken chunk is an error naming it; chunks nvCOMP cannot take, or may not under
/// the read's decode trust, are routed to the host, as are chunks whose decoder is a kernel of
/// ours and zstd frames carrying a content checksum when there are no kernels (`can_hash`: no
/// NVRTC), since libzstd there decodes and verifies them.
fn check_stored(job: &Job<'_>, items: &mut [Item], stored: &[u8]) -> Result<(), GpuError> {
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
                    HostCheck::Device { digest }
                        if may_decode
                            && (can_hash || !codec.needs_kernels())
                            && (digest.is_none() || codec.can_digest(can_hash)) =>
                    {
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
/// set ones, else the codec's ([`DeviceCodec::decode_rates`](crate::codecs::DeviceCodec::decode_rates); none: the device
/// takes every unit), with the host thread rate this device's reads have shown.
fn route_by_cost(job: &Job<'_>, items: &mut [Item], only: bool) -> Option<String> {
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
            let rates = learned_rates(job)?;
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

/// The rates a batch is scheduled by when none are set: the codec's with the host thread rate
/// this device's reads have shown of the codec, before nvCOMP's slowness, which a timed decode
/// is compared with. None: no codec, or a codec whose device decoder takes every unit it may.
pub(super) fn learned_rates(job: &Job<'_>) -> Option<DecodeRates> {
    let (codec, learned) = (job.chain.compression.as_ref()?, job.learned.as_ref()?);
    Some(DecodeRates { host_thread_rate: learned.host.get(), ..codec.decode_rates()? })
}
