//! Tiles read ahead on a background thread ([`ReadAhead`] over [`tile_subsets`]) and single
//! reads started early ([`read_async`]), compared with zarrs' host retrieval byte for byte. GPU
//! tests are `#[ignore = "needs a CUDA GPU"]`.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::array::{data_type, Array, ArrayBytes, ArraySubset, FillValue};
use zarrs_gpu::zarrs_gpu_codecs::tile_subsets;
use zarrs_gpu::zarrs_gpu_codecs::TileOrder;
use zarrs_gpu::{read_async, DecodePath, GdsStore, ReadAhead};

use super::compressed::{make_array, zstd};
use super::{posix, Result};

/// zarrs' host bytes of `subset`.
fn host_bytes(array: &Array<GdsStore>, subset: &ArraySubset) -> Result<Vec<u8>> {
    Ok(array.retrieve_array_subset::<ArrayBytes<'static>>(subset)?.into_fixed()?.into_owned())
}

/// An odd-shaped zstd array whose every fifth chunk is missing.
fn odd_array(dir: &std::path::Path) -> Result<Arc<Array<GdsStore>>> {
    let (shape, chunks) = ([37u64, 70, 45], [8u64, 16, 16]);
    let array = make_array(dir, data_type::float32(), FillValue::from(-7.5f32), &shape, &chunks, vec![zstd(3, false)])?;
    Ok(Arc::new(array))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiles_read_ahead_match_zarrs_in_c_and_random_order() -> Result {
    let dir = tempfile::tempdir()?;
    let array = odd_array(dir.path())?;
    // Tiles that divide neither the shape nor the chunks.
    let tile = [10u64, 24, 20];
    for (order, depth) in [(TileOrder::C, 2), (TileOrder::Random { seed: 3 }, 1), (TileOrder::Random { seed: 4 }, 5)] {
        let tiles = tile_subsets(array.shape(), &tile, order)?;
        assert_eq!(tiles.len(), 4 * 3 * 3);
        let mut missing = 0;
        let mut seen = Vec::new();
        // Reads ahead go in requests of up to `depth` tiles: a report counts its request's chunks.
        let mut grouped = false;
        for (n, read) in ReadAhead::<DeviceArray<f32>>::new(array.clone(), tiles.clone(), posix(), depth).enumerate() {
            let (subset, device, report) = read?;
            assert_eq!(subset, tiles[n], "{order:?}: tile {n} out of order");
            assert_eq!(device.shape(), subset.shape());
            assert_eq!(report.decode, DecodePath::Device, "{report:?}");
            let got = device.to_host_bytes()?;
            assert!(got == host_bytes(&array, &subset)?, "{order:?}: tile {subset} differs from zarrs'");
            missing += report.missing_chunks;
            let own = array.chunks_in_array_subset(&subset)?.map_or(0, |g| g.num_elements_usize());
            assert!(report.chunks >= own, "{order:?}: {report:?}");
            grouped |= report.chunks > own;
            seen.push(subset);
        }
        assert_eq!(seen, tiles, "{order:?}: every tile, once");
        assert_eq!(grouped, depth > 1, "{order:?}, depth {depth}: tiles read in requests of up to {depth}");
        assert!(missing > 0, "{order:?}: no tile met a missing chunk");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_read_ahead_stops_when_dropped_and_ends_at_an_error() -> Result {
    let dir = tempfile::tempdir()?;
    let array = odd_array(dir.path())?;
    let tiles = tile_subsets(array.shape(), &[4, 8, 8], TileOrder::C)?;
    let mut reads = ReadAhead::<DeviceArray<f32>>::new(array.clone(), tiles.clone(), posix(), 2);
    let (subset, device, _) = reads.next().ok_or("no tile")??;
    assert_eq!(subset, tiles[0]);
    assert!(device.to_host_bytes()? == host_bytes(&array, &subset)?);
    // Dropped midway with reads in flight and results queued: the tile taken stays valid.
    drop(reads);
    assert!(device.to_host_bytes()? == host_bytes(&array, &subset)?);

    // An out-of-bounds subset among good ones: the tiles before it, its error, then nothing.
    let subsets = vec![tiles[0].clone(), ArraySubset::new_with_ranges(&[30..40, 0..1, 0..1]), tiles[1].clone()];
    let mut reads = ReadAhead::<DeviceArray<f32>>::new(array.clone(), subsets, posix(), 2);
    assert!(reads.next().ok_or("no tile")?.is_ok());
    assert!(reads.next().ok_or("no error")?.is_err());
    assert!(reads.next().is_none());
    // The wrong element type is an error too, not a panic.
    let mut reads = ReadAhead::<DeviceArray<u16>>::new(array, tiles, posix(), 2);
    assert!(reads.next().ok_or("no error")?.is_err());
    assert!(reads.next().is_none());
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn read_async_matches_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let array = odd_array(dir.path())?;
    let subsets = [ArraySubset::new_with_ranges(&[3..29, 5..70, 0..45]), array.subset_all()];
    let pending: Vec<_> =
        subsets.iter().map(|s| read_async::<DeviceArray<f32>, _>(array.clone(), s.clone(), posix())).collect();
    for (subset, pending) in subsets.iter().zip(pending) {
        let (device, report) = pending.wait()?;
        assert_eq!(device.shape(), subset.shape());
        assert_eq!(report.decode, DecodePath::Device, "{report:?}");
        assert!(device.to_host_bytes()? == host_bytes(&array, subset)?, "{subset} differs from zarrs'");
    }
    let pending =
        read_async::<DeviceArray<f32>, _>(array.clone(), ArraySubset::new_with_ranges(&[0..1, 0..1, 0..1]), posix());
    while !pending.is_done() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (one, _) = pending.wait()?;
    assert!(one.to_host_bytes()? == host_bytes(&array, &ArraySubset::new_with_ranges(&[0..1, 0..1, 0..1]))?);
    // Errors come back from `wait`.
    let out_of_bounds = ArraySubset::new_with_ranges(&[0..38, 0..1, 0..1]);
    assert!(read_async::<DeviceArray<f32>, _>(array, out_of_bounds, posix()).wait().is_err());
    Ok(())
}
