//! Blosc's device codec: every compressed stream of a batch's chunks is one item of a batched
//! decoder, decoded into scratch: our LZ4 kernel (lz4 and lz4hc streams, one launch per batch;
//! `ZARRS_GPU_LZ4_DECODER=nvcomp` picks nvCOMP's instead), the zstd family's decoder of the
//! read's route (zstd streams: ours where nothing verifies them, as for the `zstd` codec), or
//! nvCOMP's deflate (zlib); each block is then assembled into its chunk's output by one kernel,
//! from those streams and from the streams stored as they are, with the byte or bit shuffle
//! undone on the way.

use std::borrow::Cow;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use nvcomp_sys::{sys as nv, Decompressor};
use zarrs::metadata::Configuration;

use super::decode_host;
use super::header::{check_chunk_as, parse_chunk, BloscChunk, BloscVerdict, Compressor, Shuffle};
use super::kernels::{self, FoldArrays, Task, ADLER_MISMATCH, BIT, BYTE, COPY, SIZE_MISMATCH};
use crate::codecs::deflate;
use crate::codecs::lz4::decode::{self as lz4_decode, launch_decode, Lz4Decoder};
use crate::codecs::nvcomp::{self as nvcomp_backend, library};
use crate::codecs::zlib::adler32::launch_adler32;
use crate::codecs::zstd::decode::{self as zstd_decode, BlockPlan, ZstdDecoder};
use crate::codecs::{BoxError, DeviceBatch, DeviceCodec, HostCheck, ItemArrays};
use crate::config::DecodeTrust;
use crate::error::GpuError;
use crate::schedule::{DecodeRates, GIB, MIB};

/// The device takes a chunk of at most this many streams plus one per this many decoded bytes:
/// what bounds a batch's tables and nvCOMP's item count ahead of its bytes (c-blosc's own
/// blocks split into streams of 8 KiB and more unless told otherwise).
const STREAMS_FREE: usize = 16;
const BYTES_PER_STREAM: usize = 4096;
/// Alignment of each stream in the scratch (and of payloads copied for an aligned decoder).
const ALIGN: u64 = 16;
/// Alignment of each region of the scratch.
const REGION: u64 = 256;
/// Marks a status of our LZ4 kernel (the fold keeps the largest, so it wins over
/// [`SIZE_MISMATCH`]); bits 8 to 29 hold the failing stream's index in its chunk, the low 8 the
/// kernel's code.
const LZ4_TAG: u32 = 0x4000_0000;
const LZ4_STREAM_BITS: u32 = 22;
/// Marks a status of our zstd kernels, the stream's index beside it as for [`LZ4_TAG`] (the fold
/// or-s it into the kernels' codes, which are below 256).
const ZSTD_TAG: u32 = 0x8000_0000;

/// `blosc`: Blosc1 chunks whose streams a device decoder decodes (lz4 and lz4hc: ours or
/// nvCOMP's; zstd: ours or nvCOMP's, by the read's trust; zlib: nvCOMP's), as the codec's
/// configuration names them; chunks of another compressor decode on host threads.
#[derive(Clone, Debug)]
pub(crate) struct Blosc {
    /// The compressor the configuration names.
    compressor: Compressor,
    cname: String,
    /// The decoder of LZ4 streams.
    lz4: Lz4Decoder,
    /// The decoder of zstd streams (`Auto` until a read routes it).
    zstd: ZstdDecoder,
}

/// The batched decoder of a chunk's compressed streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamDecoder {
    Nvcomp(Decompressor),
    /// Our LZ4 kernel.
    Lz4,
    /// Our zstd kernels.
    Zstd,
}

impl Blosc {
    /// The device codec for a `blosc` configuration (zarrs maps the v2 compressor to it).
    pub(crate) fn new(configuration: &Configuration) -> Result<Self, String> {
        let cname = configuration.get("cname").and_then(|v| v.as_str()).unwrap_or("lz4").to_string();
        let compressor = match cname.as_str() {
            "lz4" | "lz4hc" => Compressor::Lz4,
            "zstd" => Compressor::Zstd,
            "zlib" => Compressor::Zlib,
            "blosclz" => Compressor::BloscLz,
            "snappy" => Compressor::Snappy,
            other => return Err(format!("blosc compressor {other:?} is not one c-blosc 1.x has")),
        };
        Ok(Self {
            compressor,
            cname,
            lz4: Lz4Decoder::from_env(&crate::env::LZ4_DECODER)?,
            zstd: ZstdDecoder::from_env(&crate::env::ZSTD_DECODER)?,
        })
    }

