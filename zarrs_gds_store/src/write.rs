//! Writes that a reader never sees torn: each value goes to a temporary file beside its own, which
//! is then renamed over it (a rename within a directory is atomic on POSIX filesystems), flushed
//! to the disk first where the store's [`Durability`] asks.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a [`GdsStore`](crate::store::GdsStore) write guarantees once it has returned. Either way a
/// value is replaced whole: a reader, or a writer killed mid-write, leaves the old value or the
/// new one, never a mix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// The value's file, then its directory, are flushed to the disk (`fsync`) before the write
    /// returns: a write that returned survives a crash of the machine.
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
/// the process, a counter.
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}{TEMP_SUFFIX}", std::process::id()))
}

/// Write `value` to `path` atomically, making its directories as needed. On an error (a full
/// disk, say) the old value, if any, is still there and the temporary file is removed.
pub(crate) fn write_atomic(path: &Path, value: &[u8], durability: Durability) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("a value's path has no directory"))?;
    fs::create_dir_all(dir)?;
    let temp = temp_path(path);
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).open(&temp)?;
        file.write_all(value)?;
        if durability == Durability::Sync {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&temp, path)?;
        if durability == Durability::Sync {
            // The rename itself is durable once the directory is.
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        // After a failed rename the file is still there; after a failed directory sync, not.
        let _ = fs::remove_file(&temp);
    }
    result
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
    fn partial_writes_patch_and_grow_a_value() {
        let patched = patched(b"abcdef".to_vec(), [(1, b"XY".to_vec()), (8, b"Z".to_vec())].into_iter()).unwrap();
        assert_eq!(patched, b"aXYdef\0\0Z");
        assert!(super::patched(Vec::new(), [(u64::MAX, b"Z".to_vec())].into_iter()).is_err());
    }
}
