//! GdsStore: zarrs' store conformance suite, host reads, and value ranges opened for reads.

use std::error::Error;

use zarrs_gds_store::{Durability, GdsStore, GdsStoreOptions, IoBackend, IoPath, ReadError, ValueRange};
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::{Bytes, ReadableStorageTraits, StoreKey, WritableStorageTraits};

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

#[test]
fn conformance() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    zarrs_storage::store_test::store_write(&store)?;
    zarrs_storage::store_test::store_read(&store)?;
    zarrs_storage::store_test::store_list(&store)?;
    zarrs_storage::store_test::store_list_size(&store)?;
    Ok(())
}

#[test]
fn host_byte_ranges_missing_keys_and_errors() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("a/b/c")?;
    let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    store.set(&key, Bytes::from(data.clone()))?;
    assert_eq!(store.key_to_fspath(&key), dir.path().join("a/b/c"));
    assert_eq!(store.get_partial(&key, ByteRange::FromStart(100, Some(50)))?.unwrap().as_ref(), &data[100..150]);
    assert_eq!(store.get_partial(&key, ByteRange::Suffix(10))?.unwrap().as_ref(), &data[9990..]);
    assert_eq!(store.size_key(&key)?, Some(10_000));
    assert!(store.get(&StoreKey::new("a/missing")?)?.is_none());
    assert!(store.get_partial(&key, ByteRange::FromStart(9_990, Some(20))).is_err(), "read past the end");
    let options = GdsStoreOptions::default().with_backend(IoBackend::Posix);
    let store = GdsStore::new_with_options(dir.path(), options)?;
    assert_eq!(store.options().backend(), IoBackend::Posix);
    assert!(store.last_io_status().is_none());
    Ok(())
}

/// A byte range of a value, as a read names it.
struct Range(StoreKey, u64, usize, Option<u64>);

impl ValueRange for Range {
    fn key(&self) -> &StoreKey {
        &self.0
    }
    fn offset(&self) -> u64 {
        self.1
    }
    fn len(&self) -> usize {
        self.2
    }
    fn value_len(&self) -> Option<u64> {
        self.3
    }
}

#[test]
fn ranges_open_once_read_in_parts_and_refuse_what_does_not_fit() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let (a, b) = (StoreKey::new("c/0")?, StoreKey::new("c/1")?);
    let data: Vec<u8> = (0..100_003u32).map(|i| (i * 7 + i / 253) as u8).collect();
    store.set(&a, Bytes::from(data.clone()))?;
    store.set(&b, Bytes::from(data[..4096].to_vec()))?;
    let ranges = [
        Range(a.clone(), 0, data.len(), Some(data.len() as u64)),
        Range(a.clone(), 17, 50_000, None),
        Range(b.clone(), 1, 4095, None),
        Range(StoreKey::new("c/missing")?, 0, 10, None),
    ];
    let files = store.open_for_host(&ranges)?;
    assert_eq!(files.len(), 4);
    // Parts of a range, at offsets within it.
    let mut buf = vec![0u8; 1000];
    assert!(files.read_host(1, 3000, &mut buf)?);
    assert_eq!(buf, data[17 + 3000..17 + 4000]);
    assert!(files.read_host(2, 4095 - 1000, &mut buf)?);
    assert_eq!(buf, data[4096 - 1000..4096]);
    assert!(!files.read_host(3, 0, &mut buf[..10])?, "a missing key is not found, not an error");
    assert!(!files.is_direct(0), "host reads register nothing with cuFile");
    // Beyond its range (not its file): refused.
    let err = files.read_host(2, 4000, &mut buf).unwrap_err();
    assert!(matches!(err, ReadError::PastEnd { .. }) && err.to_string().contains("c/1"), "{err}");
    // Past a value's end, or a value of the wrong size: refused when opened, naming the file.
    let err = store.open_for_host(&[Range(b.clone(), 10, 4087, None)]).err().expect("past the end");
    assert!(matches!(err, ReadError::PastEnd { .. }) && err.to_string().contains("c/1"), "{err}");
    let err = store.open_for_host(&[Range(b.clone(), 0, 8, Some(8))]).err().expect("wrong size");
    assert!(matches!(err, ReadError::WrongSize { size: 4096, expected: 8, .. }), "{err}");
    let err = store.open_for_host(&[Range(b.clone(), u64::MAX - 2, 8, None)]).err().expect("offset overflow");
    assert!(matches!(err, ReadError::PastEnd { .. }), "{err}");
    Ok(())
}

