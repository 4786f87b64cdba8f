//! Throughput benchmark: whole arrays and slabs to the GPU, ours against zarrs' own host path
//! (decode into a pinned buffer allocated once, then one copy: what a Rust user writes today).
//! The Python peers run beside it on the same data (benches/run.sh).
//!
//! ```text
//! bench --dir /tmp/bench [--gib 8] [--repeat 5] [--json results.jsonl] [--tiles 48] [--tiles-only] [--filled 512] [--batch 32] [--write] [--cold 3]
//! bench --dir /tmp/bench --gib 8 --cases z2,s1 --ratios 256    # libzstd's ratios, host only
//! ```
//!
//! Rows are printed (and appended to `--json`) as each group of them is measured: a run cut short
//! keeps the groups it finished.
//!
//! Tiles (issue 17): for each case, `--tiles N` reads of 64 x 256 x 256 tiles at random starts
//! (not chunk aligned), N at chunk-aligned starts and N single chunks (a shard's inner chunk for
//! sharded cases), each read then synchronised and freed; rows give the median and p90 latency
//! and, for compressed cases, the host-thread bound beside it: ceil(chunks the tile meets /
//! reader threads) x the time one host thread takes to decode one stored chunk, measured here.
//! Tile starts come from splitmix64 seeded with 17, as `benches/tiles.py` draws them for the
//! Python peers (see [`tile_starts`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use zarrs::array::codec::{BloscCodec, BloscCompressor, BloscShuffleMode, GzipCodec, ZstdCodec};
use zarrs::array::{
    Array, ArrayBytesDecodeIntoTarget, ArrayBytesFixedDisjointView, ArraySubset, BytesToBytesCodecTraits,
};
use zarrs_gpu::zarrs_gds_store::Durability;
use zarrs_gpu::zarrs_gpu_codecs::reader::{cuda_context, PinnedBuffer};
use zarrs_gpu::zarrs_gpu_codecs::{random_crops, CropStarts};
use zarrs_gpu::{
    parse_subset, sample, with_gpu_config, ArrayDeviceExt, ArrayDeviceWriteExt, DecodeTrust, DeviceArray, GdsStore,
    GdsStoreOptions, GpuConfig, IoBackend, ShardIndexCache,
};

