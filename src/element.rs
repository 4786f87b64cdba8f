//! The element types reads hand out, by zarrs data type name: one table for the command line and
//! the Python package.

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

/// `$f::<T>` (a generic function, as a function pointer) for the Rust element type `T` of the
/// element type named `$name` (a name of [`ELEMENT_TYPES`]), or None.
#[macro_export]
macro_rules! by_element_type {
    ($name:expr, $f:ident) => {
        match $name {
            "bool" => Some($f::<bool> as _),
            "int8" => Some($f::<i8> as _),
            "int16" => Some($f::<i16> as _),
            "int32" => Some($f::<i32> as _),
            "int64" => Some($f::<i64> as _),
            "uint8" => Some($f::<u8> as _),
            "uint16" => Some($f::<u16> as _),
            "uint32" => Some($f::<u32> as _),
            "uint64" => Some($f::<u64> as _),
            "float16" => Some($f::<$crate::half::f16> as _),
            "bfloat16" => Some($f::<$crate::half::bf16> as _),
            "float32" => Some($f::<f32> as _),
            "float64" => Some($f::<f64> as _),
            "complex64" => Some($f::<$crate::num_complex::Complex32> as _),
            "complex128" => Some($f::<$crate::num_complex::Complex64> as _),
            _ => None,
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_element_type_has_a_rust_type() {
        fn size<T>() -> usize {
            std::mem::size_of::<T>()
        }
        for (name, typestr) in super::ELEMENT_TYPES {
            let f: Option<fn() -> usize> = crate::by_element_type!(*name, size);
            let bytes = f.expect(name)();
            if let Some(typestr) = typestr {
                assert_eq!(typestr[2..].parse::<usize>().unwrap(), bytes, "{name}");
            }
        }
        let none: Option<fn() -> usize> = crate::by_element_type!("string", size);
        assert!(none.is_none());
    }
}
