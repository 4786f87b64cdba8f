//! numcodecs' `delta` filter (Zarr v2 filter id `delta`, Zarr v3 codec `numcodecs.delta`, an
//! array-to-array codec), which zarrs 0.23 lacks: registered with zarrs as a codec plugin, so
//! that linking this crate makes zarrs open, read and write such arrays, and decoded on the
//! device where the chain allows (a running sum per chunk after the chunk's other codecs, before
//! placement).
//!
//! Configuration: `{"dtype": "<i4", "astype": "<i2"}` (`astype` optional, `dtype` by default),
//! numpy type strings of an integer or float type; `dtype` is the array's data type. Each chunk
//! is encoded in C order as its first element and the differences after it, in `astype`;
//! decoding is their running sum. The arithmetic is numpy's, bit for bit (`host`). The byte
//! order marks are taken as the array's: zarrs' `bytes` codec orders every element, so a
//! configuration whose two types name different byte orders is refused.
//!
//! The device ([`DeviceDelta`], `kernels`) takes `dtype == astype` (integers, or integers of
//! one width; floats, summed in order by one thread per chunk as numpy does); other pairs, and
//! delta with any other array-to-array codec, are decoded by zarrs on the host.

pub(crate) mod host;
pub(crate) mod kernels;

use std::any::Any;
use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::codec::api::{
    ArrayCodecTraits, ArrayPartialDecoderTraits, ArrayToArrayCodecTraits, CodecPluginV2, CodecPluginV3, CodecTraitsV2,
    CodecTraitsV3, PartialDecoderCapability, PartialEncoderCapability,
};
use zarrs::array::{
    data_type, ArrayBytes, ArraySubset, Codec, CodecError, CodecMetadataOptions, CodecOptions, CodecTraits, DataType,
    FillValue, Indexer, RecommendedConcurrency,
};
use zarrs::metadata::v2::MetadataV2;
use zarrs::metadata::v3::MetadataV3;
use zarrs::metadata::Configuration;
use zarrs::plugin::{PluginCreateError, ZarrVersion};
use zarrs_storage::StorageError;

pub use host::DeltaType;

/// The codec's Zarr v3 name.
pub const DELTA_NAME: &str = "numcodecs.delta";

/// numcodecs' `delta` filter as a zarrs array-to-array codec.
#[derive(Clone, Debug)]
pub struct DeltaCodec {
    dtype: DeltaType,
    astype: DeltaType,
    /// The type strings as configured, written back unchanged.
    dtype_str: String,
    astype_str: Option<String>,
}

zarrs::plugin::impl_extension_aliases!(DeltaCodec, v3: "numcodecs.delta", [], v2: "delta", []);

inventory::submit! {
    CodecPluginV3::new::<DeltaCodec>()
}
inventory::submit! {
    CodecPluginV2::new::<DeltaCodec>()
}

impl CodecTraitsV3 for DeltaCodec {
    fn create(metadata: &MetadataV3) -> Result<Codec, PluginCreateError> {
        let configuration = metadata.configuration().cloned().unwrap_or_default();
        Ok(Codec::ArrayToArray(Arc::new(Self::new_with_configuration(&configuration)?)))
    }
}

impl CodecTraitsV2 for DeltaCodec {
    fn create(metadata: &MetadataV2) -> Result<Codec, PluginCreateError> {
        Ok(Codec::ArrayToArray(Arc::new(Self::new_with_configuration(metadata.configuration())?)))
    }
}

fn config_error(message: &str) -> PluginCreateError {
    PluginCreateError::Other(format!("{DELTA_NAME}: {message}"))
}

