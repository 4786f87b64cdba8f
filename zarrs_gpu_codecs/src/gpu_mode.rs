//! GPU mode: [`with_gpu_config`] scopes a configuration to the thread that runs a closure
//! ([`gpu_config`] reads it, and `GpuConfig::current` where a read is given none), and GPU
//! mode's codecs: inside a scope, the codecs zarrs builds for every name a
//! [`DeviceCodecPlugin`] registers with host codecs (`zstd`, `gzip`, `numcodecs.zlib`) are
//! [`GpuModeCodec`]s: zarrs' own codec on the host (same metadata, same decoding through the
//! ordinary zarrs API) that carries its device implementation, which the device pipeline takes
//! from the array's codec chain. zarrs' codec registry is process-wide, so the plugins stay
//! registered while any thread has a scope open; they build zarrs' own codec for a thread that
//! has none, which therefore never sees another thread's scope. (zarrs gives v2's `zlib`
//! compressor the id `zlib`, which GPU mode does not register: such arrays keep zarrs' codec, and
//! the pipeline finds the device codec by the v3 name.)

use std::any::Any;
use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock};

use zarrs::array::codec::api::{
    register_codec_v2, register_codec_v3, unregister_codec_v2, unregister_codec_v3, CodecRuntimePluginV2,
    CodecRuntimePluginV3, CodecRuntimeRegistryHandleV2, CodecRuntimeRegistryHandleV3,
};
use zarrs::array::{
    ArrayBytesRaw, BytesPartialDecoderTraits, BytesPartialEncoderTraits, BytesRepresentation, BytesToBytesCodecTraits,
    Codec, CodecError, CodecMetadataOptions, CodecOptions, CodecTraits, RecommendedConcurrency,
};
use zarrs::plugin::{ExtensionName, PluginCreateError, ZarrVersion};

use crate::codecs::{self, DeviceCodec, DeviceCodecPlugin};
use crate::config::GpuConfig;
use crate::error::GpuError;

thread_local! {
    static THREAD_SCOPES: RefCell<Vec<GpuConfig>> = const { RefCell::new(Vec::new()) };
}
/// Ends a scope (also when its closure panics).
struct ScopeGuard;

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        scope_closed();
        THREAD_SCOPES.with(|s| s.borrow_mut().pop());
    }
}

/// Run `f` in GPU mode with `config`: device retrieval on this thread inside uses it, zarrs'
/// generic retrieval into [`DeviceArray`](crate::DeviceArray) places its result on that device,
/// and arrays opened inside get [`GpuModeCodec`]s for "zstd", "gzip" and (v3) "numcodecs.zlib"
/// (zarrs' codecs carrying their device codecs, registered with zarrs as runtime codec plugins
/// while any scope is open). Scopes nest (the inner one wins, the outer one is restored on exit)
/// and end also when `f` panics.
///
/// The scope belongs to this thread: other threads never see it, even while it is open (an
/// array another thread opens meanwhile gets zarrs' own codecs). Work
/// `f` hands to other threads that should run in GPU mode takes the configuration along:
/// `let config = gpu_config(); rayon::spawn(move || with_gpu_config(config.unwrap(), ...))`.
/// (zarrs' retrieval makes its result on the calling thread, so it needs nothing of the kind.)
pub fn with_gpu_config<R>(config: GpuConfig, f: impl FnOnce() -> R) -> R {
    THREAD_SCOPES.with(|s| s.borrow_mut().push(config));
    scope_opened();
    let _guard = ScopeGuard;
    f()
}

/// The GPU mode configuration in force on this thread (its innermost scope), or `None`.
#[must_use]
pub fn gpu_config() -> Option<GpuConfig> {
    THREAD_SCOPES.with(|s| s.borrow().last().cloned())
}

