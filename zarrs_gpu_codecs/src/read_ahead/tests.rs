use super::*;
use crate::DeviceArray;
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn ranges(s: &ArraySubset) -> Vec<std::ops::Range<u64>> {
    s.to_ranges()
}

#[test]
fn c_order_covers_the_shape_once_with_edge_tiles_clipped() {
    let shape = [5u64, 7, 3];
    let tiles = tile_subsets(&shape, &[2, 3, 3], TileOrder::C).unwrap();
    assert_eq!(tiles.len(), 3 * 3);
    assert_eq!(ranges(&tiles[0]), [0..2, 0..3, 0..3]);
    assert_eq!(ranges(&tiles[1]), [0..2, 3..6, 0..3]);
    assert_eq!(ranges(&tiles[2]), [0..2, 6..7, 0..3]);
    assert_eq!(ranges(&tiles[3]), [2..4, 0..3, 0..3]);
    assert_eq!(ranges(&tiles[8]), [4..5, 6..7, 0..3]);
    // Every element exactly once.
    let mut seen = vec![0u8; 5 * 7 * 3];
    for tile in &tiles {
        for index in &tile.indices() {
            seen[(index[0] * 21 + index[1] * 3 + index[2]) as usize] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    // Tiles larger than the shape: one tile, the shape.
    let one = tile_subsets(&shape, &[10, u64::MAX, 4], TileOrder::C).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(ranges(&one[0]), [0..5, 0..7, 0..3]);
}

#[test]
fn empty_and_zero_dimensional_shapes() {
    assert!(tile_subsets(&[4, 0], &[2, 2], TileOrder::C).unwrap().is_empty());
    let scalar = tile_subsets(&[], &[], TileOrder::Random { seed: 1 }).unwrap();
    assert_eq!(scalar.len(), 1);
    assert_eq!(scalar[0].dimensionality(), 0);
}

#[test]
fn random_order_is_a_seeded_permutation_of_the_grid() {
    let shape = [37u64, 70, 45];
    let tile = [8u64, 16, 20];
    let c = tile_subsets(&shape, &tile, TileOrder::C).unwrap();
    let a = tile_subsets(&shape, &tile, TileOrder::Random { seed: 7 }).unwrap();
    let b = tile_subsets(&shape, &tile, TileOrder::Random { seed: 7 }).unwrap();
    let other = tile_subsets(&shape, &tile, TileOrder::Random { seed: 8 }).unwrap();
    assert_eq!(a, b, "the same seed, the same order");
    assert_ne!(a, c);
    assert_ne!(a, other);
    let (mut sorted, mut want) = (a.clone(), c.clone());
    sorted.sort();
    want.sort();
    assert_eq!(sorted, want, "the same tiles");
    // The order is fixed by the seed for good (Python and Rust callers, later versions).
    assert_eq!(ranges(&a[0]), ranges(&tile_subsets(&shape, &tile, TileOrder::Random { seed: 7 }).unwrap()[0]));
    // splitmix64's reference output, and the shuffle as written out independently (Python).
    assert_eq!(SplitMix64(0).next(), 0xE220_A839_7B1D_CDAF);
    let mut small: Vec<u32> = (0..10).collect();
    shuffle(&mut small, 0);
    assert_eq!(small, [4, 9, 2, 5, 1, 7, 6, 0, 3, 8]);
}

#[test]
fn random_crops_are_seeded_inside_the_array_and_drawn_as_benches_tiles_py_draws_them() {
    let starts = |extent: &[u64], count, at| -> Vec<Vec<u64>> {
        let crops = random_crops(&[512, 2048, 2048], extent, count, 17, at).unwrap();
        crops.iter().map(|c| c.start().to_vec()).collect()
    };
    // The values benches/tiles.py checks its own draws against (RUST_RANDOM_512 and the others).
    let tile = [64u64, 256, 256];
    assert_eq!(starts(&tile, 3, CropStarts::Anywhere), [[225, 701, 588], [100, 30, 146], [14, 1171, 45]]);
    assert_eq!(starts(&tile, 3, CropStarts::OnGrid), [[256, 768, 512], [64, 0, 0], [0, 1280, 0]]);
    assert_eq!(starts(&[64, 64, 64], 3, CropStarts::OnGrid), [[256, 768, 640], [64, 0, 128], [0, 1280, 0]]);
    // A list is the first crops of a longer one; every crop lies inside, of the extent.
    let many = random_crops(&[37, 70, 45], &[8, 16, 45], 200, 3, CropStarts::Anywhere).unwrap();
    assert_eq!(many[..20], random_crops(&[37, 70, 45], &[8, 16, 45], 20, 3, CropStarts::Anywhere).unwrap());
    assert!(many
        .iter()
        .all(|c| c.shape() == [8, 16, 45] && c.end_exc().iter().zip([37, 70, 45]).all(|(&e, n)| e <= n)));
    assert!(many.iter().any(|c| c.start()[0] % 8 != 0), "starts anywhere");
    let grid = random_crops(&[37, 70, 45], &[8, 16, 45], 50, 3, CropStarts::OnGrid).unwrap();
    assert!(grid.iter().all(|c| c.start()[0] % 8 == 0 && c.start()[1] % 16 == 0 && c.end_exc()[0] <= 32));
    // A crop as large as the array starts at 0; crops that cannot fit are errors.
    assert_eq!(random_crops(&[5, 3], &[5, 3], 2, 1, CropStarts::Anywhere).unwrap()[1].start(), [0, 0]);
    for (shape, extent, at) in [
        (&[5u64, 3][..], &[6u64, 3][..], CropStarts::Anywhere),
        (&[5, 3], &[5], CropStarts::Anywhere),
        (&[5, 3], &[0, 3], CropStarts::OnGrid),
    ] {
        let err = random_crops(shape, extent, 1, 0, at).unwrap_err();
        assert!(matches!(err, GpuError::Unsupported(_)), "{err}");
    }
}

#[test]
fn bad_tile_shapes_are_errors_naming_the_values() {
    let err = tile_subsets(&[4, 4], &[2], TileOrder::C).unwrap_err();
    assert!(matches!(err, GpuError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("[2] has 1 dimensions, the array's shape [4, 4] has 2"), "{err}");
    let err = tile_subsets(&[4, 4], &[2, 0], TileOrder::C).unwrap_err();
    assert!(matches!(err, GpuError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("extent 0 in dimension 1"), "{err}");
    let err = tile_subsets(&[u64::MAX, u64::MAX], &[1, 1], TileOrder::C).unwrap_err();
    assert!(matches!(err, GpuError::Overflow(_)), "{err}");
    assert!(err.to_string().contains("more than 2^64"), "{err}");
    let err = tile_subsets(&[1 << 40, 1 << 20], &[1, 1], TileOrder::C).unwrap_err();
    assert!(matches!(err, GpuError::Overflow(_)), "{err}");
    assert!(err.to_string().contains("1152921504606846976 tiles"), "{err}");
}

/// The items whose reads have started, in order.
type Started = Arc<Mutex<Vec<u32>>>;

/// A fake read that records the order of the reads it starts and takes `sleep` each.
fn recorder(sleep: Duration, fail_at: Option<u32>) -> (Started, impl FnMut(u32) -> Result<u32, String> + Send) {
    let started = Arc::new(Mutex::new(Vec::new()));
    let log = started.clone();
    let read = move |i: u32| {
        log.lock().unwrap().push(i);
        std::thread::sleep(sleep);
        if Some(i) == fail_at {
            return Err(format!("read {i} failed"));
        }
        Ok(i * 10)
    };
    (started, read)
}

fn wait_until(what: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !what() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn results_come_in_order_and_at_most_depth_plus_one_reads_run_ahead() {
    for depth in [0usize, 1, 3] {
        let ahead = depth.max(1) + 1;
        let (started, read) = recorder(Duration::from_millis(2), None);
        let mut reads = Prefetch::start(0..20u32, depth, read).unwrap();
        wait_until(|| started.lock().unwrap().len() >= ahead);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(started.lock().unwrap().len(), ahead, "depth {depth}: before any is taken");
        assert_eq!(reads.ready(), ahead);
        assert_eq!(reads.next(), Some(Ok(0)));
        wait_until(|| started.lock().unwrap().len() > ahead);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(started.lock().unwrap().len(), ahead + 1, "depth {depth}: one taken");
        let rest: Vec<_> = reads.by_ref().collect();
        assert_eq!(rest, (1..20).map(|i| Ok(i * 10)).collect::<Vec<_>>());
        assert_eq!(reads.next(), None);
        assert_eq!(*started.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }
}

#[test]
fn dropping_stops_the_reads_without_waiting_for_the_current_one() {
    let (started, read) = recorder(Duration::from_millis(300), None);
    let mut reads = Prefetch::start(0..1000u32, 2, read).unwrap();
    assert_eq!(reads.next(), Some(Ok(0)));
    let before = Instant::now();
    drop(reads);
    assert!(before.elapsed() < Duration::from_millis(200), "the drop waited: {:?}", before.elapsed());
    // The read in progress ends; no other starts.
    std::thread::sleep(Duration::from_millis(400));
    let n = started.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(started.lock().unwrap().len(), n);
    assert!(n <= 5, "{n} reads started");
}

#[test]
fn a_wait_with_a_timeout_returns_pending_and_keeps_the_result() {
    let (_, read) = recorder(Duration::from_millis(400), None);
    let mut reads = Prefetch::start(0..2u32, 1, read).unwrap();
    let start = Instant::now();
    assert_eq!(reads.next_timeout(Duration::from_millis(50)), Poll::Pending);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(40) && took < Duration::from_millis(300), "{took:?}");
    // The read goes on; a later wait takes its result, then the next, then the end.
    let mut slices = 0;
    let first = loop {
        slices += 1;
        if let Poll::Ready(result) = reads.next_timeout(Duration::from_millis(50)) {
            break result;
        }
    };
    assert_eq!(first, Some(Ok(0)));
    assert!(slices > 1, "the read took 400 ms: more than one slice of 50");
    assert_eq!(reads.next(), Some(Ok(10)));
    assert_eq!(reads.next_timeout(Duration::from_millis(50)), Poll::Ready(None));
}

#[test]
fn ending_stops_the_reads_too() {
    let (started, read) = recorder(Duration::from_millis(20), None);
    let mut reads = Prefetch::start(0..1000u32, 1, read).unwrap();
    assert_eq!(reads.next(), Some(Ok(0)));
    reads.end();
    assert_eq!(reads.next(), None);
    std::thread::sleep(Duration::from_millis(200));
    assert!(started.lock().unwrap().len() <= 4);
}

#[test]
fn the_first_error_ends_the_iteration_and_the_reads() {
    let (started, read) = recorder(Duration::ZERO, Some(3));
    let reads = Prefetch::start(0..1000u32, 4, read).unwrap();
    let got: Vec<_> = reads.collect();
    assert_eq!(got, [Ok(0), Ok(10), Ok(20), Err("read 3 failed".to_string())]);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(*started.lock().unwrap(), [0, 1, 2, 3]);
}

#[test]
fn a_panicking_read_panics_in_the_consumer() {
    let read = |i: u32| -> Result<u32, String> {
        assert!(i != 2, "read {i} panicked");
        Ok(i)
    };
    let mut reads = Prefetch::start(0..10u32, 1, read).unwrap();
    assert_eq!(reads.next(), Some(Ok(0)));
    assert_eq!(reads.next(), Some(Ok(1)));
    let panic = catch_unwind(AssertUnwindSafe(|| reads.next())).unwrap_err();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("read 2 panicked"), "{message}");
    assert_eq!(reads.next(), None);
}

#[test]
fn requests_take_up_to_depth_subsets_within_the_byte_budget() {
    let row = |n: u64| ArraySubset::new_with_ranges(&[0..1, 0..n]);
    let subsets = vec![row(10), row(10), row(10), row(30), row(5), row(100), row(1)];
    let plan = |count, budget| RequestPlan { subsets: subsets.clone(), count, budget, elem: 4 };
    let sizes = |count, budget| plan(count, budget).into_iter().map(|g| g.len()).collect::<Vec<_>>();
    // 4-byte elements: 40, 40, 40, 120, 20, 400, 4 bytes.
    assert_eq!(sizes(3, 1 << 20), [3, 3, 1]);
    assert_eq!(sizes(10, 160), [3, 2, 1, 1], "the budget closes a request; one too large stands alone");
    assert_eq!(sizes(1, 1 << 20), [1; 7]);
    let all: Vec<ArraySubset> = plan(4, 200).into_iter().flatten().collect();
    assert_eq!(all, subsets, "every subset once, in order");
}

#[test]
fn a_group_yields_its_results_in_order_up_to_its_first_error() {
    let groups = vec![vec![1u32, 2, 3], vec![4, 5], vec![6, 7, 8]];
    let read = |group: Vec<u32>| -> Vec<Result<u32, String>> {
        group.into_iter().map(|i| if i == 7 { Err(format!("read {i} failed")) } else { Ok(i) }).collect()
    };
    let got: Vec<_> = Prefetch::start_grouped(groups, 2, read).unwrap().collect();
    assert_eq!(got, [Ok(1), Ok(2), Ok(3), Ok(4), Ok(5), Ok(6), Err("read 7 failed".to_string())]);
}

#[test]
fn subsets_come_lazily_from_their_iterator() {
    // An endless iterator: only what is read ahead is taken from it.
    let taken = Arc::new(AtomicUsize::new(0));
    let count = taken.clone();
    let items = (0u32..).inspect(move |_| {
        count.fetch_add(1, Ordering::Relaxed);
    });
    let mut reads = Prefetch::start(items, 2, |i: u32| Ok::<_, String>(i)).unwrap();
    assert_eq!(reads.by_ref().take(5).collect::<Vec<_>>(), (0..5).map(Ok).collect::<Vec<_>>());
    drop(reads);
    std::thread::sleep(Duration::from_millis(100));
    assert!(taken.load(Ordering::Relaxed) <= 5 + 3 + 1);
}

/// Reads on a device that cannot be had (no driver here; on a GPU host, no device 4096) are
/// errors, handed out in order, and the reads end after the first.
#[test]
fn reads_on_a_device_that_cannot_be_had_are_errors_in_order() {
    let config = GpuConfig::default().with_device(4096);
    // SAFETY: only probes whether the driver library can be loaded.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    // Without a driver any NoCuda; with one, the device asked for is named.
    let no_device = |err: &GpuError| matches!(err, GpuError::NoCuda(why) if !driver || why.contains("device 4096"));
    let store = Arc::new(zarrs_storage::store::MemoryStore::new());
    let array = zarrs::array::ArrayBuilder::new(
        vec![10, 10],
        vec![4, 4],
        zarrs::array::data_type::float32(),
        zarrs::array::FillValue::from(0f32),
    )
    .build(store, "/")
    .unwrap();
    let array = Arc::new(array);
    let tiles = tile_subsets(array.shape(), &[5, 5], TileOrder::C).unwrap();
    let mut reads = ReadAhead::<DeviceArray<f32>>::new(array.clone(), tiles, config.clone(), 2);
    let err = reads.next().unwrap().unwrap_err();
    assert!(no_device(&err), "{err}");
    assert!(reads.next().is_none());
    let pending =
        read_async::<DeviceArray<f32>, _>(array.clone(), ArraySubset::new_with_ranges(&[0..1, 0..1]), config.clone());
    let err = pending.wait().unwrap_err();
    assert!(no_device(&err), "{err}");
    // With a timeout: the same error once it comes, then no second result.
    let mut pending = read_async::<DeviceArray<f32>, _>(array, ArraySubset::new_with_ranges(&[0..1, 0..1]), config);
    let err = loop {
        if let Poll::Ready(result) = pending.wait_timeout(Duration::from_millis(50)) {
            break result.unwrap_err();
        }
    };
    assert!(no_device(&err), "{err}");
    let Poll::Ready(Err(again)) = pending.wait_timeout(Duration::ZERO) else { panic!("a second result") };
    assert!(again.to_string().contains("taken"), "{again}");
}
