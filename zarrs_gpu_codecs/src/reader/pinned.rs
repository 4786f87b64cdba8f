//! Page-locked (pinned) host memory: what the device reads into and copies out of at the bus's
//! rate. Buffers of 16 MiB and more are anonymous memory in transparent huge pages registered
//! with `cuMemHostRegister` (the driver then locks and maps 512 times fewer pages), smaller ones
//! (and all, with `ZARRS_GPU_PINNED_PAGES=alloc`, or where the system refuses huge pages) are
//! made by `cuMemHostAlloc`. Pinning is slow either way, which is why the pools keep buffers
//! between reads and a process's first read pays it: on an H100 host 1.19 GB took 0.64 s by
//! `cuMemHostAlloc` and 0.26 s in huge pages (`cold_read --pin`), and a fresh process's warm
//! read of 8 GiB (Z2) fell from 2.10 to 1.16 s (`benches/pinning.sh`).

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext};

use super::DeviceReadError;
use crate::env::{self, EnvError, PINNED_PAGES};

/// A transparent huge page on x86-64 and aarch64 kernels of 4 KiB pages: registered memory
/// starts and ends on this boundary so that every page of it may be a huge one (elsewhere the
/// kernel gives small pages, which still pin).
const HUGE_PAGE: usize = 2 << 20;

/// Buffers smaller than this are made by `cuMemHostAlloc` even where huge pages are asked for:
/// rounded up to whole huge pages they would waste more than an eighth (the upload and result
/// buffers are kilobytes; a batch's stored bytes are hundreds of megabytes).
const HUGE_FROM: usize = 8 * HUGE_PAGE;

/// How pinned memory is made ([`PINNED_PAGES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pages {
    Alloc,
    /// Huge pages where the system gives them; `asked`: set so, when a refusal is said.
    Huge {
        asked: bool,
    },
}

/// [`PINNED_PAGES`] as set, read once: the way, or the value that cannot be used.
fn pages() -> Result<Pages, DeviceReadError> {
    static PAGES: OnceLock<Result<Pages, EnvError>> = OnceLock::new();
    let parsed = PAGES.get_or_init(|| {
        Ok(match env::pinned_alloc()? {
            Some(true) => Pages::Alloc,
            Some(false) => Pages::Huge { asked: true },
            None => Pages::Huge { asked: false },
        })
    });
    Ok(parsed.clone()?)
}

/// Where a buffer's memory came from, to give it back the same way.
#[derive(Debug)]
enum Origin {
    /// `cuMemHostAlloc`.
    Driver,
    /// An anonymous mapping of `map_len` bytes, registered with the driver.
    Registered { map_len: usize },
}

