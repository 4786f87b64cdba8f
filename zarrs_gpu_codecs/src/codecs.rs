//! Device codecs as plugins: the [`DeviceCodec`] trait, what it is given ([`DeviceBatch`]) and
//! what its host check says ([`HostCheck`]), its registration ([`DeviceCodecPlugin`], collected
//! by `inventory`) and the lookup the pipeline uses.
//!
//! The codecs this crate registers live here too, one family to a module and its folder (its
//! registration, device codec, host check, kernels and tests): `zstd`, `gzip`, `zlib`, `blosc`,
//! the nvCOMP glue they share (`nvcomp`), the host check of deflate streams (`deflate`, shared by
//! gzip, zlib and Blosc's zlib streams) and the LZ4 block walk (`lz4`, Blosc's lz4 streams).
//! `delta` is numcodecs' delta filter, an array-to-array codec: its zarrs codec (registered with
//! zarrs here, which lacks it) and the running sum the device pipeline runs on decoded chunks.
//! `zlib` decodes with nvCOMP's deflate decoder, its Adler-32 verified by our kernel; `blosc`
//! hands each stream of a chunk to a batched decoder (our LZ4 or zstd kernels, or nvCOMP's) and
//! assembles the blocks with its own kernels. Adding
//! a family touches its folder, one `mod` line here and its kernels' line in `KERNEL_SOURCES`.

pub(crate) mod blosc;
pub(crate) mod decoder_choice;
pub mod deflate;
pub(crate) mod delta;
pub(crate) mod encode;
pub(crate) mod gzip;
pub(crate) mod lz4;
pub(crate) mod nvcomp;
pub(crate) mod zlib;
pub(crate) mod zstd;

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use zarrs::array::Codec;
use zarrs::metadata::v2::MetadataV2;
use zarrs::metadata::v3::MetadataV3;
use zarrs::metadata::Configuration;
use zarrs::plugin::PluginCreateError;

use crate::config::DecodeTrust;
use crate::device::kernels::Kernels;
use crate::device::upload::Uploads;
use crate::error::GpuError;
use crate::schedule::DecodeRates;
use encode::WriteCodec;

/// A device codec's error: any error type (a `String` or `&str` converts).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the host check says of one stored unit.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostCheck {
    /// The device may decode it. `digest`: the value [`DeviceCodec::digest`] must compute over
    /// its decoded bytes (a checksum the stored bytes carry), verified before data is returned.
    Device {
        /// The stored check value of the decoded bytes, if the unit carries one.
        digest: Option<u32>,
    },
    /// Valid as far as the host can tell, but decoded on a host thread, for this reason.
    Host(Cow<'static, str>),
}

/// One batch of units on the device, for [`DeviceCodec::decode`] and [`DeviceCodec::digest`].
///
/// The arrays are device memory of `count` entries each, ordered on `stream`: input pointers,
/// input sizes, output capacities (the decoded length of each unit) and output pointers (`u64`
/// each); then where the decode reports each unit's decoded size (`u64`) and status (`u32`, 0
/// for success).
#[non_exhaustive]
pub struct DeviceBatch<'a> {
    /// The stream all of the batch's work is ordered on.
    pub stream: &'a CudaStream,
    /// Units in the batch.
    pub count: usize,
    /// Device array of input pointers.
    pub inputs: u64,
    /// Device array of input sizes.
    pub input_sizes: u64,
    /// Device array of output capacities.
    pub capacities: u64,
    /// Device array of output pointers (each 8-byte aligned).
    pub outputs: u64,
    /// Device array the decode writes decoded sizes to.
    pub decoded_sizes: u64,
    /// Device array the decode writes statuses to (0: success).
    pub statuses: u64,
    /// Scratch device memory of [`DeviceCodec::scratch_bound`] bytes (or
    /// [`DeviceCodec::scratch_for`]'s).
    pub scratch: u64,
    /// Bytes at `scratch`.
    pub scratch_bytes: usize,
    /// The largest decoded unit.
    pub max_decoded: usize,
    /// Host copies of the first four device arrays, `count` entries each in the same order
    /// (input pointers, input sizes, output capacities, output pointers).
    pub host_arrays: &'a [u64],
    /// Each unit's stored bytes on the host, as read and checked: the bytes its input pointer
    /// holds on the device (so a codec can lay out sub-items, such as Blosc's streams).
    pub host_inputs: &'a [&'a [u8]],
    pub(crate) kernels: Option<&'a Kernels>,
    /// The device's pinned buffers for a codec's tables.
    pub(crate) uploads: Option<&'a Uploads>,
    /// Host threads decode other units of the batch once it is launched: a codec's host work
    /// before its launch (our zstd decoder's chain walks) delays theirs.
    pub(crate) host_decodes: bool,
}

