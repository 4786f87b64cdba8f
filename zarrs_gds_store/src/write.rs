//! Writes that a reader never sees torn: each value goes to a temporary file beside its own, which
//! is then renamed over it (a rename within a directory is atomic on POSIX filesystems), flushed
//! to the disk first where the store's [`Durability`] asks.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a `GdsStore` write guarantees once it has returned. Either way a
/// value is replaced whole: a reader, or a writer killed mid-write, leaves the old value or the
/// new one, never a mix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// The value's file, then its directory (and any directory the write made), are flushed to
    /// the disk (`fsync`) before the write returns, as is the directory of an erased value: a
    /// write that returned survives a crash of the machine.
    #[default]
    Sync,
    /// Written and renamed into place; the operating system flushes it when it chooses, so a
    /// crash of the machine (not of the process) may lose the latest writes.
    NoSync,
}

/// How the temporary files of unfinished writes end: never a key a Zarr array or group uses
/// (those are `zarr.json`, `.z*` and chunk keys), and left out of the store's listings.
pub(crate) const TEMP_SUFFIX: &str = ".zarrs-tmp";

/// Whether `name` (a file name, or a key's last part) is a temporary file of a write.
pub(crate) fn is_temp(name: &str) -> bool {
    name.ends_with(TEMP_SUFFIX)
}

/// A name no other write of this process or another uses at the same time: the target's name,
/// the process, the clock's nanoseconds and a counter (a writer killed earlier with the same
/// process id, as containers reuse them, left names of another time; a clash is retried).
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    path.with_file_name(format!(".{name}.{pid}.{nanos:x}.{n}{TEMP_SUFFIX}", pid = std::process::id()))
}

/// A new temporary file beside `path`, and its name (a name taken, by a file left behind, is
/// passed over). It is locked (`flock`) as long as it is open: a cleaner of stale temporary
/// files passes over a locked one ([`clean_stale_temps`]).
fn create_temp(path: &Path) -> std::io::Result<(File, PathBuf)> {
    let mut tries = 0;
    loop {
        let temp = temp_path(path);
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
            Err(err) => return Err(err),
            Ok(file) => {
                if let Err(err) = file.lock() {
                    let _ = fs::remove_file(&temp);
                    return Err(err);
                }
                return Ok((file, temp));
            }
        }
    }
}

/// A temporary file older than this whose writer holds no lock on it was left by a writer that
/// was killed. (A live writer locks its file microseconds after making it; the age only closes
/// that gap.)
const STALE_AFTER: std::time::Duration = std::time::Duration::from_mins(5);

/// Remove the temporary files in `dir` that killed writers left: older than [`STALE_AFTER`] and
/// not locked (a live writer holds the lock on its file until it is renamed or removed). Errors
/// are ignored: a file another cleaner removed first, or one this process may not remove, stays
/// someone else's business. Returns how many it removed.
pub(crate) fn clean_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else { return 0 };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        if !is_temp(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        let old =
            |meta: &fs::Metadata| meta.modified().ok().and_then(|m| now.duration_since(m).ok()) > Some(STALE_AFTER);
        let Ok(file) = File::open(&path) else { continue };
        let Ok(meta) = file.metadata() else { continue };
        if !meta.is_file() || !old(&meta) || file.try_lock().is_err() {
            continue;
        }
        // Still the file locked (temporary names are never reused, so nothing else can take it).
        if fs::symlink_metadata(&path).is_ok_and(|now| same_file(&now, &meta)) && fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Clean each of `dirs` of stale temporary files once in this process's life (a listing per
/// directory, not per write); those in `made` were made by this write, empty: only noted.
fn clean_once(dirs: &[&Path], made: &[bool]) {
    static CLEANED: std::sync::Mutex<Option<std::collections::HashSet<PathBuf>>> = std::sync::Mutex::new(None);
    let mut todo = Vec::new();
    {
        let mut cleaned = CLEANED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let cleaned = cleaned.get_or_insert_with(Default::default);
        if cleaned.len() > 1 << 16 {
            cleaned.clear();
        }
        for (k, dir) in dirs.iter().enumerate() {
            if cleaned.insert(dir.to_path_buf()) && !made.get(k).copied().unwrap_or(false) {
                todo.push(*dir);
            }
        }
    }
    for dir in todo {
        clean_stale_temps(dir);
    }
}

/// Flush `dir`'s entries (a rename or removal in it) to the disk.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Make `dir` and its missing ancestors; under [`Durability::Sync`] each new directory's entry is
/// flushed in its parent, so that a value flushed inside it is found after a crash too. Whether
/// `dir` was made here.
pub(crate) fn create_dirs(dir: &Path, durability: Durability) -> std::io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.is_dir()).collect();
    fs::create_dir_all(dir)?;
    if durability == Durability::Sync {
        for created in missing {
            if let Some(parent) = created.parent() {
                sync_dir(parent)?;
            }
        }
    }
    Ok(true)
}

