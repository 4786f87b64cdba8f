//! What a remote store refuses to take from a server or to send to one, against small servers
//! on loopback written here: reads of whole values bounded before their bodies are taken,
//! redirects to another origin not followed with credentials, plain HTTP beyond loopback only
//! when allowed, and URLs shown without any part of a password.

use std::error::Error;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use zarrs::array::Array;
use zarrs_gds_store::RemoteStore;
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::{ReadableStorageTraits, StoreKey};

type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// `len` bytes of xorshift noise from `seed`.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A server on loopback that answers each request (its text, up to 4 KiB) with `respond`'s bytes
/// and closes the connection; its port and every request it had.
fn routed_server(respond: impl Fn(&str) -> Vec<u8> + Send + 'static) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let n = stream.read(&mut request).unwrap_or(0);
            let text = String::from_utf8_lossy(&request[..n]).into_owned();
            let answer = respond(&text);
            // Recorded before the answer: a client that has its answer finds its request here.
            seen.lock().unwrap().push(text);
            let _ = stream.write_all(&answer);
        }
    });
    (port, requests)
}

/// A server that answers every request with `head`, then zeros until the client hangs up (each
/// connection on its own thread); the bytes of body it got to send.
fn endless_server(head: &'static str, chunked: bool) -> (u16, Arc<AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = Arc::new(AtomicU64::new(0));
    let counted = sent.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let counted = counted.clone();
            std::thread::spawn(move || {
                let _ = stream.read(&mut [0u8; 4096]);
                let block = vec![0u8; 64 << 10];
                let framed = if chunked { [&b"10000\r\n"[..], &block, b"\r\n"].concat() } else { block.clone() };
                let _ = stream.write_all(head.as_bytes());
                // The client hanging up ends the writes (std ignores SIGPIPE).
                while stream.write_all(&framed).is_ok() {
                    counted.fetch_add(block.len() as u64, Ordering::SeqCst);
                }
            });
        }
    });
    (port, sent)
}

