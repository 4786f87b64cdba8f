//! Device retrieval compared with zarrs' host retrieval, byte for byte: one test binary (GPU
//! test binaries travel to the GPU host, so there are few). GPU tests are
//! `#[ignore = "needs a CUDA GPU"]`.

mod compressed;
mod retrieval;
mod sharding;
