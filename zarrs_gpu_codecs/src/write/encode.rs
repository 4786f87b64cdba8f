//! A batch's chunks encoded: assembled raw chunks (C order, the platform's byte order) laid out
//! as stored (the gather kernel: transposes, byte swaps), compressed by nvCOMP in one batched call
//! (zstd, gzip, raw deflate in a zlib frame, LZ4 or zstd in a Blosc frame after the shuffle
//! kernel) or by host threads (small batches), then copied into one pinned host buffer with the
//! frames' headers and trailers written around them, ready to store.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use nvcomp_sys::{sys, Compressor};
use rayon::prelude::*;
use zarrs_storage::StoreKey;

use super::codec::{Layout, WriteChain};
use crate::codecs::blosc::encode::{BloscShuffle, BloscWrite, FRAME_HEAD as BLOSC_FRAME_HEAD};
use crate::codecs::blosc::header::{HEADER_LEN as BLOSC_HEADER, MEMCPYED as BLOSC_MEMCPYED};
use crate::codecs::blosc::kernels::{launch_shuffle, ShuffleTask, BIT, BYTE};
use crate::codecs::encode::WriteCodec;
use crate::codecs::zlib::adler32::launch_adler32;
use crate::codecs::zstd::encode::ZstdWrite;
use crate::codecs::zstd::frame::flag_content_checksum;
use crate::device::context::GpuContext;
use crate::device::kernels::Kernels;
use crate::error::GpuError;
use crate::pipeline::place;
use crate::reader::PinnedBuffer;

/// Room left after each encoded chunk in host memory for its crc32c.
pub(super) const CRC_ROOM: usize = 4;

/// The chunks of a batch to encode, in a device buffer: where each starts, its raw length, its
/// shape (for a stored layout) and its key (its shard's, for an inner chunk; for errors).
pub(super) struct Slots<'a> {
    pub(super) offsets: Vec<u64>,
    pub(super) lens: Vec<u64>,
    pub(super) shapes: Vec<&'a [u64]>,
    pub(super) keys: Vec<&'a StoreKey>,
    /// Bytes per element.
    pub(super) elem: u64,
}

/// Bytes written before or after a chunk's device bytes in the pinned copy (a frame's header or
/// trailer): at most a Blosc header, its block start and its stream's length.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Affix {
    bytes: [u8; 24],
    len: usize,
}

