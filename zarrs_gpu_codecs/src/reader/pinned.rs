//! Page-locked (pinned) host memory: what the device reads into and copies out of at the bus's
//! rate. Made by `cuMemHostAlloc`, or, where `ZARRS_GPU_PINNED_PAGES=huge`, as anonymous memory
//! in transparent huge pages registered with `cuMemHostRegister`: the driver then locks and maps
//! 512 times fewer pages. Pinning is slow either way (1.19 GB took 0.56 s with `cuMemHostAlloc`
//! on the GPU host), which is why the pools keep buffers between reads and a process's first
//! read pays it; `cold_read --pin` measures both ways.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext};

use super::DeviceReadError;

/// The environment variable that says how pinned host memory is made: `alloc`
/// (`cuMemHostAlloc`, the default) or `huge` (transparent huge pages, registered).
pub const PINNED_PAGES_ENV: &str = "ZARRS_GPU_PINNED_PAGES";

/// A transparent huge page on x86-64 and the usual aarch64 kernels: registered memory starts
/// and ends on this boundary so that every page of it may be a huge one.
const HUGE_PAGE: usize = 2 << 20;

/// How pinned memory is made ([`PINNED_PAGES_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pages {
    Alloc,
    Huge,
}

/// [`PINNED_PAGES_ENV`] as set, read once: the way, or the value that cannot be used.
fn pages() -> Result<Pages, DeviceReadError> {
    static PAGES: OnceLock<Result<Pages, String>> = OnceLock::new();
    let parsed = PAGES.get_or_init(|| parse_pages(std::env::var(PINNED_PAGES_ENV).ok().as_deref()));
    parsed.clone().map_err(|value| DeviceReadError::Config {
        variable: PINNED_PAGES_ENV,
        value,
        expected: "alloc or huge",
    })
}

fn parse_pages(value: Option<&str>) -> Result<Pages, String> {
    match value.map(str::trim) {
        None | Some("" | "alloc") => Ok(Pages::Alloc),
        Some("huge") => Ok(Pages::Huge),
        Some(other) => Err(other.to_string()),
    }
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
    /// Allocate `len` bytes of pinned host memory (cacheable, so the CPU may also read it fast),
    /// as [`PINNED_PAGES_ENV`] says. Huge pages that cannot be had (a mapping or registration the
    /// system refuses) fall back to `cuMemHostAlloc`.
    ///
    /// # Errors
    /// Returns the driver's error when the allocation fails, or [`DeviceReadError::Config`] for
    /// a value of [`PINNED_PAGES_ENV`] that cannot be used.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DeviceReadError> {
        ctx.bind_to_thread().map_err(DeviceReadError::cuda("binding the CUDA context"))?;
        if pages()? == Pages::Huge {
            if let Some((ptr, map_len)) = huge_registered(len) {
                return Ok(Self { ptr, len, origin: Origin::Registered { map_len }, ctx: ctx.clone() });
            }
        }
        // SAFETY: a plain allocation; the memory is owned by the returned value and freed on drop.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }
            .map_err(DeviceReadError::cuda("allocating pinned host memory"))?;
        Ok(Self { ptr: ptr.cast(), len, origin: Origin::Driver, ctx: ctx.clone() })
    }

    /// The buffer's bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for as long as self lives; neither allocation
        // initializes them in a way Rust knows of, but every byte is a valid u8.
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

/// `len` bytes (whole huge pages) of anonymous memory on a huge-page boundary, advised to
/// transparent huge pages, kept out of forked children (as the driver's own pinned memory is),
/// and registered with the current context: its address and mapped length, or None where the
/// system refuses any step (then nothing is left mapped).
fn huge_registered(len: usize) -> Option<(*mut u8, usize)> {
    let map_len = len.max(1).checked_next_multiple_of(HUGE_PAGE)?;
    let span = map_len.checked_add(HUGE_PAGE)?;
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
        return None;
    }
    // The mapping is over-long by a huge page: keep the aligned part, unmap the rest.
    let head = (base as usize).next_multiple_of(HUGE_PAGE) - base as usize;
    let ptr = base.cast::<u8>().wrapping_add(head);
    // SAFETY: head and tail lie inside the mapping just made and outside the part kept.
    unsafe {
        if head > 0 {
            libc::munmap(base, head);
        }
        let tail = span - head - map_len;
        if tail > 0 {
            libc::munmap(ptr.wrapping_add(map_len).cast::<c_void>(), tail);
        }
        // Advice only: a kernel without transparent huge pages still gives (small) pages.
        libc::madvise(ptr.cast::<c_void>(), map_len, libc::MADV_HUGEPAGE);
        libc::madvise(ptr.cast::<c_void>(), map_len, libc::MADV_DONTFORK);
        if sys::cuMemHostRegister_v2(ptr.cast::<c_void>(), map_len, 0).result().is_err() {
            libc::munmap(ptr.cast::<c_void>(), map_len);
            return None;
        }
    }
    Some((ptr, map_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_pages_are_made_by_the_driver_unless_huge_ones_are_asked_for() {
        assert_eq!(parse_pages(None), Ok(Pages::Alloc));
        assert_eq!(parse_pages(Some("")), Ok(Pages::Alloc));
        assert_eq!(parse_pages(Some("alloc")), Ok(Pages::Alloc));
        assert_eq!(parse_pages(Some(" huge ")), Ok(Pages::Huge));
        assert_eq!(parse_pages(Some("2M")), Err("2M".to_string()));
    }
}
