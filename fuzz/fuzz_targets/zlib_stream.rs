//! `check_stream` never panics and agrees with zlib (flate2, as zarrs' codec calls it): a stream
//! it rejects, zlib does not decode either; one it sends to the device carries its trailer's
//! Adler-32; every stream zlib decodes to the chunk's size, with nothing after it and no longer
//! than the device takes, goes to the device.
//!
//! Input: the chunk's size / 13 (one byte), then the stream.
#![no_main]

use std::io::Read;

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::zlib_stream::{check_stream, payload_bound, StreamVerdict};

fuzz_target!(|data: &[u8]| {
    let Some((&size, stream)) = data.split_first() else { return };
    let n = u64::from(size) * 13;
    let verdict = check_stream(stream, n);
    let mut decoder = flate2::bufread::ZlibDecoder::new(stream);
    let mut out = Vec::new();
    let decoded = decoder.read_to_end(&mut out).is_ok();
    match verdict {
        Err(err) => assert!(!decoded, "{err}, but zlib decodes {} bytes", out.len()),
        Ok(StreamVerdict::Device { adler32 }) => {
            let t = &stream[stream.len() - 4..];
            assert_eq!(adler32, u32::from_be_bytes([t[0], t[1], t[2], t[3]]));
        }
        Ok(StreamVerdict::Host(_)) => {}
    }
    // bufread: after the stream, the reader holds exactly the bytes that follow it.
    let whole = decoded && out.len() as u64 == n && n > 0 && decoder.into_inner().is_empty();
    if whole && stream.len() as u64 - 6 <= payload_bound(n) {
        assert!(matches!(verdict, Ok(StreamVerdict::Device { .. })), "{verdict:?}");
    }
});
