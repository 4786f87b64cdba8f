//! Reads of shards that a writer replaces meanwhile: the index and the inner chunks of one read
//! come from one version of the shard's file, or the read is planned again, or it fails naming
//! the shard; never another inner chunk's bytes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use zarrs::array::codec::ShardingCodecConfiguration;
use zarrs::array::ArraySubset;
use zarrs_gds_store::GdsStore;
use zarrs_storage::{StoreKey, WritableStorageTraits};

use zarrs_gds_store::ValueVersion;

use super::{sharded_units, ShardLevel, ShardSource};
use crate::error::GpuError;
use crate::pipeline::unit::Source;
use crate::pipeline::units::{replanned_once, value_changed};
use crate::reader::{DeviceReadError, HostReadRequest, ReadSource};

/// A shard of 2 x 256 bytes in two inner chunks of 1 x 256, its index at the end.
fn level() -> ShardLevel {
    let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
        "chunk_shape": [1, 256],
        "codecs": [{"name": "bytes"}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end",
    }))
    .unwrap();
    ShardLevel::new(&configuration).unwrap().0
}

/// Inner chunk `k`'s stored bytes in version `v`: its version and index, then bytes of both;
/// inner chunk 0 is longer in odd versions, so that one version's offsets fall on the other's
/// inner chunk 0 or past the end.
fn stored(v: u32, k: u32) -> Vec<u8> {
    let len = if k == 0 && v % 2 == 1 { 600 } else { 300 };
    let mut bytes = [v.to_le_bytes(), k.to_le_bytes()].concat();
    bytes.extend(
        (8..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(v.wrapping_mul(7).wrapping_add(k * 101)) as u8),
    );
    bytes
}

fn shard(level: &ShardLevel, v: u32) -> Vec<u8> {
    let chunks = [stored(v, 0), stored(v, 1)];
    level.encode_shard(&[2, 256], &[Some(&chunks[0]), Some(&chunks[1])]).unwrap().unwrap()
}

/// One read of inner chunk 1 as the pipeline plans and reads it: its shard's index, its unit,
/// its range read from the file (checked against the version its index came from). `between`
/// runs after the plan, before the read.
fn read_inner_chunk_1(
    store: &GdsStore,
    level: &ShardLevel,
    key: &StoreKey,
    between: impl FnOnce(),
) -> Result<Vec<u8>, GpuError> {
    let source = ShardSource { source: ReadSource::Gds(store), cache: None };
    let subset = ArraySubset::new_with_ranges(&[1..2, 0..256]);
    let shards = vec![(vec![0, 0], key.clone(), ArraySubset::new_with_shape(vec![2, 256]))];
    let (units, _) = sharded_units(&source, std::slice::from_ref(level), 1, &subset, shards)?;
    let [unit] = &units[..] else { panic!("{} units", units.len()) };
    let Source::Range { offset, len } = unit.source else { panic!("{:?}", unit.source) };
    assert!(matches!(unit.version, Some(ValueVersion::File(_))), "{:?}", unit.version);
    let (len, version) = (len as usize, unit.version.clone());
    let requests = [HostReadRequest { key: key.clone(), offset, len, at: 0, value_len: None, version }];
    between();
    let files = store.open_for_host(&requests).map_err(DeviceReadError::from)?;
    let mut buf = vec![0u8; len];
    files.read_host(0, 0, &mut buf).map_err(DeviceReadError::from)?;
    Ok(buf)
}

/// A shard replaced between the read of its index and of its inner chunk: the read finds the
/// file's version changed (never the new file's bytes at the old offsets), and planned again it
/// reads the new version's inner chunk.
#[test]
fn a_shard_replaced_after_its_index_was_read_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = GdsStore::new(dir.path()).unwrap();
    let level = level();
    let key = StoreKey::new("c/0/0").unwrap();
    store.set(&key, shard(&level, 0).into()).unwrap();
    let replace = || store.set(&key, shard(&level, 1).into()).unwrap();
    // Version 0's offsets of inner chunk 1 (300..600) fall on version 1's inner chunk 0.
    let err = read_inner_chunk_1(&store, &level, &key, replace).unwrap_err();
    let changed = value_changed(&err).unwrap_or_else(|| panic!("not a change: {err}"));
    assert!(changed.what.ends_with("c/0/0"), "{changed}");
    // Planned again: version 1's inner chunk 1; a change the second time too is an error.
    let mut attempts = 0;
    let got = replanned_once(|| {
        attempts += 1;
        read_inner_chunk_1(&store, &level, &key, || {
            if attempts == 1 {
                store.set(&key, shard(&level, 2).into()).unwrap();
            }
        })
    })
    .unwrap();
    assert_eq!((got, attempts), (stored(2, 1), 2));
    let mut v = 3;
    let err = replanned_once(|| {
        read_inner_chunk_1(&store, &level, &key, || {
            store.set(&key, shard(&level, v).into()).unwrap();
            v += 1;
        })
    })
    .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("c/0/0") && message.contains("replaced while it was read, twice"), "{message}");
    // Removed after its index was read: a change too.
    let remove = || store.erase(&key).unwrap();
    let err = read_inner_chunk_1(&store, &level, &key, remove).unwrap_err();
    assert!(value_changed(&err).is_some_and(|c| c.reason.contains("removed")), "{err}");
}

