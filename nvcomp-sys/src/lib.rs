//! Raw bindings to NVIDIA [nvCOMP](https://docs.nvidia.com/cuda/nvcomp/), loaded at run time.
//!
//! This crate finds and loads `libnvcomp.so.6` so that nothing links against nvCOMP at build
//! time: [`NvcompLibrary::get`] loads `NVCOMP_LIBRARY_PATH` when it is set, else the Python
//! packages' copy (`nvidia/libnvcomp/lib64`, as `pip install nvidia-libnvcomp-cu13` places it,
//! under the directories a program adds, `PYTHONPATH`, the usual package directories, and those of
//! the `python3` on `PATH`: see [`candidates`]), then tries the system loader. A missing library is
//! an error that lists what was tried, where, and how to install it. The function bindings
//! (generated with bindgen from the wheel's headers) come
//! with a thin checked layer: batched zstd, deflate, gzip and LZ4 decompression and compression,
//! CRC32 options.
//!
//! ```no_run
//! let nvcomp = nvcomp_sys::NvcompLibrary::get()?;
//! println!("nvCOMP {} from {}", nvcomp.version_string(), nvcomp.path());
//! let temp = nvcomp.decompress_temp_size(nvcomp_sys::Decompressor::Zstd, 4096, 1 << 20, 4 << 30)?;
//! println!("4096 zstd chunks of 1 MiB need {temp} bytes of scratch");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Licence
//! `nvcomp-sys` is licensed under either of the Apache License, Version 2.0 or the MIT license, at
//! your option. nvCOMP itself is NVIDIA's and is neither bundled nor redistributed.

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

#[allow(
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::pedantic
)]
pub mod sys {
    //! Raw nvCOMP 6 bindings (generated; see `scripts/generate-bindings.sh`).
    include!("bindings.rs");
}

mod compress;
pub use compress::{deflate_compress_opts, gzip_compress_opts, lz4_compress_opts, zstd_compress_opts, Compressor};

/// The nvCOMP major version these bindings are for.
pub const MAJOR_VERSION: u32 = 6;

/// The environment variable naming the nvCOMP library file to load first.
pub const LIBRARY_ENV: &str = "NVCOMP_LIBRARY_PATH";
/// The shared library's name (nvCOMP 6).
pub const SONAME: &str = "libnvcomp.so.6";
/// Where the PyPI wheel puts the library, relative to a Python package directory.
pub const WHEEL_DIR: &str = "nvidia/libnvcomp/lib64";

/// nvCOMP could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "nvCOMP ({SONAME}) could not be loaded; tried: {}{}. Install it with `pip install nvidia-libnvcomp-cu13` \
     or set {LIBRARY_ENV} to the library file",
    tried.join("; "),
    searched_text(searched)
)]
pub struct LoadError {
    /// Each candidate and why it failed (missing file, missing entry points, wrong version).
    pub tried: Vec<String>,
    /// The package directories where the wheel's library (`nvidia/libnvcomp/lib64`) was looked for.
    pub searched: Vec<PathBuf>,
}

fn searched_text(searched: &[PathBuf]) -> String {
    if searched.is_empty() {
        return String::new();
    }
    let dirs: Vec<_> = searched.iter().map(|d| d.display().to_string()).collect();
    format!("; looked for {WHEEL_DIR}/{SONAME} under: {}", dirs.join(", "))
}

/// An nvCOMP call returned a status other than success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nvCOMP {what} failed: {message} (status {status})")]
pub struct NvcompError {
    /// What was being done.
    pub what: &'static str,
    /// The status code.
    pub status: sys::nvcompStatus_t,
    /// nvCOMP's description of the status.
    pub message: String,
}

/// The loaded nvCOMP library: every entry point resolved, version checked.
pub struct NvcompLibrary {
    functions: sys::NvcompFunctions,
    path: String,
    version: u32,
    cudart_version: u32,
}

