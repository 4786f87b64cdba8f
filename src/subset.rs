use zarrs::array::ArraySubset;

/// Parse a subset written as numpy-style slices, one per dimension, separated by commas:
/// `0:64,:,100:`, `-16:`, `5`, `...,0:8`. Missing trailing dimensions mean the whole dimension;
/// `...` stands for as many whole dimensions as needed; negative numbers count from the end.
/// An integer keeps its dimension (of extent 1).
///
/// # Errors
/// Returns a message naming the dimension and what is wrong: not an integer, a step (not
/// supported), an index or bound outside the dimension, an empty or reversed slice.
pub fn parse_subset(spec: &str, shape: &[u64]) -> Result<ArraySubset, String> {
    let mut parts: Vec<&str> =
        if spec.trim().is_empty() { Vec::new() } else { spec.split(',').map(str::trim).collect() };
    if let Some(at) = parts.iter().position(|p| *p == "...") {
        if parts.iter().filter(|p| **p == "...").count() > 1 {
            return Err(format!("subset {spec:?} has more than one \"...\""));
        }
        let fill = (shape.len() + 1).saturating_sub(parts.len());
        parts.splice(at..=at, std::iter::repeat_n(":", fill));
    }
    if parts.len() > shape.len() {
        return Err(format!("subset {spec:?} has {} dimensions but the array has {}", parts.len(), shape.len()));
    }
    let mut ranges = Vec::with_capacity(shape.len());
    for (dim, &size) in shape.iter().enumerate() {
        let part = parts.get(dim).copied().filter(|p| !p.is_empty()).unwrap_or(":");
        ranges.push(dimension(part, dim, size)?);
    }
    Ok(ArraySubset::new_with_ranges(&ranges))
}

/// One dimension's part of a subset: `i`, `a:b`, `a:b:1`, with negative numbers from the end.
fn dimension(part: &str, dim: usize, size: u64) -> Result<std::ops::Range<u64>, String> {
    // An integer of any sign, within i128 (u64 values and their negatives all fit).
    let number = |s: &str| -> Result<i128, String> {
        s.trim().parse::<i128>().map_err(|_| format!("dimension {dim}: {:?} is not an integer", s.trim()))
    };
    // A negative number counts from the end.
    let from_end = |v: i128| if v < 0 { v + i128::from(size) } else { v };
    let pieces: Vec<&str> = part.split(':').collect();
    match pieces.as_slice() {
        [index] => {
            let i = from_end(number(index)?);
            if i < 0 || i >= i128::from(size) {
                return Err(format!("dimension {dim}: index {} is out of bounds for size {size}", index.trim()));
            }
            let i = i as u64;
            Ok(i..i + 1)
        }
        [a, b] | [a, b, _] => {
            if let [_, _, step] = pieces.as_slice() {
                if !step.trim().is_empty() && number(step)? != 1 {
                    return Err(format!("dimension {dim}: steps are not supported ({part:?})"));
                }
            }
            let bound = |s: &str, default: u64, what: &str| -> Result<u64, String> {
                if s.trim().is_empty() {
                    return Ok(default);
                }
                let v = from_end(number(s)?);
                if v < 0 || v > i128::from(size) {
                    return Err(format!("dimension {dim}: {what} {} is outside 0..{size}", s.trim()));
                }
                Ok(v as u64)
            };
            let (start, stop) = (bound(a, 0, "start")?, bound(b, size, "stop")?);
            if start > stop {
                return Err(format!(
                    "dimension {dim}: {part:?} selects nothing (start {start} is after stop {stop}); empty subsets are not read"
                ));
            }
            Ok(start..stop)
        }
        _ => Err(format!("dimension {dim}: {part:?} is not a slice (start:stop)")),
    }
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
        assert!(parse_subset("0:5", &[4]).unwrap_err().contains("stop 5 is outside 0..4"));
        assert!(parse_subset("a:1", &[4]).unwrap_err().contains("\"a\" is not an integer"));
        assert!(parse_subset(":,:,:", &[4, 4]).unwrap_err().contains("3 dimensions"));
        assert!(parse_subset("3:2", &[4]).unwrap_err().contains("start 3 is after stop 2"));
        // Indices at u64's end: errors, never an overflow.
        let max = u64::MAX;
        assert!(parse_subset("18446744073709551615", &[max])
            .unwrap_err()
            .contains("index 18446744073709551615 is out of bounds"));
        assert!(parse_subset("18446744073709551615,:", &[1 << 63, 64])
            .unwrap_err()
            .contains("out of bounds for size 9223372036854775808"));
        assert_eq!(parse_subset("18446744073709551614", &[max]).unwrap().to_ranges(), vec![max - 1..max]);
        assert_eq!(parse_subset(":18446744073709551615", &[max]).unwrap().to_ranges(), vec![0..max]);
        assert!(parse_subset("18446744073709551616", &[max]).unwrap_err().contains("out of bounds"));
    }

    #[test]
    fn negative_indices_ellipsis_and_steps_as_numpy_users_write_them() {
        let shape = [10u64, 20, 30];
        assert_eq!(parse_subset("-1", &shape).unwrap().to_ranges(), vec![9..10, 0..20, 0..30]);
        assert_eq!(parse_subset("-4:,:-5", &shape).unwrap().to_ranges(), vec![6..10, 0..15, 0..30]);
        assert_eq!(parse_subset("...,0:8", &shape).unwrap().to_ranges(), vec![0..10, 0..20, 0..8]);
        assert_eq!(parse_subset("2,...", &shape).unwrap().to_ranges(), vec![2..3, 0..20, 0..30]);
        assert_eq!(parse_subset("1,...,3", &shape).unwrap().to_ranges(), vec![1..2, 0..20, 3..4]);
        assert_eq!(parse_subset("0:10:1", &shape).unwrap().to_ranges(), vec![0..10, 0..20, 0..30]);
        assert!(parse_subset("0:10:2", &shape).unwrap_err().contains("steps are not supported"));
        assert!(parse_subset("-11", &shape).unwrap_err().contains("index -11 is out of bounds for size 10"));
        assert!(parse_subset("...,...", &shape).unwrap_err().contains("more than one"));
        assert!(parse_subset("1:2:3:4", &shape).unwrap_err().contains("not a slice"));
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
