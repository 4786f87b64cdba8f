//! Blosc's encoder half: what a write takes from the codec's configuration (zarrs' typed one),
//! chunks written on host threads by c-blosc (as zarrs writes them), and the Blosc1 framing of
//! the one-block chunks the device writes (`write/encode.rs` shuffles on the device and
//! compresses the block's one stream with nvCOMP).

use zarrs::metadata::{Configuration, DataTypeSize};
use zarrs::metadata_ext::codec::blosc::{
    codec_blosc_v2_numcodecs_to_v3, BloscCodecConfiguration, BloscCompressor as Cname, BloscShuffleMode,
};

use super::header::{COMPRESSOR_VERSION, DOBITSHUFFLE, DONT_SPLIT, DOSHUFFLE, FORMAT_VERSION, HEADER_LEN, MEMCPYED};
use crate::codecs::json;

/// A Blosc1 chunk as the device writes it: one block of the whole chunk, its one stream
/// (`BLOSC_DONT_SPLIT`) compressed by nvCOMP after the shuffle; a chunk that does not shrink is
/// stored memcpyed, as c-blosc does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BloscWrite {
    pub(crate) compressor: BloscCompressor,
    pub(crate) clevel: u8,
    pub(crate) shuffle: BloscShuffle,
    pub(crate) typesize: u8,
}

/// The compressors whose streams the device writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BloscCompressor {
    Lz4,
    Zstd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BloscShuffle {
    None,
    Byte,
    Bit,
}

/// Bytes of a one-block frame's head: the header, its block start and its stream's length.
pub(crate) const FRAME_HEAD: usize = HEADER_LEN + 8;

impl BloscWrite {
    /// The write a `blosc` configuration asks for (elements of `elem` bytes), or why the host
    /// writes it: compressors other than lz4 and zstd, a block size set.
    pub(crate) fn from_configuration(configuration: &Configuration, elem: usize) -> Result<Self, String> {
        let typed: BloscCodecConfiguration =
            configuration.to_typed().map_err(|e| format!("blosc configuration {}: {e}", json(configuration)))?;
        let c = match typed {
            BloscCodecConfiguration::V1(c) => c,
            BloscCodecConfiguration::Numcodecs(n) => {
                match codec_blosc_v2_numcodecs_to_v3(&n, Some(DataTypeSize::Fixed(elem))) {
                    BloscCodecConfiguration::V1(c) => c,
                    other => return Err(format!("blosc configuration {other} is not one this writer knows")),
                }
            }
            other => return Err(format!("blosc configuration {other} is not one this writer knows")),
        };
        let compressor = match c.cname {
            Cname::LZ4 => BloscCompressor::Lz4,
            Cname::Zstd => BloscCompressor::Zstd,
            other => return Err(format!("Blosc with {} is encoded on the host", cname_text(other))),
        };
        let shuffle = match c.shuffle {
            BloscShuffleMode::NoShuffle => BloscShuffle::None,
            BloscShuffleMode::Shuffle => BloscShuffle::Byte,
            BloscShuffleMode::BitShuffle => BloscShuffle::Bit,
        };
        // c-blosc takes typesizes up to 255 (larger ones shuffle as bytes).
        let typesize = u8::try_from(c.typesize.unwrap_or(elem)).unwrap_or(1).max(1);
        // One block per chunk is what the device writes; a block size set smaller is c-blosc's.
        if c.blocksize != 0 {
            return Err("Blosc with a set block size is encoded on the host".into());
        }
        Ok(Self { compressor, clevel: c.clevel.into(), shuffle, typesize })
    }

    /// c-blosc's name of the compressor.
    fn cname(self) -> &'static std::ffi::CStr {
        match self.compressor {
            BloscCompressor::Lz4 => c"lz4",
            BloscCompressor::Zstd => c"zstd",
        }
    }

    /// `raw` as c-blosc compresses it (its own block size, one thread).
    pub(crate) fn encode_host(self, raw: &[u8]) -> Result<Vec<u8>, String> {
        let shuffle = match self.shuffle {
            BloscShuffle::None => 0,
            BloscShuffle::Byte => 1,
            BloscShuffle::Bit => 2,
        };
        let mut out = vec![0u8; raw.len() + blosc_src::BLOSC_MAX_OVERHEAD as usize];
        // SAFETY: c-blosc reads `raw.len()` bytes of `raw` and writes at most `out.len()` into
        // `out`; the compressor name is a NUL-terminated string.
        let n = unsafe {
            blosc_src::blosc_compress_ctx(
                i32::from(self.clevel),
                shuffle,
                usize::from(self.typesize),
                raw.len(),
                raw.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                out.len(),
                self.cname().as_ptr(),
                0,
                1,
            )
        };
        let n = usize::try_from(n).ok().filter(|&n| n > 0).ok_or_else(|| format!("c-blosc failed ({n})"))?;
        out.truncate(n);
        Ok(out)
    }

    /// The shuffle a chunk of `len` bytes gets: byte shuffle for typesizes above 1, bit shuffle
    /// where the chunk holds a multiple of 8 elements (c-blosc 1.x leaves other blocks as they
    /// are when it decodes: the flag is then not set at all).
    pub(crate) fn shuffle_for(self, len: u64) -> BloscShuffle {
        let typesize = u64::from(self.typesize);
        match self.shuffle {
            BloscShuffle::Byte if typesize > 1 => BloscShuffle::Byte,
            BloscShuffle::Bit if len / typesize > 0 && (len / typesize).is_multiple_of(8) => BloscShuffle::Bit,
            _ => BloscShuffle::None,
        }
    }

    /// The 16-byte Blosc1 header of a chunk of `nbytes` bytes in one block, `cbytes` in all.
    pub(crate) fn header(self, flags: u8, nbytes: u32, cbytes: u32) -> [u8; HEADER_LEN] {
        let format = match self.compressor {
            BloscCompressor::Lz4 => 1u8,
            BloscCompressor::Zstd => 4u8,
        };
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&[FORMAT_VERSION, COMPRESSOR_VERSION, flags | DONT_SPLIT | format << 5, self.typesize]);
        h[4..8].copy_from_slice(&nbytes.to_le_bytes());
        h[8..12].copy_from_slice(&nbytes.to_le_bytes());
        h[12..16].copy_from_slice(&cbytes.to_le_bytes());
        h
    }

    /// What precedes a one-block chunk's compressed stream of `size` bytes (`nbytes` raw,
    /// shuffled by `shuffle`): the header, the block's start (after the header and the one
    /// start), the stream's length.
    pub(crate) fn frame_head(self, shuffle: BloscShuffle, nbytes: u32, size: u32) -> [u8; FRAME_HEAD] {
        let flags = match shuffle {
            BloscShuffle::Byte => DOSHUFFLE,
            BloscShuffle::Bit => DOBITSHUFFLE,
            BloscShuffle::None => 0,
        };
        let mut head = [0u8; FRAME_HEAD];
        head[..HEADER_LEN].copy_from_slice(&self.header(flags, nbytes, FRAME_HEAD as u32 + size));
        head[16..20].copy_from_slice(&(HEADER_LEN as u32 + 4).to_le_bytes());
        head[20..24].copy_from_slice(&size.to_le_bytes());
        head
    }
}