impl DeltaCodec {
    /// The codec of a configuration (`dtype`, optional `astype`).
    ///
    /// # Errors
    /// Names the field and value: a missing `dtype`, a type that is not an integer or float
    /// numpy type string, two byte orders, or another field.
    pub fn new_with_configuration(configuration: &Configuration) -> Result<Self, PluginCreateError> {
        if let Some(other) = configuration.keys().find(|k| !matches!(k.as_str(), "dtype" | "astype" | "id")) {
            return Err(config_error(&format!("unknown configuration field {other:?}")));
        }
        let field = |name: &str| -> Result<Option<(String, DeltaType, Option<char>)>, PluginCreateError> {
            let Some(value) = configuration.get(name).filter(|v| !v.is_null()) else { return Ok(None) };
            let s = value.as_str().ok_or_else(|| config_error(&format!("{name} {value} is not a string")))?;
            let (ty, order) = DeltaType::parse(s).ok_or_else(|| {
                config_error(&format!(
                    "{name} {s:?} is not supported (an integer or float numpy type: int8 to int64, uint8 to uint64, float16 to float64)"
                ))
            })?;
            Ok(Some((s.to_string(), ty, order)))
        };
        let (dtype_str, dtype, dtype_order) = field("dtype")?.ok_or_else(|| config_error("no dtype"))?;
        let astype = field("astype")?;
        let (astype_str, astype_ty, astype_order) = match astype {
            Some((s, ty, order)) => (Some(s), ty, order),
            None => (None, dtype, dtype_order),
        };
        // Single-byte types have no order; of the others, both must agree where both name one.
        let ordered = |ty: DeltaType, order: Option<char>| order.filter(|_| ty.size() > 1);
        if let (Some(a), Some(b)) = (ordered(dtype, dtype_order), ordered(astype_ty, astype_order)) {
            if a != b {
                return Err(config_error(&format!(
                    "dtype {dtype_str:?} and astype {:?} name different byte orders (the array's applies to both)",
                    astype_str.as_deref().unwrap_or_default()
                )));
            }
        }
        Ok(Self { dtype, astype: astype_ty, dtype_str, astype_str })
    }

    /// The decoded element type.
    #[must_use]
    pub fn dtype(&self) -> DeltaType {
        self.dtype
    }

    /// The encoded element type.
    #[must_use]
    pub fn astype(&self) -> DeltaType {
        self.astype
    }

    /// `data_type` must be `dtype`'s.
    fn check_data_type(&self, data_type: &DataType) -> Result<(), CodecError> {
        if delta_type_of(data_type) == Some(self.dtype) {
            Ok(())
        } else {
            Err(CodecError::Other(format!(
                "{DELTA_NAME}: the array's data type {data_type} is not the codec's dtype {:?} ({})",
                self.dtype_str, self.dtype
            )))
        }
    }

    /// The device's take on this codec: its plan, or why the host decodes it.
    ///
    /// # Errors
    /// Why the device does not decode this configuration.
    pub(crate) fn device(&self, data_type: &DataType) -> Result<DeviceDelta, String> {
        let (d, a) = (self.dtype, self.astype);
        if delta_type_of(data_type) != Some(d) {
            return Err(format!("{DELTA_NAME}: the array's data type {data_type} is not the codec's dtype {d}"));
        }
        if d.size() != a.size() || d.is_float() != a.is_float() || (d.is_float() && d != a) {
            return Err(format!(
                "{DELTA_NAME} with dtype {d} and astype {a} is decoded on the host (the device takes one type, or integers of one width)"
            ));
        }
        if DeltaType::sum_type(d, a) != host::SumType::Wrapping && !d.is_float() {
            return Err(format!(
                "{DELTA_NAME} with dtype {d} and astype {a} sums in float64 (numpy): decoded on the host"
            ));
        }
        Ok(DeviceDelta { dtype: d, swap: false })
    }
}

/// The type of a zarrs data type, where delta takes it.
#[must_use]
pub fn delta_type_of(data_type: &DataType) -> Option<DeltaType> {
    DeltaType::ALL.into_iter().find(|t| data_type_of(*t) == *data_type)
}

