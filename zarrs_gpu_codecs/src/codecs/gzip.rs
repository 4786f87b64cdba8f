//! `gzip`: its registration, its device codec (nvCOMP's batched decoder; the CRC-32 of the
//! decoded bytes by nvCOMP) and the host check of its members ([`member`]).

pub(crate) mod encode;
pub mod member;

use std::ffi::c_void;
use std::sync::Arc;

use nvcomp_sys::{sys as nv, Crc32, Decompressor};
use zarrs::array::codec::GzipCodec;
use zarrs::array::{CodecTraitsV2, CodecTraitsV3};

use crate::codecs::deflate;
use crate::codecs::encode::WriteCodec;
use crate::codecs::nvcomp::{library, nvcomp_decoder};
use crate::codecs::{BoxError, DeviceBatch, DeviceCodec, DeviceCodecPlugin, HostCheck};
use crate::config::DecodeTrust;
use crate::error::GpuError;
use crate::schedule::DecodeRates;
use member::{check_member, MemberVerdict};

inventory::submit! {
    DeviceCodecPlugin::new("gzip", |_| Ok(Arc::new(Gzip)))
        .with_host(<GzipCodec as CodecTraitsV3>::create, <GzipCodec as CodecTraitsV2>::create)
        .with_encoder(|configuration, _| encode::GzipWrite::from_configuration(configuration).map(WriteCodec::Gzip))
        .with_description(
            "nvCOMP batched gzip where crc32c verifies members first or decode trust is \"trusted\" \
             (ZARRS_GPU_DECODE_TRUST), else host threads; the CRC-32 of the decoded bytes checked",
        )
}

/// `gzip`: one plain member per chunk (nvCOMP's naive decompressor, which takes members at any
/// byte: the look-ahead one wants 4-byte aligned input and decoded 4096 members of 1 MiB at 0.9
/// GiB/s on the H200, the naive one at 16), the trailer's CRC-32 verified by nvCOMP after
/// decoding. nvCOMP decodes a member only when crc32c verified it first, or under
/// [`DecodeTrust::Trusted`].
#[derive(Debug)]
pub(crate) struct Gzip;

const GZIP: Decompressor = Decompressor::Gzip { lookahead: false };

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
        deflate::may_decode(trust, verified)
    }

    nvcomp_decoder!(GZIP);

    fn decode_rates(&self) -> Option<DecodeRates> {
        Some(deflate::decode_rates())
    }

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
            library()?.crc32_async(
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
    deflate::read_into(flate2::bufread::GzDecoder::new(data), out)
}
