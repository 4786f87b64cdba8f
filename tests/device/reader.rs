//! The device read engine on its own: a GdsStore's files and any zarrs store's values, whole and in
//! parts, missing keys among them, into device memory, and into host memory mirrored to the device.

use cudarc::driver::result;
use zarrs_gpu::zarrs_gds_store::ReadError;
use zarrs_gpu::zarrs_gpu_codecs::reader::{
    DeviceMirror, DeviceReadError, DeviceReadRequest, DeviceReader, HostReadRequest,
};
use zarrs_gpu::{GdsStore, IoBackend, IoPath};
use zarrs_storage::{Bytes, StoreKey, WritableStorageTraits};

use crate::Result;

#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_into_device_memory() -> Result {
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
    // Through the store's files (three ways), through any store's partial reads, and into host
    // memory with each piece mirrored to the device.
    let modes = ["posix", "auto", "posix ordered", "any store", "host mirrored"];
    for mode in modes {
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
        unsafe { result::memset_d8_sync(base, 0xEE, total) }?;
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
                    version: None,
                };
                offset += *len as u64;
                r
            })
            .collect();
        let mut host_read = vec![0u8; total];
        let found = match mode {
            "any store" => {
                let outcome = unsafe { reader.read_store_to_device(&store, &reqs, None) }?;
                assert_eq!(outcome.status.path, IoPath::Staged, "{}", outcome.status);
                outcome.found
            }
            "host mirrored" => {
                let host_reqs: Vec<HostReadRequest> = reqs
                    .iter()
                    .map(|r| HostReadRequest {
                        key: r.key.clone(),
                        offset: r.offset,
                        len: r.len,
                        at: (r.dst - base) as usize,
                        value_len: None,
                        version: None,
                    })
                    .collect();
                let mirror = Some(unsafe { DeviceMirror::new(base, total, &stream) });
                let found = reader.read_gds_to_host(&store, &host_reqs, &mut host_read, mirror)?;
                stream.synchronize()?;
                found
            }
            _ => {
                let backend = if mode == "auto" { IoBackend::Auto } else { IoBackend::Posix };
                // Ordered on a stream: the bytes are there once the stream has run what came before.
                let on = mode.ends_with("ordered").then_some(stream.as_ref());
                let outcome = unsafe { reader.read_gds_to_device(&store, &reqs, Some(backend), on) }?;
                stream.synchronize()?;
                assert_eq!(outcome.status.path, IoPath::Posix, "{}", outcome.status);
                outcome.found
            }
        };
        let mut device = vec![0u8; total];
        unsafe { result::memcpy_dtoh_sync(&mut device, base) }?;
        let mut offset = 0;
        for ((req, want), found) in reqs.iter().zip(&expected).zip(&found) {
            assert_eq!(*found, want.is_some(), "{mode}: {}", req.key);
            if let Some(want) = want {
                assert!(device[offset..offset + req.len] == want[..], "{mode}: {} at {}", req.key, req.offset);
                if mode == "host mirrored" {
                    assert!(host_read[offset..offset + req.len] == want[..], "{mode}: {} on the host", req.key);
                }
            } else {
                assert!(device[offset..offset + req.len].iter().all(|&b| b == 0xEE), "{mode}: missing key written");
            }
            offset += req.len;
        }
        // Past the end: an error naming the file (or the key).
        let bad = [DeviceReadRequest {
            key: files[1].0.clone(),
            offset: 10,
            len: 4095,
            dst: base,
            value_len: None,
            version: None,
        }];
        let err = match mode {
            "any store" => unsafe { reader.read_store_to_device(&store, &bad, None) }.unwrap_err(),
            _ => unsafe { reader.read_gds_to_device(&store, &bad, Some(IoBackend::Posix), None) }.unwrap_err(),
        };
        assert!(
            matches!(err, DeviceReadError::Read(ReadError::PastEnd { .. } | ReadError::Key { .. }))
                && err.to_string().contains("c/1"),
            "{mode}: {err}"
        );
        unsafe { result::free_sync(base) }?;
    }
    // Forced GDS on a host without it: a clear error (or GDS where it works).
    let dst = unsafe { result::malloc_sync(16) }?;
    let reqs = [DeviceReadRequest { key: files[0].0.clone(), offset: 0, len: 1, dst, value_len: None, version: None }];
    match unsafe { reader.read_gds_to_device(&store, &reqs, Some(IoBackend::Gds), None) } {
        Ok(outcome) => assert_eq!(outcome.status.path, IoPath::Gds),
        Err(err) => assert!(err.to_string().contains("GPUDirect Storage"), "{err}"),
    }
    unsafe { result::free_sync(dst) }?;
    Ok(())
}

/// Pinned memory both ways (`ZARRS_GPU_PINNED_PAGES`): a buffer is at least as long as asked
/// (huge pages: whole 2 MiB pages), and bytes written into it go to the device and back through
/// async copies on a stream unchanged.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pinned_buffers_of_either_kind_copy_to_the_device_and_back() -> Result {
    use zarrs_gpu::zarrs_gpu_codecs::reader::PinnedBuffer;
    let reader = DeviceReader::shared(0)?;
    let stream = reader.context().new_stream()?;
    let len = (20 << 20) + 12_345;
    for huge in [false, true] {
        let mut source = PinnedBuffer::with_pages(reader.context(), len, huge)?;
        let mut back = PinnedBuffer::with_pages(reader.context(), len, huge)?;
        assert!(source.len() >= len && back.len() >= len, "huge {huge}: {} bytes for {len}", source.len());
        if huge {
            assert_eq!(source.len() % (2 << 20), 0, "whole huge pages");
        }
        let data: Vec<u8> = (0..len).map(|j| (j * 13 + j / 4093 + usize::from(huge)) as u8).collect();
        source.as_mut_slice()[..len].copy_from_slice(&data);
        back.as_mut_slice().fill(0);
        // SAFETY: a device allocation of len bytes, freed below after the stream is synchronized;
        // the pinned buffers outlive the copies (synchronized before they are read or dropped).
        unsafe {
            let device = result::malloc_sync(len)?;
            result::memcpy_htod_async(device, &source.as_slice()[..len], stream.cu_stream())?;
            result::memcpy_dtoh_async(&mut back.as_mut_slice()[..len], device, stream.cu_stream())?;
            stream.synchronize()?;
            result::free_sync(device)?;
        }
        assert!(back.as_slice()[..len] == data[..], "huge {huge}: the bytes came back changed");
    }
    Ok(())
}
