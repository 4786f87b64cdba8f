//! `zstd`: its registration, its device codec (nvCOMP's batched decoder or ours, [`decode`]:
//! picked per read by its trust, or named by `ZARRS_GPU_ZSTD_DECODER`), the host check of its
//! frames ([`frame`]) and the XXH64 kernel that verifies their content checksums (`xxhash`).

pub mod decode;
pub(crate) mod encode;
pub mod frame;
pub(crate) mod xxhash;

use std::ffi::c_void;
use std::sync::Arc;

use nvcomp_sys::{sys as nv, Decompressor};
use zarrs::array::codec::ZstdCodec;
use zarrs::array::{CodecTraitsV2, CodecTraitsV3};

use crate::codecs::encode::WriteCodec;
use crate::codecs::nvcomp::{self as nvcomp_backend, library};
use crate::codecs::{BoxError, DeviceBatch, DeviceCodec, DeviceCodecPlugin, HostCheck};
use crate::config::DecodeTrust;
use crate::error::GpuError;
use crate::schedule::DecodeRates;
use decode::{launch_block_decode, launch_decode, launch_frame_plans, BlockPlan, ZstdDecoder};
use frame::{check_frame, FrameVerdict};

inventory::submit! {
    DeviceCodecPlugin::new("zstd", |_| Ok(Arc::new(Zstd { decoder: ZstdDecoder::from_env(&crate::env::ZSTD_DECODER)? })))
        .with_host(<ZstdCodec as CodecTraitsV3>::create, <ZstdCodec as CodecTraitsV2>::create)
        .with_encoder(|configuration, _| encode::ZstdWrite::from_configuration(configuration).map(WriteCodec::Zstd))
        .with_description(
            "frames checked on the host first, then our decoder (a frame's blocks side by side; any input an error at \
             worst), or nvCOMP's batched zstd where crc32c verifies frames first or decode trust is \"trusted\" \
             (ZARRS_GPU_DECODE_TRUST); content checksums, where frames carry them, verified on the device (XXH64)",
        )
}

/// `zstd`: one frame per chunk, walked block by block on the host first; a frame's content
/// checksum, where its header sets the flag, verified by our XXH64 kernel.
#[derive(Debug)]
pub(crate) struct Zstd {
    decoder: ZstdDecoder,
}

impl Zstd {
    /// Whether ours decodes: named, or `Auto` not yet routed (ours takes any input).
    fn runs_ours(&self) -> bool {
        self.decoder != ZstdDecoder::Nvcomp
    }
}

