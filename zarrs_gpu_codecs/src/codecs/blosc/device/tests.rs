use super::*;
use crate::codecs::blosc::kernels::assemble_on_host;

/// A chunk c-blosc writes of `data`.
fn compress(data: &[u8], cname: &str, clevel: i32, shuffle: u32, typesize: usize, blocksize: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len() + 16];
    let cname = std::ffi::CString::new(cname).unwrap();
    // SAFETY: buffers of the lengths given; c-blosc writes at most `out.len()` bytes.
    let n = unsafe {
        blosc_src::blosc_compress_ctx(
            clevel,
            shuffle as i32,
            typesize,
            data.len(),
            data.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            out.len(),
            cname.as_ptr(),
            blocksize,
            1,
        )
    };
    assert!(n > 0, "c-blosc could not compress ({n})");
    out.truncate(n as usize);
    out
}

pub(super) fn compress_for_speed(data: &[u8]) -> Vec<u8> {
    compress(data, "lz4", 5, 1, 4, 0)
}

/// The decoded bytes of one compressed stream, on the host: LZ4 and zstd by our device
/// kernels' code too (every way of running them), the others by their libraries.
fn decode_stream(compressor: Compressor, bytes: &[u8], len: usize) -> Vec<u8> {
    match compressor {
        Compressor::Lz4 => {
            let expected = lz4_flex::block::decompress(bytes, len).unwrap();
            for threads in lz4_decode::HostThreads::ALL {
                let mut out = vec![0u8; len];
                let result = lz4_decode::decode_on_host(&mut [(bytes, &mut out)], threads);
                assert_eq!(result, [(lz4_decode::OK, len as u64)], "{threads:?}");
                assert!(out == expected, "our LZ4 kernel ({threads:?}) and lz4_flex differ");
            }
            expected
        }
        Compressor::Zstd => {
            let expected = zstd::bulk::decompress(bytes, len).unwrap();
            for path in [zstd_decode::HostPath::OneWarp, zstd_decode::HostPath::Execute, zstd_decode::HostPath::Jump] {
                let mut out = vec![0u8; len];
                let result = zstd_decode::decode_on_host(&mut [(bytes, &mut out)], path);
                assert_eq!(result, [(zstd_decode::OK, len as u64)], "{path:?}");
                assert!(out == expected, "our zstd kernels ({path:?}) and libzstd differ");
            }
            expected
        }
        Compressor::Zlib => {
            use std::io::Read;
            let mut out = Vec::new();
            flate2::read::ZlibDecoder::new(bytes).read_to_end(&mut out).unwrap();
            out
        }
        other => panic!("no host decoder here for {other:?}"),
    }
}

/// Each block assembled as the kernel does it (from its streams, decoded on the host, and
/// the task the plan makes), against c-blosc's own decode of the chunk.
fn assemble_like_the_device(chunk_bytes: &[u8], expected: &[u8]) {
    let chunk = parse_chunk(chunk_bytes, expected.len() as u64).unwrap();
    let mut out = vec![0u8; expected.len()];
    let blocksize = chunk.header.blocksize as usize;
    for block in 0..chunk.nblocks {
        let streams: Vec<Vec<u8>> = chunk
            .streams
            .iter()
            .filter(|s| s.block == block)
            .map(|s| {
                let stored = &chunk_bytes[s.src_offset..s.src_offset + s.src_len];
                if s.raw {
                    stored.to_vec()
                } else {
                    // A zlib stream goes whole to the host's decoder (the device gets its payload).
                    decode_stream(chunk.compressor, stored, s.dst_len)
                }
            })
            .collect();
        let task = block_task(&chunk, block, streams.len() as u32, 0, 0).unwrap();
        let views: Vec<&[u8]> = streams.iter().map(Vec::as_slice).collect();
        let at = block * blocksize;
        assemble_on_host(&task, &views, &mut out[at..at + task.len as usize]);
    }
    assert!(out == expected, "assembled blocks differ from c-blosc's decode");
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    // Smooth float32 values with noise in the low bits: shuffles matter, streams compress.
    let mut state = seed;
    (0..len / 4)
        .flat_map(|i| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let v = (i as f32 * 0.01).sin() * 1000.0 + ((state >> 40) as f32) * 1e-6;
            v.to_le_bytes()
        })
        .chain((0..len % 4).map(|i| i as u8))
        .collect()
}

