//! Sharded arrays (`sharding_indexed`, nested too) on the device: each shard's index is read with
//! a partial read (start or end of the shard, decoded on the host with its own codecs, crc32c
//! included; kept between reads in a [`ShardIndexCache`] the caller holds), and every inner
//! chunk that meets the subset becomes a decode unit: its byte range in the shard file, or
//! missing. Each unit carries the version of the shard's value its index came from (a
//! `GdsStore` file's `fstat`, an object's ETag), which the read of its bytes checks: a shard
//! replaced in between is read again from its new index ([`replanned_once`]), never through the
//! old one's offsets.
//!
//! The sharded read (`read`: units from indexes, `index`: reading and checking one index), the
//! sharded write's layout (`encode`), the geometry both share (`level`) and the fuzzing hooks
//! (`fuzz`).
//!
//! [`replanned_once`]: crate::pipeline::units::replanned_once

mod encode;
mod fuzz;
mod index;
mod level;
mod read;

pub(crate) use encode::encode_shards;
#[cfg(test)]
pub(crate) use encode::nested_origins;
pub use fuzz::{fuzz_shard_index_entry, fuzz_shard_index_len};
pub(crate) use level::ShardLevel;
pub(crate) use read::{sharded_units, ShardSource};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod consistency_tests;
