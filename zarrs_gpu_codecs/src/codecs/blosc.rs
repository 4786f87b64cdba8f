//! `blosc`: the Blosc1 chunks of zarr-python 2's default compressor and the v3 `blosc` codec.
//! So far its host check ([`header`]): every block start and stream of a chunk checked against
//! the chunk and its expected size, each stream checked as a chunk of its own codec, the layout
//! a device decode would follow (its device codec, which hands each stream to nvCOMP, comes next).

pub mod header;