#[derive(Parser)]
struct Args {
    /// Where the benchmark arrays live (made if absent).
    #[arg(long)]
    dir: PathBuf,
    /// Size of the U1 array in GiB (shape (64 * GiB, 2048, 2048) float32, chunks 64x256x256).
    #[arg(long, default_value_t = 8)]
    gib: u64,
    /// Timed repetitions per case (after one warm-up).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Append JSON lines here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Cases: u1 (uncompressed, 16 MiB chunks), z1 (zstd 3, 16 MiB chunks), z2 (zstd 3, 1 MiB
    /// chunks), g2 (gzip 5, 1 MiB chunks), s1 (shards of 64 MiB, zstd 3 inner chunks of 1 MiB),
    /// s1r (the same shards, inner chunks uncompressed), s1g (gzip 5 inner chunks), b1 (Blosc
    /// lz4 5, byte shuffle, 1 MiB chunks), b2 (Blosc zstd 5, bit shuffle, 1 MiB chunks).
    #[arg(long, value_delimiter = ',', default_value = "u1")]
    cases: Vec<String>,
    /// Only this project's reads (no zarrs peers, no ceilings): for A/B runs of settings.
    #[arg(long)]
    ours_only: bool,
    /// A label added to this project's rows (e.g. the settings of an A/B run).
    #[arg(long, default_value = "")]
    label: String,
    /// Tiles per tile row (random tiles, chunk-aligned tiles, single chunks); 0: no tile rows.
    #[arg(long, default_value_t = 0)]
    tiles: usize,
    /// Only the tile rows (no whole-array or slab rows, no peers, no ceilings).
    #[arg(long)]
    tiles_only: bool,
    /// Rows of the 1 GiB slab (the first 64 planes) read with the device filled by another
    /// allocator, as a training job fills it, but for the output and this many MiB; beside the
    /// same slab read unconstrained in the same run. 0: none.
    #[arg(long, default_value_t = 0)]
    filled: u64,
    /// Rows of batches of this many random 64x256x256 crops: read one at a time, and as one
    /// request (stacked), with the scheduler's split and with each side alone. 0: none.
    #[arg(long, default_value_t = 0)]
    batch: usize,
    /// Rows of chunk-aligned reads meeting these many chunks (a shard's inner chunks for sharded
    /// cases), e.g. 1,16,64,288,1024,4096: median and p90 of `--size-reads` reads each, with the
    /// scheduler's split, then all on nvCOMP, then all on host threads.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<u64>,
    /// Timed reads per size row (after one untimed).
    #[arg(long, default_value_t = 15)]
    size_reads: usize,
    /// Rows of the whole array written from device memory into a new array of the same chunks
    /// and codecs (`<dir>/write-<case>.zarr`, made afresh each time), a final `sync` included:
    /// `store_array_subset_device`, and zarrs' `store_array_subset` from host memory.
    #[arg(long)]
    write: bool,
    /// The written arrays' `GdsStore` durability: sync (each write flushed before it returns; the
    /// device writer flushes a batch's files together) or nosync (left to the OS; the timed `sync`
    /// still flushes everything).
    #[arg(long, default_value = "sync")]
    write_durability: String,
    /// Rows of the whole array read this many times with the page cache dropped before each
    /// (`/proc/sys/vm/drop_caches`: as root), after one read that fills the pools as a process
    /// that has read before holds them: the cold read alone, without CUDA's start and the first
    /// allocations that a cold `zarrs-gpu read` includes. Each stage's median is in the row.
    /// 0: none.
    #[arg(long, default_value_t = 0)]
    cold: usize,
    /// Only rows of libzstd's compression ratio at levels 1 and 3 on this many chunks of each
    /// case's data (a sharded case's inner chunks), spread over the array, for comparison with
    /// the ratio nvCOMP's zstd reaches in the `--write` rows. Host threads only: needs no GPU
    /// and writes no array (the data is the sample the arrays are written with). 0: no such rows.
    #[arg(long, default_value_t = 0)]
    ratios: usize,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The inner chunks of the sharded cases.
const INNER_CHUNK: [u64; 3] = [64, 64, 64];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(repeat: usize, mut f: impl FnMut() -> Result<(), Error>) -> Result<(f64, Vec<f64>), Error> {
    f()?; // warm-up
    let mut runs = Vec::new();
    for _ in 0..repeat {
        let start = Instant::now();
        f()?;
        runs.push(start.elapsed().as_secs_f64());
    }
    Ok((median(runs.clone()), runs))
}

/// The configuration of this project's timed reads: the store's backend chosen per file, row
/// reads, a set host decode fraction and the trace as the environment says (the A/B switches;
/// `ZARRS_GPU_TRACE=1` prints each read's stages), shard indexes kept in `cache` between reads.
fn bench_config(cache: Arc<ShardIndexCache>) -> Result<GpuConfig, Error> {
    let env = GpuConfig::from_env()?;
    Ok(GpuConfig::default()
        .with_backend(IoBackend::Auto)
        .with_row_reads(env.row_reads())
        .with_host_decode_fraction(env.host_decode_fraction())
        .with_decode_trust(env.decode_trust())
        .with_trace(env.trace())
        .with_shard_index_cache(Some(cache)))
}

fn main() -> std::process::ExitCode {
    match run(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Rows printed and appended to the JSON file as each group of them is measured: a run cut short
/// keeps the groups it finished.
struct Rows<'a> {
    json: Option<&'a std::path::Path>,
}

impl Rows<'_> {
    fn push(&mut self, row: &str) -> Result<(), Error> {
        use std::io::Write;
        println!("{row}");
        if let Some(json) = self.json {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(json)?
                .write_all(format!("{row}\n").as_bytes())?;
        }
        Ok(())
    }

    fn extend(&mut self, rows: &[String]) -> Result<(), Error> {
        rows.iter().try_for_each(|row| self.push(row))
    }
}

fn run(args: &Args) -> Result<(), Error> {
    let shape = [64 * args.gib, 2048, 2048];
    let mut lines = Rows { json: args.json.as_deref() };
    if args.ratios > 0 {
        for case in &args.cases {
            lines.push(&ratio_row(case, &shape, args.ratios)?)?;
        }
        return Ok(());
    }
    // Refuse before writing gigabytes when there is nothing to measure on.
    cuda_context(0).map_err(|e| format!("{e} (the benchmark reads arrays to a GPU; run it on a machine with one)"))?;
    std::fs::create_dir_all(&args.dir)?;
    for case in &args.cases {
        let (name, chunks, codecs) = case_of(case)?;
        let sharded = case.starts_with("s1");
        let path = args.dir.join(format!("{case}.zarr"));
        if !path.join("zarr.json").exists() {
            let start = Instant::now();
            let written = if sharded {
                sample::create_sharded_sample_array(&path, &shape, &chunks, &INNER_CHUNK, codecs.clone())
            } else {
                sample::create_sample_array_with_codecs(&path, &shape, &chunks, codecs.clone())
            };
            if let Err(err) = written {
                // No half-written array left behind (it would pass for a whole one next time).
                let _ = std::fs::remove_dir_all(&path);
                return Err(format!("writing {}: {err}", path.display()).into());
            }
            // Flush dirty pages so that writeback does not compete with the timed reads.
            std::process::Command::new("sync").status()?;
            eprintln!("wrote {} in {:.1} s", path.display(), start.elapsed().as_secs_f64());
        }
        let array = Array::open(Arc::new(GdsStore::new(&path)?), "/")?;
        let subsets: &[(&str, &str)] = if args.tiles_only {
            &[]
        } else if case == "u1" {
            &[("whole array", "0:"), ("slab 64 planes", "0:64"), ("slab 16 planes", "0:16")]
        } else if sharded {
            &[("whole array", "0:"), ("slab 64 planes (S2)", "0:64"), ("slab 16 planes", "0:16")]
        } else {
            &[("whole array", "0:")]
        };
        for (what, spec) in subsets {
            let label = format!("{name} {what}");
            let subset = parse_subset(spec, array.shape())?;
            let bytes = subset.num_elements() * 4;
            // Shard indexes kept between the repeats, as an application reading one array does.
            let cache = Arc::new(ShardIndexCache::new());
            let config = bench_config(cache)?;
            // Timed like a user's load: allocation and read; the previous result is freed untimed.
            let mut io = String::new();
            let mut runs = Vec::new();
            let mut held = None;
            for i in 0..=args.repeat {
                let start = Instant::now();
                let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &config)?;
                let elapsed = start.elapsed().as_secs_f64();
                if i > 0 {
                    runs.push(elapsed); // the first read is the warm-up
                }
                io = format!(
                    "{}; decode {}; stored bytes read {} (ratio {:.2}); {} of {} chunks on host threads",
                    report.io.map(|s| s.to_string()).unwrap_or_default(),
                    report.decode,
                    report.bytes_read,
                    bytes as f64 / report.bytes_read.max(1) as f64,
                    report.host_decoded_chunks,
                    report.chunks
                );
                drop(data);
                // What the pools keep idle after the result is freed (the bound's effect).
                held = zarrs_gpu::memory_in_use(0).ok();
            }
            let secs = median(runs.clone());
            let who = ours(&config, &args.label);
            let io = held.map_or(io.clone(), |m| {
                format!(
                    "{io}; idle after a freed result: device {} MiB, pinned {} MiB (bounds {} and {} MiB)",
                    (m.output_pool_idle + m.staging_pooled) >> 20,
                    m.pinned_pooled >> 20,
                    m.pool_keep >> 20,
                    m.pinned_keep >> 20
                )
            });
            lines.push(&line(&who, &label, &subset, bytes, secs, &runs, &io))?;
            if args.ours_only {
                continue;
            }
            let (secs, runs) = zarrs_pinned_then_copy(&array, &subset, args.repeat.min(3))?;
            lines.push(&line("zarrs pinned+copy", &label, &subset, bytes, secs, &runs, ""))?;
            if *what == "whole array" {
                // zarrs' ordinary retrieval in GPU mode, the array opened inside the scope.
                let (secs, runs) = gpu_mode_retrieval(&path, &subset, &config, args.repeat.min(3))?;
                lines.push(&line(
                    "zarrs GPU mode (retrieve_array_subset::<DeviceArray>)",
                    &label,
                    &subset,
                    bytes,
                    secs,
                    &runs,
                    "",
                ))?;
            }
        }
        if case == "u1" && !args.ours_only && !args.tiles_only {
            lines.extend(&ceilings(&path, &array)?)?;
        }
        if args.cold > 0 {
            lines.push(&cold_row(&array, name, args.cold, &args.label)?)?;
        }
        if args.write {
            let durability = match args.write_durability.as_str() {
                "sync" => Durability::Sync,
                "nosync" => Durability::NoSync,
                other => return Err(format!("--write-durability {other}: sync or nosync").into()),
            };
            let target = Target { dir: &args.dir, case, durability };
            lines.extend(&write_rows(&array, name, &target, args.repeat.min(2), &args.label)?)?;
        }
        if args.filled > 0 {
            lines.extend(&filled_rows(&array, name, args.filled << 20, args.repeat, &args.label)?)?;
        }
        if args.batch > 0 {
            lines.extend(&batch_rows(&array, name, args.batch, &args.label)?)?;
        }
        if !args.sizes.is_empty() {
            let unit = if sharded { INNER_CHUNK.to_vec() } else { chunks.to_vec() };
            let compressed = !matches!(case.as_str(), "u1" | "s1r");
            lines.extend(&size_rows(&array, name, &unit, &args.sizes, args.size_reads, compressed, &args.label)?)?;
        }
        if args.tiles > 0 {
            let compression = match case.as_str() {
                "z1" | "z2" | "z2c" | "s1" => Some(Compression::Zstd),
                "g2" | "s1g" => Some(Compression::Gzip),
                _ => None,
            };
            let unit = if sharded { INNER_CHUNK.to_vec() } else { chunks.to_vec() };
            let tiles =
                Tiles { name, path: &path, array: &array, unit: &unit, sharded, compression, count: args.tiles };
            lines.extend(&tiles.rows(&args.label)?)?;
        }
    }
    Ok(())
}

