//! `check_member` never panics, sends to the device only plain members whose trailer has the
//! chunk's size, and sends there every plain member flate2 decodes to the chunk's size.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::gzip_member::{check_member, MemberVerdict};

fuzz_target!(|data: &[u8]| {
    let Some((&size, member)) = data.split_first() else { return };
    let n = u64::from(size) * 13;
    let verdict = check_member(member, n);
    if let MemberVerdict::Device { crc32 } = verdict {
        assert_eq!(&member[..3], &[0x1F, 0x8B, 8]);
        let t = &member[member.len() - 8..];
        assert_eq!(u32::from_le_bytes([t[0], t[1], t[2], t[3]]), crc32);
        assert_eq!(u64::from(u32::from_le_bytes([t[4], t[5], t[6], t[7]])), n);
    }
    // bufread: after the member, the reader holds exactly the bytes that follow it.
    let mut decoder = flate2::bufread::GzDecoder::new(member);
    let mut out = Vec::new();
    if decoder.read_to_end(&mut out).is_ok() && out.len() as u64 == n && n > 0 {
        let whole = decoder.into_inner().is_empty();
        if whole && member[3] & !1 == 0 {
            assert!(matches!(verdict, MemberVerdict::Device { .. }), "{verdict:?}");
        }
    }
});