impl DeviceBatch<'_> {
    /// The batch's units as the items of a batched decoder.
    pub(crate) fn items(&self) -> ItemArrays {
        ItemArrays {
            inputs: self.inputs,
            input_sizes: self.input_sizes,
            capacities: self.capacities,
            outputs: self.outputs,
            decoded: self.decoded_sizes,
            statuses: self.statuses,
        }
    }
}

/// The device arrays of `n` items as our batched decoders take them (and nvCOMP's): input
/// pointers, input sizes, capacities (each item's expected decoded length) and output pointers
/// (`u64` each), then where a decoder writes decoded lengths (`u64`) and statuses (`u32`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ItemArrays {
    pub(crate) inputs: u64,
    pub(crate) input_sizes: u64,
    pub(crate) capacities: u64,
    pub(crate) outputs: u64,
    pub(crate) decoded: u64,
    pub(crate) statuses: u64,
}

/// A batch's item arrays on the host, as [`ItemArrays`] lays them out on the device: for the
/// device kernels compiled for the CPU (the LZ4 and zstd decoders' `decode_on_host`).
#[cfg(any(test, feature = "cpu-kernels"))]
pub(crate) struct HostItems {
    pub(crate) inputs: Vec<*const u8>,
    pub(crate) input_sizes: Vec<u64>,
    pub(crate) capacities: Vec<u64>,
    pub(crate) outputs: Vec<*mut u8>,
    pub(crate) decoded: Vec<u64>,
    pub(crate) statuses: Vec<u32>,
}

/// [`HostItems`]' arrays, laid out as `host_shim.h`'s `HostItemPointers`.
#[cfg(any(test, feature = "cpu-kernels"))]
#[repr(C)]
pub(crate) struct HostItemPointers {
    inputs: *const *const u8,
    input_sizes: *const u64,
    capacities: *const u64,
    outputs: *const *mut u8,
    decoded: *mut u64,
    statuses: *mut u32,
}

#[cfg(any(test, feature = "cpu-kernels"))]
impl HostItems {
    /// Each item's input and its output, whose length is its capacity; no status written yet
    /// (`u32::MAX`).
    pub(crate) fn new(items: &mut [(&[u8], &mut [u8])]) -> Self {
        Self {
            inputs: items.iter().map(|(i, _)| i.as_ptr()).collect(),
            input_sizes: items.iter().map(|(i, _)| i.len() as u64).collect(),
            capacities: items.iter().map(|(_, o)| o.len() as u64).collect(),
            outputs: items.iter_mut().map(|(_, o)| o.as_mut_ptr()).collect(),
            decoded: vec![0; items.len()],
            statuses: vec![u32::MAX; items.len()],
        }
    }

    /// The items' count, as the kernels take it.
    pub(crate) fn count(&self) -> u64 {
        self.inputs.len() as u64
    }

    /// The arrays as the host entries take them (`host_shim.h`'s `HostItemPointers`), valid while
    /// `self` is neither moved nor changed.
    pub(crate) fn pointers(&mut self) -> HostItemPointers {
        HostItemPointers {
            inputs: self.inputs.as_ptr(),
            input_sizes: self.input_sizes.as_ptr(),
            capacities: self.capacities.as_ptr(),
            outputs: self.outputs.as_ptr(),
            decoded: self.decoded.as_mut_ptr(),
            statuses: self.statuses.as_mut_ptr(),
        }
    }

    /// Each item's status and decoded length, as the kernel wrote them.
    pub(crate) fn results(self) -> Vec<(u32, u64)> {
        self.statuses.into_iter().zip(self.decoded).collect()
    }
}

impl std::fmt::Debug for DeviceBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch")
            .field("count", &self.count)
            .field("scratch_bytes", &self.scratch_bytes)
            .field("max_decoded", &self.max_decoded)
            .finish_non_exhaustive()
    }
}

