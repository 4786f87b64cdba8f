//! What a read takes: which codec chains the device pipeline decodes (`device_plan`, from the
//! array's own codecs; else the host route and why: `host_decode_reason`) and the chunks a subset
//! meets. A write encodes from the same plan (`write::codec`).

use std::borrow::Cow;
use std::sync::Arc;

use zarrs::array::codec::{BytesDataTypeExt, TransposeCodecConfiguration};
use zarrs::array::{Array, ArrayMetadata, ArraySubset, CodecMetadataOptions, DataType, Endianness};
use zarrs::plugin::ExtensionName;

use crate::codecs::delta::{delta_of, DeviceDelta};
use crate::codecs::DeviceCodec;
use crate::config::DecodeTrust;
use crate::error::GpuError;
use crate::gpu_mode::device_codec_of;
use crate::pipeline::place::GATHER_DIMS;
use crate::pipeline::shard::ShardLevel;

/// The codecs of a chunk the device pipeline decodes: an optional transpose or delta, the `bytes`
/// codec in either byte order, then a registered device codec (zstd, gzip, or a plugin's), and crc32c.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeviceChain {
    /// The bytes-to-bytes codec decoded on the device, if any.
    pub(crate) compression: Option<Arc<dyn DeviceCodec>>,
    /// Its registered (v3) name and its v3 configuration as zarrs gives them (for v2 arrays
    /// too): what a write asks the family's encoder for.
    pub(crate) configuration: Option<(String, zarrs::metadata::Configuration)>,
    /// crc32c after everything else (nvCOMP CRC32C).
    pub(crate) crc32c: bool,
    /// Bytes per word to reverse when the stored byte order is not the platform's: the words
    /// zarrs reverses ([`swap_word`]); 0 when nothing is swapped.
    pub(crate) swap: u64,
    /// The transpose codec's order: a chunk is stored as its C-order transpose by this
    /// permutation (v2 order F is the reversal).
    pub(crate) transpose: Option<Vec<usize>>,
    /// numcodecs' delta: each whole decoded chunk's running sum, in staging before placement
    /// (its byte swap, if any, done there first: `swap` is then 0).
    pub(crate) delta: Option<DeviceDelta>,
}

impl DeviceChain {
    /// Chunk bytes are the elements in C order: copied as they are.
    pub(crate) fn is_raw(&self) -> bool {
        !self.is_checked() && !self.needs_gather() && self.delta.is_none()
    }

    /// Stored bytes are checked on the host before the device sees them (a codec or crc32c):
    /// they are read to host memory, not straight to the device.
    pub(crate) fn is_checked(&self) -> bool {
        self.compression.is_some() || self.crc32c
    }

    /// nvCOMP runs: crc32c, or a codec that decodes with it.
    pub(crate) fn needs_nvcomp(&self) -> bool {
        self.crc32c || self.compression.as_ref().is_some_and(|c| c.needs_nvcomp())
    }

    /// Whether the device may decode this chain's chunks under `trust` (checked ones; the rest
    /// decode on host threads): crc32c verifies them before decoding, or the codec's trust rule
    /// allows the rest.
    pub(crate) fn device_may_decode(&self, trust: DecodeTrust) -> bool {
        self.compression.as_ref().is_some_and(|c| c.may_decode(trust, self.crc32c))
    }

    /// Elements are placed one by one (transposed or byte-swapped), not by strided copies.
    pub(crate) fn needs_gather(&self) -> bool {
        self.swap > 1 || self.transpose.is_some()
    }
}

/// How the device reads an array: the sharding levels to open (outermost first, none for
/// unsharded arrays) and the codecs of the innermost chunks.
#[derive(Clone, Debug)]
pub(crate) struct DevicePlan {
    pub(crate) shards: Vec<ShardLevel>,
    pub(crate) chain: DeviceChain,
}