/// Page-locked host memory, allocated once and reused.
pub struct PinnedBuffer {
    ptr: *mut u8,
    len: usize,
    origin: Origin,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer is plain host memory owned by this value; access is through &/&mut self.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocate at least `len` bytes of pinned host memory (cacheable, so the CPU may also read
    /// it fast), as [`PINNED_PAGES`] says: buffers of 16 MiB and more in huge pages, whole
    /// huge pages long (unless `alloc` is set); where the system refuses (a mapping or a
    /// registration), the buffer is made by `cuMemHostAlloc`, and where `huge` was set, the
    /// first such refusal is said on stderr.
    ///
    /// # Errors
    /// Returns the driver's error when the allocation fails, or [`DeviceReadError::Config`] for
    /// a value of [`PINNED_PAGES`] that cannot be used.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DeviceReadError> {
        if let (Pages::Huge { asked }, true) = (pages()?, len >= HUGE_FROM) {
            match Self::with_pages(ctx, len, true) {
                Ok(buffer) => return Ok(buffer),
                Err(refused) if asked => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        eprintln!("zarrs_gpu: {}=huge: {refused}; using cuMemHostAlloc", PINNED_PAGES.name);
                    });
                }
                // The default: a system without huge pages pins as the driver does.
                Err(_) => {}
            }
        }
        Self::with_pages(ctx, len, false)
    }

    /// `len` bytes of pinned host memory by `cuMemHostAlloc` (`huge` false), or at least `len`
    /// in transparent huge pages, registered (`huge` true; an error where the system refuses).
    /// For benchmarks of the two ways ([`PinnedBuffer::new`] chooses by [`PINNED_PAGES`]).
    ///
    /// # Errors
    /// Returns the driver's or the system's error when the allocation fails.
    #[doc(hidden)]
    pub fn with_pages(ctx: &Arc<CudaContext>, len: usize, huge: bool) -> Result<Self, DeviceReadError> {
        ctx.bind_to_thread().map_err(DeviceReadError::cuda("binding the CUDA context"))?;
        if huge {
            let (ptr, map_len) = huge_registered(len)?;
            // The whole mapping is pinned: all of it is the buffer's (pools count its capacity).
            return Ok(Self { ptr, len: map_len, origin: Origin::Registered { map_len }, ctx: ctx.clone() });
        }
        // SAFETY: a plain allocation; the memory is owned by the returned value and freed on drop.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }
            .map_err(DeviceReadError::cuda("allocating pinned host memory"))?;
        Ok(Self { ptr: ptr.cast(), len, origin: Origin::Driver, ctx: ctx.clone() })
    }

    /// The buffer's bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for as long as self lives; every byte is a valid u8
        // (cuMemHostAlloc's memory holds what it held, an anonymous mapping's reads as zeros).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The buffer's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The buffer's length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the memory came from the call its origin names and is given back once; copies
        // from it were synchronized by their owners before the buffer is dropped.
        unsafe {
            match self.origin {
                Origin::Driver => {
                    let _ = result::free_host(self.ptr.cast::<c_void>());
                }
                Origin::Registered { map_len } => {
                    let _ = sys::cuMemHostUnregister(self.ptr.cast::<c_void>());
                    libc::munmap(self.ptr.cast::<c_void>(), map_len);
                }
            }
        }
    }
}

/// At least `len` bytes (whole huge pages) of anonymous memory on a huge-page boundary, advised
/// to transparent huge pages, kept out of forked children (as the driver's own pinned memory is),
/// and registered with the current context (portable, as `cuMemHostAlloc`'s memory is where
/// addressing is unified): its address and mapped length, or what refused it (then nothing is
/// left mapped).
fn huge_registered(len: usize) -> Result<(*mut u8, usize), DeviceReadError> {
    let too_large = || DeviceReadError::HostMemory { bytes: len, source: std::io::ErrorKind::OutOfMemory.into() };
    let map_len = len.max(1).checked_next_multiple_of(HUGE_PAGE).ok_or_else(too_large)?;
    let span = map_len.checked_add(HUGE_PAGE).ok_or_else(too_large)?;
    // SAFETY: a new private anonymous mapping; every part of it is unmapped below or on drop.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(DeviceReadError::HostMemory { bytes: span, source: std::io::Error::last_os_error() });
    }
    // The mapping is a huge page longer than needed: keep its aligned part, unmap the rest (the
    // head may be empty; the tail is then a whole huge page).
    let head = (base as usize).next_multiple_of(HUGE_PAGE) - base as usize;
    let ptr = base.cast::<u8>().wrapping_add(head);
    // SAFETY: head and tail lie inside the mapping just made, outside the part kept; the part
    // kept is unmapped here if the driver refuses it, else on drop.
    unsafe {
        if head > 0 {
            libc::munmap(base, head);
        }
        libc::munmap(ptr.wrapping_add(map_len).cast::<c_void>(), span - head - map_len);
        // Advice only: a kernel without transparent huge pages still gives (small) pages.
        libc::madvise(ptr.cast::<c_void>(), map_len, libc::MADV_HUGEPAGE);
        libc::madvise(ptr.cast::<c_void>(), map_len, libc::MADV_DONTFORK);
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if let Err(e) = sys::cuMemHostRegister_v2(ptr.cast::<c_void>(), map_len, flags).result() {
            libc::munmap(ptr.cast::<c_void>(), map_len);
            return Err(DeviceReadError::Cuda { what: "registering huge pages as pinned memory", source: e });
        }
    }
    Ok((ptr, map_len))
}