impl Affix {
    fn of(bytes: &[u8]) -> Self {
        let mut affix = Self { len: bytes.len(), ..Self::default() };
        affix.bytes[..bytes.len()].copy_from_slice(bytes);
        affix
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Where an encoded chunk is before it is copied out: on the device (its bytes at `ptr`, with a
/// header and trailer of the host's around them), or already on the host (encoded by host threads).
pub(super) enum Source<'a> {
    Device { ptr: u64, len: usize, head: Affix, tail: Affix },
    Host(&'a [u8]),
}

impl Source<'_> {
    fn plain(ptr: u64, len: usize) -> Self {
        Self::Device { ptr, len, head: Affix::default(), tail: Affix::default() }
    }

    fn len(&self) -> usize {
        match self {
            Self::Device { len, head, tail, .. } => head.len + len + tail.len,
            Self::Host(bytes) => bytes.len(),
        }
    }
}

/// A batch's encoded chunks in pinned host memory, one after another, each followed by
/// [`CRC_ROOM`] bytes for its checksum: copied out of the device at once, stored from here.
pub(super) struct EncodedBatch {
    /// None once given back (on drop).
    pub(super) buffer: Option<PinnedBuffer>,
    /// Each chunk's encoded bytes in `buffer`: start and length.
    pub(super) frames: Vec<(usize, usize)>,
    ctx: Arc<GpuContext>,
}

impl EncodedBatch {
    /// Copy `sources`, in order, into a pinned buffer of `ctx`'s pool.
    fn copy_out(ctx: &Arc<GpuContext>, stream: &CudaStream, sources: &[Source<'_>]) -> Result<Self, GpuError> {
        let mut frames = Vec::with_capacity(sources.len());
        let mut total = 0usize;
        for source in sources {
            let len = source.len();
            frames.push((total, len));
            total = len
                .checked_add(CRC_ROOM)
                .and_then(|len| total.checked_add(len))
                .ok_or_else(|| GpuError::Unsupported("a batch of encoded chunks overflows usize".into()))?;
        }
        let mut buffer = ctx.take_pinned(total.max(1))?;
        let host = buffer.as_mut_slice();
        let queued = sources.iter().zip(&frames).try_for_each(|(source, &(at, len))| match source {
            Source::Device { ptr, len: body, head, tail } => {
                let frame = &mut host[at..at + len];
                let (front, rest) = frame.split_at_mut(head.len);
                let (middle, back) = rest.split_at_mut(*body);
                front.copy_from_slice(head.as_slice());
                back.copy_from_slice(tail.as_slice());
                // SAFETY: `ptr` holds `body` bytes on the device until the stream has run the
                // copy (the caller keeps them and synchronizes below); the destination is within
                // `host`.
                unsafe { cudarc::driver::result::memcpy_dtoh_async(middle, *ptr, stream.cu_stream()) }
            }
            Source::Host(bytes) => {
                host[at..at + len].copy_from_slice(bytes);
                Ok(())
            }
        });
        let synced = stream.synchronize();
        if let Err(err) = synced {
            // Copies may still be writing into it: never reused, never freed.
            std::mem::forget(buffer);
            return Err(GpuError::cuda("copying encoded chunks to the host")(err));
        }
        if let Err(err) = queued {
            // The copies queued before the failure have run: the buffer may be used again.
            ctx.give_pinned(buffer);
            return Err(GpuError::cuda("copying encoded chunks to the host")(err));
        }
        Ok(Self { buffer: Some(buffer), frames, ctx: ctx.clone() })
    }
}

impl Drop for EncodedBatch {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            self.ctx.give_pinned(buffer);
        }
    }
}

/// Whether a chain needs kernels on the device (a layout's gather, zlib's Adler-32, zstd's XXH64
/// content checksum, Blosc's shuffle).
pub(super) fn needs_kernels(chain: &WriteChain) -> bool {
    chain.layout.is_some()
        || matches!(
            chain.codec,
            Some(WriteCodec::Zlib(_) | WriteCodec::Blosc(_) | WriteCodec::Zstd(ZstdWrite { checksum: true, .. }))
        )
}

/// The slots of `buffer` encoded by `chain` and copied to the host. Codecs split a batch between
/// nvCOMP (the first chunks) and host threads (the rest, from a pinned copy of their raw bytes),
/// both at once: `share` of it on host threads, else all of a small batch ([`host_encoded`]).
pub(super) fn encode_slots(
    chain: &WriteChain,
    share: Option<f64>,
    (ctx, stream, kernels): (&Arc<GpuContext>, &Arc<CudaStream>, Option<&Kernels>),
    buffer: &CudaSlice<u8>,
    slots: &Slots<'_>,
) -> Result<EncodedBatch, GpuError> {
    let needed = kernels;
    let kernels = || needed.ok_or_else(no_kernels);
    // The stored layout, in a buffer of its own (same offsets).
    let laid_out = match &chain.layout {
        Some(layout) => Some(lay_out(layout, (ctx, stream, kernels()?), buffer, slots)?),
        None => None,
    };
    let buffer = laid_out.as_ref().unwrap_or(buffer);
    let (ptr, _guard) = buffer.device_ptr(stream);
    let n = slots.lens.len();
    let Some(codec) = &chain.codec else {
        let sources: Vec<Source<'_>> =
            slots.offsets.iter().zip(&slots.lens).map(|(&at, &len)| Source::plain(ptr + at, len as usize)).collect();
        return EncodedBatch::copy_out(ctx, stream, &sources);
    };
    let on_device = n - host_encoded(share, n);
    // The host's share: its raw bytes in pinned memory first (none to copy when it has none).
    let host_sources: Vec<Source<'_>> =
        (on_device..n).map(|k| Source::plain(ptr + slots.offsets[k], slots.lens[k] as usize)).collect();
    let staged = if host_sources.is_empty() { None } else { Some(EncodedBatch::copy_out(ctx, stream, &host_sources)?) };
    let on_host = || -> Result<Vec<Vec<u8>>, GpuError> {
        let Some(staged) = &staged else { return Ok(Vec::new()) };
        let host = staged.buffer.as_ref().expect("held until dropped").as_slice();
        staged
            .frames
            .par_iter()
            .zip(&slots.keys[on_device..])
            .map(|(&(at, len), key)| {
                codec.encode_host(&host[at..at + len]).map_err(|e| GpuError::chunk(key.to_string(), e))
            })
            .collect()
    };
    let device = Slots {
        offsets: slots.offsets[..on_device].to_vec(),
        lens: slots.lens[..on_device].to_vec(),
        shapes: slots.shapes[..on_device].to_vec(),
        keys: slots.keys[..on_device].to_vec(),
        elem: slots.elem,
    };
    if let WriteCodec::Blosc(blosc) = codec {
        return encode_blosc(*blosc, (ctx, stream, needed), buffer, &device, on_host);
    }
    let compressor = codec.nvcomp().expect("every codec but Blosc at level 0 compresses");
    // A zlib stream ends with the Adler-32 of its content (big endian), a zstd frame with a
    // content checksum with the low 32 bits of its XXH64 (little endian).
    let digest = match codec {
        WriteCodec::Zlib(_) => Some(Digest::Adler32),
        WriteCodec::Zstd(ZstdWrite { checksum: true, .. }) => Some(Digest::Xxh64),
        _ => None,
    };
    let digest = match digest {
        Some(digest) => Some((digest, kernels()?)),
        None => None,
    };
    let done = compress(compressor, (ctx, stream, digest), buffer, &device, on_host)?;
    let (out_ptr, _g) = done.out.device_ptr(stream);
    let head = match codec {
        WriteCodec::Zlib(zlib) => Affix::of(&zlib.header()),
        _ => Affix::default(),
    };
    let tail = |k: usize| match (digest, done.digests.get(k)) {
        (Some((Digest::Adler32, _)), Some(d)) => Affix::of(&d.to_be_bytes()),
        (Some((Digest::Xxh64, _)), Some(d)) => Affix::of(&d.to_le_bytes()),
        _ => Affix::default(),
    };
    let sources: Vec<Source<'_>> = done
        .sizes
        .iter()
        .enumerate()
        .map(|(k, &size)| Source::Device {
            ptr: out_ptr + (k * done.slot) as u64,
            len: size as usize,
            head,
            tail: tail(k),
        })
        .chain(done.host.iter().map(|f| Source::Host(f)))
        .collect();
    let mut encoded = EncodedBatch::copy_out(ctx, stream, &sources)?;
    if let Some((Digest::Xxh64, _)) = digest {
        // nvCOMP's frames say nothing of the checksum after them: their headers' flag is set
        // here (libzstd's frames, from host threads, carry their own).
        let frames = encoded.frames[..done.sizes.len()].to_vec();
        let host = encoded.buffer.as_mut().expect("held until dropped").as_mut_slice();
        for (k, (at, len)) in frames.into_iter().enumerate() {
            let frame = &mut host[at..at + len - 4];
            flag_content_checksum(frame, device.lens[k]).map_err(|e| {
                GpuError::chunk(device.keys[k].to_string(), format!("nvCOMP's zstd frame takes no checksum: {e}"))
            })?;
        }
    }
    Ok(encoded)
}

/// A checksum of each raw chunk that its frame ends with, computed on the device beside nvCOMP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Digest {
    /// zlib's Adler-32.
    Adler32,
    /// The low 32 bits of XXH64 (seed 0): zstd's content checksum.
    Xxh64,
}