/// A case's name in the rows, its chunk shape (a sharded case's shards) and its codecs.
type Case = (&'static str, [u64; 3], Vec<Arc<dyn BytesToBytesCodecTraits>>);

fn case_of(case: &str) -> Result<Case, Error> {
    let zstd = || -> Arc<dyn BytesToBytesCodecTraits> { Arc::new(ZstdCodec::new(3, false)) };
    let gzip = || -> Result<Arc<dyn BytesToBytesCodecTraits>, Error> { Ok(Arc::new(GzipCodec::new(5)?)) };
    let blosc = |cname, shuffle| -> Result<Arc<dyn BytesToBytesCodecTraits>, Error> {
        Ok(Arc::new(BloscCodec::new(cname, 5u8.try_into().map_err(|_| "level")?, None, shuffle, Some(4))?))
    };
    Ok(match case {
        "u1" => ("U1", [64, 256, 256], vec![]),
        "z1" => ("Z1", [64, 256, 256], vec![zstd()]),
        "z2" => ("Z2", [64, 64, 64], vec![zstd()]),
        // Z2 with zstd content checksums (XXH64, verified on the device).
        "z2c" => ("Z2 checksummed", [64, 64, 64], vec![Arc::new(ZstdCodec::new(3, true))]),
        "g2" => ("G2", [64, 64, 64], vec![gzip()?]),
        // Shards of 256^3 holding 64^3 inner chunks (chunks below are the shard shape).
        "s1" => ("S1", [256, 256, 256], vec![zstd()]),
        "s1r" => ("S1 uncompressed", [256, 256, 256], vec![]),
        "s1g" => ("S1 gzip", [256, 256, 256], vec![gzip()?]),
        // Blosc as zarr-python 2 writes it by default (lz4, byte shuffle), and zstd with bit
        // shuffle: 1 MiB chunks like Z2.
        "b1" => ("B1 blosc lz4 shuffle", [64, 64, 64], vec![blosc(BloscCompressor::LZ4, BloscShuffleMode::Shuffle)?]),
        "b2" => (
            "B2 blosc zstd bitshuffle",
            [64, 64, 64],
            vec![blosc(BloscCompressor::Zstd, BloscShuffleMode::BitShuffle)?],
        ),
        other => return Err(format!("unknown case {other}").into()),
    })
}

/// Where a write row writes: a new array with the case's metadata (chunks or shards, codecs).
struct Target<'a> {
    dir: &'a std::path::Path,
    case: &'a str,
    durability: Durability,
}

impl Target<'_> {
    /// The target array, a fresh copy of `array`'s metadata (the previous one removed, untimed).
    fn fresh(&self, array: &Array<GdsStore>) -> Result<(Array<GdsStore>, PathBuf), Error> {
        let path = self.dir.join(format!("write-{}.zarr", self.case));
        let _ = std::fs::remove_dir_all(&path);
        let options = GdsStoreOptions::default().with_durability(self.durability);
        let store = Arc::new(GdsStore::new_with_options(&path, options)?);
        let out = Array::new_with_metadata(store, "/", array.metadata().clone())?;
        out.store_metadata()?;
        Ok((out, path))
    }
}

/// Bytes of the files under `path`.
fn stored_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => stored_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// The whole array read to the device once, then written into a fresh array of the same chunks
/// and codecs `repeat` times after one untimed (each timed with a final `sync`), by
/// `store_array_subset_device` and by zarrs from host memory; the stored ratio of each.
fn write_rows(
    array: &Array<GdsStore>,
    name: &str,
    target: &Target,
    repeat: usize,
    label: &str,
) -> Result<Vec<String>, Error> {
    let all = array.subset_all();
    let bytes = all.num_elements() * 4;
    let config = GpuConfig::default().with_backend(IoBackend::Auto);
    let data = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&all, &config)?.0;
    let label_of = |what: &str| format!("{name} write whole array {what}");
    let sync = || -> Result<(), Error> {
        std::process::Command::new("sync").status()?;
        Ok(())
    };
    let mut lines = Vec::new();
    let (mut runs, mut io, mut last) = (Vec::new(), String::new(), None);
    for i in 0..=repeat {
        let (out, path) = target.fresh(array)?;
        sync()?;
        let start = Instant::now();
        let report = out.store_array_subset_device(&all, &data)?;
        sync()?;
        let elapsed = start.elapsed().as_secs_f64();
        if i > 0 {
            runs.push(elapsed);
        }
        let stored = stored_bytes(&path);
        io = format!(
            "{:?}{}; {} chunks written, {} erased; ratio {:.3} (files {:.3}); store_array_subset_device {:.2} s \
             of it (encode {:.2} s, store {:.2} s on another thread)",
            report.path,
            report.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
            report.written,
            report.erased,
            report.ratio().unwrap_or(0.0),
            bytes as f64 / stored.max(1) as f64,
            report.seconds,
            report.encode_seconds,
            report.store_seconds
        );
        last = Some((out, path));
    }
    // What the pools keep idle after the writes (batch buffers go back to the output pool).
    if let Ok(m) = zarrs_gpu::memory_in_use(0) {
        use std::fmt::Write as _;
        let _ = write!(
            io,
            "; idle after the write: device {} MiB, pinned {} MiB",
            (m.output_pool_idle + m.staging_pooled) >> 20,
            m.pinned_pooled >> 20
        );
    }
    let who = format!("zarrs_gpu (durability {:?}) {label}", target.durability);
    lines.push(line(&who, &label_of("from device memory"), &all, bytes, median(runs.clone()), &runs, &io));
    if let Some((out, path)) = last {
        lines.push(tile_write_row(array, &out, name, &who)?);
        let _ = std::fs::remove_dir_all(&path);
    }
    if matches!(target.case, "z2" | "s1" | "g2" | "b1" | "b2") {
        // The same write with every chunk on nvCOMP (the split's device side alone).
        let config = GpuConfig::current()?.with_host_encode_fraction(Some(0.0));
        let (out, path) = target.fresh(array)?;
        sync()?;
        let start = Instant::now();
        let report = out.store_array_subset_device_opt(&all, &data, &config)?;
        sync()?;
        let secs = start.elapsed().as_secs_f64();
        let io = format!(
            "ratio {:.3}; encode {:.2} s, store {:.2} s on another thread",
            report.ratio().unwrap_or(0.0),
            report.encode_seconds,
            report.store_seconds
        );
        lines.push(line(
            &format!("{who}, all nvCOMP"),
            &label_of("from device memory"),
            &all,
            bytes,
            secs,
            &[secs],
            &io,
        ));
        let _ = std::fs::remove_dir_all(&path);
    }
    // zarrs' writer, from host memory (the copy from the device untimed).
    let host = data.to_host()?;
    drop(data);
    let (out, path) = target.fresh(array)?;
    sync()?;
    let start = Instant::now();
    out.store_array_subset(&all, &host)?;
    sync()?;
    let secs = start.elapsed().as_secs_f64();
    let io = format!("ratio (files) {:.3}", bytes as f64 / stored_bytes(&path).max(1) as f64);
    let zarrs = format!("zarrs store_array_subset (host memory, durability {:?})", target.durability);
    lines.push(line(&zarrs, &label_of("from host memory"), &all, bytes, secs, &[secs], &io));
    let _ = std::fs::remove_dir_all(&path);
    Ok(lines)
}

