//! The caller's cache of decoded shard indexes ([`ShardIndexCache`]), which reads take from a
//! configuration (`GpuConfig::with_shard_index_cache`) and the pipeline's shard walk fills.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use zarrs_gds_store::{FileVersion, ValueVersion};
use zarrs_storage::{ReadableStorageTraits, StoreKey};

/// Decoded shard indexes kept between device reads, owned by the caller (like zarrs'
/// `ArrayShardedReadableExtCache`) and given to reads with
/// [`GpuConfig::with_shard_index_cache`](crate::GpuConfig::with_shard_index_cache); dropped
/// with the last handle. It serves one store at a time: it holds that store (so no other can
/// take its address), and a read of another store empties it first. Entries are keyed by the
/// shard's nesting level, key, where the shard starts in it, its length and its index shape; at
/// most 65536 are kept. On a `GdsStore`, an entry serves only while its shard file is the same
/// (device, inode, size, modification and status-change times, asked on every read): a shard
/// replaced, or rewritten in place (also by `rsync --inplace -t` or `cp -p`, which set the
/// modification time back: the status-change time cannot be set back), is read again. Files
/// changed in the last two seconds are not cached at all, since a rewrite of the same size within
/// one tick of the file system's clock would keep every time (the rule git applies to its
/// index). On a `RemoteStore` the same holds with the object's ETag, size and
/// modification time from a HEAD on every read (an async zarrs store behind one, which tells
/// only sizes, is never served from the cache). Other stores tell no version of a value, so
/// their indexes are never served from the cache (a rewritten shard's old index could be).
#[derive(Default)]
pub struct ShardIndexCache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    /// The store served (its address, and a handle that keeps it alive).
    store: Option<(usize, Box<dyn std::any::Any + Send + Sync>)>,
    indexes: HashMap<CacheKey, CachedIndex>,
}

/// A shard's nesting level (0 outermost), its key, where it starts in that value, its length
/// (None for a whole value) and its inner chunks per dimension. An outer shard and the first
/// shard nested in it can share everything but the level and the length.
pub(crate) type CacheKey = (usize, StoreKey, u64, Option<u64>, Vec<NonZeroU64>);
/// A decoded index, the shard's length where known, and the identity of the value it was read
/// from (`GdsStore` files, object stores: an index is used again only while its value is the
/// same).
pub(crate) type CachedIndex = (Arc<Vec<u64>>, Option<u64>, Option<Stamp>);

/// A value's identity and version, as read with its shard's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// A `GdsStore` file: its version (device, inode, size, modification and status-change
    /// times), its size, and when it last changed (the later of the two times, ns). A file
    /// replaced (as zarr-python writes shards) or rewritten changes it.
    File { version: FileVersion, size: u64, changed_ns: i128 },
    /// An object, from a HEAD: a hash of its ETag and version id, its size and last modification
    /// (ns), and its ETag where the server sent one.
    Object { id: (u64, u64, i128), e_tag: Option<Arc<str>> },
}

impl Stamp {
    /// The stamp of the file `meta` describes (from `fstat` of the descriptor read from).
    pub(crate) fn of_file(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        let changed_ns = ns(meta.mtime(), meta.mtime_nsec()).max(ns(meta.ctime(), meta.ctime_nsec()));
        Self::File { version: FileVersion::of(meta), size: meta.len(), changed_ns }
    }

    /// The value's size.
    pub(crate) fn size(&self) -> u64 {
        match self {
            Self::File { size, .. } => *size,
            Self::Object { id, .. } => id.1,
        }
    }

    /// What a read of the value's bytes at offsets from its index is checked against: the file's
    /// version, or the object's ETag (None where the server sends none).
    pub(crate) fn version(&self) -> Option<ValueVersion> {
        match self {
            Self::File { version, .. } => Some(ValueVersion::File(*version)),
            Self::Object { e_tag, .. } => e_tag.clone().map(ValueVersion::ETag),
        }
    }

    /// When the value last changed (ns).
    fn changed_ns(&self) -> i128 {
        match self {
            Self::File { changed_ns, .. } => *changed_ns,
            Self::Object { id, .. } => id.2,
        }
    }
}

/// Indexes kept at most (beyond that the cache starts over): 64 inner chunks take 1 KiB.
const INDEX_CACHE_ENTRIES: usize = 1 << 16;

/// How long after its last modification a file's stamp is trusted: a rewrite within the same
/// tick of the file system's clock (coarse on some file systems, 2 s on FAT) leaves inode, size
/// and modification time unchanged, so the index of a file this young is never cached.
const RACY_NS: i128 = 2_000_000_000;

/// Whether a value of this stamp last changed long enough ago for the stamp to identify its
/// contents (a time in the future does not).
pub(crate) fn settled(stamp: &Stamp, now: std::time::SystemTime) -> bool {
    let now = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
    stamp.changed_ns().saturating_add(RACY_NS) < now
}

impl std::fmt::Debug for ShardIndexCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardIndexCache").field("len", &self.len()).finish_non_exhaustive()
    }
}

impl ShardIndexCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Indexes held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().indexes.len()
    }

    /// Whether it holds none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every index (and the store).
    pub fn clear(&self) {
        *self.lock() = CacheInner::default();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serve `store` from now on: another store's indexes are dropped first.
    pub(crate) fn bind<S: ReadableStorageTraits + ?Sized + 'static>(&self, store: &Arc<S>) {
        let address = Arc::as_ptr(store).cast::<()>() as usize;
        let mut inner = self.lock();
        if inner.store.as_ref().is_none_or(|(held, _)| *held != address) {
            inner.indexes.clear();
            inner.store = Some((address, Box::new(store.clone())));
        }
    }

    /// Forget the indexes of the values at `keys` (a device write replaced or erased them).
    pub(crate) fn forget(&self, keys: &std::collections::HashSet<&StoreKey>) {
        self.lock().indexes.retain(|(_, key, ..), _| !keys.contains(key));
    }

    pub(crate) fn get(&self, key: &CacheKey) -> Option<CachedIndex> {
        self.lock().indexes.get(key).cloned()
    }

    pub(crate) fn insert(&self, key: CacheKey, index: Arc<Vec<u64>>, shard_len: Option<u64>, stamp: Option<Stamp>) {
        let mut inner = self.lock();
        if inner.indexes.len() >= INDEX_CACHE_ENTRIES {
            inner.indexes.clear();
        }
        inner.indexes.insert(key, (index, shard_len, stamp));
    }
}
