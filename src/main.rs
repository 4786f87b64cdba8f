//! `zarrs-gpu`: load Zarr arrays into GPU memory from the command line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, Subcommand};

mod convert;
mod info;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use zarrs::array::{Array, ArraySubset, DataType};
use zarrs_gpu::{
    parse_subset, sample, zarrs_gpu_codecs::reader::DeviceReadError, AnyStore, ArrayDeviceExt, DecodePath, DecodeTrust,
    DeviceBytes, GpuConfig, GpuError, IoBackend, IoPath, OpenError, RetrieveReport, ShardIndexCache,
};

#[derive(Parser)]
#[command(name = "zarrs-gpu", version, about = "Load Zarr arrays (v2 and v3) straight into NVIDIA GPU memory")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load an array (or a subset) to the GPU; print size, time, GiB/s and the I/O path.
    /// With no PATH, write a sample array to a temporary directory and read that (`sample`
    /// writes one to keep, without a GPU).
    Read {
        /// The Zarr store: a directory, or an object store's URL (s3://BUCKET/PREFIX with the
        /// AWS_* environment: AWS_ENDPOINT, AWS_REGION, AWS_ACCESS_KEY_ID, ..., then the
        /// AWS_PROFILE profile of ~/.aws/credentials and ~/.aws/config; http(s)://HOST/PREFIX).
        path: Option<PathBuf>,
        /// The array's node path inside the store.
        #[arg(long, default_value = "/")]
        array: String,
        /// Numpy-style slices per dimension, e.g. `0:64,:,:`, `-16:`, `...,0:8` (default: the
        /// whole array; negative numbers count from the end; steps are not supported).
        #[arg(long, default_value = "", hide_default_value = true, allow_hyphen_values = true)]
        subset: String,
        /// I/O backend: auto, gds or posix. Default: ZARRS_GDS_BACKEND, else auto.
        #[arg(long)]
        backend: Option<IoBackend>,
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Which chunks the device may decode: verified (crc32c first), checked (also zstd frames
        /// checked on the host, by our decoder; the default) or trusted (everything, nvCOMP's
        /// zstd and gzip without crc32c too).
        /// Default: ZARRS_GPU_DECODE_TRUST, else checked.
        #[arg(long)]
        decode_trust: Option<DecodeTrust>,
        /// Timed repetitions (the first read also sets up the device).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Print the SHA-256 of the retrieved bytes (C order, little-endian), copied back to the host.
        #[arg(long)]
        digest: bool,
        /// Write the retrieved array as a .npy file.
        #[arg(long)]
        npy: Option<PathBuf>,
        /// Print the last read's time in each stage of the device pipeline and the path it took.
        #[arg(long)]
        stats: bool,
        /// Print one JSON object (the figures, the report and the stages) instead of text, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Re-encode an array into a new one (other codecs, chunks or shards) through the GPU: slab
    /// after slab read to the device and written from there, encoded on the device where the new
    /// codecs allow (zstd, gzip, zlib, Blosc lz4 or zstd, crc32c, none), else by zarrs. Chunks
    /// carry checks unless --no-checksum: zstd's content checksum, or a crc32c.
    Convert {
        /// The source Zarr store (a directory, or an s3:// or http(s):// URL as for `read`).
        src: PathBuf,
        /// The new store (a new or empty directory): the array at its root, Zarr v3, its metadata
        /// written once every block is.
        dst: PathBuf,
        /// The source array's node path.
        #[arg(long, default_value = "/")]
        array: String,
        /// The new codec: none, zstd[:LEVEL] (default level 3), gzip[:LEVEL] (default 5),
        /// zlib[:LEVEL] (default 1) or blosc-{lz4,zstd}[-{noshuffle,shuffle,bitshuffle}][:LEVEL]
        /// (default byte shuffle, level 5). nvCOMP has no zstd levels: a level applies where host
        /// threads encode (small batches, ZARRS_GPU_HOST_ENCODE_LEVEL).
        #[arg(long, default_value = "zstd")]
        codec: String,
        /// Check each chunk with a crc32c after the compressor (zstd's too, instead of its content
        /// checksum): verified before nvCOMP sees a byte (decode trust "verified").
        #[arg(long, conflicts_with = "no_checksum")]
        crc32c: bool,
        /// Write chunks without checks. By default zstd frames carry their content checksum and
        /// every other codec, none too, is followed by a crc32c, so that damage in storage is
        /// always an error.
        #[arg(long)]
        no_checksum: bool,
        /// The new chunk shape, e.g. 64,64,64 (inner chunks with --shard; default: the source's
        /// chunk grid, its shards for a sharded source).
        #[arg(long)]
        chunks: Option<String>,
        /// Shards of this shape holding the chunks, e.g. 256,256,256.
        #[arg(long)]
        shard: Option<String>,
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
    /// Write a sample array to keep (float32, a smooth signal plus noise, uncompressed: the one
    /// `read` without PATH reads) into a new directory, for `info` and `read`; needs no GPU.
    Sample {
        /// The new store (a new or empty directory): the array at its root, Zarr v3.
        dst: PathBuf,
        /// The array's shape.
        #[arg(long, default_value = "256,512,512")]
        shape: String,
        /// The chunk shape, as many sizes as the shape (default: 64,128,128 for three
        /// dimensions, else 64 each; never larger than the shape).
        #[arg(long)]
        chunks: Option<String>,
    },
    /// Print an array's metadata and how each codec would be decoded; for a group, its arrays
    /// (and OME-Zarr multiscale levels) with shapes, data types, chunks and decode routes.
    Info {
        /// The Zarr store (a directory, or an s3:// or http(s):// URL as for `read`).
        path: PathBuf,
        /// The node path inside the store (an array or a group; the leading `/` is optional).
        #[arg(long, default_value = "/")]
        array: String,
    },
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    // Asked before parsing, so that a usage error is JSON too where JSON was asked for.
    let json_asked = std::env::args_os().skip(1).any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if json_asked && err.use_stderr() => {
            // clap's text: "error: ..." first, then the usage and where help is.
            let text = err.render().to_string();
            let message = text.lines().next().unwrap_or_default().trim_start_matches("error: ").to_string();
            println!("{}", serde_json::json!({"error": message, "kind": "usage", "usage": text.trim_end()}));
            return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
        }
        Err(err) => err.exit(),
    };
    let context = ErrorContext::of(&cli);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // 2 for arguments that cannot be used, as clap's own errors; 1 for work that failed.
            let usage = err.downcast_ref::<Failed>().is_some_and(|f| USAGE_KINDS.contains(&f.kind));
            if context.json {
                // The same stream as a read's JSON object: a script reads one object either way.
                println!("{}", context.error_json(err.as_ref()));
            } else {
                eprintln!("zarrs-gpu: error: {err}");
            }
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

/// The kinds of [`Failed`] that are bad arguments: exit code 2.
const USAGE_KINDS: [&str; 6] = ["codec", "chunks", "shard", "shape", "subset", "npy"];

/// What a failed command was asked, for its `--json` error object.
struct ErrorContext {
    json: bool,
    command: &'static str,
    path: Option<PathBuf>,
    array: String,
    subset: Option<String>,
}

impl ErrorContext {
    fn of(cli: &Cli) -> Self {
        match &cli.command {
            Command::Read { path, array, subset, json, .. } => Self {
                json: *json,
                command: "read",
                path: path.clone(),
                array: array.clone(),
                subset: Some(subset.clone()),
            },
            Command::Info { path, array } => {
                Self { json: false, command: "info", path: Some(path.clone()), array: array.clone(), subset: None }
            }
            Command::Convert { src, array, .. } => {
                Self { json: false, command: "convert", path: Some(src.clone()), array: array.clone(), subset: None }
            }
            Command::Sample { dst, .. } => {
                Self { json: false, command: "sample", path: Some(dst.clone()), array: "/".into(), subset: None }
            }
        }
    }

    /// `{"error": message, "kind": ..., "command", "path", "array", "subset"}`, and for a node
    /// that is not an array what is there instead (`nearest_group`, `arrays`, `levels`).
    fn error_json(&self, err: &(dyn std::error::Error + 'static)) -> serde_json::Value {
        let mut object = serde_json::json!({
            "error": err.to_string(),
            "kind": "error",
            "command": self.command,
            "path": self.path.as_ref().map(|p| p.display().to_string()),
            "array": zarrs_gpu::open::node_path(&self.array),
            "subset": self.subset,
        });
        let kind = if let Some(err) = err.downcast_ref::<Failed>() {
            err.kind
        } else if let Some(err) = err.downcast_ref::<OpenError>() {
            match err {
                OpenError::NodeNotFound { nearest_group, arrays, levels, .. } => {
                    object["nearest_group"] = serde_json::json!(nearest_group);
                    object["arrays"] = serde_json::json!(arrays);
                    object["levels"] = serde_json::json!(levels);
                    "node_not_found"
                }
                OpenError::IsAGroup { arrays, levels, .. } => {
                    object["arrays"] = serde_json::json!(arrays);
                    object["levels"] = serde_json::json!(levels);
                    "is_a_group"
                }
                _ => "open",
            }
        } else if let Some(err) = err.downcast_ref::<GpuError>() {
            match err {
                GpuError::NoCuda(_) => "no_cuda",
                GpuError::Config { .. } => "config",
                _ => "read",
            }
        } else if let Some(err) = err.downcast_ref::<DeviceReadError>() {
            // `read` without PATH asks for the device itself, before writing its sample.
            match err {
                DeviceReadError::NoCuda(_) => "no_cuda",
                DeviceReadError::Config { .. } => "config",
                _ => "read",
            }
        } else {
            "error"
        };
        object["kind"] = kind.into();
        object
    }
}

/// An error of a step of a command that the `--json` error object names (`kind`).
#[derive(Debug)]
struct Failed {
    kind: &'static str,
    message: String,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failed {}

fn failed(kind: &'static str) -> impl FnOnce(String) -> Failed {
    move |message| Failed { kind, message }
}

fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Info { path, array } => info::info(&path, &array),
        Command::Sample { dst, shape, chunks } => write_sample(&dst, &shape, chunks.as_deref()),
        Command::Convert { src, dst, array, codec, crc32c, no_checksum, chunks, shard, device } => {
            // The codec's form first: a bad --codec is a usage error whatever the source is.
            let checks = match (crc32c, no_checksum) {
                (true, _) => convert::Checks::Crc32c,
                (false, true) => convert::Checks::None,
                (false, false) => convert::Checks::Default,
            };
            convert::codecs(&codec, checks, 1).map_err(failed("codec"))?;
            let source = open(&src, &array)?;
            let n = source.dimensionality();
            // Every argument checked before the device is asked for.
            let elem = source.data_type().fixed_size().unwrap_or(1);
            convert::codecs(&codec, checks, elem).map_err(failed("codec"))?;
            let chunks = chunks.map(|c| convert::shape_arg("--chunks", &c, n)).transpose().map_err(failed("chunks"))?;
            let shard = shard.map(|s| convert::shape_arg("--shard", &s, n)).transpose().map_err(failed("shard"))?;
            if let Some(shard) = &shard {
                let chunks = chunks.clone().map_or_else(|| convert::chunk_shape(&source), Ok)?;
                if shard.iter().zip(&chunks).any(|(s, c)| s % c != 0) {
                    return Err(failed("shard")(format!(
                        "--shard {shard:?} is not a multiple of the chunks {chunks:?}"
                    ))
                    .into());
                }
            }
            let target = convert::Target { codec: &codec, checks, chunks, shard };
            let config = GpuConfig::from_env()?.with_device(device);
            convert::convert(&source, &dst, &target, &config)
        }
        Command::Read { path, array, subset, backend, device, decode_trust, repeat, digest, npy, stats, json } => {
            // The environment first (every bad value an error naming its variable), then flags.
            // Shard indexes are kept between the repeats.
            let cache = Some(Arc::new(ShardIndexCache::new()));
            let mut config = GpuConfig::from_env()?.with_device(device).with_shard_index_cache(cache);
            if let Some(backend) = backend {
                config = config.with_backend(backend);
            }
            if let Some(trust) = decode_trust {
                config = config.with_decode_trust(trust);
            }
            if let Some(npy) = &npy {
                npy_target_ok(npy).map_err(failed("npy"))?;
            }
            let (path, _sample_dir) = sample::given_or_sample(path.as_deref(), "sample.zarr", |path| {
                // No 256 MiB written for nothing: the device first.
                zarrs_gpu::zarrs_gpu_codecs::reader::cuda_context(device).map_err(|err| match err {
                    DeviceReadError::NoCuda(why) => DeviceReadError::NoCuda(format!(
                        "{why} (`zarrs-gpu sample DIR` writes the sample array without one, for `info DIR`)"
                    )),
                    err => err,
                })?;
                let (shape, chunks) = (SAMPLE_SHAPE, SAMPLE_CHUNKS);
                eprintln!("writing a sample float32 array {shape:?} (chunks {chunks:?}) to {}", path.display());
                sample::create_sample_array(path, &shape, &chunks)?;
                Ok(())
            })?;
            let array = open(&path, &array)?;
            let subset = parse_subset(&subset, array.shape()).map_err(failed("subset"))?;
            let options = ReadOptions { repeat: repeat.max(1), digest, npy, stats, json };
            read(&array, &subset, &config, &options)
        }
    }
}

/// The sample array's shape and chunks (`read` without PATH, and `sample`'s defaults).
const SAMPLE_SHAPE: [u64; 3] = [256, 512, 512];
/// See [`SAMPLE_SHAPE`].
const SAMPLE_CHUNKS: [u64; 3] = [64, 128, 128];

/// `sample`: the sample array at `dst` (a new or empty directory), with no device asked for.
fn write_sample(dst: &Path, shape: &str, chunks: Option<&str>) -> Result<(), Error> {
    let shape = convert::sizes("--shape", shape).map_err(failed("shape"))?;
    let chunks = match chunks {
        Some(chunks) => convert::shape_arg("--chunks", chunks, shape.len()).map_err(failed("chunks"))?,
        None if shape.len() == SAMPLE_CHUNKS.len() => shape.iter().zip(SAMPLE_CHUNKS).map(|(&n, c)| n.min(c)).collect(),
        None => shape.iter().map(|&n| n.min(64)).collect(),
    };
    convert::new_store_dir(dst)?;
    let bytes = shape
        .iter()
        .try_fold(4u64, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| failed("shape")(format!("--shape {shape:?}: more than 2^64 bytes")))?;
    sample::create_sample_array(dst, &shape, &chunks)?;
    println!(
        "wrote a sample float32 array {shape:?} (chunks {chunks:?}, {:.1} MiB) to {}; next: `zarrs-gpu info {1}`, \
         `zarrs-gpu read {1}` (needs a GPU)",
        bytes as f64 / f64::from(1u32 << 20),
        dst.display()
    );
    Ok(())
}

/// Where `--npy` writes can take a file, checked before any read (which may take minutes): its
/// directory exists and the path is not a directory.
fn npy_target_ok(npy: &Path) -> Result<(), String> {
    let dir = match npy.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!("--npy {}: the directory {} does not exist", npy.display(), dir.display()));
    }
    if npy.is_dir() {
        return Err(format!("--npy {}: is a directory (give a file name)", npy.display()));
    }
    Ok(())
}