/// The device plan of an array's codecs, or why it decodes on the host.
pub(crate) fn device_plan<S: ?Sized>(array: &Array<S>) -> Result<DevicePlan, String> {
    if let ArrayMetadata::V3(metadata) = array.metadata() {
        if !metadata.storage_transformers.is_empty() {
            return Err("storage transformers are read on the host".into());
        }
    }
    if array.data_type().fixed_size().is_none() {
        return Err(format!("data type {} has no fixed size", array.data_type()));
    }
    let mut shards = Vec::new();
    let mut codecs = array.codecs();
    loop {
        let a2a = codecs.array_to_array_codecs();
        let mut delta = None;
        let transpose = match a2a {
            [] => None,
            [codec] if delta_of(codec.as_ref()).is_some() => {
                delta = delta_of(codec.as_ref()).map(|d| d.device(array.data_type())).transpose()?;
                None
            }
            [codec] if name(codec.as_ref()) == "transpose" => {
                let configuration: TransposeCodecConfiguration = codec
                    .configuration_v3(&CodecMetadataOptions::default())
                    .ok_or("transpose without a configuration")?
                    .to_typed()
                    .map_err(|e| format!("transpose configuration: {e}"))?;
                let TransposeCodecConfiguration::V1(c) = configuration else {
                    return Err("this transpose configuration version is not supported".into());
                };
                // zarrs opens an order of another length than the array's dimensionality (and
                // refuses it when decoding): the gather kernel must never index by it.
                if c.order.0.len() != array.dimensionality() {
                    return Err(format!(
                        "transpose order {:?} does not fit {} dimensions",
                        c.order.0,
                        array.dimensionality()
                    ));
                }
                if c.order.0.len() > GATHER_DIMS {
                    return Err(format!("transposes of more than {GATHER_DIMS} dimensions are done on the host"));
                }
                Some(c.order.0)
            }
            _ => {
                let names: Vec<String> = a2a.iter().map(|c| name(c.as_ref())).collect();
                return Err(format!("array-to-array codecs [{}] have no device implementation yet", names.join(", ")));
            }
        };
        let a2b = codecs.array_to_bytes_codec();
        let names: Vec<String> = codecs.bytes_to_bytes_codecs().iter().map(|c| name(c.as_ref())).collect();
        match name(a2b.as_ref()).as_str() {
            "sharding_indexed" => {
                if !names.is_empty() || transpose.is_some() || delta.is_some() {
                    return Err("codecs over whole shards (before or after sharding) run on the host".into());
                }
                let configuration = a2b
                    .configuration_v3(&CodecMetadataOptions::default())
                    .ok_or("sharding_indexed without a configuration")?
                    .to_typed()
                    .map_err(|e| format!("sharding_indexed configuration: {e}"))?;
                let (level, inner) = ShardLevel::new(&configuration)?;
                shards.push(level);
                codecs = Arc::new(inner);
            }
            "bytes" => {
                let endian = a2b.configuration_v3(&CodecMetadataOptions::default()).and_then(|c| {
                    c.get("endian").and_then(|e| e.as_str()).map(|e| {
                        if e == "big" {
                            Endianness::Big
                        } else {
                            Endianness::Little
                        }
                    })
                });
                let mut swap = swap_word(array.data_type(), endian)?;
                if let Some(delta) = &mut delta {
                    // The sum needs native words: the scan swaps them as it reads.
                    delta.swap = swap > 1;
                    swap = 0;
                }
                if swap > 0 && array.dimensionality() > GATHER_DIMS {
                    return Err(format!("byte swaps of more than {GATHER_DIMS} dimensions are done on the host"));
                }
                let b2b = codecs.bytes_to_bytes_codecs();
                let (codec, crc32c) = match (b2b, names.last().map(String::as_str)) {
                    ([], _) => (None, false),
                    ([_], Some("crc32c")) => (None, true),
                    ([codec], _) => (Some(codec), false),
                    ([codec, _], Some("crc32c")) => (Some(codec), true),
                    _ => {
                        return Err(format!(
                            "bytes-to-bytes codecs [{}] have no device implementation yet",
                            names.join(", ")
                        ))
                    }
                };
                let compression = codec.map(|c| device_codec_of(c.as_ref(), &name(c.as_ref()))).transpose()?;
                let configuration = codec.map(|c| {
                    (name(c.as_ref()), c.configuration_v3(&CodecMetadataOptions::default()).unwrap_or_default())
                });
                let chain = DeviceChain { compression, configuration, crc32c, swap, transpose, delta };
                return Ok(DevicePlan { shards, chain });
            }
            other => return Err(format!("array-to-bytes codec {other} has no device implementation yet")),
        }
    }
}