/// One thread replaces the shard by rename (as every writer of ours and zarr-python's does)
/// while two read inner chunk 1 again and again, each planned again once where the shard
/// changed: every read is inner chunk 1 of some version, or (replaced during both) an error
/// naming the shard. Before reads checked the version, 116 of 16159 reads here returned other
/// bytes (inner chunk 0's, or parts of it) and 132 failed.
#[test]
fn reads_during_shard_replacements_are_one_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(GdsStore::new(dir.path()).unwrap());
    let level = level();
    let key = StoreKey::new("c/0/0").unwrap();
    store.set(&key, shard(&level, 0).into()).unwrap();
    let stop = AtomicBool::new(false);
    let counts = [(); 5].map(|()| AtomicU64::new(0));
    let [reads, wrong, twice, replanned, other] = &counts;
    let first_error = std::sync::Mutex::new(None);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut v = 1;
            while !stop.load(Ordering::Relaxed) {
                store.set(&key, shard(&level, v).into()).unwrap();
                v += 1;
            }
        });
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    reads.fetch_add(1, Ordering::Relaxed);
                    let mut attempts = 0;
                    let got = replanned_once(|| {
                        attempts += 1;
                        read_inner_chunk_1(&store, &level, &key, || {})
                    });
                    if attempts > 1 {
                        replanned.fetch_add(1, Ordering::Relaxed);
                    }
                    match got {
                        Ok(got) => {
                            let v = u32::from_le_bytes(got[..4].try_into().unwrap());
                            if got != stored(v, 1) {
                                wrong.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(err) if value_changed(&err).is_some() && err.to_string().contains("c/0/0") => {
                            twice.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => {
                            other.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().unwrap().get_or_insert(err.to_string());
                        }
                    }
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
    });
    let [reads, wrong, twice, replanned, other] = counts.map(AtomicU64::into_inner);
    eprintln!("{reads} reads: {wrong} wrong, {replanned} planned again, {twice} changed twice, {other} other errors");
    assert_eq!(wrong, 0, "{wrong} of {reads} reads returned other bytes than inner chunk 1");
    assert_eq!(other, 0, "{other} other errors, the first: {:?}", first_error.lock().unwrap());
    assert!(replanned > 0, "no read met a replacement in {reads} reads: the race was not exercised");
    assert!(twice < reads / 10, "{twice} of {reads} reads failed twice");
}

/// A shard rewritten in place with bytes of the same size, its modification time set back
/// (`rsync --inplace -t`, `cp -p`): the cache must not serve its old index. Only the file's
/// status-change time, which userspace cannot set back, tells the two apart; before the cache's
/// stamp held it, the old index was served and the read took inner chunk 0's bytes for 1's.
#[test]
fn the_index_cache_sees_a_rewrite_in_place_that_keeps_size_and_mtime() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let store = GdsStore::new(dir.path()).unwrap();
    let level = level();
    let key = StoreKey::new("c/0/0").unwrap();
    let path = store.key_to_fspath(&key);
    // Two versions of one size: inner chunk 0 of 300 bytes then 1 of 600, and the reverse.
    let version = |first: usize| {
        let chunks = [vec![0xA0u8; first], vec![0xB1u8; 900 - first]];
        level.encode_shard(&[2, 256], &[Some(&chunks[0]), Some(&chunks[1])]).unwrap().unwrap()
    };
    let (old, new) = (version(300), version(600));
    assert_eq!(old.len(), new.len());
    store.set(&key, old.into()).unwrap();
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_hours(1);
    let set_mtime = || {
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_times(std::fs::FileTimes::new().set_modified(an_hour_ago)).unwrap();
    };
    set_mtime();
    // Past the two seconds within which a file's stamp is not trusted (its ctime is now).
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let cache = crate::shard_index_cache::ShardIndexCache::new();
    let source = ShardSource { source: ReadSource::Gds(&store), cache: Some(&cache) };
    let subset = ArraySubset::new_with_ranges(&[1..2, 0..256]);
    let shards = || vec![(vec![0, 0], key.clone(), ArraySubset::new_with_shape(vec![2, 256]))];
    let plan = || {
        let (units, read) = sharded_units(&source, std::slice::from_ref(&level), 1, &subset, shards()).unwrap();
        (units[0].source.clone(), read)
    };
    assert_eq!(plan(), (Source::Range { offset: 300, len: 600 }, 16 * 2 + 4));
    assert_eq!(plan(), (Source::Range { offset: 300, len: 600 }, 0), "served from the cache");
    let before = std::fs::metadata(&path).unwrap();
    // Rewritten in place, the modification time set back.
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all(&new).unwrap();
    drop(file);
    set_mtime();
    let after = std::fs::metadata(&path).unwrap();
    let kept = |m: &std::fs::Metadata| (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec());
    assert_eq!(kept(&before), kept(&after), "the rewrite keeps inode, size and mtime");
    assert_eq!(plan(), (Source::Range { offset: 600, len: 300 }, 16 * 2 + 4), "the new index, read");
}

