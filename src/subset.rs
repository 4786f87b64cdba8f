//! numpy's basic indexing, in one place for the command line (`--subset 0:64,:`), the Python
//! package's `Array.read("0:64, :")` and `array[0:64, :]`: integers, `start:stop` slices
//! (clamped to the dimension, as numpy's are; a slice whose stop is not after its start selects
//! nothing) and one `...`.

use std::ops::Range;

use zarrs::array::ArraySubset;

/// One item of a numpy-style index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexItem {
    /// An integer (negative: from the end): one position, its dimension dropped from the result.
    Index(i128),
    /// `start:stop:step`, each optional (negative: from the end). Only steps of 1 are read.
    Slice {
        /// Where the slice starts (None: 0).
        start: Option<i128>,
        /// Where it stops, excluded (None: the dimension's extent).
        stop: Option<i128>,
        /// The step (None: 1).
        step: Option<i128>,
    },
    /// `...`: as many whole dimensions as the other items leave.
    Ellipsis,
}

/// What an index selects: a box of the array, and the result's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// One range per dimension of the array (empty ranges select nothing).
    pub ranges: Vec<Range<u64>>,
    /// The result's shape: the box's, less the dimensions that integers dropped.
    pub shape: Vec<u64>,
}

/// What `items` select of an array of `shape`, by numpy's rules: slices clamp to the dimension
/// (`0:1000` of 10 is `0:10`, `3:3` and `5:2` are empty), negative numbers count from the end,
/// missing trailing dimensions are whole.
///
/// # Errors
/// Returns numpy's message for an integer outside its dimension, more indices than dimensions,
/// more than one `...`; and says that steps other than 1 are not supported.
pub fn select(items: &[IndexItem], shape: &[u64]) -> Result<Selection, String> {
    let ellipses = items.iter().filter(|i| **i == IndexItem::Ellipsis).count();
    if ellipses > 1 {
        return Err("an index can only have a single ellipsis ('...')".into());
    }
    let indexed = items.len() - ellipses;
    if indexed > shape.len() {
        return Err(format!(
            "too many indices for array: array is {}-dimensional, but {indexed} were indexed",
            shape.len()
        ));
    }
    let mut selection = Selection { ranges: Vec::with_capacity(shape.len()), shape: Vec::new() };
    let mut dim = 0usize;
    for item in items {
        match *item {
            IndexItem::Ellipsis => {
                for &size in &shape[dim..dim + shape.len() - indexed] {
                    selection.ranges.push(0..size);
                    selection.shape.push(size);
                }
                dim += shape.len() - indexed;
            }
            IndexItem::Index(index) => {
                selection.ranges.push(position(index, dim, shape[dim])?);
                dim += 1;
            }
            IndexItem::Slice { start, stop, step } => {
                let range = clamp(start, stop, step, dim, shape[dim])?;
                selection.shape.push(range.end - range.start);
                selection.ranges.push(range);
                dim += 1;
            }
        }
    }
    for &size in &shape[dim..] {
        selection.ranges.push(0..size);
        selection.shape.push(size);
    }
    Ok(selection)
}

/// An integer index of dimension `dim` (of `size`) as its one-element range.
fn position(index: i128, dim: usize, size: u64) -> Result<Range<u64>, String> {
    let i = if index < 0 { index.saturating_add(i128::from(size)) } else { index };
    match u64::try_from(i) {
        Ok(i) if i < size => Ok(i..i + 1),
        _ => Err(format!("index {index} is out of bounds for axis {dim} with size {size}")),
    }
}

/// A slice of dimension `dim` (of `size`) as its range, clamped as numpy's `slice.indices`.
#[allow(clippy::similar_names)] // start, stop, step: a slice's own names
fn clamp(
    start: Option<i128>,
    stop: Option<i128>,
    step: Option<i128>,
    dim: usize,
    size: u64,
) -> Result<Range<u64>, String> {
    match step {
        None | Some(1) => {}
        Some(0) => return Err(format!("dimension {dim}: slice step cannot be zero")),
        Some(step) => return Err(format!("dimension {dim}: steps are not supported (step {step})")),
    }
    let n = i128::from(size);
    let bound = |v: Option<i128>, default: i128| {
        let v = v.map_or(default, |v| if v < 0 { v.saturating_add(n) } else { v });
        // Within 0..=size, so it fits u64.
        v.clamp(0, n) as u64
    };
    let start = bound(start, 0);
    // A stop before the start selects nothing, from the start.
    let stop = bound(stop, n).max(start);
    Ok(start..stop)
}