/// Sync, then drop the page cache (as root): the next reads come from the disk.
fn drop_page_cache() -> Result<(), Error> {
    std::process::Command::new("sync").status()?;
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("dropping the page cache (writing 3 to /proc/sys/vm/drop_caches needs root): {e}"))?;
    Ok(())
}

/// The whole array read `repeat` times, the page cache dropped before each, after one read that
/// fills the pools; each read with a fresh shard index cache (a cold read knows no index). The
/// row gives the stored bytes' rate too (the disk's ceiling is of stored bytes) and each stage's
/// median seconds over the reads.
fn cold_row(array: &Array<GdsStore>, name: &str, repeat: usize, label: &str) -> Result<String, Error> {
    let all = array.subset_all();
    let bytes = all.num_elements() * 4;
    drop(array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(
        &all,
        &bench_config(Arc::new(ShardIndexCache::new()))?,
    )?);
    let mut runs = Vec::new();
    let mut stages: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let (mut stored, mut io, mut who) = (0, String::new(), String::new());
    for _ in 0..repeat {
        let config = bench_config(Arc::new(ShardIndexCache::new()))?;
        drop_page_cache()?;
        let start = Instant::now();
        let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&all, &config)?;
        runs.push(start.elapsed().as_secs_f64());
        drop(data);
        for s in &report.stages {
            match stages.iter_mut().find(|(stage, _)| *stage == s.stage) {
                Some((_, times)) => times.push(s.time.as_secs_f64()),
                None => stages.push((s.stage, vec![s.time.as_secs_f64()])),
            }
        }
        stored = report.bytes_read;
        io = report.io.map(|s| s.to_string()).unwrap_or_default();
        who = ours(&config, label);
    }
    let secs = median(runs.clone());
    let stage_medians: serde_json::Map<String, serde_json::Value> =
        stages.iter().map(|(stage, times)| ((*stage).to_string(), median_p90(times).0.into())).collect();
    let mut row: serde_json::Value = serde_json::from_str(&line(
        &who,
        &format!("{name} whole array, cold page cache"),
        &all,
        bytes,
        secs,
        &runs,
        &io,
    ))?;
    row["stored_bytes"] = stored.into();
    row["stored_gib_s"] = (stored as f64 / f64::from(1u32 << 30) / secs).into();
    row["stage_median_seconds"] = stage_medians.into();
    Ok(row.to_string())
}

/// libzstd's compression ratio at levels 1 and 3 on `count` chunks of `case`'s data (a sharded
/// case's inner chunks) at chunk-aligned places drawn as the tile rows draw them, compressed on
/// host threads: what nvCOMP's ratio in the write rows is compared with.
fn ratio_row(case: &str, shape: &[u64; 3], count: usize) -> Result<String, Error> {
    use rayon::prelude::*;
    let (name, chunks, _) = case_of(case)?;
    let unit = if case.starts_with("s1") { INNER_CHUNK } else { chunks };
    let starts = tile_starts(shape, &unit, count, true);
    let sizes: Vec<[usize; 3]> = starts
        .par_iter()
        .map(|start| -> Result<[usize; 3], Error> {
            let mut raw = Vec::with_capacity(unit.iter().product::<u64>() as usize * 4);
            for z in 0..unit[0] {
                for y in 0..unit[1] {
                    let row = ((start[0] + z) * shape[1] + start[1] + y) * shape[2] + start[2];
                    for x in 0..unit[2] {
                        raw.extend_from_slice(&sample::sample_value(row + x, shape).to_le_bytes());
                    }
                }
            }
            let level = |l| zstd::bulk::compress(&raw, l).map(|c| c.len());
            Ok([raw.len(), level(1)?, level(3)?])
        })
        .collect::<Result<_, _>>()?;
    let sum = |i: usize| sizes.iter().map(|s| s[i] as f64).sum::<f64>();
    Ok(serde_json::json!({
        "peer": "libzstd (host threads)", "case": format!("{name} compression ratio"), "chunks": count,
        "chunk_shape": unit, "ratio_level_1": sum(0) / sum(1), "ratio_level_3": sum(0) / sum(2),
    })
    .to_string())
}

/// Tiles written per tile-write row, after [`TILE_WRITE_WARMUP`] untimed.
const TILE_WRITES: usize = 20;
const TILE_WRITE_WARMUP: usize = 3;

/// [`TILE`]s written one at a time at random unaligned places of `out` (a written copy of
/// `array`), each the values of another random place of `array` (read to the device untimed): the
/// chunks a tile covers in part are read, modified and written again. Median and p90.
fn tile_write_row(array: &Array<GdsStore>, out: &Array<GdsStore>, name: &str, who: &str) -> Result<String, Error> {
    let shape = out.shape().to_vec();
    let extent: Vec<u64> = TILE.iter().zip(&shape).map(|(&e, &s)| e.min(s)).collect();
    let n = TILE_WRITE_WARMUP + TILE_WRITES;
    let starts = tile_starts(&shape, &extent, n + 1, false);
    let boxed =
        |s: &[u64]| ArraySubset::new_with_ranges(&s.iter().zip(&extent).map(|(&a, &e)| a..a + e).collect::<Vec<_>>());
    let config = GpuConfig::default().with_backend(IoBackend::Auto);
    let (mut runs, mut modified, mut met, mut phases) = (Vec::new(), 0, 0, (Vec::new(), Vec::new(), Vec::new()));
    for k in 0..n {
        let (tile, _) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&boxed(&starts[k]), &config)?;
        tile.stream().synchronize()?;
        let start = Instant::now();
        let report = out.store_array_subset_device(&boxed(&starts[k + 1]), &tile)?;
        let secs = start.elapsed().as_secs_f64();
        if k >= TILE_WRITE_WARMUP {
            runs.push(secs);
            modified += report.modified;
            met += report.chunks;
            phases.0.push(report.encode_seconds);
            phases.1.push(report.store_seconds);
            phases.2.push(report.read_seconds);
        }
    }
    let (secs, p90) = median_p90(&runs);
    let bytes = extent.iter().product::<u64>() * 4;
    let case = format!(
        "{name} write a {} tile at a random place",
        extent.iter().map(u64::to_string).collect::<Vec<_>>().join("x")
    );
    let row = serde_json::json!({
        "peer": who, "case": case,
        "subset": format!("{TILE_WRITES} random starts after {TILE_WRITE_WARMUP}, splitmix64 seed {TILE_SEED}"),
        "bytes": bytes, "seconds": secs, "p90_seconds": p90,
        "gib_s": bytes as f64 / f64::from(1u32 << 30) / secs, "runs": runs,
        "io": format!("{:.1} chunks met and {:.1} read-modified-written per tile; median encode {:.1} ms (old \
            values read ({:.1} ms), assembled, encoded, copied out), store {:.1} ms",
            met as f64 / TILE_WRITES as f64, modified as f64 / TILE_WRITES as f64,
            median(phases.0) * 1e3, median(phases.2) * 1e3, median(phases.1) * 1e3),
    });
    Ok(row.to_string())
}

