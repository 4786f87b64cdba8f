//! A device codec registered from outside the crate, as another crate would add one: a toy
//! bytes-to-bytes codec (`toy_framed`: a 16-byte header, "TOYFRAME" and the payload's length,
//! then the payload) with a zarrs host codec for writing and a `DeviceCodec` that the pipeline
//! finds by its name, never by a match in the pipeline.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;
use zarrs::array::codec::api::{register_codec_v3, CodecRuntimePluginV3};
use zarrs::array::codec::api::{PartialDecoderCapability, PartialEncoderCapability};
use zarrs::array::{
    data_type, Array, ArrayBuilder, ArrayBytesRaw, ArraySubset, BytesRepresentation, BytesToBytesCodecTraits, Codec,
    CodecError, CodecMetadataOptions, CodecOptions, CodecTraits, RecommendedConcurrency,
};
use zarrs::metadata::Configuration;
use zarrs::plugin::{ExtensionName, ZarrVersion};
use zarrs_gpu::zarrs_gpu_codecs::host_decode_reason;
use zarrs_gpu::zarrs_gpu_codecs::{inventory, BoxError, DeviceBatch, DeviceCodec, DeviceCodecPlugin, HostCheck};
use zarrs_gpu::{DecodePath, GdsStore, GpuConfig, GpuError};

use super::{check, Result};

const NAME: &str = "toy_framed";
const MAGIC: &[u8; 8] = b"TOYFRAME";

/// The payload of a framed unit, or why it is not one of `expected` bytes.
fn payload(encoded: &[u8], expected: u64) -> std::result::Result<&[u8], String> {
    let (head, body) = encoded.split_at_checked(16).ok_or("shorter than the 16-byte header")?;
    if &head[..8] != MAGIC {
        return Err("no TOYFRAME header".into());
    }
    let len = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
    if len != body.len() as u64 || len != expected {
        return Err(format!("header says {len} bytes, {} stored, {expected} expected", body.len()));
    }
    Ok(body)
}

/// zarrs' side: encodes and decodes on the host.
#[derive(Debug)]
struct ToyHost;

impl ExtensionName for ToyHost {
    fn name(&self, _version: ZarrVersion) -> Option<Cow<'static, str>> {
        Some(NAME.into())
    }
}

impl CodecTraits for ToyHost {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn configuration(&self, _version: ZarrVersion, _options: &CodecMetadataOptions) -> Option<Configuration> {
        Some(Configuration::default())
    }

    fn partial_decoder_capability(&self) -> PartialDecoderCapability {
        PartialDecoderCapability { partial_read: false, partial_decode: false }
    }

    fn partial_encoder_capability(&self) -> PartialEncoderCapability {
        PartialEncoderCapability { partial_encode: false }
    }
}

impl BytesToBytesCodecTraits for ToyHost {
    fn into_dyn(self: Arc<Self>) -> Arc<dyn BytesToBytesCodecTraits> {
        self
    }

    fn recommended_concurrency(
        &self,
        _decoded: &BytesRepresentation,
    ) -> std::result::Result<RecommendedConcurrency, CodecError> {
        Ok(RecommendedConcurrency::new_maximum(1))
    }

    fn encoded_representation(&self, decoded: &BytesRepresentation) -> BytesRepresentation {
        decoded.size().map_or(BytesRepresentation::UnboundedSize, |n| BytesRepresentation::FixedSize(n + 16))
    }

    fn encode<'a>(
        &self,
        decoded: ArrayBytesRaw<'a>,
        _options: &CodecOptions,
    ) -> std::result::Result<ArrayBytesRaw<'a>, CodecError> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(decoded.len() as u64).to_le_bytes());
        out.extend_from_slice(&decoded);
        Ok(Cow::Owned(out))
    }

    fn decode<'a>(
        &self,
        encoded: ArrayBytesRaw<'a>,
        decoded: &BytesRepresentation,
        _options: &CodecOptions,
    ) -> std::result::Result<ArrayBytesRaw<'a>, CodecError> {
        let expected = decoded.size().unwrap_or(encoded.len().saturating_sub(16) as u64);
        let body = payload(&encoded, expected).map_err(CodecError::Other)?;
        Ok(Cow::Owned(body.to_vec()))
    }
}

