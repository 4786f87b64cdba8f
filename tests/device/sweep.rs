//! What nvCOMP does with the damaged zstd frames (no checksum) that pass the host check although
//! libzstd rejects them: the remaining risk of `DecodeTrust::Checked`, measured. Each frame is a
//! chunk read on its own; a hang or a context fault ends the child process it runs in, and the
//! sweep goes on in a new one. Run with `--nocapture` for the table.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::ZstdCodec;
use zarrs::array::{data_type, ArrayBuilder, ArraySubset};
use zarrs_gpu::{ArrayDeviceExt, GdsStore, GpuError};
use zarrs_gpu_codecs::zstd_frame::{check_frame, FrameVerdict};
use zarrs_storage::{Bytes, WritableStorageTraits};

use super::{child_command, posix, Result};

/// The length of every frame's content: chunks of one array.
const LEN: usize = 64 << 10;

/// Frames of float32 fields and int16 images at several levels; for each, one byte XORed at
/// many positions; kept: those libzstd rejects (or decodes to other bytes) that the host check
/// lets through to nvCOMP, at most [`SAMPLE`] of them spread evenly. With the original content of
/// each.
fn survivors() -> Vec<(Vec<u8>, Arc<Vec<u8>>)> {
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
            bad[at] ^= [0x01, 0x10, 0x80, 0xFF][rng.random_range(0..4)];
            let libzstd_ok = zstd::bulk::decompress(&bad, LEN).is_ok_and(|d| d.len() == LEN);
            if !libzstd_ok && matches!(check_frame(&bad, LEN as u64), Ok(FrameVerdict::Device { .. })) {
                out.push((bad, raw.clone()));
            }
        }
    }
    let step = out.len().div_ceil(SAMPLE).max(1);
    out.into_iter().step_by(step).collect()
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
    for (k, (bad, raw)) in frames.iter().enumerate().skip(from) {
        array.storage().set(&array.chunk_key(&[k as u64]), Bytes::from(bad.clone()))?;
        let subset = ArraySubset::new_with_start_shape(vec![(k * LEN) as u64], vec![LEN as u64])?;
        let outcome = match array.retrieve_array_subset_device_opt::<u8>(&subset, &config) {
            Ok((data, _)) if data.to_host_bytes()? == raw.as_slice() => "nvCOMP decodes the original bytes",
            Ok(_) => "nvCOMP returns other bytes without an error",
            Err(GpuError::Timeout { .. }) => "nvCOMP never finishes (timeout, device lost)",
            Err(GpuError::ContextLost { .. }) => "nvCOMP faults the context (device lost)",
            Err(GpuError::Chunk { reason, .. }) if reason.contains("nvCOMP") => "nvCOMP reports an error",
            Err(GpuError::Chunk { reason, .. }) if reason.contains("decoded") => "nvCOMP decodes another size (error)",
            Err(err) => return Err(format!("frame {k}: unexpected error {err}").into()),
        };
        println!("SWEEP {k} {outcome}");
        if outcome.contains("device lost") {
            break;
        }
    }
    std::io::Write::flush(&mut std::io::stdout())?;
    // SAFETY: ends the process without exit handlers (a kernel may still be running).
    unsafe { libc::_exit(0) }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nvcomp_on_damaged_frames_the_host_check_lets_through() -> Result {
    if let Ok(from) = std::env::var(CHILD) {
        return child(from.parse()?);
    }
    let total = survivors().len();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut from = 0;
    while from < total {
        let from_text = from.to_string();
        let name = "sweep::nvcomp_on_damaged_frames_the_host_check_lets_through";
        let out = child_command(name, &[(CHILD, Some(&from_text))])?.output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child from {from}: {text}{}", String::from_utf8_lossy(&out.stderr));
        let mut last = None;
        for line in text.lines() {
            if let Some((k, outcome)) = line.split_once("SWEEP ").and_then(|(_, rest)| rest.split_once(' ')) {
                *outcomes.entry(outcome.to_string()).or_default() += 1;
                last = Some(k.parse::<usize>()?);
            }
        }
        from = last.ok_or_else(|| format!("child from {from} read nothing: {text}"))? + 1;
    }
    println!("{total} damaged frames that libzstd rejects and the host check passes, each read on the device:");
    for (outcome, n) in &outcomes {
        println!("| {outcome} | {n} |");
    }
    assert_eq!(outcomes.values().sum::<usize>(), total);
    Ok(())
}
