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

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{
    ClientConfigKey, GetOptions, GetRange, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutPayload, RetryConfig,
};
use zarrs_storage::byte_range::{ByteRange, ByteRangeIterator};
use zarrs_storage::{
    AsyncReadableStorageTraits, Bytes, ListableStorageTraits, MaybeBytes, MaybeBytesIterator, OffsetBytesIterator,
    ReadableStorageTraits, StorageError, StoreKey, StoreKeys, StoreKeysPrefixes, StorePrefix, StorePrefixes,
    WritableStorageTraits,
};

use crate::aws_profile::with_profile;
use crate::body_buffers::{self, BodyBuffers};
use crate::http_client::{redirect_refused, Connector, Redirects};
use crate::version::ValueChanged;

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

/// The options of [`RemoteStore::from_url`] for `url` as object_store names and spells them:
/// fsspec's names (`storage_options` of zarr-python and s3fs) translated, Python's booleans
/// lowercased; for S3 URLs an AWS profile's settings from the shared files (`~/.aws/credentials`
/// and `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE`) where neither
/// the options nor the `AWS_*` environment set them, the profile the `profile` option's (its
/// credentials then win over the environment's), else `AWS_PROFILE`'s, else `default` (none with
/// `profile_files=false`: what a client that never reads the files configured); and
/// `allow_http` added where the URL or the endpoint (an option's, a profile's, or for S3 the
/// environment's `AWS_ENDPOINT`/`AWS_ENDPOINT_URL`) is plain HTTP on loopback (127.0.0.0/8, ::1,
/// `localhost`), or where `AWS_ALLOW_HTTP` in the environment says so. Other clients of
/// object_store (obstore) take the result as they are, but for this crate's own `max_retries`,
/// `retry_timeout`, `concurrency`, `kept_body_bytes` and `max_value_bytes`.
///
/// # Errors
/// Returns an error naming the URL (never a secret) when a profile named is in neither file, or
/// would take its credentials from single sign-on, a role or a process (not resolved here); and
/// when the URL or endpoint is plain HTTP to another host than this one without `allow_http`
/// (the option, or `AWS_ALLOW_HTTP=true`): signed headers, a session token and the data would
/// cross the network unencrypted.
pub fn object_store_options<K: AsRef<str>, V: AsRef<str>>(
    url: &str,
    options: impl IntoIterator<Item = (K, V)>,
) -> Result<Vec<(String, String)>, StorageError> {
    let mut out: Vec<(String, String)> =
        options.into_iter().map(|(k, v)| (option_name(k.as_ref()).to_string(), option_value(v.as_ref()))).collect();
    let s3 = url::Url::parse(url)
        .ok()
        .and_then(|u| ObjectStoreScheme::parse(&u).ok())
        .is_some_and(|(scheme, _)| scheme == ObjectStoreScheme::AmazonS3);
    if s3 {
        out = with_profile(out, &|variable| std::env::var(variable).ok()).map_err(|e| config_error(url, e))?;
    }
    // Only S3 has profiles to read.
    out.retain(|(k, _)| !matches!(k.as_str(), "profile_files" | "aws_profile_files"));
    allow_plain_http(url, s3, &mut out, &|variable| std::env::var(variable).ok())?;
    Ok(out)
}

/// `allow_http` in `options` for a plain-HTTP `url` or endpoint: added where every such one is
/// loopback and nothing chose (the option, or `AWS_ALLOW_HTTP` in `env`: then that value); an
/// error naming `allow_http` where one is not loopback and it is not true.
fn allow_plain_http(
    url: &str,
    s3: bool,
    options: &mut Vec<(String, String)>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), StorageError> {
    let is_endpoint = |k: &str| matches!(k, "aws_endpoint" | "endpoint" | "aws_endpoint_url" | "endpoint_url");
    let mut endpoints: Vec<String> = options.iter().filter(|(k, _)| is_endpoint(k)).map(|(_, v)| v.clone()).collect();
    if s3 && endpoints.is_empty() {
        // object_store's from_env takes these where no option gives one.
        endpoints.extend(["AWS_ENDPOINT", "AWS_ENDPOINT_URL"].iter().filter_map(|v| env(v)));
    }
    endpoints.push(url.to_string());
    let plain: Vec<&String> =
        endpoints.iter().filter(|e| e.get(..7).is_some_and(|p| p.eq_ignore_ascii_case("http://"))).collect();
    if plain.is_empty() {
        return Ok(());
    }
    let chosen = options
        .iter()
        .rev()
        .find(|(k, _)| k.trim_start_matches("aws_") == "allow_http")
        .map(|(_, v)| v.clone())
        .or_else(|| env("AWS_ALLOW_HTTP"));
    let allowed =
        chosen.as_deref().is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes" | "y"));
    if let Some(remote) = plain.iter().find(|e| !crate::http_client::is_loopback(e)) {
        if !allowed {
            return Err(config_error(
                url,
                format!(
                    "{} is plain HTTP to another machine: the requests (signed headers, a session token, the \
                     data) would cross the network unencrypted. Use https, or allow it explicitly: the option \
                     allow_http=true, or AWS_ALLOW_HTTP=true in the environment (loopback needs neither)",
                    redact_url(remote)
                ),
            ));
        }
    }
    match chosen {
        // The environment's choice, for clients that do not read it (HTTP stores, obstore).
        Some(value) if !options.iter().any(|(k, _)| k.trim_start_matches("aws_") == "allow_http") => {
            options.push(("allow_http".into(), value));
        }
        Some(_) => {}
        None => options.push(("allow_http".into(), "true".into())),
    }
    Ok(())
}

