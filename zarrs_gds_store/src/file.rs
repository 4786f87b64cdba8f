//! The files behind a store's values. A read opens each file once; a file registered with cuFile
//! (the costly part: nvidia-fs maps it) stays open in the store's [`FileCache`] for later reads.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cufile::{CuFileDriver, CuFileHandle};
use crate::error::ReadError;
use crate::write::FileVersion;

/// Rows this far apart or closer are read with the gap between them (dropped), by one `preadv`:
/// cheaper than another call per row.
pub(crate) const ROW_GAP: u64 = 64 << 10;
/// Rows per `preadv` (each row and gap an iovec, under the usual limit of 1024).
const ROWS_PER_CALL: usize = 500;

thread_local! {
    /// Where a thread's row reads drop the gaps between rows (kept: read after read).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An open file, registered with cuFile when it could be.
pub(crate) struct GdsFile {
    pub(crate) path: PathBuf,
    file: File,
    cufile: Option<CuFileHandle>,
}

impl GdsFile {
    /// Fill `buf` from byte `at` of the file (parallel preads on one descriptor are fine).
    pub(crate) fn read_host(&self, at: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        self.file.read_exact_at(buf, at).map_err(|source| ReadError::Io { path: self.path.clone(), source })
    }

    /// Fill `buf` with rows of the file packed one after another: the first `width - col` bytes
    /// from byte `at` (column `col` of its row), then whole rows of `width` bytes, each `pitch`
    /// bytes after the one before, the last cut where `buf` ends. Gaps between rows of at most
    /// [`ROW_GAP`] are read into a scratch buffer so that one `preadv` takes many rows; rows
    /// farther apart are read one by one.
    pub(crate) fn read_rows_host(
        &self,
        at: u64,
        col: u64,
        width: u64,
        pitch: u64,
        buf: &mut [u8],
    ) -> Result<(), ReadError> {
        let io = |source| ReadError::Io { path: self.path.clone(), source };
        debug_assert!(col < width && width <= pitch, "rows of {width} bytes every {pitch}, from column {col}");
        let gap = pitch - width;
        let (first, len) = ((width - col) as usize, buf.len());
        let count = if len <= first { 1 } else { 1 + (len - first).div_ceil(width as usize) };
        // Row k as (offset in buf, offset in the file, bytes), the first and last cut; every row
        // lies within the range the caller checked, so no offset overflows.
        let row = |k: usize| {
            let (b, f, n) = if k == 0 {
                (0, at, first)
            } else {
                let later = (k - 1) as u64;
                (first + (k - 1) * width as usize, at + (width - col) + gap + later * pitch, width as usize)
            };
            (b, f, n.min(len - b))
        };
        if gap > ROW_GAP || count == 1 {
            for k in 0..count {
                let (b, f, n) = row(k);
                self.read_host(f, &mut buf[b..b + n])?;
            }
            return Ok(());
        }
        SCRATCH.with_borrow_mut(|scratch| {
            if scratch.len() < gap as usize {
                scratch.resize(gap as usize, 0);
            }
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(2 * ROWS_PER_CALL.min(count));
            // Each preadv: up to ROWS_PER_CALL rows and the gaps between them.
            for start in (0..count).step_by(ROWS_PER_CALL) {
                let group = start..(start + ROWS_PER_CALL).min(count);
                iov.clear();
                let mut expected = 0usize;
                for k in group.clone() {
                    let (b, _, n) = row(k);
                    if k > start && gap > 0 {
                        iov.push(libc::iovec { iov_base: scratch.as_mut_ptr().cast(), iov_len: gap as usize });
                        expected += gap as usize;
                    }
                    // SAFETY: b + n <= buf.len() (the rows split buf), so the pointer stays within it.
                    iov.push(libc::iovec { iov_base: unsafe { buf.as_mut_ptr().add(b) }.cast(), iov_len: n });
                    expected += n;
                }
                let offset =
                    libc::off_t::try_from(row(start).1).map_err(|_| io(std::io::ErrorKind::InvalidInput.into()))?;
                // SAFETY: every iovec points into buf or this thread's scratch, both borrowed mutably
                // here and valid for the lengths given; the rows' parts of buf are disjoint (the
                // scratch takes the gaps, whose bytes are dropped); the descriptor is this file's,
                // open while self is.
                let got =
                    unsafe { libc::preadv(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int, offset) };
                if got < 0 {
                    let err = std::io::Error::last_os_error();
                    if err.kind() != std::io::ErrorKind::Interrupted {
                        return Err(io(err));
                    }
                }
                if usize::try_from(got).ok() != Some(expected) {
                    // Short (a signal, or a file cut meanwhile): each row again, which says which.
                    for k in group {
                        let (b, f, n) = row(k);
                        self.read_host(f, &mut buf[b..b + n])?;
                    }
                }
            }
            Ok(())
        })
    }

    pub(crate) fn is_registered(&self) -> bool {
        self.cufile.is_some()
    }

    /// Read `len` bytes from byte `at` of the file straight to device memory at `dst`.
    ///
    /// # Safety
    /// As [`CuFileHandle::read`].
    pub(crate) unsafe fn read_device(&self, at: u64, dst: u64, len: usize) -> Result<(), ReadError> {
        let Some(handle) = &self.cufile else {
            return Err(ReadError::GdsUnavailable(format!("{} is not registered with cuFile", self.path.display())));
        };
        // SAFETY: the caller's contract.
        unsafe { handle.read(&self.path, at, dst, len) }
    }
}

/// A value's file as one read sees it.
pub(crate) struct OpenValue {
    /// None when the key does not exist.
    pub(crate) file: Option<Arc<GdsFile>>,
    /// Its size when opened for this read (a cached file may have been rewritten in place since).
    pub(crate) size: u64,
    /// Its version when opened for this read, from `fstat` of the descriptor read from (None
    /// when the key does not exist).
    pub(crate) version: Option<FileVersion>,
    /// Why cuFile could not register it, when it was tried.
    pub(crate) gds_error: Option<ReadError>,
}

impl OpenValue {
    const MISSING: Self = Self { file: None, size: 0, version: None, gds_error: None };

    /// Open `path` for one read: from `cache` when a registered file for it is there and the path
    /// still names that file, else opened (and, with a `driver`, registered and cached).
    pub(crate) fn open(
        path: PathBuf,
        driver: Option<&'static CuFileDriver>,
        cache: &FileCache<GdsFile>,
    ) -> Result<Self, ReadError> {
        if driver.is_some() {
            let meta = match std::fs::metadata(&path) {
                Ok(meta) => meta,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Self::MISSING),
                Err(source) => return Err(ReadError::Io { path, source }),
            };
            if let Some(file) = cache.get(&path, &meta) {
                // The version of the descriptor kept, not of the path (replaced since, maybe).
                let meta = file.file.metadata().map_err(|source| ReadError::Io { path: path.clone(), source })?;
                let version = Some(FileVersion::of(&meta));
                return Ok(Self { file: Some(file), size: meta.len(), version, gds_error: None });
            }
        }
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Self::MISSING),
            Err(source) => return Err(ReadError::Io { path, source }),
        };
        let meta = file.metadata().map_err(|source| ReadError::Io { path: path.clone(), source })?;
        let (cufile, gds_error) = match driver.map(|d| d.register(&path)) {
            None => (None, None),
            // The registration opens the path again: it must be the same file (not one that
            // replaced it meanwhile), or device reads and host reads would see two files.
            Some(Ok(handle)) => match handle.file().metadata() {
                Ok(m) if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) => (Some(handle), None),
                _ => {
                    (None, Some(ReadError::GdsUnavailable(format!("{} was replaced while it opened", path.display()))))
                }
            },
            Some(Err(err)) => (None, Some(err)),
        };
        let file = Arc::new(GdsFile { path, file, cufile });
        if file.is_registered() {
            cache.insert(file.path.clone(), &meta, file.clone());
        }
        Ok(Self { file: Some(file), size: meta.len(), version: Some(FileVersion::of(&meta)), gds_error })
    }
}