impl std::fmt::Debug for NvcompLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvcompLibrary")
            .field("path", &self.path)
            .field("version", &self.version_string())
            .finish_non_exhaustive()
    }
}

impl NvcompLibrary {
    /// The process's nvCOMP, loaded on first use from [`candidates`].
    ///
    /// # Errors
    /// Returns what was tried when no candidate loads.
    pub fn get() -> Result<&'static Self, LoadError> {
        static LIBRARY: OnceLock<Result<NvcompLibrary, LoadError>> = OnceLock::new();
        LIBRARY
            .get_or_init(|| {
                let (candidates, searched) = SearchPlaces::from_env().search(python3_package_dirs);
                Self::load_first(&candidates).map_err(|err| LoadError { searched, ..err })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Load the first of `candidates` (file paths, or bare names for the system loader) that loads.
    ///
    /// # Errors
    /// Returns each candidate with its error when none loads.
    pub fn load_first(candidates: &[String]) -> Result<Self, LoadError> {
        let mut tried = Vec::new();
        for candidate in candidates {
            match Self::load(candidate) {
                Ok(library) => return Ok(library),
                Err(err) => tried.push(format!("{candidate} ({err})")),
            }
        }
        Err(LoadError { tried, searched: Vec::new() })
    }

    fn load(path: &str) -> Result<Self, String> {
        // SAFETY: loading nvCOMP runs its initialisers, which have no preconditions; every entry
        // point is looked up with the signature bindgen read from nvCOMP's headers.
        let functions = unsafe { sys::NvcompFunctions::new(path) }.map_err(|e| e.to_string())?;
        let mut properties = sys::nvcompProperties_t { version: 0, cudart_version: 0 };
        // SAFETY: properties is a valid out-pointer.
        let status = unsafe { functions.nvcompGetProperties(&raw mut properties) };
        if status != sys::nvcompSuccess {
            return Err(format!("nvcompGetProperties returned status {status}"));
        }
        let library = Self {
            functions,
            path: path.to_string(),
            version: properties.version,
            cudart_version: properties.cudart_version,
        };
        if properties.version / 1000 != MAJOR_VERSION {
            return Err(format!("nvCOMP {} found, version {MAJOR_VERSION}.x needed", library.version_string()));
        }
        Ok(library)
    }

    /// The candidate that loaded.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The raw entry points.
    #[must_use]
    pub fn functions(&self) -> &sys::NvcompFunctions {
        &self.functions
    }

    /// The version, as nvCOMP encodes it (`major * 1000 + minor * 100 + patch`).
    #[must_use]
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The version as `major.minor.patch`.
    #[must_use]
    pub fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
    }

    /// The CUDA runtime version nvCOMP was built with (`major * 1000 + minor * 10`).
    #[must_use]
    pub fn cudart_version(&self) -> u32 {
        self.cudart_version
    }

    /// nvCOMP's description of `status`.
    #[must_use]
    pub fn status_string(&self, status: sys::nvcompStatus_t) -> String {
        // SAFETY: nvcompGetStatusString returns a static C string (or null) for any value.
        let ptr = unsafe { self.functions.nvcompGetStatusString(status) };
        if ptr.is_null() {
            return format!("unknown status {status}");
        }
        // SAFETY: non-null pointers are NUL-terminated static strings.
        unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
    }

    /// `Ok` for success, else the status with its description.
    ///
    /// # Errors
    /// Returns the status as an [`NvcompError`] naming `what`.
    pub fn check(&self, what: &'static str, status: sys::nvcompStatus_t) -> Result<(), NvcompError> {
        if status == sys::nvcompSuccess {
            Ok(())
        } else {
            Err(NvcompError { what, status, message: self.status_string(status) })
        }
    }

    /// Buffer alignments `codec`'s batched decompression needs.
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails.
    pub fn decompress_alignments(
        &self,
        codec: Decompressor,
    ) -> Result<sys::nvcompAlignmentRequirements_t, NvcompError> {
        let mut out = sys::nvcompAlignmentRequirements_t { input: 0, output: 0, temp: 0 };
        let f = &self.functions;
        // SAFETY: options by value, out-pointer valid.
        let status = unsafe {
            match codec {
                Decompressor::Zstd => {
                    f.nvcompBatchedZstdDecompressGetRequiredAlignments(zstd_decompress_opts(), &raw mut out)
                }
                Decompressor::Deflate => {
                    f.nvcompBatchedDeflateDecompressGetRequiredAlignments(deflate_decompress_opts(), &raw mut out)
                }
                Decompressor::Lz4 => {
                    f.nvcompBatchedLZ4DecompressGetRequiredAlignments(lz4_decompress_opts(), &raw mut out)
                }
                Decompressor::Gzip { lookahead } => {
                    f.nvcompBatchedGzipDecompressGetRequiredAlignments(gzip_decompress_opts(lookahead), &raw mut out)
                }
            }
        };
        self.check("querying decompression alignments", status)?;
        Ok(out)
    }

    /// nvCOMP's kernel configuration for CRC32 of `num_chunks` chunks of at most `max_chunk_bytes`
    /// (asks the device's properties; enqueues no work).
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails.
    pub fn crc32_kernel_conf(
        &self,
        num_chunks: usize,
        max_chunk_bytes: usize,
    ) -> Result<sys::nvcompCRC32KernelConf_t, NvcompError> {
        let mut conf = sys::nvcompCRC32KernelConf_t {
            kernel_kind: sys::nvcompCRC32WarpKernel,
            bytes_per_read: 0,
            blocks_per_msg: 0,
            reserved: [0; 20],
        };
        // SAFETY: sizes passed directly (no device array, so no stream work); conf is a valid out-pointer.
        let status = unsafe {
            self.functions.nvcompBatchedCRC32GetHeuristicConf(
                std::ptr::null(),
                num_chunks,
                &raw mut conf,
                max_chunk_bytes.max(1),
                std::ptr::null_mut(),
            )
        };
        self.check("choosing a CRC32 kernel", status)?;
        Ok(conf)
    }

    /// Device temp bytes `codec`'s batched decompression of `num_chunks` chunks needs (no device
    /// work).
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails.
    pub fn decompress_temp_size(
        &self,
        codec: Decompressor,
        num_chunks: usize,
        max_chunk_bytes: usize,
        total_bytes: usize,
    ) -> Result<usize, NvcompError> {
        let mut temp = 0usize;
        let f = &self.functions;
        let null = std::ptr::null_mut();
        // SAFETY: plain values and a valid out-pointer; a null stream is allowed for this query,
        // which enqueues no work.
        let status = unsafe {
            match codec {
                Decompressor::Zstd => f.nvcompBatchedZstdDecompressGetTempSize(
                    num_chunks,
                    max_chunk_bytes,
                    zstd_decompress_opts(),
                    &raw mut temp,
                    total_bytes,
                    null,
                ),
                Decompressor::Deflate => f.nvcompBatchedDeflateDecompressGetTempSize(
                    num_chunks,
                    max_chunk_bytes,
                    deflate_decompress_opts(),
                    &raw mut temp,
                    total_bytes,
                    null,
                ),
                Decompressor::Lz4 => f.nvcompBatchedLZ4DecompressGetTempSize(
                    num_chunks,
                    max_chunk_bytes,
                    lz4_decompress_opts(),
                    &raw mut temp,
                    total_bytes,
                    null,
                ),
                Decompressor::Gzip { lookahead } => f.nvcompBatchedGzipDecompressGetTempSize(
                    num_chunks,
                    max_chunk_bytes,
                    gzip_decompress_opts(lookahead),
                    &raw mut temp,
                    total_bytes,
                    null,
                ),
            }
        };
        self.check("sizing decompression temp memory", status)?;
        Ok(temp)
    }

    /// Device temp bytes `codec`'s batched decompression of these `num_chunks` chunks needs,
    /// from the compressed data itself (nvCOMP's `GetTempSizeSync`: it reads the chunks on
    /// `stream` and waits for it). For zstd this is well under [`Self::decompress_temp_size`]'s
    /// bound, which assumes the worst chunk everywhere (H200, 4096 frames of 1 MiB: 1.36 against
    /// 3.05 times the decoded bytes).
    ///
    /// # Errors
    /// Returns nvCOMP's status when the query fails.
    ///
    /// # Safety
    /// `inputs` and `input_sizes` are device arrays of `num_chunks` entries describing device
    /// memory that holds the chunks (ordered on `stream`), `statuses` a device array of
    /// `num_chunks` statuses; the chunks must have passed the host checks that make them safe for
    /// the decoder (nvCOMP's behaviour on malformed input is not defined).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decompress_temp_size_of(
        &self,
        codec: Decompressor,
        inputs: *const *const c_void,
        input_sizes: *const usize,
        num_chunks: usize,
        max_chunk_bytes: usize,
        total_bytes: usize,
        statuses: *mut sys::nvcompStatus_t,
        stream: sys::cudaStream_t,
    ) -> Result<usize, NvcompError> {
        let mut temp = 0usize;
        let f = &self.functions;
        // The functions take the same arguments but for their options.
        macro_rules! query {
            ($function:ident, $opts:expr) => {
                f.$function(
                    inputs,
                    input_sizes,
                    num_chunks,
                    max_chunk_bytes,
                    &raw mut temp,
                    total_bytes,
                    $opts,
                    statuses,
                    stream,
                )
            };
        }
        // SAFETY: the caller's contract; a valid out-pointer.
        let status = unsafe {
            match codec {
                Decompressor::Zstd => query!(nvcompBatchedZstdDecompressGetTempSizeSync, zstd_decompress_opts()),
                Decompressor::Deflate => {
                    query!(nvcompBatchedDeflateDecompressGetTempSizeSync, deflate_decompress_opts())
                }
                Decompressor::Lz4 => query!(nvcompBatchedLZ4DecompressGetTempSizeSync, lz4_decompress_opts()),
                Decompressor::Gzip { lookahead } => {
                    query!(nvcompBatchedGzipDecompressGetTempSizeSync, gzip_decompress_opts(lookahead))
                }
            }
        };
        self.check("sizing decompression temp memory from the data", status)?;
        Ok(temp)
    }

