//! zlib's encoder half: the level a write takes from the codec's configuration (zarrs' typed
//! one), streams written on host threads by zlib-rs through flate2 (as zarrs writes them), and the
//! stream header the device's writes put before nvCOMP's raw deflate (its Adler-32 after).

use std::io::Write;

use zarrs::metadata::Configuration;
use zarrs::metadata_ext::codec::zlib::ZlibCodecConfiguration;

use crate::codecs::json;

/// A zlib write at `level` (1 to 9; level 0, stored blocks, nvCOMP does not write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ZlibWrite {
    pub(crate) level: u32,
}

impl ZlibWrite {
    /// The write a `numcodecs.zlib` configuration asks for, or why the host writes it.
    pub(crate) fn from_configuration(configuration: &Configuration) -> Result<Self, String> {
        let typed: ZlibCodecConfiguration =
            configuration.to_typed().map_err(|e| format!("zlib configuration {}: {e}", json(configuration)))?;
        let level = match typed {
            ZlibCodecConfiguration::V1(c) => c.level.as_u32(),
            other => return Err(format!("zlib configuration {other} is not one this writer knows")),
        };
        if level == 0 {
            return Err("zlib level 0 is encoded on the host".into());
        }
        Ok(Self { level })
    }

    /// `raw` as one zlib stream at the level.
    pub(crate) fn encode_host(self, raw: &[u8]) -> Result<Vec<u8>, String> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(self.level));
        e.write_all(raw).and_then(|()| e.finish()).map_err(|e| format!("zlib level {}: {e}", self.level))
    }

    /// The stream header (RFC 1950) for the level: deflate with a 32 KiB window, the level's
    /// FLEVEL, and the check bits.
    pub(crate) fn header(self) -> [u8; 2] {
        const CMF: u8 = 0x78;
        let flevel: u8 = match self.level {
            0 | 1 => 0,
            2..=5 => 1,
            6 => 2,
            _ => 3,
        };
        let flg = flevel << 6;
        let check = (31 - (u16::from(CMF) << 8 | u16::from(flg)) % 31) % 31;
        [CMF, flg | check as u8]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_headers_and_host_streams() {
        let conf = |v: serde_json::Value| -> Configuration { v.as_object().unwrap().clone().into() };
        assert_eq!(ZlibWrite::from_configuration(&conf(serde_json::json!({"level": 3}))), Ok(ZlibWrite { level: 3 }));
        assert!(ZlibWrite::from_configuration(&conf(serde_json::json!({"level": 0}))).unwrap_err().contains("host"));
        let raw: Vec<u8> = (0..40_000u32).map(|i| (i % 241 / 5) as u8).collect();
        for level in 1..=9 {
            let write = ZlibWrite { level };
            let stream = write.encode_host(&raw).unwrap();
            // flate2 writes the same header as ours: the device's streams read as the host's.
            assert_eq!(stream[..2], write.header(), "level {level}");
            assert_eq!((u16::from(stream[0]) << 8 | u16::from(stream[1])) % 31, 0);
        }
    }
}
