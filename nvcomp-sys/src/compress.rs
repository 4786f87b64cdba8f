//! nvCOMP's batched compression, the checked layer: zstd, DEFLATE, gzip and LZ4, as their
//! decompression is.

use std::ffi::c_void;

use crate::{sys, NvcompError, NvcompLibrary};

/// A batched compressor of nvCOMP's. Its output is the standard format: a Zstandard frame, a raw
/// DEFLATE stream, a gzip member, a raw LZ4 block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compressor {
    /// Zstandard frames (RFC 8878). nvCOMP 6 has no level to choose.
    Zstd,
    /// Raw DEFLATE streams (RFC 1951). `algorithm` is nvCOMP's option of that name: 0 its fastest,
    /// higher numbers a better ratio for more time (see nvCOMP's documentation of
    /// `nvcompBatchedDeflateCompressOpts_t`).
    Deflate {
        /// nvCOMP's algorithm number.
        algorithm: i32,
    },
    /// gzip members (RFC 1952); `algorithm` as for [`Compressor::Deflate`].
    Gzip {
        /// nvCOMP's algorithm number.
        algorithm: i32,
    },
    /// Raw LZ4 blocks of bytes (no frame, no bit shuffle).
    Lz4,
}

/// Zstd compression options: nvCOMP's defaults (its reserved bytes zeroed).
#[must_use]
pub fn zstd_compress_opts() -> sys::nvcompBatchedZstdCompressOpts_t {
    sys::nvcompBatchedZstdCompressOpts_t { reserved: [0; 64] }
}

/// DEFLATE compression options with nvCOMP's `algorithm`.
#[must_use]
pub fn deflate_compress_opts(algorithm: i32) -> sys::nvcompBatchedDeflateCompressOpts_t {
    sys::nvcompBatchedDeflateCompressOpts_t { algorithm, reserved: [0; 60] }
}

/// gzip compression options with nvCOMP's `algorithm`.
#[must_use]
pub fn gzip_compress_opts(algorithm: i32) -> sys::nvcompBatchedGzipCompressOpts_t {
    sys::nvcompBatchedGzipCompressOpts_t { algorithm, reserved: [0; 60] }
}

/// LZ4 compression options: bytes, no bit shuffle.
#[must_use]
pub fn lz4_compress_opts() -> sys::nvcompBatchedLZ4CompressOpts_t {
    sys::nvcompBatchedLZ4CompressOpts_t {
        data_type: sys::NVCOMP_TYPE_CHAR,
        bitshuffle_mode: sys::NVCOMP_BITSHUFFLE_NONE,
        reserved: [0; 56],
    }
}

impl NvcompLibrary {
    /// Buffer alignments `codec`'s batched compression needs.
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails.
    pub fn compress_alignments(&self, codec: Compressor) -> Result<sys::nvcompAlignmentRequirements_t, NvcompError> {
        let mut out = sys::nvcompAlignmentRequirements_t { input: 0, output: 0, temp: 0 };
        let f = &self.functions;
        // SAFETY: options by value, out-pointer valid.
        let status = unsafe {
            match codec {
                Compressor::Zstd => {
                    f.nvcompBatchedZstdCompressGetRequiredAlignments(zstd_compress_opts(), &raw mut out)
                }
                Compressor::Deflate { algorithm } => {
                    f.nvcompBatchedDeflateCompressGetRequiredAlignments(deflate_compress_opts(algorithm), &raw mut out)
                }
                Compressor::Gzip { algorithm } => {
                    f.nvcompBatchedGzipCompressGetRequiredAlignments(gzip_compress_opts(algorithm), &raw mut out)
                }
                Compressor::Lz4 => f.nvcompBatchedLZ4CompressGetRequiredAlignments(lz4_compress_opts(), &raw mut out),
            }
        };
        self.check("querying compression alignments", status)?;
        Ok(out)
    }

    /// The most bytes `codec` may write for one chunk of `max_chunk_bytes` (each output buffer
    /// must hold that much).
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails (a chunk larger than the codec takes).
    pub fn compress_max_output_chunk_size(
        &self,
        codec: Compressor,
        max_chunk_bytes: usize,
    ) -> Result<usize, NvcompError> {
        let mut out = 0usize;
        let f = &self.functions;
        // SAFETY: plain values and a valid out-pointer.
        let status = unsafe {
            match codec {
                Compressor::Zstd => f.nvcompBatchedZstdCompressGetMaxOutputChunkSize(
                    max_chunk_bytes,
                    zstd_compress_opts(),
                    &raw mut out,
                ),
                Compressor::Deflate { algorithm } => f.nvcompBatchedDeflateCompressGetMaxOutputChunkSize(
                    max_chunk_bytes,
                    deflate_compress_opts(algorithm),
                    &raw mut out,
                ),
                Compressor::Gzip { algorithm } => f.nvcompBatchedGzipCompressGetMaxOutputChunkSize(
                    max_chunk_bytes,
                    gzip_compress_opts(algorithm),
                    &raw mut out,
                ),
                Compressor::Lz4 => {
                    f.nvcompBatchedLZ4CompressGetMaxOutputChunkSize(max_chunk_bytes, lz4_compress_opts(), &raw mut out)
                }
            }
        };
        self.check("sizing compressed chunks", status)?;
        Ok(out)
    }