    /// Enqueue `codec`'s batched decompression of `num_chunks` chunks on `stream`.
    ///
    /// # Errors
    /// Returns nvCOMP's status when the launch fails (per-chunk results are in `statuses` and
    /// `actual_sizes` once the stream gets there).
    ///
    /// # Safety
    /// Every pointer is device memory: `inputs`, `input_sizes`, `output_sizes`, `actual_sizes`,
    /// `outputs` and `statuses` arrays of `num_chunks` entries, each input and output as long as
    /// its size says; `temp` of `temp_bytes` as [`Self::decompress_temp_size`] asks; alignments as
    /// [`Self::decompress_alignments`] says. All must stay valid until the stream has run the
    /// work. nvCOMP's behaviour on malformed input is not defined: check it first.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decompress_async(
        &self,
        codec: Decompressor,
        inputs: *const *const c_void,
        input_sizes: *const usize,
        output_sizes: *const usize,
        actual_sizes: *mut usize,
        num_chunks: usize,
        temp: *mut c_void,
        temp_bytes: usize,
        outputs: *const *mut c_void,
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
                    output_sizes,
                    actual_sizes,
                    num_chunks,
                    temp,
                    temp_bytes,
                    outputs,
                    $opts,
                    statuses,
                    stream,
                )
            };
        }
        // SAFETY: the caller's contract.
        let status = unsafe {
            match codec {
                Decompressor::Zstd => launch!(nvcompBatchedZstdDecompressAsync, zstd_decompress_opts()),
                Decompressor::Deflate => launch!(nvcompBatchedDeflateDecompressAsync, deflate_decompress_opts()),
                Decompressor::Lz4 => launch!(nvcompBatchedLZ4DecompressAsync, lz4_decompress_opts()),
                Decompressor::Gzip { lookahead } => {
                    launch!(nvcompBatchedGzipDecompressAsync, gzip_decompress_opts(lookahead))
                }
            }
        };
        self.check(codec.launching(), status)
    }

    /// Enqueue `variant` CRC-32s of `num_chunks` chunks of at most `max_chunk_bytes` on `stream`
    /// (the kernel chosen by [`Self::crc32_kernel_conf`]).
    ///
    /// # Errors
    /// Returns nvCOMP's status when choosing the kernel or the launch fails (per-chunk results are
    /// in `statuses` once the stream gets there).
    ///
    /// # Safety
    /// `inputs` and `sizes` are device arrays of `num_chunks` pointers and sizes describing device
    /// memory, `values` and `statuses` device arrays of `num_chunks` u32 each; all valid until the
    /// stream has run the work.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn crc32_async(
        &self,
        variant: Crc32,
        inputs: *const *const c_void,
        sizes: *const usize,
        num_chunks: usize,
        max_chunk_bytes: usize,
        values: *mut u32,
        statuses: *mut sys::nvcompStatus_t,
        stream: sys::cudaStream_t,
    ) -> Result<(), NvcompError> {
        let conf = self.crc32_kernel_conf(num_chunks, max_chunk_bytes)?;
        // SAFETY: the caller's contract.
        let status = unsafe {
            self.functions.nvcompBatchedCRC32Async(
                inputs,
                sizes,
                num_chunks,
                values,
                crc32_opts(variant, conf),
                sys::nvcompCRC32OnlySegment,
                statuses,
                stream,
            )
        };
        self.check("computing CRC-32 checksums", status)
    }
}

