//! Cold reads of every file under a directory into host memory, by several readers, each after
//! the page cache is dropped (root: `/proc/sys/vm/drop_caches`): the disk's ceiling and what each
//! way of reading gets of it. No GPU needed. One JSON row per reader, thread count and repetition.
//!
//! Readers: `pread` (each file opened and read whole by one of T threads), `willneed` (every
//! file opened and `posix_fadvise(WILLNEED)` first, from T threads, then read as `pread`: the
//! kernel's read-ahead queues the whole set at once), `direct` (`O_DIRECT`, 4 KiB-aligned reads
//! of whole files into aligned buffers: no page cache), `phased` (every file's size, then every
//! file opened, then every file read, each phase on T threads: what the store does in a batch),
//! `wideopen` (as `phased`, the sizes and opens on 64 threads: whether opens, which wait on the
//! disk's latency, hold the store back), `split` (each of T threads reads a contiguous block of
//! the files in name order, as a rayon `par_iter` splits them), `uring` and `uring-direct`
//! (every file opened on 16 threads, then read whole from one thread through io_uring with T
//! reads in flight, buffered or `O_DIRECT`: a deep queue without a thread per read).
//!
//! Three more run this project's own code, in batches of 4,096 files (a Z2 batch of the
//! pipeline), each value sized through the store first as the pipeline does: `store` (a
//! `GdsStore` opens the batch's files, `open_for_host`, and reads each whole, `read_host`, on a
//! rayon pool of T threads, into host memory: no GPU), `reader` (the device reader of T threads,
//! `DeviceReader::read_gds_to_host`, into pinned memory in pieces, as the pipeline reads chunks it
//! checks on the host) and `mirrored` (as `reader`, each piece also copied to device memory as it
//! is read: the pipeline's read of a checked batch, whole). The last two need a GPU; their
//! buffers and reader are made before the page cache is dropped and the clock starts.
//! Between them, the ladder from `pread` to `mirrored` shows which step loses a disk's rate.
//!
//! ```text
//! cargo run --release --example cold_read -- /tmp/zarrs-gpu-bench/z2.zarr pread,willneed,direct 16,64 2
//! ```
//!
//! `cold_read --pin BYTES[,BYTES...]` instead times pinning host memory (a batch's stored bytes
//! are read into pinned memory, and a process's first read pins its buffers): `PinnedBuffer`'s
//! two ways, `cuMemHostAlloc` (the default) and `huge` (`ZARRS_GPU_PINNED_PAGES=huge`: anonymous
//! memory in transparent huge pages, registered with `cuMemHostRegister`), beside anonymous memory
//! in 4 KiB pages registered; then one copy of the whole buffer to the device, which shows it
//! copies at the pinned rate. The machine's transparent huge page settings are in each row.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use zarrs_gpu::zarrs_gpu_codecs::reader::{
    cuda_context, DeviceMirror, DeviceReader, DeviceReaderOptions, HostReadRequest, PinnedBuffer,
};
use zarrs_gpu::GdsStore;
use zarrs_storage::{ReadableStorageTraits, StoreKey};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Every reader, by name.
const READERS: [&str; 11] = [
    "pread",
    "willneed",
    "direct",
    "phased",
    "wideopen",
    "split",
    "uring",
    "uring-direct",
    "store",
    "reader",
    "mirrored",
];

/// Files per batch of the `store`, `reader` and `mirrored` readers: a Z2 batch of the pipeline.
const BATCH_FILES: usize = 4096;

/// What the project's readers use, made before any clock starts: the store, per thread count a
/// rayon pool or a device reader, and the largest batch's buffers (host, pinned, device).
struct Kit {
    store: GdsStore,
    pools: std::collections::HashMap<usize, rayon::ThreadPool>,
    readers: std::collections::HashMap<usize, DeviceReader>,
    host: Vec<u8>,
    pinned: Option<PinnedBuffer>,
    device: Option<(u64, Arc<cudarc::driver::CudaStream>)>,
}