/// The device side: the header checked on the host, the payload copied on the device.
#[derive(Debug)]
struct ToyDevice;

impl DeviceCodec for ToyDevice {
    fn name(&self) -> &'static str {
        NAME
    }

    fn check(&self, encoded: &[u8], decoded_len: u64) -> std::result::Result<HostCheck, BoxError> {
        Ok(payload(encoded, decoded_len).map(|_| HostCheck::Device { digest: None })?)
    }

    unsafe fn decode(&self, batch: &DeviceBatch<'_>) -> std::result::Result<(), GpuError> {
        let n = batch.count;
        let (inputs, capacities, outputs) =
            (&batch.host_arrays[..n], &batch.host_arrays[2 * n..3 * n], &batch.host_arrays[3 * n..4 * n]);
        let stream = batch.stream.cu_stream();
        let cuda = |what: &'static str| move |e: cudarc::driver::DriverError| GpuError::Cuda { what, source: e };
        for k in 0..n {
            // SAFETY: the batch's contract: the input holds the 16-byte header then `capacity`
            // bytes (checked on the host), the output has room for `capacity` bytes.
            unsafe { sys::cuMemcpyDtoDAsync_v2(outputs[k], inputs[k] + 16, capacities[k] as usize, stream) }
                .result()
                .map_err(cuda("copying a toy payload"))?;
        }
        // Every unit decodes to its capacity (the device array of capacities), with status 0.
        // SAFETY: the batch's arrays, n entries each.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(batch.decoded_sizes, batch.capacities, 8 * n, stream)
                .result()
                .map_err(cuda("writing toy sizes"))?;
            sys::cuMemsetD32Async(batch.statuses, 0, n, stream).result().map_err(cuda("writing toy statuses"))?;
        }
        Ok(())
    }

    fn decode_host(&self, encoded: &[u8], out: &mut [u8]) -> std::result::Result<usize, String> {
        let body = payload(encoded, out.len() as u64)?;
        out.copy_from_slice(body);
        Ok(body.len())
    }
}

inventory::submit! { DeviceCodecPlugin::new(NAME, |_| Ok(Arc::new(ToyDevice))) }

/// zarrs learns the toy codec once per process (its host side, for writing and reading).
fn register_host() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        let handle = register_codec_v3(CodecRuntimePluginV3::new(
            |name| name == NAME,
            |_| Ok(Codec::BytesToBytes(Arc::new(ToyHost))),
        ));
        std::mem::forget(handle);
    });
}

/// An int32 array of 70 x 45 in 16 x 16 chunks (partial edge chunks), two chunks left missing.
fn toy_array(dir: &std::path::Path) -> Result<Array<GdsStore>> {
    register_host();
    let store = Arc::new(GdsStore::new(dir)?);
    let array = ArrayBuilder::new(vec![70, 45], vec![16, 16], data_type::int32(), -7i32)
        .bytes_to_bytes_codecs(vec![Arc::new(ToyHost)])
        .build(store, "/toy")?;
    array.store_metadata()?;
    let values: Vec<i32> = (0..70 * 45).map(|i| i * 31 - 5000).collect();
    array.store_array_subset(&array.subset_all(), values)?;
    for missing in [[1u64, 1], [4, 2]] {
        array.erase_chunk(&missing)?;
    }
    Ok(Array::open(array.storage(), "/toy")?)
}

#[test]
fn an_outside_device_codec_is_found_by_its_name() -> Result {
    let dir = tempfile::tempdir()?;
    let array = toy_array(dir.path())?;
    assert_eq!(host_decode_reason(&array), None, "the registered toy codec gives a device plan");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_outside_device_codec_decodes_on_the_device() -> Result {
    let dir = tempfile::tempdir()?;
    let array = toy_array(dir.path())?;
    let config = GpuConfig::default();
    for subset in [array.subset_all(), ArraySubset::new_with_ranges(&[3..67, 5..44])] {
        let report = check::<i32>(&array, &subset, &config)?;
        assert_eq!(report.decode, DecodePath::Device, "{report:?}");
        assert_eq!(report.host_decoded_chunks, 0, "{report:?}");
        assert!(report.missing_chunks > 0, "{report:?}");
    }
    Ok(())
}
