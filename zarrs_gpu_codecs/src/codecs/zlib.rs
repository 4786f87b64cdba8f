//! `zlib` (numcodecs' `zlib` compressor: zarr v2 `{"id": "zlib"}`, v3 `numcodecs.zlib`, zarrs'
//! `ZlibCodec`): its registration, its device codec, the host check of its streams ([`stream`]),
//! the kernel that hands nvCOMP their deflate streams (`payload`) and the Adler-32 kernel that
//! verifies what nvCOMP decoded (`adler32`).
//!
//! - **Checked on the host** ([`stream::check_stream`]): the 2-byte header (deflate, a window of
//!   at most 32 KiB, FCHECK, no preset dictionary), the length, and of the deflate stream its
//!   first blocks' headers ([`crate::codecs::deflate`]); what zlib rejects is an error naming the
//!   chunk, what the device does not take decodes on host threads.
//! - **Trust**: nvCOMP decodes a stream only when crc32c verified the stored bytes first, or under
//!   [`DecodeTrust::Trusted`] (nvCOMP is undefined on malformed deflate), as for gzip; the rest
//!   decode on host threads (flate2, the Adler-32 checked, as zarrs' codec decodes them).
//! - **Decoded** by nvCOMP's batched deflate decoder, on the deflate stream between the header and
//!   the Adler-32, copied to 4-byte aligned places first (nvCOMP's deflate inputs must be; see
//!   `payload`).
//! - **Digest**: the Adler-32 (the stream's last four bytes, big-endian) of every decoded unit,
//!   computed on the device by our kernel and compared before any data is returned: wrong bytes
//!   from nvCOMP are an error naming the chunk. Without NVRTC (no kernels) zlib chunks decode on
//!   host threads.

pub(crate) mod adler32;
pub(crate) mod encode;
pub(crate) mod payload;
pub mod stream;

use std::sync::Arc;

use nvcomp_sys::{Decompressor, NvcompLibrary};
use zarrs::array::codec::ZlibCodec;
use zarrs::array::{CodecTraitsV2, CodecTraitsV3};

use crate::codecs::deflate;
use crate::codecs::encode::WriteCodec;
use crate::codecs::nvcomp::{self as nvcomp_backend, decompress, library};
use crate::codecs::{BoxError, DeviceBatch, DeviceCodec, DeviceCodecPlugin, HostCheck};
use crate::config::DecodeTrust;
use crate::error::GpuError;
use crate::schedule::DecodeRates;
use payload::Layout;
use stream::{check_stream, StreamVerdict};

// zarrs names the codec `numcodecs.zlib` (v3), which it also gives v2's `zlib` compressor. GPU
// mode's codecs are registered under that name, so v2 arrays in GPU mode keep zarrs' own codec,
// whose device codec the pipeline then finds by the same name.
inventory::submit! {
    DeviceCodecPlugin::new("numcodecs.zlib", |_| Ok(Arc::new(Zlib)))
        .with_host(<ZlibCodec as CodecTraitsV3>::create, <ZlibCodec as CodecTraitsV2>::create)
        .with_encoder(|configuration, _| encode::ZlibWrite::from_configuration(configuration).map(WriteCodec::Zlib))
        .with_description(
            "nvCOMP batched deflate where crc32c verifies streams first or decode trust is \"trusted\" \
             (ZARRS_GPU_DECODE_TRUST), else host threads; streams checked on the host first; the Adler-32 of the \
             decoded bytes verified on the device",
        )
}

/// `zlib`: one zlib stream per chunk; nvCOMP decodes its deflate stream, our kernel verifies its
/// Adler-32 (see the module docs).
#[derive(Debug)]
pub(crate) struct Zlib;

const DEFLATE: Decompressor = Decompressor::Deflate;

/// Whether nvCOMP takes deflate streams at any byte (then they are decoded where they lie).
fn in_place(nvcomp: &NvcompLibrary) -> Result<bool, GpuError> {
    Ok(nvcomp.decompress_alignments(DEFLATE)?.input <= 1)
}

