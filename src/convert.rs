//! `zarrs-gpu convert`: an array re-encoded into a new one (other codecs, chunks or shards)
//! through the GPU, slab after slab: each read to the device and written from there (encoded on
//! the device where the new codecs allow, else by zarrs from a host copy). Chunks carry checks
//! by default ([`Checks`]): data this writes is always checkable.

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use zarrs::array::codec::{
    BloscCodec, BloscCompressor, BloscShuffleMode, Crc32cCodec, GzipCodec, ShardingCodecBuilder, ZlibCodec, ZstdCodec,
};
use zarrs::array::{Array, ArrayBuilder, ArraySubset, BytesToBytesCodecTraits};
use zarrs_gpu::{AnyStore, ArrayDeviceExt, ArrayDeviceWriteExt, DeviceBytes, GdsStore, GpuConfig, WritePath};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of the source read to the device at once (about: whole rows of destination chunks), at
/// most: a write's last batch is stored after its encode, not beside the next one's, so fewer,
/// larger blocks overlap more. Beside a block, the device holds the read's staging and a write
/// batch's buffers (about 1 GiB together): a sixth of the free memory bounds a block below this.
const SLAB_BYTES: u64 = 4 << 30;
/// The least block (whole units still exceed it where one is larger).
const SLAB_MIN_BYTES: u64 = 256 << 20;

/// What the new array is.
pub(crate) struct Target<'a> {
    /// `none`, `zstd[:LEVEL]`, `gzip[:LEVEL]`, ... ([`CODEC_FORMS`]).
    pub(crate) codec: &'a str,
    /// The checks its chunks carry.
    pub(crate) checks: Checks,
    /// Chunk shape (inner chunks where sharded); None: the source's.
    pub(crate) chunks: Option<Vec<u64>>,
    /// Shard shape; None: not sharded.
    pub(crate) shard: Option<Vec<u64>>,
}

/// The forms `--codec` takes.
const CODEC_FORMS: &str = "none, zstd[:LEVEL], gzip[:LEVEL], zlib[:LEVEL] or blosc-{lz4,zstd}[-{noshuffle,shuffle,\
     bitshuffle}][:LEVEL]";

/// The checks a converted array's chunks carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checks {
    /// The default: zstd's content checksum (XXH64, in each frame) for zstd; a crc32c after the
    /// compressor for every other codec, `none` too. gzip and zlib carry their own CRC-32 and
    /// Adler-32, but only a crc32c lets nvCOMP decode them under the default decode trust.
    Default,
    /// A crc32c after the compressor, zstd's too (`--crc32c`): verified before nvCOMP sees a byte.
    Crc32c,
    /// None (`--no-checksum`).
    None,
}

impl Checks {
    /// What the summary line says of the checks of chunks stored with `codec`.
    fn text(self, codec: &str) -> &'static str {
        match (self, codec.split(':').next() == Some("zstd")) {
            (Checks::None, _) => "no checks (--no-checksum)",
            (Checks::Default, true) => "checked by zstd's content checksums",
            _ => "checked by crc32c",
        }
    }
}

/// The bytes-to-bytes codecs `codec` (with `checks`) names, for elements of `typesize` bytes
/// (Blosc's shuffle).
pub(crate) fn codecs(
    codec: &str,
    checks: Checks,
    typesize: usize,
) -> Result<Vec<Arc<dyn BytesToBytesCodecTraits>>, String> {
    let (name, level) = match codec.split_once(':') {
        Some((name, level)) => (name, Some(level)),
        None => (codec, None),
    };
    let level = |default: i64, range: std::ops::RangeInclusive<i64>| -> Result<i64, String> {
        let level =
            level.map_or(Ok(default), str::parse).map_err(|_| format!("--codec {codec}: the level is a number"))?;
        if range.contains(&level) {
            Ok(level)
        } else {
            Err(format!("--codec {codec}: the level lies in {range:?}"))
        }
    };
    let mut codecs: Vec<Arc<dyn BytesToBytesCodecTraits>> = match name {
        "none" if level(0, 0..=0).is_ok() => vec![],
        "zstd" => vec![Arc::new(ZstdCodec::new(level(3, -7..=22)? as i32, checks == Checks::Default))],
        "gzip" => vec![Arc::new(GzipCodec::new(level(5, 0..=9)? as u32).map_err(|e| e.to_string())?)],
        "zlib" => {
            let level = (level(1, 0..=9)? as u32).try_into().map_err(|e| format!("--codec {codec}: {e}"))?;
            vec![Arc::new(ZlibCodec::new(level))]
        }
        blosc if blosc.starts_with("blosc-") => {
            let mut parts = blosc["blosc-".len()..].splitn(2, '-');
            let compressor = match parts.next() {
                Some("lz4") => BloscCompressor::LZ4,
                Some("zstd") => BloscCompressor::Zstd,
                _ => return Err(format!("--codec {codec}: {CODEC_FORMS}")),
            };
            let shuffle = match parts.next() {
                None | Some("shuffle") => BloscShuffleMode::Shuffle,
                Some("noshuffle") => BloscShuffleMode::NoShuffle,
                Some("bitshuffle") => BloscShuffleMode::BitShuffle,
                Some(_) => return Err(format!("--codec {codec}: {CODEC_FORMS}")),
            };
            let clevel = (level(5, 0..=9)? as u8).try_into().map_err(|_| format!("--codec {codec}: a Blosc level"))?;
            let blosc =
                BloscCodec::new(compressor, clevel, None, shuffle, Some(typesize)).map_err(|e| e.to_string())?;
            vec![Arc::new(blosc)]
        }
        _ => return Err(format!("--codec {codec}: {CODEC_FORMS}")),
    };
    let zstd = name == "zstd";
    if checks == Checks::Crc32c || (checks == Checks::Default && !zstd) {
        codecs.push(Arc::new(Crc32cCodec::new()));
    }
    Ok(codecs)
}