#[test]
fn blocks_assembled_from_their_streams_equal_c_blosc_in_every_mode() {
    let mut cases = 0;
    for cname in ["lz4", "lz4hc", "zstd", "zlib"] {
        for shuffle in [0, 1, 2] {
            for typesize in [1usize, 2, 3, 4, 8, 16] {
                // Whole blocks, a short last block, a chunk not a multiple of the typesize.
                for (len, blocksize) in [(1 << 20, 0), (300_000, 65_536), (100_003, 8192), (4096 + 7, 0)] {
                    let data = data(len, (len + typesize) as u64);
                    let chunk = compress(&data, cname, 5, shuffle, typesize, blocksize);
                    assemble_like_the_device(&chunk, &data);
                    cases += 1;
                }
            }
        }
    }
    // Stored as they are (clevel 0: memcpyed), and incompressible data (raw streams).
    let data = data(200_000, 9);
    assemble_like_the_device(&compress(&data, "lz4", 0, 1, 4, 0), &data);
    let noise: Vec<u8> = (0..300_000u64).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect();
    assemble_like_the_device(&compress(&noise, "lz4", 9, 1, 4, 65_536), &noise);
    assert_eq!(cases, 4 * 3 * 6 * 4);
}

/// The codec's configuration for compressor `cname` (level 5, byte shuffle, typesize 4).
fn config(cname: &str) -> Configuration {
    let json = format!(r#"{{"cname": "{cname}", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}"#);
    serde_json::from_str::<Configuration>(&json).unwrap()
}

#[test]
fn the_device_takes_what_nvcomp_decodes_and_says_why_not_otherwise() {
    let data = data(1 << 18, 3);
    let lz4 = compress(&data, "lz4", 5, 1, 4, 0);
    let zstd = compress(&data, "zstd", 5, 2, 4, 0);
    let blosclz = compress(&data, "blosclz", 5, 1, 4, 0);
    let len = data.len() as u64;
    let lz4_codec = Blosc::new(&config("lz4")).unwrap();
    assert_eq!(lz4_codec.check(&lz4, len).unwrap(), HostCheck::Device { digest: None });
    assert_eq!(Blosc::new(&config("zstd")).unwrap().check(&zstd, len).unwrap(), HostCheck::Device { digest: None });
    // zlib streams: on the device (their Adler-32 verified there), only when verified or trusted.
    let zlib_codec = Blosc::new(&config("zlib")).unwrap();
    let zlib = compress(&data, "zlib", 5, 1, 4, 0);
    assert_eq!(zlib_codec.check(&zlib, len).unwrap(), HostCheck::Device { digest: None });
    assert!(!zlib_codec.may_decode(DecodeTrust::Checked, false) && zlib_codec.may_decode(DecodeTrust::Trusted, false));
    assert!(lz4_codec.may_decode(DecodeTrust::Checked, false));
    // Another compressor than the configuration names; blosclz, which nvCOMP does not decode.
    assert!(matches!(lz4_codec.check(&zstd, len).unwrap(), HostCheck::Host(why) if why.contains("configuration")));
    let blosclz_codec = Blosc::new(&config("blosclz")).unwrap();
    assert!(matches!(blosclz_codec.check(&blosclz, len).unwrap(), HostCheck::Host(why) if why.contains("blosclz")));
    // LZ4 streams: our kernel, no nvCOMP; nvCOMP's when picked.
    assert!(!blosclz_codec.needs_nvcomp() && !lz4_codec.needs_nvcomp());
    let lz4_nvcomp = Blosc::new(&config("lz4")).unwrap().with_lz4_decoder(Lz4Decoder::Nvcomp);
    assert!(lz4_nvcomp.needs_nvcomp());
    assert_eq!(lz4_nvcomp.check(&lz4, len).unwrap(), HostCheck::Device { digest: None });
    // Stored as they are: copies, whatever the compressor.
    let stored = compress(&data, "blosclz", 0, 1, 4, 0);
    assert_eq!(blosclz_codec.check(&stored, len).unwrap(), HostCheck::Device { digest: None });
    // A corrupt chunk is an error, not a verdict; the host decode is c-blosc's.
    assert!(lz4_codec.check(&lz4[..lz4.len() - 1], len).is_err());
    // Damage within an LZ4 stream: the walk finds it for nvCOMP; our kernel, which checks
    // every block by the same rules, is left to find it (no walk on the host).
    let mut damaged = lz4.clone();
    let at = damaged.len() - 40;
    damaged[at..].fill(0xFF);
    assert!(lz4_nvcomp.check(&damaged, len).is_err());
    assert_eq!(lz4_codec.check(&damaged, len).unwrap(), HostCheck::Device { digest: None });
    let mut out = vec![0u8; data.len()];
    assert_eq!(lz4_codec.decode_host(&lz4, &mut out), Ok(data.len()));
    assert!(out == data);
    assert!(lz4_codec.decode_host(&lz4[..40], &mut out).is_err());
    assert!(Blosc::new(&config("lzma")).is_err());
}

/// Issue 28: a single Blosc chunk went to nvCOMP's latency (5.7 ms against well under one on
/// a host thread) because Blosc had no rates. Each nvCOMP-decoded compressor has its own: a
/// chunk or a tile's 16 go to host threads, thousands mostly to the device, and they learn
/// apart. Our LZ4 kernel has none: the device takes every chunk (issue 47, runs DS1 and DS2).
#[test]
fn small_blosc_reads_go_to_host_threads_and_large_ones_to_the_device() {
    let mib = 1u64 << 20;
    let mut keys = std::collections::HashSet::new();
    let lz4_nvcomp = Blosc::new(&config("lz4")).unwrap().with_lz4_decoder(Lz4Decoder::Nvcomp);
    for (cname, codec) in [
        ("lz4 (nvCOMP)", lz4_nvcomp),
        ("zstd", Blosc::new(&config("zstd")).unwrap()),
        ("zlib", Blosc::new(&config("zlib")).unwrap()),
    ] {
        let rates = codec.decode_rates().expect("rates");
        assert_eq!(rates.host_share(1, mib, mib, 16), 1, "{cname}: one chunk");
        assert_eq!(rates.host_share(16, 16 * mib, mib, 16), 16, "{cname}: a tile's chunks");
        let k = rates.host_share(4096, 4096 * mib, mib, 16);
        assert!(k < 4096 / 2, "{cname}: {k} of 4096 chunks on the host");
        assert!(keys.insert(rates.key()), "{cname} learns under its own key");
    }
    assert!(Blosc::new(&config("lz4")).unwrap().decode_rates().is_none(), "our LZ4 kernel takes every chunk");
    assert!(Blosc::new(&config("blosclz")).unwrap().decode_rates().is_none());
}

/// A failing stream of our LZ4 or zstd kernels is named, its index and flaw, above the fold's
/// other codes; the setting parses.
#[test]
fn lz4_and_zstd_statuses_name_the_stream_and_the_flaw() {
    let codec = Blosc::new(&config("lz4")).unwrap();
    for (stream, code) in [(0u32, lz4_decode::BAD_OFFSET), (17, lz4_decode::END_RULES), (300_000, 1)] {
        let status = stream_tag(LZ4_TAG, stream) | code;
        assert!(status > ADLER_MISMATCH && ADLER_MISMATCH > SIZE_MISMATCH, "the fold keeps the largest");
        let text = codec.status_string(status);
        assert!(text.contains(&format!("LZ4 stream {stream} ")), "{text}");
        assert!(text.contains(lz4_decode::status_text(code)), "{text}");
    }
    assert_eq!(stream_tag(LZ4_TAG, u32::MAX) >> 30, 1, "the stream index stays within its bits");
    let zstd = Blosc::new(&config("zstd")).unwrap();
    for (stream, code) in [(3u32, zstd_decode::BAD_SEQUENCE), (40, zstd_decode::TRUNCATED)] {
        let status = stream_tag(ZSTD_TAG, stream) | code;
        assert!(status > stream_tag(LZ4_TAG, u32::MAX), "the fold keeps the largest");
        let text = zstd.status_string(status);
        assert!(text.contains(&format!("zstd stream {stream} ")), "{text}");
        assert!(text.contains(zstd_decode::status_text(code)), "{text}");
    }
    assert_eq!(stream_tag(ZSTD_TAG, u32::MAX) >> 30, 2, "the stream index stays within its bits");
    assert_eq!("nvcomp".parse::<Lz4Decoder>(), Ok(Lz4Decoder::Nvcomp));
    assert_eq!(" Ours ".parse::<Lz4Decoder>(), Ok(Lz4Decoder::Ours));
    assert!("fast".parse::<Lz4Decoder>().unwrap_err().contains("auto, ours or nvcomp"));
    assert_eq!(Lz4Decoder::default(), Lz4Decoder::Auto, "ours unless nvCOMP's is named");
}

/// zstd streams take the zstd family's route: ours where nothing verifies them (ours ends any
/// stream as a status), nvCOMP's where crc32c or the trust vouches for them.
#[test]
fn zstd_streams_decode_with_ours_unless_verified_or_trusted() {
    use DecodeTrust::{Checked, Trusted, Verified};
    let auto = Blosc::new(&config("zstd")).unwrap().with_zstd(ZstdDecoder::Auto);
    let route = |trust, verified| auto.routed(trust, verified).unwrap_or_else(|| Arc::new(auto.clone()));
    let checked = route(Checked, false);
    assert_eq!(checked.decoder(), "ours");
    assert!(!checked.needs_nvcomp() && checked.needs_kernels() && checked.may_decode(Checked, false));
    for (trust, verified) in [(Checked, true), (Verified, true), (Trusted, false)] {
        let codec = route(trust, verified);
        assert_eq!(codec.decoder(), "nvCOMP", "{trust:?}, verified {verified}");
        assert!(codec.may_decode(trust, verified));
    }
    assert!(!route(Verified, false).may_decode(Verified, false), "`verified` and nothing verified: host");
    // A decoder named stays; the other compressors are not routed.
    let ours = auto.clone().with_zstd(ZstdDecoder::Ours);
    assert!(ours.routed(Trusted, true).is_none() && ours.may_decode(Verified, false));
    assert!(auto.clone().with_zstd(ZstdDecoder::Nvcomp).routed(Checked, false).is_none());
    assert!(Blosc::new(&config("lz4")).unwrap().routed(Trusted, true).is_none());
    // Each decoder learns its own rates.
    let rates = |codec: &Blosc| codec.decode_rates().unwrap().key();
    assert_ne!(rates(&ours), rates(&auto.clone().with_zstd(ZstdDecoder::Nvcomp)));
}

#[test]
fn scratch_bounds_hold_the_exact_plans() {
    // The plan's regions fit in `scratch_bound` for any batch the device takes: checked
    // without nvCOMP's temp (the same on both sides) on real chunks.
    let cases = [("lz4", 1, 4, 0), ("zstd", 2, 8, 0), ("lz4", 1, 4, 16_384), ("zlib", 1, 4, 0), ("zstd", 0, 2, 0)];
    for (len, (cname, shuffle, typesize, blocksize)) in
        [1 << 20, 5000, 1000, 130].into_iter().flat_map(|len| cases.map(|case| (len, case)))
    {
        let data = data(len, 5);
        let chunk_bytes = compress(&data, cname, 5, shuffle, typesize, blocksize);
        let chunk = parse_chunk(&chunk_bytes, data.len() as u64).unwrap();
        for align in [1, 4] {
            let mut plan = Plan { input_align: align, ..Plan::default() };
            for u in 0..3 {
                plan.add_chunk(&chunk, &chunk_bytes, u, 1 << 40, 1 << 41).unwrap();
            }
            plan.locate(0);
            let total = 3 * data.len();
            let bound = bound_beside_nvcomp(3, total, stream_bound(3, total));
            // What nvCOMP's temp is sized by on both sides: the bound's covers the plan's.
            assert!(plan.items.len() <= stream_bound(3, total) && plan.max_item <= data.len());
            assert!(plan.scratch_len as usize <= total + stream_bound(3, total) * ALIGN as usize);
            assert!(plan.len <= bound as u64, "{cname} {blocksize}: {} > {bound}", plan.len);
            let (bytes, t) = plan.tables();
            assert!(bytes.len() as u64 <= plan.tables_len(plan.items.len() as u64));
            if cname == "zstd" {
                // Our zstd kernels' plan, from the items' payloads: those of the streams,
                // within the bound their scratch is sized by.
                let frames = plan.zstd_frames(&[chunk_bytes.as_slice(); 3]).unwrap();
                let zstd = BlockPlan::device_walks(&frames, &plan.zstd_capacities());
                let payloads: Vec<&[u8]> = (0..3)
                    .flat_map(|_| chunk.streams.iter().filter(|s| !s.raw))
                    .map(|s| &chunk_bytes[chunk.payload(s)])
                    .collect();
                let lens: Vec<u64> = plan.items.iter().map(|it| it.len).collect();
                assert_eq!(zstd.len, BlockPlan::new(&payloads, &lens).len);
                assert!(zstd.len <= BlockPlan::bound(stream_bound(3, total), total), "{blocksize} {len}");
                assert!(plan.zstd_frames(&[&chunk_bytes[..1]; 3]).is_err() || plan.items.is_empty());
            }
            // The kernels read these as 8-byte words: one misaligned faults on the device
            // (an odd number of streams once left the tasks 4 bytes off).
            let words = [t.inputs, t.input_sizes, t.capacities, t.outputs, t.actual, t.tasks];
            for at in words.into_iter().chain([t.sources, t.packs, t.pack_sources]) {
                assert_eq!(at % 8, 0, "{cname} {blocksize} align {align}: {} streams", plan.items.len());
            }
        }
    }
}