fn no_kernels() -> GpuError {
    GpuError::Unsupported("this chain's device encoders need NVRTC".into())
}

/// `slots` of `buffer` laid out as stored (transposed, words swapped) into a new buffer at the
/// same offsets: one gather job per chunk.
fn lay_out(
    layout: &Layout,
    (ctx, stream, kernels): (&Arc<GpuContext>, &Arc<CudaStream>, &Kernels),
    buffer: &CudaSlice<u8>,
    slots: &Slots<'_>,
) -> Result<CudaSlice<u8>, GpuError> {
    // Every byte of each slot's chunk is written by its job; the padding between is never read.
    let out = ctx.alloc(stream, buffer.len())?;
    let (src, _a) = buffer.device_ptr(stream);
    let jobs = layout_jobs(layout, slots, src);
    let table = stream.clone_htod(&place::encode_gather(&jobs)).map_err(GpuError::cuda("staging the layout jobs"))?;
    {
        let (table_ptr, _b) = table.device_ptr(stream);
        let (out_ptr, _c) = out.device_ptr(stream);
        // SAFETY: each job reads its chunk within `buffer` and writes the same bytes of `out` at
        // its offset (strides from the chunk's shape); the table is ordered on the stream.
        unsafe { kernels.launch_gather(stream, table_ptr, &jobs, out_ptr) }?;
    }
    Ok(out)
}