/// A batch of many files opened together: each range read back as written, missing keys not
/// found, a wrong size among them refused naming its file.
#[test]
fn many_files_open_together_and_read_back() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let value = |i: usize| -> Vec<u8> { (0..1000 + i * 3).map(|j| (i * 31 + j * 7) as u8).collect() };
    let keys: Vec<StoreKey> =
        (0..700).map(|i| StoreKey::new(format!("c/{}/{}", i / 100, i % 100))).collect::<std::result::Result<_, _>>()?;
    for (i, key) in keys.iter().enumerate().filter(|(i, _)| i % 9 != 4) {
        store.set(key, Bytes::from(value(i)))?;
    }
    let ranges: Vec<Range> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| Range(k.clone(), 2, value(i).len() - 2, Some(value(i).len() as u64)))
        .collect();
    let files = store.open_for_host(&ranges)?;
    assert_eq!(files.len(), 700);
    for (i, range) in ranges.iter().enumerate() {
        let mut buf = vec![0u8; range.2];
        let found = files.read_host(i, 0, &mut buf)?;
        assert_eq!(found, i % 9 != 4, "c/{}/{}", i / 100, i % 100);
        if found {
            assert_eq!(buf, value(i)[2..], "c/{}/{}", i / 100, i % 100);
        }
    }
    let mut wrong = ranges;
    wrong[601].3 = Some(5);
    let err = store.open_for_host(&wrong).err().expect("a wrong size");
    assert!(matches!(err, ReadError::WrongSize { expected: 5, .. }) && err.to_string().contains("c/6/1"), "{err}");
    Ok(())
}

/// Bytes `offset..offset + len` of `data`'s rows (`width` every `pitch`) packed: what
/// `read_host_rows` must return.
fn packed_rows(data: &[u8], width: usize, pitch: usize, offset: usize, len: usize) -> Vec<u8> {
    (offset..offset + len).map(|p| data[(p / width) * pitch + p % width]).collect()
}

#[test]
fn rows_of_a_range_read_packed_in_any_piece() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("c/0/0")?;
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 13 + i / 251) as u8).collect();
    store.set(&key, Bytes::from(data.clone()))?;
    // (range start, width, pitch, rows): gaps read and dropped (small and 64 KiB), one gap past
    // that (rows read one by one), no gap, more rows than one preadv takes, one byte wide rows.
    let cases = [
        (100, 784, 1024, 300),
        (7, 1000, 1000 + 65536, 20),
        (3, 40, 70_000, 30),
        (0, 512, 512, 900),
        (11, 96, 1024, 1200),
        (5, 1, 3, 5000),
    ];
    for (start, width, pitch, rows) in cases {
        let span = (rows - 1) * pitch + width;
        let ranges = [Range(key.clone(), start as u64, span, None)];
        let files = store.open_for_host(&ranges)?;
        let range = &data[start..start + span];
        let packed = rows * width;
        // The whole, then pieces that start and end inside rows.
        for (offset, len) in [(0, packed), (width / 2, packed - width / 2), (width + 1, 2 * width + 3), (packed - 1, 1)]
        {
            let mut buf = vec![0xEEu8; len];
            assert!(files.read_host_rows(0, offset as u64, width as u64, pitch as u64, &mut buf)?);
            assert_eq!(buf, packed_rows(range, width, pitch, offset, len), "{width} every {pitch}, {offset}+{len}");
        }
        // One byte past the last row: outside the range.
        let mut buf = vec![0u8; 2];
        let err = files.read_host_rows(0, packed as u64 - 1, width as u64, pitch as u64, &mut buf).unwrap_err();
        assert!(matches!(err, ReadError::PastEnd { .. }) && err.to_string().contains("c/0/0"), "{err}");
    }
    let ranges = [Range(key.clone(), 0, 4096, None), Range(StoreKey::new("c/9/9")?, 0, 10, None)];
    let files = store.open_for_host(&ranges)?;
    let mut buf = vec![0u8; 64];
    assert!(!files.read_host_rows(1, 0, 4, 8, &mut buf[..4])?, "a missing key is not found, not an error");
    for (width, pitch) in [(0, 8), (9, 8)] {
        assert!(files.read_host_rows(0, 0, width, pitch, &mut buf).is_err(), "rows of {width} every {pitch}");
    }
    // Offsets whose rows lie past 2^64: refused, not wrapped; one row of a huge pitch is one row.
    assert!(files.read_host_rows(0, u64::MAX - 8, 4, u64::MAX / 2, &mut buf[..4]).is_err());
    assert!(files.read_host_rows(0, 0, 64, u64::MAX, &mut buf)?);
    assert_eq!(buf, data[..64]);
    Ok(())
}

