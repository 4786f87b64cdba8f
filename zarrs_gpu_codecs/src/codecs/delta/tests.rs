//! The host codec against values computed independently (integer arithmetic in i128, numpy's
//! outputs recorded from numcodecs 0.16.6 with numpy 2.4), and through zarrs (v2 and v3
//! metadata, edge chunks, missing chunks).

use std::sync::Arc;

use half::f16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::{Array, ArrayBytes, ArrayMetadata, ArraySubset};
use zarrs::metadata::Configuration;
use zarrs_storage::ReadableStorageTraits;

use super::host::{self, DeltaType, SumType};
use super::DeltaCodec;

fn config(json: &str) -> Configuration {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json).unwrap().into()
}

fn bytes<T: bytemuck::Pod>(values: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

fn values<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(size_of::<T>()).map(bytemuck::pod_read_unaligned).collect()
}

fn encode<D: bytemuck::Pod, A: bytemuck::Pod>(d: DeltaType, a: DeltaType, arr: &[D]) -> Result<Vec<A>, String> {
    let mut out = vec![0u8; arr.len() * a.size()];
    host::encode(d, a, &bytes(arr), &mut out)?;
    Ok(values(&out))
}

fn decode<A: bytemuck::Pod, D: bytemuck::Pod>(d: DeltaType, a: DeltaType, enc: &[A]) -> Vec<D> {
    let mut out = vec![0u8; enc.len() * d.size()];
    host::decode(d, a, &bytes(enc), &mut out);
    values(&out)
}

