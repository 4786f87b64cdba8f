//! `blosc`: the Blosc1 chunks of zarr-python 2's default compressor and the v3 `blosc` codec:
//! its registration, the host check of its chunks ([`header`]: every block start and stream
//! checked against the chunk and its expected size, each stream as a chunk of its own codec),
//! its device codec (each stream one item of nvCOMP's batch, then one kernel that assembles the
//! blocks and undoes the shuffle) and its kernels.

mod device;
pub(crate) mod encode;
pub mod header;
pub(crate) mod kernels;

use std::sync::Arc;

use zarrs::array::codec::BloscCodec;
use zarrs::array::{CodecTraitsV2, CodecTraitsV3};

use crate::codecs::encode::WriteCodec;
use crate::codecs::DeviceCodecPlugin;

inventory::submit! {
    DeviceCodecPlugin::new("blosc", |configuration| Ok(Arc::new(device::Blosc::new(configuration)?)))
        .with_host(<BloscCodec as CodecTraitsV3>::create, <BloscCodec as CodecTraitsV2>::create)
        .with_encoder(|configuration, elem| {
            encode::BloscWrite::from_configuration(configuration, elem).map(WriteCodec::Blosc)
        })
        .with_description(
            "our LZ4 decoder for lz4 and lz4hc streams (any input an error at worst), zstd streams as the zstd codec \
             routes frames (ours unless verified or trusted, then nvCOMP's), nvCOMP's deflate for zlib ones (zlib \
             under gzip's decode trust rule, its Adler-32 verified on the device), after the host checks the chunk's \
             layout (and each zstd or zlib stream); then one kernel assembles the blocks and undoes the shuffle; \
             blosclz and snappy chunks on host threads (c-blosc)",
        )
}

/// Decode one Blosc chunk into `out` with c-blosc, as zarrs' codec does: validated first, then
/// decoded on this thread; its decoded size must be `out`'s length.
fn decode_host(encoded: &[u8], out: &mut [u8]) -> Result<usize, String> {
    let mut nbytes = 0usize;
    // SAFETY: c-blosc reads at most `encoded.len()` bytes and writes the size.
    let valid =
        unsafe { blosc_src::blosc_cbuffer_validate(encoded.as_ptr().cast(), encoded.len(), &raw mut nbytes) } == 0;
    if !valid {
        return Err("not a valid Blosc chunk (c-blosc's validation)".into());
    }
    if nbytes != out.len() {
        return Err(format!("the Blosc chunk holds {nbytes} bytes, {} expected", out.len()));
    }
    // SAFETY: validated above; c-blosc writes at most `out.len()` bytes.
    let written =
        unsafe { blosc_src::blosc_decompress_ctx(encoded.as_ptr().cast(), out.as_mut_ptr().cast(), out.len(), 1) };
    match usize::try_from(written) {
        Ok(n) if n == out.len() => Ok(n),
        _ => Err(format!("c-blosc could not decode the chunk ({written})")),
    }
}