/// A batched decompressor of nvCOMP's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decompressor {
    /// Zstandard frames (RFC 8878).
    Zstd,
    /// Raw DEFLATE streams (RFC 1951): the payload of a gzip member or a zlib stream.
    Deflate,
    /// Raw LZ4 blocks (no frame): what Blosc's lz4 and lz4hc streams are.
    Lz4,
    /// gzip members (RFC 1952), header included. `lookahead` picks nvCOMP's look-ahead
    /// algorithm, which wants 4-byte aligned input; the naive one takes any alignment.
    Gzip {
        /// nvCOMP's look-ahead algorithm rather than the naive one.
        lookahead: bool,
    },
}

impl Decompressor {
    fn launching(self) -> &'static str {
        match self {
            Self::Zstd => "launching zstd decompression",
            Self::Deflate => "launching deflate decompression",
            Self::Lz4 => "launching LZ4 decompression",
            Self::Gzip { .. } => "launching gzip decompression",
        }
    }
}

/// Zstd decompression options: the default backend (the hardware engine does not take zstd on
/// Hopper), reserved bytes zeroed as nvCOMP requires.
#[must_use]
pub fn zstd_decompress_opts() -> sys::nvcompBatchedZstdDecompressOpts_t {
    sys::nvcompBatchedZstdDecompressOpts_t { backend: sys::NVCOMP_DECOMPRESS_BACKEND_DEFAULT, reserved: [0; 60] }
}

