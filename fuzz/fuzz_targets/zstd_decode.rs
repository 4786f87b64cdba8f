//! Our device zstd kernels' code, run on the CPU (the block-parallel decoder, and the one-warp
//! decoder, which must accept the same frames with the same bytes), never reads or writes outside
//! its buffers, and agrees with libzstd: a frame it decodes (its content checksum, where it has one, verified as
//! the pipeline does) libzstd decodes to the same bytes; one libzstd rejects, it rejects.
//!
//! Input: a mode byte (0: the rest is the frame; otherwise the rest is raw data, compressed here
//! at level `mode % 23 - 3` with a checksum when the mode is odd, then one byte of it changed at
//! the position the data's first two bytes give), the expected length (u16 little endian) where
//! the rest is a frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::zstd_decode::{decode_on_host, HostPath, OK};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (frame, n) = if mode == 0 {
        let Some((n, frame)) = rest.split_first_chunk::<2>() else { return };
        (frame.to_vec(), usize::from(u16::from_le_bytes(*n)))
    } else {
        let Ok(mut c) = zstd::bulk::Compressor::new(i32::from(mode % 23) - 3) else { return };
        let _ = c.include_checksum(mode % 2 == 1);
        let Ok(mut frame) = c.compress(rest) else { return };
        if let [a, b, ..] = rest {
            let at = usize::from(u16::from_le_bytes([*a, *b])) % frame.len();
            frame[at] ^= mode;
        }
        (frame, rest.len())
    };
    // Guard bytes after the output the kernel is given.
    let mut out = vec![0xA5u8; n + 32];
    let [(status, decoded)] = decode_on_host(&mut [(&frame, &mut out[..n])], HostPath::Jump)[..] else { unreachable!() };
    assert!(out[n..].iter().all(|&b| b == 0xA5), "the kernel wrote past the output");
    assert!(decoded <= n as u64);
    for path in [HostPath::Execute, HostPath::OneWarp] {
        let mut theirs = vec![0xA5u8; n + 32];
        let [(their_status, _)] = decode_on_host(&mut [(&frame, &mut theirs[..n])], path)[..] else { unreachable!() };
        assert!(theirs[n..].iter().all(|&b| b == 0xA5), "{path:?} wrote past the output");
        assert_eq!(status == OK, their_status == OK, "the decoders disagree ({path:?})");
        if status == OK {
            assert!(out[..n] == theirs[..n], "{path:?} decoded other bytes");
        }
    }
    out.truncate(n);
    let mut theirs = vec![0u8; n];
    let libzstd = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(&frame, &mut theirs))
        .is_ok_and(|len| len == n);
    let checked = frame.len() > 4 && frame[4] & 4 != 0;
    let ours = status == OK
        && (!checked || {
            let stored = u32::from_le_bytes(frame[frame.len() - 4..].try_into().expect("4 bytes"));
            twox_hash::XxHash64::oneshot(0, &out) as u32 == stored
        });
    if ours {
        assert!(libzstd && out == theirs, "ours decodes a frame libzstd rejects or decodes otherwise");
    }
});
