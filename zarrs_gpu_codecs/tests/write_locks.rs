//! Two writers of one chunk or one shard in one process, through zarrs' host write holding
//! `lock_chunks` (as zarrs_gpu's Python writes of host values and the device writer's host route
//! do): whichever parts of the chunk each changes, neither update is lost. Each writer opens the
//! array on its own store of the same directory (locks name the file, not the store object).

use std::path::Path;
use std::sync::{Arc, Barrier};

use zarrs::array::codec::{ShardingCodecBuilder, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArraySubset};
use zarrs_gds_store::GdsStore;
use zarrs_gpu_codecs::lock_chunks;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Rounds per case: without the locks every one of 20 lost a writer's update.
const ROUNDS: u32 = 20;

/// A u32 array of 64 x 64 in one chunk (or one shard of 4 x 4 inner chunks of 16 x 16), zstd.
fn create(dir: &Path, sharded: bool) -> Result<()> {
    let store = Arc::new(GdsStore::new(dir)?);
    let mut builder = ArrayBuilder::new(vec![64, 64], vec![64, 64], data_type::uint32(), 0u32);
    if sharded {
        let mut sharding =
            ShardingCodecBuilder::new(vec![std::num::NonZeroU64::new(16).expect("nonzero"); 2], &data_type::uint32());
        sharding.bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(1, false))]);
        builder.array_to_bytes_codec(Arc::new(sharding.build()));
    } else {
        builder.bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(1, false))]);
    }
    builder.build(store, "/")?.store_metadata()?;
    Ok(())
}

fn open(dir: &Path) -> Result<Array<GdsStore>> {
    Ok(Array::open(Arc::new(GdsStore::new(dir)?), "/")?)
}

/// Round `round`'s values of writer `w` for `subset`: nonzero, and another for each round.
fn values(round: u32, w: u32, subset: &ArraySubset) -> Vec<u32> {
    (0..subset.num_elements()).map(|j| (round << 20) + (w << 16) + j as u32 + 1).collect()
}

/// Two threads write `parts` (one each) of the array's one chunk at once, `ROUNDS` times, each
/// holding the locks of the chunks it writes: after each round both parts hold their values.
fn both_land(sharded: bool, parts: &[ArraySubset; 2]) -> Result {
    let dir = tempfile::tempdir()?;
    create(dir.path(), sharded)?;
    let check = open(dir.path())?;
    for round in 0..ROUNDS {
        let start = Barrier::new(2);
        std::thread::scope(|scope| -> Result {
            let writers: Vec<_> = parts
                .iter()
                .zip(0u32..)
                .map(|(part, w)| {
                    let (start, dir) = (&start, dir.path());
                    scope.spawn(move || -> Result {
                        let array = open(dir)?;
                        start.wait();
                        let _locked = lock_chunks(&array, part)?;
                        array.store_array_subset(part, values(round, w, part))?;
                        Ok(())
                    })
                })
                .collect();
            writers.into_iter().try_for_each(|w| w.join().expect("a writer panicked"))
        })?;
        for (part, w) in parts.iter().zip(0u32..) {
            let got: Vec<u32> = check.retrieve_array_subset(part)?;
            assert!(got == values(round, w, part), "sharded {sharded}, round {round}: writer {w}'s update was lost");
        }
    }
    Ok(())
}

#[test]
fn two_writers_of_different_inner_chunks_of_one_shard_both_land() -> Result {
    // Inner chunks [0, 0] and [3, 3] of the one shard.
    both_land(true, &[ArraySubset::new_with_ranges(&[0..16, 0..16]), ArraySubset::new_with_ranges(&[48..64, 48..64])])
}

#[test]
fn two_writers_of_two_halves_of_one_chunk_both_land() -> Result {
    both_land(false, &[ArraySubset::new_with_ranges(&[0..32, 0..64]), ArraySubset::new_with_ranges(&[32..64, 0..64])])
}