    /// The same codec with LZ4 streams decoded by `lz4`.
    #[cfg(test)]
    fn with_lz4_decoder(mut self, lz4: Lz4Decoder) -> Self {
        self.lz4 = lz4;
        self
    }

    /// The same codec with zstd streams decoded by `zstd`.
    fn with_zstd(mut self, zstd: ZstdDecoder) -> Self {
        self.zstd = zstd;
        self
    }

    fn stream_decoder(&self) -> Option<StreamDecoder> {
        match (self.compressor, self.lz4) {
            (Compressor::Lz4, Lz4Decoder::Ours | Lz4Decoder::Auto) => Some(StreamDecoder::Lz4),
            (Compressor::Lz4, Lz4Decoder::Nvcomp) => Some(StreamDecoder::Nvcomp(Decompressor::Lz4)),
            // `Auto` not yet routed decodes with ours, which takes any input.
            (Compressor::Zstd, _) if self.zstd == ZstdDecoder::Nvcomp => {
                Some(StreamDecoder::Nvcomp(Decompressor::Zstd))
            }
            (Compressor::Zstd, _) => Some(StreamDecoder::Zstd),
            (Compressor::Zlib, _) => Some(StreamDecoder::Nvcomp(Decompressor::Deflate)),
            _ => None,
        }
    }

    /// nvCOMP's decoder of the streams, where nvCOMP decodes them.
    fn decompressor(&self) -> Option<Decompressor> {
        match self.stream_decoder() {
            Some(StreamDecoder::Nvcomp(d)) => Some(d),
            _ => None,
        }
    }

    /// Why the device does not take a chunk that checked out, if it does not.
    fn device_refusal(&self, chunk: &BloscChunk, decoded_len: u64) -> Option<Cow<'static, str>> {
        let compressed = chunk.streams.iter().any(|s| !s.raw);
        if compressed && chunk.compressor != self.compressor {
            return Some(
                format!("its streams are {:?}, the codec's configuration names {}", chunk.compressor, self.cname)
                    .into(),
            );
        }
        if compressed && self.stream_decoder().is_none() {
            return Some(format!("{} streams, which neither nvCOMP nor our kernels decode", self.cname).into());
        }
        let most = (decoded_len as usize / BYTES_PER_STREAM).saturating_add(STREAMS_FREE);
        if chunk.streams.len() > most {
            return Some(format!("{} streams, more than the device takes for its size", chunk.streams.len()).into());
        }
        // c-blosc stores a stream as it is rather than let it grow: never longer compressed.
        if chunk.streams.iter().any(|s| !s.raw && s.src_len >= s.dst_len) {
            return Some("a compressed stream no shorter than its decoded bytes".into());
        }
        None
    }

    /// The batch's plan, laid out from `base` (the scratch's address; 0 to size it), in `room`
    /// bytes where given: our zstd kernels then decode one warp a frame where their
    /// block-parallel plan does not fit.
    fn plan(&self, batch: &DeviceBatch<'_>, base: u64, room: Option<usize>) -> Result<Plan, GpuError> {
        let n = batch.count;
        let words = batch.host_arrays;
        if batch.host_inputs.len() != n || words.len() < 4 * n {
            return Err(GpuError::Unsupported("Blosc's device decode needs the chunks' stored bytes".into()));
        }
        // nvCOMP, for the configurations whose streams it decodes (the pipeline made sure of it).
        let decoder = match self.decompressor() {
            Some(d) => Some((d, library()?)),
            None => None,
        };
        let input_align = match decoder {
            Some((d, nvcomp)) => nvcomp.decompress_alignments(d)?.input as u64,
            None => 1,
        };
        let tag = match self.stream_decoder() {
            Some(StreamDecoder::Lz4) => LZ4_TAG,
            Some(StreamDecoder::Zstd) => ZSTD_TAG,
            _ => 0,
        };
        let mut plan = Plan { input_align: input_align.max(1), tag, ..Plan::default() };
        for u in 0..n {
            let (input, capacity, output) = (words[u], words[2 * n + u], words[3 * n + u]);
            let chunk = parse_chunk(batch.host_inputs[u], capacity)
                .map_err(|e| GpuError::Unsupported(format!("a Blosc chunk changed after its check: {e}")))?;
            plan.add_chunk(&chunk, batch.host_inputs[u], u as u32, input, output)?;
        }
        plan.decoder_temp = match (decoder, plan.items.len()) {
            (Some((d, nvcomp)), 1..) => {
                nvcomp.decompress_temp_size(d, plan.items.len(), plan.max_item, plan.scratch_len as usize)?
            }
            (None, 1..) if self.stream_decoder().is_none() => {
                return Err(GpuError::Unsupported(format!("{} streams reached the device", self.cname)));
            }
            (None, 1..) if self.stream_decoder() == Some(StreamDecoder::Zstd) => {
                let zstd = BlockPlan::device_walks(&plan.zstd_frames(batch.host_inputs)?, &plan.zstd_capacities());
                let len = zstd.len;
                plan.zstd = Some(zstd);
                len
            }
            _ => 0,
        };
        plan.locate(base);
        if room.is_some_and(|room| plan.len > room as u64) && plan.zstd.is_some() {
            plan.zstd = None;
            plan.decoder_temp = 0;
            plan.locate(base);
        }
        // For a launch whose zstd plan fits: the chains walked on the host where quicker (the
        // plan's size unchanged), but not while host threads wait to decode the batch's others.
        if room.is_some() && !batch.host_decodes {
            if let Some(zstd) = plan.zstd.take() {
                plan.zstd = Some(zstd.with_host_chains(&plan.zstd_frames(batch.host_inputs)?));
            }
        }
        Ok(plan)
    }
}

