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
//! the files in name order, as a rayon `par_iter` splits them).
//!
//! ```text
//! cargo run --release --example cold_read -- /tmp/zarrs-gpu-bench/z2.zarr pread,willneed,direct 16,64 2
//! ```

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn files_under(dir: &Path) -> Result<Vec<(PathBuf, u64)>, Error> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                out.push((entry.path(), meta.len()));
            }
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

fn run(files: &[(PathBuf, u64)], reader: &str, threads: usize) -> Result<u64, Error> {
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

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().ok_or("usage: cold_read DIR [READERS] [THREADS] [REPEAT]")?);
    let readers: Vec<&str> = args.get(1).map_or("pread,willneed,direct,phased", String::as_str).split(',').collect();
    if let Some(unknown) =
        readers.iter().find(|r| !matches!(**r, "pread" | "willneed" | "direct" | "phased" | "wideopen" | "split"))
    {
        return Err(format!("unknown reader {unknown}: pread, willneed, direct, phased, wideopen or split").into());
    }
    let threads: Vec<usize> =
        args.get(2).map_or("16,64", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    let repeat: usize = args.get(3).map_or(Ok(2), |r| r.parse())?;
    let files = files_under(&dir)?;
    let bytes: u64 = files.iter().map(|f| f.1).sum();
    for run_index in 0..repeat {
        for reader in &readers {
            for &t in &threads {
                drop_caches()?;
                let start = Instant::now();
                let read = run(&files, reader, t)?;
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