/// Sizes from `a,b,c` (each at least 1).
pub(crate) fn sizes(flag: &str, text: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .map(|s| s.trim().parse::<u64>().ok().filter(|&v| v > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{flag} {text}: sizes of at least 1, separated by commas"))
}

/// A shape of `n` dimensions from `a,b,c` (each at least 1).
pub(crate) fn shape_arg(flag: &str, text: &str, n: usize) -> Result<Vec<u64>, String> {
    let shape = sizes(flag, text)?;
    if shape.len() != n {
        return Err(format!("{flag} {text}: {} sizes for an array of {n} dimensions", shape.len()));
    }
    Ok(shape)
}

/// The new array at `dst` (an empty or new directory: a Zarr node, or anything, there already is
/// refused): the source's shape, data type, fill value, dimension names and attributes, the
/// target's codecs and chunks. Its metadata is not stored yet: a convert that fails leaves no
/// array that reads as whole.
fn create(src: &Array<AnyStore>, dst: &Path, target: &Target) -> Result<Array<GdsStore>, Error> {
    new_store_dir(dst)?;
    let chunks = target.chunks.clone().map_or_else(|| chunk_shape(src), Ok)?;
    let elem = src.data_type().fixed_size().unwrap_or(1);
    let codecs = codecs(target.codec, target.checks, elem)?;
    let store = Arc::new(GdsStore::new(dst)?);
    let mut builder = if let Some(shard) = &target.shard {
        if shard.iter().zip(&chunks).any(|(s, c)| s % c != 0) {
            return Err(format!("--shard {shard:?} is not a multiple of the chunks {chunks:?}").into());
        }
        let inner: Vec<NonZeroU64> = chunks.iter().map(|&c| NonZeroU64::new(c).expect("at least 1")).collect();
        let sharding = ShardingCodecBuilder::new(inner, src.data_type()).bytes_to_bytes_codecs(codecs).build_arc();
        let mut b =
            ArrayBuilder::new(src.shape().to_vec(), shard.clone(), src.data_type().clone(), src.fill_value().clone());
        b.array_to_bytes_codec(sharding);
        b
    } else {
        let mut b = ArrayBuilder::new(src.shape().to_vec(), chunks, src.data_type().clone(), src.fill_value().clone());
        b.bytes_to_bytes_codecs(codecs);
        b
    };
    builder.attributes(src.attributes().clone());
    if let Some(names) = src.dimension_names() {
        builder.dimension_names(Some(names.clone()));
    }
    Ok(builder.build(store, "/")?)
}

/// Refuses `dst` where a new array cannot go: a Zarr node there already, or a directory that is
/// not empty (`convert` and `sample` write new arrays, never over data).
pub(crate) fn new_store_dir(dst: &Path) -> Result<(), Error> {
    if dst.join("zarr.json").exists() || dst.join(".zarray").exists() || dst.join(".zgroup").exists() {
        return Err(format!("{}: a Zarr node is there already (a new array is written)", dst.display()).into());
    }
    if std::fs::read_dir(dst).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(format!("{}: the directory is not empty (a new array is written)", dst.display()).into());
    }
    if dst.exists() && !dst.is_dir() {
        return Err(format!("{}: not a directory (a new array is written as one)", dst.display()).into());
    }
    Ok(())
}

/// The source's chunk shape (its shards' for a sharded source): the new chunks by default.
pub(crate) fn chunk_shape(src: &Array<AnyStore>) -> Result<Vec<u64>, Error> {
    Ok(src.chunk_shape(&vec![0; src.dimensionality()])?.iter().map(|c| c.get()).collect())
}

/// The blocks a convert reads and writes: whole units (the new chunks, or shards) that tile
/// `shape`, each within `budget` bytes where one unit allows: the last dimensions kept whole as
/// long as they fit, the first ones cut to as many units as fit.
pub(crate) fn blocks(shape: &[u64], unit: &[u64], elem: u64, budget: u64) -> Vec<ArraySubset> {
    let mut block: Vec<u64> = shape.iter().map(|&n| n.max(1)).collect();
    let bytes = |b: &[u64]| b.iter().fold(elem, |acc, &n| acc.saturating_mul(n));
    for d in 0..block.len() {
        if bytes(&block) <= budget {
            break;
        }
        // As many units along `d` as fit with the dimensions after it whole (one at least).
        let rest = bytes(&block) / block[d].max(1);
        let units = (budget / rest.saturating_mul(unit[d]).max(1)).max(1);
        block[d] = units.saturating_mul(unit[d]).min(block[d]);
    }
    // The grid of blocks, in C order.
    let counts: Vec<u64> = shape.iter().zip(&block).map(|(&n, &b)| n.div_ceil(b)).collect();
    if counts.contains(&0) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut index = vec![0u64; shape.len()];
    loop {
        let ranges: Vec<std::ops::Range<u64>> =
            index.iter().zip(&block).zip(shape).map(|((&i, &b), &n)| i * b..((i + 1) * b).min(n)).collect();
        out.push(ArraySubset::new_with_ranges(&ranges));
        // The next index, the last dimension fastest; done after the last.
        let Some(d) = (0..index.len()).rev().find(|&d| index[d] + 1 < counts[d]) else { break };
        index[d] += 1;
        index[d + 1..].iter_mut().for_each(|i| *i = 0);
    }
    out
}

/// Convert `src` into a new array at `dst`, slab after slab (its bytes, whatever their data
/// type); print what it did.
pub(crate) fn convert(src: &Array<AnyStore>, dst: &Path, target: &Target, config: &GpuConfig) -> Result<(), Error> {
    let dt = src.data_type();
    let elem = zarrs_gpu::element::element_type(dt)
        .and(dt.fixed_size())
        .ok_or_else(|| format!("data type {dt} is not read to the device (fixed-size numeric types are)"))?
        as u64;
    let out = create(src, dst, target)?;
    let shape = src.shape().to_vec();
    // Blocks of whole new chunks (or shards), within what the device has free.
    let unit: Vec<u64> = out.chunk_shape(&vec![0; shape.len()])?.iter().map(|n| n.get()).collect();
    // An array without elements has no block: its metadata alone, no device asked for.
    let budget = if shape.contains(&0) {
        SLAB_MIN_BYTES
    } else {
        let free = zarrs_gpu::memory_in_use(config.device())?.device_free;
        (free / 6).clamp(SLAB_MIN_BYTES, SLAB_BYTES)
    };
    let blocks = blocks(&shape, &unit, elem, budget);
    let total = shape.iter().product::<u64>().saturating_mul(elem);
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}")?);
    let start = Instant::now();
    let (mut stored, mut encoded, mut host) = (0u64, 0u64, None);
    for slab in blocks {
        let (data, _) = src.retrieve_array_subset_device_opt::<DeviceBytes>(&slab, config)?;
        let report = out.store_array_subset_device_opt(&slab, &data, config)?;
        if report.path == WritePath::Host {
            host.clone_from(&report.reason);
        }
        stored += report.bytes_stored;
        encoded += report.bytes_encoded;
        bar.inc(slab.num_elements() * elem);
    }
    // Every block written: now the array exists.
    out.store_metadata()?;
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} -> {}: {} bytes in {secs:.2} s ({:.2} GiB/s); {}; {}",
        src.path(),
        dst.display(),
        total,
        total as f64 / f64::from(1u32 << 30) / secs.max(1e-9),
        match host {
            Some(reason) => format!("encoded by zarrs on the host: {reason}"),
            None if total == 0 => "no elements: the metadata alone".to_string(),
            None => format!("encoded on the device, ratio {:.2}", encoded as f64 / stored.max(1) as f64),
        },
        target.checks.text(target.codec)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_and_shape_arguments_are_checked_before_any_work() {
        let none = Checks::None;
        assert_eq!(codecs("none", none, 4).unwrap().len(), 0);
        assert_eq!(codecs("zstd", Checks::Crc32c, 4).unwrap().len(), 2);
        assert_eq!(codecs("zstd:-3", none, 4).unwrap().len(), 1);
        assert_eq!(codecs("gzip:9", none, 4).unwrap().len(), 1);
        assert_eq!(codecs("zlib:6", Checks::Crc32c, 4).unwrap().len(), 2);
        for blosc in ["blosc-lz4", "blosc-zstd-bitshuffle:3", "blosc-lz4-noshuffle:9", "blosc-zstd-shuffle"] {
            assert_eq!(codecs(blosc, none, 2).unwrap().len(), 1, "{blosc}");
        }
        for bad in ["lz4", "zstd:x", "zstd:23", "gzip:10", "none:1", "", "zlib:12", "blosc-snappy", "blosc-lz4-twice"] {
            for checks in [Checks::Default, Checks::Crc32c, none] {
                assert!(codecs(bad, checks, 4).unwrap_err().contains("--codec"), "{bad}");
            }
        }
        assert_eq!(shape_arg("--chunks", "64, 64,32", 3).unwrap(), [64, 64, 32]);
        assert!(shape_arg("--chunks", "64,0,32", 3).unwrap_err().contains("at least 1"));
        assert!(shape_arg("--chunks", "64,64", 3).unwrap_err().contains("2 sizes for an array of 3"));
    }

    /// The chain's v3 metadata, as the new array's zarr.json holds it.
    fn chain(codec: &str, checks: Checks) -> Vec<serde_json::Value> {
        codecs(codec, checks, 4)
            .unwrap()
            .iter()
            .map(|c| {
                let name = c.name_v3().map(|n| n.to_string()).unwrap_or_default();
                let configuration = c.configuration_v3(&zarrs::array::CodecMetadataOptions::default());
                serde_json::json!({"name": name, "configuration": serde_json::to_value(configuration).unwrap()})
            })
            .collect()
    }

    /// Data convert writes is checkable unless asked otherwise: zstd frames with their content
    /// checksum, every other codec (none too) followed by a crc32c; `--crc32c` puts a crc32c after
    /// zstd instead, and `--no-checksum` leaves checks out.
    #[test]
    fn chunks_carry_checks_by_default() {
        let names = |codec, checks| chain(codec, checks).iter().map(|c| c["name"].clone()).collect::<Vec<_>>();
        let zstd = chain("zstd:5", Checks::Default);
        assert_eq!(zstd.len(), 1, "{zstd:?}");
        assert_eq!((&zstd[0]["name"], &zstd[0]["configuration"]["checksum"]), (&"zstd".into(), &true.into()));
        assert_eq!(zstd[0]["configuration"]["level"], 5);
        for codec in ["none", "gzip", "zlib:3", "blosc-lz4", "blosc-zstd-bitshuffle"] {
            let got = names(codec, Checks::Default);
            assert_eq!(got.last(), Some(&"crc32c".into()), "{codec}: {got:?}");
            assert_eq!(got.len(), if codec == "none" { 1 } else { 2 }, "{codec}: {got:?}");
            assert!(!names(codec, Checks::None).contains(&"crc32c".into()), "{codec}");
        }
        let crc = chain("zstd", Checks::Crc32c);
        assert_eq!(crc.iter().map(|c| c["name"].clone()).collect::<Vec<_>>(), ["zstd", "crc32c"]);
        assert_eq!(crc[0]["configuration"]["checksum"], false, "{crc:?}");
        let bare = chain("zstd", Checks::None);
        assert_eq!((bare.len(), &bare[0]["configuration"]["checksum"]), (1, &false.into()), "{bare:?}");
        assert_eq!(Checks::Default.text("zstd:3"), "checked by zstd's content checksums");
        assert_eq!(Checks::Default.text("gzip"), "checked by crc32c");
    }

    /// Every element once, in whole units, within the budget where one unit allows.
    #[test]
    fn blocks_tile_the_array_in_whole_units_within_the_budget() {
        let covered = |blocks: &[ArraySubset]| blocks.iter().map(ArraySubset::num_elements).sum::<u64>();
        // Whole planes fit: blocks cut along the first dimension only, in whole units.
        let b = blocks(&[100, 64, 64], &[8, 32, 32], 4, 8 * 64 * 64 * 4 * 3);
        assert_eq!(b[0].to_ranges(), [0..24, 0..64, 0..64]);
        assert_eq!((b.len(), covered(&b)), (5, 100 * 64 * 64));
        // A plane too large: the second dimension is cut too.
        let b = blocks(&[10, 1000, 100], &[4, 10, 100], 1, 4 * 30 * 100);
        assert_eq!(b[0].to_ranges(), [0..4, 0..30, 0..100]);
        assert_eq!(covered(&b), 10 * 1000 * 100);
        assert!(b.iter().all(|s| s.num_elements() <= 4 * 30 * 100));
        // One unit larger than the budget: one unit a block.
        let b = blocks(&[9, 9], &[4, 4], 8, 16);
        assert_eq!((b.len(), b[0].to_ranges()), (9, vec![0..4, 0..4]));
        // A 0-d array is one block of its one element; an empty one none.
        assert_eq!(blocks(&[], &[], 4, 1 << 30).len(), 1);
        assert!(blocks(&[0, 5], &[2, 2], 4, 1 << 30).is_empty());
    }
}
