use std::io::Read;

use proptest::prelude::*;
use zarrs::array::codec::bytes_to_bytes::blosc::{
    blosc_compress_bytes, blosc_decompress_bytes, blosc_validate, BloscCompressionLevel, BloscCompressor,
    BloscShuffleMode,
};

use super::*;

const CNAMES: [BloscCompressor; 6] = [
    BloscCompressor::LZ4,
    BloscCompressor::LZ4HC,
    BloscCompressor::Zstd,
    BloscCompressor::Zlib,
    BloscCompressor::BloscLZ,
    BloscCompressor::Snappy,
];
const SHUFFLES: [BloscShuffleMode; 3] =
    [BloscShuffleMode::NoShuffle, BloscShuffleMode::Shuffle, BloscShuffleMode::BitShuffle];

/// c-blosc's compression, as zarrs' blosc codec calls it.
fn encode(
    raw: &[u8],
    cname: BloscCompressor,
    clevel: u8,
    shuffle: BloscShuffleMode,
    typesize: usize,
    blocksize: usize,
    threads: usize,
) -> Vec<u8> {
    let clevel = BloscCompressionLevel::try_from(clevel).unwrap();
    blosc_compress_bytes(raw, clevel, shuffle, typesize, cname, blocksize, threads).unwrap()
}

/// c-blosc's decompression, as zarrs' blosc codec calls it (sizes over 1 MiB are not tried).
fn host(data: &[u8]) -> Option<Vec<u8>> {
    let n = blosc_validate(data).filter(|&n| n <= 1 << 20)?;
    blosc_decompress_bytes(data, n, 1).ok()
}

/// Byte unshuffle of one block: byte `i` of element `j` is at `i * elements + j`.
fn byte_unshuffle(src: &[u8], typesize: usize) -> Vec<u8> {
    let elements = src.len() / typesize;
    let mut out = src.to_vec();
    for j in 0..elements {
        for i in 0..typesize {
            out[j * typesize + i] = src[i * elements + j];
        }
    }
    out
}

/// Bit unshuffle of one block of a multiple of 8 elements: bit `k` of byte `i` of element
/// `j` is bit `(i * 8 + k) * elements + j` of the block (least significant first).
fn bit_unshuffle(src: &[u8], typesize: usize) -> Vec<u8> {
    let elements = src.len() / typesize;
    let mut out = src.to_vec();
    out[..elements * typesize].fill(0);
    for j in 0..elements {
        for bit in 0..typesize * 8 {
            let at = bit * elements + j;
            if src[at / 8] >> (at % 8) & 1 != 0 {
                out[j * typesize + bit / 8] |= 1 << (bit % 8);
            }
        }
    }
    out
}

/// Decodes a chunk from its description as the device would: each stream's payload into its
/// place, then each block unshuffled.
fn device_decode(data: &[u8], chunk: &BloscChunk) -> Vec<u8> {
    let mut shuffled = vec![0u8; chunk.header.nbytes as usize];
    for s in &chunk.streams {
        let payload = &data[chunk.payload(s)];
        let out = &mut shuffled[s.dst_offset..s.dst_offset + s.dst_len];
        if s.raw {
            out.copy_from_slice(payload);
            continue;
        }
        match chunk.compressor {
            Compressor::Lz4 => assert_eq!(lz4_flex::block::decompress_into(payload, out).ok(), Some(s.dst_len)),
            Compressor::Zstd => out.copy_from_slice(&zstd::bulk::decompress(payload, s.dst_len).unwrap()),
            Compressor::Zlib => flate2::read::DeflateDecoder::new(payload).read_exact(out).unwrap(),
            other => panic!("no decoder for {other:?}"),
        }
    }
    let (blocksize, typesize) = (chunk.header.blocksize as usize, usize::from(chunk.header.typesize));
    let mut decoded = Vec::with_capacity(shuffled.len());
    for block in 0..chunk.nblocks {
        let bytes = &shuffled[block * blocksize..block * blocksize + chunk.block_len(block)];
        decoded.extend(match chunk.unshuffle(block) {
            Shuffle::None => bytes.to_vec(),
            Shuffle::Byte => byte_unshuffle(bytes, typesize),
            Shuffle::Bit => bit_unshuffle(bytes, typesize),
        });
    }
    decoded
}