impl Kit {
    fn new(dir: &Path, files: &[(PathBuf, u64)], readers: &[&str], threads: &[usize]) -> Result<Self, Error> {
        let largest = files.chunks(BATCH_FILES).map(|b| b.iter().map(|f| f.1).sum::<u64>()).max().unwrap_or(0);
        let largest = usize::try_from(largest)?;
        let mut kit = Kit {
            store: GdsStore::new(dir)?,
            pools: std::collections::HashMap::new(),
            readers: std::collections::HashMap::new(),
            host: Vec::new(),
            pinned: None,
            device: None,
        };
        if readers.contains(&"store") {
            // Touched now: the pipeline's buffers are reused, not faulted in during a read.
            kit.host = vec![1u8; largest];
            for &t in threads {
                kit.pools.insert(t, rayon::ThreadPoolBuilder::new().num_threads(t).build()?);
            }
        }
        if readers.iter().any(|r| matches!(*r, "reader" | "mirrored")) {
            let ctx = cuda_context(0)?;
            let start = Instant::now();
            kit.pinned = Some(PinnedBuffer::new(&ctx, largest)?);
            eprintln!(
                "cold_read: {largest} bytes of pinned memory allocated in {:.3} s",
                start.elapsed().as_secs_f64()
            );
            for &t in threads {
                let options = DeviceReaderOptions::default().with_threads(t);
                kit.readers.insert(t, DeviceReader::new(ctx.clone(), options)?);
            }
            if readers.contains(&"mirrored") {
                ctx.bind_to_thread()?;
                // SAFETY: a plain allocation, freed in Drop.
                let ptr = unsafe { cudarc::driver::result::malloc_sync(largest.max(1)) }?;
                kit.device = Some((ptr, ctx.new_stream()?));
            }
        }
        Ok(kit)
    }
}

impl Drop for Kit {
    fn drop(&mut self) {
        if let Some((ptr, stream)) = self.device.take() {
            let _ = stream.synchronize();
            // SAFETY: allocated by malloc_sync in Kit::new; the copies into it are done.
            let _ = unsafe { cudarc::driver::result::free_sync(ptr) };
        }
    }
}

/// The project's readers over `files` (under `dir`), batch after batch: each batch's values
/// sized through the store (in parallel, as the pipeline sizes a batch), then read.
fn project_read(
    dir: &Path,
    files: &[(PathBuf, u64)],
    reader: &str,
    threads: usize,
    kit: &mut Kit,
) -> Result<u64, Error> {
    let mut total = 0;
    for batch in files.chunks(BATCH_FILES) {
        let keys: Vec<StoreKey> = batch
            .iter()
            .map(|(path, _)| Ok(StoreKey::new(path.strip_prefix(dir)?.to_string_lossy())?))
            .collect::<Result<_, Error>>()?;
        let size_all = || {
            use rayon::prelude::*;
            keys.par_iter().map(|key| kit.store.size_key(key).map(|s| s.unwrap_or(0))).collect::<Result<Vec<u64>, _>>()
        };
        let sizes = if reader == "store" {
            kit.pools[&threads].install(size_all)
        } else {
            kit.readers[&threads].install(size_all)
        }?;
        let mut at = 0;
        let requests: Vec<HostReadRequest> = keys
            .into_iter()
            .zip(&sizes)
            .map(|(key, &len)| {
                let r = HostReadRequest { key, offset: 0, len: len as usize, at, value_len: None, version: None };
                at += len as usize;
                r
            })
            .collect();
        let found = if reader == "store" {
            let (store, host) = (&kit.store, &mut kit.host);
            kit.pools[&threads].install(|| -> Result<Vec<bool>, Error> {
                use rayon::prelude::*;
                let files = store.open_for_host(&requests)?;
                let mut parts = Vec::with_capacity(requests.len());
                let mut rest = &mut host[..at];
                for r in &requests {
                    let (part, tail) = rest.split_at_mut(r.len);
                    parts.push(part);
                    rest = tail;
                }
                parts.into_par_iter().enumerate().map(|(i, part)| Ok(files.read_host(i, 0, part)?)).collect()
            })?
        } else {
            let pinned = kit.pinned.as_mut().ok_or("no pinned buffer")?;
            let mirror = kit.device.as_ref().filter(|_| reader == "mirrored").map(|(ptr, stream)| {
                // SAFETY: the device buffer holds the largest batch; the stream is synchronized
                // before the next batch overwrites it.
                unsafe { DeviceMirror::new(*ptr, at, stream) }
            });
            let found = kit.readers[&threads].read_gds_to_host(
                &kit.store,
                &requests,
                &mut pinned.as_mut_slice()[..at],
                mirror,
            )?;
            if let Some((_, stream)) = &kit.device {
                stream.synchronize()?;
            }
            found
        };
        if let Some(i) = found.iter().position(|&f| !f) {
            return Err(format!("{}: missing while read", requests[i].key).into());
        }
        total += at as u64;
    }
    Ok(total)
}