/// On an object store, the units of a shard carry the ETag its index came from (a HEAD, then
/// the index read with `If-Match`), and their ranges are fetched with it: an object replaced in
/// between is a change, and planned again the read takes the new version's inner chunk.
#[test]
fn remote_inner_chunks_are_fetched_from_the_version_their_index_came_from() {
    use zarrs_gds_store::{RemoteRange, RemoteStore};
    let store = RemoteStore::new(Arc::new(object_store::memory::InMemory::new()));
    let level = level();
    let key = StoreKey::new("c/0/0").unwrap();
    store.set(&key, shard(&level, 0).into()).unwrap();
    let mut attempts = 0;
    let read = |replace: Option<u32>| -> Result<Vec<u8>, GpuError> {
        let source = ShardSource { source: ReadSource::Remote(&store), cache: None };
        let subset = ArraySubset::new_with_ranges(&[1..2, 0..256]);
        let shards = vec![(vec![0, 0], key.clone(), ArraySubset::new_with_shape(vec![2, 256]))];
        let (units, _) = sharded_units(&source, std::slice::from_ref(&level), 1, &subset, shards)?;
        let Source::Range { offset, len } = units[0].source else { panic!("{:?}", units[0].source) };
        let Some(ValueVersion::ETag(e_tag)) = units[0].version.clone() else { panic!("{:?}", units[0].version) };
        if let Some(v) = replace {
            store.set(&key, shard(&level, v).into()).unwrap();
        }
        let mut got = Vec::new();
        let ranges = [RemoteRange { key: key.clone(), offset, len }];
        store.fetch_many_if_match(&ranges, &[Some(e_tag)], |_, bytes| -> Result<(), DeviceReadError> {
            got = bytes.expect("present").0.to_vec();
            Ok(())
        })?;
        Ok(got)
    };
    assert_eq!(read(None).unwrap(), stored(0, 1));
    let err = read(Some(1)).unwrap_err();
    assert!(value_changed(&err).is_some_and(|c| c.what.contains("c/0/0")), "{err}");
    let got = replanned_once(|| {
        attempts += 1;
        read((attempts == 1).then_some(2))
    });
    assert_eq!((got.unwrap(), attempts), (stored(2, 1), 2));
}

/// A nested shard's index comes from the version of the value its outer index came from: a
/// file or object found in another version (replaced between the two reads), or gone, is a
/// change, not an index read from the new one.
#[test]
fn a_nested_index_of_another_version_than_its_outer_index_is_a_change() {
    use zarrs_gds_store::RemoteStore;
    let dir = tempfile::tempdir().unwrap();
    let files = GdsStore::new(dir.path()).unwrap();
    let objects = RemoteStore::new(Arc::new(object_store::memory::InMemory::new()));
    let level = level();
    let key = StoreKey::new("c/0/0").unwrap();
    let nested = |version: Option<ValueVersion>| super::index::ShardRef {
        key: key.clone(),
        base: 0,
        len: Some(shard(&level, 0).len() as u64),
        subset: ArraySubset::new_with_shape(vec![2, 256]),
        origin: vec![0, 0],
        version,
    };
    for source in [ReadSource::Gds(&files), ReadSource::Remote(&objects)] {
        let what = if source.gds().is_some() { "a file" } else { "an object" };
        let write = |v: u32| match source {
            ReadSource::Gds(store) => store.set(&key, shard(&level, v).into()).unwrap(),
            ReadSource::Remote(store) => store.set(&key, shard(&level, v).into()).unwrap(),
            ReadSource::Store(_) => unreachable!(),
        };
        write(0);
        let shards = ShardSource { source, cache: None };
        let read = |version| super::index::read_index(&shards, 1, &level, &nested(version));
        // The version now, as the outer index's read would have carried it.
        let now = read(None).unwrap().unwrap().version;
        let now = match (source, now) {
            (ReadSource::Remote(store), None) => {
                Some(ValueVersion::ETag(store.stamp_and_e_tag(&key).unwrap().unwrap().1.unwrap().into()))
            }
            (_, version) => version,
        };
        assert!(now.is_some(), "a version of {what}");
        assert!(read(now.clone()).unwrap().is_some());
        write(1);
        let err = read(now.clone()).err().expect("an index of another version");
        assert!(value_changed(&err).is_some(), "{what}: {err}");
        assert!(err.to_string().contains("c/0/0"), "{what}: {err}");
    }
}