/// The gather jobs laying out each of `slots` (chunks in C order at `src` + its offset) as stored,
/// each to its own offset of the output.
fn layout_jobs(layout: &Layout, slots: &Slots<'_>, src: u64) -> Vec<place::Gather> {
    let elem = slots.elem;
    slots
        .offsets
        .iter()
        .zip(&slots.shapes)
        .map(|(&at, &shape)| {
            // Stored as a read gathers from it.
            let dst_stride = place::stored_strides(layout.transpose.as_deref(), shape, elem);
            place::Gather {
                src: src + at,
                dst: at,
                elem,
                swap: layout.swap,
                extent: shape.to_vec(),
                src_stride: place::stored_strides(None, shape, elem),
                dst_stride,
            }
        })
        .collect()
}

/// What nvCOMP compressed: the frames in slots of `slot` bytes of `out` (`sizes` of them), the
/// digest of each raw chunk where asked, and the host's frames.
struct Compressed {
    out: CudaSlice<u8>,
    slot: usize,
    sizes: Vec<u64>,
    digests: Vec<u32>,
    host: Vec<Vec<u8>>,
}

/// nvCOMP's batched `codec` of `slots` of `raw`, with a digest of each raw chunk where asked
/// (with the kernels), and `alongside` run while the device compresses.
fn compress(
    codec: Compressor,
    (ctx, stream, digest): (&Arc<GpuContext>, &Arc<CudaStream>, Option<(Digest, &Kernels)>),
    raw: &CudaSlice<u8>,
    slots: &Slots<'_>,
    alongside: impl FnOnce() -> Result<Vec<Vec<u8>>, GpuError>,
) -> Result<Compressed, GpuError> {
    let n = slots.lens.len();
    if n == 0 {
        let host = alongside()?;
        let out = ctx.alloc(stream, 1)?;
        return Ok(Compressed { out, slot: 0, sizes: Vec::new(), digests: Vec::new(), host });
    }
    let nvcomp = nvcomp_sys::NvcompLibrary::get().map_err(|e| GpuError::NoNvcomp(e.to_string()))?;
    let cuda = |what| GpuError::cuda(what);
    let max_len = slots.lens.iter().copied().max().unwrap_or(0) as usize;
    let total = slots.lens.iter().sum::<u64>() as usize;
    let bound = nvcomp.compress_max_output_chunk_size(codec, max_len).map_err(GpuError::Nvcomp)?;
    let slot = bound.next_multiple_of(256);
    let temp_bytes = nvcomp.compress_temp_size(codec, n, max_len, total).map_err(GpuError::Nvcomp)?;
    // From the device's pool: nvCOMP writes the frames and uses the scratch; only the bytes of
    // each frame it reports are copied out.
    let out_len =
        n.checked_mul(slot).ok_or_else(|| GpuError::Overflow(format!("{n} compressed slots of {slot} bytes")))?;
    let mut out = ctx.alloc(stream, out_len)?;
    let mut temp = ctx.alloc(stream, temp_bytes.max(1))?;
    let mut sizes: CudaSlice<u64> = stream.alloc_zeros(n).map_err(cuda("allocating sizes"))?;
    let mut statuses: CudaSlice<u32> = stream.alloc_zeros(n).map_err(cuda("allocating statuses"))?;
    let mut digests: CudaSlice<u32> = stream.alloc_zeros(n).map_err(cuda("allocating checksums"))?;
    let host = {
        let (raw_ptr, _a) = raw.device_ptr(stream);
        let (out_ptr, _b) = out.device_ptr_mut(stream);
        let (temp_ptr, _c) = temp.device_ptr_mut(stream);
        // nvCOMP's three arrays (input pointers, lengths, output pointers) in one upload.
        let table: Vec<u64> = (slots.offsets.iter().map(|&at| raw_ptr + at))
            .chain(slots.lens.iter().copied())
            .chain((0..n).map(|k| out_ptr + (k * slot) as u64))
            .collect();
        let d_table = stream.clone_htod(&table).map_err(cuda("staging compression arrays"))?;
        let (p_inputs, _d) = d_table.device_ptr(stream);
        let (p_lens, p_outputs) = (p_inputs + 8 * n as u64, p_inputs + 16 * n as u64);
        let (p_sizes, _g) = sizes.device_ptr_mut(stream);
        let (p_statuses, _h) = statuses.device_ptr_mut(stream);
        if let Some((digest, kernels)) = digest {
            let (p_digests, _i) = digests.device_ptr_mut(stream);
            match digest {
                // SAFETY: n pointers and lengths of raw chunks within `raw`, n u32 out; ordered on
                // the stream, alive until it is synchronised below.
                Digest::Adler32 => unsafe { launch_adler32(kernels, stream, p_inputs, p_lens, n, p_digests) }?,
                Digest::Xxh64 => {
                    // The kernel reads 8-byte words: chunks start at aligned slots (checked).
                    if let Some(k) = table[..n].iter().position(|&p| p % 8 != 0) {
                        let reason = format!("raw chunk at {:#x} is not 8-byte aligned for XXH64", table[k]);
                        return Err(GpuError::chunk(slots.keys[k].to_string(), reason));
                    }
                    // SAFETY: as above; the chunks are 8-byte aligned (checked).
                    unsafe { kernels.launch_xxh64(stream, p_inputs, p_lens, n, p_digests) }?;
                }
            }
        }
        // SAFETY: n device pointers to chunks within `raw` (256-byte aligned, each at most
        // max_len bytes) and their lengths; n output slots of nvCOMP's bound; its temp size; n
        // sizes and statuses; all alive until the stream has run the work (awaited below).
        unsafe {
            nvcomp.compress_async(
                codec,
                p_inputs as *const *const c_void,
                p_lens as *const usize,
                max_len,
                n,
                temp_ptr as *mut c_void,
                temp_bytes,
                p_outputs as *const *mut c_void,
                p_sizes as *mut usize,
                p_statuses as *mut sys::nvcompStatus_t,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(GpuError::Nvcomp)?;
        // The host's share runs now; whatever happens there, the device's work ends before its
        // buffers go.
        let host = alongside();
        stream.synchronize().map_err(cuda("compressing chunks"))?;
        host?
    };
    let statuses = stream.clone_dtoh(&statuses).map_err(cuda("reading compression statuses"))?;
    let sizes = stream.clone_dtoh(&sizes).map_err(cuda("reading compressed sizes"))?;
    let digests =
        if digest.is_some() { stream.clone_dtoh(&digests).map_err(cuda("reading checksums"))? } else { Vec::new() };
    if let Some(k) = statuses.iter().position(|&s| s != sys::nvcompSuccess) {
        let reason = format!("nvCOMP {codec:?} compression: {}", nvcomp.status_string(statuses[k]));
        return Err(GpuError::chunk(slots.keys[k].to_string(), reason));
    }
    if let Some(k) = sizes.iter().position(|&size| size == 0 || size as usize > bound) {
        let reason = format!("nvCOMP {codec:?} wrote {} bytes (bound {bound})", sizes[k]);
        return Err(GpuError::chunk(slots.keys[k].to_string(), reason));
    }
    Ok(Compressed { out, slot, sizes, digests, host })
}

/// Blosc chunks on the device: each chunk one block, shuffled (a kernel), its one stream
/// compressed by nvCOMP (LZ4 or zstd); a chunk whose stream does not shrink is stored memcpyed
/// (its raw bytes after the header), as c-blosc stores it.
fn encode_blosc(
    blosc: BloscWrite,
    (ctx, stream, kernels): (&Arc<GpuContext>, &Arc<CudaStream>, Option<&Kernels>),
    raw: &CudaSlice<u8>,
    slots: &Slots<'_>,
    on_host: impl FnOnce() -> Result<Vec<Vec<u8>>, GpuError>,
) -> Result<EncodedBatch, GpuError> {
    let too_large = |k: usize| GpuError::chunk(slots.keys[k].to_string(), "a Blosc chunk holds less than 2 GiB");
    let nbytes: Vec<u32> = (0..slots.lens.len())
        .map(|k| u32::try_from(slots.lens[k]).ok().filter(|&n| n <= i32::MAX as u32 - 16).ok_or_else(|| too_large(k)))
        .collect::<Result<_, _>>()?;
    let (raw_ptr, _a) = raw.device_ptr(stream);
    let memcpyed = |k: usize| Source::Device {
        ptr: raw_ptr + slots.offsets[k],
        len: slots.lens[k] as usize,
        head: Affix::of(&blosc.header(BLOSC_MEMCPYED, nbytes[k], nbytes[k] + BLOSC_HEADER as u32)),
        tail: Affix::default(),
    };
    let Some(compressor) = WriteCodec::Blosc(blosc).nvcomp() else {
        // Level 0: every chunk memcpyed.
        let host = on_host()?;
        let sources: Vec<Source<'_>> =
            (0..nbytes.len()).map(memcpyed).chain(host.iter().map(|f| Source::Host(f))).collect();
        return EncodedBatch::copy_out(ctx, stream, &sources);
    };
    // Shuffled into a buffer of their own at the same offsets (the raw ones stay for memcpyed
    // chunks); chunks without a shuffle are copied as they are by the same kernel.
    let shuffles: Vec<BloscShuffle> = slots.lens.iter().map(|&len| blosc.shuffle_for(len)).collect();
    let shuffled_copy = if shuffles.iter().all(|&s| s == BloscShuffle::None) {
        None
    } else {
        let out = ctx.alloc(stream, raw.len())?;
        let (out_ptr, guard) = out.device_ptr(stream);
        let tasks: Vec<ShuffleTask> = (0..nbytes.len())
            .map(|k| ShuffleTask {
                src: raw_ptr + slots.offsets[k],
                dst: out_ptr + slots.offsets[k],
                len: nbytes[k],
                typesize: u32::from(blosc.typesize),
                mode: match shuffles[k] {
                    BloscShuffle::Byte => BYTE,
                    BloscShuffle::Bit => BIT,
                    BloscShuffle::None => 0,
                },
                pad: 0,
            })
            .collect();
        let words: &[u64] = bytemuck::cast_slice(&tasks);
        let table = stream.clone_htod(words).map_err(GpuError::cuda("staging shuffle tasks"))?;
        let (table_ptr, _c) = table.device_ptr(stream);
        let longest = nbytes.iter().copied().max().unwrap_or(0);
        // SAFETY: each task reads its chunk within `raw` and writes the same range of `out`; the
        // table is ordered on the stream.
        unsafe { launch_shuffle(kernels.ok_or_else(no_kernels)?, stream, table_ptr, tasks.len(), longest) }?;
        drop(guard);
        Some(out)
    };
    let done = compress(compressor, (ctx, stream, None), shuffled_copy.as_ref().unwrap_or(raw), slots, on_host)?;
    let (out_ptr, _d) = done.out.device_ptr(stream);
    let sources: Vec<Source<'_>> = done
        .sizes
        .iter()
        .enumerate()
        .map(|(k, &size)| {
            let framed = (size as usize).checked_add(BLOSC_FRAME_HEAD - BLOSC_HEADER);
            // c-blosc stores a chunk memcpyed when its frame is no smaller than its bytes.
            match framed.and_then(|f| u32::try_from(f).ok()).filter(|&f| f < nbytes[k]) {
                None => memcpyed(k),
                Some(_) => Source::Device {
                    ptr: out_ptr + (k * done.slot) as u64,
                    len: size as usize,
                    head: Affix::of(&blosc.frame_head(shuffles[k], nbytes[k], size as u32)),
                    tail: Affix::default(),
                },
            }
        })
        .chain(done.host.iter().map(|f| Source::Host(f)))
        .collect();
    EncodedBatch::copy_out(ctx, stream, &sources)
}

/// How many of a batch's `n` chunks host threads encode (the last ones): the share the caller
/// set, else all of a small batch and none of a larger one. On the GPU host (16 cores) libzstd
/// level 3 encoded about 1.2 GiB/s of float32 on all threads, nvCOMP 2.3, and an even split ran
/// slower than nvCOMP alone (the host's share also competes with the stores for the cores).
pub(super) fn host_encoded(share: Option<f64>, n: usize) -> usize {
    match share {
        Some(share) => ((n as f64 * share).round() as usize).min(n),
        None if n < NVCOMP_ENCODE_FROM => n,
        None => 0,
    }
}

/// Batches of fewer chunks than this are encoded on host threads alone (unless a share is set):
/// nvCOMP's zstd took over 100 ms for a batch of 50 chunks of 1 MiB on the GPU host, host threads
/// about 60.
const NVCOMP_ENCODE_FROM: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs::blosc::encode::BloscCompressor;
    use crate::codecs::zlib::encode::ZlibWrite;

    /// Smooth float32 values with a little noise: compressible, not trivially.
    fn values(n: usize) -> Vec<u8> {
        (0..n).flat_map(|i| ((i as f32 * 0.01).sin() * 100.0 + (i % 7) as f32 * 0.125).to_le_bytes()).collect()
    }

    /// What the `blosc_shuffle` kernel writes (its index arithmetic on the host).
    fn shuffled(raw: &[u8], typesize: usize, shuffle: BloscShuffle) -> Vec<u8> {
        let n = raw.len() / typesize;
        let whole = n * typesize;
        (0..raw.len())
            .map(|q| match shuffle {
                BloscShuffle::Byte if q < whole => raw[(q % n) * typesize + q / n],
                BloscShuffle::Bit if q < whole => {
                    let row_len = n / 8;
                    let (r, at) = (q / row_len, q % row_len);
                    let (j, b) = (r / 8, r % 8);
                    (0..8).fold(0u8, |v, k| v | ((raw[(at * 8 + k) * typesize + j] >> b) & 1) << k)
                }
                _ => raw[q],
            })
            .collect()
    }

    fn c_blosc_decode(frame: &[u8], len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: c-blosc reads the frame (its header's sizes checked against the buffers) and
        // writes at most `out.len()` bytes.
        let n =
            unsafe { blosc_src::blosc_decompress_ctx(frame.as_ptr().cast(), out.as_mut_ptr().cast(), out.len(), 1) };
        assert_eq!(n, len as i32, "c-blosc decoded {n} bytes");
        out
    }

    #[test]
    fn blosc_frames_as_the_device_writes_them_decode_with_c_blosc() {
        for compressor in [BloscCompressor::Lz4, BloscCompressor::Zstd] {
            for shuffle in [BloscShuffle::None, BloscShuffle::Byte, BloscShuffle::Bit] {
                // 4-byte and 8-byte types, a multiple of 8 elements and not (bit shuffle then
                // drops its flag), a typesize that leaves bytes past the last element.
                for (typesize, len) in [(4u8, 1usize << 16), (8, 8 * 1000), (4, 4 * 1001), (3, 3001)] {
                    let blosc = BloscWrite { compressor, clevel: 5, shuffle, typesize };
                    let raw = values(len.div_ceil(4))[..len].to_vec();
                    let applied = blosc.shuffle_for(len as u64);
                    if shuffle == BloscShuffle::Bit && (len / usize::from(typesize)) % 8 != 0 {
                        assert_eq!(applied, BloscShuffle::None);
                    }
                    let stream = shuffled(&raw, usize::from(typesize), applied);
                    let compressed = match compressor {
                        BloscCompressor::Lz4 => lz4_flex::block::compress(&stream),
                        BloscCompressor::Zstd => zstd::bulk::compress(&stream, 3).unwrap(),
                    };
                    let head = blosc.frame_head(applied, len as u32, compressed.len() as u32);
                    let frame = [&head[..], &compressed].concat();
                    let what = format!("{compressor:?} {shuffle:?} typesize {typesize}, {len} bytes");
                    assert_eq!(c_blosc_decode(&frame, len), raw, "{what}");
                    // c-blosc's own idea of the frame's sizes.
                    let (mut nbytes, mut cbytes, mut blocksize) = (0usize, 0usize, 0usize);
                    // SAFETY: reads the 16-byte header of `frame`.
                    unsafe {
                        blosc_src::blosc_cbuffer_sizes(
                            frame.as_ptr().cast(),
                            &raw mut nbytes,
                            &raw mut cbytes,
                            &raw mut blocksize,
                        );
                    }
                    assert_eq!((nbytes, cbytes, blocksize), (len, frame.len(), len), "{what}");
                    // The same chunk memcpyed.
                    let memcpyed = [&blosc.header(BLOSC_MEMCPYED, len as u32, len as u32 + 16)[..], &raw].concat();
                    assert_eq!(c_blosc_decode(&memcpyed, len), raw, "{what}, memcpyed");
                    // And the host encoder (c-blosc itself) for the host's share.
                    let host = WriteCodec::Blosc(blosc).encode_host(&raw).unwrap();
                    assert_eq!(c_blosc_decode(&host, len), raw, "{what}, c-blosc's encoding");
                }
            }
        }
    }

    #[test]
    fn zlib_frames_around_raw_deflate_decode_with_zlib() {
        use std::io::{Read, Write};
        let raw = values(50_000);
        for level in [1, 6, 9] {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(level));
            e.write_all(&raw).unwrap();
            let deflate = e.finish().unwrap();
            let adler = adler2::adler32_slice(&raw);
            let frame = [&ZlibWrite { level }.header()[..], &deflate, &adler.to_be_bytes()].concat();
            let mut back = Vec::new();
            flate2::read::ZlibDecoder::new(&frame[..]).read_to_end(&mut back).unwrap();
            assert!(back == raw, "level {level}");
        }
    }

    /// The gather kernel on the host: each job's elements in C order of its extent.
    fn gather_on_host(jobs: &[place::Gather], src: &[u8], out: &mut [u8]) {
        for g in jobs {
            let count: u64 = g.extent.iter().product();
            for i in 0..count {
                let (mut rest, mut s, mut d) = (i, g.src, g.dst);
                for k in (0..g.extent.len()).rev() {
                    let x = rest % g.extent[k];
                    rest /= g.extent[k];
                    s += x * g.src_stride[k];
                    d += x * g.dst_stride[k];
                }
                let (s, d, e) = (s as usize, d as usize, g.elem as usize);
                let element = &src[s..s + e];
                let to = &mut out[d..d + e];
                if g.swap > 1 {
                    let w = g.swap as usize;
                    for (t, f) in to.chunks_exact_mut(w).zip(element.chunks_exact(w)) {
                        t.iter_mut().zip(f.iter().rev()).for_each(|(t, f)| *t = *f);
                    }
                } else {
                    to.copy_from_slice(element);
                }
            }
        }
    }

    #[test]
    fn layout_jobs_lay_chunks_out_as_zarrs_stores_them() {
        use zarrs::array::codec::{BytesCodec, TransposeCodec, TransposeOrder};
        use zarrs::array::{data_type, ArrayBuilder, Endianness, FillValue};
        use zarrs_storage::ReadableStorageTraits;
        let shape = [6u64, 5, 4];
        let chunk: Vec<f32> = (0..120).map(|i| i as f32 * 1.5 + 0.25).collect();
        let native: Vec<u8> = bytemuck::cast_slice(&chunk).to_vec();
        let other = if cfg!(target_endian = "little") { Endianness::Big } else { Endianness::Little };
        for (order, big) in [(Some(vec![2usize, 0, 1]), false), (None, true), (Some(vec![1, 2, 0]), true)] {
            let store = Arc::new(zarrs::storage::store::MemoryStore::new());
            let mut builder =
                ArrayBuilder::new(shape.to_vec(), shape.to_vec(), data_type::float32(), FillValue::from(0.0f32));
            if let Some(order) = &order {
                builder.array_to_array_codecs(vec![Arc::new(TransposeCodec::new(TransposeOrder::new(order).unwrap()))]);
            }
            if big {
                builder.array_to_bytes_codec(Arc::new(BytesCodec::new(Some(other))));
            }
            let array = builder.build(store.clone(), "/a").unwrap();
            array.store_chunk(&[0, 0, 0], chunk.clone()).unwrap();
            let stored = store.get(&array.chunk_key(&[0, 0, 0])).unwrap().unwrap();
            let layout = Layout { transpose: order.clone(), swap: if big { 4 } else { 0 } };
            // Two slots: the chunk at offset 0 and again at 512 (the second slot is compared).
            let key = zarrs_storage::StoreKey::new("k").unwrap();
            let slots = Slots {
                offsets: vec![0, 512],
                lens: vec![480, 480],
                shapes: vec![&shape, &shape],
                keys: vec![&key, &key],
                elem: 4,
            };
            let mut src = vec![0u8; 1024];
            src[..480].copy_from_slice(&native);
            src[512..992].copy_from_slice(&native);
            let mut out = vec![0u8; 1024];
            gather_on_host(&layout_jobs(&layout, &slots, 0), &src, &mut out);
            assert_eq!(&out[512..992], &stored[..], "order {order:?}, big-endian {big}");
            assert_eq!(&out[..480], &stored[..], "order {order:?}, big-endian {big}");
        }
    }

    #[test]
    fn zlib_headers_pass_their_check_and_name_the_level() {
        for level in 1..=9 {
            let [cmf, flg] = ZlibWrite { level }.header();
            assert_eq!((u16::from(cmf) << 8 | u16::from(flg)) % 31, 0, "level {level}");
            assert_eq!(cmf, 0x78);
            assert_eq!(flg & 0x20, 0, "no preset dictionary");
        }
        assert_eq!(ZlibWrite { level: 1 }.header(), [0x78, 0x01]);
        assert_eq!(ZlibWrite { level: 6 }.header(), [0x78, 0x9C]);
        assert_eq!(ZlibWrite { level: 9 }.header(), [0x78, 0xDA]);
    }
}
