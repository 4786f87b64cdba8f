//! `parse_subset` never panics on any text and shape, and a subset it accepts has one range per
//! dimension, each inside the shape.
//!
//! Input: a byte with the dimensionality (low 3 bits, 0 to 7), then per dimension a byte picking
//! its extent (0, 1, 2^63, u64::MAX - 1, u64::MAX, a small number, or the next 8 bytes little
//! endian); the rest is the subset's text (invalid UTF-8 replaced).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&dims, mut rest)) = data.split_first() else { return };
    let mut shape = Vec::new();
    for _ in 0..dims & 7 {
        let Some((&pick, tail)) = rest.split_first() else { return };
        rest = tail;
        shape.push(match pick % 8 {
            0 => 0,
            1 => 1,
            2 => 1 << 63,
            3 => u64::MAX - 1,
            4 => u64::MAX,
            5 | 6 => u64::from(pick >> 3),
            _ => {
                let Some((n, tail)) = rest.split_first_chunk::<8>() else { return };
                rest = tail;
                u64::from_le_bytes(*n)
            }
        });
    }
    let spec = String::from_utf8_lossy(rest);
    if let Ok(subset) = zarrs_gpu::parse_subset(&spec, &shape) {
        let ranges = subset.to_ranges();
        assert_eq!(ranges.len(), shape.len(), "{spec:?} {shape:?}");
        for (r, &n) in ranges.iter().zip(&shape) {
            assert!(r.start <= r.end && r.end <= n, "{spec:?} {shape:?}: {ranges:?}");
        }
    }
});