    /// Device temp bytes `codec`'s batched compression of `num_chunks` chunks of at most
    /// `max_chunk_bytes`, `total_bytes` in all, needs (no device work).
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails.
    pub fn compress_temp_size(
        &self,
        codec: Compressor,
        num_chunks: usize,
        max_chunk_bytes: usize,
        total_bytes: usize,
    ) -> Result<usize, NvcompError> {
        let mut temp = 0usize;
        let f = &self.functions;
        let null = std::ptr::null_mut();
        // The functions take the same arguments but for their options.
        macro_rules! query {
            ($function:ident, $opts:expr) => {
                f.$function(num_chunks, max_chunk_bytes, $opts, &raw mut temp, total_bytes, null)
            };
        }
        // SAFETY: plain values and a valid out-pointer; a null stream is allowed for this query,
        // which enqueues no work.
        let status = unsafe {
            match codec {
                Compressor::Zstd => query!(nvcompBatchedZstdCompressGetTempSize, zstd_compress_opts()),
                Compressor::Deflate { algorithm } => {
                    query!(nvcompBatchedDeflateCompressGetTempSize, deflate_compress_opts(algorithm))
                }
                Compressor::Gzip { algorithm } => {
                    query!(nvcompBatchedGzipCompressGetTempSize, gzip_compress_opts(algorithm))
                }
                Compressor::Lz4 => query!(nvcompBatchedLZ4CompressGetTempSize, lz4_compress_opts()),
            }
        };
        self.check("sizing compression temp memory", status)?;
        Ok(temp)
    }

    /// Enqueue `codec`'s batched compression of `num_chunks` chunks on `stream`.
    ///
    /// # Errors
    /// Returns nvCOMP's status when the launch fails (per-chunk results are in `statuses` and
    /// `output_sizes` once the stream gets there).
    ///
    /// # Safety
    /// Every pointer is device memory: `inputs`, `input_sizes`, `outputs`, `output_sizes` and
    /// `statuses` arrays of `num_chunks` entries; each input as long as its size, at most
    /// `max_chunk_bytes`; each output [`Self::compress_max_output_chunk_size`] bytes for
    /// `max_chunk_bytes`; `temp` of `temp_bytes` as [`Self::compress_temp_size`] asks; alignments
    /// as [`Self::compress_alignments`] says. All must stay valid until the stream has run the
    /// work.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compress_async(
        &self,
        codec: Compressor,
        inputs: *const *const c_void,
        input_sizes: *const usize,
        max_chunk_bytes: usize,
        num_chunks: usize,
        temp: *mut c_void,
        temp_bytes: usize,
        outputs: *const *mut c_void,
        output_sizes: *mut usize,
        statuses: *mut sys::nvcompStatus_t,
        stream: sys::cudaStream_t,
    ) -> Result<(), NvcompError> {
        let f = &self.functions;
        // The functions take the same arguments but for their options.
        macro_rules! launch {
            ($function:ident, $opts:expr) => {
                f.$function(
                    inputs,
                    input_sizes,
                    max_chunk_bytes,
                    num_chunks,
                    temp,
                    temp_bytes,
                    outputs,
                    output_sizes,
                    $opts,
                    statuses,
                    stream,
                )
            };
        }
        // SAFETY: the caller's contract.
        let status = unsafe {
            match codec {
                Compressor::Zstd => launch!(nvcompBatchedZstdCompressAsync, zstd_compress_opts()),
                Compressor::Deflate { algorithm } => {
                    launch!(nvcompBatchedDeflateCompressAsync, deflate_compress_opts(algorithm))
                }
                Compressor::Gzip { algorithm } => {
                    launch!(nvcompBatchedGzipCompressAsync, gzip_compress_opts(algorithm))
                }
                Compressor::Lz4 => launch!(nvcompBatchedLZ4CompressAsync, lz4_compress_opts()),
            }
        };
        self.check("launching compression", status)
    }
}