fn open(path: &Path, node: &str) -> Result<Array<AnyStore>, Error> {
    Ok(zarrs_gpu::open_array(path, node, "--array")?)
}

struct ReadOptions {
    repeat: usize,
    digest: bool,
    npy: Option<PathBuf>,
    stats: bool,
    json: bool,
}

fn unsupported(dt: &DataType) -> Error {
    format!("data type {dt} is not supported by the command line (fixed-size numeric types are)").into()
}

/// `repeat` reads of `subset` to the device (its bytes, whatever their data type), shown.
fn read(array: &Array<AnyStore>, subset: &ArraySubset, config: &GpuConfig, o: &ReadOptions) -> Result<(), Error> {
    let dt = array.data_type();
    let (_, typestr) = zarrs_gpu::element::element_type(dt).ok_or_else(|| unsupported(dt))?;
    // numpy has no bfloat16: its .npy holds 2-byte raw values.
    let npy_descr = typestr.unwrap_or("<V2");
    let (times, data, reports) = timed_reads(array, subset, config, o.repeat)?;
    let report = reports.last().cloned().ok_or("--repeat must be 1 or more")?;
    let host = if o.digest || o.npy.is_some() { Some(data.to_host_bytes()?) } else { None };
    let sha256 = host.as_ref().filter(|_| o.digest).map(|h| format!("{:x}", Sha256::digest(h)));
    if let (Some(path), Some(host)) = (&o.npy, &host) {
        write_npy(path, npy_descr, data.shape(), host)?;
    }
    let timing = Timing::of(&times, data.num_bytes());
    let shown = Shown {
        array,
        config,
        shape: data.shape(),
        bytes: data.num_bytes(),
        report: &report,
        reports: &reports,
        sha256,
    };
    if o.json {
        println!("{}", shown.json(&timing, o));
    } else {
        shown.print(&timing, o);
    }
    Ok(())
}

