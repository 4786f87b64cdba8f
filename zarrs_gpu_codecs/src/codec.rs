//! The device zstd codec, registered with zarrs as a runtime codec plugin for the name "zstd"
//! while GPU mode is on. It is zarrs' own zstd codec on the host (same metadata, same decoding
//! through the ordinary zarrs API) and marks its arrays for device decoding: the device pipeline
//! decodes "zstd" chains with nvCOMP.

use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use zarrs::array::codec::api::{
    register_codec_v2, register_codec_v3, unregister_codec_v2, unregister_codec_v3, CodecRuntimePluginV2,
    CodecRuntimePluginV3, CodecRuntimeRegistryHandleV2, CodecRuntimeRegistryHandleV3,
};
use zarrs::array::codec::ZstdCodec;
use zarrs::array::{
    ArrayBytesRaw, BytesPartialDecoderTraits, BytesPartialEncoderTraits, BytesRepresentation, BytesToBytesCodecTraits,
    Codec, CodecError, CodecMetadataOptions, CodecOptions, CodecTraits, CodecTraitsV2, CodecTraitsV3,
    RecommendedConcurrency,
};
use zarrs::plugin::{ExtensionName, ZarrVersion};

/// zarrs' zstd codec, wrapped: identical on the host, decoded on the device by the device pipeline.
#[derive(Debug)]
pub struct DeviceZstdCodec {
    host: Arc<dyn BytesToBytesCodecTraits>,
}

impl DeviceZstdCodec {
    /// Wrap the host codec zarrs made from the metadata.
    fn wrap(codec: Codec) -> Codec {
        match codec {
            Codec::BytesToBytes(host) => Codec::BytesToBytes(Arc::new(Self { host })),
            other => other,
        }
    }

    /// The host codec it decodes with outside the device pipeline.
    #[must_use]
    pub fn host_codec(&self) -> &Arc<dyn BytesToBytesCodecTraits> {
        &self.host
    }
}

impl ExtensionName for DeviceZstdCodec {
    fn name(&self, version: ZarrVersion) -> Option<Cow<'static, str>> {
        self.host.name(version)
    }
}

impl CodecTraits for DeviceZstdCodec {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn configuration(
        &self,
        version: ZarrVersion,
        options: &CodecMetadataOptions,
    ) -> Option<zarrs::metadata::Configuration> {
        self.host.configuration(version, options)
    }

    fn partial_decoder_capability(&self) -> zarrs::array::codec::api::PartialDecoderCapability {
        self.host.partial_decoder_capability()
    }

    fn partial_encoder_capability(&self) -> zarrs::array::codec::api::PartialEncoderCapability {
        self.host.partial_encoder_capability()
    }
}

impl BytesToBytesCodecTraits for DeviceZstdCodec {
    fn into_dyn(self: Arc<Self>) -> Arc<dyn BytesToBytesCodecTraits> {
        self
    }

    fn recommended_concurrency(&self, decoded: &BytesRepresentation) -> Result<RecommendedConcurrency, CodecError> {
        self.host.recommended_concurrency(decoded)
    }

    fn encoded_representation(&self, decoded: &BytesRepresentation) -> BytesRepresentation {
        self.host.encoded_representation(decoded)
    }

    fn encode<'a>(&self, decoded: ArrayBytesRaw<'a>, options: &CodecOptions) -> Result<ArrayBytesRaw<'a>, CodecError> {
        self.host.encode(decoded, options)
    }

    fn decode<'a>(
        &self,
        encoded: ArrayBytesRaw<'a>,
        decoded: &BytesRepresentation,
        options: &CodecOptions,
    ) -> Result<ArrayBytesRaw<'a>, CodecError> {
        self.host.decode(encoded, decoded, options)
    }

    fn partial_decoder(
        self: Arc<Self>,
        input: Arc<dyn BytesPartialDecoderTraits>,
        decoded: &BytesRepresentation,
        options: &CodecOptions,
    ) -> Result<Arc<dyn BytesPartialDecoderTraits>, CodecError> {
        self.host.clone().partial_decoder(input, decoded, options)
    }

    fn partial_encoder(
        self: Arc<Self>,
        input_output: Arc<dyn BytesPartialEncoderTraits>,
        decoded: &BytesRepresentation,
        options: &CodecOptions,
    ) -> Result<Arc<dyn BytesPartialEncoderTraits>, CodecError> {
        self.host.clone().partial_encoder(input_output, decoded, options)
    }
}

/// The registration held while any GPU mode scope is open in the process.
struct Registration {
    scopes: usize,
    handles: Option<(CodecRuntimeRegistryHandleV3, CodecRuntimeRegistryHandleV2)>,
}

static REGISTRATION: Mutex<Registration> = Mutex::new(Registration { scopes: 0, handles: None });

/// A scope opened: the first one registers the device zstd codec for v3 and v2 metadata.
pub(crate) fn scope_opened() {
    let mut reg = REGISTRATION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    reg.scopes += 1;
    if reg.handles.is_none() {
        let v3 = register_codec_v3(CodecRuntimePluginV3::new(
            |name| name == "zstd",
            |metadata| Ok(DeviceZstdCodec::wrap(<ZstdCodec as CodecTraitsV3>::create(metadata)?)),
        ));
        let v2 = register_codec_v2(CodecRuntimePluginV2::new(
            |name| name == "zstd",
            |metadata| Ok(DeviceZstdCodec::wrap(<ZstdCodec as CodecTraitsV2>::create(metadata)?)),
        ));
        reg.handles = Some((v3, v2));
    }
}

/// A scope closed: the last one unregisters the codec.
pub(crate) fn scope_closed() {
    let mut reg = REGISTRATION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    reg.scopes = reg.scopes.saturating_sub(1);
    if reg.scopes == 0 {
        if let Some((v3, v2)) = reg.handles.take() {
            unregister_codec_v3(&v3);
            unregister_codec_v2(&v2);
        }
    }
}