/// The streams of every block tile its decoded bytes, in order, once.
fn assert_covers(chunk: &BloscChunk) {
    let mut streams = chunk.streams.iter().peekable();
    for block in 0..chunk.nblocks {
        let mut at = block * chunk.header.blocksize as usize;
        let end = at + chunk.block_len(block);
        while let Some(s) = streams.next_if(|s| s.block == block) {
            assert_eq!(s.dst_offset, at, "block {block}");
            at += s.dst_len;
        }
        assert_eq!(at, end, "block {block} covered up to {at} of {end}");
    }
    assert!(streams.next().is_none());
    let last = chunk.nblocks.checked_sub(1).map_or(0, |b| b * chunk.header.blocksize as usize + chunk.block_len(b));
    assert_eq!(last, chunk.header.nbytes as usize);
}

/// `n` bytes of several kinds: noise, a smooth float field, a counting pattern, one value.
fn kinds(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut state = seed | 1;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let noise: Vec<u8> = (0..n).map(|_| random() as u8).collect();
    let smooth: Vec<u8> = (0..n.div_ceil(4))
        .flat_map(|i| ((i as f32 * 0.01).sin() + (random() % 100) as f32 * 1e-4).to_le_bytes())
        .take(n)
        .collect();
    let counting: Vec<u8> = (0..n).map(|i| ((i / 7) as u8).wrapping_mul(31) ^ (i % 5) as u8).collect();
    vec![noise, smooth, counting, vec![7; n]]
}

/// Every compressor, shuffle, typesize and a few block sizes: parsed, the streams cover each
/// block once, LZ4 streams pass the walk, and what goes to the device decodes from the
/// description to the original bytes.
#[test]
fn chunks_from_c_blosc() {
    // Chunks seen: on the device, split, byte and bit unshuffled, memcpyed, to the host.
    let mut seen = [0usize; 6];
    for (k, n) in [0usize, 1, 127, 128, 1000, 5000, 70_000, 300_000].into_iter().enumerate() {
        for (kind, raw) in kinds(n, k as u64 + 1).into_iter().enumerate() {
            for (c, cname) in CNAMES.into_iter().enumerate() {
                let typesize = [1, 2, 3, 4, 8, 17][(kind + c + k) % 6];
                let blocksize = [0, 128, 1000, 4096][(kind + k) % 4];
                for shuffle in SHUFFLES {
                    let clevel = [5, 1, 9, 0, 3, 7][(c + kind + k) % 6];
                    let data = encode(&raw, cname, clevel, shuffle, typesize, blocksize, 1);
                    let what = format!("{n} bytes of kind {kind}, {cname:?} {clevel} {shuffle:?}, typesize {typesize}, blocksize {blocksize}");
                    let (device, chunk) = check_c_blosc(&data, &raw, &what);
                    let shuffles: Vec<Shuffle> = (0..chunk.nblocks).map(|b| chunk.unshuffle(b)).collect();
                    for (i, seen_it) in [
                        device,
                        device && chunk.split,
                        device && shuffles.contains(&Shuffle::Byte),
                        device && shuffles.contains(&Shuffle::Bit),
                        chunk.memcpyed,
                        !device,
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        seen[i] += usize::from(seen_it);
                    }
                }
            }
        }
    }
    assert!(seen.iter().all(|&n| n > 10), "{seen:?}");
}

/// The checks of `chunks_from_c_blosc` on one chunk c-blosc made from `raw`; whether it goes
/// to the device, and its layout.
fn check_c_blosc(data: &[u8], raw: &[u8], what: &str) -> (bool, BloscChunk) {
    let chunk = parse_chunk(data, raw.len() as u64).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_covers(&chunk);
    assert_eq!(chunk.unusual_layout, None, "{what}");
    if chunk.compressor == Compressor::Lz4 {
        for s in chunk.streams.iter().filter(|s| !s.raw) {
            assert_eq!(check_block(&data[chunk.payload(s)], s.dst_len), Ok(s.dst_len), "{what}");
        }
    }
    let unsupported = matches!(chunk.compressor, Compressor::BloscLz | Compressor::Snappy);
    match check_chunk(data, raw.len() as u64).unwrap_or_else(|e| panic!("{what}: {e}")) {
        BloscVerdict::Device(device) => {
            assert_eq!(device, chunk);
            assert!(!raw.is_empty() && (chunk.memcpyed || !unsupported || chunk.streams.iter().all(|s| s.raw)));
            assert_eq!(device_decode(data, &chunk), raw, "{what}");
            (true, chunk)
        }
        BloscVerdict::Host(why) => {
            assert!(raw.is_empty() || unsupported, "{what}: {why}");
            (false, chunk)
        }
    }
}

