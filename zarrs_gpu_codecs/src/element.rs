//! The numeric data types, by zarrs' name: one table for DLPack, the command line and the Python
//! package (reads to the device take every fixed-size data type; these are the ones with a
//! numeric element those three hand out).

use zarrs::array::DataType;

/// The fixed-size numeric data types read to the device: zarrs' name (numpy's too) and numpy's
/// array-interface type string (None for bfloat16, which numpy has not).
pub const ELEMENT_TYPES: &[(&str, Option<&str>)] = &[
    ("bool", Some("|b1")),
    ("int8", Some("|i1")),
    ("int16", Some("<i2")),
    ("int32", Some("<i4")),
    ("int64", Some("<i8")),
    ("uint8", Some("|u1")),
    ("uint16", Some("<u2")),
    ("uint32", Some("<u4")),
    ("uint64", Some("<u8")),
    ("float16", Some("<f2")),
    ("bfloat16", None),
    ("float32", Some("<f4")),
    ("float64", Some("<f8")),
    ("complex64", Some("<c8")),
    ("complex128", Some("<c16")),
];

/// `data_type`'s row of [`ELEMENT_TYPES`], or None for a type without a numeric element.
#[must_use]
pub fn element_type(data_type: &DataType) -> Option<(&'static str, Option<&'static str>)> {
    let name = type_name(data_type);
    ELEMENT_TYPES.iter().find(|t| t.0 == name).copied()
}

/// zarrs' name of `data_type`, the same for a v2 and a v3 array's (a type prints as
/// "float32 / <f4", "r16 / |V2").
#[must_use]
pub fn type_name(data_type: &DataType) -> String {
    let name = data_type.to_string();
    name.split(" / ").next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_data_type_has_its_row_and_others_have_none() {
        use zarrs::array::data_type;
        for (dt, name) in [
            (data_type::bool(), "bool"),
            (data_type::int16(), "int16"),
            (data_type::uint64(), "uint64"),
            (data_type::bfloat16(), "bfloat16"),
            (data_type::float32(), "float32"),
            (data_type::complex128(), "complex128"),
        ] {
            assert_eq!(element_type(&dt).map(|t| t.0), Some(name));
        }
        assert!(element_type(&data_type::string()).is_none());
        assert!(element_type(&data_type::float8_e4m3()).is_none(), "no Rust element type here");
        for (name, typestr) in ELEMENT_TYPES {
            if let Some(typestr) = typestr {
                assert!(typestr[2..].parse::<usize>().is_ok(), "{name}");
            }
        }
    }
}