/// A subset written as numpy-style slices, one per dimension, separated by commas, as its index
/// items: `0:64,:,100:`, `-16:`, `5`, `...,0:8`, `0:1,` (one trailing comma, as numpy allows).
/// An empty text is the whole array; numbers too large for 128 bits saturate (they clamp like
/// any bound past the end).
///
/// # Errors
/// Returns a message naming the part that is empty (`,`, `0:1,,:`: numpy's syntax errors; `:`
/// is a whole dimension), or not an integer or a slice.
pub fn parse_index(spec: &str) -> Result<Vec<IndexItem>, String> {
    if spec.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut parts: Vec<&str> = spec.split(',').map(str::trim).collect();
    // numpy's `a[0:1,]` is `a[0:1]`: one trailing comma is dropped, and only after an item.
    if parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(at, part)| {
            let pieces: Vec<&str> = part.split(':').map(str::trim).collect();
            let optional = |s: &str| if s.is_empty() { Ok(None) } else { number(s, at).map(Some) };
            match pieces.as_slice() {
                [""] => Err(format!(
                    "index part {at} of {spec:?} is empty (numpy refuses it; write : for a whole dimension)"
                )),
                ["..."] => Ok(IndexItem::Ellipsis),
                [index] => number(index, at).map(IndexItem::Index),
                [a, b] => Ok(IndexItem::Slice { start: optional(a)?, stop: optional(b)?, step: None }),
                [a, b, c] => Ok(IndexItem::Slice { start: optional(a)?, stop: optional(b)?, step: optional(c)? }),
                _ => Err(format!("index part {at}: {part:?} is not a slice (start:stop)")),
            }
        })
        .collect()
}

/// An integer of any sign, saturated to i128 (u64 values and their negatives all fit).
fn number(s: &str, at: usize) -> Result<i128, String> {
    use std::num::IntErrorKind;
    s.parse::<i128>().or_else(|e| match e.kind() {
        IntErrorKind::PosOverflow => Ok(i128::MAX),
        IntErrorKind::NegOverflow => Ok(i128::MIN),
        _ => Err(format!("index part {at}: {s:?} is not an integer")),
    })
}