/// A batch's streams laid out: the decoder's items, the blocks to assemble, and where everything
/// lies in the scratch (the decoder's own, decoded streams, aligned payloads, tables).
#[derive(Debug, Default)]
struct Plan {
    input_align: u64,
    /// What a failing stream's status carries for its message ([`stream_tag`]): [`LZ4_TAG`],
    /// [`ZSTD_TAG`], or 0 (nvCOMP's statuses, untagged).
    tag: u32,
    /// The decoder's items (inputs hold stored addresses until payloads are copied for
    /// alignment).
    items: Vec<Item>,
    /// Blocks to assemble, and the addresses of their streams (scratch offsets of decoded
    /// streams are relative until [`Plan::locate`]).
    tasks: Vec<Task>,
    sources: Vec<Source>,
    /// Payload copies to aligned places, for decoders that need aligned input.
    packs: Vec<Task>,
    pack_sources: Vec<u64>,
    max_item: usize,
    max_block: u32,
    max_pack: u32,
    /// The decoder's scratch: nvCOMP's temp, or the block plan of our zstd kernels.
    decoder_temp: usize,
    zstd: Option<BlockPlan>,
    /// Bytes of decoded streams, and of aligned payloads.
    scratch_len: u64,
    packed_len: u64,
    /// Where each region starts (after [`Plan::locate`]).
    scratch_at: u64,
    packed_at: u64,
    tables_at: u64,
    len: u64,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    input: u64,
    input_len: u64,
    /// Where its payload starts in its chunk's stored bytes (on the host).
    host_start: u64,
    /// Offset of its decoded bytes in the scratch.
    at: u64,
    len: u64,
    unit: u32,
    /// Offset of its aligned copy, where one is made.
    packed_at: u64,
    /// Its index among its chunk's streams, for messages.
    stream: u32,
    /// The Adler-32 its decoded bytes must have (zlib streams).
    adler: u32,
}

#[derive(Debug, Clone, Copy)]
enum Source {
    /// Stored bytes, as they are.
    Stored(u64),
    /// The decoded bytes of item `k`.
    Item(usize),
}

impl Plan {
    fn add_chunk(
        &mut self,
        chunk: &BloscChunk,
        bytes: &[u8],
        unit: u32,
        input: u64,
        output: u64,
    ) -> Result<(), GpuError> {
        let blocksize = u64::from(chunk.header.blocksize);
        let mut streams = chunk.streams.iter().enumerate().peekable();
        for block in 0..chunk.nblocks {
            let first = self.sources.len();
            let mut count = 0u32;
            while let Some((index, s)) = streams.next_if(|(_, s)| s.block == block) {
                count += 1;
                let source = if s.raw {
                    Source::Stored(input + s.src_offset as u64)
                } else {
                    let payload = chunk.payload(s);
                    let at = self.scratch_len;
                    self.scratch_len = (at + s.dst_len as u64).next_multiple_of(ALIGN);
                    self.max_item = self.max_item.max(s.dst_len);
                    let packed_at = if self.input_align > 1 {
                        let at = self.packed_len;
                        self.packed_len = (at + payload.len() as u64).next_multiple_of(ALIGN.max(self.input_align));
                        at
                    } else {
                        0
                    };
                    // A zlib stream ends with the Adler-32 of its decoded bytes, big-endian.
                    let end = s.src_offset + s.src_len;
                    let adler = match (chunk.compressor, bytes.get(end.saturating_sub(4)..end)) {
                        (Compressor::Zlib, Some(&[a, b, c, d])) => u32::from_be_bytes([a, b, c, d]),
                        _ => 0,
                    };
                    self.items.push(Item {
                        input: input + payload.start as u64,
                        input_len: payload.len() as u64,
                        host_start: payload.start as u64,
                        at,
                        len: s.dst_len as u64,
                        unit,
                        packed_at,
                        stream: index as u32,
                        adler,
                    });
                    Source::Item(self.items.len() - 1)
                };
                self.sources.push(source);
            }
            if count == 0 {
                return Err(GpuError::Unsupported(format!("Blosc block {block} without streams")));
            }
            let task = block_task(chunk, block, count, output + block as u64 * blocksize, first as u64)?;
            self.max_block = self.max_block.max(task.len);
            self.tasks.push(task);
        }
        Ok(())
    }

