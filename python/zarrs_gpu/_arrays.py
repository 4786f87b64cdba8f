"""zarrs_gpu arrays kept open per process while their metadata is unchanged: opening one reads and
parses its metadata and loses its shard index cache, and an array rewritten in place (another
fill value, data type, codec or shape) must be opened again, or its chunks would be read with the
old metadata. Used by the zarr-python pipeline and by ``zarrs_gpu.dask`` (and so the xarray
engine)."""

import json
import os
import threading
import time

import zarrs_gpu

#: URL schemes of object stores (zarrs_gpu.open takes them with storage_options).
_URL_SCHEMES = ("s3://", "s3a://", "http://", "https://")


def is_url(store) -> bool:
    """Whether `store` is an object store's URL rather than a path."""
    return isinstance(store, str) and store.lower().startswith(_URL_SCHEMES)


class RemoteLocation:
    """An object store's URL with its ``storage_options``, as Dask tasks and datasets carry a
    store: picklable, hashable, and shown by its URL only (the options hold credentials)."""

    __slots__ = ("url", "_key")

    def __init__(self, url, storage_options=None):
        self.url = url
        # The options as JSON gives them back (keys text, other values by str): the identity.
        options = json.loads(json.dumps(dict(storage_options or {}), default=str))
        self._key = (url, json.dumps(options, sort_keys=True))

    @property
    def storage_options(self):
        """A copy of the options (the location's identity is fixed when it is made)."""
        return json.loads(self._key[1])

    @property
    def shown(self):
        """The URL without user, password, query or fragment, as messages show it (the Rust
        side's rule)."""
        from ._zarrs_gpu import _redact_url

        return _redact_url(self.url)

    def __eq__(self, other):
        return isinstance(other, RemoteLocation) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"RemoteLocation({self.shown!r})"

    __str__ = __repr__

    def __reduce__(self):
        return (RemoteLocation, (self.url, self.storage_options))

    def __dask_tokenize__(self):
        return ("zarrs_gpu.RemoteLocation",) + self._key


def location(store, storage_options=None, caller="zarrs_gpu"):
    """Where a store is, as tasks carry it: a RemoteLocation for an object store's URL, else the
    directory's absolute path (which takes no storage_options)."""
    if isinstance(store, RemoteLocation):
        return store
    if is_url(store):
        return RemoteLocation(store, storage_options)
    if storage_options:
        raise ValueError(f"{caller}: storage_options are for object store URLs (s3://, http(s)://), not {store!r}")
    return os.path.abspath(os.fspath(store))


#: object_store's client options (obstore takes them apart from a store's own configuration).
_CLIENT_OPTIONS = {
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http2_only",
    "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
    "timeout", "user_agent", "randomize_addresses",
}
#: zarrs_gpu's own options, which obstore does not take.
_OURS = {"max_retries", "retry_timeout", "concurrency", "kept_body_bytes", "max_value_bytes"}


def zarr_python_store(where):
    """zarr-python's read-only store of a RemoteLocation, through obstore (object_store's Python
    client: the same option names as zarrs_gpu's RemoteStore), for what zarr-python does here
    (listing a group's arrays and their attributes)."""
    try:
        import obstore.store
    except ImportError as err:
        raise ImportError(f"reading {where} with zarr-python needs obstore: pip install obstore") from err
    import zarr.storage

    config, client = {}, {}
    from ._zarrs_gpu import _object_store_options

    for key, value in _object_store_options(where.url, where.storage_options):
        plain = key[len("aws_"):] if key.startswith("aws_") else key
        if plain in _CLIENT_OPTIONS:
            client[plain] = value
        elif key not in _OURS:
            config[key] = value
    s3 = where.url.lower().startswith(("s3://", "s3a://"))
    store = obstore.store.from_url(where.url, config=config or None, client_options=client or None) if s3 else \
        obstore.store.from_url(where.url, client_options=client or None)
    return zarr.storage.ObjectStore(store, read_only=True)


# The zarr-python stores `zarr_python_root` names, for errors that say what was expected.
ZARR_PYTHON_STORES = ("a local store (zarr.storage.LocalStore) or in an ObjectStore of obstore's S3Store "
                      "(without a credential provider), HTTPStore or LocalStore")


def zarr_python_root(store):
    """Where zarrs_gpu finds a zarr-python store's arrays (what `zarr_python_store` turns back into
    a store): a `LocalStore`'s directory; for an `ObjectStore`, its obstore store's directory
    (obstore's `LocalStore`, by an absolute path) or a RemoteLocation: an `S3Store`'s bucket and
    prefix as the URL, its configuration, client and retry options as storage_options, and
    `profile_files=false` (obstore reads no AWS shared file, so neither does zarrs_gpu for it: a
    profile's endpoint or keys would send the requests elsewhere); an `HTTPStore`'s URL with its
    client and retry options. None for any other store (zarr-python reads it), for an `S3Store`
    whose credentials come from a Python credential provider (zarrs_gpu cannot call it), and for
    a store whose settings obstore cannot report."""
    from zarr.storage import LocalStore, ObjectStore

    if isinstance(store, LocalStore):
        return str(store.root)
    if not isinstance(store, ObjectStore):
        return None
    inner = store.store
    kind = type(inner)
    if not kind.__module__.startswith("obstore"):
        return None
    try:
        return _obstore_root(inner, kind.__name__)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - obstore reports some settings with a panic (a BaseException)
        return None