/// Blocks written by several threads land in the order they finish, not their own.
#[test]
fn blocks_out_of_order_from_threads() {
    let raw: Vec<u8> = kinds(4_000_000, 9).swap_remove(1);
    // Threads usually finish out of order; on a busy machine one encode may not: try again.
    let out_of_order = (0..50).find_map(|_| {
        let data = encode(&raw, BloscCompressor::LZ4, 5, BloscShuffleMode::Shuffle, 4, 16384, 4);
        let BloscVerdict::Device(chunk) = check_chunk(&data, raw.len() as u64).unwrap() else { panic!("host") };
        let starts: Vec<usize> =
            (0..chunk.nblocks).map(|b| chunk.streams.iter().find(|s| s.block == b).unwrap().src_offset).collect();
        starts.windows(2).any(|w| w[1] < w[0]).then_some((data, chunk))
    });
    let (data, chunk) = out_of_order.expect("50 encodes on 4 threads, every one with its blocks in order");
    assert_eq!(device_decode(&data, &chunk), raw);
}

/// A literal-only LZ4 block of `bytes`.
fn lz4_literals(bytes: &[u8]) -> Vec<u8> {
    let mut block = vec![(bytes.len().min(15) << 4) as u8];
    if bytes.len() >= 15 {
        let mut rest = bytes.len() - 15;
        while rest >= 255 {
            block.push(255);
            rest -= 255;
        }
        block.push(rest as u8);
    }
    block.extend_from_slice(bytes);
    block
}

/// A chunk of `blocks` of streams, packed after the starts, `gap` bytes after the starts.
fn build(flags: u8, typesize: u8, nbytes: u32, blocksize: u32, blocks: &[Vec<Vec<u8>>], gap: usize) -> Vec<u8> {
    let mut data = vec![2, 1, flags, typesize];
    data.extend(nbytes.to_le_bytes());
    data.extend(blocksize.to_le_bytes());
    data.extend([0; 4]);
    let mut body = vec![0u8; gap];
    for block in blocks {
        data.extend(((HEADER_LEN + 4 * blocks.len() + body.len()) as u32).to_le_bytes());
        for stream in block {
            body.extend((stream.len() as u32).to_le_bytes());
            body.extend(stream);
        }
    }
    data.extend(body);
    let cbytes = (data.len() as u32).to_le_bytes();
    data[12..16].copy_from_slice(&cbytes);
    data
}

const LZ4: u8 = 1 << 5;

/// 300 bytes in blocks of 128, 128 and 44, each one LZ4 stream of literals.
fn hand_built() -> (Vec<u8>, Vec<u8>) {
    let raw: Vec<u8> = (0..300).map(|i| (i * 7) as u8).collect();
    let blocks: Vec<Vec<Vec<u8>>> = raw.chunks(128).map(|b| vec![lz4_literals(b)]).collect();
    (build(LZ4, 1, 300, 128, &blocks, 0), raw)
}

/// `check_chunk` rejects `data` naming `what`, and c-blosc does not decode `expected` bytes.
fn rejects(data: &[u8], expected: u64, what: &str) {
    let err = check_chunk(data, expected).unwrap_err();
    assert!(err.to_string().contains(what), "expected {what:?}, got {err}");
    assert_ne!(host(data).map(|h| h.len() as u64), Some(expected), "c-blosc decodes what we reject: {err}");
}

/// `check_chunk` sends `data` to the host, saying `what`.
fn to_host(data: &[u8], expected: u64, what: &str) {
    match check_chunk(data, expected) {
        Ok(BloscVerdict::Host(why)) => assert!(why.contains(what), "expected {what:?}, got {why}"),
        other => panic!("expected the host ({what}), got {other:?}"),
    }
}