/// Which version of a value's file a write read: a rewrite (a new file renamed over) or an
/// erase changes it, as does any change to the file. Taken from the file a read opened, and
/// compared, under the value's lock, just before a read-modify-write replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileVersion {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    /// The status change time: what userspace cannot set back (a rewrite in place that keeps
    /// size and modification time still changes it).
    ctime: (i64, i64),
}

impl FileVersion {
    /// The version of the file `meta` describes.
    #[must_use]
    pub fn of(meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The version of the file at `path` now; None when there is none.
    ///
    /// # Errors
    /// An error of `stat` other than a missing file.
    pub fn at(path: &Path) -> std::io::Result<Option<Self>> {
        match fs::metadata(path) {
            Ok(meta) => Ok(Some(Self::of(&meta))),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// What a replacement expects to find at its path: None checks nothing (a value written whole);
/// `Some(None)`, no file (read as missing); `Some(Some(v))`, the file read.
pub type Expected = Option<Option<FileVersion>>;

fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

/// The error of a read-modify-write whose value another writer changed after it was read.
fn conflict(path: &Path) -> std::io::Error {
    std::io::Error::other(format!(
        "{} changed after this write read it (another writer, most likely another process): nothing was \
         written for it; write again",
        path.display()
    ))
}

/// Run `modify` (a rename onto `path`, or its removal) holding the lock of what is at `path`
/// now: its file, or its directory when it has none (`flock`, which excludes other processes and
/// other descriptors of this one). Every rename onto a value's path and every erase of it is
/// made so; one that finds another file there than it locked locks again. Under the lock,
/// `expected` is compared with what is there: a value that changed since it was read is a
/// conflict, never overwritten.
fn locked_at<R>(path: &Path, expected: Expected, modify: impl FnOnce() -> std::io::Result<R>) -> std::io::Result<R> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other(format!("{} has no directory", path.display())))?;
    loop {
        let (held, meta) = match File::open(path) {
            Ok(file) => {
                file.lock()?;
                let meta = file.metadata()?;
                (file, Some(meta))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let held = File::open(dir)?;
                held.lock()?;
                (held, None)
            }
            Err(err) => return Err(err),
        };
        let now = match fs::metadata(path) {
            Ok(now) => Some(now),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => return Err(err),
        };
        let still = match (&meta, &now) {
            (Some(locked), Some(now)) => same_file(locked, now),
            (None, None) => true,
            _ => false,
        };
        if !still {
            drop(held);
            continue;
        }
        if expected.is_some_and(|expected| expected != now.as_ref().map(FileVersion::of)) {
            return Err(conflict(path));
        }
        let done = modify();
        drop(held);
        return done;
    }
}

/// Remove the value at `path` (under its lock, as [`locked_at`]); whether there was one.
pub(crate) fn remove_locked(path: &Path, expected: Expected) -> std::io::Result<bool> {
    if !path.parent().is_some_and(Path::is_dir) {
        return match expected {
            Some(Some(_)) => Err(conflict(path)),
            _ => Ok(false),
        };
    }
    locked_at(path, expected, || match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(err),
    })
}

/// Give `temp` the mode of the file it replaces at `path`, and its owner where this process may
/// (a rewrite keeps a file's permissions; a new file has the process's defaults).
fn keep_mode_and_owner(temp: &File, path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let old = match fs::metadata(path) {
        Ok(old) => old,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    let ours = temp.metadata()?;
    if (ours.uid(), ours.gid()) != (old.uid(), old.gid()) {
        // Only root (or the owner, to one of its groups) may: otherwise the file stays ours.
        let _ = std::os::unix::fs::fchown(temp, Some(old.uid()), Some(old.gid()))
            .or_else(|_| std::os::unix::fs::fchown(temp, None, Some(old.gid())));
    }
    if ours.mode() & 0o7777 != old.mode() & 0o7777 {
        temp.set_permissions(fs::Permissions::from_mode(old.mode() & 0o7777))?;
    }
    Ok(())
}

/// Write `value` to `path` atomically, making its directories as needed. On an error (a full
/// disk, say) the old value, if any, is still there and the temporary file is removed.
pub(crate) fn write_atomic(path: &Path, value: &[u8], durability: Durability) -> std::io::Result<()> {
    write_many_atomic(&[(path.to_path_buf(), value)], &[], durability).map_err(|(_, err)| err)
}

/// Write each of `values` (path, bytes) atomically, flushed as one:
/// every temporary file written and (under [`Durability::Sync`]) flushed in parallel, then renamed
/// into place, then each directory flushed once (one flush per directory rather than one per
/// value). Each value is replaced whole; when the call returns without error every one is durable
/// as `durability` says. `expected` (empty, or one per value) says what each rename must find at
/// its path ([`locked_at`]). The first error is returned, naming its path; values renamed before
/// it keep their new bytes (their directories flushed under Sync), the others their old ones.
pub(crate) fn write_many_atomic(
    values: &[(PathBuf, &[u8])],
    expected: &[Expected],
    durability: Durability,
) -> Result<(), (PathBuf, std::io::Error)> {
    use rayon::prelude::*;
    let clean = |temps: &[(File, PathBuf)]| {
        for (_, temp) in temps {
            let _ = fs::remove_file(temp);
        }
    };
    // Directories first, each once (their entries flushed under Sync).
    let mut dirs: Vec<&Path> = values.iter().filter_map(|(path, _)| path.parent()).collect();
    dirs.sort_unstable();
    dirs.dedup();
    let mut made = Vec::with_capacity(dirs.len());
    for dir in &dirs {
        // A directory that cannot be made is named by the first value in it.
        let first = || values.iter().find(|(path, _)| path.parent() == Some(*dir)).map(|(path, _)| path.clone());
        made.push(create_dirs(dir, durability).map_err(|err| (first().unwrap_or_else(|| dir.to_path_buf()), err))?);
    }
    clean_once(&dirs, &made);
    // Each temporary file stays open (and locked) until it is renamed or removed.
    let written: Vec<Result<(File, PathBuf), (PathBuf, std::io::Error)>> = values
        .par_iter()
        .map(|(path, bytes)| {
            let (mut file, temp) = create_temp(path).map_err(|err| (path.clone(), err))?;
            let mut write = || -> std::io::Result<()> {
                keep_mode_and_owner(&file, path)?;
                file.write_all(bytes)?;
                if durability == Durability::Sync {
                    file.sync_all()?;
                }
                Ok(())
            };
            match write() {
                Ok(()) => Ok((file, temp)),
                Err(err) => {
                    let _ = fs::remove_file(&temp);
                    Err((path.clone(), err))
                }
            }
        })
        .collect();
    let mut temps = Vec::with_capacity(written.len());
    let mut failed = None;
    for w in written {
        match w {
            Ok(temp) => temps.push(temp),
            Err(err) => failed = failed.or(Some(err)),
        }
    }
    if let Some(err) = failed {
        clean(&temps);
        return Err(err);
    }
    let flush = |renamed: &[(PathBuf, &[u8])]| -> Result<(), (PathBuf, std::io::Error)> {
        if durability != Durability::Sync {
            return Ok(());
        }
        let mut dirs: Vec<&Path> = renamed.iter().filter_map(|(path, _)| path.parent()).collect();
        dirs.sort_unstable();
        dirs.dedup();
        dirs.par_iter().try_for_each(|dir| sync_dir(dir).map_err(|err| (dir.to_path_buf(), err)))
    };
    // Renamed in order. A value whose path is free is renamed under its directory's lock, held
    // across the consecutive values of one directory, with a rename that refuses to replace
    // (one call per value: a fresh array's thousand files cost what plain renames did); a value
    // whose path holds a file goes through that file's lock (`locked_at`).
    let mut dir_lock: Option<(&Path, File)> = None;
    for (k, ((path, _), (_, temp))) in values.iter().zip(&temps).enumerate() {
        let expect = expected.get(k).copied().flatten();
        let mut rename = || -> std::io::Result<()> {
            if !matches!(expect, Some(Some(_))) {
                let dir = path.parent().ok_or_else(|| std::io::Error::other("a value without a directory"))?;
                if dir_lock.as_ref().is_none_or(|(held, _)| *held != dir) {
                    dir_lock = None;
                    let held = File::open(dir)?;
                    held.lock()?;
                    dir_lock = Some((dir, held));
                }
                if rename_if_free(temp, path)? {
                    return Ok(());
                }
            }
            // Its own lock, never two held at once: the directory's goes first.
            dir_lock = None;
            locked_at(path, expect, || fs::rename(temp, path))
        };
        if let Err(err) = rename() {
            clean(&temps[k..]);
            // The values renamed before it are durable as the call promises of what it wrote.
            let _ = flush(&values[..k]);
            return Err((path.clone(), err));
        }
    }
    drop(dir_lock);
    drop(temps);
    flush(values)
}

/// Rename `temp` to `path` if no file is there (`renameat2` with `RENAME_NOREPLACE`; where the
/// filesystem cannot do that, a stat then a rename, which the caller's directory lock makes
/// safe); whether it was renamed.
fn rename_if_free(temp: &Path, path: &Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (from, to) = (c(temp)?, c(path)?);
    // SAFETY: two NUL-terminated paths that live across the call.
    let r =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if r == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => Ok(false),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => match fs::symlink_metadata(path) {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::rename(temp, path).map(|()| true),
            Err(e) => Err(e),
        },
        _ => Err(err),
    }
}

/// Locks on values of stores, held by writes of this process across a read-modify-write (a
/// chunk or shard read, changed and written again), so that two writers of one value, whichever
/// parts of it they change, never lose an update. A write takes the locks of every value it
/// writes (all at once, in a fixed order: two writes of many values never wait on each other in
/// a circle) and holds them until its last value is stored. Between processes the store itself
/// compares the version it read with the file's just before it renames a new one over
/// (`GdsStore::set_many_checked`): a conflict is an error naming the key, never a lost update.
pub struct KeyLocks;

/// What a lock is taken on: a value's file (its store's directory resolved, so two stores of one
/// directory share it), or a key of a store with no files (named by the store's address).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockId {
    /// A value's file.
    File(PathBuf),
    /// A key of the store at this address.
    Key(usize, String),
}