/// Deflate decompression options: the default backend, reserved bytes zeroed.
#[must_use]
pub fn deflate_decompress_opts() -> sys::nvcompBatchedDeflateDecompressOpts_t {
    sys::nvcompBatchedDeflateDecompressOpts_t {
        backend: sys::NVCOMP_DECOMPRESS_BACKEND_DEFAULT,
        sort_before_hw_decompress: 0,
        reserved: [0; 56],
    }
}

/// LZ4 decompression options: the default backend, bytes (no bitshuffle), reserved bytes zeroed.
#[must_use]
pub fn lz4_decompress_opts() -> sys::nvcompBatchedLZ4DecompressOpts_t {
    sys::nvcompBatchedLZ4DecompressOpts_t {
        backend: sys::NVCOMP_DECOMPRESS_BACKEND_DEFAULT,
        sort_before_hw_decompress: 0,
        data_type: sys::NVCOMP_TYPE_CHAR,
        bitshuffle_mode: sys::NVCOMP_BITSHUFFLE_NONE,
        reserved: [0; 48],
    }
}

/// gzip decompression options: the default backend, the naive or the look-ahead algorithm.
#[must_use]
pub fn gzip_decompress_opts(lookahead: bool) -> sys::nvcompBatchedGzipDecompressOpts_t {
    sys::nvcompBatchedGzipDecompressOpts_t {
        backend: sys::NVCOMP_DECOMPRESS_BACKEND_DEFAULT,
        algorithm: if lookahead {
            sys::NVCOMP_GZIP_DECOMPRESS_ALGORITHM_LOOKAHEAD
        } else {
            sys::NVCOMP_GZIP_DECOMPRESS_ALGORITHM_NAIVE
        },
        sort_before_hw_decompress: 0,
        reserved: [0; 52],
    }
}