/// Batches timed per batch row (after one untimed).
const BATCH_ROUNDS: usize = 11;

/// Batches of `n` random crops of [`TILE`] (starts drawn as the tile rows draw theirs, batch after
/// batch from one stream): read one at a time (each kept until the batch is done, as a training
/// step holds its samples), then as one request, stacked, with the scheduler's split, all on
/// nvCOMP and all on host threads. Each batch synchronised and freed; median and p90 per row.
fn batch_rows(array: &Array<GdsStore>, name: &str, n: usize, label: &str) -> Result<Vec<String>, Error> {
    let shape = array.shape().to_vec();
    let extent: Vec<u64> = TILE.iter().zip(&shape).map(|(&e, &s)| e.min(s)).collect();
    let starts = tile_starts(&shape, &extent, n * (BATCH_ROUNDS + 1), false);
    let batches: Vec<Vec<ArraySubset>> = starts
        .chunks(n)
        .map(|batch| {
            batch
                .iter()
                .map(|s| {
                    ArraySubset::new_with_ranges(&s.iter().zip(&extent).map(|(&a, &e)| a..a + e).collect::<Vec<_>>())
                })
                .collect()
        })
        .collect();
    let cache = Arc::new(ShardIndexCache::new());
    let base = bench_config(cache)?;
    let modes: [(&str, GpuConfig, bool); 4] = [
        ("one at a time", base.clone(), false),
        ("as one request", base.clone(), true),
        ("as one request, all on the device decoder", base.clone().with_host_decode_fraction(Some(0.0)), true),
        ("as one request, all host threads", base.clone().with_decode_trust(DecodeTrust::Verified), true),
    ];
    let bytes = extent.iter().product::<u64>() * 4 * n as u64;
    let mut lines = Vec::new();
    for (mode, config, one_request) in modes {
        let (mut runs, mut peaks, mut chunks, mut host) = (Vec::new(), Vec::new(), 0usize, 0usize);
        for (b, batch) in batches.iter().enumerate() {
            let start = Instant::now();
            let (peak, met, on_host) = if one_request {
                let (data, report) =
                    array.retrieve_array_subsets_stacked_device_opt::<DeviceArray<f32>>(batch, &config)?;
                data.stream().synchronize()?;
                (report.peak_device_bytes, report.chunks, report.host_decoded_chunks)
            } else {
                let mut held = Vec::with_capacity(batch.len());
                let (mut peak, mut met, mut on_host) = (0, 0, 0);
                for subset in batch {
                    let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(subset, &config)?;
                    data.stream().synchronize()?;
                    peak = peak.max(report.peak_device_bytes);
                    met += report.chunks;
                    on_host += report.host_decoded_chunks;
                    held.push(data);
                }
                (peak, met, on_host)
            };
            let secs = start.elapsed().as_secs_f64();
            if b > 0 {
                runs.push(secs);
                peaks.push(peak as f64);
                chunks += met;
                host += on_host;
            }
        }
        let (secs, p90) = median_p90(&runs);
        let case = format!(
            "{name} batch of {n} random tiles {} {mode}",
            extent.iter().map(u64::to_string).collect::<Vec<_>>().join("x")
        );
        let row = serde_json::json!({
            "peer": ours(&config, label), "case": case,
            "subset": format!("{BATCH_ROUNDS} batches of {n} random starts, splitmix64 seed {TILE_SEED}"),
            "bytes": bytes, "seconds": secs, "gib_s": bytes as f64 / f64::from(1u32 << 30) / secs, "runs": runs,
            "median_ms": secs * 1e3, "p90_ms": p90 * 1e3, "crops_per_s": n as f64 / secs,
            "peak_device_mib": median_p90(&peaks).0 / f64::from(1u32 << 20),
            "io": format!("{} chunks decoded per batch, {} on host threads", chunks / BATCH_ROUNDS, host / BATCH_ROUNDS),
        });
        lines.push(row.to_string());
    }
    Ok(lines)
}

/// A box of whole units (`unit`, from the origin) meeting exactly `n` of them within `shape`:
/// the factorisation with the squarest last two sides, then the fewest planes. None: no box.
fn box_of_units(shape: &[u64], unit: &[u64], n: u64) -> Option<Vec<u64>> {
    let grid: Vec<u64> = shape.iter().zip(unit).map(|(&s, &u)| s / u.max(1)).collect();
    let [gz, gy, gx] = grid[..] else { return None };
    let mut best: Option<(u64, [u64; 3])> = None;
    for a in (1..=gz.min(n)).filter(|a| n.is_multiple_of(*a)) {
        for b in (1..=gy.min(n / a)).filter(|b| (n / a).is_multiple_of(*b)) {
            let c = n / a / b;
            let score = b.abs_diff(c) * 1_000_000 + a;
            if c <= gx && best.is_none_or(|(s, _)| score < s) {
                best = Some((score, [a, b, c]));
            }
        }
    }
    best.map(|(_, counts)| counts.iter().zip(unit).map(|(&k, &u)| k * u).collect())
}

/// Reads of chunk-aligned boxes meeting each of `sizes` units, `reads` times each after one
/// untimed: with the scheduler's split, then all on nvCOMP, then all on host threads (for
/// compressed cases), each read synchronised and freed. Rows give the median and p90; the
/// scheduled row also its median over the faster side's median (issue 28: at most 1.15).
fn size_rows(
    array: &Array<GdsStore>,
    name: &str,
    unit: &[u64],
    sizes: &[u64],
    reads: usize,
    compressed: bool,
    label: &str,
) -> Result<Vec<String>, Error> {
    let cache = Arc::new(ShardIndexCache::new());
    let base = bench_config(cache)?;
    let mut modes = vec![("scheduled", base.clone())];
    if compressed {
        modes.push(("all on the device decoder", base.clone().with_host_decode_fraction(Some(0.0))));
        modes.push(("all host threads", base.clone().with_decode_trust(DecodeTrust::Verified)));
    }
    let mut lines = Vec::new();
    for &n in sizes {
        let Some(extent) = box_of_units(array.shape(), unit, n) else {
            eprintln!("bench: no box of {n} chunks fits {name}; size row left out");
            continue;
        };
        let subset = ArraySubset::new_with_ranges(&extent.iter().map(|&e| 0..e).collect::<Vec<_>>());
        let spec = extent.iter().map(|e| format!("0:{e}")).collect::<Vec<_>>().join(",");
        let bytes = subset.num_elements() * 4;
        let mut medians = Vec::new();
        for (mode, config) in &modes {
            let (mut runs, mut host, mut peak, mut decoder) = (Vec::new(), 0usize, 0u64, None);
            for i in 0..=reads {
                let start = Instant::now();
                let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, config)?;
                data.stream().synchronize()?;
                let secs = start.elapsed().as_secs_f64();
                drop(data);
                if i > 0 {
                    runs.push(secs);
                    host += report.host_decoded_chunks;
                    peak = peak.max(report.peak_device_bytes);
                    decoder = report.device_decoder;
                }
            }
            let (median, p90) = median_p90(&runs);
            medians.push(median);
            let mut row = serde_json::json!({
                "peer": ours(config, label),
                "case": format!("{name} read of {n} chunks {mode}"),
                "subset": format!("{spec} ({reads} reads after one)"),
                "bytes": bytes, "seconds": median, "gib_s": bytes as f64 / f64::from(1u32 << 30) / median, "runs": runs,
                "median_ms": median * 1e3, "p90_ms": p90 * 1e3, "p90_over_median": p90 / median,
                "peak_device_mib": peak >> 20,
                "io": format!("{:.1} of {n} chunks on host threads a read", host as f64 / reads as f64),
                "decoder": decoder,
            });
            if *mode == "all host threads" {
                let faster = medians[1].min(medians[2]);
                row["scheduled_over_faster_side"] = serde_json::json!(medians[0] / faster);
            }
            lines.push(row.to_string());
        }
    }
    Ok(lines)
}