/// Each read's seconds, the last read's array, and each read's report.
type TimedReads = (Vec<f64>, DeviceBytes, Vec<RetrieveReport>);

/// `repeat` reads of `subset`, each timed (the previous result freed first), with a progress bar
/// on stderr for reads that last; the times, the last read and every read's report.
fn timed_reads(
    array: &Array<AnyStore>,
    subset: &ArraySubset,
    config: &GpuConfig,
    repeat: usize,
) -> Result<TimedReads, Error> {
    let mut times = Vec::new();
    let mut reports = Vec::new();
    let mut last: Option<DeviceBytes> = None;
    // Chunks done, batch by batch, on stderr; indicatif draws nothing when it is not a terminal,
    // and a short read is over before the first draw.
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} chunks, {elapsed}")?.progress_chars("=> "),
    );
    let shown = bar.clone();
    let config = config.clone().with_progress(move |p| {
        if shown.is_hidden() && shown.elapsed() > std::time::Duration::from_millis(500) {
            shown.set_draw_target(ProgressDrawTarget::stderr());
        }
        shown.set_length(p.total as u64);
        shown.set_position(p.done as u64);
    });
    for r in 0..repeat {
        drop(last.take()); // free the previous result first
        bar.reset();
        bar.set_message(format!("read {}/{}", r + 1, repeat));
        let start = Instant::now();
        let result = array.retrieve_array_subset_device_opt::<DeviceBytes>(subset, &config);
        bar.finish_and_clear();
        bar.set_draw_target(ProgressDrawTarget::hidden()); // the next read shows it after 500 ms too
        let (data, report) = result?;
        times.push(start.elapsed().as_secs_f64());
        reports.push(report);
        last = Some(data);
    }
    let data = last.ok_or("--repeat must be 1 or more")?;
    Ok((times, data, reports))
}

