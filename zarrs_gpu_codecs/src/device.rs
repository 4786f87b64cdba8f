//! What each device holds across reads: its state ([`context`]: the CUDA context, the read
//! engine, whether the context is lost), its memory pools ([`pool`]), its kernels ([`kernels`]),
//! the guard that gives a caller's thread its own current context back ([`current_context`]),
//! and the pinned buffers through which codecs copy their tables ([`upload`]).

pub(crate) mod context;
pub(crate) mod current_context;
pub(crate) mod kernels;
pub(crate) mod pool;
pub(crate) mod upload;
