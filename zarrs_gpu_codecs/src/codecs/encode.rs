//! The device writes of the families that have an encoder half (zstd, gzip, zlib, Blosc), as one
//! type the write pipeline matches on: each family's settings, parsed by the family from zarrs'
//! typed configuration (`DeviceCodecPlugin::encoder`), with nvCOMP's compressor and the host
//! writer of each.

use nvcomp_sys::Compressor;

use super::blosc::encode::{BloscCompressor, BloscWrite};
use super::gzip::encode::GzipWrite;
use super::zlib::encode::ZlibWrite;
use super::zstd::encode::ZstdWrite;

/// A bytes-to-bytes codec the device encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteCodec {
    /// nvCOMP's zstd (it has no levels; host threads use the level), with the frame's content
    /// checksum where asked (the XXH64 kernel's, added to nvCOMP's frames; libzstd's own on host
    /// threads).
    Zstd(ZstdWrite),
    /// A gzip member per chunk (nvCOMP's gzip at the algorithm for the level).
    Gzip(GzipWrite),
    /// A zlib stream per chunk: nvCOMP's raw deflate with the zlib header and Adler-32 around it.
    Zlib(ZlibWrite),
    Blosc(BloscWrite),
}

/// nvCOMP's deflate algorithm for a zlib or gzip level: 1 (fast, a poor ratio) for levels 1 and
/// 2, 2 (about zlib level 1's ratio) for 3 to 5, 4 (about zlib level 6's) from 6 on.
pub(crate) fn deflate_algorithm(level: u32) -> i32 {
    match level {
        0..=2 => 1,
        3..=5 => 2,
        _ => 4,
    }
}

impl WriteCodec {
    /// The level the codec asks for (zstd's, gzip's or zlib's level; Blosc's clevel).
    pub(crate) fn level(self) -> i32 {
        match self {
            Self::Zstd(z) => z.level,
            Self::Gzip(GzipWrite { level }) | Self::Zlib(ZlibWrite { level }) => level as i32,
            Self::Blosc(b) => i32::from(b.clevel),
        }
    }

    /// nvCOMP's compressor of the codec (None: Blosc at level 0, stored memcpyed).
    pub(crate) fn nvcomp(self) -> Option<Compressor> {
        match self {
            Self::Zstd(_) => Some(Compressor::Zstd),
            Self::Gzip(GzipWrite { level }) => Some(Compressor::Gzip { algorithm: deflate_algorithm(level) }),
            Self::Zlib(ZlibWrite { level }) => Some(Compressor::Deflate { algorithm: deflate_algorithm(level) }),
            Self::Blosc(b) if b.clevel == 0 => None,
            Self::Blosc(b) => Some(match b.compressor {
                BloscCompressor::Lz4 => Compressor::Lz4,
                BloscCompressor::Zstd => Compressor::Zstd,
            }),
        }
    }

    /// `raw` encoded on the host, by the library zarrs uses (libzstd, zlib-rs through flate2,
    /// c-blosc), at the codec's level.
    pub(crate) fn encode_host(self, raw: &[u8]) -> Result<Vec<u8>, String> {
        match self {
            Self::Zstd(z) => z.encode_host(raw),
            Self::Gzip(g) => g.encode_host(raw),
            Self::Zlib(z) => z.encode_host(raw),
            Self::Blosc(b) => b.encode_host(raw),
        }
    }
}
