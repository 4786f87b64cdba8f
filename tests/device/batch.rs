//! Many subsets read as one request (`retrieve_array_subsets_device`, its stacked form), compared
//! with zarrs' host retrieval of each subset byte for byte: crops overlapping each other and the
//! array's edges, repeated and empty ones, missing chunks, on every kind of chain (zstd,
//! uncompressed, sharded, transposed and big-endian, the host route).

use std::collections::HashSet;
use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{BytesCodec, ShardingIndexLocation, TransposeCodec, TransposeOrder, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBytes, ArraySubset, Endianness};
use zarrs_gpu::{ArrayDeviceExt, DecodePath, GdsStore, GpuConfig, GpuError};

use super::compressed::{make_array, zstd};
use super::sharding::{make_sharded, sharding};
use super::{posix, scheduled, subsets, Result};

/// `n` crops of `crop` (clipped to the array) at random places, some reaching past the edges,
/// the first repeated at the end.
fn crops(shape: &[u64], crop: &[u64], n: usize, seed: u64) -> Vec<ArraySubset> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out: Vec<ArraySubset> = (0..n)
        .map(|_| {
            let ranges: Vec<_> = shape
                .iter()
                .zip(crop)
                .map(|(&s, &c)| {
                    let c = c.min(s);
                    let a = rng.random_range(0..=s - c);
                    a..a + c
                })
                .collect();
            ArraySubset::new_with_ranges(&ranges)
        })
        .collect();
    out.push(out[0].clone());
    out
}

/// Boxes of any shape: the whole array and random ones (`subsets`), an empty one, one element at
/// the far corner.
fn mixed(shape: &[u64], seed: u64) -> Vec<ArraySubset> {
    let mut out = subsets(shape, seed);
    out.insert(2, ArraySubset::new_with_ranges(&shape.iter().map(|&s| s / 2..s / 2).collect::<Vec<_>>()));
    out.push(ArraySubset::new_with_ranges(&shape.iter().map(|&s| s - 1..s).collect::<Vec<_>>()));
    out
}

