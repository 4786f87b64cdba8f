//! What a write encodes on the device: an array's chunk chain (a shard's inner chunks') as the
//! device encodes it, from the read's plan of the same array, or why zarrs encodes it on the host.
//! Each codec also encodes on host threads (small batches, see `encode`), with the library zarrs
//! itself uses for it, so that both give what every Zarr reader decodes.

use std::sync::Arc;

use nvcomp_sys::Compressor;
use zarrs::array::Array;
use zarrs::metadata::Configuration;

use crate::codecs::DeviceCodec;
use crate::pipeline::route::device_plan;
use crate::pipeline::shard::ShardLevel;

/// The chain the device encodes a chunk with: its elements (C order, the platform's byte order)
/// laid out as stored, then a codec, then crc32c; a sharded array's shards then laid out with
/// their index on the host.
#[derive(Clone, Debug)]
pub(crate) struct WriteChain {
    /// How a chunk's stored elements differ from C order in the platform's byte order (None: they
    /// do not).
    pub(crate) layout: Option<Layout>,
    pub(crate) codec: Option<WriteCodec>,
    pub(crate) crc32c: bool,
    /// The sharding levels of a sharded array, outermost first (none for an unsharded one).
    pub(crate) shards: Vec<ShardLevel>,
    /// The codec's device decoder: its host decoder tells which encoded chunks are all fill value.
    pub(crate) decoder: Option<Arc<dyn DeviceCodec>>,
}

/// A stored layout other than C order in the platform's byte order: a transpose (stored as the C
/// order of the chunk transposed by `transpose`), words of `swap` bytes reversed, or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) transpose: Option<Vec<usize>>,
    pub(crate) swap: u64,
}

/// A bytes-to-bytes codec the device encodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WriteCodec {
    /// nvCOMP's zstd (it has no levels; host threads use `level`), with the frame's content
    /// checksum where `checksum` asks (the XXH64 kernel's, added to nvCOMP's frames; libzstd's
    /// own on host threads).
    Zstd {
        level: i32,
        checksum: bool,
    },
    /// A gzip member per chunk (nvCOMP's gzip at the algorithm for `level`).
    Gzip {
        level: u32,
    },
    /// A zlib stream per chunk: nvCOMP's raw deflate with the zlib header and Adler-32 around it.
    Zlib {
        level: u32,
    },
    Blosc(BloscWrite),
}

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
    pub(crate) fn level(&self) -> i32 {
        match *self {
            Self::Zstd { level, .. } => level,
            Self::Gzip { level } | Self::Zlib { level } => level as i32,
            Self::Blosc(b) => i32::from(b.clevel),
        }
    }

    /// nvCOMP's compressor of the codec (None: Blosc at level 0, stored memcpyed).
    pub(crate) fn nvcomp(&self) -> Option<Compressor> {
        match *self {
            Self::Zstd { .. } => Some(Compressor::Zstd),
            Self::Gzip { level } => Some(Compressor::Gzip { algorithm: deflate_algorithm(level) }),
            Self::Zlib { level } => Some(Compressor::Deflate { algorithm: deflate_algorithm(level) }),
            Self::Blosc(b) if b.clevel == 0 => None,
            Self::Blosc(b) => Some(match b.compressor {
                BloscCompressor::Lz4 => Compressor::Lz4,
                BloscCompressor::Zstd => Compressor::Zstd,
            }),
        }
    }

    /// `raw` encoded on the host, by the library zarrs uses (libzstd, zlib-rs through flate2,
    /// c-blosc), at the codec's level.
    pub(crate) fn encode_host(&self, raw: &[u8]) -> Result<Vec<u8>, String> {
        use std::io::Write;
        match *self {
            Self::Zstd { level, checksum } => {
                zstd_encode(raw, level, checksum).map_err(|e| format!("zstd level {level}: {e}"))
            }
            Self::Gzip { level } => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
                e.write_all(raw).and_then(|()| e.finish()).map_err(|e| format!("gzip level {level}: {e}"))
            }
            Self::Zlib { level } => {
                let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(level));
                e.write_all(raw).and_then(|()| e.finish()).map_err(|e| format!("zlib level {level}: {e}"))
            }
            Self::Blosc(b) => b.encode_host(raw),
        }
    }
}

