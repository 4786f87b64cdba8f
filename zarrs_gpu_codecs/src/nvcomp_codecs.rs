//! The device codecs this crate registers: `zstd` and `gzip`, decoded in batches by nvCOMP.

use std::ffi::c_void;
use std::sync::Arc;

use nvcomp_sys::{sys as nv, Crc32, Decompressor, NvcompLibrary};
use zarrs::array::codec::{GzipCodec, ZstdCodec};
use zarrs::array::{CodecTraitsV2, CodecTraitsV3};

use crate::device_codec::{BoxError, DeviceBatch, DeviceCodec, DeviceCodecPlugin, HostCheck};
use crate::gzip_member::{check_member, MemberVerdict};
use crate::schedule::DecodeRates;
use crate::zstd_frame::{check_frame, FrameVerdict};
use crate::{DecodeTrust, GpuError};

inventory::submit! {
    DeviceCodecPlugin::new("zstd", |_| Ok(Arc::new(Zstd)))
        .with_host(<ZstdCodec as CodecTraitsV3>::create, <ZstdCodec as CodecTraitsV2>::create)
}
inventory::submit! {
    DeviceCodecPlugin::new("gzip", |_| Ok(Arc::new(Gzip)))
        .with_host(<GzipCodec as CodecTraitsV3>::create, <GzipCodec as CodecTraitsV2>::create)
}

/// `zstd`: one frame per chunk, walked block by block on the host first; a frame's content
/// checksum, where its header sets the flag, verified by our XXH64 kernel.
#[derive(Debug)]
pub(crate) struct Zstd;

/// `gzip`: one plain member per chunk (nvCOMP's naive decompressor, which takes members at any
/// byte: the look-ahead one wants 4-byte aligned input and decoded 4096 members of 1 MiB at 0.9
/// GiB/s on the H200, the naive one at 16), the trailer's CRC-32 verified by nvCOMP after
/// decoding. nvCOMP decodes a member only when crc32c verified it first, or under
/// [`DecodeTrust::Trusted`].
#[derive(Debug)]
pub(crate) struct Gzip;

const ZSTD: Decompressor = Decompressor::Zstd;
const GZIP: Decompressor = Decompressor::Gzip { lookahead: false };

fn need(nvcomp: Option<&NvcompLibrary>) -> Result<&NvcompLibrary, GpuError> {
    nvcomp.ok_or_else(|| GpuError::NoNvcomp("this codec chain needs it".into()))
}

/// The methods of a device codec that nvCOMP's batched `$decompressor` decodes.
macro_rules! nvcomp_decoder {
    ($decompressor:expr) => {
        fn needs_nvcomp(&self) -> bool {
            true
        }

        fn temp_bytes(
            &self,
            nvcomp: Option<&NvcompLibrary>,
            count: usize,
            max: usize,
            total: usize,
        ) -> Result<usize, GpuError> {
            Ok(need(nvcomp)?.decompress_temp_size($decompressor, count, max, total)?)
        }

        fn input_alignment(&self, nvcomp: Option<&NvcompLibrary>) -> Result<usize, GpuError> {
            Ok(need(nvcomp)?.decompress_alignments($decompressor)?.input)
        }

        unsafe fn decode(&self, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
            // SAFETY: the caller's contract.
            unsafe { decompress($decompressor, batch) }
        }
    };
}

/// nvCOMP's batched decode with the batch's arrays.
unsafe fn decompress(decompressor: Decompressor, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
    // SAFETY: the batch's contract (DeviceCodec::decode).
    unsafe {
        need(batch.nvcomp)?.decompress_async(
            decompressor,
            batch.inputs as *const *const c_void,
            batch.input_sizes as *const usize,
            batch.capacities as *const usize,
            batch.decoded_sizes as *mut usize,
            batch.count,
            batch.temp as *mut c_void,
            batch.temp_bytes,
            batch.outputs as *const *mut c_void,
            batch.statuses as *mut nv::nvcompStatus_t,
            batch.stream.cu_stream() as nv::cudaStream_t,
        )
    }?;
    Ok(())
}