fn host_bytes(array: &Array<GdsStore>, subset: &ArraySubset) -> Result<Vec<u8>> {
    Ok(array.retrieve_array_subset::<ArrayBytes<'static>>(subset)?.into_fixed()?.into_owned())
}

/// Read `subsets` as one request, as separate arrays and (where they share a shape) stacked, and
/// require each subset's bytes to be zarrs'. Returns the separate read's report.
fn check_many(
    array: &Array<GdsStore>,
    subsets: &[ArraySubset],
    config: &GpuConfig,
) -> Result<zarrs_gpu::RetrieveReport> {
    let want: Vec<Vec<u8>> = subsets.iter().map(|s| host_bytes(array, s)).collect::<Result<_>>()?;
    let (arrays, report) = array.retrieve_array_subsets_device_opt::<DeviceArray<f32>>(subsets, config)?;
    assert_eq!(arrays.len(), subsets.len());
    for (i, (got, subset)) in arrays.iter().zip(subsets).enumerate() {
        assert_eq!(got.shape(), subset.shape(), "subset {i}");
        assert_eq!(got.device_ptr() % 256, 0, "subset {i}: its view is aligned as an allocation");
        assert!(
            got.to_host_bytes()? == want[i],
            "subset {i} {:?}: differs from zarrs' ({report:?})",
            subset.to_ranges()
        );
    }
    if subsets.iter().all(|s| s.shape() == subsets[0].shape()) {
        let (stacked, stacked_report) =
            array.retrieve_array_subsets_stacked_device_opt::<DeviceArray<f32>>(subsets, config)?;
        let mut shape = vec![subsets.len() as u64];
        shape.extend(subsets[0].shape());
        assert_eq!(stacked.shape(), shape.as_slice());
        assert_eq!(stacked_report.chunks, report.chunks);
        assert!(stacked.to_host_bytes()? == want.concat(), "stacked: differs from zarrs' ({stacked_report:?})");
    }
    Ok(report)
}

/// The distinct chunks (grid indices) that `subsets` meet.
fn chunks_met(array: &Array<GdsStore>, subsets: &[ArraySubset]) -> Result<usize> {
    let mut met = HashSet::new();
    for subset in subsets {
        if let Some(grid) = array.chunks_in_array_subset(subset)? {
            met.extend(grid.indices().into_iter().map(|i| i.to_vec()));
        }
    }
    Ok(met.len())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn many_crops_of_zstd_chunks_read_each_chunk_once_and_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [37u64, 70, 45];
    let array =
        make_array(dir.path(), data_type::float32(), (-1.5f32).into(), &shape, &[8, 16, 16], vec![zstd(3, true)])?;
    for (config, name) in [(posix(), "nvCOMP"), (scheduled(), "scheduled")] {
        for seed in 0..3 {
            let crops = crops(&shape, &[12, 30, 20], 9, seed);
            let report = check_many(&array, &crops, &config)?;
            // Each chunk met counts once, however many crops meet it.
            assert_eq!(report.chunks, chunks_met(&array, &crops)?, "{name}: {report:?}");
            assert!(report.missing_chunks > 0, "{name}: the crops meet missing chunks ({report:?})");
        }
        check_many(&array, &mixed(&shape, 4), &config)?;
    }
    let report = check_many(&array, &crops(&shape, &[12, 30, 20], 9, 7), &posix())?;
    assert_eq!(report.decode, DecodePath::Device, "{report:?}");
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn many_crops_of_uncompressed_and_sharded_chunks_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [33u64, 64, 40];
    let raw = make_array(&dir.path().join("raw"), data_type::float32(), 0.5f32.into(), &shape, &[8, 16, 16], vec![])?;
    for seed in 10..13 {
        let crops = crops(&shape, &[9, 40, 17], 7, seed);
        let report = check_many(&raw, &crops, &posix())?;
        assert_eq!(report.chunks, chunks_met(&raw, &crops)?, "{report:?}");
        check_many(&raw, &mixed(&shape, seed), &posix())?;
    }
    for location in [ShardingIndexLocation::End, ShardingIndexLocation::Start] {
        let inner = [4u64, 16, 8];
        let a2b = sharding(&inner, vec![Arc::new(ZstdCodec::new(3, false))], location);
        let sharded = make_sharded(&dir.path().join(format!("s{location:?}")), &shape, &[16, 32, 16], &inner, a2b)?;
        let plain = sharding(&inner, vec![], location);
        let plain = make_sharded(&dir.path().join(format!("p{location:?}")), &shape, &[16, 32, 16], &inner, plain)?;
        for seed in 20..22 {
            for array in [&sharded, &plain] {
                check_many(array, &crops(&shape, &[9, 40, 17], 7, seed), &posix())?;
                check_many(array, &crops(&shape, &[9, 40, 17], 7, seed), &scheduled())?;
                check_many(array, &mixed(&shape, seed), &posix())?;
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn many_crops_of_transposed_big_endian_and_host_route_chunks_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [40u64, 33, 20];
    let inner = [8u64, 16, 8];
    let a2b = zarrs::array::codec::ShardingCodecBuilder::new(
        inner.iter().map(|&n| std::num::NonZeroU64::new(n).unwrap()).collect(),
        &data_type::float32(),
    )
    .array_to_array_codecs(vec![Arc::new(TransposeCodec::new(TransposeOrder::new(&[2, 1, 0])?))])
    .array_to_bytes_codec(Arc::new(BytesCodec::new(Some(Endianness::Big))))
    .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
    .build_arc();
    let gathered = make_sharded(&dir.path().join("t"), &shape, &[16, 32, 16], &inner, a2b)?;
    let report = check_many(&gathered, &crops(&shape, &[10, 20, 9], 6, 30), &posix())?;
    assert_eq!(report.decode, DecodePath::Device, "{report:?}");
    check_many(&gathered, &mixed(&shape, 31), &posix())?;

    // Two transposes in a row have no device plan: zarrs decodes each subset on the host.
    let store = Arc::new(GdsStore::new(dir.path().join("h"))?);
    let transpose =
        || -> Result<Arc<TransposeCodec>> { Ok(Arc::new(TransposeCodec::new(TransposeOrder::new(&[1, 0, 2])?))) };
    let host = zarrs::array::ArrayBuilder::new(shape.to_vec(), vec![8, 16, 8], data_type::float32(), 0.25f32)
        .array_to_array_codecs(vec![transpose()?, transpose()?])
        .bytes_to_bytes_codecs(vec![zstd(3, false)])
        .build(store, "/h")?;
    host.store_metadata()?;
    let values: Vec<f32> = (0..shape.iter().product::<u64>()).map(|i| (i % 977) as f32 * 0.5).collect();
    host.store_array_subset(&host.subset_all(), values)?;
    let report = check_many(&host, &crops(&shape, &[10, 20, 9], 6, 32), &posix())?;
    assert_eq!(report.decode, DecodePath::Host, "{report:?}");
    check_many(&host, &mixed(&shape, 33), &posix())?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stacked_subsets_of_two_shapes_and_out_of_bounds_ones_are_refused_before_reading() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [20u64, 30];
    let array = make_array(dir.path(), data_type::float32(), 0f32.into(), &shape, &[8, 8], vec![zstd(1, false)])?;
    let two = [ArraySubset::new_with_ranges(&[0..4, 0..4]), ArraySubset::new_with_ranges(&[0..4, 0..5])];
    match array.retrieve_array_subsets_stacked_device::<DeviceArray<f32>>(&two) {
        Err(GpuError::Unsupported(reason)) => assert!(reason.contains("subset 1"), "{reason}"),
        other => panic!("two shapes stacked: {other:?}"),
    }
    let outside = [ArraySubset::new_with_ranges(&[0..4, 0..4]), ArraySubset::new_with_ranges(&[18..22, 0..4])];
    assert!(array.retrieve_array_subsets_device::<DeviceArray<f32>>(&outside).is_err());
    assert!(array.retrieve_array_subsets_device::<DeviceArray<i32>>(&two[..1]).is_err(), "the element type is checked");
    assert!(array.retrieve_array_subsets_device::<DeviceArray<f32>>(&[])?.is_empty());
    let none = array.retrieve_array_subsets_stacked_device::<DeviceArray<f32>>(&[])?;
    assert_eq!(none.shape(), &[0, 0, 0]);
    // The views outlive each other in any order and keep their memory alive.
    let mut views = array.retrieve_array_subsets_device::<DeviceArray<f32>>(&crops(&shape, &[5, 7], 4, 40))?;
    let last = views.pop().unwrap();
    drop(views);
    assert_eq!(last.to_host_bytes()?, host_bytes(&array, &crops(&shape, &[5, 7], 4, 40)[4])?);
    Ok(())
}

/// Reads of one array from many threads at once through `CoalescedReads` (issue 28, item 4):
/// each thread's crop equals zarrs' host read of it, the reads that arrive together share one
/// request (each report says how many reads its request served), none fails as a whole, and a
/// crop that is out of bounds is that thread's own error without joining a request (in runs BR to
/// BU it joined, failed the request, and every read was made again alone). The threads start
/// right after a read, within the window, so that the first of them waits for the others however
/// the host schedules them. The engine underneath (`Coalescer`) is checked too, its first request
/// held until the others have queued, without a window.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_from_many_threads_are_gathered_into_requests_and_match_zarrs() -> Result {
    let dir = tempfile::tempdir()?;
    let shape = [40u64, 96, 80];
    let array =
        make_array(dir.path(), data_type::float32(), (-2.0f32).into(), &shape, &[8, 16, 16], vec![zstd(3, false)])?;
    let array = Arc::new(array);
    for (config, name) in [(posix(), "nvCOMP"), (scheduled(), "scheduled")] {
        let mut all = crops(&shape, &[12, 40, 30], 23, 50);
        let want: Vec<Vec<u8>> = all.iter().map(|s| host_bytes(&array, s)).collect::<Result<_>>()?;
        all.push(ArraySubset::new_with_ranges(&[30..44, 0..8, 0..8])); // past the edge: an error
        let window = std::time::Duration::from_secs(1);
        let reads = zarrs_gpu::CoalescedReads::<_, DeviceArray<f32>>::new(
            Arc::clone(&array),
            config.clone().with_coalesce_window(Some(window)),
        );
        // A lone read: no wait (the window counts from a request's end).
        let start = std::time::Instant::now();
        let (_, report) = reads.retrieve_array_subset_device(&all[0])?;
        assert!(start.elapsed() < window, "{name}: a lone read waited {:?}", start.elapsed());
        assert_eq!(report.coalesced_reads, 1);
        let served = on_threads(&all, |subset| {
            let (data, report) = reads.retrieve_array_subset_device(subset)?;
            Ok((data.to_host_bytes()?, report.coalesced_reads))
        });
        let (bad, served) = served.split_last().expect("crops");
        assert!(bad.is_err(), "{name}: the crop past the edge read");
        let mut sizes = Vec::new();
        for (i, result) in served.iter().enumerate() {
            let (got, n) = result.as_ref().map_err(|e| format!("{name}: crop {i}: {e}"))?;
            assert!(*got == want[i], "{name}: crop {i} {:?} differs from zarrs'", all[i].to_ranges());
            sizes.push(*n);
        }
        assert_eq!(reads.failures(), (0, None), "{name}: requests of several reads failed");
        assert_eq!(sizes, vec![24; 24], "{name}: the 24 crops' threads shared one request");
        // The engine, its first request held until every other thread has had time to queue.
        let coalescer = zarrs_gpu::zarrs_gpu_codecs::Coalescer::new(std::time::Duration::ZERO);
        let first = std::sync::atomic::AtomicBool::new(true);
        let many = |subsets: &[ArraySubset]| {
            if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            let (arrays, _) = array.retrieve_array_subsets_device_opt::<DeviceArray<f32>>(subsets, &config)?;
            Ok::<_, GpuError>(arrays)
        };
        let shared = on_threads(&all[..all.len() - 1], |subset| {
            let (data, n) = coalescer.read(subset.clone(), many)?;
            Ok((data.to_host_bytes()?, n))
        });
        let mut sizes = Vec::new();
        for (i, result) in shared.iter().enumerate() {
            let (got, n) = result.as_ref().map_err(|e| format!("{name}: shared crop {i}: {e}"))?;
            assert!(*got == want[i], "{name}: shared crop {i} {:?} differs from zarrs'", all[i].to_ranges());
            sizes.push(*n);
        }
        assert_eq!(coalescer.failures(), (0, None), "{name}: the engine's requests failed");
        // The first read starts at once (the engine idle); the others gather while it runs. Which
        // threads make it into the first request is the scheduler's: one, or a few that arrive in
        // the same instant. Each request of k reads is seen by its k readers.
        sizes.sort_unstable();
        let mut requests = Vec::new();
        let mut rest = sizes.as_slice();
        while let Some(&k) = rest.first() {
            assert!(k >= 1 && rest.len() >= k && rest[..k].iter().all(|&n| n == k), "{name}: sizes {sizes:?}");
            requests.push(k);
            rest = &rest[k..];
        }
        assert!(
            requests.len() <= 3 && requests.iter().max().is_some_and(|&k| k >= 20),
            "{name}: 24 reads gathered into requests of {requests:?}"
        );
    }
    Ok(())
}

/// `read` of each subset, each on its own thread, the threads started together; results in order.
fn on_threads<R: Send>(
    subsets: &[ArraySubset],
    read: impl Fn(&ArraySubset) -> std::result::Result<R, GpuError> + Sync,
) -> Vec<std::result::Result<R, GpuError>> {
    let barrier = std::sync::Barrier::new(subsets.len());
    std::thread::scope(|s| {
        let handles: Vec<_> = subsets
            .iter()
            .map(|subset| {
                let (barrier, read) = (&barrier, &read);
                s.spawn(move || {
                    barrier.wait();
                    read(subset)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect()
    })
}