/// Whether a Blosc chunk is stored memcpyed (its raw bytes after the header).
pub(crate) fn is_memcpyed(frame: &[u8]) -> bool {
    frame.len() >= HEADER_LEN && frame[2] & MEMCPYED != 0
}

/// c-blosc's name of a compressor of zarrs' configuration.
fn cname_text(cname: Cname) -> String {
    serde_json::to_value(cname)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{cname:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(v: &serde_json::Value) -> Configuration {
        v.as_object().unwrap().clone().into()
    }

    #[test]
    fn configurations_map_to_the_device_writer_or_the_host() {
        let b = BloscWrite::from_configuration(
            &conf(
                &serde_json::json!({"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 4, "blocksize": 0}),
            ),
            4,
        );
        assert_eq!(
            b,
            Ok(BloscWrite { compressor: BloscCompressor::Lz4, clevel: 5, shuffle: BloscShuffle::Bit, typesize: 4 })
        );
        let b = BloscWrite::from_configuration(
            &conf(&serde_json::json!({"cname": "zstd", "clevel": 3, "shuffle": "shuffle", "blocksize": 0})),
            8,
        )
        .unwrap();
        assert_eq!((b.compressor, b.shuffle, b.typesize), (BloscCompressor::Zstd, BloscShuffle::Byte, 8));
        // numcodecs' form: its shuffle a number, the typesize the element's.
        let b =
            BloscWrite::from_configuration(&conf(&serde_json::json!({"cname": "lz4", "clevel": 1, "shuffle": 2})), 2)
                .unwrap();
        assert_eq!((b.shuffle, b.typesize, b.clevel), (BloscShuffle::Bit, 2, 1));
        let host = |v: serde_json::Value| BloscWrite::from_configuration(&conf(&v), 4).unwrap_err();
        assert!(host(serde_json::json!({"cname": "blosclz", "clevel": 5, "blocksize": 0})).contains("blosclz"));
        assert!(host(serde_json::json!({"cname": "lz4", "clevel": 5, "blocksize": 4096})).contains("block size"));
        assert!(host(serde_json::json!({"cname": "lz4", "clevel": 12, "blocksize": 0})).contains("blosc configuration"));
    }

    #[test]
    fn one_block_frames_are_what_c_blosc_decodes() {
        let raw: Vec<u8> = (0..4096u32).flat_map(|i| (i / 3).to_le_bytes()).collect();
        for (compressor, shuffle) in
            [(BloscCompressor::Lz4, BloscShuffle::Byte), (BloscCompressor::Zstd, BloscShuffle::None)]
        {
            let write = BloscWrite { compressor, clevel: 5, shuffle, typesize: 4 };
            // The stream of the one block, as nvCOMP would write it, from the shuffled bytes.
            let shuffled: Vec<u8> = match write.shuffle_for(raw.len() as u64) {
                BloscShuffle::Byte => (0..4).flat_map(|b| raw.iter().skip(b).step_by(4).copied()).collect(),
                _ => raw.clone(),
            };
            let stream = match compressor {
                BloscCompressor::Lz4 => lz4_flex::block::compress(&shuffled),
                BloscCompressor::Zstd => zstd::bulk::compress(&shuffled, 3).unwrap(),
            };
            let mut frame =
                write.frame_head(write.shuffle_for(raw.len() as u64), raw.len() as u32, stream.len() as u32).to_vec();
            frame.extend_from_slice(&stream);
            assert!(!is_memcpyed(&frame));
            let mut out = vec![0u8; raw.len()];
            // SAFETY: c-blosc reads the frame's `frame.len()` bytes and writes at most `out.len()`.
            let n = unsafe {
                blosc_src::blosc_decompress_ctx(frame.as_ptr().cast(), out.as_mut_ptr().cast(), out.len(), 1)
            };
            assert_eq!((n, &out), (raw.len() as i32, &raw), "{compressor:?}");
            // And the host writer's chunk decodes too.
            let host = write.encode_host(&raw).unwrap();
            // SAFETY: as above.
            let n =
                unsafe { blosc_src::blosc_decompress_ctx(host.as_ptr().cast(), out.as_mut_ptr().cast(), out.len(), 1) };
            assert_eq!(n, raw.len() as i32);
        }
    }
}