fn files_under(dir: &Path) -> Result<Vec<(PathBuf, u64)>, Error> {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry?;
        let meta = entry.metadata()?;
        if !meta.is_dir() {
            out.push((entry.into_path(), meta.len()));
        }
    }
    Ok(out)
}

fn drop_caches() -> Result<(), Error> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").map_err(|e| format!("dropping the page cache (root?): {e}"))?;
    Ok(())
}

/// A 4 KiB-aligned buffer of at least `len` bytes.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(4096).next_multiple_of(4096), 4096).expect("a layout");
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "allocating {len} bytes");
        Self { ptr, layout }
    }

    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for layout.size() bytes, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

// SAFETY: the buffer is owned, and used by one thread at a time.
unsafe impl Send for Aligned {}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Read `file` whole into `buf` with preads from `fd`; the bytes read.
fn read_whole(fd: i32, buf: &mut [u8], len: u64) -> Result<u64, Error> {
    let mut done = 0usize;
    let want = (len as usize).min(buf.len());
    while done < want {
        // SAFETY: the buffer is valid for its length from `done`.
        let n = unsafe { libc::pread(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done, done as libc::off_t) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    Ok(done.min(len as usize) as u64)
}

fn run(dir: &Path, files: &[(PathBuf, u64)], reader: &str, threads: usize, kit: &mut Kit) -> Result<u64, Error> {
    if matches!(reader, "store" | "reader" | "mirrored") {
        return project_read(dir, files, reader, threads, kit);
    }
    let next = AtomicUsize::new(0);
    let largest = files.iter().map(|f| f.1).max().unwrap_or(0) as usize;
    if reader == "willneed" {
        let advised = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    while let Some((path, len)) = files.get(advised.fetch_add(1, Ordering::Relaxed)) {
                        if let Ok(f) = File::open(path) {
                            // SAFETY: a valid descriptor; advice only.
                            unsafe {
                                libc::posix_fadvise(f.as_raw_fd(), 0, *len as libc::off_t, libc::POSIX_FADV_WILLNEED)
                            };
                        }
                    }
                });
            }
        });
    }
    if reader == "phased" {
        return phased(files, threads, threads, largest);
    }
    if reader == "wideopen" {
        // Opens on 64 threads, then reads on T: whether more openers would help the store.
        return phased(files, 64, threads, largest);
    }
    if reader == "split" {
        return split(files, threads, largest);
    }
    if let Some(how) = reader.strip_prefix("uring") {
        return uring(files, threads, how == "-direct", largest);
    }
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<(), Error> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), Error> {
                    let mut buf = Aligned::new(largest);
                    while let Some((path, len)) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let mut options = std::fs::OpenOptions::new();
                        options.read(true);
                        if reader == "direct" {
                            options.custom_flags(libc::O_DIRECT);
                        }
                        let f = options.open(path)?;
                        let read = read_whole(f.as_raw_fd(), buf.slice(), *len)?;
                        total.fetch_add(read as usize, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a reader thread")?;
        }
        Ok(())
    })?;
    Ok(total.load(Ordering::Relaxed) as u64)
}

