//! The checks on shard indexes (hostile input) never panic. An index entry that passes is a
//! range whose end fits in u64, inside the shard when its length is known and, for an innermost
//! chunk of known decoded size, at most twice that plus 64 KiB; only the all-ones entry is
//! missing. An index size that passes is 16 bytes per inner chunk plus the crc32c's 4.
//!
//! Input: a mode byte. Even: an entry, from four u64 little endian (offset, len, shard length,
//! decoded size), the mode's bits 1 and 2 saying whether the last two are known. Odd: shapes,
//! the dimensionality in bits 1 to 3 (0 to 7), then per dimension an inner and a shard extent,
//! each a byte (small) or, when the mode's bit 4 or 5 is set, a u64 little endian.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::{fuzz_shard_index_entry, fuzz_shard_index_len};

fn u64_at(rest: &mut &[u8], wide: bool) -> Option<u64> {
    if wide {
        let (n, tail) = rest.split_first_chunk::<8>()?;
        *rest = tail;
        Some(u64::from_le_bytes(*n))
    } else {
        let (&n, tail) = rest.split_first()?;
        *rest = tail;
        Some(u64::from(n))
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        let mut next = || u64_at(&mut rest, true);
        let (Some(offset), Some(len), Some(shard_len), Some(decoded)) = (next(), next(), next(), next()) else {
            return;
        };
        let shard_len = (mode & 2 != 0).then_some(shard_len);
        let decoded = (mode & 4 != 0).then_some(decoded);
        match fuzz_shard_index_entry(offset, len, shard_len, decoded) {
            Ok(Some((o, l))) => {
                assert_eq!((o, l), (offset, len));
                let end = o.checked_add(l).expect("the range's end fits in u64");
                assert!(shard_len.is_none_or(|s| end <= s), "{o}+{l} outside {shard_len:?}");
                assert!(decoded.is_none_or(|d| u128::from(l) <= 2 * u128::from(d) + (64 << 10)), "{l} for {decoded:?}");
            }
            Ok(None) => assert_eq!((offset, len), (u64::MAX, u64::MAX)),
            Err(_) => {}
        }
    } else {
        let dims = (mode >> 1) & 7;
        let (mut inner, mut shard) = (Vec::new(), Vec::new());
        for _ in 0..dims {
            let (Some(i), Some(s)) = (u64_at(&mut rest, mode & 16 != 0), u64_at(&mut rest, mode & 32 != 0)) else {
                return;
            };
            inner.push(i);
            shard.push(s);
        }
        if let Ok(len) = fuzz_shard_index_len(&inner, &shard) {
            let entries: u128 = inner.iter().zip(&shard).map(|(&i, &s)| u128::from(s / i)).product();
            assert!(inner.iter().zip(&shard).all(|(&i, &s)| s % i == 0 && s >= i), "{inner:?} {shard:?}");
            assert_eq!(u128::from(len), entries * 16 + 4, "{inner:?} {shard:?}");
        }
    }
});
