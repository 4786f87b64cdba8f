use zarrs::array::ArraySubset;

/// Parse a subset written as numpy-style slices, one per dimension, separated by commas:
/// `0:64,:,100:` (missing trailing dimensions mean the whole dimension).
///
/// # Errors
/// Returns a message naming the bad part when the text does not parse or leaves the shape.
pub fn parse_subset(spec: &str, shape: &[u64]) -> Result<ArraySubset, String> {
    let parts: Vec<&str> = if spec.trim().is_empty() { Vec::new() } else { spec.split(',').collect() };
    if parts.len() > shape.len() {
        return Err(format!("subset {spec:?} has {} dimensions but the array has {}", parts.len(), shape.len()));
    }
    let mut ranges = Vec::with_capacity(shape.len());
    for (dim, &size) in shape.iter().enumerate() {
        let part = parts.get(dim).map(|p| p.trim()).filter(|p| !p.is_empty()).unwrap_or(":");
        let parse = |s: &str, default: u64| -> Result<u64, String> {
            if s.trim().is_empty() {
                Ok(default)
            } else {
                s.trim().parse::<u64>().map_err(|_| format!("dimension {dim}: {s:?} is not a non-negative integer"))
            }
        };
        let (start, end) = if let Some((a, b)) = part.split_once(':') {
            (parse(a, 0)?, parse(b, size)?)
        } else {
            let i = parse(part, 0)?;
            // Checked: u64::MAX + 1 overflows, and no dimension holds index u64::MAX anyway.
            let end = i.checked_add(1).filter(|&end| end <= size);
            (i, end.ok_or_else(|| format!("dimension {dim}: index {i} is outside 0:{size}"))?)
        };
        if start > end || end > size {
            return Err(format!("dimension {dim}: {start}:{end} is outside 0:{size}"));
        }
        ranges.push(start..end);
    }
    Ok(ArraySubset::new_with_ranges(&ranges))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parses_slices() {
        let s = parse_subset("0:64, :,100:", &[512, 2048, 2048]).unwrap();
        assert_eq!(s.to_ranges(), vec![0..64, 0..2048, 100..2048]);
        assert_eq!(parse_subset("", &[4, 5]).unwrap().to_ranges(), vec![0..4, 0..5]);
        assert_eq!(parse_subset("3", &[4, 5]).unwrap().to_ranges(), vec![3..4, 0..5]);
        assert_eq!(parse_subset("1:2,", &[4, 5]).unwrap().to_ranges(), vec![1..2, 0..5]);
        assert!(parse_subset("0:5", &[4]).unwrap_err().contains("outside"));
        assert!(parse_subset("a:1", &[4]).unwrap_err().contains("\"a\""));
        assert!(parse_subset(":,:,:", &[4, 4]).unwrap_err().contains("3 dimensions"));
        assert!(parse_subset("3:2", &[4]).is_err());
        // Indices at u64's end: errors, never an overflow.
        let max = u64::MAX;
        assert!(parse_subset("18446744073709551615", &[max])
            .unwrap_err()
            .contains("index 18446744073709551615 is outside"));
        assert!(parse_subset("18446744073709551615,:", &[1 << 63, 64])
            .unwrap_err()
            .contains("outside 0:9223372036854775808"));
        assert_eq!(parse_subset("18446744073709551614", &[max]).unwrap().to_ranges(), vec![max - 1..max]);
        assert_eq!(parse_subset(":18446744073709551615", &[max]).unwrap().to_ranges(), vec![0..max]);
        assert!(parse_subset("18446744073709551616", &[max]).unwrap_err().contains("not a non-negative integer"));
    }

    /// What a parse that succeeded must satisfy: one range per dimension, inside the shape.
    fn within_shape(subset: &ArraySubset, shape: &[u64]) -> bool {
        subset.dimensionality() == shape.len()
            && subset.to_ranges().iter().zip(shape).all(|(r, &n)| r.start <= r.end && r.end <= n)
    }

    /// Shapes with extents anywhere in u64, edges weighted.
    fn shapes() -> impl Strategy<Value = Vec<u64>> {
        proptest::collection::vec(
            prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(1 << 63), any::<u64>(), 0..64u64],
            0..5,
        )
    }

    /// Text that is mostly a subset: numbers (edges included), colons, commas, spaces, junk.
    fn specs() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            Just(":".to_string()),
            Just(",".to_string()),
            Just(" ".to_string()),
            Just("-".to_string()),
            Just("18446744073709551615".to_string()),
            Just("18446744073709551616".to_string()),
            Just("99999999999999999999999".to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            (0..70u64).prop_map(|n| n.to_string()),
            "[a-z+.]{1,2}",
        ];
        proptest::collection::vec(token, 0..12).prop_map(|t| t.concat())
    }

    proptest! {
        #[test]
        fn random_text_never_panics(spec in "\\PC{0,40}", shape in shapes()) {
            if let Ok(subset) = parse_subset(&spec, &shape) {
                prop_assert!(within_shape(&subset, &shape), "{spec:?} {shape:?}: {subset:?}");
            }
        }

        #[test]
        fn mutated_subsets_never_panic_and_stay_in_bounds(spec in specs(), shape in shapes()) {
            if let Ok(subset) = parse_subset(&spec, &shape) {
                prop_assert!(within_shape(&subset, &shape), "{spec:?} {shape:?}: {subset:?}");
            }
        }

        #[test]
        fn written_subsets_parse_back(shape in proptest::collection::vec(1..u64::MAX, 1..5), cut in any::<u64>()) {
            // Each dimension as a:b, a lone index or ':', inside the shape: parses to exactly that.
            let ranges: Vec<std::ops::Range<u64>> = shape.iter().enumerate().map(|(d, &n)| {
                let a = cut.rotate_left(d as u32 * 13) % n;
                match d % 3 { 0 => a..n, 1 => a..a + 1, _ => 0..n }
            }).collect();
            let spec: Vec<String> = ranges.iter().enumerate().map(|(d, r)| match d % 3 {
                0 => format!("{}:{}", r.start, r.end), 1 => r.start.to_string(), _ => ":".to_string(),
            }).collect();
            let parsed = parse_subset(&spec.join(","), &shape).map_err(TestCaseError::fail)?;
            prop_assert_eq!(parsed.to_ranges(), ranges);
        }
    }
}
