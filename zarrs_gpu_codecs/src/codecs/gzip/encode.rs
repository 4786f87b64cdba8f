//! gzip's encoder half: the level a write takes from the codec's configuration (zarrs' typed
//! one), and members written on host threads by zlib-rs through flate2, as zarrs writes them. The
//! device's members are nvCOMP's gzip at the algorithm nearest the level.

use std::io::Write;

use zarrs::metadata::Configuration;

use crate::codecs::json;
use zarrs::metadata_ext::codec::gzip::GzipCodecConfiguration;

/// A gzip write at `level` (1 to 9; level 0, stored blocks, nvCOMP does not write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GzipWrite {
    pub(crate) level: u32,
}

impl GzipWrite {
    /// The write a `gzip` configuration asks for, or why the host writes it.
    pub(crate) fn from_configuration(configuration: &Configuration) -> Result<Self, String> {
        let typed: GzipCodecConfiguration =
            configuration.to_typed().map_err(|e| format!("gzip configuration {}: {e}", json(configuration)))?;
        let level = match typed {
            GzipCodecConfiguration::V1(c) => c.level.as_u32(),
            other => return Err(format!("gzip configuration {other} is not one this writer knows")),
        };
        if level == 0 {
            return Err("gzip level 0 is encoded on the host".into());
        }
        Ok(Self { level })
    }

    /// `raw` as one gzip member at the level.
    pub(crate) fn encode_host(self, raw: &[u8]) -> Result<Vec<u8>, String> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(self.level));
        e.write_all(raw).and_then(|()| e.finish()).map_err(|e| format!("gzip level {}: {e}", self.level))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_come_from_the_configuration_and_level_0_stays_on_the_host() {
        let conf = |v: serde_json::Value| -> Configuration { v.as_object().unwrap().clone().into() };
        assert_eq!(GzipWrite::from_configuration(&conf(serde_json::json!({"level": 7}))), Ok(GzipWrite { level: 7 }));
        assert!(GzipWrite::from_configuration(&conf(serde_json::json!({"level": 0}))).unwrap_err().contains("host"));
        assert!(GzipWrite::from_configuration(&conf(serde_json::json!({"level": 12}))).is_err());
        let raw: Vec<u8> = (0..50_000u32).map(|i| (i % 251 / 3) as u8).collect();
        let member = GzipWrite { level: 6 }.encode_host(&raw).unwrap();
        let mut back = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&member[..]), &mut back).unwrap();
        assert_eq!(back, raw);
    }
}
