//! What a write encodes on the device: an array's chunk chain (a shard's inner chunks') as the
//! device encodes it, from the read's plan of the same array, or why zarrs encodes it on the host.
//! Each codec family owns its encoder half (`codecs/<family>/encode.rs`: its settings, from zarrs'
//! typed configuration, and its host writer, the library zarrs itself uses, so that both give
//! what every Zarr reader decodes); this module asks the family.

use std::sync::Arc;

use zarrs::array::Array;

use crate::codecs::encode::WriteCodec;
use crate::codecs::{DeviceCodec, DeviceCodecPlugin};
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
    let elem = array.data_type().fixed_size().unwrap_or(1);
    let codec = match &chain.configuration {
        None => None,
        Some((name, configuration)) => Some(DeviceCodecPlugin::encoder(name, configuration, elem)?),
    };
    Ok(WriteChain { layout, codec, crc32c: chain.crc32c, shards: plan.shards, decoder: chain.compression })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs::gzip::encode::GzipWrite;
    use crate::codecs::zlib::encode::ZlibWrite;
    use crate::codecs::zstd::encode::ZstdWrite;
    use nvcomp_sys::Compressor;
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
            (Some(WriteCodec::Zstd(ZstdWrite { level: 5, checksum: false })), true, true)
        );
        let chain = write_chain(&plain(vec![zstd(3, true)])).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Zstd(ZstdWrite { level: 3, checksum: true })));
        let chain = write_chain(&plain(vec![Arc::new(GzipCodec::new(7).unwrap())])).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Gzip(GzipWrite { level: 7 })));
        assert_eq!(chain.codec.unwrap().nvcomp(), Some(Compressor::Gzip { algorithm: 4 }));
        let zlib = zarrs::array::codec::ZlibCodec::new(3u32.try_into().unwrap());
        let chain = write_chain(&plain(vec![Arc::new(zlib)])).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Zlib(ZlibWrite { level: 3 })));
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
        assert_eq!(
            (chain.codec, chain.shards.len()),
            (Some(WriteCodec::Zstd(ZstdWrite { level: 7, checksum: false })), 1)
        );
        // The inner chunks' checksum counts (the outer chain has no zstd of its own).
        let chain = write_chain(&sharded(true)).unwrap();
        assert_eq!(chain.codec, Some(WriteCodec::Zstd(ZstdWrite { level: 7, checksum: true })));
    }

    /// zarrs' own Blosc codecs (v3 and v2's numcodecs form) give configurations the Blosc family
    /// parses for the device writer; those it cannot write name why.
    #[test]
    fn blosc_codecs_of_zarrs_map_to_the_device_writer() {
        use crate::codecs::blosc::encode::{BloscCompressor as Out, BloscShuffle, BloscWrite};
        use zarrs::array::codec::{BloscCodec, BloscCompressor, BloscShuffleMode};
        let store = Arc::new(zarrs::storage::store::MemoryStore::new());
        let array = |cname, shuffle, typesize| {
            let level = 5u8.try_into().unwrap();
            let blosc = BloscCodec::new(cname, level, None, shuffle, typesize).unwrap();
            ArrayBuilder::new(vec![8, 8], vec![4, 4], data_type::float32(), FillValue::from(0.0f32))
                .bytes_to_bytes_codecs(vec![Arc::new(blosc)])
                .build(store.clone(), "/b")
                .unwrap()
        };
        let chain = write_chain(&array(BloscCompressor::LZ4, BloscShuffleMode::BitShuffle, Some(4))).unwrap();
        let expected = BloscWrite { compressor: Out::Lz4, clevel: 5, shuffle: BloscShuffle::Bit, typesize: 4 };
        assert_eq!(chain.codec, Some(WriteCodec::Blosc(expected)));
        let chain = write_chain(&array(BloscCompressor::Zstd, BloscShuffleMode::NoShuffle, None)).unwrap();
        let Some(WriteCodec::Blosc(b)) = chain.codec else { panic!("{:?}", chain.codec) };
        assert_eq!((b.compressor, b.shuffle, b.typesize), (Out::Zstd, BloscShuffle::None, 4));
        let err = write_chain(&array(BloscCompressor::Snappy, BloscShuffleMode::Shuffle, Some(4))).unwrap_err();
        assert!(err.contains("snappy") && err.contains("host"), "{err}");
    }
}