/// Integers of every type: the differences and sums computed in i128 and reduced mod 2^bits
/// (so they wrap as numpy's do), random values over the whole range, then a round trip.
#[test]
fn integers_of_every_type_wrap_as_numpy_does() {
    fn check<T: bytemuck::Pod + PartialEq + std::fmt::Debug>(
        t: DeltaType,
        to: impl Fn(i128) -> T,
        from: impl Fn(T) -> i128,
    ) {
        let mut rng = StdRng::seed_from_u64(t.size() as u64 + u64::from(t.is_signed_int()));
        let bits = 8 * t.size() as u32;
        let reduce = |v: i128| {
            let m = v.rem_euclid(1i128 << bits);
            if t.is_signed_int() && m >= 1i128 << (bits - 1) {
                m - (1i128 << bits)
            } else {
                m
            }
        };
        // Random bits (extremes, so every difference overflows somewhere), then runs near the ends.
        let mut arr: Vec<i128> = (0..999).map(|_| reduce(i128::from(rng.random::<u64>()))).collect();
        arr.extend((0..40).map(|i| reduce(if i % 2 == 0 { i128::MAX } else { 0 } - i)));
        let arr_t: Vec<T> = arr.iter().map(|&v| to(v)).collect();
        let want: Vec<T> =
            (0..arr.len()).map(|i| to(reduce(if i == 0 { arr[0] } else { arr[i] - arr[i - 1] }))).collect();
        // A signed type's first element always fits its own range: numpy never refuses it.
        let enc = encode::<T, T>(t, t, &arr_t).unwrap();
        assert_eq!(enc, want, "{t}: encode");
        // Sums reduced independently.
        let mut sum = 0i128;
        let dec_want: Vec<T> = enc
            .iter()
            .map(|&e| {
                sum = reduce(sum + from(e));
                to(sum)
            })
            .collect();
        assert_eq!(dec_want, arr_t, "{t}: the independent sum");
        assert_eq!(decode::<T, T>(t, t, &enc), arr_t, "{t}: decode");
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    {
        check(DeltaType::I8, |v| v as i8, i128::from);
        check(DeltaType::I16, |v| v as i16, i128::from);
        check(DeltaType::I32, |v| v as i32, i128::from);
        check(DeltaType::I64, |v| v as i64, i128::from);
        check(DeltaType::U8, |v| v as u8, i128::from);
        check(DeltaType::U16, |v| v as u16, i128::from);
        check(DeltaType::U32, |v| v as u32, i128::from);
        check(DeltaType::U64, |v| v as u64, i128::from);
    }
}

/// numcodecs' own outputs (numcodecs 0.16.6, numpy 2.4.6), astype narrowing and widening.
#[test]
fn numcodecs_outputs_are_reproduced() {
    use DeltaType::{F16, F64, I16, I32, I8, U16, U8};
    // int8: every difference overflows.
    let enc = encode::<i8, i8>(I8, I8, &[100, -100, 127, -128, 5]).unwrap();
    assert_eq!(enc, [100, 56, -29, 1, -123]);
    assert_eq!(decode::<i8, i8>(I8, I8, &enc), [100, -100, 127, -128, 5]);
    // int16 narrowed to int8: differences wrap in int8; the sum is int16's (not round-tripped).
    let enc = encode::<i16, i8>(I16, I8, &[30, 300, -200]).unwrap();
    assert_eq!(enc, [30, 14, 12]);
    assert_eq!(decode::<i8, i16>(I16, I8, &enc), [30, 44, 56]);
    // uint8 widened to uint16: the difference wraps in uint8 first.
    let enc = encode::<u8, u16>(U8, U16, &[3, 1, 250]).unwrap();
    assert_eq!(enc, [3, 254, 249]);
    assert_eq!(decode::<u16, u8>(U8, U16, &enc), [3, 1, 250]);
    // int8 from int32: summed in int32, cast to int8 at each step.
    assert_eq!(decode::<i32, i8>(I8, I32, &[100, 100, 100]), [100, -56, 44]);
    assert_eq!(decode::<i32, i8>(I8, I32, &[1000, 0, 0]), [-24, -24, -24]);
    // int32 from float64: summed in float64, then truncated (0.6, 1.2, 1.8, 2.4).
    assert_eq!(decode::<f64, i32>(I32, F64, &[0.6, 0.6, 0.6, 0.6]), [0, 1, 1, 2]);
    // float64 to int16: truncated, then wrapped (1000003 mod 2^16 = 16963).
    let enc = encode::<f64, i16>(F64, I16, &[5.7, -3.2, 1e6]).unwrap();
    assert_eq!(enc, [5, -8, 16963]);
    assert_eq!(decode::<i16, f64>(F64, I16, &enc), [5.0, -3.0, 16960.0]);
    // float16: every step rounds to half.
    let h = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
    let enc = encode::<f16, f16>(F16, F16, &h(&[1.0, 2.5, 1e4, 3.0])).unwrap();
    assert_eq!(enc, h(&[1.0, 1.5, 1e4, -1e4]));
    assert_eq!(decode::<f16, f16>(F16, F16, &enc), h(&[1.0, 2.5, 1e4, 0.0]));
    // int32 to float64 and back, the difference wrapped in int32 first.
    let enc = encode::<i32, f64>(I32, F64, &[5, i32::MIN, i32::MAX]).unwrap();
    assert_eq!(enc, [5.0, 2_147_483_643.0, -1.0]);
    assert_eq!(decode::<f64, i32>(I32, F64, &enc), [5, i32::MIN, i32::MAX]);
    // A signed integer astype refuses a first element out of its range, an unsigned one wraps.
    let err = encode::<i16, i8>(I16, I8, &[300, 1]).unwrap_err();
    assert!(err.contains("300") && err.contains("int8"), "{err}");
    assert!(encode::<f64, i16>(F64, I16, &[f64::NAN, 1.0]).unwrap_err().contains("NaN"));
    assert_eq!(encode::<i8, u8>(I8, U8, &[-1, 3]).unwrap(), [255, 4]);
    // Floats to unsigned: truncated through int64, as numpy on x86-64 (-3.5 -> 253).
    assert_eq!(encode::<f32, u8>(DeltaType::F32, U8, &[-3.5, 1.0]).unwrap(), [253, 4]);
}

/// Floats of every width: numpy's in-order sums, the -0.0 of a first element kept.
#[test]
fn floats_sum_in_order() {
    let mut rng = StdRng::seed_from_u64(9);
    let arr: Vec<f64> = (0..500).map(|_| rng.random_range(-1e6..1e6) * rng.random_range(0.0..1e-3)).collect();
    let enc = encode::<f64, f64>(DeltaType::F64, DeltaType::F64, &arr).unwrap();
    let mut want = Vec::new();
    let mut acc = 0.0f64;
    for (i, &e) in enc.iter().enumerate() {
        acc = if i == 0 { e } else { acc + e };
        want.push(acc);
    }
    assert_eq!(decode::<f64, f64>(DeltaType::F64, DeltaType::F64, &enc), want);
    assert_eq!(enc[1].to_bits(), (arr[1] - arr[0]).to_bits());
    let arr32: Vec<f32> = vec![-0.0, 1.5, 1e-8, 3.25];
    let enc32 = encode::<f32, f32>(DeltaType::F32, DeltaType::F32, &arr32).unwrap();
    let dec32 = decode::<f32, f32>(DeltaType::F32, DeltaType::F32, &enc32);
    assert!(dec32[0].is_sign_negative() && dec32[0] == 0.0, "{dec32:?}");
    // float32 decoded from float64: summed in float64 (1 + 1e-8 three times is not 1 there).
    assert_eq!(decode::<f32, f64>(DeltaType::F64, DeltaType::F32, &[1.0f32, 1e-8, 1e-8, 1e-8]), {
        let e = f64::from(1e-8f32);
        vec![1.0, 1.0 + e, 1.0 + e + e, 1.0 + e + e + e]
    });
}

/// numpy's `result_type` for the pairs whose sums differ (recorded from numpy 2.4).
#[test]
fn sums_run_in_numpys_promoted_type() {
    use DeltaType::{F16, F32, F64, I16, I32, I64, I8, U16, U32, U64, U8};
    let cases = [
        (I8, U64, SumType::F64),
        (U64, I16, SumType::F64),
        (I64, U64, SumType::F64),
        (U64, U32, SumType::Wrapping),
        (I8, F16, SumType::F16),
        (U8, F16, SumType::F16),
        (I16, F16, SumType::F32),
        (F16, U16, SumType::F32),
        (I32, F16, SumType::F64),
        (F32, I32, SumType::F64),
        (F32, I16, SumType::F32),
        (F16, F32, SumType::F32),
        (F32, F64, SumType::F64),
        (F16, F16, SumType::F16),
        (I8, I64, SumType::Wrapping),
    ];
    for (d, a, want) in cases {
        assert_eq!(DeltaType::sum_type(d, a), want, "dtype {d}, astype {a}");
    }
}

#[test]
fn configurations_parse_as_numcodecs_writes_them_and_bad_ones_name_the_value() {
    let codec = DeltaCodec::new_with_configuration(&config(r#"{"dtype": "<i4", "astype": "<i2"}"#)).unwrap();
    assert_eq!((codec.dtype(), codec.astype()), (DeltaType::I32, DeltaType::I16));
    let codec = DeltaCodec::new_with_configuration(&config(r#"{"dtype": "int32"}"#)).unwrap();
    assert_eq!((codec.dtype(), codec.astype()), (DeltaType::I32, DeltaType::I32));
    for (s, t) in [("|u1", DeltaType::U8), (">f8", DeltaType::F64), ("f2", DeltaType::F16), ("uint64", DeltaType::U64)]
    {
        assert_eq!(DeltaType::parse(s).map(|p| p.0), Some(t), "{s}");
    }
    let err = |json: &str| DeltaCodec::new_with_configuration(&config(json)).unwrap_err().to_string();
    for (json, needle) in [
        (r#"{"dtype": "<c8"}"#, "\"<c8\""),
        (r#"{"dtype": "<i4", "astype": "|b1"}"#, "\"|b1\""),
        (r#"{"dtype": "<i4", "astype": ">i2"}"#, "different byte orders"),
        (r#"{"astype": "<i4"}"#, "no dtype"),
        (r#"{"dtype": 4}"#, "not a string"),
        (r#"{"dtype": "<i4", "scale": 2}"#, "\"scale\""),
        (r#"{"dtype": "<int32"}"#, "\"<int32\""),
    ] {
        let e = err(json);
        assert!(e.contains("numcodecs.delta") && e.contains(needle), "{json}: {e}");
    }
    // Single-byte types have no byte order to disagree with.
    assert!(DeltaCodec::new_with_configuration(&config(r#"{"dtype": ">i4", "astype": "|i1"}"#)).is_ok());
}

fn write(dir: &std::path::Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

/// Through zarrs: v3 `numcodecs.delta` and the v2 `delta` filter open, write (edge chunks;
/// chunks stored as numcodecs encodes them) and read back; one chunk is never written.
#[test]
fn zarrs_opens_writes_and_reads_delta_arrays() {
    let dir = tempfile::tempdir().unwrap();
    let v3 = r#"{"zarr_format": 3, "node_type": "array", "shape": [7, 5], "data_type": "int16",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 3]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": -7,
        "codecs": [{"name": "numcodecs.delta", "configuration": {"dtype": "<i2", "astype": "<i4"}},
                   {"name": "bytes", "configuration": {"endian": "little"}}]}"#;
    std::fs::create_dir_all(dir.path().join("v3")).unwrap();
    write(&dir.path().join("v3"), "zarr.json", v3);
    std::fs::create_dir_all(dir.path().join("v2")).unwrap();
    let v2 = r#"{"zarr_format": 2, "shape": [7, 5], "chunks": [4, 3], "dtype": ">i2", "fill_value": -7,
        "order": "C", "compressor": null, "filters": [{"id": "delta", "dtype": ">i2", "astype": ">i4"}]}"#;
    write(&dir.path().join("v2"), ".zarray", v2);
    let values: Vec<i16> = (0..35).map(|i| (i * i * 977 % 65_536 - 32_768) as i16).collect();
    for (node, big) in [("v3", false), ("v2", true)] {
        let store = Arc::new(zarrs::filesystem::FilesystemStore::new(dir.path().join(node)).unwrap());
        let array = Array::open(store.clone(), "/").unwrap();
        assert!(matches!(array.metadata(), ArrayMetadata::V3(_)) == (node == "v3"));
        // All but chunk [1, 1] (rows 4..7, columns 3..5): it stays missing.
        let rows = |r: std::ops::Range<u64>, c: std::ops::Range<u64>| {
            let subset = ArraySubset::new_with_ranges(&[r.clone(), c.clone()]);
            let part: Vec<i16> =
                r.flat_map(|i| c.clone().map(move |j| (i, j))).map(|(i, j)| values[(i * 5 + j) as usize]).collect();
            (subset, part)
        };
        for (r, c) in [(0..4, 0..5), (4..7, 0..3)] {
            let (subset, part) = rows(r, c);
            array.store_array_subset(&subset, part).unwrap();
        }
        let got = array.retrieve_array_subset::<Vec<i16>>(&array.subset_all()).unwrap();
        let want: Vec<i16> = (0..35).map(|k| if k / 5 >= 4 && k % 5 >= 3 { -7 } else { values[k as usize] }).collect();
        assert_eq!(got, want, "{node}");
        // Chunk [0, 1] (rows 0..4, columns 3..5, then the edge's padding with the fill value):
        // stored as int32 differences in C order of the whole chunk, in the array's byte order.
        let chunk: Vec<i16> = (0..4)
            .flat_map(|i| (3..6).map(move |j| (i, j)))
            .map(|(i, j)| if j < 5 { values[i * 5 + j] } else { -7 })
            .collect();
        let want: Vec<i32> = (0..chunk.len())
            .map(|k| i32::from(if k == 0 { chunk[0] } else { chunk[k].wrapping_sub(chunk[k - 1]) }))
            .collect();
        let key = if node == "v3" { "c/0/1" } else { "0.1" };
        let stored = store.get(&zarrs_storage::StoreKey::new(key).unwrap()).unwrap().expect("chunk [0, 1] is stored");
        let stored: Vec<i32> = stored
            .chunks_exact(4)
            .map(|b| {
                if big {
                    i32::from_be_bytes(b.try_into().unwrap())
                } else {
                    i32::from_le_bytes(b.try_into().unwrap())
                }
            })
            .collect();
        assert_eq!(stored, want, "{node}: the stored chunk");
        // A chunk alone, and a subset within one chunk (decoded whole, then cut).
        let chunk = array.retrieve_chunk::<ArrayBytes<'static>>(&[0, 0]).unwrap().into_fixed().unwrap().into_owned();
        assert_eq!(chunk.len(), 4 * 3 * 2);
        let inner = array.retrieve_array_subset::<Vec<i16>>(&ArraySubset::new_with_ranges(&[2..4, 1..2])).unwrap();
        assert_eq!(inner, [values[11], values[16]], "{node}");
        // Partial writes: one element inside a stored chunk, one inside the missing chunk.
        array.store_array_subset(&ArraySubset::new_with_ranges(&[1..2, 1..2]), vec![1234i16]).unwrap();
        array.store_array_subset(&ArraySubset::new_with_ranges(&[5..6, 4..5]), vec![-4321i16]).unwrap();
        let got = array.retrieve_array_subset::<Vec<i16>>(&array.subset_all()).unwrap();
        let want: Vec<i16> = (0..35)
            .map(|k| match k {
                6 => 1234,
                29 => -4321,
                k if k / 5 >= 4 && k % 5 >= 3 => -7,
                k => values[k as usize],
            })
            .collect();
        assert_eq!(got, want, "{node}: after partial writes");
    }
}

#[test]
fn an_array_whose_data_type_is_not_dtype_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let v3 = r#"{"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}},
                   {"name": "bytes", "configuration": {"endian": "little"}}]}"#;
    write(dir.path(), "zarr.json", v3);
    let store = Arc::new(zarrs::filesystem::FilesystemStore::new(dir.path()).unwrap());
    let err = match Array::open(store, "/") {
        Err(e) => e.to_string(),
        Ok(array) => array.store_array_subset(&array.subset_all(), vec![1.0f32; 4]).unwrap_err().to_string(),
    };
    assert!(err.contains("float32") && err.contains("<i4"), "{err}");
}
