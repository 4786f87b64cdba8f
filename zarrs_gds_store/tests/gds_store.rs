//! GdsStore: zarrs' store conformance suite, host reads, and reads into device memory.

use std::error::Error;

use zarrs_gds_store::{DeviceReadError, DeviceReadRequest, DeviceReader, GdsStore, GdsStoreOptions, IoBackend, IoPath};
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

#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_into_device_memory() -> Result {
    use zarrs_gds_store::cudarc::driver::result;
    let dir = tempfile::tempdir()?;
    let store = GdsStore::new(dir.path())?;
    let sizes = [1usize, 4095, 4096, 1 << 20, (9 << 20) + 17];
    let mut files = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..n).map(|j| (j * 31 + i * 7 + j / 251) as u8).collect();
        let key = StoreKey::new(format!("c/{i}"))?;
        store.set(&key, Bytes::from(data.clone()))?;
        files.push((key, data));
    }
    let reader = DeviceReader::shared(0)?;
    let stream = reader.context().new_stream()?;
    for (backend, ordered) in [(IoBackend::Posix, false), (IoBackend::Auto, false), (IoBackend::Posix, true)] {
        // Whole values, partial ranges at odd offsets, and a missing key, all in one batch.
        let mut requests = Vec::new();
        let mut expected: Vec<Option<Vec<u8>>> = Vec::new();
        for (key, data) in &files {
            requests.push((key.clone(), 0u64, data.len()));
            expected.push(Some(data.clone()));
            if data.len() > 10 {
                let (a, b) = (3, data.len() - 5);
                requests.push((key.clone(), a as u64, b - a));
                expected.push(Some(data[a..b].to_vec()));
            }
        }
        requests.push((StoreKey::new("c/none")?, 0, 100));
        expected.push(None);
        let total: usize = requests.iter().map(|r| r.2).sum();
        reader.context().bind_to_thread()?;
        let base = unsafe { result::malloc_sync(total) }?;
        let mut offset = 0u64;
        let reqs: Vec<DeviceReadRequest> = requests
            .iter()
            .map(|(key, start, len)| {
                let r = DeviceReadRequest {
                    key: key.clone(),
                    offset: *start,
                    len: *len,
                    dst: base + offset,
                    value_len: None,
                };
                offset += *len as u64;
                r
            })
            .collect();
        // Ordered on a stream: the bytes are there once the stream has run what came before.
        let on = ordered.then_some(stream.as_ref());
        let outcome = unsafe { store.read_to_device(&reader, &reqs, Some(backend), on) }?;
        stream.synchronize()?;
        assert_eq!(outcome.status.path, IoPath::Posix, "{}", outcome.status);
        let mut host = vec![0u8; total];
        unsafe { result::memcpy_dtoh_sync(&mut host, base) }?;
        let mut offset = 0;
        for ((req, want), found) in reqs.iter().zip(&expected).zip(&outcome.found) {
            assert_eq!(*found, want.is_some(), "{}", req.key);
            if let Some(want) = want {
                assert!(host[offset..offset + req.len] == want[..], "{} at {}", req.key, req.offset);
            }
            offset += req.len;
        }
        // Past the end: an error naming the file.
        let bad = [DeviceReadRequest { key: files[1].0.clone(), offset: 10, len: 4095, dst: base, value_len: None }];
        let err = unsafe { store.read_to_device(&reader, &bad, Some(backend), None) }.unwrap_err();
        assert!(matches!(err, DeviceReadError::PastEnd { .. }) && err.to_string().contains("c/1"), "{err}");
        unsafe { result::free_sync(base) }?;
    }
    // Forced GDS on a host without it: a clear error (or GDS where it works).
    let dst = unsafe { result::malloc_sync(16) }?;
    let reqs = [DeviceReadRequest { key: files[0].0.clone(), offset: 0, len: 1, dst, value_len: None }];
    match unsafe { store.read_to_device(&reader, &reqs, Some(IoBackend::Gds), None) } {
        Ok(outcome) => assert_eq!(outcome.status.path, IoPath::Gds),
        Err(err) => assert!(err.to_string().contains("GPUDirect Storage"), "{err}"),
    }
    unsafe { result::free_sync(dst) }?;
    Ok(())
}