#[test]
fn device_reads_say_which_path_and_why() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("c/0")?;
    store.set(&key, Bytes::from(vec![7u8; 8192]))?;
    let ranges = [Range(key.clone(), 0, 8192, None)];
    let posix = store.open_for_device(&ranges, Some(IoBackend::Posix))?;
    assert_eq!(posix.status().path, IoPath::Posix);
    assert!(posix.status().reason.contains("posix backend requested"), "{}", posix.status());
    assert!(!posix.is_direct(0));
    assert_eq!(store.last_io_status().map(|s| s.path), Some(IoPath::Posix));
    // Auto: native GDS where cuFile registers the file; here (no nvidia-fs) the pread path, with
    // the reason.
    let auto = store.open_for_device(&ranges, Some(IoBackend::Auto))?;
    match auto.status().path {
        IoPath::Gds => assert!(auto.is_direct(0)),
        _ => assert!(!auto.status().reason.is_empty() && !auto.is_direct(0), "{}", auto.status()),
    }
    // Forced GDS: native GDS where it works, else an error that says so.
    match store.open_for_device(&ranges, Some(IoBackend::Gds)) {
        Ok(gds) => assert!(gds.status().path == IoPath::Gds && gds.is_direct(0)),
        Err(err) => assert!(err.to_string().contains("GPUDirect Storage"), "{err}"),
    }
    Ok(())
}

/// `pread_reason` decides as `open_for_device` does: a forced `Gds` backend never says "pread"
/// (a read that uses it must be an error where GDS is not usable), `Posix` always does, and
/// wherever it says pread, a device open takes the pread path.
#[test]
fn pread_reason_agrees_with_the_device_open() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("c/0")?;
    store.set(&key, Bytes::from(vec![7u8; 4096]))?;
    let ranges = [Range(key, 0, 4096, Some(4096))];
    assert_eq!(store.pread_reason(Some(IoBackend::Posix))?.as_deref(), Some("posix backend requested"));
    match store.pread_reason(Some(IoBackend::Gds)) {
        Ok(reason) => assert_eq!(reason, None, "forced GDS must not be read with preads"),
        Err(err) => assert!(matches!(err, ReadError::GdsUnavailable(_)), "{err}"),
    }
    for backend in [IoBackend::Auto, IoBackend::Posix, IoBackend::Gds] {
        let Ok(reason) = store.pread_reason(Some(backend)) else { continue };
        let path = store.open_for_device(&ranges, Some(backend)).map(|r| r.status().path);
        if reason.is_some() {
            assert_eq!(path.ok(), Some(IoPath::Posix), "{backend}: {reason:?}");
        } else {
            assert!(!matches!(path, Ok(IoPath::Posix)), "{backend}: native GDS expected, {path:?}");
        }
    }
    Ok(())
}

/// The environment variable that makes [`writer_child`] write (its directory: the store in
/// `store/`, a file `started` once the first value is written).
const CHILD_DIR_ENV: &str = "ZARRS_GDS_TEST_WRITER_DIR";

/// Two values of 8 MiB, each one byte repeated: a torn value would hold both.
fn whole_value(k: usize) -> Vec<u8> {
    vec![if k.is_multiple_of(2) { 0xAA } else { 0x55 }; 8 << 20]
}

