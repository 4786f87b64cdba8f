//! The data types read to the device, by zarrs' name: one table for reads, DLPack, the command
//! line and the Python package.

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

/// `data_type`'s row of [`ELEMENT_TYPES`], or None for a type not read to the device.
#[must_use]
pub fn element_type(data_type: &DataType) -> Option<(&'static str, Option<&'static str>)> {
    // A v2 array's type prints as "float32 / <f4".
    let name = data_type.to_string();
    let name = name.split(" / ").next().unwrap_or_default();
    ELEMENT_TYPES.iter().find(|t| t.0 == name).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_numeric_data_type_is_read_to_the_device_and_others_are_not() {
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