def _obstore_root(inner, kind):
    """`zarr_python_root` of an obstore store of class name `kind` (its attributes may raise)."""
    import urllib.parse

    if kind == "LocalStore":
        prefix = getattr(inner, "prefix", None)
        return str(prefix) if prefix is not None and os.path.isabs(str(prefix)) else None
    options = {k: str(v) for k, v in (getattr(inner, "client_options", None) or {}).items()}
    retry = getattr(inner, "retry_config", None) or {}
    if retry.get("max_retries") is not None:
        options["max_retries"] = str(int(retry["max_retries"]))
    timeout = retry.get("retry_timeout")
    if timeout is not None:
        options["retry_timeout"] = str(timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout)
    if kind == "HTTPStore":
        return RemoteLocation(inner.url, options)
    if kind != "S3Store" or getattr(inner, "credential_provider", None) is not None:
        return None
    config = {k: str(v) for k, v in (inner.config or {}).items()}
    bucket = None
    for name in ("bucket", "bucket_name", "aws_bucket", "aws_bucket_name"):
        bucket = config.pop(name, None) or bucket
    if not bucket:
        return None
    for name in ("request_payer", "aws_request_payer"):
        # obstore reports the header's value; object_store's option is a flag.
        if config.get(name, "").lower() == "requester":
            config[name] = "true"
    # The prefix is a path of the bucket, not URL text: "#", "?" and "%" in it are escaped.
    prefix = urllib.parse.quote(str(inner.prefix or "").strip("/"), safe="/")
    url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    return RemoteLocation(url, {**config, **options, "profile_files": "false"})


def open_at(where, array, device=0, mode="r"):
    """zarrs_gpu.open of a location (a path or a RemoteLocation)."""
    if isinstance(where, RemoteLocation):
        return zarrs_gpu.open(where.url, array, device=device, mode=mode, storage_options=where.storage_options)
    return zarrs_gpu.open(where, array, device=device, mode=mode)

_ARRAY_METADATA = ("zarr.json", ".zarray")
_lock = threading.Lock()
_arrays = {}  # (store root, array path, device) -> (stamp, zarrs_gpu.Array, cached at, metadata bytes)


#: A metadata file modified this close (ns) before its array was cached may be rewritten within
#: the same modification-time tick, same size and inode: its stamp is not trusted ("racy git").
_RACY_NS = 2_000_000_000


def open_cached(root, path, device=0):
    """The zarrs_gpu array at `path` of the store at `root`, for reads to GPU `device` (and writes
    from it), or None:
    kept between reads (its shard indexes too) while its metadata file is the same, so that an
    array rewritten with another fill value, codec or shape is opened again. The same is its stamp
    (inode, size, modification time) unless the file was modified within 2 s of the caching: then
    (zarr-python and zarrs rewrite in place, within one tick of a coarse clock) its bytes are
    compared. At most 64 are kept. `root` may be a RemoteLocation: its arrays are kept while
    the metadata their store holds is byte for byte what they were opened with (one small GET)."""
    if isinstance(root, RemoteLocation):
        return _open_remote(root, path, device)
    stamp = None
    for name in _ARRAY_METADATA:
        try:
            st = os.stat(os.path.join(root, path, name))
        except OSError:
            continue
        stamp = (name, st.st_ino, st.st_size, st.st_mtime_ns)
        break
    if stamp is None:
        return None
    metadata_file = os.path.join(root, path, stamp[0])
    with _lock:
        cached = _arrays.get((root, path, device))
    if cached is not None and cached[0] == stamp:
        cached_stamp, array, cached_at, cached_bytes = cached
        if cached_at - stamp[3] >= _RACY_NS:
            return array
        now = time.time_ns()
        if _read_bytes(metadata_file) == cached_bytes:
            with _lock:
                # Seen the same this long after its modification: a rewrite now changes the stamp.
                _arrays[(root, path, device)] = (cached_stamp, array, now, cached_bytes)
            return array
    # Read (and the time taken) before opening: a change meanwhile only makes the next read open it
    # again.
    cached_at = time.time_ns()
    metadata = _read_bytes(metadata_file)
    try:
        # Writable: zarr-python writes of device values go through the same instance (its shard
        # index cache sees them); opening "r+" touches nothing.
        array = zarrs_gpu.open(root, "/" + path, device=device, mode="r+")
    except (ValueError, FileNotFoundError, TypeError):
        return None
    with _lock:
        if len(_arrays) >= 64:
            _arrays.clear()
        _arrays[(root, path, device)] = (stamp, array, cached_at, metadata)
    return array


def _open_remote(root, path, device):
    """open_cached for an object store: kept while the metadata its store holds is byte for byte
    what was read just before it opened (one small GET per use)."""
    with _lock:
        cached = _arrays.get((root, path, device))
    if cached is not None:
        array = cached[1]
        opened = array._opened_metadata()
        try:
            same = opened is not None and array._stored_metadata() == opened
        except ValueError:  # the metadata could not be fetched now: opened again below
            same = False
        if same:
            return array
    try:
        array = open_at(root, "/" + path, device=device, mode="r+")
    except (ValueError, FileNotFoundError, TypeError):
        return None
    with _lock:
        if len(_arrays) >= 64:
            _arrays.clear()
        _arrays[(root, path, device)] = (None, array, time.time_ns(), None)
    return array


def _read_bytes(path):
    """A file's bytes, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None
