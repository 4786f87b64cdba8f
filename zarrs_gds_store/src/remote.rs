//! [`RemoteStore`]: object stores (S3 and S3-compatible servers, HTTP(S)) and any async zarrs
//! store, read through zarrs' synchronous traits, with many ranged GETs in flight at once for the
//! device reader ([`RemoteStore::fetch_many`]).
//!
//! One tokio runtime serves every remote store of the process: HTTP clients keep pooled
//! connections tied to the runtime that opened them.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{
    ClientConfigKey, GetOptions, GetRange, ObjectStore, ObjectStoreExt, ObjectStoreScheme, RetryConfig,
};
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::{AsyncReadableStorageTraits, Bytes, MaybeBytes, StorageError, StoreKey};

use crate::body_buffers::{self, BodyBuffers};
use crate::http_client::{redirect_refused, Connector, Redirects};
use crate::version::ValueChanged;

mod batches;
mod options;
mod traits;

pub use batches::ValueBatches;

use options::config_error;
pub use options::{object_store_options, redact_url};

/// Ranged GETs a [`RemoteStore`] keeps in flight by default.
pub const DEFAULT_CONCURRENCY: usize = 64;

/// The most bytes of finished response bodies a [`RemoteStore`] keeps for later ones by default
/// ([`RemoteStore::with_kept_body_bytes`]): two of the device pipeline's batches of Z2's values
/// several times over, held in host memory while the store lives.
pub const DEFAULT_KEPT_BODY_BYTES: usize = 512 << 20;

/// The most bytes a read of a whole value (or of all of it from an offset) takes by default
/// ([`RemoteStore::with_max_value_bytes`]): metadata and chunks read whole are far smaller; a
/// server that says or sends more is refused before its body is taken.
pub const DEFAULT_MAX_VALUE_BYTES: u64 = 1 << 30;

/// Retries of a failed request (5xx, timeouts, dropped connections) with exponential backoff, and
/// the time after which a request is no longer retried: a server that dies mid-read is an error
/// within about a minute, never a hang.
const MAX_RETRIES: usize = 3;
const RETRY_TIMEOUT: Duration = Duration::from_mins(1);
/// Per request; object_store's default too (`timeout` in the options sets another).
const REQUEST_TIMEOUT: &str = "30s";
const CONNECT_TIMEOUT: &str = "5s";

/// The process's runtime for remote stores (a few threads: the work is waiting on sockets).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(4, std::num::NonZero::get).clamp(2, 8);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("zarrs-remote")
            .enable_all()
            .build()
            .expect("a tokio runtime for remote stores")
    })
}

/// Run `future` to completion on the remote stores' runtime. From a thread already inside a
/// tokio runtime (where `block_on` would panic) the thread waits for it with the remote runtime
/// entered, so that the requests it spawns run there.
fn block_on<F: Future>(future: F) -> F::Output {
    if tokio::runtime::Handle::try_current().is_ok() {
        let _entered = runtime().enter();
        futures::executor::block_on(future)
    } else {
        runtime().block_on(future)
    }
}

/// What a [`RemoteStore`] reads from.
#[derive(Clone)]
enum Backend {
    /// An object store (its paths relative to the store's root prefix).
    Object(Arc<dyn ObjectStore>),
    /// Any async zarrs store (reads only).
    Async(Arc<dyn AsyncReadableStorageTraits>),
}

/// One ranged read of [`RemoteStore::fetch_many`]: `len` bytes of `key` from `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteRange {
    /// The key.
    pub key: StoreKey,
    /// The first byte.
    pub offset: u64,
    /// How many bytes (a value shorter than `offset + len` is an error).
    pub len: u64,
}

/// An object's identity as [`RemoteStore::stamp`] tells it: a hash of its ETag and version id, its
/// size and its last modification (ns).
pub type ObjectStamp = (u64, u64, i128);