impl DeviceCodec for Zstd {
    fn name(&self) -> &'static str {
        "zstd"
    }

    fn check(&self, encoded: &[u8], decoded_len: u64) -> Result<HostCheck, BoxError> {
        match check_frame(encoded, decoded_len)? {
            FrameVerdict::Device { checksum: false } => Ok(HostCheck::Device { digest: None }),
            // The frame ends with the low 32 bits of the XXH64 of its content.
            FrameVerdict::Device { checksum: true } => {
                let tail = encoded.len().checked_sub(4).ok_or("zstd frame without room for its checksum")?;
                Ok(HostCheck::Device { digest: Some(u32::from_le_bytes(encoded[tail..].try_into().expect("4 bytes"))) })
            }
            FrameVerdict::Host(reason) => Ok(HostCheck::Host(reason.into())),
        }
    }

    nvcomp_decoder!(ZSTD);

    fn decode_rates(&self) -> Option<DecodeRates> {
        // Measured for this codec (see DecodeRates' defaults).
        Some(DecodeRates::default())
    }

    unsafe fn scratch_for(&self, batch: &DeviceBatch<'_>, total_decoded: usize) -> Result<Option<usize>, GpuError> {
        // SAFETY: the caller's contract: input arrays of `count` entries describing checked
        // frames, ordered on the stream; `count` statuses.
        let bytes = unsafe {
            need(batch.nvcomp)?.decompress_temp_size_of(
                ZSTD,
                batch.inputs as *const *const c_void,
                batch.input_sizes as *const usize,
                batch.count,
                batch.max_decoded,
                total_decoded,
                batch.statuses as *mut nv::nvcompStatus_t,
                batch.stream.cu_stream() as nv::cudaStream_t,
            )
        }?;
        Ok(Some(bytes))
    }

    fn digest_name(&self) -> &'static str {
        "zstd content checksum (XXH64)"
    }

    fn can_digest(&self, kernels: bool) -> bool {
        kernels
    }

    unsafe fn digest(&self, batch: &DeviceBatch<'_>, values: u64, _statuses: u64) -> Result<(), GpuError> {
        let kernels = batch.kernels.ok_or_else(|| GpuError::NoNvrtc("verifying zstd checksums needs it".into()))?;
        // SAFETY: the caller's contract; outputs are 8-byte aligned, as the kernel needs.
        unsafe { kernels.launch_xxh64(batch.stream, batch.outputs, batch.capacities, batch.count, values) }
    }

    fn decode_host(&self, encoded: &[u8], out: &mut [u8]) -> Result<usize, String> {
        // One decompression context per thread, kept: a new one (zstd::bulk::decompress_to_buffer)
        // allocates and faults in about 200 KiB for every chunk. The one-shot decode resets it.
        thread_local!(static CONTEXT: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) });
        CONTEXT.with(|context| {
            let mut context = context.borrow_mut();
            if context.is_none() {
                *context = Some(zstd::bulk::Decompressor::new().map_err(|e| e.to_string())?);
            }
            let decompressor = context.as_mut().expect("made above");
            decompressor.decompress_to_buffer(encoded, out).map_err(|e| e.to_string())
        })
    }
}

impl DeviceCodec for Gzip {
    fn name(&self) -> &'static str {
        "gzip"
    }

    fn check(&self, encoded: &[u8], decoded_len: u64) -> Result<HostCheck, BoxError> {
        Ok(match check_member(encoded, decoded_len) {
            MemberVerdict::Device { crc32 } => HostCheck::Device { digest: Some(crc32) },
            MemberVerdict::Host(reason) => HostCheck::Host(reason.into()),
        })
    }

    fn may_decode(&self, trust: DecodeTrust, verified: bool) -> bool {
        verified || trust == DecodeTrust::Trusted
    }

    nvcomp_decoder!(GZIP);

    fn digest_name(&self) -> &'static str {
        "gzip CRC-32"
    }

    fn can_digest(&self, _kernels: bool) -> bool {
        true
    }

    unsafe fn digest(&self, batch: &DeviceBatch<'_>, values: u64, statuses: u64) -> Result<(), GpuError> {
        // The trailer's CRC-32 covers the decoded bytes: computed over the output buffers.
        // SAFETY: the caller's contract.
        unsafe {
            need(batch.nvcomp)?.crc32_async(
                Crc32::IsoHdlc,
                batch.outputs as *const *const c_void,
                batch.capacities as *const usize,
                batch.count,
                batch.max_decoded,
                values as *mut u32,
                statuses as *mut nv::nvcompStatus_t,
                batch.stream.cu_stream() as nv::cudaStream_t,
            )
        }?;
        Ok(())
    }

    fn decode_host(&self, encoded: &[u8], out: &mut [u8]) -> Result<usize, String> {
        gunzip(encoded, out).map_err(|e| e.to_string())
    }
}

/// Decode the first gzip member of `data` into `out` as zarrs' gzip codec does (flate2, one
/// member, its CRC-32 and length checked): the bytes written, or `out.len() + 1` when the member
/// holds more.
fn gunzip(data: &[u8], out: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut decoder = flate2::bufread::GzDecoder::new(data);
    let mut written = 0;
    while written < out.len() {
        match decoder.read(&mut out[written..])? {
            0 => return Ok(written),
            n => written += n,
        }
    }
    // Reading on to the end checks the trailer; anything more is too long.
    let more = decoder.read(&mut [0u8; 1])?;
    Ok(written + more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_zstd_decodes_frame_after_frame_on_one_context_errors_included() {
        let frames: Vec<(Vec<u8>, Vec<u8>)> = (0..4u32)
            .map(|k| {
                let data: Vec<u8> = (0..(50_000 + k * 7_000)).map(|i| ((i * (k + 3)) % 251) as u8).collect();
                (zstd::bulk::compress(&data, 3).unwrap(), data)
            })
            .collect();
        for (n, (frame, data)) in frames.iter().enumerate() {
            let mut out = vec![0u8; data.len()];
            assert_eq!(Zstd.decode_host(frame, &mut out), Ok(data.len()));
            assert_eq!(&out, data, "frame {n}");
            // A damaged frame is an error, and the next frame still decodes on the same context.
            let mut bad = frame.clone();
            bad.truncate(frame.len() / 2);
            assert!(Zstd.decode_host(&bad, &mut out).is_err());
        }
        let (frame, data) = &frames[0];
        let mut out = vec![0u8; data.len()];
        assert_eq!(Zstd.decode_host(frame, &mut out), Ok(data.len()));
        assert_eq!(&out, data);
    }
}
