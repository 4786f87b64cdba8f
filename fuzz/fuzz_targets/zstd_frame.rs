//! `check_frame` never panics, and rejects only what libzstd (one-shot, as zarrs decodes) rejects.
//! The first byte picks the input: the bytes as they are, or the bytes as the body of a frame's
//! one compressed block (to reach the literals and sequences parsers).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::zstd_frame::check_frame;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Some((&size, body)) = rest.split_first() else { return };
    let (frame, n) = if mode & 1 == 0 {
        (body.to_vec(), u64::from(size) * 97)
    } else {
        let word = (body.len() as u32) << 3 | 2 << 1 | 1;
        let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x80, 0, size, 0, 0, 0];
        frame.extend_from_slice(&word.to_le_bytes()[..3]);
        frame.extend_from_slice(body);
        (frame, u64::from(size))
    };
    if let Err(e) = check_frame(&frame, n) {
        let decoded = zstd::bulk::decompress(&frame, n as usize);
        assert!(!matches!(decoded, Ok(out) if out.len() as u64 == n), "we reject what libzstd decodes: {e}");
    }
});