/// `raw` as libzstd compresses it at `level` (with its content checksum where `checksum` asks),
/// on a compression context kept per thread: a new one (`zstd::bulk::compress`) allocates and
/// faults in its tables, a few MiB at level 3 for 1 MiB chunks, for every chunk (10% of a tile's
/// encode on two cores here). The same bytes either way.
fn zstd_encode(raw: &[u8], level: i32, checksum: bool) -> std::io::Result<Vec<u8>> {
    type Kept = Option<((i32, bool), zstd::bulk::Compressor<'static>)>;
    thread_local!(static CONTEXT: std::cell::RefCell<Kept> = const { std::cell::RefCell::new(None) });
    CONTEXT.with(|context| {
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
    })
}

impl BloscWrite {
    /// c-blosc's name of the compressor.
    fn cname(self) -> &'static std::ffi::CStr {
        match self.compressor {
            BloscCompressor::Lz4 => c"lz4",
            BloscCompressor::Zstd => c"zstd",
        }
    }

    /// `raw` as c-blosc compresses it (its own block size, one thread).
    fn encode_host(self, raw: &[u8]) -> Result<Vec<u8>, String> {
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
}

/// The chain the device encodes `array`'s chunks with, or why they are encoded on the host:
/// filters (numcodecs' delta), codecs (or settings) without a device encoder.
pub(crate) fn write_chain<S: ?Sized>(array: &Array<S>) -> Result<WriteChain, String> {
    let plan = device_plan(array)?;
    let chain = plan.chain;
    if chain.delta.is_some() {
        return Err("filters (delta) are encoded on the host".into());
    }
    let layout = (chain.transpose.is_some() || chain.swap > 1)
        .then(|| Layout { transpose: chain.transpose.clone(), swap: chain.swap });
    let codec = match &chain.compression {
        None => None,
        Some(codec) => {
            let configuration = chain.configuration.clone().unwrap_or_default();
            let elem = array.data_type().fixed_size().unwrap_or(1);
            Some(write_codec(codec.name(), &configuration, elem)?)
        }
    };
    Ok(WriteChain { layout, codec, crc32c: chain.crc32c, shards: plan.shards, decoder: chain.compression })
}

/// The device encoder of codec `name` with its v3 `configuration` (elements of `elem` bytes).
fn write_codec(name: &str, configuration: &Configuration, elem: usize) -> Result<WriteCodec, String> {
    let int = |key: &str| configuration.get(key).and_then(serde_json::Value::as_i64);
    let level = |default: i64, range: std::ops::RangeInclusive<i64>| -> Result<i64, String> {
        let level = int("level").unwrap_or(default);
        if range.contains(&level) {
            Ok(level)
        } else {
            Err(format!("{name} level {level} is out of range"))
        }
    };
    match name {
        "zstd" => {
            let checksum = match configuration.get("checksum") {
                None => false,
                Some(value) => value.as_bool().ok_or_else(|| format!("zstd checksum {value} is not a boolean"))?,
            };
            Ok(WriteCodec::Zstd { level: level(0, -131_072..=22)? as i32, checksum })
        }
        // Level 0 stores deflate blocks uncompressed, which nvCOMP does not write.
        // The zlib device codec's name is "zlib" (numcodecs.zlib in v3 metadata).
        "gzip" | "zlib" | "numcodecs.zlib" if int("level") == Some(0) => {
            Err(format!("{name} level 0 is encoded on the host"))
        }
        "gzip" => Ok(WriteCodec::Gzip { level: level(6, 1..=9)? as u32 }),
        "zlib" | "numcodecs.zlib" => Ok(WriteCodec::Zlib { level: level(6, 1..=9)? as u32 }),
        "blosc" => blosc_write(configuration, elem).map(WriteCodec::Blosc),
        other => Err(format!("{other} is encoded on the host (no device encoder for it yet)")),
    }
}

/// A Blosc configuration (zarrs' v3 form: `cname`, `clevel`, `shuffle`, `typesize`,
/// `blocksize`) as the device writes it.
fn blosc_write(configuration: &Configuration, elem: usize) -> Result<BloscWrite, String> {
    let text = |key: &str| configuration.get(key).and_then(serde_json::Value::as_str);
    let int = |key: &str| configuration.get(key).and_then(serde_json::Value::as_u64);
    let compressor = match text("cname") {
        Some("lz4") => BloscCompressor::Lz4,
        Some("zstd") => BloscCompressor::Zstd,
        other => return Err(format!("Blosc with {} is encoded on the host", other.unwrap_or("(no cname)"))),
    };
    let clevel = int("clevel").unwrap_or(5);
    let clevel =
        u8::try_from(clevel).ok().filter(|&c| c <= 9).ok_or(format!("Blosc clevel {clevel} is out of range"))?;
    let shuffle = match text("shuffle") {
        None | Some("noshuffle") => BloscShuffle::None,
        Some("shuffle") => BloscShuffle::Byte,
        Some("bitshuffle") => BloscShuffle::Bit,
        Some(other) => return Err(format!("Blosc shuffle {other} is not known")),
    };
    // c-blosc takes typesizes up to 255 (larger ones shuffle as bytes).
    let typesize = int("typesize").unwrap_or(elem as u64);
    let typesize = u8::try_from(typesize).unwrap_or(1).max(1);
    // One block per chunk is what the device writes; a block size set smaller is c-blosc's.
    if int("blocksize").is_some_and(|b| b != 0) {
        return Err("Blosc with a set block size is encoded on the host".into());
    }
    Ok(BloscWrite { compressor, clevel, shuffle, typesize })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zarrs::array::{data_type, ArrayBuilder, FillValue};

    #[test]
    fn write_chains_take_codec_settings_from_the_codecs_inner_ones_too() {
        use zarrs::array::codec::{Crc32cCodec, GzipCodec, ShardingCodecBuilder, ZstdCodec};
        let store = Arc::new(zarrs::storage::store::MemoryStore::new());
        let zstd = |level, checksum| -> Arc<dyn zarrs::array::BytesToBytesCodecTraits> {
            Arc::new(ZstdCodec::new(level, checksum))
        };
        let plain = |codecs| {
            ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::float32(), FillValue::from(0.0f32))
                .bytes_to_bytes_codecs(codecs)
                .build(store.clone(), "/a")
                .unwrap()
        };
        let chain = write_chain(&plain(vec![zstd(5, false), Arc::new(Crc32cCodec::new())])).unwrap();
        assert_eq!(
            (chain.codec, chain.crc32c, chain.shards.is_empty()),
            (Some(WriteCodec::Zstd { level: 5, checksum: false }), true, true)
        );
        let chain = write_chain(&plain(vec![zstd(3, true)])).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Zstd { level: 3, checksum: true }));
        let chain = write_chain(&plain(vec![Arc::new(GzipCodec::new(7).unwrap())])).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Gzip { level: 7 }));
        assert_eq!(chain.codec.unwrap().nvcomp(), Some(Compressor::Gzip { algorithm: 4 }));
        let zlib = zarrs::array::codec::ZlibCodec::new(3u32.try_into().unwrap());
        let chain = write_chain(&plain(vec![Arc::new(zlib)])).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Zlib { level: 3 }));
        let sharded = |checksum| {
            let a2b = ShardingCodecBuilder::new(vec![std::num::NonZeroU64::new(2).unwrap(); 2], &data_type::float32())
                .bytes_to_bytes_codecs(vec![zstd(7, checksum)])
                .build_arc();
            ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::float32(), FillValue::from(0.0f32))
                .array_to_bytes_codec(a2b)
                .build(store.clone(), "/s")
                .unwrap()
        };
        let chain = write_chain(&sharded(false)).unwrap();
        assert_eq!((chain.codec, chain.shards.len()), (Some(WriteCodec::Zstd { level: 7, checksum: false }), 1));
        // The inner chunks' checksum counts (the outer chain has no zstd of its own).
        let chain = write_chain(&sharded(true)).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Zstd { level: 7, checksum: true }));
        // A checksum setting that is not a boolean is an error naming it, not a guess.
        let odd = serde_json::json!({"level": 3, "checksum": "yes"}).as_object().unwrap().clone().into();
        assert!(write_codec("zstd", &odd, 4).unwrap_err().contains("checksum \"yes\""));
    }

    #[test]
    fn blosc_configurations_map_to_the_device_writer_or_the_host() {
        let conf = |v: serde_json::Value| -> Configuration { v.as_object().unwrap().clone().into() };
        let b = blosc_write(
            &conf(serde_json::json!({"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": 4})),
            4,
        );
        assert_eq!(
            b,
            Ok(BloscWrite { compressor: BloscCompressor::Lz4, clevel: 5, shuffle: BloscShuffle::Bit, typesize: 4 })
        );
        let b = blosc_write(&conf(serde_json::json!({"cname": "zstd", "clevel": 3, "shuffle": "shuffle"})), 8).unwrap();
        assert_eq!((b.compressor, b.shuffle, b.typesize), (BloscCompressor::Zstd, BloscShuffle::Byte, 8));
        assert!(blosc_write(&conf(serde_json::json!({"cname": "blosclz", "clevel": 5})), 4).is_err());
        assert!(blosc_write(&conf(serde_json::json!({"cname": "lz4", "clevel": 5, "blocksize": 4096})), 4).is_err());
        assert!(blosc_write(&conf(serde_json::json!({"cname": "lz4", "clevel": 12})), 4).is_err());
        // Level 0: nothing to compress (memcpyed chunks).
        let zero = blosc_write(&conf(serde_json::json!({"cname": "lz4", "clevel": 0})), 4).unwrap();
        assert_eq!(WriteCodec::Blosc(zero).nvcomp(), None);
    }

    #[test]
    fn host_zstd_on_a_kept_context_writes_libzstds_frames_level_after_level() {
        // Levels changing on one thread, sizes and contents changing: each frame as a fresh
        // context writes it, and each decodes to its input.
        // Checksums switched on and off between frames too.
        let settings = [(3, false), (3, true), (1, true), (1, false), (19, false), (-5, true), (3, false), (0, true)];
        for (k, (level, checksum)) in settings.into_iter().enumerate() {
            let raw: Vec<u8> = (0..(70_000 + k * 9_001)).map(|i| ((i * (k + 5)) % 253 / 7) as u8).collect();
            let frame = WriteCodec::Zstd { level, checksum }.encode_host(&raw).unwrap();
            let mut fresh = zstd::bulk::Compressor::new(level).unwrap();
            fresh.include_checksum(checksum).unwrap();
            assert_eq!(frame, fresh.compress(&raw).unwrap(), "level {level}, checksum {checksum}");
            // The Content_Checksum_flag, and libzstd's decode (which verifies the checksum).
            assert_eq!(frame[4] & 4 != 0, checksum, "level {level}, checksum {checksum}");
            assert_eq!(zstd::bulk::decompress(&frame, raw.len()).unwrap(), raw);
        }
        assert!(WriteCodec::Zstd { level: 3, checksum: false }.encode_host(&[]).is_ok_and(|f| !f.is_empty()));
    }
}