/// A zarrs store over an object store or any async zarrs store: zarrs' synchronous traits (each
/// call waits for its requests, a value's ranges fetched together), and for the device pipeline
/// [`Self::fetch_many`], which keeps many ranged GETs in flight and hands each value over as it
/// arrives.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// let store = zarrs_gds_store::RemoteStore::from_url(
///     "s3://bucket/volume.zarr",
///     [("endpoint", "http://127.0.0.1:9000"), ("region", "us-east-1")],
/// )?;
/// let array = zarrs::array::Array::open(Arc::new(store), "/0")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RemoteStore {
    backend: Backend,
    /// What it reads, for messages: a URL without credentials, or the store's own name.
    name: String,
    concurrency: usize,
    /// The server refused a suffix range: later ones are asked as bounded ranges at once.
    no_suffix: Arc<AtomicBool>,
    /// Where bodies are gathered: memory earlier bodies used, page faults not taken again.
    buffers: BodyBuffers,
    /// The most bytes of a read with no end ([`Self::with_max_value_bytes`]), shared by clones.
    max_value: Arc<AtomicU64>,
}

impl fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The backend is left out: an object store's Debug may show its credentials.
        f.debug_struct("RemoteStore")
            .field("name", &self.name)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for RemoteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl RemoteStore {
    /// A store over `store`, its keys the store's paths.
    #[must_use]
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        let name = store.to_string();
        Self {
            backend: Backend::Object(store),
            name,
            concurrency: DEFAULT_CONCURRENCY,
            no_suffix: Arc::default(),
            buffers: BodyBuffers::new(DEFAULT_KEPT_BODY_BYTES),
            max_value: Arc::new(AtomicU64::new(DEFAULT_MAX_VALUE_BYTES)),
        }
    }

    /// A store over any async zarrs store (reads only: listing and writes are errors).
    #[must_use]
    pub fn from_async(store: Arc<dyn AsyncReadableStorageTraits>, name: impl Into<String>) -> Self {
        Self {
            backend: Backend::Async(store),
            name: name.into(),
            concurrency: DEFAULT_CONCURRENCY,
            no_suffix: Arc::default(),
            buffers: BodyBuffers::new(DEFAULT_KEPT_BODY_BYTES),
            max_value: Arc::new(AtomicU64::new(DEFAULT_MAX_VALUE_BYTES)),
        }
    }

    /// The store a URL names: `s3://bucket/prefix` (S3 and S3-compatible servers: credentials,
    /// region and endpoint from the usual `AWS_*` environment, then `options`) or
    /// `http(s)://host/prefix` (ranged GETs; listing needs WebDAV). `options` are object_store's
    /// configuration keys (`aws_endpoint`, `aws_region`, `aws_access_key_id`, `allow_http`,
    /// `timeout`, ...) or fsspec's (`endpoint_url`, `key`, `secret`, `anon`, ...), and
    /// `max_retries`, `retry_timeout` (seconds), `concurrency` (ranged GETs in flight),
    /// `kept_body_bytes` ([`Self::with_kept_body_bytes`]) and `max_value_bytes`
    /// ([`Self::with_max_value_bytes`]). Plain HTTP needs `allow_http` (or `AWS_ALLOW_HTTP`)
    /// beyond loopback. S3 requests follow redirects within their origin only: a redirect
    /// elsewhere would carry the session token there; HTTP stores, which send no credentials,
    /// follow them to HTTPS or loopback.
    ///
    /// # Errors
    /// Returns an error naming the URL (never its credentials) when it cannot be parsed, its
    /// scheme has no store here, an option is unknown or invalid, or it (or its endpoint) is
    /// plain HTTP beyond loopback without `allow_http`.
    pub fn from_url<K: AsRef<str>, V: AsRef<str>>(
        url: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, StorageError> {
        // The parsers' own messages echo the URL: not shown.
        let parsed = url::Url::parse(url).map_err(|_| config_error(url, "not a URL"))?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(config_error(
                url,
                "credentials in the URL are not used: give them as options (or the AWS_* environment)",
            ));
        }
        let (scheme, prefix) = ObjectStoreScheme::parse(&parsed)
            .map_err(|_| config_error(url, "not an object store URL (s3, http, https)"))?;
        let mut concurrency = DEFAULT_CONCURRENCY;
        let mut kept = DEFAULT_KEPT_BODY_BYTES;
        let mut max_value = DEFAULT_MAX_VALUE_BYTES;
        let mut retry = RetryConfig { max_retries: MAX_RETRIES, retry_timeout: RETRY_TIMEOUT, ..Default::default() };
        let mut settings: Vec<(String, String)> =
            vec![("timeout".into(), REQUEST_TIMEOUT.into()), ("connect_timeout".into(), CONNECT_TIMEOUT.into())];
        for (key, value) in object_store_options(url, options)? {
            match key.as_str() {
                "concurrency" => {
                    concurrency = value.parse().map_err(|_| config_error(url, "concurrency: a count"))?;
                }
                "kept_body_bytes" => {
                    kept = value.parse().map_err(|_| config_error(url, "kept_body_bytes: a byte count"))?;
                }
                "max_value_bytes" => {
                    max_value = value.parse().map_err(|_| config_error(url, "max_value_bytes: a byte count"))?;
                }
                "max_retries" => {
                    retry.max_retries = value.parse().map_err(|_| config_error(url, "max_retries: a count"))?;
                }
                "retry_timeout" => {
                    let secs: f64 = value.parse().map_err(|_| config_error(url, "retry_timeout: seconds"))?;
                    retry.retry_timeout =
                        Duration::try_from_secs_f64(secs).map_err(|_| config_error(url, "retry_timeout: seconds"))?;
                }
                _ => settings.push((key, value)),
            }
        }
        let store: Arc<dyn ObjectStore> = match scheme {
            ObjectStoreScheme::AmazonS3 => {
                let mut builder = AmazonS3Builder::from_env()
                    .with_url(url)
                    .with_retry(retry)
                    .with_http_connector(Connector(Redirects::SameOrigin));
                for (key, value) in settings {
                    let key: AmazonS3ConfigKey =
                        key.parse().map_err(|_| config_error(url, format!("unknown S3 option {key}")))?;
                    builder = builder.with_config(key, value);
                }
                Arc::new(builder.build().map_err(|e| config_error(url, e))?)
            }
            ObjectStoreScheme::Http => {
                let base = &parsed[..url::Position::BeforePath];
                let mut builder = HttpBuilder::new()
                    .with_url(base)
                    .with_retry(retry)
                    .with_http_connector(Connector(Redirects::Anywhere));
                for (key, value) in settings {
                    let key: ClientConfigKey =
                        key.parse().map_err(|_| config_error(url, format!("unknown HTTP option {key}")))?;
                    builder = builder.with_config(key, value);
                }
                Arc::new(builder.build().map_err(|e| config_error(url, e))?)
            }
            other => {
                return Err(config_error(url, format!("{other:?} URLs have no remote store here (s3, http, https)")))
            }
        };
        let prefix = ObjectPath::parse(prefix).map_err(|e| config_error(url, e))?;
        let store: Arc<dyn ObjectStore> =
            if prefix.as_ref().is_empty() { store } else { Arc::new(PrefixStore::new(store, prefix)) };
        let mut remote =
            Self::new(store).with_concurrency(concurrency).with_kept_body_bytes(kept).with_max_value_bytes(max_value);
        remote.name = redact_url(url);
        Ok(remote)
    }

    /// Ranged GETs kept in flight by [`Self::fetch_many`] (at least 1).
    #[must_use]
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The most bytes of finished response bodies kept for later ones (default
    /// [`DEFAULT_KEPT_BODY_BYTES`]; 0: none): a body is gathered into the memory of one dropped
    /// before it, where fresh memory would cost a page fault per 4 KiB on the thread gathering
    /// every body. Held in host memory while the store or a clone of it lives.
    #[must_use]
    pub fn with_kept_body_bytes(mut self, bytes: usize) -> Self {
        self.buffers = BodyBuffers::new(bytes);
        self
    }

    /// The bound set by [`Self::with_kept_body_bytes`].
    #[must_use]
    pub fn kept_body_bytes(&self) -> usize {
        self.buffers.limit()
    }

    /// The most bytes a read of a whole value, or of the rest of one from an offset, takes
    /// (default [`DEFAULT_MAX_VALUE_BYTES`]; the option `max_value_bytes` of [`Self::from_url`]):
    /// a larger value is an error naming its key, its size and this bound, raised before its
    /// body is taken (from the size the server states; a body longer than that is refused as it
    /// arrives). Reads of a range, and [`Self::fetch_values`]' with their own limits, are bounded
    /// by what they ask.
    #[must_use]
    pub fn with_max_value_bytes(self, bytes: u64) -> Self {
        self.set_max_value_bytes(bytes);
        self
    }

    /// [`Self::with_max_value_bytes`] on a store already shared (this store and its clones): a
    /// caller that knows the array's largest encoded chunk and metadata bounds reads by them.
    pub fn set_max_value_bytes(&self, bytes: u64) {
        self.max_value.store(bytes, Ordering::Relaxed);
    }

    /// The bound of [`Self::with_max_value_bytes`].
    #[must_use]
    pub fn max_value_bytes(&self) -> u64 {
        self.max_value.load(Ordering::Relaxed)
    }

    /// An error of `key`'s request, saying why where a redirect was refused.
    fn request_error(&self, key: &StoreKey, e: &object_store::Error) -> StorageError {
        match redirect_refused(e) {
            Some(refused) => StorageError::Other(format!("{}: {key}: {refused}", self.name)),
            None => StorageError::Other(format!("{}: {key}: {e}", self.name)),
        }
    }

    /// An error where a read with no end would take more than [`Self::max_value_bytes`]: the
    /// response's stated range is checked before its body is read.
    fn check_unbounded(&self, key: &StoreKey, result: &object_store::GetResult) -> Result<(), StorageError> {
        let bound = self.max_value_bytes();
        let (range, size) = (&result.range, result.meta.size);
        let len = range.end.saturating_sub(range.start);
        if len <= bound {
            return Ok(());
        }
        let what = if range.start == 0 {
            format!("the value is {size} bytes")
        } else {
            format!("bytes {}.. of the value are {len} bytes", range.start)
        };
        Err(StorageError::Other(format!(
            "{}: {key}: {what}, over the bound of {bound} bytes on reading a value whole (a server's stated \
             size is not taken on trust); if values are meant to be this large, raise the store's option \
             max_value_bytes (RemoteStore::with_max_value_bytes)",
            self.name
        )))
    }

    /// Whether its responses tell each value's whole size ([`Self::fetch_many_sized`]): object
    /// stores' do, async zarrs stores' do not.
    #[must_use]
    pub fn reports_sizes(&self) -> bool {
        matches!(self.backend, Backend::Object(_))
    }

    /// Ranged GETs kept in flight by [`Self::fetch_many`].
    #[must_use]
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn object_path(key: &StoreKey) -> ObjectPath {
        ObjectPath::from(key.as_str())
    }

    /// `range` of `key` (the whole value for `None`), None when the key does not exist.
    async fn get(&self, key: &StoreKey, range: Option<GetRange>) -> Result<MaybeBytes, StorageError> {
        Ok(self.get_sized(key, range).await?.map(|(bytes, _)| bytes))
    }

    /// `range` of `key` (the whole value for `None`) and the whole value's size where the server
    /// said it (object stores do; async zarrs stores do not); None when the key does not exist.
    async fn get_sized(
        &self,
        key: &StoreKey,
        range: Option<GetRange>,
    ) -> Result<Option<(Bytes, Option<u64>)>, StorageError> {
        let error = |e: object_store::Error| self.request_error(key, &e);
        match &self.backend {
            Backend::Object(store) => {
                // A suffix range is one GET where the server takes it (S3 does); where it
                // refuses (HTTP servers without suffix ranges are common) a bounded range from
                // the value's size, and the store remembers not to ask again.
                let range = match range {
                    Some(GetRange::Suffix(n)) => {
                        if !self.no_suffix.load(Ordering::Relaxed) {
                            let options = GetOptions { range: Some(GetRange::Suffix(n)), ..Default::default() };
                            match store.get_opts(&Self::object_path(key), options).await {
                                Ok(result) => {
                                    let size = result.meta.size;
                                    return Ok(Some((self.body(key, result).await?, Some(size))));
                                }
                                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                                Err(_) => self.no_suffix.store(true, Ordering::Relaxed),
                            }
                        }
                        let Some(size) = self.size(key).await? else { return Ok(None) };
                        if size == 0 || n == 0 {
                            return Ok(Some((Bytes::new(), Some(size))));
                        }
                        Some(GetRange::Bounded(size.saturating_sub(n)..size))
                    }
                    other => other,
                };
                // A read with no end takes what the server says: bounded here, and its body
                // then by that size (Self::body).
                let unbounded = matches!(range, None | Some(GetRange::Offset(_)));
                let options = GetOptions { range, ..Default::default() };
                match store.get_opts(&Self::object_path(key), options).await {
                    Ok(result) => {
                        if unbounded {
                            self.check_unbounded(key, &result)?;
                        }
                        let size = result.meta.size;
                        Ok(Some((self.body(key, result).await?, Some(size))))
                    }
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(error(e)),
                }
            }
            Backend::Async(store) => {
                let range = match range {
                    None => ByteRange::FromStart(0, None),
                    Some(GetRange::Bounded(r)) => ByteRange::FromStart(r.start, Some(r.end - r.start)),
                    Some(GetRange::Offset(o)) => ByteRange::FromStart(o, None),
                    Some(GetRange::Suffix(n)) => ByteRange::Suffix(n),
                };
                Ok(store.get_partial(key, range).await?.map(|bytes| (bytes, None)))
            }
        }
    }

    /// A response's body, exactly as long as the range the server says it sends: a body that
    /// runs past it is refused as soon as it does (a hostile server cannot make us take more),
    /// a shorter one at its end.
    async fn body(&self, key: &StoreKey, result: object_store::GetResult) -> Result<Bytes, StorageError> {
        let range = result.range.clone();
        let expected = range.end.saturating_sub(range.start);
        let wrong = |got: u64| {
            StorageError::Other(format!(
                "{}: {key}: the response's body has {got} bytes where its range {}..{} has {expected}",
                self.name, range.start, range.end
            ))
        };
        // A kept buffer where the length is a kept size; else one grown as the bytes come, never
        // more than LARGEST up front (the claimed length is the server's word).
        let claimed = usize::try_from(expected).unwrap_or(usize::MAX);
        let kept = self.buffers.take(claimed);
        let pooled = kept.is_some();
        let mut body = kept.unwrap_or_else(|| Vec::with_capacity(claimed.min(body_buffers::LARGEST)));
        let mut chunks = result.into_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| StorageError::Other(format!("{}: {key}: {e}", self.name)))?;
            let got = body.len() as u64 + chunk.len() as u64;
            if got > expected {
                return Err(wrong(got));
            }
            body.extend_from_slice(&chunk);
        }
        if body.len() as u64 != expected {
            return Err(wrong(body.len() as u64));
        }
        Ok(if pooled { self.buffers.freeze(body) } else { Bytes::from(body) })
    }

    /// `len` bytes of `key` from `offset`, exactly (a shorter value is an error naming the key),
    /// and the whole value's size where the server said it.
    async fn get_exact(
        &self,
        key: &StoreKey,
        offset: u64,
        len: u64,
    ) -> Result<Option<(Bytes, Option<u64>)>, StorageError> {
        if len == 0 {
            // A zero-length range is an error to S3; the value's existence is what is asked.
            return Ok(self.size(key).await?.map(|size| (Bytes::new(), Some(size))));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| StorageError::Other(format!("{key}: bytes {offset} + {len} overflow u64")))?;
        let got = self.get_sized(key, Some(GetRange::Bounded(offset..end))).await?;
        match got {
            Some((bytes, _)) if bytes.len() as u64 != len => Err(StorageError::Other(format!(
                "{}: {key}: bytes {offset}..{end} asked, {} returned (the value is shorter)",
                self.name,
                bytes.len()
            ))),
            other => Ok(other),
        }
    }

    async fn size(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        match &self.backend {
            Backend::Object(store) => match store.head(&Self::object_path(key)).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.request_error(key, &e)),
            },
            Backend::Async(store) => store.size_key(key).await,
        }
    }

    /// Fetch every range with up to [`Self::concurrency`] GETs in flight, calling `each` with the
    /// range's index and its bytes (None: the key does not exist) as each arrives, in whatever
    /// order they complete. Stops at the first error, of a GET or of `each`.
    ///
    /// # Errors
    /// Returns the first failed GET's error (naming its key) or `each`'s.
    pub fn fetch_many<E: From<StorageError>>(
        &self,
        ranges: &[RemoteRange],
        mut each: impl FnMut(usize, Option<Bytes>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.fetch_many_sized(ranges, |i, got| each(i, got.map(|(bytes, _)| bytes)))
    }

    /// [`Self::fetch_many`], each range with its whole value's size where the server said it
    /// (object stores do, in the response's Content-Range; async zarrs stores do not): a caller
    /// that knows what size a value must have checks it without asking first.
    ///
    /// # Errors
    /// As [`Self::fetch_many`].
    pub fn fetch_many_sized<E: From<StorageError>>(
        &self,
        ranges: &[RemoteRange],
        each: impl FnMut(usize, Option<(Bytes, Option<u64>)>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.fetch_many_if_match(ranges, &[], each)
    }

    /// [`Self::fetch_many_sized`], range `i` fetched from the object's version `e_tags[i]` only
    /// (sent as `If-Match`; None, or no entry: any version): an object replaced since its ranges
    /// were planned is a [`ValueChanged`] error naming its key, never another version's bytes.
    ///
    /// # Errors
    /// As [`Self::fetch_many`], and a [`ValueChanged`] error as above.
    pub fn fetch_many_if_match<E: From<StorageError>>(
        &self,
        ranges: &[RemoteRange],
        e_tags: &[Option<Arc<str>>],
        mut each: impl FnMut(usize, Option<(Bytes, Option<u64>)>) -> Result<(), E>,
    ) -> Result<(), E> {
        block_on(async {
            let mut fetched = futures::stream::iter(ranges.iter().enumerate())
                .map(|(i, r)| async move {
                    let e_tag = e_tags.get(i).and_then(Option::as_deref);
                    (i, self.get_exact_if_match(&r.key, r.offset, r.len, e_tag).await)
                })
                .buffer_unordered(self.concurrency);
            while let Some((i, got)) = fetched.next().await {
                each(i, got?)?;
            }
            Ok(())
        })
    }

    /// The size of each key's value (None: missing), asked with many requests in flight.
    ///
    /// # Errors
    /// Returns the first failed request's error.
    pub fn sizes(&self, keys: &[&StoreKey]) -> Result<Vec<Option<u64>>, StorageError> {
        block_on(in_any_order(keys.iter().map(|key| self.size(key)), self.concurrency))
    }

    /// The identity of `key`'s value, as a file's stamp is one: a hash of its ETag, its size and
    /// its last modification (ns); None when it is missing. A cache keyed by it (shard indexes)
    /// sees a rewritten value as another. An async zarrs store tells only the size: its stamp's
    /// modification time is the far future, which such caches never trust.
    ///
    /// # Errors
    /// Returns the request's error, naming the key.
    pub fn stamp(&self, key: &StoreKey) -> Result<Option<ObjectStamp>, StorageError> {
        Ok(self.stamp_and_e_tag(key)?.map(|(stamp, _)| stamp))
    }

    /// [`Self::stamp`] and the object's ETag (None where the server sends none, and for an
    /// async zarrs store), from one HEAD: a reader that plans byte ranges from the object's
    /// bytes (a shard's index) reads them with [`Self::fetch_many_if_match`] from that version.
    ///
    /// # Errors
    /// Returns the request's error, naming the key.
    pub fn stamp_and_e_tag(&self, key: &StoreKey) -> Result<Option<(ObjectStamp, Option<String>)>, StorageError> {
        match &self.backend {
            Backend::Object(store) => match block_on(store.head(&Self::object_path(key))) {
                Ok(meta) => {
                    use std::hash::{Hash, Hasher};
                    let mut hasher = std::collections::hash_map::DefaultHasher::new();
                    (meta.e_tag.as_deref(), meta.version.as_deref()).hash(&mut hasher);
                    let modified = meta.last_modified.timestamp_nanos_opt().map_or(i128::MAX, i128::from);
                    Ok(Some(((hasher.finish(), meta.size, modified), meta.e_tag)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(StorageError::Other(format!("{}: {key}: {e}", self.name))),
            },
            Backend::Async(_) => Ok(block_on(self.size(key))?.map(|size| ((0, size, i128::MAX), None))),
        }
    }

    /// `len` bytes of `key` from `offset` of the object's version `e_tag` (sent as `If-Match`),
    /// None when the key does not exist: an object replaced since is a [`ValueChanged`] error
    /// ([`ValueChanged::in_storage_error`] finds it), as is one removed.
    ///
    /// # Errors
    /// Returns the request's error, naming the key; a [`ValueChanged`] error as above.
    pub fn get_if_match(&self, key: &StoreKey, offset: u64, len: u64, e_tag: &str) -> Result<MaybeBytes, StorageError> {
        Ok(block_on(self.get_exact_if_match(key, offset, len, Some(e_tag)))?.map(|(bytes, _)| bytes))
    }

    /// [`Self::get_exact`] of the object's version `e_tag` where given (an object store's):
    /// sent as `If-Match`, a precondition failure (or the object gone) a [`ValueChanged`] error.
    async fn get_exact_if_match(
        &self,
        key: &StoreKey,
        offset: u64,
        len: u64,
        e_tag: Option<&str>,
    ) -> Result<Option<(Bytes, Option<u64>)>, StorageError> {
        let (Some(e_tag), Backend::Object(store), false) = (e_tag, &self.backend, len == 0) else {
            return self.get_exact(key, offset, len).await;
        };
        let end = offset
            .checked_add(len)
            .ok_or_else(|| StorageError::Other(format!("{key}: bytes {offset} + {len} overflow u64")))?;
        let changed = |reason: String| ValueChanged::new(format!("{}: {key}", self.name), reason).into_storage_error();
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: Some(e_tag.to_owned()),
            ..Default::default()
        };
        match store.get_opts(&Self::object_path(key), options).await {
            Ok(result) => {
                let size = result.meta.size;
                let bytes = self.body(key, result).await?;
                if bytes.len() as u64 != len {
                    return Err(StorageError::Other(format!(
                        "{}: {key}: bytes {offset}..{end} asked, {} returned (the value is shorter)",
                        self.name,
                        bytes.len()
                    )));
                }
                Ok(Some((bytes, Some(size))))
            }
            Err(object_store::Error::Precondition { .. }) => Err(changed(format!("its ETag is no longer {e_tag}"))),
            Err(object_store::Error::NotFound { .. }) => Err(changed("it was removed".into())),
            Err(e) => Err(StorageError::Other(format!("{}: {key}: {e}", self.name))),
        }
    }

    /// Whole values, each of at most its `limit` bytes, with many GETs in flight: per key its
    /// bytes (None: missing). A longer value comes back as its first `limit + 1` bytes, for the
    /// caller to refuse without having taken it whole. One GET each where a size and then the
    /// bytes would take two requests.
    ///
    /// # Errors
    /// Returns the first failed request's error, naming its key.
    pub fn fetch_values(&self, keys: &[(&StoreKey, u64)]) -> Result<Vec<Option<Bytes>>, StorageError> {
        let fetches = keys.iter().map(|&(key, limit)| self.fetch_value(key, limit));
        block_on(in_any_order(fetches, self.concurrency))
    }

    /// `key`'s whole value, at most `limit` bytes and one more (see [`Self::fetch_values`]).
    async fn fetch_value(&self, key: &StoreKey, limit: u64) -> Result<MaybeBytes, StorageError> {
        match &self.backend {
            Backend::Object(_) => self.get(key, Some(GetRange::Bounded(0..limit.saturating_add(1)))).await,
            // zarrs' async stores clamp no ranges: the size first.
            Backend::Async(store) => match self.size(key).await? {
                Some(size) => {
                    store.get_partial(key, ByteRange::FromStart(0, Some(size.min(limit.saturating_add(1))))).await
                }
                None => Ok(None),
            },
        }
    }

    fn object_store(&self, what: &str) -> Result<&Arc<dyn ObjectStore>, StorageError> {
        match &self.backend {
            Backend::Object(store) => Ok(store),
            Backend::Async(_) => {
                Err(StorageError::Unsupported(format!("{what} of {}: a read-only async store", self.name)))
            }
        }
    }
}

/// Run `requests` with up to `concurrency` in flight, each started as soon as any one finishes
/// (not the oldest: one slow response must not hold the rest back), their results in the
/// requests' order. Stops at the first error.
async fn in_any_order<T>(
    requests: impl ExactSizeIterator<Item = impl std::future::Future<Output = Result<T, StorageError>>>,
    concurrency: usize,
) -> Result<Vec<T>, StorageError> {
    let mut out: Vec<Option<T>> = std::iter::repeat_with(|| None).take(requests.len()).collect();
    let mut done = futures::stream::iter(requests.enumerate().map(|(i, request)| async move { (i, request.await) }))
        .buffer_unordered(concurrency);
    while let Some((i, result)) = done.next().await {
        out[i] = Some(result?);
    }
    out.into_iter().map(|v| v.ok_or_else(|| StorageError::Other("a request was never answered".into()))).collect()
}

/// A byte range of zarrs as object_store's (None: the whole value).
fn get_range(range: ByteRange) -> Result<Option<GetRange>, StorageError> {
    Ok(match range {
        ByteRange::FromStart(0, None) => None,
        ByteRange::FromStart(offset, None) => Some(GetRange::Offset(offset)),
        ByteRange::FromStart(offset, Some(len)) => {
            let end = offset
                .checked_add(len)
                .ok_or_else(|| StorageError::Other(format!("bytes {offset} + {len} overflow u64")))?;
            Some(GetRange::Bounded(Range { start: offset, end }))
        }
        ByteRange::Suffix(len) => Some(GetRange::Suffix(len)),
    })
}

/// Ranges of one value closer than this are fetched as one GET (a request costs more than the
/// bytes between them).
const COALESCE_GAP: u64 = 1 << 20;

/// GETs one partial read of zarrs keeps in flight (zarrs reads chunks from many threads at once).
const PARTIAL_CONCURRENCY: usize = 8;

/// Spans to fetch `(offset, len)`, and per range its span and its offset in that span.
type Coalesced = (Vec<(u64, u64)>, Vec<(usize, u64)>);

/// Bounded ranges `(offset, len)` merged into spans whose gaps are at most [`COALESCE_GAP`].
fn coalesce(ranges: &[(u64, u64)]) -> Coalesced {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].0);
    let mut spans: Vec<(u64, u64)> = Vec::new();
    let mut placed = vec![(0, 0); ranges.len()];
    for i in order {
        let (offset, len) = ranges[i];
        let end = offset.saturating_add(len);
        match spans.last_mut() {
            Some((start, span_len)) if offset <= (*start + *span_len).saturating_add(COALESCE_GAP) => {
                *span_len = (*span_len).max(end - *start);
            }
            _ => spans.push((offset, len)),
        }
        let span = spans.len() - 1;
        placed[i] = (span, offset - spans[span].0);
    }
    (spans, placed)
}

impl RemoteStore {
    /// Bounded ranges of `key`, nearby ones fetched together (exact lengths required).
    async fn get_ranges(&self, key: &StoreKey, ranges: &[(u64, u64)]) -> Result<Option<Vec<Bytes>>, StorageError> {
        let (spans, placed) = coalesce(ranges);
        let gets = spans.iter().map(|&(o, n)| async move { Ok(self.get_exact(key, o, n).await?.map(|g| g.0)) });
        let fetched: Vec<MaybeBytes> = in_any_order(gets, PARTIAL_CONCURRENCY).await?;
        let Some(fetched) = fetched.into_iter().collect::<Option<Vec<Bytes>>>() else { return Ok(None) };
        Ok(Some(
            ranges
                .iter()
                .zip(placed)
                .map(|(&(_, len), (span, at))| fetched[span].slice(at as usize..(at + len) as usize))
                .collect(),
        ))
    }
}
