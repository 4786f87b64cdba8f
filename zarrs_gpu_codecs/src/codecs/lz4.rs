//! `lz4`: raw LZ4 blocks (Blosc's lz4 and lz4hc streams; numcodecs' `lz4` later). So far their
//! host check ([`block`]): a walk of every sequence that proves a block decodes to its expected
//! length without decoding it, so that only valid blocks reach nvCOMP.

pub mod block;
