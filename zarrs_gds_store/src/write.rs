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
/// passed over).
fn create_temp(path: &Path) -> std::io::Result<(File, PathBuf)> {
    let mut tries = 0;
    loop {
        let temp = temp_path(path);
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && tries < 8 => tries += 1,
            opened => return opened.map(|file| (file, temp)),
        }
    }
}

/// Flush `dir`'s entries (a rename or removal in it) to the disk.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Make `dir` and its missing ancestors; under [`Durability::Sync`] each new directory's entry is
/// flushed in its parent, so that a value flushed inside it is found after a crash too.
pub(crate) fn create_dirs(dir: &Path, durability: Durability) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
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
    Ok(())
}

/// Write `value` to `path` atomically, making its directories as needed. On an error (a full
/// disk, say) the old value, if any, is still there and the temporary file is removed.
pub(crate) fn write_atomic(path: &Path, value: &[u8], durability: Durability) -> std::io::Result<()> {
    write_many_atomic(&[(path.to_path_buf(), value)], durability).map_err(|(_, err)| err)
}

/// Write each of `values` (path, bytes) atomically, flushed as one:
/// every temporary file written and (under [`Durability::Sync`]) flushed in parallel, then renamed
/// into place, then each directory flushed once (one flush per directory rather than one per
/// value). Each value is replaced whole; when the call returns without error every one is durable
/// as `durability` says. The first error is returned, naming its path; values renamed before it
/// keep their new bytes, the others their old ones.
pub(crate) fn write_many_atomic(
    values: &[(PathBuf, &[u8])],
    durability: Durability,
) -> Result<(), (PathBuf, std::io::Error)> {
    use rayon::prelude::*;
    let clean = |temps: &[Option<PathBuf>]| {
        for temp in temps.iter().flatten() {
            let _ = fs::remove_file(temp);
        }
    };
    // Directories first, each once (their entries flushed under Sync).
    let mut dirs: Vec<&Path> = values.iter().filter_map(|(path, _)| path.parent()).collect();
    dirs.sort_unstable();
    dirs.dedup();
    for dir in &dirs {
        // A directory that cannot be made is named by the first value in it.
        let first = || values.iter().find(|(path, _)| path.parent() == Some(*dir)).map(|(path, _)| path.clone());
        create_dirs(dir, durability).map_err(|err| (first().unwrap_or_else(|| dir.to_path_buf()), err))?;
    }
    let written: Vec<Result<PathBuf, (PathBuf, std::io::Error)>> = values
        .par_iter()
        .map(|(path, bytes)| {
            let (mut file, temp) = create_temp(path).map_err(|err| (path.clone(), err))?;
            let mut write = || -> std::io::Result<()> {
                file.write_all(bytes)?;
                if durability == Durability::Sync {
                    file.sync_all()?;
                }
                Ok(())
            };
            match write() {
                Ok(()) => Ok(temp),
                Err(err) => {
                    let _ = fs::remove_file(&temp);
                    Err((path.clone(), err))
                }
            }
        })
        .collect();
    let temps: Vec<Option<PathBuf>> = written.iter().map(|w| w.as_ref().ok().cloned()).collect();
    if let Some(Err(err)) = written.into_iter().find(Result::is_err) {
        clean(&temps);
        return Err(err);
    }
    for (k, ((path, _), temp)) in values.iter().zip(&temps).enumerate() {
        if let Err(err) = fs::rename(temp.as_ref().expect("written"), path) {
            clean(&temps[k..]);
            return Err((path.clone(), err));
        }
    }
    if durability == Durability::Sync {
        dirs.par_iter().try_for_each(|dir| sync_dir(dir).map_err(|err| (dir.to_path_buf(), err)))?;
    }
    Ok(())
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
            write_many_atomic(&borrowed, durability).unwrap();
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
        let (path, _) = write_many_atomic(&bad, Durability::Sync).unwrap_err();
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