const ZSTD: Decompressor = Decompressor::Zstd;

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

    fn needs_nvcomp(&self) -> bool {
        !self.runs_ours()
    }

    fn needs_kernels(&self) -> bool {
        self.runs_ours()
    }

    fn may_decode(&self, trust: DecodeTrust, verified: bool) -> bool {
        decode::may_decode(self.decoder, trust, verified)
    }

    fn routed(&self, trust: DecodeTrust, verified: bool) -> Option<Arc<dyn DeviceCodec>> {
        let decoder = decode::for_route(self.decoder, trust, verified);
        (decoder != self.decoder).then(|| Arc::new(Zstd { decoder }) as Arc<dyn DeviceCodec>)
    }

    fn scratch_bound(&self, count: usize, max: usize, total: usize) -> Result<usize, GpuError> {
        match self.decoder {
            ZstdDecoder::Ours | ZstdDecoder::Auto => Ok(BlockPlan::bound(count, total)),
            ZstdDecoder::Nvcomp => nvcomp_backend::scratch_bound(ZSTD, count, max, total),
        }
    }

    fn input_alignment(&self) -> Result<usize, GpuError> {
        match self.decoder {
            ZstdDecoder::Ours | ZstdDecoder::Auto => Ok(1),
            ZstdDecoder::Nvcomp => nvcomp_backend::input_alignment(ZSTD),
        }
    }

    unsafe fn decode(&self, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
        match self.decoder {
            // SAFETY: the caller's contract.
            ZstdDecoder::Nvcomp => unsafe { nvcomp_backend::decompress(ZSTD, batch) },
            ZstdDecoder::Ours | ZstdDecoder::Auto => {
                let kernels =
                    batch.kernels.ok_or_else(|| GpuError::NoNvrtc("our zstd decoder is a kernel of ours".into()))?;
                let arrays = batch.items();
                // The block-parallel decoder where its scratch fits (the batch's own frames
                // planned on the host), else one warp per frame.
                let capacities = batch.host_arrays.get(2 * batch.count..3 * batch.count).unwrap_or_default();
                let plan = BlockPlan::device_walks(batch.host_inputs, capacities);
                match batch.uploads {
                    Some(uploads)
                        if plan.len <= batch.scratch_bytes
                            && batch.host_inputs.len() == batch.count
                            && capacities.len() == batch.count =>
                    {
                        let (stream, n, scratch) = (batch.stream, batch.count, batch.scratch);
                        // The chains walked on the host where quicker, but not while host
                        // threads wait to decode the batch's other chunks; meanwhile the device
                        // walks the frames' headers and decodes the literals.
                        let host_walks = !batch.host_decodes && plan.host_walks_chains();
                        let plan = plan.literals_first(host_walks);
                        // SAFETY: the batch's arrays, as the kernels take them (the caller's
                        // contract); the scratch holds the plan of the batch's own stored bytes.
                        unsafe { launch_frame_plans(kernels, uploads, stream, &arrays, n, &plan, scratch) }?;
                        let plan = if host_walks { plan.with_host_chains(batch.host_inputs) } else { plan };
                        // SAFETY: as above, after the frame plans of the same layout.
                        unsafe { launch_block_decode(kernels, uploads, stream, &arrays, n, &plan, scratch) }
                    }
                    // SAFETY: the batch's arrays, as the kernel takes them (the caller's contract).
                    _ => unsafe { launch_decode(kernels, batch.stream, &arrays, batch.count) },
                }
            }
        }
    }

    fn status_string(&self, status: u32) -> String {
        match self.decoder {
            ZstdDecoder::Ours | ZstdDecoder::Auto => decode::status_text(status).to_string(),
            ZstdDecoder::Nvcomp => nvcomp_backend::status_string(status),
        }
    }

    fn decode_rates(&self) -> Option<DecodeRates> {
        // Measured for this codec: nvCOMP's in DecodeRates' defaults; ours on an H100
        // (benches/RESULTS.md run DW1): through the pipeline, reads of 1, 16, 64, 288 and 1,024
        // Z2 chunks of 1 MiB all on ours took 1.18, 3.46, 7.29, 22.7 and 42.7 ms, on host
        // threads 2.39, 3.25, 9.45, 42.5 and 135.9, split by the rates 1.41, 3.74, 7.23, 26.0
        // and 48.2: frames under 4 MiB stay on the device. For larger ones: one frame executes
        // at about 330 MiB/s (a 1 MiB frame in 3.1 ms on a thread block), 8 GiB of frames decode
        // alone in 128 ms (63 GiB/s); about 0.4 ms of launches and plan.
        Some(match self.decoder {
            ZstdDecoder::Nvcomp => DecodeRates::default(),
            ZstdDecoder::Ours | ZstdDecoder::Auto => DecodeRates {
                device_call_s: 0.4e-3,
                device_frame_rate: 330.0 * crate::schedule::MIB,
                device_rate: 63.0 * crate::schedule::GIB,
                small_frames_on_device: true,
                ..DecodeRates::default()
            },
        })
    }

    unsafe fn scratch_for(&self, batch: &DeviceBatch<'_>, total_decoded: usize) -> Result<Option<usize>, GpuError> {
        if self.runs_ours() {
            // Sized from the batch's own frames, on the host.
            let capacities = batch.host_arrays.get(2 * batch.count..3 * batch.count).unwrap_or_default();
            return Ok(Some(BlockPlan::device_walks(batch.host_inputs, capacities).len));
        }
        // SAFETY: the caller's contract: input arrays of `count` entries describing checked
        // frames, ordered on the stream; `count` statuses.
        let bytes = unsafe {
            library()?.decompress_temp_size_of(
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

#[cfg(test)]
mod tests {
    use super::*;

    const ZSTD_CODEC: Zstd = Zstd { decoder: ZstdDecoder::Nvcomp };

    #[test]
    fn each_decoder_is_named_for_the_report_and_ours_needs_no_nvcomp_nor_trust() {
        let ours = Zstd { decoder: ZstdDecoder::Ours };
        assert_eq!((ZSTD_CODEC.decoder(), ours.decoder()), ("nvCOMP", "ours"));
        assert!(ZSTD_CODEC.needs_nvcomp() && !ours.needs_nvcomp());
        assert!(!ZSTD_CODEC.may_decode(DecodeTrust::Verified, false));
        assert!(ours.may_decode(DecodeTrust::Verified, false));
        assert_eq!(ours.scratch_bound(1, 1 << 20, 1 << 20).ok(), Some(BlockPlan::bound(1, 1 << 20)));
        assert_eq!(ours.input_alignment().ok(), Some(1));
        assert_eq!(ours.status_string(crate::codecs::zstd::decode::BAD_SEQUENCE), decode::status_text(9));
        // The scheduler weighs ours by its own costs: a far smaller fixed cost, a faster frame;
        // small frames stay on ours (a read of 16 or 1,024 of 1 MiB), nvCOMP's go to host
        // threads or split.
        let (theirs, mine) = (ZSTD_CODEC.decode_rates().unwrap(), ours.decode_rates().unwrap());
        assert!(mine.device_call_s < theirs.device_call_s && mine.device_frame_rate > 3.0 * theirs.device_frame_rate);
        assert_eq!(mine.host_thread_rate.to_bits(), theirs.host_thread_rate.to_bits());
        let m = 1u64 << 20;
        for n in [16, 1024] {
            assert_eq!(mine.host_share(n, n as u64 * m, m, 16), 0);
            assert!(theirs.host_share(n, n as u64 * m, m, 16) > 0);
        }
    }

    #[test]
    fn auto_sends_what_nothing_verified_to_ours_and_verified_or_trusted_frames_to_nvcomp() {
        use DecodeTrust::{Checked, Trusted, Verified};
        let routed = |decoder, trust, verified| {
            let codec = Zstd { decoder };
            codec.routed(trust, verified).unwrap_or_else(|| Arc::new(codec))
        };
        let route = |trust, verified| routed(ZstdDecoder::Auto, trust, verified);
        // Nothing verifies the frames: ours, which no input can hang.
        assert_eq!(route(Checked, false).decoder(), "ours");
        assert!(!route(Checked, false).needs_nvcomp());
        assert!(route(Checked, false).may_decode(Checked, false));
        // crc32c first, or trusted data: nvCOMP's.
        for (trust, verified) in [(Checked, true), (Verified, true), (Trusted, false), (Trusted, true)] {
            let codec = route(trust, verified);
            assert_eq!(codec.decoder(), "nvCOMP", "{trust:?}, verified {verified}");
            assert!(codec.may_decode(trust, verified));
        }
        // `verified` trust and nothing verified: the host decodes, whichever decoder.
        assert!(!route(Verified, false).may_decode(Verified, false));
        // Unrouted, auto decodes with ours; a decoder named stays named.
        assert_eq!(Zstd { decoder: ZstdDecoder::Auto }.decoder(), "ours");
        assert_eq!(routed(ZstdDecoder::Nvcomp, Checked, false).decoder(), "nvCOMP");
        assert_eq!(routed(ZstdDecoder::Ours, Trusted, true).decoder(), "ours");
        assert_eq!("auto".parse::<ZstdDecoder>(), Ok(ZstdDecoder::Auto));
        assert_eq!(ZstdDecoder::default(), ZstdDecoder::Auto);
    }

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
            assert_eq!(ZSTD_CODEC.decode_host(frame, &mut out), Ok(data.len()));
            assert_eq!(&out, data, "frame {n}");
            // A damaged frame is an error, and the next frame still decodes on the same context.
            let mut bad = frame.clone();
            bad.truncate(frame.len() / 2);
            assert!(ZSTD_CODEC.decode_host(&bad, &mut out).is_err());
        }
        let (frame, data) = &frames[0];
        let mut out = vec![0u8; data.len()];
        assert_eq!(ZSTD_CODEC.decode_host(frame, &mut out), Ok(data.len()));
        assert_eq!(&out, data);
    }
}