    /// The items' zstd frames, from their payloads in `chunks` (the batch's stored bytes on the
    /// host), which our zstd kernels' block-parallel plan is made of.
    fn zstd_frames<'a>(&self, chunks: &[&'a [u8]]) -> Result<Vec<&'a [u8]>, GpuError> {
        self.items
            .iter()
            .map(|it| {
                let (start, len) = (it.host_start as usize, it.input_len as usize);
                chunks.get(it.unit as usize).and_then(|c| c.get(start..start.checked_add(len)?))
            })
            .collect::<Option<Vec<&[u8]>>>()
            .ok_or_else(|| GpuError::Unsupported("a Blosc stream outside its chunk's stored bytes".into()))
    }

    /// What each item's frame decodes to.
    fn zstd_capacities(&self) -> Vec<u64> {
        self.items.iter().map(|it| it.len).collect()
    }

    /// Lay the regions out from `base`, and make the addresses absolute.
    fn locate(&mut self, base: u64) {
        let n = self.items.len() as u64;
        self.packs.clear();
        self.pack_sources.clear();
        self.max_pack = 0;
        self.scratch_at = base + (self.decoder_temp as u64).next_multiple_of(REGION);
        self.packed_at = self.scratch_at + self.scratch_len.next_multiple_of(REGION);
        self.tables_at = self.packed_at + self.packed_len.next_multiple_of(REGION);
        self.len = self.tables_at - base + self.tables_len(n);
        if self.input_align > 1 {
            for it in &self.items {
                self.pack_sources.push(it.input);
                let len = it.input_len as u32;
                self.max_pack = self.max_pack.max(len);
                self.packs.push(Task {
                    dst: self.packed_at + it.packed_at,
                    first: self.pack_sources.len() as u64 - 1,
                    len,
                    stream_len: len.max(1),
                    typesize: 1,
                    mode: COPY,
                });
            }
        }
    }

    /// Bytes of the tables: the decoder's arrays (inputs, input sizes, capacities, outputs,
    /// decoded sizes: u64; statuses, the owning units, Adler-32 values and the stored ones, our
    /// kernels' status tags: u32), the tasks and their sources, the payload copies and theirs.
    fn tables_len(&self, n: u64) -> u64 {
        let tasks = (self.tasks.len() + self.items.len()) as u64;
        n * (5 * 8 + 5 * 4) + tasks * 32 + (self.sources.len() + self.items.len()) as u64 * 8 + 64
    }

    /// The tables' bytes, and the device addresses of each.
    fn tables(&self) -> (Vec<u8>, Tables) {
        let n = self.items.len();
        let mut out: Vec<u8> = Vec::with_capacity(self.tables_len(n as u64) as usize);
        let at = |out: &Vec<u8>| self.tables_at + out.len() as u64;
        let input = |it: &Item| if self.input_align > 1 { self.packed_at + it.packed_at } else { it.input };
        let words = |out: &mut Vec<u8>, values: &mut dyn Iterator<Item = u64>| {
            values.for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        };
        let inputs = at(&out);
        words(&mut out, &mut self.items.iter().map(input));
        let input_sizes = at(&out);
        words(&mut out, &mut self.items.iter().map(|it| it.input_len));
        let capacities = at(&out);
        words(&mut out, &mut self.items.iter().map(|it| it.len));
        let outputs = at(&out);
        words(&mut out, &mut self.items.iter().map(|it| self.scratch_at + it.at));
        let actual = at(&out);
        out.resize(out.len() + 8 * n, 0);
        let statuses = at(&out);
        out.resize(out.len() + 4 * n, 0);
        let unit_of = at(&out);
        self.items.iter().for_each(|it| out.extend_from_slice(&it.unit.to_le_bytes()));
        let adler = at(&out);
        out.resize(out.len() + 4 * n, 0);
        let adler_expected = at(&out);
        self.items.iter().for_each(|it| out.extend_from_slice(&it.adler.to_le_bytes()));
        let tags = at(&out);
        // None for decoders whose statuses carry no tag (nvCOMP's).
        let tag = |it: &Item| if self.tag == 0 { 0 } else { stream_tag(self.tag, it.stream) };
        self.items.iter().for_each(|it| out.extend_from_slice(&tag(it).to_le_bytes()));
        // The tables of 4-byte words above end on a multiple of 4 only: the tasks and the
        // address tables below are read as 8-byte words (a misaligned one is a fault that loses
        // the context), so each starts on 16 bytes.
        let align = |out: &mut Vec<u8>| out.resize(out.len().next_multiple_of(16), 0);
        align(&mut out);
        let tasks = at(&out);
        out.extend_from_slice(bytemuck::cast_slice(&self.tasks));
        align(&mut out);
        let sources = at(&out);
        words(
            &mut out,
            &mut self.sources.iter().map(|s| match *s {
                Source::Stored(address) => address,
                Source::Item(k) => self.scratch_at + self.items[k].at,
            }),
        );
        align(&mut out);
        let packs = at(&out);
        out.extend_from_slice(bytemuck::cast_slice(&self.packs));
        align(&mut out);
        let pack_sources = at(&out);
        words(&mut out, &mut self.pack_sources.iter().copied());
        debug_assert!(out.len() as u64 <= self.tables_len(n as u64), "Blosc's tables outgrew their room");
        let tables = Tables {
            inputs,
            input_sizes,
            capacities,
            outputs,
            actual,
            statuses,
            unit_of,
            adler,
            adler_expected,
            tags,
            tasks,
            sources,
            packs,
            pack_sources,
        };
        (out, tables)
    }
}