#[test]
fn hand_built_chunk_and_its_header_corruptions() {
    let (data, raw) = hand_built();
    assert_eq!(host(&data).unwrap(), raw, "c-blosc reads the hand-built chunk");
    let BloscVerdict::Device(chunk) = check_chunk(&data, 300).unwrap() else { panic!("host") };
    assert_eq!((chunk.nblocks, chunk.streams.len(), chunk.split), (3, 3, true));
    assert_eq!(device_decode(&data, &chunk), raw);
    let len = data.len();
    let with = |at: usize, bytes: &[u8]| {
        let mut bad = data.clone();
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        bad
    };
    rejects(&data[..15], 300, "truncated Blosc chunk: 16 bytes needed, 15 present");
    rejects(&[&data[..], &[0]].concat(), 300, &format!("records {len} stored bytes, but the chunk holds {}", len + 1));
    rejects(&data, 301, "holds 300 bytes but the chunk is 301 bytes");
    rejects(&with(4, &u32::MAX.to_le_bytes()), 300, "decoded size 4294967295 exceeds Blosc's limit");
    rejects(&with(8, &[0; 4]), 300, "blocksize 0 is not positive");
    rejects(&with(8, &301u32.to_le_bytes()), 300, "blocksize 301 exceeds the decoded size");
    rejects(&with(3, &[0]), 300, "typesize 0 is not positive");
    rejects(&with(8, &1u32.to_le_bytes()), 300, "the starts of 300 blocks end at byte 1216");
    rejects(&with(24, &9000u32.to_le_bytes()), 300, &format!("block 2 starts at 9000, outside the {len} stored bytes"));
    rejects(&with(24, &(-5i32).to_le_bytes()), 300, "block 2 starts at -5");
    rejects(&with(2, &[LZ4 | MEMCPYED]), 300, "stored size");
    // Typesize 3 splits 385-byte blocks (128 bytes each) but leaves a byte over.
    let odd = build(LZ4, 3, 770, 385, &[vec![vec![0]], vec![vec![0]]], 0);
    rejects(&odd, 770, "blocks of 385 bytes do not split into 3 equal streams");
}

#[test]
fn corrupt_streams() {
    let (data, raw) = hand_built();
    let with = |at: usize, bytes: &[u8]| {
        let mut bad = data.clone();
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        bad
    };
    // Block 0's stream: its size at 28, its LZ4 block (token, extension, literals) at 32.
    let len = data.len();
    rejects(&with(28, &(-1i32).to_le_bytes()), 300, "block 0, stream 0 at byte 28: its -1 bytes run past");
    rejects(&with(28, &5000i32.to_le_bytes()), 300, &format!("its 5000 bytes run past the {len} stored bytes"));
    rejects(&with(28, &[0; 4]), 300, "block 0, stream 0 at byte 28: an empty stream cannot decode to 128 bytes");
    rejects(
        &with(33, &[114]),
        300,
        "block 0, stream 0 at byte 28: corrupt LZ4 block at input byte 2: literals run past the input",
    );
    rejects(
        &with(24, &((len - 2) as u32).to_le_bytes()),
        300,
        &format!("block 2, stream 0 at byte {}: its 4-byte size runs past", len - 2),
    );
    // A memcpyed chunk: its bytes after the header.
    let mut copied = build(MEMCPYED | 3 << 5, 4, 300, 128, &[], 0);
    copied.truncate(HEADER_LEN);
    copied.extend(&raw);
    copied[12..16].copy_from_slice(&316u32.to_le_bytes());
    let BloscVerdict::Device(chunk) = check_chunk(&copied, 300).unwrap() else { panic!("host") };
    assert!(chunk.memcpyed && chunk.streams.iter().all(|s| s.raw));
    assert_eq!((device_decode(&copied, &chunk), host(&copied).unwrap()), (raw.clone(), raw));
}

#[test]
fn valid_but_unusual_chunks_go_to_the_host() {
    let (data, raw) = hand_built();
    let with = |at: usize, bytes: &[u8]| {
        let mut bad = data.clone();
        bad[at..at + bytes.len()].copy_from_slice(bytes);
        bad
    };
    to_host(&with(0, &[3]), 300, "Blosc format version 3");
    to_host(&with(2, &[LZ4 | RESERVED]), 300, "reserved flag");
    to_host(&with(2, &[6 << 5]), 300, "compressor code 6");
    to_host(&with(1, &[2]), 300, "compressor format version 2");
    to_host(&with(2, &[LZ4 | DOSHUFFLE | DOBITSHUFFLE]), 300, "both byte and bit shuffle");
    to_host(&with(2, &[0]), 300, "blosclz streams");
    to_host(&with(2, &[2 << 5]), 300, "snappy streams");
    to_host(&build(LZ4, 1, 0, 0, &[], 0), 0, "the chunk is empty");
    // Blocks 0 and 1 hold the same bytes: c-blosc decodes block 0's bytes twice.
    let overlap = with(20, &data[16..20]);
    to_host(&overlap, 300, "block 1 starts at 28, inside the block before it");
    assert_eq!(host(&overlap).unwrap()[128..256], raw[..128]);
    let blocks: Vec<Vec<Vec<u8>>> = raw.chunks(128).map(|b| vec![lz4_literals(b)]).collect();
    let gap = build(LZ4, 1, 300, 128, &blocks, 3);
    to_host(&gap, 300, "bytes 28..31 belong to no block");
    assert_eq!(host(&gap).unwrap(), raw);
    to_host(&with(16, &[16, 0, 0, 0]), 300, "block 0 starts at 16, inside the header and block starts (28 bytes)");
}

