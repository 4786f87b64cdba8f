//! zstd's encoder half: what a write takes from the codec's configuration (zarrs' typed one), and
//! frames written on host threads by libzstd, as zarrs writes them. The device's frames are
//! nvCOMP's (`write/encode.rs`), with the content checksum from our XXH64 kernel.

use zarrs::metadata::Configuration;

use crate::codecs::json;
use zarrs::metadata_ext::codec::zstd::{codec_zstd_v2_numcodecs_to_v3, ZstdCodecConfiguration};

/// A zstd write: libzstd's level on host threads (nvCOMP's has none), and whether frames carry
/// their content checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ZstdWrite {
    pub(crate) level: i32,
    pub(crate) checksum: bool,
}

impl ZstdWrite {
    /// The write a `zstd` configuration asks for.
    pub(crate) fn from_configuration(configuration: &Configuration) -> Result<Self, String> {
        let typed: ZstdCodecConfiguration =
            configuration.to_typed().map_err(|e| format!("zstd configuration {}: {e}", json(configuration)))?;
        match codec_zstd_v2_numcodecs_to_v3(&typed) {
            ZstdCodecConfiguration::V1(c) => Ok(Self { level: c.level.into(), checksum: c.checksum }),
            other => Err(format!("zstd configuration {other} is not one this writer knows")),
        }
    }

    /// `raw` as libzstd compresses it at the level (with its content checksum where asked), on
    /// a compression context kept per thread: a new one (`zstd::bulk::compress`) allocates and
    /// faults in its tables, a few MiB at level 3 for 1 MiB chunks, for every chunk (10% of a
    /// tile's encode on two cores here). The same bytes either way.
    pub(crate) fn encode_host(self, raw: &[u8]) -> Result<Vec<u8>, String> {
        type Kept = Option<((i32, bool), zstd::bulk::Compressor<'static>)>;
        thread_local!(static CONTEXT: std::cell::RefCell<Kept> = const { std::cell::RefCell::new(None) });
        let Self { level, checksum } = self;
        let frame = CONTEXT.with(|context| -> std::io::Result<Vec<u8>> {
            let mut context = context.borrow_mut();
            match context.as_mut() {
                Some((kept, compressor)) if *kept != (level, checksum) => {
                    compressor.set_compression_level(level)?;
                    compressor.include_checksum(checksum)?;
                    *kept = (level, checksum);
                }
                Some(_) => {}
                None => {
                    let mut compressor = zstd::bulk::Compressor::new(level)?;
                    compressor.include_checksum(checksum)?;
                    *context = Some(((level, checksum), compressor));
                }
            }
            context.as_mut().expect("made above").1.compress(raw)
        });
        frame.map_err(|e| format!("zstd level {level}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configuration(value: &serde_json::Value) -> Configuration {
        value.as_object().expect("an object").clone().into()
    }

    #[test]
    fn settings_come_from_zarrs_typed_configuration() {
        let write = ZstdWrite::from_configuration(&configuration(&serde_json::json!({"level": 5, "checksum": true})));
        assert_eq!(write, Ok(ZstdWrite { level: 5, checksum: true }));
        // numcodecs' form (no checksum): none.
        let write = ZstdWrite::from_configuration(&configuration(&serde_json::json!({"level": -3})));
        assert_eq!(write, Ok(ZstdWrite { level: -3, checksum: false }));
        // A setting of the wrong kind is an error naming the configuration, not a guess.
        let err = ZstdWrite::from_configuration(&configuration(&serde_json::json!({"level": 3, "checksum": "yes"})));
        assert!(err.unwrap_err().contains("\"yes\""));
        assert!(ZstdWrite::from_configuration(&configuration(&serde_json::json!({"level": 30}))).is_err());
    }

    #[test]
    fn host_frames_on_a_kept_context_are_libzstds_level_after_level() {
        // Levels changing on one thread, sizes and contents changing, checksums switched on and
        // off: each frame as a fresh context writes it, and each decodes to its input.
        let settings = [(3, false), (3, true), (1, true), (1, false), (19, false), (-5, true), (3, false), (0, true)];
        for (k, (level, checksum)) in settings.into_iter().enumerate() {
            let raw: Vec<u8> = (0..(70_000 + k * 9_001)).map(|i| ((i * (k + 5)) % 253 / 7) as u8).collect();
            let frame = ZstdWrite { level, checksum }.encode_host(&raw).unwrap();
            let mut fresh = zstd::bulk::Compressor::new(level).unwrap();
            fresh.include_checksum(checksum).unwrap();
            assert_eq!(frame, fresh.compress(&raw).unwrap(), "level {level}, checksum {checksum}");
            // The Content_Checksum_flag, and libzstd's decode (which verifies the checksum).
            assert_eq!(frame[4] & 4 != 0, checksum, "level {level}, checksum {checksum}");
            assert_eq!(zstd::bulk::decompress(&frame, raw.len()).unwrap(), raw);
        }
        assert!(ZstdWrite { level: 3, checksum: false }.encode_host(&[]).is_ok_and(|f| !f.is_empty()));
    }
}