/// The locks a write holds (see [`KeyLocks`]); dropped, they are released.
#[must_use = "the locks are released when this is dropped"]
pub struct KeyLockGuard {
    ids: Vec<LockId>,
}

impl std::fmt::Debug for KeyLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLockGuard").field("locks", &self.ids.len()).finish()
    }
}

static HELD: std::sync::Mutex<Option<std::collections::HashSet<LockId>>> = std::sync::Mutex::new(None);
static RELEASED: std::sync::Condvar = std::sync::Condvar::new();

impl KeyLocks {
    /// Take the locks of `ids` (waiting while another write of this process holds any), in
    /// sorted order. A thread must not take a lock it already holds: it would wait for itself.
    pub fn lock(ids: impl IntoIterator<Item = LockId>) -> KeyLockGuard {
        let mut ids: Vec<LockId> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut held = HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in &ids {
            while held.get_or_insert_with(Default::default).contains(id) {
                held = RELEASED.wait(held).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            held.get_or_insert_with(Default::default).insert(id.clone());
        }
        KeyLockGuard { ids }
    }

    /// Whether a write of this process holds the lock of `id`.
    #[must_use]
    pub fn is_held(id: &LockId) -> bool {
        HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref().is_some_and(|h| h.contains(id))
    }
}

impl Drop for KeyLockGuard {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut held = HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(held) = held.as_mut() {
            for id in &self.ids {
                held.remove(id);
            }
        }
        RELEASED.notify_all();
    }
}