/// The CRC-32 variants Zarr's codecs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Crc32 {
    /// CRC-32C (Castagnoli): the `crc32c` codec.
    Castagnoli,
    /// CRC-32 of ISO-HDLC (zlib's `crc32`): the trailer of a gzip member.
    IsoHdlc,
}

/// CRC32 options for `variant` with a kernel configuration from
/// [`NvcompLibrary::crc32_kernel_conf`].
#[must_use]
pub fn crc32_opts(variant: Crc32, kernel_conf: sys::nvcompCRC32KernelConf_t) -> sys::nvcompBatchedCRC32Opts_t {
    let poly = match variant {
        Crc32::Castagnoli => 0x1EDC_6F41,
        Crc32::IsoHdlc => 0x04C1_1DB7,
    };
    sys::nvcompBatchedCRC32Opts_t {
        spec: sys::nvcompCRC32Spec_t {
            poly,
            init: 0xFFFF_FFFF,
            ref_in: true,
            ref_out: true,
            xorout: 0xFFFF_FFFF,
            reserved: [0; 16],
        },
        kernel_conf,
        reserved: [0; 64],
    }
}

/// Package directories the program adds to the search ([`add_search_dirs`]).
static ADDED_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Look for the wheel's library under each of `dirs` (Python package directories: a Python
/// program passes its interpreter's `sys.path` and site directories) before the usual places.
/// Only a search that has not run yet sees them: call it before nvCOMP is first used. Relative
/// directories are ignored.
pub fn add_search_dirs<I: IntoIterator<Item = PathBuf>>(dirs: I) {
    // Only absolute directories: `""` in `sys.path` (python -c, Jupyter) or a relative entry
    // would name a library in whatever directory is current when nvCOMP is first loaded.
    let dirs = dirs.into_iter().filter(|d| d.is_absolute());
    ADDED_DIRS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(dirs);
}

/// Where a search looks: the environment's places (tests give their own).
#[derive(Debug, Default)]
struct SearchPlaces {
    /// `NVCOMP_LIBRARY_PATH`: when set, the only candidate.
    library: Option<String>,
    /// Package directories searched first: those added by the program, then `PYTHONPATH`'s.
    roots: Vec<PathBuf>,
    /// Prefixes whose `lib*/python3*/{site,dist}-packages` are searched next.
    prefixes: Vec<PathBuf>,
}