/// A bytes-to-bytes codec the device pipeline decodes.
///
/// It checks a stored unit on the host before any device sees it, decodes a batch of units on
/// the device, computes what the decoded bytes must hash to (where the stored bytes carry it),
/// and decodes on a host thread what the device may not take. Implementations register with
/// `inventory::submit!` as a [`DeviceCodecPlugin`] under a zarrs codec name; the pipeline finds
/// them from an array's own codec chain, never by matching names itself. This crate registers
/// `zstd`, `gzip`, `numcodecs.zlib` and `blosc` (nvCOMP's decoders and ours); another crate adds
/// one the same way:
///
/// ```text
/// zarrs_gpu_codecs::inventory::submit! {
///     zarrs_gpu_codecs::DeviceCodecPlugin::new("my_codec", |_configuration| Ok(Arc::new(MyDeviceCodec)))
/// }
/// ```
///
/// zarrs must know the codec too (its host side, for opening and writing arrays). `crc32c`
/// (verified on the device before anything is decoded), `bytes`, `transpose` and
/// `sharding_indexed` are the structure the pipeline walks, not plugins.
pub trait DeviceCodec: Send + Sync + std::fmt::Debug {
    /// The codec's name in messages.
    fn name(&self) -> &str;

    /// Whether [`decode`](Self::decode) needs nVCOMP (the pipeline refuses at once without it).
    fn needs_nvcomp(&self) -> bool {
        false
    }

    /// Whether [`decode`](Self::decode) runs kernels of this crate (NVRTC compiles them): without
    /// them, the units decode on host threads.
    fn needs_kernels(&self) -> bool {
        false
    }