/// Device memory held by another allocator of the process, freed on drop.
struct Filler {
    ptr: u64,
    ctx: Arc<cudarc::driver::CudaContext>,
}

impl Filler {
    /// Take all of device 0's free memory but `leave` bytes.
    fn leaving(leave: u64) -> Result<Self, Error> {
        let ctx = cuda_context(0)?;
        ctx.bind_to_thread()?;
        let (free, _) = cudarc::driver::result::mem_get_info()?;
        let take = (free as u64).checked_sub(leave).ok_or(format!("{free} bytes free, fewer than {leave}"))?;
        // SAFETY: a plain allocation, freed on drop.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(take as usize) }?;
        Ok(Self { ptr, ctx })
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated in leaving(); nothing uses it.
        let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
    }
}

/// The 1 GiB slab read unconstrained, then with the device filled but for its output and
/// `extra` bytes (our pools emptied first, as a training job's allocator would have taken
/// them): medians, the ratio of the two rates, and each read's peak device memory.
fn filled_rows(
    array: &Array<GdsStore>,
    name: &str,
    extra: u64,
    repeat: usize,
    label: &str,
) -> Result<Vec<String>, Error> {
    let subset = parse_subset("0:64", array.shape())?;
    let bytes = subset.num_elements() * 4;
    let config = GpuConfig::default().with_backend(IoBackend::Auto);
    let timed = |filled: bool| -> Result<(f64, Vec<f64>, String), Error> {
        zarrs_gpu::empty_cache()?;
        let filler = if filled { Some(Filler::leaving(bytes + extra)?) } else { None };
        let mut runs = Vec::new();
        let mut io = String::new();
        for i in 0..=repeat {
            let start = Instant::now();
            let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subset, &config)?;
            let elapsed = start.elapsed().as_secs_f64();
            drop(data);
            if i > 0 {
                runs.push(elapsed);
            }
            io = format!(
                "peak device memory {} MiB; {} of {} chunks on host threads; {}",
                report.peak_device_bytes >> 20,
                report.host_decoded_chunks,
                report.chunks,
                report.schedule.unwrap_or_default()
            );
        }
        drop(filler);
        Ok((median(runs.clone()), runs, io))
    };
    let (free_secs, free_runs, free_io) = timed(false)?;
    let (secs, runs, io) = timed(true)?;
    let who = ours(&config, label);
    let case = format!("{name} 1 GiB slab");
    let io = format!("{io}; {:.2} of the unconstrained rate", free_secs / secs);
    Ok(vec![
        line(&who, &format!("{case}, unconstrained"), &subset, bytes, free_secs, &free_runs, &free_io),
        line(
            &who,
            &format!("{case}, device filled but output + {} MiB", extra >> 20),
            &subset,
            bytes,
            secs,
            &runs,
            &io,
        ),
    ])
}

/// The peer name of this project's rows: its decode trust and the run's label.
fn ours(config: &GpuConfig, label: &str) -> String {
    let who = match config.decode_trust() {
        DecodeTrust::Checked => "zarrs_gpu",
        DecodeTrust::Trusted => "zarrs_gpu (decode trust: trusted)",
        _ => "zarrs_gpu (decode trust: verified)",
    };
    let who = if config.row_reads() { who.to_string() } else { format!("{who} (row reads off)") };
    if label.is_empty() {
        who
    } else {
        format!("{who} {label}")
    }
}

fn line(who: &str, case: &str, subset: &ArraySubset, bytes: u64, secs: f64, runs: &[f64], io: &str) -> String {
    let gib_s = bytes as f64 / f64::from(1u32 << 30) / secs;
    let p90 = if runs.is_empty() { secs } else { median_p90(runs).1 };
    serde_json::json!({
        "peer": who, "case": case, "subset": format!("{:?}", subset.to_ranges()), "bytes": bytes,
        "seconds": secs, "gib_s": gib_s, "p90_seconds": p90, "runs": runs, "io": io,
    })
    .to_string()
}

/// `with_gpu_config(config, || array.retrieve_array_subset::<DeviceArray<f32>>(subset))`, the
/// array opened inside the scope (its codecs are GPU mode's).
fn gpu_mode_retrieval(
    path: &std::path::Path,
    subset: &ArraySubset,
    config: &GpuConfig,
    repeat: usize,
) -> Result<(f64, Vec<f64>), Error> {
    with_gpu_config(config.clone(), || {
        let array = Array::open(Arc::new(GdsStore::new(path)?), "/")?;
        time(repeat, || {
            let device: DeviceArray<f32> = array.retrieve_array_subset(subset)?;
            drop(device);
            Ok(())
        })
    })
}

/// zarrs decoding into a pinned buffer allocated once, then one copy to a device buffer.
fn zarrs_pinned_then_copy(
    array: &Array<GdsStore>,
    subset: &ArraySubset,
    repeat: usize,
) -> Result<(f64, Vec<f64>), Error> {
    let ctx = cuda_context(0)?;
    let len = subset.num_elements_usize() * 4;
    let mut pinned = PinnedBuffer::new(&ctx, len)?;
    let stream = ctx.default_stream();
    let mut device = unsafe { stream.alloc::<u8>(len) }?;
    let shape = subset.shape().to_vec();
    time(repeat, || {
        {
            let cells = unsafe_cell_slice::UnsafeCellSlice::new(pinned.as_mut_slice());
            // SAFETY: the view covers the whole buffer, written only by this retrieval.
            let mut view = unsafe {
                ArrayBytesFixedDisjointView::new(cells, 4, &shape, ArraySubset::new_with_shape(shape.clone()))
            }?;
            array.retrieve_array_subset_into(subset, ArrayBytesDecodeIntoTarget::Fixed(&mut view))?;
        }
        stream.memcpy_htod(pinned.as_slice(), &mut device)?;
        stream.synchronize()?;
        Ok(())
    })
}