/// A file's identity: its device and inode.
type FileId = (u64, u64);

/// Open files kept between reads, keyed on their paths. An entry serves while its path names the
/// same file (device and inode): a file rewritten in place is read through the same descriptor and
/// sees the new bytes; a file replaced (renamed over, or deleted and made again) is opened anew.
/// Bounded: each entry holds descriptors.
pub(crate) struct FileCache<T> {
    entries: Mutex<HashMap<PathBuf, (FileId, Arc<T>)>>,
    capacity: usize,
}

impl<T> FileCache<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { entries: Mutex::default(), capacity }
    }

    /// The entry for `path` when `meta` (the path's metadata now) names the same file; a stale
    /// entry is dropped.
    pub(crate) fn get(&self, path: &Path, meta: &Metadata) -> Option<Arc<T>> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(path) {
            Some((id, value)) if *id == (meta.dev(), meta.ino()) => Some(value.clone()),
            Some(_) => {
                entries.remove(path);
                None
            }
            None => None,
        }
    }

    /// Keep `value`, opened from `path` whose metadata (taken from the open file) is `meta`. When
    /// full, an arbitrary entry makes room (reads that hold it keep it alive).
    pub(crate) fn insert(&self, path: PathBuf, meta: &Metadata, value: Arc<T>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity && !entries.contains_key(&path) {
            if let Some(evict) = entries.keys().next().cloned() {
                entries.remove(&evict);
            }
        }
        entries.insert(path, ((meta.dev(), meta.ino()), value));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_serves_the_same_file_and_drops_replaced_ones() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c0");
        std::fs::write(&path, b"first")?;
        let cache = FileCache::new(2);
        let open = |path: &Path| -> std::io::Result<(Metadata, Arc<File>)> {
            let file = File::open(path)?;
            Ok((file.metadata()?, Arc::new(file)))
        };
        let (meta, file) = open(&path)?;
        cache.insert(path.clone(), &meta, file);
        // Rewritten in place: the same inode, served, and the descriptor reads the new bytes.
        std::fs::write(&path, b"second!")?;
        let hit = cache.get(&path, &std::fs::metadata(&path)?).expect("same file");
        let mut buf = [0u8; 7];
        hit.read_exact_at(&mut buf, 0)?;
        assert_eq!(&buf, b"second!");
        // Replaced by a rename: another inode, so the entry is stale and dropped.
        let tmp = dir.path().join("tmp");
        std::fs::write(&tmp, b"third")?;
        std::fs::rename(&tmp, &path)?;
        assert!(cache.get(&path, &std::fs::metadata(&path)?).is_none());
        assert_eq!(cache.len(), 0);
        // Bounded: a third file evicts one of two.
        for name in ["a", "b", "c"] {
            let p = dir.path().join(name);
            std::fs::write(&p, name)?;
            let (meta, file) = open(&p)?;
            cache.insert(p, &meta, file);
        }
        assert_eq!(cache.len(), 2);
        Ok(())
    }
}