/// The reads' times: best, median, first, and the GiB read each time.
struct Timing<'a> {
    times: &'a [f64],
    best: f64,
    median: f64,
    gib: f64,
}

impl<'a> Timing<'a> {
    fn of(times: &'a [f64], bytes: usize) -> Self {
        // The library checked the subset's size (a size that overflows is refused before any read).
        let gib = bytes as f64 / f64::from(1u32 << 30);
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        let mut sorted = times.to_vec();
        sorted.sort_by(f64::total_cmp);
        Self { times, best, median: sorted[sorted.len() / 2], gib }
    }
}

/// What `read` shows of the last read.
struct Shown<'a> {
    array: &'a Array<AnyStore>,
    config: &'a GpuConfig,
    shape: &'a [u64],
    bytes: usize,
    report: &'a RetrieveReport,
    /// Every read's report, the last one's too.
    reports: &'a [RetrieveReport],
    sha256: Option<String>,
}

impl Shown<'_> {
    /// One JSON object (`--json`).
    fn json(&self, t: &Timing<'_>, o: &ReadOptions) -> serde_json::Value {
        let (report, io) = (self.report, self.report.io.as_ref());
        let stages_of = |r: &RetrieveReport| -> Vec<serde_json::Value> {
            r.stages
                .iter()
                .map(|s| serde_json::json!({"stage": s.stage, "seconds": s.time.as_secs_f64(), "count": s.count}))
                .collect()
        };
        let stages = stages_of(report);
        // Each read in turn: what the scheduler chose and where the time went (reads of one
        // subset that differ in time differ here).
        let reads: Vec<_> = self
            .reports
            .iter()
            .zip(t.times)
            .map(|(r, &seconds)| {
                serde_json::json!({
                    "seconds": seconds, "host_decoded_chunks": r.host_decoded_chunks, "schedule": r.schedule,
                    "peak_device_bytes": r.peak_device_bytes, "stages": stages_of(r),
                })
            })
            .collect();
        serde_json::json!({
            "shape": self.shape,
            "data_type": self.array.data_type().to_string(),
            "device": self.config.device(),
            "bytes": self.bytes,
            "seconds": t.times,
            "best_seconds": t.best,
            "median_seconds": t.median,
            "best_gib_s": t.gib / t.best,
            "median_gib_s": t.gib / t.median,
            "decode": match report.decode {
                DecodePath::Device => "device",
                _ => "host",
            },
            "io_path": io.map(|s| match s.path {
                IoPath::Gds => "gds",
                IoPath::Posix => "posix",
                _ => "staged",
            }),
            "io_reason": io.map(|s| s.reason.clone()),
            "chunks": report.chunks,
            "missing_chunks": report.missing_chunks,
            "host_decoded_chunks": report.host_decoded_chunks,
            "bytes_read": report.bytes_read,
            "peak_device_bytes": report.peak_device_bytes,
            "host_reason": report.host_reason,
            "schedule": report.schedule,
            "device_decoder": report.device_decoder,
            "stages": stages,
            "reads": reads,
            "sha256": self.sha256,
            "npy": o.npy.as_ref().map(|p| p.display().to_string()),
        })
    }

    /// Lines for a person: the rates, the paths taken, and with `--stats` the stages.
    fn print(&self, t: &Timing<'_>, o: &ReadOptions) {
        let report = self.report;
        println!(
            "read {:.3} GiB, shape {:?}, {} on device {}: best {:.4} s ({:.2} GiB/s), median {:.4} s ({:.2} GiB/s), first {:.4} s",
            t.gib,
            self.shape,
            self.array.data_type(),
            self.config.device(),
            t.best,
            t.gib / t.best,
            t.median,
            t.gib / t.median,
            t.times[0]
        );
        println!(
            "decode: {}; io: {}; chunks: {} ({} missing, {} decoded on host threads); bytes read: {}; peak device memory: {} MiB",
            report.decode,
            report.io.as_ref().map_or_else(|| "zarrs host reads".to_string(), ToString::to_string),
            report.chunks,
            report.missing_chunks,
            report.host_decoded_chunks,
            report.bytes_read,
            report.peak_device_bytes.div_ceil(1 << 20)
        );
        if o.stats {
            if let Some(decoder) = &report.device_decoder {
                println!("device decoder: {decoder}");
            }
            if let Some(schedule) = &report.schedule {
                println!("scheduler (last batch): {schedule}");
            }
            match report.stages.as_slice() {
                [] => println!(
                    "stages: none (zarrs decoded on the host: {})",
                    report.host_reason.as_deref().unwrap_or("")
                ),
                stages => {
                    println!("stages of the last read (host clock, summed over batches):");
                    for s in stages {
                        println!("  {:<12} {:>9.3} ms  x{}", s.stage, s.time.as_secs_f64() * 1e3, s.count);
                    }
                }
            }
        }
        if let Some(sha256) = &self.sha256 {
            println!("sha256: {sha256}");
        }
        if let Some(path) = &o.npy {
            println!("wrote {}", path.display());
        }
    }
}

fn write_npy(path: &Path, descr: &str, shape: &[u64], bytes: &[u8]) -> Result<(), Error> {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 and a newline.
    let total = (10 + header.len() + 1).next_multiple_of(64);
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    file.write_all(b"\x93NUMPY\x01\x00")?;
    file.write_all(&u16::try_from(header.len())?.to_le_bytes())?;
    file.write_all(header.as_bytes())?;
    file.write_all(bytes)?;
    file.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_targets_are_checked_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        // A bare file name is in the current directory (its parent is the empty path).
        assert_eq!(npy_target_ok(Path::new("out.npy")), Ok(()));
        assert_eq!(npy_target_ok(&dir.path().join("out.npy")), Ok(()));
        let err = npy_target_ok(&dir.path().join("no/out.npy")).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
        assert!(npy_target_ok(dir.path()).unwrap_err().contains("is a directory"));
    }
}
