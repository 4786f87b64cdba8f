//! What the device zstd decoder (by default ours, which `DecodeTrust::Checked` gives frames that
//! nothing verifies; nvCOMP's under `ZARRS_GPU_ZSTD_DECODER=nvcomp`) does with the damaged zstd
//! frames (no checksum) that pass the host check although libzstd rejects them or decodes them to
//! other bytes: each frame read must be an error, or libzstd's bytes (the original ones where
//! libzstd rejects it), never other bytes returned as a success; and with our decoder (the
//! default route) never a hang or a lost context either. Each frame is a chunk read on its own; a hang or
//! a context fault ends the child process it runs in, and the sweep goes on in a new one. Run with
//! `--nocapture` for the table.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use zarrs_gpu::DeviceArray;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::ZstdCodec;
use zarrs::array::{data_type, ArrayBuilder, ArraySubset};
use zarrs_gpu::{ArrayDeviceExt, GdsStore, GpuError};
use zarrs_gpu_codecs::zstd_decode::ZstdDecoder;
use zarrs_gpu_codecs::zstd_frame::{check_frame, FrameVerdict};
use zarrs_storage::{Bytes, WritableStorageTraits};

use super::{child_command, posix, Result};

/// The length of every frame's content: chunks of one array.
const LEN: usize = 64 << 10;

/// A damaged frame the host check lets through to nvCOMP.
struct Survivor {
    bad: Vec<u8>,
    /// The content of the frame before the damage.
    raw: Arc<Vec<u8>>,
    /// What libzstd decodes it to (None: libzstd rejects it, or decodes another size).
    libzstd: Option<Vec<u8>>,
    /// Which frame, where and how it was damaged (for the report).
    what: String,
}

/// Frames of float32 fields and int16 images at several levels; for each, one byte XORed at
/// many positions; kept: those libzstd rejects or decodes to other bytes that the host check lets
/// through to nvCOMP, at most [`SAMPLE`] of each kind (rejected, decoded to other bytes: the
/// second are far more) spread evenly.
fn survivors() -> Vec<Survivor> {
    let mut rng = StdRng::seed_from_u64(2026);
    let mut out = Vec::new();
    for f in 0..48 {
        let raw: Vec<u8> = if f % 2 == 0 {
            let phase = rng.random::<f32>();
            (0..LEN / 4)
                .flat_map(|i| ((i as f32 * 0.002 + phase).sin() * 50.0 + rng.random::<f32>() * 0.05).to_le_bytes())
                .collect()
        } else {
            (0..LEN / 2)
                .flat_map(|i| (((i % 256) * 9 + (i / 256) * 5) as i16 + rng.random_range(-30..30)).to_le_bytes())
                .collect()
        };
        let level = [1, 3, 9][f % 3];
        let frame = zstd::bulk::compress(&raw, level).unwrap();
        let raw = Arc::new(raw);
        for _ in 0..200 {
            let mut bad = frame.clone();
            // Half in the first 512 bytes (headers and tables), half anywhere.
            let at = if rng.random_bool(0.5) {
                rng.random_range(4..frame.len().min(512))
            } else {
                rng.random_range(4..frame.len())
            };
            let xor = [0x01, 0x10, 0x80, 0xFF][rng.random_range(0..4)];
            bad[at] ^= xor;
            let libzstd = zstd::bulk::decompress(&bad, LEN).ok().filter(|d| d.len() == LEN);
            if libzstd.as_deref() != Some(raw.as_slice())
                && matches!(check_frame(&bad, LEN as u64), Ok(FrameVerdict::Device { .. }))
            {
                let what = format!("frame {f} (level {level}, {} bytes), byte {at} ^= {xor:#04x}", frame.len());
                out.push(Survivor { bad, raw: raw.clone(), libzstd, what });
            }
        }
    }
    let (rejected, decoded): (Vec<Survivor>, Vec<Survivor>) = out.into_iter().partition(|s| s.libzstd.is_none());
    let spread = |kind: Vec<Survivor>| {
        let step = kind.len().div_ceil(SAMPLE).max(1);
        kind.into_iter().step_by(step)
    };
    spread(rejected).chain(spread(decoded)).collect()
}

/// How many damaged frames the sweep reads (a hang costs its timeout and a new process).
const SAMPLE: usize = 240;

const CHILD: &str = "ZARRS_GPU_TEST_SWEEP_FROM";