/// Run `f` over `0..n` on `threads` threads, each taking the next index.
fn on_threads<T: Send>(
    n: usize,
    threads: usize,
    f: impl Fn(usize) -> Result<T, Error> + Sync,
) -> Result<Vec<T>, Error> {
    let next = AtomicUsize::new(0);
    let out: Vec<std::sync::Mutex<Option<T>>> = (0..n).map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| -> Result<(), Error> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), Error> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let value = f(i)?;
                        *out[i].lock().expect("a slot") = Some(value);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a thread")?;
        }
        Ok(())
    })?;
    Ok(out.into_iter().map(|m| m.into_inner().expect("a slot").expect("every index")).collect())
}

/// The store's phases, each finished before the next: every file's size (stat) and every file
/// opened, each on `openers` threads, then every file read on `threads`.
fn phased(files: &[(PathBuf, u64)], openers: usize, threads: usize, largest: usize) -> Result<u64, Error> {
    let sizes = on_threads(files.len(), openers, |i| Ok(std::fs::metadata(&files[i].0)?.len()))?;
    let opened = on_threads(files.len(), openers, |i| Ok(File::open(&files[i].0)?))?;
    let buffers: Vec<std::sync::Mutex<Aligned>> =
        (0..threads).map(|_| std::sync::Mutex::new(Aligned::new(largest))).collect();
    let read = on_threads(files.len(), threads, |i| {
        let mut buf = buffers[i % threads].lock().expect("a buffer");
        read_whole(opened[i].as_raw_fd(), buf.slice(), sizes[i])
    })?;
    Ok(read.iter().sum())
}