    /// Whose decoder [`decode`](Self::decode) runs, for the read's report: `"nvCOMP"` where it
    /// needs nvCOMP, else `"ours"` (a kernel of this crate or of the plugin).
    fn decoder(&self) -> &'static str {
        if self.needs_nvcomp() {
            "nvCOMP"
        } else {
            "ours"
        }
    }

    /// Check one stored unit on the host before any device sees it: everything the device
    /// decoder would choke on, where that is cheap. `decoded_len` is the unit's decoded length.
    ///
    /// # Errors
    /// Returns why the unit is not valid data of this codec (the pipeline names the unit and
    /// keeps the error as the cause).
    fn check(&self, encoded: &[u8], decoded_len: u64) -> Result<HostCheck, BoxError>;

    /// Whether units that passed [`check`](Self::check) may be decoded on the device under
    /// `trust`; `verified`: a checksum of the stored bytes (crc32c) was verified first.
    fn may_decode(&self, trust: DecodeTrust, verified: bool) -> bool {
        verified || trust != DecodeTrust::Verified
    }

    /// Another codec to decode a read's units under `trust` (`verified`: crc32c checks the stored
    /// bytes first): a family with several device decoders picks one here, once per read. None
    /// (the default): this codec.
    fn routed(&self, trust: DecodeTrust, verified: bool) -> Option<Arc<dyn DeviceCodec>> {
        let _ = (trust, verified);
        None
    }

    /// Scratch device memory enough for the decode of any batch of `count` units of at most
    /// `max_decoded` bytes, `total_decoded` in all: what the pipeline budgets a batch by.
    ///
    /// # Errors
    /// Returns the device library's error.
    fn scratch_bound(&self, count: usize, max_decoded: usize, total_decoded: usize) -> Result<usize, GpuError> {
        let _ = (count, max_decoded, total_decoded);
        Ok(0)
    }

    /// How fast this codec decodes on the device and on a host thread, for the scheduler that
    /// splits small reads between them; None (the default): the device takes every unit it may,
    /// at any size (a decoder no slower than host threads at any size needs no split).
    fn decode_rates(&self) -> Option<DecodeRates> {
        None
    }

    /// Whether the device decodes faster in batches larger than the staging budget, where the
    /// device has room and the caller set no budget (zstd: nvCOMP's rate is the frames in
    /// flight, 4096 frames of 1 MiB per call ran 20% faster than 1024). A codec whose reads are
    /// bound by the host (its check) says no: smaller batches overlap more of it with the
    /// device's work, and leave less of that work after the host's last batch.
    fn prefers_large_batches(&self) -> bool {
        true
    }

    /// The scratch `batch` needs, computed from its stored bytes on the device, where that can
    /// be less than [`scratch_bound`](Self::scratch_bound) for the same batch; None: the
    /// bound. Only `stream`, `count`, the input arrays, `statuses`, `max_decoded` and
    /// `host_arrays` are set; the query may wait for `stream`. The pipeline asks only when the
    /// bound is large (a wait per batch costs small batches more than their scratch).
    ///
    /// # Safety
    /// As for [`decode`](Self::decode), for the fields set.
    ///
    /// # Errors
    /// Returns the device library's error.
    unsafe fn scratch_for(&self, batch: &DeviceBatch<'_>, total_decoded: usize) -> Result<Option<usize>, GpuError> {
        let _ = (batch, total_decoded);
        Ok(None)
    }

    /// The alignment the decoder needs of each input (units stored at other offsets decode on
    /// host threads).
    ///
    /// # Errors
    /// Returns the device library's error.
    fn input_alignment(&self) -> Result<usize, GpuError> {
        Ok(1)
    }

    /// Enqueue the decode of `batch` on its stream.
    ///
    /// # Safety
    /// The pipeline guarantees the batch's contract: every array and buffer it describes is
    /// valid device memory, ordered on `batch.stream`, and every input passed [`check`](Self::check).
    ///
    /// # Errors
    /// Returns an error when the work cannot be enqueued.
    unsafe fn decode(&self, batch: &DeviceBatch<'_>) -> Result<(), GpuError>;

    /// The name of the digest, in messages ("zstd content checksum (XXH64)").
    fn digest_name(&self) -> &'static str {
        "checksum"
    }

    /// Enqueue, after the decode, the digest of each decoded unit: `values` and `statuses` are
    /// device arrays of `batch.count` `u32` (statuses zeroed before; nonzero: the digest failed).
    /// Called when a unit's [`HostCheck::Device`] carried a digest.
    ///
    /// # Safety
    /// As for [`decode`](Self::decode); `values` and `statuses` have room for `batch.count` entries.
    ///
    /// # Errors
    /// Returns an error when the work cannot be enqueued, or the digest cannot be computed here.
    unsafe fn digest(&self, batch: &DeviceBatch<'_>, values: u64, statuses: u64) -> Result<(), GpuError> {
        let _ = (batch, values, statuses);
        Err(GpuError::Unsupported(format!("{} cannot compute its digest on the device", self.name())))
    }

    /// Whether [`digest`](Self::digest) can run (without it, units carrying one decode on host
    /// threads, where [`decode_host`](Self::decode_host) verifies them).
    fn can_digest(&self, kernels: bool) -> bool {
        let _ = kernels;
        false
    }

    /// A device status of [`decode`](Self::decode) or [`digest`](Self::digest), in words.
    fn status_string(&self, status: u32) -> String {
        format!("status {status}")
    }

    /// Decode one unit on a host thread into `out` (its decoded length), verifying whatever the
    /// stored bytes carry; returns the bytes written.
    ///
    /// # Errors
    /// Returns why the unit cannot be decoded.
    fn decode_host(&self, encoded: &[u8], out: &mut [u8]) -> Result<usize, String>;
}

/// zarrs' host codec for Zarr v3 metadata, as zarrs' codec plugins make it.
pub type HostCodecV3 = fn(&MetadataV3) -> Result<Codec, PluginCreateError>;
/// zarrs' host codec for Zarr v2 metadata.
pub type HostCodecV2 = fn(&MetadataV2) -> Result<Codec, PluginCreateError>;

/// A device codec's registration: the zarrs codec name it decodes, how to make it from the
/// codec's configuration, and (optionally) zarrs' host codec of that name, which GPU mode then
/// builds as a [`GpuModeCodec`](crate::GpuModeCodec) carrying the device codec.
#[derive(Debug)]
pub struct DeviceCodecPlugin {
    name: &'static str,
    create: fn(&Configuration) -> Result<Arc<dyn DeviceCodec>, String>,
    host: Option<(HostCodecV3, HostCodecV2)>,
    description: &'static str,
    /// The family's encoder half: the device write a configuration asks for (elements of the
    /// given size in bytes), or why the host writes it. Only this crate's families have one: the
    /// write pipeline knows their framing.
    encoder: Option<EncoderFn>,
}