/// In the child: read frames `from..` one by one, printing each outcome; stop after a hang or a
/// fault (the device is lost for this process).
fn child(from: usize) -> Result {
    let frames = survivors();
    let dir = tempfile::tempdir()?;
    let array = ArrayBuilder::new(vec![(frames.len() * LEN) as u64], vec![LEN as u64], data_type::uint8(), 0u8)
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
        .build(Arc::new(GdsStore::new(dir.path())?), "/w")?;
    array.store_metadata()?;
    let config = posix().with_batch_timeout(Some(Duration::from_secs(2)));
    for (k, frame) in frames.iter().enumerate().skip(from) {
        array.storage().set(&array.chunk_key(&[k as u64]), Bytes::from(frame.bad.clone()))?;
        let subset = ArraySubset::new_with_start_shape(vec![(k * LEN) as u64], vec![LEN as u64])?;
        let outcome = match array.retrieve_array_subset_device_opt::<DeviceArray<u8>>(&subset, &config) {
            Ok((data, _)) => {
                let data = data.to_host_bytes()?;
                if frame.libzstd.as_deref() == Some(data.as_slice()) {
                    LIBZSTDS
                } else if data == frame.raw.as_slice() {
                    ORIGINAL
                } else {
                    OTHER_BYTES
                }
            }
            Err(GpuError::Timeout { .. }) => "the decoder never finishes (timeout, device lost)",
            Err(GpuError::ContextLost { .. }) => "the decoder faults the context (device lost)",
            Err(GpuError::Chunk { reason, .. }) if reason.contains("nvCOMP") => "nvCOMP reports an error",
            Err(GpuError::Chunk { reason, .. }) if reason.contains("decoded") => {
                "the decoder decodes another size (error)"
            }
            Err(err) => {
                eprintln!("frame {k}: {err}");
                "another error"
            }
        };
        if outcome == OTHER_BYTES {
            // Where the device's bytes part from libzstd's (or the original's), and how many differ.
            let data =
                array.retrieve_array_subset_device_opt::<DeviceArray<u8>>(&subset, &config)?.0.to_host_bytes()?;
            let reference = frame.libzstd.as_deref().unwrap_or(&frame.raw);
            let differ = data.iter().zip(reference).filter(|(a, b)| a != b).count();
            let first = data.iter().zip(reference).position(|(a, b)| a != b);
            let original = data.iter().zip(frame.raw.iter()).filter(|(a, b)| a != b).count();
            println!("DETAIL {k} first difference at {first:?}, {differ} bytes differ ({original} from the original)");
        }
        println!("SWEEP {k} {outcome}");
        if outcome.contains("device lost") {
            break;
        }
    }
    std::io::Write::flush(&mut std::io::stdout())?;
    // SAFETY: ends the process without exit handlers (a kernel may still be running).
    unsafe { libc::_exit(0) }
}

/// A read's bytes are libzstd's (it decodes the damaged frame to other bytes, without an error).
const LIBZSTDS: &str = "the decoder decodes libzstd's bytes";
/// A read's bytes are the frame's content before the damage (libzstd rejects the frame).
const ORIGINAL: &str = "the decoder decodes the original bytes";
/// Wrong data: neither, returned as a success.
const OTHER_BYTES: &str = "the decoder returns other bytes without an error";

#[test]
#[ignore = "needs a CUDA GPU"]
fn damaged_frames_the_host_check_lets_through_are_errors_or_libzstds_bytes() -> Result {
    if let Ok(from) = std::env::var(CHILD) {
        return child(from.parse()?);
    }
    let frames = survivors();
    let total = frames.len();
    let rejected = frames.iter().filter(|f| f.libzstd.is_none()).count();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    let mut from = 0;
    while from < total {
        let from_text = from.to_string();
        let name = "sweep::damaged_frames_the_host_check_lets_through_are_errors_or_libzstds_bytes";
        let out = child_command(name, &[(CHILD, Some(&from_text))])?.output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child from {from}: {text}{}", String::from_utf8_lossy(&out.stderr));
        let mut last = None;
        for line in text.lines() {
            if let Some((k, outcome)) = line.split_once("SWEEP ").and_then(|(_, rest)| rest.split_once(' ')) {
                let k = k.parse::<usize>()?;
                assert_eq!(k, last.map_or(from, |l| l + 1), "the child skipped a frame: {text}");
                *outcomes.entry(outcome.to_string()).or_default() += 1;
                // Wrong data is any success but libzstd's bytes, or the original ones where
                // libzstd rejects the frame (correct values, though zarrs would refuse them).
                let right = match (outcome, &frames[k].libzstd) {
                    (LIBZSTDS, Some(_)) | (ORIGINAL, None) => true,
                    (LIBZSTDS | ORIGINAL | OTHER_BYTES, _) => false,
                    _ => true,
                };
                if !right {
                    let kind = if frames[k].libzstd.is_some() { "libzstd decodes it" } else { "libzstd rejects it" };
                    // (libtest's "test ... " may start the line.)
                    let marker = format!("DETAIL {k} ");
                    let detail = text.lines().find_map(|l| l.split_once(&marker).map(|(_, d)| d)).unwrap_or_default();
                    wrong.push(format!("{k}: {} ({kind}; {outcome}; {detail})", frames[k].what));
                }
                last = Some(k);
            }
        }
        from = last.ok_or_else(|| format!("child from {from} read nothing: {text}"))? + 1;
    }
    let decoder: ZstdDecoder = std::env::var(zarrs_gpu_codecs::env::ZSTD_DECODER.name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .map_or(Ok(ZstdDecoder::default()), |v| v.parse())?;
    println!(
        "{total} damaged frames that the host check passes ({rejected} libzstd rejects, {} it decodes to other \
         bytes), each read on the device ({decoder:?}):",
        total - rejected
    );
    for (outcome, n) in &outcomes {
        println!("| {outcome} | {n} |");
    }
    assert_eq!(outcomes.values().sum::<usize>(), total);
    assert!(wrong.is_empty(), "{} frames read as wrong data without an error:\n{}", wrong.len(), wrong.join("\n"));
    // Ours (named, or auto's pick for these unverified frames) ends any input as a status: a
    // hang or a lost context is a bug there (nvCOMP's are what this sweep measures).
    let lost: usize = outcomes.iter().filter(|(o, _)| o.contains("device lost")).map(|(_, n)| n).sum();
    assert!(decoder == ZstdDecoder::Nvcomp || lost == 0, "our decoder lost the device on {lost} frames");
    Ok(())
}