fn data_type_of(t: DeltaType) -> DataType {
    match t {
        DeltaType::I8 => data_type::int8(),
        DeltaType::I16 => data_type::int16(),
        DeltaType::I32 => data_type::int32(),
        DeltaType::I64 => data_type::int64(),
        DeltaType::U8 => data_type::uint8(),
        DeltaType::U16 => data_type::uint16(),
        DeltaType::U32 => data_type::uint32(),
        DeltaType::U64 => data_type::uint64(),
        DeltaType::F16 => data_type::float16(),
        DeltaType::F32 => data_type::float32(),
        DeltaType::F64 => data_type::float64(),
    }
}

impl CodecTraits for DeltaCodec {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn configuration(&self, _version: ZarrVersion, _options: &CodecMetadataOptions) -> Option<Configuration> {
        let mut map = serde_json::Map::new();
        map.insert("dtype".into(), self.dtype_str.clone().into());
        if let Some(astype) = &self.astype_str {
            map.insert("astype".into(), astype.clone().into());
        }
        Some(map.into())
    }

    fn partial_decoder_capability(&self) -> PartialDecoderCapability {
        // A running sum: every element depends on all before it in the chunk.
        PartialDecoderCapability { partial_read: false, partial_decode: false }
    }

    fn partial_encoder_capability(&self) -> PartialEncoderCapability {
        PartialEncoderCapability { partial_encode: false }
    }
}

impl ArrayCodecTraits for DeltaCodec {
    fn recommended_concurrency(
        &self,
        _shape: &[NonZeroU64],
        _data_type: &DataType,
    ) -> Result<RecommendedConcurrency, CodecError> {
        Ok(RecommendedConcurrency::new_maximum(1))
    }
}

impl ArrayToArrayCodecTraits for DeltaCodec {
    fn into_dyn(self: Arc<Self>) -> Arc<dyn ArrayToArrayCodecTraits> {
        self
    }

    fn encoded_data_type(&self, decoded_data_type: &DataType) -> Result<DataType, CodecError> {
        self.check_data_type(decoded_data_type)?;
        Ok(data_type_of(self.astype))
    }

    fn encoded_fill_value(
        &self,
        decoded_data_type: &DataType,
        decoded_fill_value: &FillValue,
    ) -> Result<FillValue, CodecError> {
        // One element encodes as itself cast; never refused (unlike a chunk's first element),
        // since the encoded fill value describes no stored chunk.
        self.check_data_type(decoded_data_type)?;
        Ok(FillValue::new(host::cast(self.dtype, self.astype, decoded_fill_value.as_ne_bytes())))
    }

    fn encode<'a>(
        &self,
        bytes: ArrayBytes<'a>,
        shape: &[NonZeroU64],
        data_type: &DataType,
        _fill_value: &FillValue,
        _options: &CodecOptions,
    ) -> Result<ArrayBytes<'a>, CodecError> {
        self.check_data_type(data_type)?;
        let arr = bytes.into_fixed()?;
        let n = elements(shape, arr.len(), self.dtype)?;
        let mut out = vec![0u8; n * self.astype.size()];
        host::encode(self.dtype, self.astype, &arr, &mut out)
            .map_err(|e| CodecError::Other(format!("{DELTA_NAME}: {e}")))?;
        Ok(ArrayBytes::from(out))
    }

    fn partial_decoder(
        self: Arc<Self>,
        input_handle: Arc<dyn ArrayPartialDecoderTraits>,
        shape: &[NonZeroU64],
        data_type: &DataType,
        fill_value: &FillValue,
        _options: &CodecOptions,
    ) -> Result<Arc<dyn ArrayPartialDecoderTraits>, CodecError> {
        Ok(Arc::new(DeltaPartialDecoder {
            input: input_handle,
            codec: self,
            shape: shape.to_vec(),
            data_type: data_type.clone(),
            fill_value: fill_value.clone(),
        }))
    }

    fn decode<'a>(
        &self,
        bytes: ArrayBytes<'a>,
        shape: &[NonZeroU64],
        data_type: &DataType,
        _fill_value: &FillValue,
        _options: &CodecOptions,
    ) -> Result<ArrayBytes<'a>, CodecError> {
        self.check_data_type(data_type)?;
        let enc = bytes.into_fixed()?;
        let n = elements(shape, enc.len(), self.astype)?;
        let mut out = vec![0u8; n * self.dtype.size()];
        host::decode(self.dtype, self.astype, &enc, &mut out);
        Ok(ArrayBytes::from(out))
    }
}

