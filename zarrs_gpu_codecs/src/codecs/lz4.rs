//! `lz4`: raw LZ4 blocks (Blosc's lz4 and lz4hc streams; numcodecs' `lz4` later): their host
//! check ([`block`]: a walk of every sequence that proves a block decodes to its expected length
//! without decoding it), and our device decoder ([`decode`]: a thread block per LZ4 block, a batch in one
//! launch, its CUDA source also run on the CPU for the tests). nvCOMP's batched LZ4 is the
//! family's other decoder (`ZARRS_GPU_LZ4_DECODER`).

pub mod block;
pub mod decode;