/// The assembly of block `block` of `chunk` (`streams` of them, their addresses from `first` in
/// the sources table) into `dst`.
fn block_task(chunk: &BloscChunk, block: usize, streams: u32, dst: u64, first: u64) -> Result<Task, GpuError> {
    let len =
        u32::try_from(chunk.block_len(block)).map_err(|_| GpuError::Unsupported("a Blosc block over 4 GiB".into()))?;
    let mode = match chunk.unshuffle(block) {
        Shuffle::None => COPY,
        Shuffle::Byte => BYTE,
        Shuffle::Bit => BIT,
    };
    let typesize = if mode == COPY { 1 } else { u32::from(chunk.header.typesize).max(1) };
    Ok(Task { dst, first, len, stream_len: len.div_ceil(streams.max(1)), typesize, mode })
}

/// Device addresses of a plan's tables.
struct Tables {
    inputs: u64,
    input_sizes: u64,
    capacities: u64,
    outputs: u64,
    actual: u64,
    statuses: u64,
    unit_of: u64,
    /// The Adler-32 of each item's decoded bytes (zlib), and the stored ones.
    adler: u64,
    adler_expected: u64,
    /// What our kernels' failing stream's status carries ([`stream_tag`]).
    tags: u64,
    tasks: u64,
    sources: u64,
    packs: u64,
    pack_sources: u64,
}

impl Tables {
    /// The streams as the items of a batched decoder.
    fn items(&self) -> ItemArrays {
        ItemArrays {
            inputs: self.inputs,
            input_sizes: self.input_sizes,
            capacities: self.capacities,
            outputs: self.outputs,
            decoded: self.actual,
            statuses: self.statuses,
        }
    }
}

/// The status tag `tag` ([`LZ4_TAG`], [`ZSTD_TAG`]) of the chunk's stream `stream`.
fn stream_tag(tag: u32, stream: u32) -> u32 {
    tag | (stream.min((1 << LZ4_STREAM_BITS) - 1) << 8)
}

/// Bytes the device decode of a batch of `count` chunks, `total` decoded bytes in all and at
/// most `max` each, may need beside nvCOMP's own temp (see [`Blosc::device_refusal`]'s bounds).
fn bound_beside_nvcomp(count: usize, total: usize, streams: usize) -> usize {
    let regions = 3 * REGION as usize;
    // Decoded streams, aligned payloads (compressed streams are shorter than decoded ones).
    let bytes = 2 * total.saturating_add(streams * ALIGN as usize);
    let tables = streams * (5 * 8 + 5 * 4 + 32 + 8 + 32 + 8) + 64;
    let _ = count;
    regions + bytes + tables
}

fn stream_bound(count: usize, total: usize) -> usize {
    count.saturating_mul(STREAMS_FREE).saturating_add(total / BYTES_PER_STREAM)
}