/// The two ceilings of the uncompressed path, measured on the same data: page cache to host
/// memory with as many threads as the reader uses (no copy to the device), and pinned host memory
/// to the device (no file reads).
fn ceilings(path: &std::path::Path, array: &Array<GdsStore>) -> Result<Vec<String>, Error> {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    let subset = array.subset_all();
    let files: Vec<PathBuf> = array
        .chunks_in_array_subset(&subset)?
        .map(|grid| grid.indices().into_iter().map(|i| path.join(array.chunk_key(&i).as_str())).collect())
        .unwrap_or_default();
    let bytes: u64 = files.iter().map(|f| std::fs::metadata(f).map_or(0, |m| m.len())).sum();
    let threads = zarrs_gpu::zarrs_gpu_codecs::reader::DeviceReaderOptions::from_env()?.threads;
    let task = 4usize << 20;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
    let (secs, runs) = time(3, || {
        pool.install(|| {
            files.par_iter().try_for_each(|f| -> Result<(), Error> {
                let file = std::fs::File::open(f)?;
                let len = file.metadata()?.len();
                thread_local!(static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![1u8; 4 << 20]));
                BUF.with(|b| -> Result<(), Error> {
                    let mut b = b.borrow_mut();
                    let mut off = 0;
                    while off < len {
                        let n = (len - off).min(task as u64) as usize;
                        file.read_exact_at(&mut b[..n], off)?;
                        off += n as u64;
                    }
                    Ok(())
                })
            })
        })
    })?;
    let all = ArraySubset::new_with_shape(vec![]);
    let mut lines = vec![line("ceiling: page cache -> host", "pread only", &all, bytes, secs, &runs, "")];
    let ctx = cuda_context(0)?;
    let len = 1usize << 30;
    let pinned = PinnedBuffer::new(&ctx, len)?;
    let stream = ctx.new_stream()?;
    let mut device = unsafe { stream.alloc::<u8>(len) }?;
    let (secs, runs) = time(5, || {
        for _ in 0..4 {
            stream.memcpy_htod(pinned.as_slice(), &mut device)?;
        }
        stream.synchronize()?;
        Ok(())
    })?;
    lines.push(line("ceiling: pinned -> device", "4 x 1 GiB", &all, 4 * len as u64, secs, &runs, ""));
    Ok(lines)
}

/// The tile of issue 17's tile case: 64 planes of 256 x 256 (16 MiB of float32).
const TILE: [u64; 3] = [64, 256, 256];
/// Every list of tile starts is drawn by [`random_crops`] with this seed.
const TILE_SEED: u64 = 17;
/// Untimed reads before each tile row (the first tiles of its list, read again timed).
const TILE_WARMUP: usize = 2;

/// `count` starts of boxes of `extent` (at most `shape`) inside `shape`, drawn by
/// [`random_crops`] seeded with `TILE_SEED` (as `benches/tiles.py` draws them): any start from 0
/// to `shape - extent`, or when `aligned` a multiple of the extent (boxes wholly inside the array).
fn tile_starts(shape: &[u64], extent: &[u64], count: usize, aligned: bool) -> Vec<Vec<u64>> {
    let at = if aligned { CropStarts::OnGrid } else { CropStarts::Anywhere };
    let crops = random_crops(shape, extent, count, TILE_SEED, at).expect("the bench's boxes fit their arrays");
    crops.iter().map(|crop| crop.start().to_vec()).collect()
}

/// Chunks of shape `unit` (a regular grid from the origin) that the box `start`, `extent` meets.
fn units_met(start: &[u64], extent: &[u64], unit: &[u64]) -> u64 {
    start.iter().zip(extent).zip(unit).map(|((&s, &e), &u)| (s + e - 1) / u - s / u + 1).product()
}

/// Median (the mean of the middle two for an even count, as Python's `statistics.median`) and
/// p90 (nearest rank: the `ceil(0.9 n)`-th smallest) of `v`, not empty.
fn median_p90(v: &[f64]) -> (f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { f64::midpoint(v[n / 2 - 1], v[n / 2]) };
    let rank = (n * 9).div_ceil(10).max(1);
    (median, v[rank - 1])
}

/// The bytes-to-bytes codec of a case's chunks, for the host-thread bound.
#[derive(Clone, Copy)]
enum Compression {
    Zstd,
    Gzip,
}

/// The tile rows of one case's array.
struct Tiles<'a> {
    /// The case's name in the rows (U1, Z2, S1, ...).
    name: &'a str,
    path: &'a std::path::Path,
    array: &'a Array<GdsStore>,
    /// The stored chunks' shape: the chunk shape, or a shard's inner chunk shape.
    unit: &'a [u64],
    sharded: bool,
    /// The chunks' codec when compressed (then the rows carry the host-thread bound).
    compression: Option<Compression>,
    /// Tiles per row.
    count: usize,
}

