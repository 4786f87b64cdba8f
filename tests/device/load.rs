//! Load: many threads reading mixed arrays and subsets on one GPU for many rounds, every result
//! compared with zarrs' host read, and the memory the reads hold measured after every round: it
//! must stay steady (pools bounded, nothing leaked).

use std::sync::{Arc, Barrier, Mutex};
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{Crc32cCodec, GzipCodec, ShardingCodecBuilder, ShardingIndexLocation, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, ArraySubset, BytesToBytesCodecTraits};
use zarrs_gpu::{memory_in_use, ArrayDeviceExt, DecodeTrust, GdsStore, MemoryInUse};

use super::{posix, Result};

const SHAPE: [u64; 3] = [48, 192, 160];

/// An array of the mix: its name, its bytes-to-bytes codecs, whether they sit inside shards.
type Spec = (&'static str, Vec<Arc<dyn BytesToBytesCodecTraits>>, bool);

/// The arrays of the mix: raw, zstd, zstd with checksums and crc32c, gzip, sharded zstd, sharded
/// raw; float32 of [`SHAPE`], every seventh chunk missing.
fn arrays(dir: &std::path::Path) -> Result<Vec<(String, Array<GdsStore>)>> {
    let store = Arc::new(GdsStore::new(dir)?);
    let zstd = |checksum| Arc::new(ZstdCodec::new(3, checksum)) as Arc<dyn BytesToBytesCodecTraits>;
    let inner = [16u64, 32, 32].map(|n| std::num::NonZeroU64::new(n).unwrap());
    let sharded = |codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>| {
        ShardingCodecBuilder::new(inner.to_vec(), &data_type::float32())
            .bytes_to_bytes_codecs(codecs)
            .index_location(ShardingIndexLocation::End)
            .build_arc()
    };
    let mut out = Vec::new();
    let specs: Vec<Spec> = vec![
        ("raw", vec![], false),
        ("zstd", vec![zstd(false)], false),
        ("zstd-checksum-crc32c", vec![zstd(true), Arc::new(Crc32cCodec::new())], false),
        ("gzip", vec![Arc::new(GzipCodec::new(5)?)], false),
        ("sharded-zstd", vec![zstd(false)], true),
        ("sharded-raw", vec![], true),
    ];
    for (name, codecs, shard) in specs {
        let builder = ArrayBuilder::new(
            SHAPE.to_vec(),
            if shard { vec![48, 64, 64] } else { vec![16, 64, 64] },
            data_type::float32(),
            0.25f32,
        );
        let mut builder = builder;
        if shard {
            builder.array_to_bytes_codec(sharded(codecs));
        } else {
            builder.bytes_to_bytes_codecs(codecs);
        }
        let array = builder.build(store.clone(), &format!("/{name}"))?;
        array.store_metadata()?;
        let grid = array.chunks_in_array_subset(&array.subset_all())?.unwrap();
        for (n, indices) in grid.indices().into_iter().enumerate() {
            if n % 7 == 5 {
                continue;
            }
            let subset = array.chunk_subset(&indices)?;
            let values: Vec<f32> = subset
                .indices()
                .into_iter()
                .map(|p| ((p[0] * 7 + p[1] * 3 + p[2]) % 251) as f32 + (n as f32) * 0.5)
                .collect();
            array.store_chunk(&indices, values)?;
        }
        out.push((name.to_string(), array));
    }
    Ok(out)
}

/// The C-order bytes of `subset` within `whole` (an array of [`SHAPE`], 4-byte elements).
fn extract(whole: &[u8], subset: &ArraySubset) -> Vec<u8> {
    let r = subset.to_ranges();
    let mut out = Vec::with_capacity(subset.num_elements_usize() * 4);
    for z in r[0].clone() {
        for y in r[1].clone() {
            let row = ((z * SHAPE[1] + y) * SHAPE[2]) as usize * 4;
            out.extend_from_slice(&whole[row + r[2].start as usize * 4..row + r[2].end as usize * 4]);
        }
    }
    out
}

/// Whole, a slab of planes, or a random box.
fn pick_subset(rng: &mut StdRng) -> ArraySubset {
    match rng.random_range(0..3) {
        0 => ArraySubset::new_with_shape(SHAPE.to_vec()),
        1 => {
            let z = rng.random_range(0..SHAPE[0] - 8);
            ArraySubset::new_with_ranges(&[z..z + 8, 0..SHAPE[1], 0..SHAPE[2]])
        }
        _ => crate::boxes::random_box(&SHAPE, rng),
    }
}

fn used(m: &MemoryInUse) -> u64 {
    m.device_total - m.device_free
}

/// 16 threads x 200 rounds of mixed reads, each compared with zarrs' host read; after every round
/// (all threads done) the device memory in use and the pooled pinned memory are measured, and
/// after a warm-up neither may grow.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sixteen_threads_two_hundred_rounds_steady_memory() -> Result {
    const THREADS: usize = 16;
    const ROUNDS: usize = 200;
    const WARMUP: usize = 20;
    let dir = tempfile::tempdir()?;
    let arrays = arrays(dir.path())?;
    let wholes: Vec<Vec<u8>> = arrays
        .iter()
        .map(|(_, a)| Ok(a.retrieve_array_subset::<ArrayBytes<'static>>(&a.subset_all())?.into_fixed()?.into_owned()))
        .collect::<Result<_>>()?;
    let before = memory_in_use(0)?;
    let barrier = Barrier::new(THREADS);
    let samples: Mutex<Vec<MemoryInUse>> = Mutex::new(Vec::new());
    let reads = Mutex::new(0usize);
    std::thread::scope(|scope| -> Result {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (arrays, wholes, barrier, samples, reads) = (&arrays, &wholes, &barrier, &samples, &reads);
                scope.spawn(move || -> Result {
                    let mut rng = StdRng::seed_from_u64(1000 + t as u64);
                    for round in 0..ROUNDS {
                        let a = rng.random_range(0..arrays.len());
                        let (name, array) = &arrays[a];
                        let subset = pick_subset(&mut rng);
                        let trust = if rng.random_bool(0.5) { DecodeTrust::Trusted } else { DecodeTrust::Checked };
                        let config = posix().with_decode_trust(trust);
                        let got = array
                            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &config)
                            .map_err(|e| format!("thread {t} round {round} {name}: {e}"))?
                            .0
                            .to_host_bytes()?;
                        let want = extract(&wholes[a], &subset);
                        assert!(
                            got == want,
                            "thread {t} round {round} {name} {:?}: differs from zarrs",
                            subset.to_ranges()
                        );
                        *reads.lock().unwrap() += 1;
                        barrier.wait();
                        if t == 0 {
                            samples.lock().unwrap().push(memory_in_use(0)?);
                        }
                        barrier.wait();
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a reader thread panicked")??;
        }
        Ok(())
    })?;
    let samples = samples.into_inner().unwrap();
    assert_eq!((samples.len(), *reads.lock().unwrap()), (ROUNDS, THREADS * ROUNDS));
    let peak = |s: &[MemoryInUse], f: fn(&MemoryInUse) -> u64| s.iter().map(f).max().unwrap();
    let (warm, rest) = samples.split_at(WARMUP);
    let pinned = |m: &MemoryInUse| m.pinned_pooled;
    for (what, f) in [("device memory in use", used as fn(&MemoryInUse) -> u64), ("pooled pinned memory", pinned)] {
        let (w, r) = (peak(warm, f), peak(rest, f));
        println!(
            "{what}: before {} MiB, warm-up peak {} MiB, rounds {WARMUP}..{ROUNDS} peak {} MiB, last {} MiB",
            f(&before) >> 20,
            w >> 20,
            r >> 20,
            f(samples.last().unwrap()) >> 20
        );
        assert!(r <= w + (256 << 20), "{what} grew after the warm-up: {} MiB -> {} MiB", w >> 20, r >> 20);
    }
    Ok(())
}