/// Any part of a chunk decodes the whole chunk (each element is the sum of all before it), and a
/// missing chunk is the fill value: zarrs' default partial decoder decodes the encoded fill value
/// instead, right only for element-wise codecs (here it would be a running sum of fill values).
struct DeltaPartialDecoder {
    input: Arc<dyn ArrayPartialDecoderTraits>,
    codec: Arc<DeltaCodec>,
    shape: Vec<NonZeroU64>,
    data_type: DataType,
    fill_value: FillValue,
}

impl ArrayPartialDecoderTraits for DeltaPartialDecoder {
    fn data_type(&self) -> &DataType {
        &self.data_type
    }

    fn exists(&self) -> Result<bool, StorageError> {
        self.input.exists()
    }

    fn size_held(&self) -> usize {
        self.input.size_held()
    }

    fn partial_decode(&self, indexer: &dyn Indexer, options: &CodecOptions) -> Result<ArrayBytes<'_>, CodecError> {
        if !self.input.exists()? {
            return ArrayBytes::new_fill_value(&self.data_type, indexer.len(), &self.fill_value)
                .map_err(|e| CodecError::Other(format!("{DELTA_NAME}: the fill value: {e}")));
        }
        let shape: Vec<u64> = self.shape.iter().map(|n| n.get()).collect();
        let whole = ArraySubset::new_with_shape(shape.clone());
        let encoded = self.input.partial_decode(&whole, options)?;
        let decoded = self.codec.decode(encoded, &self.shape, &self.data_type, &self.fill_value, options)?;
        Ok(decoded.extract_array_subset(indexer, &shape, &self.data_type)?.into_owned())
    }

    fn supports_partial_decode(&self) -> bool {
        false
    }
}

/// The elements of a chunk of `shape` whose bytes (`len`, `ty` elements) must match it.
fn elements(shape: &[NonZeroU64], len: usize, ty: DeltaType) -> Result<usize, CodecError> {
    let n = shape.iter().try_fold(1u64, |acc, d| acc.checked_mul(d.get()));
    let n = n.and_then(|n| usize::try_from(n).ok()).filter(|n| n.checked_mul(ty.size()) == Some(len));
    n.ok_or_else(|| {
        CodecError::Other(format!("{DELTA_NAME}: a chunk of shape {shape:?} does not hold {len} bytes of {ty}"))
    })
}

/// The device's plan for delta in a chain (see [`DeltaCodec::device`]): the element type, and
/// whether stored words are byte-swapped first (the `bytes` codec's order, undone before the
/// sum, so that placement copies the sums as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceDelta {
    pub(crate) dtype: DeltaType,
    pub(crate) swap: bool,
}

/// How the device decodes an array-to-array codec that is delta, for `zarrs-gpu info`'s plan
/// line (None: not delta).
#[must_use]
pub fn delta_device_text(codec: &dyn ArrayToArrayCodecTraits) -> Option<&'static str> {
    delta_of(codec).map(|_| {
        "the running sum of each whole decoded chunk in staging, before placement; integers by a block scan, floats in order as numpy adds them"
    })
}

/// The delta codec of an array-to-array codec, if it is one.
pub(crate) fn delta_of(codec: &dyn ArrayToArrayCodecTraits) -> Option<&DeltaCodec> {
    codec.as_any().downcast_ref::<DeltaCodec>()
}

#[cfg(test)]
mod tests;