impl DeviceCodec for Blosc {
    fn name(&self) -> &'static str {
        "blosc"
    }

    fn needs_kernels(&self) -> bool {
        // The assembly of blocks (and our LZ4 decoder) are kernels of ours.
        true
    }

    fn needs_nvcomp(&self) -> bool {
        self.decompressor().is_some()
    }

    fn check(&self, encoded: &[u8], decoded_len: u64) -> Result<HostCheck, BoxError> {
        // Our LZ4 kernel checks every block as the walk does: the walk is for nvCOMP's.
        let walk_lz4 = self.lz4 == Lz4Decoder::Nvcomp;
        Ok(match check_chunk_as(encoded, decoded_len, walk_lz4)? {
            BloscVerdict::Host(why) => HostCheck::Host(why),
            BloscVerdict::Device(chunk) => match self.device_refusal(&chunk, decoded_len) {
                Some(why) => HostCheck::Host(why),
                None => HostCheck::Device { digest: None },
            },
        })
    }

    fn may_decode(&self, trust: DecodeTrust, verified: bool) -> bool {
        match self.compressor {
            Compressor::Zlib => deflate::may_decode(trust, verified),
            Compressor::Zstd => zstd_decode::may_decode(self.zstd, trust, verified),
            _ => verified || trust != DecodeTrust::Verified,
        }
    }

    fn routed(&self, trust: DecodeTrust, verified: bool) -> Option<Arc<dyn DeviceCodec>> {
        // zstd streams take the zstd family's route: ours where nothing verifies them.
        let zstd = zstd_decode::for_route(self.zstd, trust, verified);
        (self.compressor == Compressor::Zstd && zstd != self.zstd)
            .then(|| Arc::new(self.clone().with_zstd(zstd)) as Arc<dyn DeviceCodec>)
    }

    fn decode_rates(&self) -> Option<DecodeRates> {
        // First estimates for 1 MiB chunks of float32 (B1, B2 of `bench`: one chunk took 3.7 ms
        // (zstd) on nvCOMP, its blocks decoding side by side, and a whole batch decodes far
        // faster than the host reads and checks it); a host thread runs c-blosc at about 1.5
        // GiB/s for lz4 with byte shuffle, less for zstd and zlib. A device's reads refine the
        // host's rate and the device's slowness.
        let rates = DecodeRates::default();
        match self.compressor {
            // Our LZ4 kernel needs no split: through the pipeline on an H100 (benches/RESULTS.md
            // runs DS1, DS2) B1 reads of 1, 16, 64, 288 and 1,024 chunks all on it took 1.15,
            // 1.70, 3.22, 9.95 and 31.4 ms, on host threads 1.06, 1.89, 4.92, 20.8 and 66.0, and
            // split by these rates 1.07, 1.92, 3.83, 9.86 and 30.7 (p90 of one chunk 2.08
            // against 1.29 on the device): the split cost more than it saved.
            Compressor::Lz4 if self.stream_decoder() == Some(StreamDecoder::Lz4) => None,
            // nvCOMP's: one chunk took 5.7 ms on an H200.
            Compressor::Lz4 => {
                Some(rates.with_device_rates(1.0e-3, 220.0 * MIB, 60.0 * GIB).with_host_thread_rate(1.5 * GIB))
            }
            // Our zstd kernels: about 0.4 ms of launches and plan, and their bulk rate on Z2's
            // frames (22 GiB/s, run DL5); a chunk's streams decode side by side.
            Compressor::Zstd if self.stream_decoder() == Some(StreamDecoder::Zstd) => {
                Some(rates.with_device_rates(0.5e-3, 400.0 * MIB, 22.0 * GIB).with_host_thread_rate(0.6 * GIB))
            }
            Compressor::Zstd => {
                Some(rates.with_device_rates(0.8e-3, 340.0 * MIB, 60.0 * GIB).with_host_thread_rate(0.6 * GIB))
            }
            Compressor::Zlib => {
                Some(rates.with_device_rates(1.0e-3, 160.0 * MIB, 20.0 * GIB).with_host_thread_rate(0.3 * GIB))
            }
            Compressor::BloscLz | Compressor::Snappy | Compressor::Unknown(_) => None,
        }
    }

    fn prefers_large_batches(&self) -> bool {
        // LZ4 streams: reads are bound by the host's walk of every block (nvCOMP's LZ4 is fast);
        // batches of the 1 GiB staging budget ran B1 at 27.5 GiB/s, of 4 GiB at 23.4 (run AO).
        self.compressor != Compressor::Lz4
    }

    fn scratch_bound(&self, count: usize, max_decoded: usize, total_decoded: usize) -> Result<usize, GpuError> {
        let streams = stream_bound(count, total_decoded);
        // Sized as the plan sizes it: the decoded streams, each aligned in the scratch.
        let decoded = total_decoded.saturating_add(streams.saturating_mul(ALIGN as usize));
        let decoder_temp = match self.stream_decoder() {
            Some(StreamDecoder::Nvcomp(d)) => library()?.decompress_temp_size(d, streams, max_decoded, decoded)?,
            // Room for the block-parallel plan of usual streams; a batch that needs more decodes
            // one warp a frame, with none.
            Some(StreamDecoder::Zstd) => BlockPlan::bound(streams, total_decoded),
            _ => 0,
        };
        Ok(decoder_temp.saturating_add(bound_beside_nvcomp(count, total_decoded, streams)))
    }

    unsafe fn scratch_for(&self, batch: &DeviceBatch<'_>, _total_decoded: usize) -> Result<Option<usize>, GpuError> {
        // Sized from the chunks' own streams, on the host.
        let plan = self.plan(batch, 0, None)?;
        Ok(Some(plan.len as usize))
    }

    unsafe fn decode(&self, batch: &DeviceBatch<'_>) -> Result<(), GpuError> {
        let kernels = batch.kernels.ok_or_else(|| GpuError::NoNvrtc("assembling Blosc blocks needs it".into()))?;
        let plan = self.plan(batch, batch.scratch, Some(batch.scratch_bytes))?;
        // The driver calls below act on the current context.
        batch.stream.context().bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
        if plan.len > batch.scratch_bytes as u64 {
            return Err(GpuError::Unsupported(format!(
                "Blosc's decode needs {} bytes of scratch, {} given",
                plan.len, batch.scratch_bytes
            )));
        }
        let (bytes, t) = plan.tables();
        let stream = batch.stream;
        let n = plan.items.len();
        let uploads =
            batch.uploads.ok_or_else(|| GpuError::Unsupported("Blosc's tables need the device's uploads".into()))?;
        // SAFETY: the tables' region is in this batch's scratch, which the stream owns until
        // the batch's work has run.
        unsafe { uploads.upload(stream, &bytes, plan.tables_at) }?;
        // Every chunk decodes to its whole length unless a stream says otherwise (the fold).
        // SAFETY: `count` u64 and u32 entries at the batch's arrays, ordered on the stream.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(batch.decoded_sizes, batch.capacities, 8 * batch.count, stream.cu_stream())
                .result()
                .map_err(GpuError::cuda("setting Blosc's decoded sizes"))?;
            sys::cuMemsetD32Async(batch.statuses, 0, batch.count, stream.cu_stream())
                .result()
                .map_err(GpuError::cuda("clearing Blosc's statuses"))?;
        }
        match (self.stream_decoder(), n) {
            (_, 0) | (None, _) => {}
            (Some(StreamDecoder::Lz4), _) => {
                let arrays = t.items();
                // SAFETY: inputs and input sizes are the stored payloads of the streams, outputs
                // and capacities their places in the scratch (disjoint, each its decoded
                // length); any bytes at all decode within those bounds or end as a status.
                unsafe { launch_decode(kernels, stream, &arrays, t.tags, n) }?;
            }
            (Some(StreamDecoder::Zstd), _) => {
                let arrays = t.items();
                // SAFETY: as for LZ4 above; a block plan, made from these streams' own stored
                // bytes, holds the scratch's first bytes (the plan made room for it).
                unsafe {
                    match &plan.zstd {
                        Some(zstd) => {
                            zstd_decode::launch_blocks(kernels, uploads, stream, &arrays, n, zstd, batch.scratch)
                        }
                        None => zstd_decode::launch_decode(kernels, stream, &arrays, n),
                    }
                }?;
            }
            (Some(StreamDecoder::Nvcomp(decompressor)), _) => {
                let nvcomp = library()?;
                // SAFETY: payload copies stay within the stored chunks and the packed region.
                unsafe {
                    kernels::launch_assemble(kernels, stream, t.packs, t.pack_sources, plan.packs.len(), plan.max_pack)
                }?;
                // SAFETY: every stream passed the host check of its compressor (an LZ4 block
                // walked to its decoded length, a zstd frame walked, a zlib stream only when
                // crc32c verified it or under trust); inputs, capacities and outputs describe the
                // stored (or aligned) payloads and their places in the scratch; nvCOMP's temp is
                // the scratch's first bytes, sized for these items.
                unsafe {
                    nvcomp.decompress_async(
                        decompressor,
                        t.inputs as *const *const c_void,
                        t.input_sizes as *const usize,
                        t.capacities as *const usize,
                        t.actual as *mut usize,
                        n,
                        batch.scratch as *mut c_void,
                        plan.decoder_temp,
                        t.outputs as *const *mut c_void,
                        t.statuses as *mut nv::nvcompStatus_t,
                        stream.cu_stream() as nv::cudaStream_t,
                    )
                }?;
            }
        }
        if n > 0 && self.stream_decoder().is_some() {
            // zlib: the Adler-32 of every decoded stream, against its trailer's.
            let zlib = self.compressor == Compressor::Zlib;
            if zlib {
                // SAFETY: n outputs of their capacities in the scratch, decoded on this stream;
                // n u32 values in the tables.
                unsafe { launch_adler32(kernels, stream, t.outputs, t.capacities, n, t.adler) }?;
            }
            let fold = FoldArrays {
                statuses: t.statuses,
                actual: t.actual,
                capacities: t.capacities,
                unit_of: t.unit_of,
                adler: if zlib { t.adler } else { 0 },
                adler_expected: if zlib { t.adler_expected } else { 0 },
                // Our zstd kernels' codes get their stream's tag (our LZ4 kernel's carry it, and
                // nvCOMP's streams have none).
                tags: t.tags,
            };
            // SAFETY: n entries each, ordered on the stream; unit indices below `count`.
            unsafe { kernels::launch_fold(kernels, stream, &fold, n, batch.statuses) }?;
        }
        // SAFETY: each task's sources are its block's streams (stored, or decoded into the
        // scratch) and its destination its place in the chunk's output, which holds the chunk's
        // decoded length (the blocks tile it).
        unsafe { kernels::launch_assemble(kernels, stream, t.tasks, t.sources, plan.tasks.len(), plan.max_block) }
    }

    fn status_string(&self, status: u32) -> String {
        match status {
            SIZE_MISMATCH => "a stream decoded to another length than its block's".into(),
            ADLER_MISMATCH => "a zlib stream's Adler-32 does not match its decoded bytes".into(),
            tagged if tagged & 0xC000_0000 == LZ4_TAG => format!(
                "LZ4 stream {} of the chunk failed on the device: {}",
                (tagged >> 8) & ((1 << LZ4_STREAM_BITS) - 1),
                lz4_decode::status_text(tagged)
            ),
            tagged if tagged & 0xC000_0000 == ZSTD_TAG => format!(
                "zstd stream {} of the chunk failed on the device: {}",
                (tagged >> 8) & ((1 << LZ4_STREAM_BITS) - 1),
                zstd_decode::status_text(tagged & 0xFF)
            ),
            other => format!("a stream failed: {}", nvcomp_backend::status_string(other)),
        }
    }

    fn decode_host(&self, encoded: &[u8], out: &mut [u8]) -> Result<usize, String> {
        decode_host(encoded, out)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod speed {
    /// The host check's rate on chunks like the benchmark's B1 (c-blosc lz4 level 5, byte
    /// shuffle, float32 in 1 MiB chunks): run with `--release --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, not a test: run by hand with --release"]
    fn host_check_rate_on_b1_like_chunks() {
        let chunks: Vec<(Vec<u8>, usize)> = (0..32)
            .map(|k| {
                // The benchmark's sample field (a 64^3 chunk): smooth, rounded, 4 bits of noise.
                let data: Vec<u8> = (0..1u64 << 18)
                    .flat_map(|i| {
                        let (z, y, x) = ((i >> 12) as f32 + k as f32, ((i >> 6) & 63) as f32, (i & 63) as f32);
                        let smooth = (x * 0.011).sin() * (y * 0.007).cos() * 1000.0 + z * 0.5;
                        let mut h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                        h ^= h >> 29;
                        (smooth.round() + (h & 0xF) as f32).to_le_bytes()
                    })
                    .collect();
                (super::tests::compress_for_speed(&data), data.len())
            })
            .collect();
        let stored: usize = chunks.iter().map(|c| c.0.len()).sum();
        let start = std::time::Instant::now();
        let rounds = 10;
        for _ in 0..rounds {
            for (bytes, len) in &chunks {
                let verdict = super::check_chunk_as(bytes, *len as u64, true).unwrap();
                assert!(matches!(verdict, super::BloscVerdict::Device(_)));
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let decoded = ((rounds * chunks.len()) << 20) as f64;
        eprintln!(
            "one thread: {:.2} GiB/s decoded, {:.2} GB/s stored (ratio {:.2})",
            decoded / secs / (1u64 << 30) as f64,
            (rounds * stored) as f64 / secs / 1e9,
            (chunks.len() << 20) as f64 / stored as f64
        );
    }
}
