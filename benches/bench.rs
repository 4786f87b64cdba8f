//! Throughput benchmark: whole arrays and slabs to the GPU, ours against zarrs' own host path
//! (decode into a pinned buffer allocated once, then one copy: what a Rust user writes today).
//! The Python peers run beside it on the same data (benches/run.sh).
//!
//! ```text
//! bench --dir /tmp/bench [--gib 8] [--repeat 5] [--json results.jsonl]
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use zarrs::array::codec::{GzipCodec, ZstdCodec};
use zarrs::array::{
    Array, ArrayBytesDecodeIntoTarget, ArrayBytesFixedDisjointView, ArraySubset, BytesToBytesCodecTraits,
};
use zarrs_gpu::zarrs_gpu_codecs::reader::{cuda_context, PinnedBuffer};
use zarrs_gpu::{
    parse_subset, sample, with_gpu_config, ArrayDeviceExt, DecodeTrust, DeviceArray, GdsStore, GpuConfig, IoBackend,
    ShardIndexCache,
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
    /// s1r (the same shards, inner chunks uncompressed), s1g (gzip 5 inner chunks).
    #[arg(long, value_delimiter = ',', default_value = "u1")]
    cases: Vec<String>,
    /// Only this project's reads (no zarrs peers, no ceilings): for A/B runs of settings.
    #[arg(long)]
    ours_only: bool,
    /// A label added to this project's rows (e.g. the settings of an A/B run).
    #[arg(long, default_value = "")]
    label: String,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

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

fn main() -> std::process::ExitCode {
    match run(&Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: error: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Error> {
    // Refuse before writing gigabytes when there is nothing to measure on.
    cuda_context(0).map_err(|e| format!("{e} (the benchmark reads arrays to a GPU; run it on a machine with one)"))?;
    std::fs::create_dir_all(&args.dir)?;
    let shape = [64 * args.gib, 2048, 2048];
    let mut lines = Vec::new();
    for case in &args.cases {
        let zstd = || -> Arc<dyn BytesToBytesCodecTraits> { Arc::new(ZstdCodec::new(3, false)) };
        let gzip = || -> Result<Arc<dyn BytesToBytesCodecTraits>, Error> { Ok(Arc::new(GzipCodec::new(5)?)) };
        let (name, chunks, codecs): (&str, [u64; 3], Vec<Arc<dyn BytesToBytesCodecTraits>>) = match case.as_str() {
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
            other => return Err(format!("unknown case {other}").into()),
        };
        let sharded = case.starts_with("s1");
        let path = args.dir.join(format!("{case}.zarr"));
        if !path.join("zarr.json").exists() {
            let start = Instant::now();
            let written = if sharded {
                sample::create_sharded_sample_array(&path, &shape, &chunks, &[64, 64, 64], codecs)
            } else {
                sample::create_sample_array_with_codecs(&path, &shape, &chunks, codecs)
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
        let subsets: &[(&str, &str)] = if case == "u1" {
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
            let config = GpuConfig::default().with_backend(IoBackend::Auto).with_shard_index_cache(Some(cache));
            // Timed like a user's load: allocation and read; the previous result is freed untimed.
            let mut io = String::new();
            let mut runs = Vec::new();
            let mut held = (0, 0);
            for i in 0..=args.repeat {
                let start = Instant::now();
                let (data, report) = array.retrieve_array_subset_device_opt::<f32>(&subset, &config)?;
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
                if let Ok(m) = zarrs_gpu::memory_in_use(0) {
                    held = (m.output_pool_idle + m.staging_pooled, m.pinned_pooled);
                }
            }
            let secs = median(runs.clone());
            let who = match config.decode_trust() {
                DecodeTrust::Checked => "zarrs_gpu",
                DecodeTrust::Trusted => "zarrs_gpu (decode trust: trusted)",
                _ => "zarrs_gpu (decode trust: verified)",
            };
            let who = if args.label.is_empty() { who.to_string() } else { format!("{who} {}", args.label) };
            let io =
                format!("{io}; idle after a freed result: device {} MiB, pinned {} MiB", held.0 >> 20, held.1 >> 20);
            lines.push(line(&who, &label, &subset, bytes, secs, &runs, &io));
            if args.ours_only {
                continue;
            }
            let (secs, runs) = zarrs_pinned_then_copy(&array, &subset, args.repeat.min(3))?;
            lines.push(line("zarrs pinned+copy", &label, &subset, bytes, secs, &runs, ""));
            if *what == "whole array" {
                // zarrs' ordinary retrieval in GPU mode, the array opened inside the scope.
                let (secs, runs) = gpu_mode_retrieval(&path, &subset, &config, args.repeat.min(3))?;
                lines.push(line(
                    "zarrs GPU mode (retrieve_array_subset::<DeviceArray>)",
                    &label,
                    &subset,
                    bytes,
                    secs,
                    &runs,
                    "",
                ));
            }
        }
        if case == "u1" && !args.ours_only {
            lines.extend(ceilings(&path, &array)?);
        }
    }
    let mut out = String::new();
    for l in &lines {
        println!("{l}");
        out.push_str(l);
        out.push('\n');
    }
    if let Some(json) = &args.json {
        use std::io::Write;
        std::fs::OpenOptions::new().create(true).append(true).open(json)?.write_all(out.as_bytes())?;
    }
    Ok(())
}

fn line(who: &str, case: &str, subset: &ArraySubset, bytes: u64, secs: f64, runs: &[f64], io: &str) -> String {
    let gib_s = bytes as f64 / f64::from(1u32 << 30) / secs;
    serde_json::json!({
        "peer": who, "case": case, "subset": format!("{:?}", subset.to_ranges()), "bytes": bytes,
        "seconds": secs, "gib_s": gib_s, "runs": runs, "io": io,
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