#[test]
fn streams_the_device_does_not_take() {
    // An LZ4 block breaking the end-of-block rules, which LZ4_decompress_safe decodes.
    let mut shortcut = vec![0xEE];
    shortcut.extend(b"abcdefghijklmn");
    shortcut.extend([8, 0, 0]);
    let chunk = build(LZ4, 1, 32, 32, &[vec![shortcut]], 0);
    to_host(&chunk, 32, "block 0, stream 0: LZ4 block breaks the end-of-block rules");
    assert_eq!(host(&chunk).unwrap().len(), 32);
    // zstd: a content checksum, two frames.
    let raw: Vec<u8> = (0..200u8).collect();
    let mut encoder = zstd::bulk::Compressor::new(3).unwrap();
    encoder.include_checksum(true).unwrap();
    let zstd = 4 << 5;
    to_host(&build(zstd, 1, 200, 200, &[vec![encoder.compress(&raw).unwrap()]], 0), 200, "content checksum");
    let two = [zstd::bulk::compress(&raw[..100], 3).unwrap(), zstd::bulk::compress(&raw[100..], 3).unwrap()].concat();
    to_host(&build(zstd, 1, 200, 200, &[vec![two]], 0), 200, "several frames");
    let mut frame = zstd::bulk::compress(&raw, 3).unwrap();
    frame[0] ^= 1;
    rejects(&build(zstd, 1, 200, 200, &[vec![frame]], 0), 200, "block 0, stream 0 at byte 20: not a zstd frame");
}

#[test]
fn corrupt_zlib_streams() {
    let raw: Vec<u8> = (0..200u8).map(|i| i / 3).collect();
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut encoder, &raw).unwrap();
    let stream = encoder.finish().unwrap();
    let zlib = 3 << 5;
    let chunk = build(zlib, 1, 200, 200, &[vec![stream.clone()]], 0);
    let BloscVerdict::Device(parsed) = check_chunk(&chunk, 200).unwrap() else { panic!("host") };
    assert_eq!((device_decode(&chunk, &parsed), host(&chunk).unwrap()), (raw.clone(), raw));
    let with = |header: [u8; 2]| {
        let mut bad = stream.clone();
        bad[..2].copy_from_slice(&header);
        build(zlib, 1, 200, 200, &[vec![bad]], 0)
    };
    rejects(&with([0x78, 0x9D]), 200, "zlib stream: header check fails");
    rejects(&with([0x77, 0x85]), 200, "zlib stream: compression method is not deflate");
    rejects(&with([0x88, 0x98]), 200, "zlib stream: window larger than 32 KiB");
    rejects(&with([0x78, 0xBB]), 200, "zlib stream: needs a preset dictionary");
    rejects(&build(zlib, 1, 200, 200, &[vec![vec![0x78, 0x9C, 3, 0, 0]]], 0), 200, "zlib stream: too short");
}

/// A chunk c-blosc made: its bytes, and the bytes it holds.
fn c_blosc_chunk() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    (0usize..20_000, any::<u64>(), 0usize..4, 0usize..6, 0u8..=9, 0usize..3, 1usize..=8, 0usize..5).prop_map(
        |(n, seed, kind, c, clevel, shuffle, typesize, blocksize)| {
            let raw = kinds(n, seed).swap_remove(kind);
            let blocksize = [0, 128, 256, 1000, 4096][blocksize];
            (encode(&raw, CNAMES[c], clevel, SHUFFLES[shuffle], typesize, blocksize, 1), raw)
        },
    )
}

/// One damage: a byte anywhere, a byte of the header or starts, a header field or block
/// start overwritten with a value near the truth or not, a cut, bytes appended (the last two
/// with the stored size in the header following, or not).
#[derive(Clone, Debug)]
enum Damage {
    Byte(proptest::sample::Index, u8),
    HeadByte(proptest::sample::Index, u8),
    Field(usize, u32),
    Start(proptest::sample::Index, i32),
    Cut(proptest::sample::Index, bool),
    Append(Vec<u8>, bool),
}