impl SearchPlaces {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let mut roots = ADDED_DIRS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        roots.extend(var("PYTHONPATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default());
        let prefixes = ["VIRTUAL_ENV", "CONDA_PREFIX"]
            .iter()
            .filter_map(|v| var(v).map(PathBuf::from))
            .chain(var("HOME").map(|home| Path::new(&home).join(".local")))
            .chain(["/usr/local", "/usr"].map(PathBuf::from))
            .collect();
        Self { library: std::env::var(LIBRARY_ENV).ok().filter(|p| !p.is_empty()), roots, prefixes }
    }

    /// The package directories to look in, in order.
    fn package_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = self.roots.clone();
        for prefix in &self.prefixes {
            dirs.extend(package_dirs(prefix));
        }
        dirs
    }

    /// The candidates, in order, and the package directories looked in. `ask_python` gives
    /// more package directories; it is asked only when no other has the library.
    fn search(&self, ask_python: impl FnOnce() -> Vec<PathBuf>) -> (Vec<String>, Vec<PathBuf>) {
        if let Some(library) = &self.library {
            // The file the user named, and no other: a wrong path is an error, not a surprise.
            return (vec![library.clone()], Vec::new());
        }
        let mut dirs = self.package_dirs();
        let mut out = wheel_candidates(&dirs);
        if out.is_empty() {
            let more = ask_python();
            out.extend(wheel_candidates(&more));
            dirs.extend(more);
        }
        out.push(SONAME.to_string());
        let mut seen = std::collections::HashSet::new();
        out.retain(|c| seen.insert(c.clone()));
        let mut seen = std::collections::HashSet::new();
        dirs.retain(|d| seen.insert(d.clone()));
        (out, dirs)
    }
}

/// Where to look for nvCOMP, in order: `NVCOMP_LIBRARY_PATH` alone when it is set; else the
/// wheel's directory under the package directories a program added ([`add_search_dirs`]), each
/// entry of `PYTHONPATH`, and the usual Python package directories (of `VIRTUAL_ENV`,
/// `CONDA_PREFIX`, the user's `~/.local`, `/usr/local` and `/usr`); where none has it, those of
/// the `python3` on `PATH` (asked, within 2 s); then [`SONAME`] for the system loader
/// (`LD_LIBRARY_PATH`, the ld cache).
#[must_use]
pub fn candidates() -> Vec<String> {
    SearchPlaces::from_env().search(python3_package_dirs).0
}

/// The package directories of the `python3` on `PATH` (`sys.path`, site and user site), asked
/// within 2 s; none when it is missing, slow or fails.
fn python3_package_dirs() -> Vec<PathBuf> {
    use std::process::{Command, Stdio};
    let script =
        "import site, sys\nfor p in [*sys.path, *site.getsitepackages(), site.getusersitepackages()]: print(p)";
    let Ok(mut child) = Command::new("python3")
        .args(["-I", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return Vec::new();
    };
    // Its output is read on a thread of its own: a process the child leaves behind could keep
    // the pipe open, and a read here would then never end. At most 64 KiB.
    let (sent, received) = std::sync::mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut std::io::Read::take(out, 64 << 10), &mut text);
            let _ = sent.send(text);
        });
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Vec::new();
            }
        }
    }
    let text = received.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())).unwrap_or_default();
    text.lines().filter(|l| !l.is_empty()).map(PathBuf::from).filter(|p| p.is_dir()).collect()
}

/// The Python package directories under `prefix`: `lib*/python3.*/{site,dist}-packages` (lib64
/// on Fedora) and Debian's `lib/python3/dist-packages`.
fn package_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["lib", "lib64"]
        .iter()
        .flat_map(|lib| std::fs::read_dir(prefix.join(lib)).into_iter().flatten())
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .flat_map(|e| ["site-packages", "dist-packages"].map(|d| e.path().join(d)))
        .filter(|d| d.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// The wheel's library file under each of `roots` that has one.
#[must_use]
pub fn wheel_candidates(roots: &[PathBuf]) -> Vec<String> {
    roots
        .iter()
        .map(|root| root.join(WHEEL_DIR).join(SONAME))
        .filter(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

#[cfg(test)]
mod tests;