/// The bytes per word that zarrs' `bytes` codec reverses when decoding `data_type` stored in
/// `endian` order (0: none), learned from zarrs itself by decoding a probe element: complex
/// numbers swap each part, fixed-length UTF-32 each 4-byte code point, raw bits (`r16`...)
/// nothing. A reordering that is not words reversed, or a stored order zarrs refuses, is decoded
/// by zarrs on the host.
pub(crate) fn swap_word(data_type: &DataType, endian: Option<Endianness>) -> Result<u64, String> {
    let size = data_type.fixed_size().ok_or_else(|| format!("data type {data_type} has no fixed size"))?;
    if size > 1 << 16 {
        return Err(format!("elements of {size} bytes ({data_type}) are decoded on the host"));
    }
    let codec = data_type.codec_bytes().map_err(|e| format!("the bytes codec for {data_type}: {e}"))?;
    // Two probes name every byte of an element by its position's low and high byte.
    let low: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let high: Vec<u8> = (0..size).map(|i| (i >> 8) as u8).collect();
    let decode = |probe: Vec<u8>| {
        codec.decode(Cow::Owned(probe), endian).map(Cow::into_owned).map_err(|e| format!("the bytes codec: {e}"))
    };
    let (low, high) = (decode(low)?, decode(high)?);
    if low.len() != size || high.len() != size {
        return Err(format!("the bytes codec changes the size of {data_type} elements"));
    }
    // from[j]: the stored byte that lands at byte j of a decoded element.
    let from: Vec<usize> = low.iter().zip(&high).map(|(&l, &h)| usize::from(l) | usize::from(h) << 8).collect();
    if from.iter().enumerate().all(|(j, &f)| f == j) {
        return Ok(0);
    }
    (2..=size)
        .filter(|w| size % w == 0)
        .find(|&w| from.iter().enumerate().all(|(j, &f)| f == j - j % w + (w - 1 - j % w)))
        .map(|w| w as u64)
        .ok_or_else(|| format!("zarrs' bytes codec reorders {data_type} elements in a way the device does not"))
}

/// The route of a read of `array` under `trust`: its device plan (the decoder of its compression
/// picked for the trust: `DeviceCodec::routed`) and nvCOMP where the plan needs it, or why it
/// decodes on the host (its codecs, or no loadable nvCOMP). Reads and [`host_decode_reason`]
/// both ask this, so that what is reported is what a read does.
pub(crate) fn read_route<S: ?Sized>(
    array: &Array<S>,
    trust: DecodeTrust,
) -> Result<(DevicePlan, Option<&'static nvcomp_sys::NvcompLibrary>), String> {
    let mut plan = device_plan(array)?;
    let chain = &mut plan.chain;
    if let Some(routed) = chain.compression.as_ref().and_then(|c| c.routed(trust, chain.crc32c)) {
        chain.compression = Some(routed);
    }
    if !plan.chain.needs_nvcomp() {
        return Ok((plan, None));
    }
    nvcomp_sys::NvcompLibrary::get().map(|lib| (plan, Some(lib))).map_err(|e| e.to_string())
}

/// Why an array's chunks cannot be read and decoded on the device (its codecs, or nvCOMP not
/// loadable where they need it), or None when they can: the route a read under the current
/// configuration ([`GpuConfig::current`](crate::GpuConfig::current)) takes.
#[must_use]
pub fn host_decode_reason<S: ?Sized>(array: &Array<S>) -> Option<String> {
    let trust = crate::GpuConfig::current().map(|c| c.decode_trust()).unwrap_or_default();
    read_route(array, trust).err()
}

/// A chunk meeting a subset: its grid indices, key and (unbounded) subset.
pub(crate) type ChunkRef = (Vec<u64>, zarrs_storage::StoreKey, ArraySubset);

/// Every chunk meeting `subset` (which lies within the array, or is one whole chunk). Costs what
/// the chunks meeting it cost, never the whole grid.
pub(crate) fn chunks_meeting<S: ?Sized>(array: &Array<S>, subset: &ArraySubset) -> Result<Vec<ChunkRef>, GpuError> {
    let grid = array.chunks_in_array_subset(subset).map_err(|e| GpuError::Array(e.into()))?;
    let Some(grid) = grid else { return Ok(Vec::new()) };
    // zarrs' index iterator multiplies the extents unchecked. Each chunk meeting a subset holds
    // at least one of its elements, so for a subset whose bytes fit this cannot overflow.
    if grid.shape().iter().try_fold(1u64, |acc, &n| acc.checked_mul(n)).is_none() {
        return Err(GpuError::Overflow(format!("the subset meets more than 2^64 chunks ({:?})", grid.shape())));
    }
    grid.indices()
        .into_iter()
        .map(|indices| Ok((indices.to_vec(), array.chunk_key(&indices), chunk_subset(array, &indices)?)))
        .collect()
}