impl GpuConfig {
    /// The configuration reads use where the caller gives none: the innermost GPU mode scope of
    /// this thread, else [`GpuConfig::from_env`] (read once per process).
    ///
    /// # Errors
    /// Returns [`GpuError::Config`] when the environment holds a value that cannot be used.
    pub fn current() -> Result<Self, GpuError> {
        static FROM_ENV: OnceLock<Result<GpuConfig, (&'static str, String, String)>> = OnceLock::new();
        if let Some(config) = gpu_config() {
            return Ok(config);
        }
        FROM_ENV
            .get_or_init(|| {
                Self::from_env().map_err(|e| match e {
                    GpuError::Config { variable, value, expected } => (variable, value, expected),
                    other => ("environment", other.to_string(), String::new()),
                })
            })
            .clone()
            .map_err(|(variable, value, expected)| GpuError::Config { variable, value, expected })
    }
}

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
/// device codec plugin that names its host codecs, made for threads inside a scope only.
pub(crate) fn scope_opened() {
    let mut reg = REGISTRATION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    reg.scopes += 1;
    if reg.scopes > 1 {
        return;
    }
    for plugin in inventory::iter::<DeviceCodecPlugin> {
        let Some((host_v3, host_v2)) = plugin.host() else { continue };
        // A name registered twice is left to zarrs (its device codec is ambiguous).
        if codecs::plugin(plugin.name()).is_err() {
            continue;
        }
        let name = plugin.name();
        let v3 = register_codec_v3(CodecRuntimePluginV3::new(
            move |n| n == name,
            move |metadata| -> Result<Codec, PluginCreateError> { Ok(in_scope(host_v3(metadata)?, plugin)) },
        ));
        let v2 = register_codec_v2(CodecRuntimePluginV2::new(
            move |n| n == name,
            move |metadata| -> Result<Codec, PluginCreateError> { Ok(in_scope(host_v2(metadata)?, plugin)) },
        ));
        reg.handles.push((v3, v2));
    }
}

/// The codec zarrs made, wrapped as a [`GpuModeCodec`] when the thread building it (the one
/// opening the array) is inside a scope; zarrs' own codec otherwise.
fn in_scope(codec: Codec, plugin: &DeviceCodecPlugin) -> Codec {
    if gpu_config().is_some() {
        GpuModeCodec::wrap(codec, plugin)
    } else {
        codec
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
    let plugin =
        codecs::plugin(name)?.ok_or_else(|| format!("bytes-to-bytes codec {name} has no device implementation yet"))?;
    let configuration = codec.configuration_v3(&CodecMetadataOptions::default()).unwrap_or_default();
    plugin.create(&configuration).map_err(|e| format!("{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zarrs_gds_store::IoBackend;

    #[test]
    fn scopes_nest_restore_and_survive_panics() {
        assert_eq!(gpu_config(), None);
        let outer = GpuConfig::default().with_device(1);
        let inner = GpuConfig::default().with_device(2).with_backend(IoBackend::Posix);
        with_gpu_config(outer.clone(), || {
            assert_eq!(gpu_config(), Some(outer.clone()));
            with_gpu_config(inner.clone(), || assert_eq!(gpu_config(), Some(inner.clone())));
            assert_eq!(gpu_config(), Some(outer.clone()));
            let caught = std::panic::catch_unwind(|| with_gpu_config(inner.clone(), || panic!("boom")));
            assert!(caught.is_err());
            assert_eq!(gpu_config(), Some(outer.clone()));
            // Another thread, a rayon worker too, never sees this thread's scope.
            assert_eq!(std::thread::spawn(gpu_config).join().unwrap(), None);
            let seen: Vec<_> = {
                use rayon::prelude::*;
                (0..64).into_par_iter().map(|_| gpu_config()).collect()
            };
            assert!(seen.iter().all(Option::is_none), "a worker saw another thread's scope");
        });
        assert_eq!(gpu_config(), None);
        assert_eq!(std::thread::spawn(gpu_config).join().unwrap(), None);
    }

    #[test]
    fn two_threads_in_different_scopes_at_once_see_their_own() {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(3));
        let threads: Vec<_> = (0..2)
            .map(|device| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let config = GpuConfig::default().with_device(device);
                    with_gpu_config(config.clone(), || {
                        // Both scopes are open here, and the main thread has none.
                        barrier.wait();
                        let seen = gpu_config();
                        barrier.wait();
                        seen == Some(config)
                    })
                })
            })
            .collect();
        barrier.wait();
        assert_eq!(gpu_config(), None, "a thread without a scope sees none while others are open");
        barrier.wait();
        assert!(threads.into_iter().all(|t| t.join().unwrap()));
    }
}