impl Tiles<'_> {
    /// Random tiles, chunk-aligned tiles and single chunks, each read with the configuration of the
    /// whole-array rows (one [`ShardIndexCache`] kept across the three), then synchronised and freed.
    fn rows(&self, label: &str) -> Result<Vec<String>, Error> {
        let shape = self.array.shape().to_vec();
        if shape.len() != TILE.len() || shape.contains(&0) {
            return Err(format!("tiles need a non-empty array of {} dimensions, not {shape:?}", TILE.len()).into());
        }
        let clamp = |e: &[u64]| -> Vec<u64> { e.iter().zip(&shape).map(|(&e, &n)| e.min(n)).collect() };
        let (tile, unit) = (clamp(&TILE), clamp(self.unit));
        let dims = |e: &[u64]| e.iter().map(u64::to_string).collect::<Vec<_>>().join("x");
        let threads = zarrs_gpu::zarrs_gpu_codecs::reader::DeviceReaderOptions::from_env()?.threads;
        let chunk_starts = tile_starts(&shape, &unit, self.count, true);
        // One host thread decoding one stored chunk: a few of the chunks the rows read.
        let host_chunk = match self.compression {
            Some(compression) => {
                Some(self.host_decode_seconds(compression, &unit, &chunk_starts[..self.count.min(8)])?)
            }
            None => None,
        };
        let one = if self.sharded { "one inner chunk" } else { "one chunk" };
        let kinds = [
            (format!("{} random tile {}", self.name, dims(&tile)), "random starts", &tile, false),
            (format!("{} aligned tile {}", self.name, dims(&tile)), "chunk-aligned starts", &tile, true),
            (format!("{} {one} {}", self.name, dims(&unit)), "random chunks", &unit, true),
        ];
        let cache = Arc::new(ShardIndexCache::new());
        // ZARRS_GPU_ROW_READS=0 applies, for an A/B of row reads.
        let config = bench_config(cache)?;
        let who = ours(&config, label);
        let mut lines = Vec::new();
        for (case, what, extent, aligned) in kinds {
            let starts = tile_starts(&shape, extent, self.count, aligned);
            let subsets: Vec<ArraySubset> = starts
                .iter()
                .map(|s| {
                    ArraySubset::new_with_ranges(&s.iter().zip(extent).map(|(&a, &n)| a..a + n).collect::<Vec<_>>())
                })
                .collect();
            let read = |subset: &ArraySubset| -> Result<(f64, zarrs_gpu::RetrieveReport), Error> {
                let start = Instant::now();
                let (data, report) =
                    self.array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(subset, &config)?;
                data.stream().synchronize()?;
                let elapsed = start.elapsed().as_secs_f64();
                drop(data);
                Ok((elapsed, report))
            };
            for subset in subsets.iter().take(TILE_WARMUP) {
                read(subset)?;
            }
            let (mut runs, mut chunks, mut host_decoded) = (Vec::new(), Vec::new(), 0);
            let mut io = String::new();
            for subset in &subsets {
                let (secs, report) = read(subset)?;
                runs.push(secs);
                chunks.push(report.chunks as f64);
                host_decoded += report.host_decoded_chunks;
                io = format!("{}; decode {}", report.io.map(|s| s.to_string()).unwrap_or_default(), report.decode);
            }
            let (secs, p90) = median_p90(&runs);
            let met: Vec<f64> = starts.iter().map(|s| units_met(s, extent, &unit) as f64).collect();
            let bytes = extent.iter().product::<u64>() * 4;
            let io = format!(
                "{io}; chunks met per read (report) median {}; {host_decoded} of {} chunks on host threads",
                median_p90(&chunks).0,
                chunks.iter().sum::<f64>()
            );
            let subset = format!("{} {what} of {}, splitmix64 seed {TILE_SEED}", self.count, dims(extent));
            let mut row = serde_json::json!({
                "peer": who, "case": case, "subset": subset, "bytes": bytes, "seconds": secs,
                "gib_s": bytes as f64 / f64::from(1u32 << 30) / secs, "runs": runs, "io": io,
                "median_ms": secs * 1e3, "p90_ms": p90 * 1e3, "tiles": self.count,
                "chunks_per_tile": median_p90(&met).0,
            });
            if let Some(chunk) = host_chunk {
                // ceil(chunks met / threads) x one chunk's decode, per tile; the median over the tiles.
                let bounds: Vec<f64> = starts
                    .iter()
                    .map(|s| units_met(s, extent, &unit).div_ceil(threads as u64) as f64 * chunk)
                    .collect();
                let bound = median_p90(&bounds).0;
                row["host_bound_ms"] = (bound * 1e3).into();
                row["host_bound_ratio"] = (secs / bound).into();
                row["host_chunk_ms"] = (chunk * 1e3).into();
                row["host_threads"] = threads.into();
            }
            lines.push(row.to_string());
        }
        Ok(lines)
    }

    /// The median time one host thread takes to decode one stored chunk (the chunks starting at
    /// `starts`, each `unit` in shape), read from their files first.
    fn host_decode_seconds(&self, compression: Compression, unit: &[u64], starts: &[Vec<u64>]) -> Result<f64, Error> {
        use std::io::Read;
        let decoded_len = usize::try_from(unit.iter().product::<u64>() * 4)?;
        let frames = starts.iter().map(|start| self.stored_chunk(start, unit)).collect::<Result<Vec<_>, _>>()?;
        let mut zstd = zstd::bulk::Decompressor::new()?;
        let mut out = Vec::with_capacity(decoded_len);
        let mut decode = |frame: &[u8]| -> Result<f64, Error> {
            out.clear();
            let start = Instant::now();
            match compression {
                Compression::Zstd => {
                    zstd.decompress_to_buffer(frame, &mut out)?;
                }
                Compression::Gzip => {
                    flate2::read::GzDecoder::new(frame).read_to_end(&mut out)?;
                }
            }
            let secs = start.elapsed().as_secs_f64();
            if out.len() != decoded_len {
                return Err(format!("a stored chunk decoded to {} bytes, not {decoded_len}", out.len()).into());
            }
            Ok(secs)
        };
        for frame in &frames {
            decode(frame)?; // warm-up
        }
        let mut runs = Vec::new();
        for _ in 0..3 {
            for frame in &frames {
                runs.push(decode(frame)?);
            }
        }
        if runs.is_empty() {
            return Err("no stored chunk to time the host decode with".into());
        }
        Ok(median_p90(&runs).0)
    }

    /// The stored bytes of the chunk (or a shard's inner chunk) starting at `start`.
    fn stored_chunk(&self, start: &[u64], unit: &[u64]) -> Result<Vec<u8>, Error> {
        let chunk_shape: Vec<u64> = self.array.chunk_shape(&vec![0; start.len()])?.iter().map(|n| n.get()).collect();
        let indices: Vec<u64> = start.iter().zip(&chunk_shape).map(|(&s, &c)| s / c).collect();
        let file = self.path.join(self.array.chunk_key(&indices).as_str());
        let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        if !self.sharded {
            return Ok(bytes);
        }
        // The index at the end: (offset, length) per inner chunk in C order, u64 little-endian,
        // then its crc32c (as `sample::create_sharded_sample_array` writes shards).
        let per_dim: Vec<u64> = chunk_shape.iter().zip(unit).map(|(&c, &u)| c / u).collect();
        let local = start.iter().zip(&chunk_shape).zip(unit).map(|((&s, &c), &u)| (s % c) / u);
        let entry = local.zip(&per_dim).fold(0u64, |acc, (i, &n)| acc * n + i);
        let index_len = per_dim.iter().product::<u64>() * 16 + 4;
        let index_start = (bytes.len() as u64).checked_sub(index_len).ok_or("a shard shorter than its index")?;
        let at = usize::try_from(index_start + entry * 16)?;
        let word = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        if word(at) == u64::MAX && word(at + 8) == u64::MAX {
            return Err(format!("{}: inner chunk {entry} is missing", file.display()).into());
        }
        let (offset, len) = (usize::try_from(word(at))?, usize::try_from(word(at + 8))?);
        bytes
            .get(offset..offset.checked_add(len).ok_or("an inner chunk past 2^64")?)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| format!("{}: inner chunk {entry} lies outside the shard", file.display()).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_meet_exactly_the_chunks_asked_for() {
        let (shape, unit) = ([512, 2048, 2048], [64, 64, 64]);
        for (n, want) in [(1, [64, 64, 64]), (16, [64, 256, 256]), (64, [64, 512, 512]), (288, [128, 768, 768])] {
            assert_eq!(box_of_units(&shape, &unit, n), Some(want.to_vec()), "{n} chunks");
        }
        for n in [1024, 4096, 8192] {
            let b = box_of_units(&shape, &unit, n).expect("fits");
            assert_eq!(units_met(&[0, 0, 0], &b, &unit), n);
            assert!(b.iter().zip(&shape).all(|(e, s)| e <= s));
        }
        // More chunks than the grid holds, or a count no box of the grid takes.
        assert_eq!(box_of_units(&shape, &unit, 8193), None);
        assert_eq!(box_of_units(&[64, 64, 384], &unit, 7), None);
    }
}
