//! The device pipeline: how a read of chunks (or inner chunks of shards) goes from storage to
//! the output on the device, one stage to a module.
//!
//! - [`route`]: which codec chains the device decodes (`device_plan`), the chunks a subset meets;
//! - [`plan`]: chunk regions to strided copies (pure);
//! - [`request`]: the subsets one retrieval reads, their outputs, their chunks merged (pure);
//! - [`unit`](mod@unit): the units decoded: a chunk, an inner chunk of a shard, or a missing one;
//! - [`units`]: a request's units (`units_of`), each chunk met once;
//! - [`shard`]: shard indexes to units;
//! - [`batch`]: batch planning (pure): budgets, coalesced reads, the host's share;
//! - [`layout`]: every offset of a batch's device metadata (`MetaLayout`);
//! - [`decode`]: the stages of a decoded read, batch by batch (`decode_units`);
//! - [`place`]: the placement and gather kernels, the copy-engine fallback, the fill;
//! - [`output`]: where a read's elements go (a new buffer, allocated meanwhile, or the caller's).

/// Every kernel source of a device context, in the groups `Kernels::load` compiles once per
/// process (reads and writes pass the same).
pub(crate) const KERNELS: &[&[&str]] =
    &[&[place::SOURCE, crate::device::kernels::FAULT_SOURCE], crate::codecs::KERNEL_SOURCES];

pub(crate) mod batch;
pub(crate) mod decode;
pub(crate) mod layout;
pub(crate) mod output;
pub(crate) mod place;
pub mod plan;
pub(crate) mod request;
pub(crate) mod route;
pub(crate) mod shard;
pub(crate) mod unit;
pub(crate) mod units;