impl DeviceCodecPlugin {
    /// A plugin for the codec named `name` (its Zarr v3 name, which zarrs also gives v2
    /// compressors it maps); `create` returns why a configuration has no device implementation.
    #[must_use]
    pub const fn new(name: &'static str, create: fn(&Configuration) -> Result<Arc<dyn DeviceCodec>, String>) -> Self {
        Self { name, create, host: None, description: "", encoder: None }
    }

    /// With a line on how the device decodes the codec (for `zarrs-gpu info`'s plan).
    #[must_use]
    pub const fn with_description(mut self, description: &'static str) -> Self {
        self.description = description;
        self
    }

    /// With the family's encoder half (see the field).
    pub(crate) const fn with_encoder(
        mut self,
        encoder: fn(&Configuration, usize) -> Result<WriteCodec, String>,
    ) -> Self {
        self.encoder = Some(encoder);
        self
    }

    /// The device write of the codec registered as `name` with `configuration` (elements of
    /// `elem` bytes), or why the host writes it.
    pub(crate) fn encoder(name: &str, configuration: &Configuration, elem: usize) -> Result<WriteCodec, String> {
        match plugin(name)?.and_then(|p| p.encoder) {
            Some(encoder) => encoder(configuration, elem),
            None => Err(format!("{name} is encoded on the host (no device encoder for it yet)")),
        }
    }

    /// How the device decodes the codec registered as `name` (empty where its plugin says
    /// nothing), or None where no plugin is registered for it.
    #[must_use]
    pub fn describe(name: &str) -> Option<&'static str> {
        plugin(name).ok().flatten().map(|p| p.description)
    }

    /// With zarrs' host codec of this name, for GPU mode's registration.
    #[must_use]
    pub const fn with_host(mut self, v3: HostCodecV3, v2: HostCodecV2) -> Self {
        self.host = Some((v3, v2));
        self
    }

    /// The codec name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The device codec for a codec of this name with `configuration`.
    ///
    /// # Errors
    /// Returns why that configuration has no device implementation.
    pub fn create(&self, configuration: &Configuration) -> Result<Arc<dyn DeviceCodec>, String> {
        (self.create)(configuration)
    }

    /// zarrs' host codecs of this name, where the plugin names them.
    #[must_use]
    pub fn host(&self) -> Option<(HostCodecV3, HostCodecV2)> {
        self.host
    }
}

/// A family's encoder half: the device write a configuration asks for (elements of the given
/// size in bytes), or why the host writes it.
type EncoderFn = fn(&Configuration, usize) -> Result<WriteCodec, String>;

inventory::collect!(DeviceCodecPlugin);

/// The sources of the kernels this crate's codecs launch (zstd's XXH64), compiled into each
/// device's module with the pipeline's (`Kernels::load`).
pub(crate) const KERNEL_SOURCES: &[&str] = &[
    zstd::xxhash::SOURCE,
    blosc::kernels::SOURCE,
    zlib::adler32::SOURCE,
    zlib::payload::SOURCE,
    delta::kernels::SOURCE,
    lz4::decode::SOURCE,
    zstd::decode::SOURCE,
];

/// A codec configuration as JSON, for messages.
pub(crate) fn json(configuration: &Configuration) -> String {
    serde_json::to_string(configuration).unwrap_or_default()
}

/// The registered plugin for `name`, if any; an error when several crates registered one
/// (which of them `inventory` lists first is not defined).
pub(crate) fn plugin(name: &str) -> Result<Option<&'static DeviceCodecPlugin>, String> {
    let mut found = inventory::iter::<DeviceCodecPlugin>.into_iter().filter(|p| p.name == name);
    let first = found.next();
    if found.next().is_some() {
        return Err(format!("several device codecs are registered for {name}"));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::DeviceCodecPlugin;

    /// Each family of this crate says how the device decodes it; an unregistered name is none.
    #[test]
    fn the_families_describe_themselves() {
        for (name, words) in [
            ("zstd", "our decoder"),
            ("gzip", "nvCOMP batched gzip"),
            ("numcodecs.zlib", "Adler-32"),
            ("blosc", "our LZ4 decoder"),
        ] {
            let text = DeviceCodecPlugin::describe(name).unwrap_or_default();
            assert!(text.contains(words), "{name}: {text:?}");
        }
        assert_eq!(DeviceCodecPlugin::describe("no_such_codec"), None);
    }
}