/// The (unbounded) subset of the chunk at `indices` (within the grid), its end checked: zarrs'
/// `chunk_subset` adds unchecked, and the last chunk of a grid may end past 2^64.
pub(crate) fn chunk_subset<S: ?Sized>(array: &Array<S>, indices: &[u64]) -> Result<ArraySubset, GpuError> {
    let origin = array.chunk_origin(indices)?;
    let shape: Vec<u64> = array.chunk_shape(indices)?.iter().map(|n| n.get()).collect();
    if origin.iter().zip(&shape).any(|(&o, &n)| o.checked_add(n).is_none()) {
        return Err(GpuError::Overflow(format!("chunk {indices:?} at {origin:?} of shape {shape:?} ends past 2^64")));
    }
    ArraySubset::new_with_start_shape(origin, shape).map_err(|e| GpuError::Array(e.into()))
}

fn name(codec: &dyn ExtensionName) -> String {
    codec.name_v3().map_or_else(|| "(unnamed)".to_string(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zarrs::array::data_type;

    #[test]
    fn byte_swaps_are_zarrs_words() {
        let other = if cfg!(target_endian = "little") { Endianness::Big } else { Endianness::Little };
        let swap = |data_type: DataType| swap_word(&data_type, Some(other));
        assert_eq!(swap(data_type::float32()), Ok(4));
        assert_eq!(swap(data_type::uint16()), Ok(2));
        assert_eq!(swap(data_type::float64()), Ok(8));
        assert_eq!(swap(data_type::uint8()), Ok(0));
        // A complex number's parts one by one.
        assert_eq!(swap(data_type::complex64()), Ok(4));
        assert_eq!(swap(data_type::complex128()), Ok(8));
        // Raw bits are bytes: zarrs never swaps them.
        for bytes in [2, 4, 8, 3] {
            assert_eq!(swap(data_type::raw_bits(bytes)), Ok(0), "r{}", 8 * bytes);
        }
        // Fixed-length UTF-32: each 4-byte code point, not the whole string.
        let utf32 = data_type::fixed_length_utf32(std::num::NonZeroU64::new(12).unwrap()).unwrap();
        assert_eq!(swap(utf32), Ok(4));
        // The platform's order: nothing to swap; a multi-byte type without an order: zarrs refuses.
        assert_eq!(swap_word(&data_type::float32(), Some(Endianness::native())), Ok(0));
        assert!(swap_word(&data_type::float32(), None).is_err());
        assert_eq!(swap_word(&data_type::uint8(), None), Ok(0));
    }

    #[test]
    fn decode_trust_decides_what_nvcomp_decodes() {
        let zstd =
            crate::codecs::plugin("zstd").unwrap().unwrap().create(&zarrs::metadata::Configuration::default()).unwrap();
        let gzip =
            crate::codecs::plugin("gzip").unwrap().unwrap().create(&zarrs::metadata::Configuration::default()).unwrap();
        let chain = |compression: Option<&Arc<dyn DeviceCodec>>, crc32c| DeviceChain {
            compression: compression.cloned(),
            crc32c,
            ..DeviceChain::default()
        };
        let all = [DecodeTrust::Verified, DecodeTrust::Checked, DecodeTrust::Trusted];
        for trust in all {
            // crc32c verifies before decoding: always; nothing to decode: never.
            assert!(
                chain(Some(&zstd), true).device_may_decode(trust) && chain(Some(&gzip), true).device_may_decode(trust)
            );
            assert!(!chain(None, true).device_may_decode(trust) && !chain(None, false).device_may_decode(trust));
        }
        let zstd_alone: Vec<bool> = all.iter().map(|&t| chain(Some(&zstd), false).device_may_decode(t)).collect();
        let gzip_alone: Vec<bool> = all.iter().map(|&t| chain(Some(&gzip), false).device_may_decode(t)).collect();
        assert_eq!(zstd_alone, [false, true, true]);
        assert_eq!(gzip_alone, [false, false, true]);
    }
}