/// Every file opened on 16 threads (with `O_DIRECT` when `direct`), then read whole from this
/// thread through one io_uring with `depth` reads in flight, each into its own 4 KiB-aligned
/// buffer (a direct read asks for the length rounded up to 4 KiB; the file's end cuts it short).
fn uring(files: &[(PathBuf, u64)], depth: usize, direct: bool, largest: usize) -> Result<u64, Error> {
    use io_uring::{opcode, types, IoUring};
    let opened = on_threads(files.len(), 16, |i| {
        let mut options = std::fs::OpenOptions::new();
        options.read(true);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        Ok(options.open(&files[i].0)?)
    })?;
    let depth = depth.clamp(1, 4096);
    let mut ring = IoUring::new(u32::try_from(depth.next_power_of_two())?)?;
    let capacity = largest.next_multiple_of(4096).max(4096);
    let mut buffers: Vec<Aligned> = (0..depth).map(|_| Aligned::new(capacity)).collect();
    // Per slot: the file it reads and the bytes read so far.
    let mut slots: Vec<(usize, u64)> = vec![(0, 0); depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let (mut next, mut in_flight, mut total) = (0usize, 0usize, 0u64);
    // Queue the read of the rest of slot `slot`'s file.
    let queue = |ring: &mut IoUring, buffers: &mut [Aligned], slot: usize, (file, done): (usize, u64)| {
        let len = files[file].1;
        let want = if direct { len.next_multiple_of(4096) } else { len };
        let buf = buffers[slot].slice();
        let read = opcode::Read::new(
            types::Fd(opened[file].as_raw_fd()),
            // SAFETY (of the pointer): done < want <= the buffer's length.
            buf[done as usize..].as_mut_ptr(),
            u32::try_from(want - done).expect("a file under 4 GiB"),
        )
        .offset(done)
        .build()
        .user_data(slot as u64);
        // SAFETY: the descriptor and the buffer outlive the read (both live until this function
        // returns, after every read has completed); each slot has one read in flight at most.
        unsafe { ring.submission().push(&read) }.expect("room: at most `depth` reads in flight");
    };
    loop {
        while next < files.len() {
            let Some(slot) = free.pop() else { break };
            slots[slot] = (next, 0);
            queue(&mut ring, &mut buffers, slot, slots[slot]);
            (next, in_flight) = (next + 1, in_flight + 1);
        }
        if in_flight == 0 {
            return Ok(total);
        }
        ring.submit_and_wait(1)?;
        let done: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (slot, result) in done {
            in_flight -= 1;
            if result < 0 {
                return Err(std::io::Error::from_raw_os_error(-result).into());
            }
            let (file, read) = slots[slot];
            let read = read + result as u64;
            if result == 0 || read >= files[file].1 {
                total += read.min(files[file].1);
                free.push(slot);
            } else {
                slots[slot] = (file, read);
                queue(&mut ring, &mut buffers, slot, slots[slot]);
                in_flight += 1;
            }
        }
    }
}

/// What a rayon `par_iter` over the files does: each thread reads a contiguous block of them
/// (in name order, a chunk grid's order), the blocks far apart, rather than taking the next file.
fn split(files: &[(PathBuf, u64)], threads: usize, largest: usize) -> Result<u64, Error> {
    let mut sorted: Vec<&(PathBuf, u64)> = files.iter().collect();
    sorted.sort();
    let per = sorted.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| -> Result<u64, Error> {
        let workers: Vec<_> = sorted
            .chunks(per)
            .map(|block| {
                s.spawn(move || -> Result<u64, Error> {
                    let mut buf = Aligned::new(largest);
                    let mut read = 0;
                    for (path, len) in block {
                        let f = File::open(path)?;
                        read += read_whole(f.as_raw_fd(), buf.slice(), *len)?;
                    }
                    Ok(read)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a reader thread")).sum()
    })
}

/// How host memory is pinned in `--pin`: the library's two ways (`PinnedBuffer::with_pages`), and
/// anonymous memory in 4 KiB pages registered (which tells whether `huge` gains by its pages or by
/// registering).
const PIN_METHODS: [&str; 3] = ["cuMemHostAlloc", "huge", "register-4k"];

/// Host memory pinned by one of [`PIN_METHODS`], given back on drop.
enum Pinned {
    Library(PinnedBuffer),
    /// An anonymous mapping of `len` bytes, registered.
    Registered {
        ptr: *mut u8,
        len: usize,
    },
}

impl Pinned {
    fn new(ctx: &Arc<cudarc::driver::CudaContext>, method: &str, len: usize) -> Result<Self, Error> {
        use cudarc::driver::sys;
        if method != "register-4k" {
            return Ok(Self::Library(PinnedBuffer::with_pages(ctx, len, method == "huge")?));
        }
        // SAFETY: an anonymous private mapping of len bytes, unmapped on drop or below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap of {len} bytes: {}", std::io::Error::last_os_error()).into());
        }
        // SAFETY: advice on, then registration of, the mapping just made (current context).
        let registered = unsafe {
            libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE);
            sys::cuMemHostRegister_v2(ptr, len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        };
        if registered != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the mapping made above, not registered.
            unsafe { libc::munmap(ptr, len) };
            return Err(format!("cuMemHostRegister of {len} bytes: {registered:?}").into());
        }
        Ok(Self::Registered { ptr: ptr.cast(), len })
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Library(buffer) => buffer.as_slice(),
            // SAFETY: ptr is valid for len bytes while self lives (anonymous pages read as zeros).
            Self::Registered { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Self::Registered { ptr, len } = *self {
            // SAFETY: registered and mapped in new, released once; the copies from it were synchronous.
            unsafe {
                let _ = cudarc::driver::sys::cuMemHostUnregister(ptr.cast());
                libc::munmap(ptr.cast(), len);
            }
        }
    }
}

/// The kernel's `AnonHugePages` line of /proc/meminfo (huge pages in use now).
fn anon_huge_pages() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find(|l| l.starts_with("AnonHugePages"))
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `--pin`: each method's time to pin `len` bytes, then one synchronous copy of them to the device.
fn pin_rates(sizes: &[usize]) -> Result<(), Error> {
    use cudarc::driver::result;
    let ctx = cuda_context(0)?;
    ctx.bind_to_thread()?;
    let setting = |name: &str| {
        std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let thp = format!("enabled: {}; defrag: {}", setting("enabled"), setting("defrag"));
    for &len in sizes {
        // SAFETY: a device allocation of len bytes, freed below.
        let device = unsafe { result::malloc_sync(len) }?;
        for method in PIN_METHODS {
            let start = Instant::now();
            let pinned = Pinned::new(&ctx, method, len);
            let pin_seconds = start.elapsed().as_secs_f64();
            let pinned = match pinned {
                Ok(pinned) => pinned,
                Err(e) => {
                    println!(
                        "{}",
                        serde_json::json!({"case": "pin", "method": method, "bytes": len, "error": e.to_string()})
                    );
                    continue;
                }
            };
            let start = Instant::now();
            // SAFETY: device holds len bytes (a huge-page buffer may be longer: len are copied);
            // the copy is synchronous.
            unsafe { result::memcpy_htod_sync(device, &pinned.as_slice()[..len]) }?;
            let huge_pages_in_use = anon_huge_pages();
            let copy_seconds = start.elapsed().as_secs_f64();
            let start = Instant::now();
            drop(pinned);
            let free_seconds = start.elapsed().as_secs_f64();
            let gib = len as f64 / f64::from(1 << 30);
            println!(
                "{}",
                serde_json::json!({"case": "pin", "method": method, "bytes": len, "pin_seconds": pin_seconds,
                    "pin_gib_s": gib / pin_seconds, "copy_gib_s": gib / copy_seconds, "free_seconds": free_seconds,
                    "transparent_hugepage": thp, "anon_huge_pages_while_held": huge_pages_in_use})
            );
        }
        // SAFETY: allocated above, no copy in flight.
        unsafe { result::free_sync(device) }?;
    }
    Ok(())
}

/// What `--help` prints.
fn usage() -> String {
    format!(
        "usage: cold_read DIR [READERS] [THREADS] [REPEAT]\n       cold_read --pin BYTES[,BYTES...]\n\
         READERS: comma-separated, of {} (default pread,willneed,direct,phased); THREADS: comma-separated \
         thread counts (default 16,64); REPEAT: default 2. The page cache is dropped before each read (root).",
        READERS.join(", ")
    )
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `--help` was taken for a directory named "--help".
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", usage());
        return Ok(());
    }
    if let Some(flag) = args.iter().find(|a| a.starts_with('-') && *a != "--pin") {
        eprintln!("cold_read: unknown option {flag}\n{}", usage());
        std::process::exit(2);
    }
    if args.first().is_some_and(|a| a == "--pin") {
        let sizes = args.get(1).ok_or("usage: cold_read --pin BYTES[,BYTES...]")?;
        return pin_rates(&sizes.split(',').map(str::parse).collect::<Result<Vec<usize>, _>>()?);
    }
    let dir = PathBuf::from(args.first().ok_or("usage: cold_read DIR [READERS] [THREADS] [REPEAT]")?);
    let readers: Vec<&str> = args.get(1).map_or("pread,willneed,direct,phased", String::as_str).split(',').collect();
    if let Some(unknown) = readers.iter().find(|r| !READERS.contains(r)) {
        return Err(format!("unknown reader {unknown}: one of {}", READERS.join(", ")).into());
    }
    let threads: Vec<usize> =
        args.get(2).map_or("16,64", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    let repeat: usize = args.get(3).map_or(Ok(2), |r| r.parse())?;
    let files = files_under(&dir)?;
    let bytes: u64 = files.iter().map(|f| f.1).sum();
    let mut kit = Kit::new(&dir, &files, &readers, &threads)?;
    for run_index in 0..repeat {
        for reader in &readers {
            for &t in &threads {
                drop_caches()?;
                let start = Instant::now();
                let read = run(&dir, &files, reader, t, &mut kit)?;
                let seconds = start.elapsed().as_secs_f64();
                assert_eq!(read, bytes, "{reader}: every byte read");
                println!(
                    "{}",
                    serde_json::json!({"case": "cold read", "dir": dir, "reader": reader, "threads": t, "run": run_index,
                        "files": files.len(), "bytes": bytes, "seconds": seconds,
                        "gib_s": bytes as f64 / f64::from(1 << 30) / seconds})
                );
            }
        }
    }
    Ok(())
}