/// Parse a subset written as numpy-style slices ([`parse_index`]) and select it from an array of
/// `shape` ([`select`]): the box it reads. An integer keeps its dimension (of extent 1) in the
/// box; slices clamp to the array; an empty slice is an empty subset.
///
/// # Errors
/// As [`parse_index`] and [`select`].
pub fn parse_subset(spec: &str, shape: &[u64]) -> Result<ArraySubset, String> {
    let selection = select(&parse_index(spec)?, shape)?;
    Ok(ArraySubset::new_with_ranges(&selection.ranges))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `spec` selected from `shape`: its box and its result's shape.
    fn sel(spec: &str, shape: &[u64]) -> (Vec<Range<u64>>, Vec<u64>) {
        let s = select(&parse_index(spec).unwrap(), shape).unwrap();
        (s.ranges, s.shape)
    }

    #[test]
    fn slices_clamp_and_select_as_numpy_does() {
        // Each result shape is numpy's for `np.zeros((10, 20, 30))[spec]`.
        type Case<'a> = (&'a str, &'a [Range<u64>], &'a [u64]);
        let shape = [10u64, 20, 30];
        let cases: &[Case] = &[
            ("0:1000", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            ("3:3", &[3..3, 0..20, 0..30], &[0, 20, 30]),
            ("5:2", &[5..5, 0..20, 0..30], &[0, 20, 30]),
            ("-5:", &[5..10, 0..20, 0..30], &[5, 20, 30]),
            ("-100:100", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            (":-100", &[0..0, 0..20, 0..30], &[0, 20, 30]),
            ("-3:-1", &[7..9, 0..20, 0..30], &[2, 20, 30]),
            ("7:-5", &[7..7, 0..20, 0..30], &[0, 20, 30]),
            ("100:", &[10..10, 0..20, 0..30], &[0, 20, 30]),
            ("-15:-12", &[0..0, 0..20, 0..30], &[0, 20, 30]),
            ("-1", &[9..10, 0..20, 0..30], &[20, 30]),
            ("0", &[0..1, 0..20, 0..30], &[20, 30]),
            ("...,0:8", &[0..10, 0..20, 0..8], &[10, 20, 8]),
            ("2,...", &[2..3, 0..20, 0..30], &[20, 30]),
            ("1,...,3", &[1..2, 0..20, 3..4], &[20]),
            ("...", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            ("", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            (":,:,:", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            ("0:10:1", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            ("::1", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            ("::", &[0..10, 0..20, 0..30], &[10, 20, 30]),
            ("9:10,19,-30:1", &[9..10, 19..20, 0..1], &[1, 1]),
            ("10:10,:0,30:", &[10..10, 0..0, 30..30], &[0, 0, 0]),
            ("1:2,", &[1..2, 0..20, 0..30], &[1, 20, 30]),
            (" 0 : 4 , : , -2: ", &[0..4, 0..20, 28..30], &[4, 20, 2]),
        ];
        for &(spec, ranges, result) in cases {
            assert_eq!(sel(spec, &shape), (ranges.to_vec(), result.to_vec()), "{spec:?}");
        }
        // A zero extent: every slice is empty, every integer out of bounds.
        let empty: Range<u64> = 0..0;
        assert_eq!(sel("-5:5", &[0]), (vec![empty], vec![0]));
        assert!(parse_subset("0", &[0]).unwrap_err().contains("index 0 is out of bounds for axis 0 with size 0"));
        // A 0-d array: only an empty index or `...`.
        assert_eq!(sel("...", &[]), (vec![], vec![]));
        assert!(parse_subset("0", &[]).unwrap_err().contains("array is 0-dimensional, but 1 were indexed"));
    }

    #[test]
    fn parses_slices() {
        let s = parse_subset("0:64, :,100:", &[512, 2048, 2048]).unwrap();
        assert_eq!(s.to_ranges(), vec![0..64, 0..2048, 100..2048]);
        assert_eq!(parse_subset("", &[4, 5]).unwrap().to_ranges(), vec![0..4, 0..5]);
        assert_eq!(parse_subset("3", &[4, 5]).unwrap().to_ranges(), vec![3..4, 0..5]);
        assert_eq!(parse_subset("1:2,", &[4, 5]).unwrap().to_ranges(), vec![1..2, 0..5]);
        // A stop past the end clamps; a reversed slice is empty (numpy's `a[0:5]`, `a[3:2]`).
        assert_eq!(parse_subset("0:5", &[4]).unwrap().to_ranges(), vec![0..4]);
        assert_eq!(parse_subset("3:2", &[4]).unwrap().to_ranges(), vec![3..3]);
        assert!(parse_subset("a:1", &[4]).unwrap_err().contains("\"a\" is not an integer"));
        assert!(parse_subset(":,:,:", &[4, 4]).unwrap_err().contains("3 were indexed"));
        // Indices at u64's end: errors, never an overflow.
        let max = u64::MAX;
        assert!(parse_subset("18446744073709551615", &[max])
            .unwrap_err()
            .contains("index 18446744073709551615 is out of bounds for axis 0 with size 18446744073709551615"));
        assert!(parse_subset("18446744073709551615,:", &[1 << 63, 64])
            .unwrap_err()
            .contains("out of bounds for axis 0 with size 9223372036854775808"));
        assert_eq!(parse_subset("18446744073709551614", &[max]).unwrap().to_ranges(), vec![max - 1..max]);
        assert_eq!(parse_subset(":18446744073709551615", &[max]).unwrap().to_ranges(), vec![0..max]);
        assert_eq!(parse_subset("0:18446744073709551615", &[1 << 63]).unwrap().to_ranges(), vec![0..1 << 63]);
        assert!(parse_subset("18446744073709551616", &[max]).unwrap_err().contains("out of bounds"));
        // Beyond 128 bits: saturated, so clamped like any other bound.
        let huge = "9".repeat(60);
        assert_eq!(parse_subset(&format!("-{huge}:{huge}"), &[7]).unwrap().to_ranges(), vec![0..7]);
        assert!(parse_subset(&huge, &[7]).unwrap_err().contains("out of bounds for axis 0 with size 7"));
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
        assert!(parse_subset("0:10:2", &shape).unwrap_err().contains("steps are not supported (step 2)"));
        assert!(parse_subset("::-1", &shape).unwrap_err().contains("steps are not supported (step -1)"));
        assert!(parse_subset("::0", &shape).unwrap_err().contains("slice step cannot be zero"));
        assert!(parse_subset("-11", &shape)
            .unwrap_err()
            .contains("index -11 is out of bounds for axis 0 with size 10"));
        assert!(parse_subset("0,20", &shape)
            .unwrap_err()
            .contains("index 20 is out of bounds for axis 1 with size 20"));
        assert!(parse_subset("...,...", &shape).unwrap_err().contains("single ellipsis"));
        assert!(parse_subset("1:2:3:4", &shape).unwrap_err().contains("not a slice"));
    }

    /// numpy's `a[,]`, `a[0:1,,:]` and `a[0:1,,]` are syntax errors, `a[0:1,]` is `a[0:1]`: an
    /// empty part was read as a whole dimension.
    #[test]
    fn empty_parts_are_refused_and_one_trailing_comma_is_not() {
        let shape = [10u64, 20, 30];
        for (spec, at) in [(",", 0), ("0:1,,:", 1), ("0:1,,", 1), (",0", 0), (" , ", 0), ("...,,", 1), (",,", 0)] {
            let err = parse_index(spec).unwrap_err();
            assert!(err.contains(&format!("index part {at} of {spec:?} is empty")), "{spec:?}: {err}");
            assert!(err.contains("write : for a whole dimension"), "{err}");
            assert!(parse_subset(spec, &shape).is_err(), "{spec:?}");
        }
        assert_eq!(parse_subset("0:1,", &shape).unwrap().to_ranges(), vec![0..1, 0..20, 0..30]);
        assert_eq!(parse_subset("0:1, :,", &shape).unwrap().to_ranges(), vec![0..1, 0..20, 0..30]);
        assert_eq!(parse_index("...,").unwrap(), vec![IndexItem::Ellipsis]);
        assert_eq!(parse_index(":").unwrap().len(), 1);
        assert_eq!(parse_index(" ").unwrap(), vec![]);
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
