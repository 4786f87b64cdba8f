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
    }
}
