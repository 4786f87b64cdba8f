//! What every stage of a decoded read shares: the read's [`Job`], and each unit of a batch as
//! the stages see it ([`Item`], its [`Route`]).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use nvcomp_sys::NvcompLibrary;

use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device::kernels::Kernels;
use crate::error::GpuError;
use crate::pipeline::batch::DECODED_ALIGN;
use crate::pipeline::output::OutputAddress;
use crate::pipeline::route::DeviceChain;
use crate::pipeline::unit::Unit;
use crate::reader::ReadSource;
use crate::schedule::Learned;

/// How one unit of a batch is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Missing: filled with the fill value.
    Missing,
    /// nvCOMP on the device (or, with no compression in the chain, the stored bytes themselves).
    Device,
    /// zstd or flate2 on a host thread (chunks nvCOMP cannot take, or the host's share of large
    /// chunks), then one copy.
    Host,
}

/// A unit of a batch as its stages see it: where its stored and decoded bytes lie, its route
/// and the checks it carries.
pub(super) struct Item {
    /// Index into the units.
    pub(super) unit: usize,
    pub(super) stored_len: u64,
    /// Bytes of the stored chunk that are the zstd frame, gzip member or data: without the crc32c.
    pub(super) data_len: u64,
    pub(super) host_offset: u64,
    pub(super) decoded_offset: u64,
    pub(super) route: Route,
    /// The crc32c stored after the data, when the chain has crc32c.
    pub(super) crc: Option<u32>,
    /// The digest of the decoded bytes the stored data carries (gzip CRC-32, zstd XXH64).
    pub(super) digest: Option<u32>,
}

/// What every stage of one decoded read shares.
pub(super) struct Job<'a> {
    /// Where the stored bytes come from.
    pub(super) source: ReadSource<'a>,
    /// The array's fill value, for missing units.
    pub(super) fill_value: &'a [u8],
    pub(super) units: &'a [Unit],
    pub(super) chain: &'a DeviceChain,
    pub(super) config: &'a GpuConfig,
    pub(super) context: &'a GpuContext,
    pub(super) stream: &'a Arc<CudaStream>,
    /// Host-to-device copies and crc32c checks, overlapping the previous batch's decode.
    pub(super) copy_stream: &'a Arc<CudaStream>,
    pub(super) nvcomp: Option<&'a NvcompLibrary>,
    /// Our kernels (placement, gather, XXH64); None without NVRTC.
    pub(super) kernels: Option<&'a Kernels>,
    pub(super) elem: u64,
    /// Bytes of the fill block for missing units: the longest read.
    pub(super) fill_len: u64,
    /// The output (reads of units with `direct` land in it).
    pub(super) out: &'a dyn OutputAddress,
    /// A batch of this read went wholly to host threads because of nvCOMP's learned slowness
    /// (`DeviceSlowness::sends_all_to_host`): the factor relaxes once, when the read has succeeded.
    pub(super) relax: std::sync::atomic::AtomicBool,
    /// The batches were shrunk to fit the free device memory: each is split between host threads
    /// and nvCOMP by cost, as a read of one batch is (nvCOMP's fixed cost per call weighs on
    /// many small batches, and host threads need no scratch).
    pub(super) shrunk: bool,
    /// What this device's reads have shown of the chain's codec (None without one).
    pub(super) learned: Option<Arc<Learned>>,
}

impl Job<'_> {
    pub(super) fn decoded_len(&self, u: usize) -> u64 {
        self.units[u].decoded_len()
    }

    /// Where a batch lies in a slot's staging when `on_device` decode there: stored bytes,
    /// decoded bytes, the decoder's scratch, metadata.
    pub(super) fn staging<'i>(
        &self,
        on_device: impl Iterator<Item = &'i Item>,
        stored_total: u64,
        decoded_total: u64,
        meta_bytes: u64,
    ) -> Result<Staging, GpuError> {
        let (n_dec, max_decoded) =
            on_device.fold((0usize, 0u64), |(n, max), it| (n + 1, max.max(self.decoded_len(it.unit))));
        let scratch_bytes = match &self.chain.compression {
            Some(codec) if n_dec > 0 => codec.scratch_bound(n_dec, max_decoded as usize, decoded_total as usize)?,
            _ => 0,
        };
        let decoded = stored_total.next_multiple_of(DECODED_ALIGN);
        let meta = decoded + if self.chain.compression.is_some() { decoded_total } else { 0 };
        Ok(Staging { decoded, scratch_bytes, meta, len: meta + meta_bytes, max_decoded })
    }
}

/// Offsets in a slot's staging (see [`Job::staging`]) and its length, and the decoder's scratch
/// (one buffer of the read's, [`Scratch`](super::memory::Scratch)).
pub(super) struct Staging {
    pub(super) decoded: u64,
    pub(super) scratch_bytes: usize,
    pub(super) meta: u64,
    pub(super) len: u64,
    /// The largest unit decoded on the device.
    pub(super) max_decoded: u64,
}