fn damage() -> impl Strategy<Value = Damage> {
    use proptest::sample::Index;
    prop_oneof![
        6 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Damage::Byte(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Damage::HeadByte(i, b)),
        2 => (0usize..3, prop_oneof![0u32..300, any::<u32>()]).prop_map(|(f, v)| Damage::Field(f, v)),
        2 => (any::<Index>(), prop_oneof![-8i32..8, any::<i32>()]).prop_map(|(i, d)| Damage::Start(i, d)),
        1 => (any::<Index>(), any::<bool>()).prop_map(|(i, fix)| Damage::Cut(i, fix)),
        1 => (proptest::collection::vec(any::<u8>(), 1..8), any::<bool>()).prop_map(|(b, fix)| Damage::Append(b, fix)),
    ]
}

fn apply(data: &mut Vec<u8>, damage: &Damage) {
    let table = parse_chunk(data, 0).map_or(HEADER_LEN, |c| HEADER_LEN + 4 * c.nblocks).min(data.len());
    let word = |data: &mut Vec<u8>, at: usize, value: [u8; 4]| {
        if at + 4 <= data.len() {
            data[at..at + 4].copy_from_slice(&value);
        }
    };
    match damage {
        Damage::Byte(i, b) if !data.is_empty() => {
            let at = i.index(data.len());
            data[at] = *b;
        }
        Damage::HeadByte(i, b) if table > 0 => data[i.index(table)] = *b,
        Damage::Field(f, v) => word(data, 4 + 4 * f, v.to_le_bytes()),
        Damage::Start(i, d) if table > HEADER_LEN => {
            let at = HEADER_LEN + 4 * i.index((table - HEADER_LEN) / 4);
            let start = i32::from_le_bytes(data[at..at + 4].try_into().unwrap());
            word(data, at, start.wrapping_add(*d).to_le_bytes());
        }
        Damage::Cut(i, _) => data.truncate(i.index(data.len() + 1)),
        Damage::Append(bytes, _) => data.extend(bytes),
        _ => {}
    }
    if let Damage::Cut(_, true) | Damage::Append(_, true) = damage {
        word(data, 12, (data.len() as u32).to_le_bytes());
    }
}

proptest! {
    /// Random arrays through c-blosc, every compressor, shuffle, typesize 1 to 8 and block
    /// sizes: parsed, covered, their LZ4 streams walked, the device's decoded from the layout.
    #[test]
    fn random_c_blosc_chunks((data, raw) in c_blosc_chunk()) {
        check_c_blosc(&data, &raw, "a random chunk");
    }

    /// Damaged chunks: never a panic; what is rejected, c-blosc does not decode to the size
    /// either (an LZ4 offset of 0 aside); what goes to the device with LZ4 or raw streams,
    /// c-blosc decodes to the same bytes as the layout does.
    #[test]
    fn damaged_c_blosc_chunks(
        (mut data, raw) in c_blosc_chunk(),
        damages in proptest::collection::vec(damage(), 1..3),
        lie in prop_oneof![8 => Just(0i64), 1 => -1i64..=1],
    ) {
        for damage in &damages {
            apply(&mut data, damage);
        }
        let expected = (raw.len() as i64 + lie).max(0) as u64;
        let host = host(&data);
        let decoded = host.as_ref().map(|h| h.len() as u64);
        match check_chunk(&data, expected) {
            Err(BloscError::Stream { flaw: StreamFlaw::Lz4(Lz4Error::Corrupt { what: Lz4Error::ZERO_OFFSET, .. }), .. })
            | Ok(BloscVerdict::Host(_)) => {}
            Err(e) => prop_assert_ne!(decoded, Some(expected), "c-blosc decodes what we reject: {}", e),
            Ok(BloscVerdict::Device(chunk)) => {
                assert_covers(&chunk);
                let checked = chunk.memcpyed || chunk.compressor == Compressor::Lz4 || chunk.streams.iter().all(|s| s.raw);
                if checked || decoded == Some(expected) {
                    prop_assert_eq!(decoded, Some(expected), "c-blosc rejects what we send to the device");
                    prop_assert_eq!(&device_decode(&data, &chunk), host.as_ref().unwrap());
                }
            }
        }
    }
}