#[test]
fn whole_value_reads_are_bounded_before_their_body_is_taken() -> Result {
    // A server that says 8 GiB and sends zeros for as long as it is read: every read with no
    // end is refused at once, naming the key, the size, the bound and how to raise it.
    let (port, sent) = endless_server("HTTP/1.1 200 OK\r\nContent-Length: 8589934592\r\n\r\n", false);
    let url = format!("http://127.0.0.1:{port}/a");
    let store = Arc::new(RemoteStore::from_url(&url, [("max_retries", "0")])?);
    assert_eq!(store.max_value_bytes(), zarrs_gds_store::DEFAULT_MAX_VALUE_BYTES);
    let start = Instant::now();
    let err = store.get(&StoreKey::new("v.zarr/c/0/0")?).unwrap_err().to_string();
    for part in ["v.zarr/c/0/0", "8589934592", "1073741824", "max_value_bytes"] {
        assert!(err.contains(part), "{part}: {err}");
    }
    // From an offset to the end, where the server takes ranges.
    let head = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 5-8589934591/8589934592\r\n\
                Content-Length: 8589934587\r\n\r\n";
    let (ranged_port, ranged_sent) = endless_server(head, false);
    let ranged = RemoteStore::from_url(&format!("http://127.0.0.1:{ranged_port}/a"), [("max_retries", "0")])?;
    let err =
        ranged.get_partial(&StoreKey::new("v.zarr/c/0/1")?, ByteRange::FromStart(5, None)).unwrap_err().to_string();
    assert!(err.contains("v.zarr/c/0/1") && err.contains("8589934587") && err.contains("max_value_bytes"), "{err}");
    // Metadata, read by zarrs through the store.
    let err = Array::open(store.clone(), "/v.zarr").unwrap_err().to_string();
    assert!(err.contains("zarr.json") && err.contains("max_value_bytes"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    // Nothing read of the bodies: what was sent sits in the sockets' buffers at most.
    std::thread::sleep(Duration::from_millis(200));
    for sent in [&sent, &ranged_sent] {
        assert!(sent.load(Ordering::SeqCst) < 64 << 20, "{} bytes sent", sent.load(Ordering::SeqCst));
    }

    // A body without a stated length, never ending: an error, soon.
    let (port, _) = endless_server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true);
    let url = format!("http://127.0.0.1:{port}/a");
    let store = RemoteStore::from_url(&url, [("max_retries", "0"), ("max_value_bytes", "1000000")])?;
    let start = Instant::now();
    let err = store.get(&StoreKey::new("c/9")?).unwrap_err().to_string();
    assert!(err.contains("c/9"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());

    // An honest value over a bound set as an option, then read whole once the shared store's
    // bound is raised (as a caller that knows its largest chunk would).
    let value = noise(5000, 7);
    let body = value.clone();
    let (port, _) = routed_server(move |_| {
        [format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).as_bytes(), &body]
            .concat()
    });
    let url = format!("http://127.0.0.1:{port}/a");
    let store = RemoteStore::from_url(&url, [("max_value_bytes", "4999")])?;
    let key = StoreKey::new("c/1")?;
    let err = store.get(&key).unwrap_err().to_string();
    assert!(err.contains("c/1") && err.contains("5000") && err.contains("4999"), "{err}");
    let shared = store.clone();
    shared.set_max_value_bytes(5000);
    assert_eq!(store.get(&key)?.as_deref(), Some(&value[..]));
    let err = RemoteStore::from_url(&url, [("max_value_bytes", "lots")]).unwrap_err().to_string();
    assert!(err.contains("max_value_bytes"), "{err}");
    Ok(())
}

#[test]
fn redirects_to_another_origin_never_carry_credentials() -> Result {
    // The second server: a different port on loopback is a different origin (as browsers and
    // reqwest's own header stripping count it). It records what reaches it.
    let (away_port, away) =
        routed_server(|_| b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nelsewhere".to_vec());
    let (port, _) = routed_server(move |request| {
        let path = request.split_whitespace().nth(1).unwrap_or_default().to_string();
        let moved = |to: String| {
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        };
        let text = if path.ends_with("/same") {
            moved(path.replace("/same", "/moved"))
        } else if path.ends_with("/moved") {
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nhere".to_string()
        } else if path.ends_with("/away") {
            moved(format!("http://127.0.0.1:{away_port}{path}"))
        } else {
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
        };
        text.into_bytes()
    });
    let token = "SESSION-TOKEN-0123456789";
    let options = [
        ("aws_endpoint", format!("http://127.0.0.1:{port}")),
        ("aws_region", "us-east-1".into()),
        ("aws_access_key_id", "AKREDIRECT".into()),
        ("aws_secret_access_key", "secret-redirect".into()),
        ("aws_session_token", token.into()),
        ("aws_virtual_hosted_style_request", "false".into()),
        ("profile_files", "false".into()),
        ("max_retries", "0".into()),
    ];
    let store = RemoteStore::from_url("s3://volumes/r", options)?;
    // Within the origin: followed.
    assert_eq!(store.get(&StoreKey::new("k/same")?)?.as_deref(), Some(&b"here"[..]));
    // To another: an error naming the key and both origins, and nothing reaches the other server.
    let err = store.get(&StoreKey::new("k/away")?).unwrap_err().to_string();
    let other = format!("http://127.0.0.1:{away_port}");
    assert!(err.contains("k/away") && err.contains("redirect") && err.contains(&other), "{err}");
    assert!(!err.contains(token) && !err.contains("secret-redirect"), "{err}");
    let reached = away.lock().unwrap().clone();
    assert!(reached.iter().all(|r| !r.contains(token)), "the session token went to {other}: {reached:?}");
    assert!(reached.is_empty(), "{reached:?}");
    // An HTTP store sends no credentials: it follows, and the other server sees none.
    let http = RemoteStore::from_url(&format!("http://127.0.0.1:{port}/volumes/r"), [("max_retries", "0")])?;
    assert_eq!(http.get(&StoreKey::new("k/away")?)?.as_deref(), Some(&b"elsewhere"[..]));
    let reached = away.lock().unwrap().clone();
    assert_eq!(reached.len(), 1);
    assert!(
        !reached[0].to_ascii_lowercase().contains("x-amz-")
            && !reached[0].to_ascii_lowercase().contains("authorization")
    );
    Ok(())
}

#[test]
fn plain_http_beyond_loopback_needs_allow_http() -> Result {
    let s3 = |endpoint: &str, allow: Option<&str>| {
        let mut options = vec![
            ("aws_endpoint", endpoint.to_string()),
            ("aws_region", "us-east-1".to_string()),
            ("profile_files", "false".to_string()),
        ];
        if let Some(allow) = allow {
            options.push(("allow_http", allow.to_string()));
        }
        options
    };
    for (url, options) in [
        ("s3://volumes/x", s3("http://10.1.2.3:9000", None)),
        ("s3://volumes/x", s3("HTTP://s3.example.com", Some("false"))),
        ("http://data.example.com/v.zarr", vec![]),
        ("http://192.0.2.7:8080/v.zarr", vec![("allow_http", "0".to_string())]),
    ] {
        let err = RemoteStore::from_url(url, options).unwrap_err().to_string();
        assert!(
            err.contains("allow_http") && err.contains("AWS_ALLOW_HTTP") && err.contains("plain HTTP"),
            "{url}: {err}"
        );
    }
    // Allowed explicitly: opened (nothing is sent until a read).
    RemoteStore::from_url("s3://volumes/x", s3("http://10.1.2.3:9000", Some("true")))?;
    RemoteStore::from_url("http://data.example.com/v.zarr", [("allow_http", "True")])?;
    // Loopback: allowed without a word; HTTPS needs nothing.
    for endpoint in ["http://127.0.0.1:9000", "http://127.8.9.10", "http://[::1]:9000", "http://localhost:9000"] {
        let options = zarrs_gds_store::object_store_options("s3://volumes/x", s3(endpoint, None))?;
        assert!(options.contains(&("allow_http".into(), "true".into())), "{endpoint}: {options:?}");
    }
    let options = zarrs_gds_store::object_store_options("s3://volumes/x", s3("https://10.1.2.3", None))?;
    assert!(options.iter().all(|(k, _)| k != "allow_http"), "{options:?}");

    Ok(())
}

#[test]
fn redact_url_never_shows_user_information_the_parser_misreads() {
    let redact = zarrs_gds_store::redact_url;
    for (url, want) in [
        ("https://u:p@host/x?sig=1#f", "https://host/x"),
        ("s3://bucket/prefix/v.zarr", "s3://bucket/prefix/v.zarr"),
        ("http://alice:hun?ter2@host/x", "http://***@host/x"),
        ("http://alice:hun#ter2@host/x", "http://***@host/x"),
        ("http://alice:12/cdef@host/x", "http://***@host/x"),
        ("http://alice:1234?abcd@host", "http://***@host"),
        ("s3://alice:p@ss/w@rd@bucket/k", "s3://***@bucket/k"),
        ("http://alice:hunter2@[::1/x", "http://***@[::1/x"),
        ("alice:hunter2@host/x", "***@host/x"),
        ("http://[::1/x?token=abc", "http://[::1/x"),
        ("", ""),
    ] {
        assert_eq!(redact(url), want, "{url}");
    }
}

mod redact_property {
    use proptest::prelude::*;

    /// Characters of user information that parsers read as the authority's end or the next
    /// part (`/ ? # @ \ : [ ]`), escapes, spaces, controls and other scripts; no `*`, which the
    /// redaction's own marker is made of.
    const ODD: &[char] = &[
        'a', 'b', 'c', 'x', 'Y', 'Z', '0', '1', '9', '/', '?', '#', '@', '\\', ':', '[', ']', '%', '4', ' ', '\t',
        '\n', '.', '~', '!', '$', '&', '\'', '(', ')', '+', ',', ';', '=', '-', '_', 'é', '☃', '\u{0}',
    ];

    fn odd_text(len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
        proptest::collection::vec(proptest::sample::select(ODD), len).prop_map(|c| c.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

        /// No four characters of a password in a row ever show, unless they are also text of
        /// the URL's other parts (then nothing of the password is told).
        #[test]
        fn no_part_of_a_password_ever_shows(
            scheme in prop::sample::select(&["http", "https", "s3", "s3a", "file", "gs", "x+y"][..]),
            slashes in prop::sample::select(&["://", ":/", ":", ":\\\\"][..]),
            user in odd_text(0..8),
            password in odd_text(4..24),
            host in prop::sample::select(&["host", "127.0.0.1:9000", "[::1]", "bucket", "h.example", ""][..]),
            path in prop::sample::select(&["", "/x", "/a/b.zarr", "/k@v/c", "?q=1", "#frag", "/p?x=@"][..]),
        ) {
            let url = format!("{scheme}{slashes}{user}:{password}@{host}{path}");
            let shown = zarrs_gds_store::redact_url(&url);
            let public = format!("{scheme}{slashes}***@{host}{path}");
            let chars: Vec<char> = password.chars().collect();
            for window in chars.windows(4) {
                let window: String = window.iter().collect();
                prop_assert!(
                    !shown.contains(&window) || public.contains(&window),
                    "{url:?} shows {shown:?}, with {window:?} of the password"
                );
            }
        }
    }
}
