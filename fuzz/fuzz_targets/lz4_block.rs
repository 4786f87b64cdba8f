//! `check_block` never panics, and agrees with both safe decoders: a block it accepts, lz4_flex
//! and LZ4_decompress_safe decode to exactly the expected length; one it calls a restriction,
//! lz4_flex decodes to that length; any other it rejects (but an offset of 0), the reference
//! does not decode to that length.
//!
//! Input: the expected length (u16 little endian), then the block.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs_gpu_codecs::lz4_block::{check_block, Lz4Error};

/// LZ4_decompress_safe with a capacity of `capacity`.
fn reference(block: &[u8], capacity: usize) -> i32 {
    let mut out = vec![0u8; capacity.max(1)];
    // SAFETY: both buffers are valid for the lengths given.
    unsafe {
        lz4_sys::LZ4_decompress_safe(
            block.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            block.len() as i32,
            capacity as i32,
        )
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((n, block)) = data.split_first_chunk::<2>() else { return };
    let n = usize::from(u16::from_le_bytes(*n));
    let flex = lz4_flex::block::decompress_into(block, &mut vec![0; n]).ok();
    match check_block(block, n) {
        Ok(len) => {
            assert_eq!((len, flex), (n, Some(n)));
            assert_eq!(reference(block, n), n as i32);
        }
        Err(Lz4Error::Restriction { .. }) => assert_eq!(flex, Some(n)),
        Err(Lz4Error::Corrupt { what: Lz4Error::ZERO_OFFSET, .. }) => {}
        Err(e) => assert_ne!(reference(block, n), n as i32, "LZ4_decompress_safe decodes what we reject: {e}"),
    }
});