/// `value` with `writes` (offset, bytes) applied, grown with zeros where a write reaches past its
/// end (as a file written at those offsets would be).
pub(crate) fn patched<B: AsRef<[u8]>>(
    mut value: Vec<u8>,
    writes: impl Iterator<Item = (u64, B)>,
) -> std::io::Result<Vec<u8>> {
    for (offset, bytes) in writes {
        let bytes = bytes.as_ref();
        let start = usize::try_from(offset).map_err(|_| std::io::Error::other("an offset past the address space"))?;
        let end = start.checked_add(bytes.len()).ok_or_else(|| std::io::Error::other("a write past 2^64"))?;
        if value.len() < end {
            value.resize(end, 0);
        }
        value[start..end].copy_from_slice(bytes);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_to_a_free_path_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let (temp, path) = (dir.path().join("t"), dir.path().join("v"));
        fs::write(&temp, b"new").unwrap();
        assert!(rename_if_free(&temp, &path).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"new");
        fs::write(&temp, b"newer").unwrap();
        assert!(!rename_if_free(&temp, &path).unwrap(), "a file is there");
        assert_eq!((fs::read(&path).unwrap(), fs::read(&temp).unwrap()), (b"new".to_vec(), b"newer".to_vec()));
        // A batch of new values and of values over files: each lands, in one call.
        let paths: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{}/{i}", i % 2))).collect();
        fs::create_dir_all(dir.path().join("d0")).unwrap();
        fs::write(&paths[2], b"old").unwrap();
        let values: Vec<(PathBuf, &[u8])> = paths.iter().map(|p| (p.clone(), &b"batch"[..])).collect();
        write_many_atomic(&values, &[], Durability::Sync).unwrap();
        assert!(paths.iter().all(|p| fs::read(p).unwrap() == b"batch"));
    }

    #[test]
    fn a_value_replaced_leaves_no_temporary_file_and_errors_keep_the_old_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/c.0");
        for durability in [Durability::Sync, Durability::NoSync] {
            write_atomic(&path, b"first value", durability).unwrap();
            write_atomic(&path, b"second", durability).unwrap();
            assert_eq!(fs::read(&path).unwrap(), b"second");
        }
        let names: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["c.0"], "only the value is left");
        // A path whose directory is a file: an error, and nothing written.
        let blocked = dir.path().join("a/b/c.0/d");
        assert!(write_atomic(&blocked, b"x", Durability::Sync).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"second");
        assert!(is_temp(&temp_path(&path).file_name().unwrap().to_string_lossy()));
        assert!(!is_temp("c.0") && !is_temp("zarr.json"));
    }

    #[test]
    fn many_values_are_written_together_and_a_failure_names_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let values: Vec<(PathBuf, Vec<u8>)> =
            (0..40u8).map(|k| (dir.path().join(format!("c/{}/{k}", k % 3)), vec![k; 1000 + usize::from(k)])).collect();
        for durability in [Durability::Sync, Durability::NoSync] {
            let borrowed: Vec<(PathBuf, &[u8])> = values.iter().map(|(p, v)| (p.clone(), v.as_slice())).collect();
            write_many_atomic(&borrowed, &[], durability).unwrap();
            for (path, value) in &values {
                assert_eq!(&fs::read(path).unwrap(), value);
            }
        }
        let names = |d: &str| fs::read_dir(dir.path().join(d)).unwrap().count();
        assert_eq!((names("c/0"), names("c/1"), names("c/2")), (14, 13, 13), "no temporary file is left");
        // One value whose directory is a file: an error naming it, the others' old values kept
        // (nothing is renamed when a write fails).
        fs::write(dir.path().join("blocker"), b"").unwrap();
        let bad = vec![(values[0].0.clone(), &b"new"[..]), (dir.path().join("blocker/x"), &b"x"[..])];
        let (path, _) = write_many_atomic(&bad, &[], Durability::Sync).unwrap_err();
        assert_eq!(path, dir.path().join("blocker/x"));
        assert_eq!(fs::read(&values[0].0).unwrap(), values[0].1);
        assert_eq!(names("c/0"), 14);
    }

    #[test]
    fn partial_writes_patch_and_grow_a_value() {
        let patched = patched(b"abcdef".to_vec(), [(1, b"XY".to_vec()), (8, b"Z".to_vec())].into_iter()).unwrap();
        assert_eq!(patched, b"aXYdef\0\0Z");
        assert!(super::patched(Vec::new(), [(u64::MAX, b"Z".to_vec())].into_iter()).is_err());
    }
}