impl DeviceCodec for Zlib {
    fn name(&self) -> &'static str {
        "zlib"
    }

    fn needs_kernels(&self) -> bool {
        // The stream parse and the Adler-32 are kernels of ours.
        true
    }

    fn needs_nvcomp(&self) -> bool {
        true
    }

    fn check(&self, encoded: &[u8], decoded_len: u64) -> Result<HostCheck, BoxError> {
        Ok(match check_stream(encoded, decoded_len)? {
            StreamVerdict::Device { adler32 } => HostCheck::Device { digest: Some(adler32) },
            StreamVerdict::Host(reason) => HostCheck::Host(reason.into()),
        })
    }

    fn decode_rates(&self) -> Option<DecodeRates> {
        Some(deflate::decode_rates())
    }

    fn may_decode(&self, trust: DecodeTrust, verified: bool) -> bool {
        deflate::may_decode(trust, verified)
    }

    fn scratch_bound(&self, count: usize, max_decoded: usize, total_decoded: usize) -> Result<usize, GpuError> {
        let nvcomp = library()?;
        let layout = Layout::bound(count, max_decoded, in_place(nvcomp)?);
        Ok(layout.bytes(nvcomp.decompress_temp_size(DEFLATE, count, max_decoded, total_decoded)?))
    }

    unsafe fn scratch_for(&self, batch: &DeviceBatch<'_>, total_decoded: usize) -> Result<Option<usize>, GpuError> {
        // The slots sized by the streams themselves (their host sizes; nothing to wait for).
        let nvcomp = library()?;
        let n = batch.count;
        let layout = Layout::of_streams(&batch.host_arrays[n..2 * n], in_place(nvcomp)?);
        Ok(Some(layout.bytes(nvcomp.decompress_temp_size(DEFLATE, n, batch.max_decoded, total_decoded)?)))
    }

    // Any byte: `decode` moves each deflate stream to where nvCOMP takes it.

    unsafe fn decode(&self, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
        let nvcomp = library()?;
        let kernels = batch.kernels.ok_or_else(|| GpuError::NoNvrtc("decoding zlib on the device needs it".into()))?;
        let n = batch.count;
        let layout = Layout::of_streams(&batch.host_arrays[n..2 * n], in_place(nvcomp)?);
        let decoded: usize = batch.host_arrays[2 * n..3 * n].iter().map(|&c| c as usize).sum();
        let nvcomp_temp = nvcomp.decompress_temp_size(DEFLATE, n, batch.max_decoded, decoded)?;
        if layout.bytes(nvcomp_temp) > batch.scratch_bytes {
            return Err(GpuError::Unsupported(format!(
                "zlib decode: {} bytes of scratch needed, {} given",
                layout.bytes(nvcomp_temp),
                batch.scratch_bytes
            )));
        }
        // SAFETY: the batch's contract: n checked zlib streams of at least 8 bytes, no deflate
        // stream longer than the layout's slots (sized from these very sizes), in staging that
        // starts 256-byte aligned; the scratch as large as checked above, ordered on the stream.
        let (inputs, input_sizes) =
            unsafe { layout.launch(kernels, batch.stream, batch.inputs, batch.input_sizes, batch.scratch) }?;
        let streams = DeviceBatch {
            inputs,
            input_sizes,
            scratch: batch.scratch + layout.nvcomp_at as u64,
            scratch_bytes: batch.scratch_bytes - layout.nvcomp_at,
            ..*batch
        };
        // SAFETY: the batch's contract, with the deflate streams' arrays the kernel wrote before
        // on the same stream (4-byte aligned slots, or in place where nvCOMP takes any byte), and
        // the rest of the scratch, at least what nvCOMP asked for these units.
        unsafe { decompress(DEFLATE, &streams) }
    }

    fn digest_name(&self) -> &'static str {
        "zlib Adler-32"
    }

    fn can_digest(&self, kernels: bool) -> bool {
        kernels
    }

    unsafe fn digest(&self, batch: &DeviceBatch<'_>, values: u64, _statuses: u64) -> Result<(), GpuError> {
        let kernels = batch.kernels.ok_or_else(|| GpuError::NoNvrtc("verifying zlib's Adler-32 needs it".into()))?;
        // SAFETY: the caller's contract: outputs and capacities describe the decoded units.
        unsafe { adler32::launch_adler32(kernels, batch.stream, batch.outputs, batch.capacities, batch.count, values) }
    }

    fn status_string(&self, status: u32) -> String {
        nvcomp_backend::status_string(status)
    }

    fn decode_host(&self, encoded: &[u8], out: &mut [u8]) -> Result<usize, String> {
        unzlib(encoded, out).map_err(|e| e.to_string())
    }
}

/// Decode the zlib stream at the start of `data` into `out` as zarrs' zlib codec does (flate2,
/// the Adler-32 checked at the stream's end): the bytes written, or `out.len() + 1` when the
/// stream holds more.
fn unzlib(data: &[u8], out: &mut [u8]) -> std::io::Result<usize> {
    deflate::read_into(flate2::bufread::ZlibDecoder::new(data), out)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn zlib(raw: &[u8], level: u32) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(level));
        encoder.write_all(raw).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn host_decodes_check_the_size_and_the_adler32() {
        let raw: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8 ^ (i / 1000) as u8).collect();
        for level in [0, 1, 6, 9] {
            let stream = zlib(&raw, level);
            let mut out = vec![0u8; raw.len()];
            assert_eq!(Zlib.decode_host(&stream, &mut out), Ok(raw.len()));
            assert_eq!(out, raw);
            // Too short an output, too long: reported by size.
            let mut short = vec![0u8; raw.len() - 1];
            assert_eq!(Zlib.decode_host(&stream, &mut short), Ok(raw.len()));
            let mut long = vec![0u8; raw.len() + 1];
            assert_eq!(Zlib.decode_host(&stream, &mut long), Ok(raw.len()));
            // A wrong Adler-32 is an error.
            let mut bad = stream.clone();
            *bad.last_mut().unwrap() ^= 1;
            assert!(Zlib.decode_host(&bad, &mut out).is_err(), "level {level}");
        }
    }

    #[test]
    fn the_check_carries_the_adler32_and_trust_is_gzips() {
        let raw = vec![3u8; 10_000];
        let stream = zlib(&raw, 6);
        let digest = Some(adler2::adler32_slice(&raw));
        assert_eq!(Zlib.check(&stream, 10_000).unwrap(), HostCheck::Device { digest });
        assert!(Zlib.check(&[0x78, 0x9D, 0, 0, 0, 0, 0, 0], 10).is_err());
        for trust in [DecodeTrust::Checked, DecodeTrust::Verified, DecodeTrust::Trusted] {
            assert!(Zlib.may_decode(trust, true));
            assert_eq!(Zlib.may_decode(trust, false), trust == DecodeTrust::Trusted);
        }
        assert!(Zlib.can_digest(true) && !Zlib.can_digest(false));
    }
}
