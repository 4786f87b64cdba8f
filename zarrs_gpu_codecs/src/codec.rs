//! GPU mode's codecs: inside `with_gpu_config`, the codecs zarrs builds for every name a
//! [`DeviceCodecPlugin`](crate::DeviceCodecPlugin) registers with host codecs (`zstd`, `gzip`)
//! are [`GpuModeCodec`]s: zarrs' own codec on the host (same metadata, same decoding through the
//! ordinary zarrs API) that carries its device implementation, which the device pipeline takes
//! from the array's codec chain.

use std::any::Any;
use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use zarrs::array::codec::api::{
    register_codec_v2, register_codec_v3, unregister_codec_v2, unregister_codec_v3, CodecRuntimePluginV2,
    CodecRuntimePluginV3, CodecRuntimeRegistryHandleV2, CodecRuntimeRegistryHandleV3,
};
use zarrs::array::{
    ArrayBytesRaw, BytesPartialDecoderTraits, BytesPartialEncoderTraits, BytesRepresentation, BytesToBytesCodecTraits,
    Codec, CodecError, CodecMetadataOptions, CodecOptions, CodecTraits, RecommendedConcurrency,
};
use zarrs::plugin::{ExtensionName, PluginCreateError, ZarrVersion};

use crate::device_codec::{self, DeviceCodec, DeviceCodecPlugin};

/// A zarrs bytes-to-bytes codec with its device implementation: identical on the host, decoded
/// on the device by the device pipeline.
#[derive(Debug)]
pub struct GpuModeCodec {
    host: Arc<dyn BytesToBytesCodecTraits>,
    device: Arc<dyn DeviceCodec>,
}

impl GpuModeCodec {
    /// Wrap the host codec zarrs made from the metadata, with the plugin's device codec for its
    /// configuration (a configuration without one stays zarrs' codec).
    fn wrap(codec: Codec, plugin: &DeviceCodecPlugin) -> Codec {
        match codec {
            Codec::BytesToBytes(host) => {
                let configuration = host.configuration_v3(&CodecMetadataOptions::default()).unwrap_or_default();
                match plugin.create(&configuration) {
                    Ok(device) => Codec::BytesToBytes(Arc::new(Self { host, device })),
                    Err(_) => Codec::BytesToBytes(host),
                }
            }
            other => other,
        }
    }

    /// The host codec it decodes with outside the device pipeline.
    #[must_use]
    pub fn host_codec(&self) -> &Arc<dyn BytesToBytesCodecTraits> {
        &self.host
    }

    /// Its device implementation.
    #[must_use]
    pub fn device(&self) -> &Arc<dyn DeviceCodec> {
        &self.device
    }
}

impl ExtensionName for GpuModeCodec {
    fn name(&self, version: ZarrVersion) -> Option<Cow<'static, str>> {
        self.host.name(version)
    }
}

impl CodecTraits for GpuModeCodec {
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

impl BytesToBytesCodecTraits for GpuModeCodec {
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

/// The registrations held while any GPU mode scope is open in the process.
struct Registration {
    scopes: usize,
    handles: Vec<(CodecRuntimeRegistryHandleV3, CodecRuntimeRegistryHandleV2)>,
}

static REGISTRATION: Mutex<Registration> = Mutex::new(Registration { scopes: 0, handles: Vec::new() });

/// A scope opened: the first one registers, for v3 and v2 metadata, a [`GpuModeCodec`] for every
/// device codec plugin that names its host codecs.
pub(crate) fn scope_opened() {
    let mut reg = REGISTRATION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    reg.scopes += 1;
    if reg.scopes > 1 {
        return;
    }
    for plugin in inventory::iter::<DeviceCodecPlugin> {
        let Some((host_v3, host_v2)) = plugin.host() else { continue };
        // A name registered twice is left to zarrs (its device codec is ambiguous).
        if device_codec::plugin(plugin.name()).is_err() {
            continue;
        }
        let name = plugin.name();
        let v3 = register_codec_v3(CodecRuntimePluginV3::new(
            move |n| n == name,
            move |metadata| -> Result<Codec, PluginCreateError> { Ok(GpuModeCodec::wrap(host_v3(metadata)?, plugin)) },
        ));
        let v2 = register_codec_v2(CodecRuntimePluginV2::new(
            move |n| n == name,
            move |metadata| -> Result<Codec, PluginCreateError> { Ok(GpuModeCodec::wrap(host_v2(metadata)?, plugin)) },
        ));
        reg.handles.push((v3, v2));
    }
}

/// A scope closed: the last one unregisters the codecs.
pub(crate) fn scope_closed() {
    let mut reg = REGISTRATION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    reg.scopes = reg.scopes.saturating_sub(1);
    if reg.scopes == 0 {
        for (v3, v2) in reg.handles.drain(..) {
            unregister_codec_v3(&v3);
            unregister_codec_v2(&v2);
        }
    }
}

/// The device implementation of one of an array's bytes-to-bytes codecs: carried by the codec
/// object itself (GPU mode's [`GpuModeCodec`]), or made by the plugin
/// registered for its name from its configuration. Err: why there is none.
pub(crate) fn device_codec_of(codec: &dyn BytesToBytesCodecTraits, name: &str) -> Result<Arc<dyn DeviceCodec>, String> {
    if let Some(wrapped) = codec.as_any().downcast_ref::<GpuModeCodec>() {
        return Ok(wrapped.device().clone());
    }
    let plugin = device_codec::plugin(name)?
        .ok_or_else(|| format!("bytes-to-bytes codec {name} has no device implementation yet"))?;
    let configuration = codec.configuration_v3(&CodecMetadataOptions::default()).unwrap_or_default();
    plugin.create(&configuration).map_err(|e| format!("{name}: {e}"))
}
