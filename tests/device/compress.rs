//! nvCOMP's batched compression (the write path's encoder): every chunk it writes must decode
//! with the host's standard libraries (libzstd, zlib) to the bytes it was given, and its ratio is
//! reported beside libzstd's levels 1 and 3 on the same chunks.

use std::ffi::c_void;
use std::io::Read;

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DevicePtrMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs_gpu::nvcomp_sys::{sys, Compressor, NvcompLibrary};

use crate::Result;

/// `n` chunks of `len` bytes: float32 of a smooth field, quantised, with a little noise (a
/// fourth of a step), one chunk all zero, one of random bytes (incompressible), and a short last
/// chunk.
fn chunks(n: usize, len: usize) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(29);
    (0..n)
        .map(|c| match c {
            1 => vec![0; len],
            2 => (0..len).map(|_| rng.random::<u8>()).collect(),
            c => {
                let len = if c == n - 1 { len / 3 - 4 } else { len };
                (0..len / 4)
                    .flat_map(|i| {
                        let x = i as f32 * 0.001 + c as f32;
                        ((x.sin() * 1000.0).round() + f32::from(rng.random_range(0u8..4)) * 0.25).to_le_bytes()
                    })
                    .collect()
            }
        })
        .collect()
}

/// Compress `chunks` with `codec` on the device; the compressed bytes of each, as copied back, and
/// the seconds nvCOMP's compression took (the call and a synchronise, copies and allocations
/// apart).
fn compress_on_device(codec: Compressor, chunks: &[Vec<u8>]) -> Result<(Vec<Vec<u8>>, f64)> {
    let nvcomp = NvcompLibrary::get()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let n = chunks.len();
    let max_len = chunks.iter().map(Vec::len).max().unwrap_or(0);
    let total: usize = chunks.iter().map(Vec::len).sum();
    let bound = nvcomp.compress_max_output_chunk_size(codec, max_len)?;
    let align = nvcomp.compress_alignments(codec)?;
    let slot = |len: usize| len.next_multiple_of(align.input.max(align.output).max(8));
    // Inputs and outputs each in one buffer, at aligned offsets.
    let in_at: Vec<usize> = chunks.iter().scan(0, |at, c| Some(std::mem::replace(at, *at + slot(c.len())))).collect();
    let mut packed = vec![0u8; in_at[n - 1] + slot(chunks[n - 1].len())];
    for (c, &at) in chunks.iter().zip(&in_at) {
        packed[at..at + c.len()].copy_from_slice(c);
    }
    let input: CudaSlice<u8> = stream.clone_htod(&packed)?;
    let mut output: CudaSlice<u8> = stream.alloc_zeros(n * slot(bound))?;
    let temp_bytes = nvcomp.compress_temp_size(codec, n, max_len, total)?;
    let mut temp: CudaSlice<u8> = stream.alloc_zeros(temp_bytes.max(1))?;
    let (in_ptr, g1) = input.device_ptr(&stream);
    let (out_ptr, g2) = output.device_ptr_mut(&stream);
    let (temp_ptr, g3) = temp.device_ptr_mut(&stream);
    let in_ptrs: Vec<u64> = in_at.iter().map(|&at| in_ptr + at as u64).collect();
    let sizes: Vec<u64> = chunks.iter().map(|c| c.len() as u64).collect();
    let out_ptrs: Vec<u64> = (0..n).map(|k| out_ptr + (k * slot(bound)) as u64).collect();
    let d_in_ptrs = stream.clone_htod(&in_ptrs)?;
    let d_sizes = stream.clone_htod(&sizes)?;
    let d_out_ptrs = stream.clone_htod(&out_ptrs)?;
    let mut d_out_sizes: CudaSlice<u64> = stream.alloc_zeros(n)?;
    let mut d_statuses: CudaSlice<u32> = stream.alloc_zeros(n)?;
    let seconds;
    {
        let (p_in, _a) = d_in_ptrs.device_ptr(&stream);
        let (p_sizes, _b) = d_sizes.device_ptr(&stream);
        let (p_out, _c) = d_out_ptrs.device_ptr(&stream);
        let (p_out_sizes, _d) = d_out_sizes.device_ptr_mut(&stream);
        let (p_status, _e) = d_statuses.device_ptr_mut(&stream);
        stream.synchronize()?;
        let start = std::time::Instant::now();
        // SAFETY: n pointers and sizes into `input` (each chunk within its aligned slot), n output
        // slots of the codec's bound, its temp size, n sizes and statuses; all live until the
        // stream is synchronised below.
        unsafe {
            nvcomp.compress_async(
                codec,
                p_in as *const *const c_void,
                p_sizes as *const usize,
                max_len,
                n,
                temp_ptr as *mut c_void,
                temp_bytes,
                p_out as *const *mut c_void,
                p_out_sizes as *mut usize,
                p_status as *mut sys::nvcompStatus_t,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }?;
        stream.synchronize()?;
        seconds = start.elapsed().as_secs_f64();
    }
    let statuses = stream.clone_dtoh(&d_statuses)?;
    let out_sizes = stream.clone_dtoh(&d_out_sizes)?;
    drop((g1, g2, g3));
    let bytes = stream.clone_dtoh(&output)?;
    for (k, &status) in statuses.iter().enumerate() {
        assert_eq!(status, sys::nvcompSuccess, "{codec:?} chunk {k}: {}", nvcomp.status_string(status));
    }
    let chunks = (0..n)
        .map(|k| {
            let len = out_sizes[k] as usize;
            assert!(len > 0 && len <= bound, "{codec:?} chunk {k}: {len} bytes, bound {bound}");
            bytes[k * slot(bound)..][..len].to_vec()
        })
        .collect();
    Ok((chunks, seconds))
}

/// `data` decoded by the host's standard library for `codec`'s format.
fn decode_on_host(codec: Compressor, data: &[u8], len: usize) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    match codec {
        Compressor::Zstd => out = zstd::bulk::decompress(data, len)?,
        Compressor::Gzip { .. } => _ = flate2::read::GzDecoder::new(data).read_to_end(&mut out)?,
        Compressor::Deflate { .. } => _ = flate2::read::DeflateDecoder::new(data).read_to_end(&mut out)?,
        Compressor::Lz4 => return Err("no host LZ4 decoder in these tests".into()),
    }
    Ok(out)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_compression_decodes_with_the_host_libraries_and_reports_its_ratio() -> Result {
    let chunks = chunks(48, 1 << 20);
    let raw: usize = chunks.iter().map(Vec::len).sum();
    let level = |l: i32| -> Result<usize> { chunks.iter().map(|c| Ok(zstd::bulk::compress(c, l)?.len())).sum() };
    let (zstd1, zstd3) = (level(1)?, level(3)?);
    eprintln!(
        "libzstd: level 1 ratio {:.3}, level 3 ratio {:.3}",
        raw as f64 / zstd1 as f64,
        raw as f64 / zstd3 as f64
    );
    let zlib = |l: u32| -> usize {
        chunks
            .iter()
            .map(|c| {
                let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(l));
                std::io::Write::write_all(&mut e, c).and_then(|()| e.finish()).map_or(0, |v| v.len())
            })
            .sum()
    };
    eprintln!(
        "zlib (flate2): level 1 ratio {:.3}, level 6 ratio {:.3}",
        raw as f64 / zlib(1) as f64,
        raw as f64 / zlib(6) as f64
    );
    // Every deflate and gzip algorithm nvCOMP offers (0, fastest, to 5, its best ratio).
    let codecs = std::iter::once(Compressor::Zstd)
        .chain((0..=5).map(|algorithm| Compressor::Deflate { algorithm }))
        .chain((0..=5).map(|algorithm| Compressor::Gzip { algorithm }));
    for codec in codecs {
        let (compressed, seconds) = compress_on_device(codec, &chunks)?;
        for (k, (c, z)) in chunks.iter().zip(&compressed).enumerate() {
            let back = decode_on_host(codec, z, c.len()).map_err(|e| format!("{codec:?} chunk {k}: {e}"))?;
            assert!(back == *c, "{codec:?} chunk {k}: decoded bytes differ");
        }
        let stored: usize = compressed.iter().map(Vec::len).sum();
        eprintln!(
            "{codec:?}: ratio {:.3} ({stored} of {raw} bytes) in {:.1} ms ({:.2} GiB/s); libzstd level 1 {:.3}, level 3 {:.3}",
            raw as f64 / stored as f64,
            seconds * 1e3,
            raw as f64 / seconds / f64::from(1u32 << 30),
            raw as f64 / zstd1 as f64,
            raw as f64 / zstd3 as f64
        );
        // The all-zero chunk shrinks at least 4 times, whatever the codec (nvCOMP's fast deflate
        // takes 1 MiB of zeros to 129 KiB: no long matches).
        let zeros = compressed[1].len();
        assert!(zeros < chunks[1].len() / 4, "{codec:?}: a zero chunk took {zeros} bytes");
        // nvCOMP compresses: the smooth chunks shrink (a bound that only copied would not).
        assert!(stored < raw * 9 / 10, "{codec:?}: {stored} of {raw} bytes (libzstd level 1: {zstd1})");
    }
    Ok(())
}
