//! `check_chunk` never panics; what it rejects, c-blosc (as zarrs calls it) does not decode to
//! the expected size either (an LZ4 match offset of 0 aside); what it sends to the device has
//! streams that tile every block and lie inside the chunk, and where every stream was checked
//! completely (LZ4, raw or memcpyed), c-blosc decodes it to the expected size.
//!
//! Input: a mode byte, then the chunk. Mode bit 0: the expected size is the header's `nbytes`
//! (else the next byte times 61); bit 1: the header's `cbytes` is set to the chunk's length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs::array::codec::bytes_to_bytes::blosc::{blosc_decompress_bytes, blosc_validate};
use zarrs_gpu_codecs::blosc_header::{check_chunk, BloscChunk, BloscError, BloscVerdict, Compressor, StreamFlaw};
use zarrs_gpu_codecs::lz4_block::Lz4Error;

/// The decoded length c-blosc gives, for sizes up to 1 MiB.
fn host(chunk: &[u8]) -> Option<usize> {
    let n = blosc_validate(chunk).filter(|&n| n <= 1 << 20)?;
    blosc_decompress_bytes(chunk, n, 1).ok().map(|out| out.len())
}

/// Streams inside the chunk, tiling each block in order.
fn layout_holds(chunk: &BloscChunk, len: usize) {
    let blocksize = chunk.header.blocksize as usize;
    let mut streams = chunk.streams.iter().peekable();
    for block in 0..chunk.nblocks {
        let mut at = block * blocksize;
        while let Some(s) = streams.next_if(|s| s.block == block) {
            assert_eq!(s.dst_offset, at);
            assert!(s.src_offset + s.src_len <= len);
            at += s.dst_len;
        }
        assert_eq!(at, block * blocksize + chunk.block_len(block));
    }
    assert!(streams.next().is_none());
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let Some((&size, rest)) = rest.split_first() else { return };
    let mut chunk = rest.to_vec();
    if mode & 2 != 0 && chunk.len() >= 16 {
        let len = (chunk.len() as u32).to_le_bytes();
        chunk[12..16].copy_from_slice(&len);
    }
    let expected = match chunk.get(4..8) {
        Some(n) if mode & 1 != 0 => u64::from(u32::from_le_bytes(n.try_into().unwrap())),
        _ => u64::from(size) * 61,
    };
    let decoded = host(&chunk).map(|n| n as u64);
    match check_chunk(&chunk, expected) {
        Err(BloscError::Stream {
            flaw: StreamFlaw::Lz4(Lz4Error::Corrupt { what: Lz4Error::ZERO_OFFSET, .. }),
            ..
        })
        | Ok(BloscVerdict::Host(_)) => {}
        Err(e) => assert_ne!(decoded, Some(expected), "c-blosc decodes what we reject: {e}"),
        Ok(BloscVerdict::Device(parsed)) => {
            layout_holds(&parsed, chunk.len());
            if parsed.memcpyed || parsed.compressor == Compressor::Lz4 || parsed.streams.iter().all(|s| s.raw) {
                assert_eq!(decoded, Some(expected), "c-blosc rejects what we send to the device");
            }
        }
    }
});