/// The child of [`a_writer_killed_mid_write_leaves_the_old_or_the_new_value`]: writes the two
/// values to one key, in turn, until it is killed.
#[test]
#[ignore = "the child process of the kill test, which runs it with --ignored"]
fn writer_child() -> Result {
    let dir = std::env::var(CHILD_DIR_ENV).map_err(|_| format!("{CHILD_DIR_ENV} is not set: run by the kill test"))?;
    let options = GdsStoreOptions::default().with_durability(Durability::NoSync);
    let store = GdsStore::new_with_options(std::path::Path::new(&dir).join("store"), options)?;
    let key = StoreKey::new("c/0/0")?;
    for k in 0.. {
        store.set(&key, Bytes::from(whole_value(k)))?;
        if k == 0 {
            std::fs::write(std::path::Path::new(&dir).join("started"), b"")?;
        }
    }
    Ok(())
}

#[test]
fn a_writer_killed_mid_write_leaves_the_old_or_the_new_value() -> Result {
    let dir = tempfile::tempdir()?;
    for round in 0..6 {
        let _ = std::fs::remove_file(dir.path().join("started"));
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["writer_child", "--exact", "--ignored", "--quiet"])
            .env(CHILD_DIR_ENV, dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let start = std::time::Instant::now();
        while !dir.path().join("started").exists() {
            assert!(start.elapsed().as_secs() < 30, "the writer never started");
            assert!(child.try_wait()?.is_none(), "the writer ended early");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Killed somewhere in a write: a few milliseconds in, at a different place each round.
        std::thread::sleep(std::time::Duration::from_millis(3 + 7 * round));
        child.kill()?; // SIGKILL
        child.wait()?;
        let store = GdsStore::new(dir.path().join("store"))?;
        let key = StoreKey::new("c/0/0")?;
        let value = store.get(&key)?.ok_or("the value is gone")?;
        assert!(
            value.as_ref() == whole_value(0).as_slice() || value.as_ref() == whole_value(1).as_slice(),
            "round {round}: a torn value of {} bytes",
            value.len()
        );
        // A write cut short may leave its temporary file, which is no key of the store.
        let keys = zarrs_storage::ListableStorageTraits::list(&store)?;
        assert_eq!(keys, [key], "round {round}");
    }
    Ok(())
}

#[test]
fn partial_writes_rewrite_the_whole_value_and_errors_name_the_key() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    assert!(!store.supports_set_partial(), "zarrs writes whole shards: each replaced atomically");
    let key = StoreKey::new("s/0")?;
    store.set(&key, Bytes::from_static(b"0123456789"))?;
    let writes = vec![(2, Bytes::from_static(b"ab")), (12, Bytes::from_static(b"z"))];
    store.set_partial_many(&key, Box::new(writes.into_iter()))?;
    assert_eq!(store.get(&key)?.unwrap().as_ref(), b"01ab456789\0\0z");
    // A key whose directory is a file: the error names the key and its path, the value is kept.
    let blocked = StoreKey::new("s/0/inner")?;
    let err = store.set(&blocked, Bytes::from_static(b"x")).unwrap_err().to_string();
    assert!(err.contains("s/0/inner") && err.contains(&dir.path().display().to_string()), "{err}");
    assert_eq!(store.get(&key)?.unwrap().as_ref(), b"01ab456789\0\0z");
    assert_eq!(store.options().durability(), Durability::Sync, "flushed before a write returns, by default");
    Ok(())
}

/// The environment variable that makes [`failing_writer_child`] write (its store's directory).
const FAILING_DIR_ENV: &str = "ZARRS_GDS_TEST_FAILING_DIR";

/// The child of [`a_write_that_fails_for_want_of_space_keeps_the_old_value`]: under a file size
/// limit of 1 MiB (what a full disk does to a write, as far as the write sees), it replaces a
/// small value with 4 MiB, and prints the error.
#[test]
#[ignore = "the child process of the failed-write test, which runs it with --ignored"]
fn failing_writer_child() -> Result {
    let dir = std::env::var(FAILING_DIR_ENV).map_err(|_| format!("{FAILING_DIR_ENV} is not set: run by its parent"))?;
    // SAFETY: plain libc calls on this process: SIGXFSZ ignored (a write past the limit then
    // fails with EFBIG instead of killing the process), then the limit set.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limit = libc::rlimit { rlim_cur: 1 << 20, rlim_max: 1 << 20 };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &raw const limit), 0);
    }
    let store = GdsStore::new(&dir)?;
    let err = store.set(&StoreKey::new("c/0/1")?, Bytes::from(vec![7u8; 4 << 20])).unwrap_err();
    println!("WRITE ERROR: {err}");
    Ok(())
}