fn option_name(key: &str) -> &str {
    match key {
        "key" => "aws_access_key_id",
        "secret" => "aws_secret_access_key",
        "token" => "aws_session_token",
        "endpoint_url" => "aws_endpoint",
        "region_name" => "aws_region",
        "anon" => "aws_skip_signature",
        other => other,
    }
}

/// fsspec's booleans (`anon=True` arrives as "True") as object_store parses them.
fn option_value(value: &str) -> String {
    match value {
        "True" => "true".to_string(),
        "False" => "false".to_string(),
        other => other.to_string(),
    }
}

fn config_error(url: &str, what: impl fmt::Display) -> StorageError {
    StorageError::Other(format!("{}: {what}", redact_url(url)))
}

/// `url` without user information, query or fragment (which may carry credentials or
/// signatures), as every message shows a URL. Where the text is not a URL the parser reads
/// unambiguously (a password holding `/`, `?`, `#` or `@` ends the parser's authority early, or
/// makes it refuse the text), everything from the scheme's `//` to the last `@` is shown as
/// `***@`: a password never shows, whatever it holds.
#[must_use]
pub fn redact_url(url: &str) -> String {
    if let Ok(mut parsed) = url::Url::parse(url) {
        // Every `@` was the authority's: none left in the path, query or fragment, which is where
        // a password's `/`, `?` or `#` would have pushed the rest of it.
        let at_after =
            [Some(parsed.path()), parsed.query(), parsed.fragment()].iter().flatten().any(|p| p.contains('@'));
        if parsed.has_host() && !at_after {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.set_query(None);
            parsed.set_fragment(None);
            if parsed.username().is_empty() && parsed.password().is_none() {
                return parsed.to_string();
            }
        }
    }
    // The scheme and its `//` as written, where the text starts with them.
    let head = url
        .find("://")
        .filter(|&end| {
            let scheme = &url[..end];
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
        .map_or(0, |end| end + 3);
    let (marker, rest) = match url[head..].rfind('@') {
        Some(at) => ("***@", &url[head + at + 1..]),
        None => ("", &url[head..]),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    format!("{}{marker}{rest}", &url[..head])
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

    /// [`Self::fetch_values`] of several batches, fetched in the background as one stream of
    /// GETs (at most the store's concurrency in flight, running on into the next batch while the
    /// last GETs of one come back), never more than `ahead` batches beyond the one last taken:
    /// a reader decodes one batch while the next is fetched. Take them in order with
    /// [`ValueBatches::next_batch`]; dropping it stops the GETs.
    pub fn fetch_value_batches(&self, batches: Vec<Vec<(StoreKey, u64)>>, ahead: usize) -> ValueBatches {
        let (senders, receivers): (Vec<_>, Vec<_>) = batches.iter().map(|_| tokio::sync::oneshot::channel()).unzip();
        let taken = Arc::new(tokio::sync::Semaphore::new(ahead.saturating_add(1)));
        let task = runtime().spawn(fetch_batches(self.clone(), batches, senders, Arc::clone(&taken)));
        ValueBatches {
            name: self.name.clone(),
            results: receivers.into_iter().map(Some).collect(),
            next: 0,
            taken,
            task,
        }
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

/// One batch's values from [`RemoteStore::fetch_value_batches`], or the error that stopped them.
type BatchValues = Result<Vec<Option<Bytes>>, StorageError>;

/// Batches of whole values being fetched in the background ([`RemoteStore::fetch_value_batches`]).
pub struct ValueBatches {
    /// The store's name, for messages.
    name: String,
    /// Per batch, where its values arrive (None once taken).
    results: Vec<Option<tokio::sync::oneshot::Receiver<BatchValues>>>,
    next: usize,
    /// A permit per batch the fetch may start: `ahead + 1` at first, one more per batch taken.
    taken: Arc<tokio::sync::Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl ValueBatches {
    /// The next batch's values (per key its bytes, None: missing), waiting for them; None after
    /// the last batch.
    ///
    /// # Errors
    /// The first failed request's error, naming its key: for its batch, and (as a message) for
    /// every batch not complete when it failed.
    pub fn next_batch(&mut self) -> Option<BatchValues> {
        let receiver = self.results.get_mut(self.next)?.take()?;
        self.next += 1;
        let got = block_on(receiver);
        self.taken.add_permits(1);
        Some(got.unwrap_or_else(|_| Err(StorageError::Other(format!("{}: the background fetch stopped", self.name)))))
    }
}

impl Drop for ValueBatches {
    fn drop(&mut self) {
        // A read that ends early (an error, a panic) leaves no GETs running for nothing.
        self.task.abort();
    }
}

impl fmt::Debug for ValueBatches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueBatches").field("name", &self.name).field("next", &self.next).finish_non_exhaustive()
    }
}

/// The task of [`RemoteStore::fetch_value_batches`]: every batch's keys in order through one
/// stream of GETs, batch `k` started once its permit is granted, each batch sent as it completes.
async fn fetch_batches(
    store: RemoteStore,
    batches: Vec<Vec<(StoreKey, u64)>>,
    senders: Vec<tokio::sync::oneshot::Sender<BatchValues>>,
    taken: Arc<tokio::sync::Semaphore>,
) {
    let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
    let mut values: Vec<Vec<Option<Bytes>>> = batches.iter().map(|b| vec![None; b.len()]).collect();
    let mut left: Vec<usize> = batches.iter().map(Vec::len).collect();
    // A batch with no keys is complete before any GET.
    for (k, sender) in senders.iter_mut().enumerate() {
        if left[k] == 0 {
            if let Some(sender) = sender.take() {
                let _ = sender.send(Ok(Vec::new()));
            }
        }
    }
    // Owned keys and shared handles: the task is spawned, so nothing here borrows.
    let concurrency = store.concurrency;
    let store = Arc::new(store);
    let keys = futures::stream::iter(batches.into_iter().enumerate())
        .then(move |(k, batch)| {
            let taken = Arc::clone(&taken);
            async move {
                // Closed only if the semaphore is dropped, which its owner never does first.
                if let Ok(permit) = taken.acquire().await {
                    permit.forget();
                }
                futures::stream::iter(batch.into_iter().enumerate().map(move |(i, (key, limit))| (k, i, key, limit)))
            }
        })
        .flatten();
    // Each GET its own task: bodies are gathered on every worker of the runtime, not all on the
    // one that runs this task (which also serves connections).
    let mut done = std::pin::pin!(keys
        .map(move |(k, i, key, limit)| {
            let store = Arc::clone(&store);
            Spawned(runtime().spawn(async move { (k, i, store.fetch_value(&key, limit).await) }))
        })
        .buffer_unordered(concurrency));
    while let Some((k, i, result)) = done.next().await {
        match result {
            Ok(value) => {
                values[k][i] = value;
                left[k] -= 1;
                if left[k] == 0 {
                    if let Some(sender) = senders[k].take() {
                        let _ = sender.send(Ok(std::mem::take(&mut values[k])));
                    }
                }
            }
            Err(err) => {
                let message = err.to_string();
                if let Some(sender) = senders[k].take() {
                    let _ = sender.send(Err(err));
                }
                for sender in senders.iter_mut().filter_map(Option::take) {
                    let _ =
                        sender.send(Err(StorageError::Other(format!("not fetched after an earlier error: {message}"))));
                }
                return;
            }
        }
    }
}

/// A task spawned on the remote runtime, awaited for its output and aborted when dropped (a
/// stopped fetch leaves no GET running for nothing).
struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Future for Spawned<T> {
    type Output = T;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|joined| match joined {
            Ok(output) => output,
            // Its panic is the awaiting task's; it is never aborted while awaited.
            Err(err) => std::panic::resume_unwind(err.into_panic()),
        })
    }
}

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
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

impl ReadableStorageTraits for RemoteStore {
    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        let ranges: Vec<ByteRange> = byte_ranges.collect();
        let bounded: Option<Vec<(u64, u64)>> = ranges
            .iter()
            .map(|r| match *r {
                ByteRange::FromStart(offset, Some(len)) if len > 0 => Some((offset, len)),
                _ => None,
            })
            .collect();
        let values: Option<Vec<Bytes>> = block_on(async {
            if let Some(bounded) = bounded {
                return self.get_ranges(key, &bounded).await;
            }
            let fetches = ranges.iter().map(|&range| async move {
                match range {
                    ByteRange::FromStart(offset, Some(len)) => Ok(self.get_exact(key, offset, len).await?.map(|g| g.0)),
                    other => self.get(key, get_range(other)?).await,
                }
            });
            let values: Vec<MaybeBytes> = in_any_order(fetches, PARTIAL_CONCURRENCY).await?;
            Ok::<_, StorageError>(values.into_iter().collect())
        })?;
        Ok(values.map(|values| {
            Box::new(values.into_iter().map(Ok)) as Box<dyn Iterator<Item = Result<Bytes, StorageError>> + 'a>
        }))
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        block_on(self.size(key))
    }

    fn supports_get_partial(&self) -> bool {
        true
    }
}

fn store_key(path: &ObjectPath) -> Result<StoreKey, StorageError> {
    StoreKey::new(path.as_ref()).map_err(|e| StorageError::Other(e.to_string()))
}

fn prefix_path(prefix: &StorePrefix) -> Option<ObjectPath> {
    let trimmed = prefix.as_str().trim_end_matches('/');
    (!trimmed.is_empty()).then(|| ObjectPath::from(trimmed))
}

impl ListableStorageTraits for RemoteStore {
    fn list(&self) -> Result<StoreKeys, StorageError> {
        self.list_prefix(&StorePrefix::root())
    }

    fn list_prefix(&self, prefix: &StorePrefix) -> Result<StoreKeys, StorageError> {
        let store = self.object_store("listing")?;
        let error = |e: object_store::Error| StorageError::Other(format!("{}: listing {prefix}: {e}", self.name));
        let metas: Vec<_> = block_on(store.list(prefix_path(prefix).as_ref()).try_collect()).map_err(error)?;
        let mut keys = metas.iter().map(|m| store_key(&m.location)).collect::<Result<Vec<_>, _>>()?;
        keys.sort();
        Ok(keys)
    }

    fn list_dir(&self, prefix: &StorePrefix) -> Result<StoreKeysPrefixes, StorageError> {
        let store = self.object_store("listing")?;
        let error = |e: object_store::Error| StorageError::Other(format!("{}: listing {prefix}: {e}", self.name));
        let listed = block_on(store.list_with_delimiter(prefix_path(prefix).as_ref())).map_err(error)?;
        let mut keys = listed.objects.iter().map(|m| store_key(&m.location)).collect::<Result<Vec<_>, _>>()?;
        let mut prefixes: StorePrefixes = listed
            .common_prefixes
            .iter()
            .map(|p| StorePrefix::new(format!("{p}/")).map_err(|e| StorageError::Other(e.to_string())))
            .collect::<Result<_, _>>()?;
        keys.sort();
        prefixes.sort();
        Ok(StoreKeysPrefixes::new(keys, prefixes))
    }

    fn size_prefix(&self, prefix: &StorePrefix) -> Result<u64, StorageError> {
        let store = self.object_store("listing")?;
        let error = |e: object_store::Error| StorageError::Other(format!("{}: listing {prefix}: {e}", self.name));
        let metas: Vec<_> = block_on(store.list(prefix_path(prefix).as_ref()).try_collect()).map_err(error)?;
        Ok(metas.iter().map(|m| m.size).sum())
    }
}

impl WritableStorageTraits for RemoteStore {
    /// One PUT: object stores replace a value whole, so no reader sees a torn one.
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        let store = self.object_store("writes")?;
        block_on(store.put(&Self::object_path(key), PutPayload::from_bytes(value)))
            .map_err(|e| StorageError::Other(format!("{}: writing {key}: {e}", self.name)))?;
        Ok(())
    }

    fn set_partial_many(&self, key: &StoreKey, offset_values: OffsetBytesIterator) -> Result<(), StorageError> {
        zarrs_storage::store_set_partial_many(self, key, offset_values)
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        let store = self.object_store("writes")?;
        match block_on(store.delete(&Self::object_path(key))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StorageError::Other(format!("{}: erasing {key}: {e}", self.name))),
        }
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        let store = self.object_store("writes")?.clone();
        let error = |e: object_store::Error| StorageError::Other(format!("{}: erasing {prefix}: {e}", self.name));
        block_on(async move {
            let locations = store.list(prefix_path(prefix).as_ref()).map_ok(|m| m.location).boxed();
            store.delete_stream(locations).try_collect::<Vec<_>>().await
        })
        .map_err(error)?;
        Ok(())
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}