#[test]
fn a_write_that_fails_for_want_of_space_keeps_the_old_value() -> Result {
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let key = StoreKey::new("c/0/1")?;
    store.set(&key, Bytes::from_static(b"the old value"))?;
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["failing_writer_child", "--exact", "--ignored", "--nocapture", "--quiet"])
        .env(FAILING_DIR_ENV, dir.path())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("WRITE ERROR: ")).ok_or_else(|| format!("no error: {stdout}"))?;
    assert!(line.contains("c/0/1") && line.contains(&dir.path().display().to_string()), "{line}");
    assert_eq!(store.get(&key)?.unwrap().as_ref(), b"the old value");
    let names: Vec<_> =
        std::fs::read_dir(dir.path().join("c/0"))?.map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<_>>()?;
    assert_eq!(names, ["1"], "the temporary file of the failed write is gone");
    Ok(())
}

#[test]
fn writers_of_different_keys_at_once_all_land() -> Result {
    let dir = tempfile::tempdir()?;
    let store = std::sync::Arc::new(GdsStore::new_with_options(
        dir.path(),
        GdsStoreOptions::default().with_durability(Durability::NoSync),
    )?);
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || -> std::result::Result<(), String> {
                for k in 0..40u8 {
                    let key = StoreKey::new(format!("c/{t}/{k}")).map_err(|e| e.to_string())?;
                    store.set(&key, Bytes::from(vec![t ^ k; 3000])).map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        thread.join().map_err(|_| "a writer panicked")??;
    }
    let keys = zarrs_storage::ListableStorageTraits::list(store.as_ref())?;
    assert_eq!(keys.len(), 8 * 40);
    for t in 0..8u8 {
        for k in 0..40u8 {
            let value = store.get(&StoreKey::new(format!("c/{t}/{k}"))?)?.unwrap();
            assert!(value.iter().all(|&b| b == t ^ k) && value.len() == 3000);
        }
    }
    Ok(())
}

/// How many of the file's pages are in the page cache (mincore of a mapping).
fn resident_pages(path: &std::path::Path) -> Result<(usize, usize)> {
    use std::os::unix::io::AsRawFd;
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len() as usize;
    // SAFETY: a read-only shared mapping of an open file, unmapped below; mincore writes one byte
    // per page into a vector of that many.
    unsafe {
        let map = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
        assert_ne!(map, libc::MAP_FAILED);
        let pages = len.div_ceil(4096);
        let mut flags = vec![0u8; pages];
        let rc = libc::mincore(map, len, flags.as_mut_ptr());
        libc::munmap(map, len);
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        Ok((flags.iter().filter(|&&f| f & 1 == 1).count(), pages))
    }
}

#[test]
fn advised_values_come_into_the_page_cache_and_read_the_same() -> Result {
    use std::os::unix::io::AsRawFd;
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let keys: Vec<StoreKey> = (0..4).map(|i| StoreKey::new(format!("c/{i}"))).collect::<std::result::Result<_, _>>()?;
    for key in &keys {
        store.set(key, Bytes::from(data.clone()))?;
    }
    // Out of the page cache (where the filesystem lets clean pages go: not tmpfs).
    for key in &keys {
        let file = std::fs::File::open(store.key_to_fspath(key))?;
        file.sync_all()?;
        // SAFETY: a valid descriptor; advice only.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let evicted = resident_pages(&store.key_to_fspath(&keys[0]))?;
    // Advice for whole values, one range and a key with no value: returns at once.
    let missing = StoreKey::new("c/none")?;
    store.advise_will_need([(&keys[0], 0, 0), (&keys[1], 0, 0), (&keys[2], 1 << 20, 1 << 20), (&missing, 0, 0)]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while resident_pages(&store.key_to_fspath(&keys[0]))?.0 < evicted.1 {
        assert!(std::time::Instant::now() < deadline, "advised pages did not come in: {evicted:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for key in &keys {
        assert_eq!(store.get(key)?.unwrap().as_ref(), &data[..]);
    }
    assert!(store.get(&missing)?.is_none());
    Ok(())
}
