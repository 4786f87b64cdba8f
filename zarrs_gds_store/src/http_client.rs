//! The HTTP client of the object stores `RemoteStore::from_url` builds, and which plain-HTTP
//! endpoints it takes without being told.
//!
//! object_store 0.14 lets reqwest follow up to ten redirects to any host, and reqwest drops only
//! `Authorization` and cookies when one leaves the origin: an S3 request's session token
//! (`x-amz-security-token`) and signed `x-amz-*` headers would go to whatever host a server
//! names. object_store has no redirect setting, only a connector of one's own; this one builds
//! the client object_store would build from the same [`ClientOptions`], with a redirect policy.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::client::{HttpClient, HttpConnector};
use object_store::{ClientConfigKey, ClientOptions};

/// Redirects followed in a row at most (reqwest's default).
const MAX_REDIRECTS: usize = 10;

/// Which redirects a store's client follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Redirects {
    /// Within the origin (scheme, host and port) only: S3, whose requests carry credentials.
    SameOrigin,
    /// Anywhere over HTTPS, or to plain HTTP on loopback: HTTP stores, whose requests carry
    /// none (a URL's user information is refused, and no option sets a header).
    Anywhere,
}

/// object_store's [`HttpConnector`] with a [`Redirects`] policy.
#[derive(Debug)]
pub(crate) struct Connector(pub(crate) Redirects);

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(client(options, self.0)?))
    }
}

/// A redirect not followed, found in a request's error chain to say why.
#[derive(Debug)]
pub(crate) struct RedirectRefused {
    /// The origins (`scheme://host:port`: never a path, query or user information).
    pub(crate) from: String,
    pub(crate) to: String,
}

impl fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server at {} redirected to another origin, {}, which is not followed: the request's \
             credentials (S3's session token and signed headers) would go there; give the endpoint \
             that serves the data",
            self.from, self.to
        )
    }
}

impl std::error::Error for RedirectRefused {}

/// The [`RedirectRefused`] in `error`'s chain of sources, if any.
pub(crate) fn redirect_refused<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a RedirectRefused> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(refused) = e.downcast_ref::<RedirectRefused>() {
            return Some(refused);
        }
        next = e.source();
    }
    None
}

fn config_error(what: String) -> object_store::Error {
    object_store::Error::Generic { store: "HTTP client", source: what.into() }
}

/// reqwest's client as object_store 0.14's `ClientOptions::client` builds it (every setting a
/// configuration key can give), with `redirects`.
fn client(options: &ClientOptions, redirects: Redirects) -> object_store::Result<reqwest::Client> {
    let get = |key: ClientConfigKey| options.get_config_value(&key);
    let flag = |key: ClientConfigKey| -> object_store::Result<bool> {
        match get(key).map(|v| v.to_ascii_lowercase()).as_deref() {
            None | Some("0" | "false" | "off" | "no" | "n") => Ok(false),
            Some("1" | "true" | "on" | "yes" | "y") => Ok(true),
            Some(other) => Err(config_error(format!("{key:?}: true or false, not {other:?}"))),
        }
    };
    let duration = |key: ClientConfigKey| -> object_store::Result<Option<Duration>> {
        get(key)
            .map(|v| humantime::parse_duration(&v).map_err(|_| config_error(format!("{key:?}: a duration, not {v:?}"))))
            .transpose()
    };
    let number = |key: ClientConfigKey| -> object_store::Result<Option<usize>> {
        get(key).map(|v| v.parse().map_err(|_| config_error(format!("{key:?}: a number, not {v:?}")))).transpose()
    };
    let failed = |e: reqwest::Error| config_error(e.to_string());

    let agent = get(ClientConfigKey::UserAgent)
        .unwrap_or_else(|| concat!(env!("CARGO_PKG_NAME"), "/", env!("CARGO_PKG_VERSION")).to_string());
    let mut builder = reqwest::ClientBuilder::new().user_agent(agent);
    if let Some(url) = get(ClientConfigKey::ProxyUrl) {
        let mut proxy = reqwest::Proxy::all(&url).map_err(failed)?;
        if let Some(pem) = get(ClientConfigKey::ProxyCaCertificate) {
            let certificate = reqwest::Certificate::from_pem(pem.as_bytes()).map_err(failed)?;
            builder = builder.tls_certs_merge(std::iter::once(certificate));
        }
        if let Some(excludes) = get(ClientConfigKey::ProxyExcludes) {
            proxy = proxy.no_proxy(reqwest::NoProxy::from_string(&excludes));
        }
        builder = builder.proxy(proxy);
    }
    if flag(ClientConfigKey::NoSystemCertificates)? {
        builder = builder.tls_certs_only(std::iter::empty());
    }
    if let Some(t) = duration(ClientConfigKey::Timeout)? {
        builder = builder.timeout(t);
    }
    if let Some(t) = duration(ClientConfigKey::ConnectTimeout)? {
        builder = builder.connect_timeout(t);
    }
    if let Some(t) = duration(ClientConfigKey::ReadTimeout)? {
        builder = builder.read_timeout(t);
    }
    if let Some(t) = duration(ClientConfigKey::PoolIdleTimeout)? {
        builder = builder.pool_idle_timeout(t);
    }
    if let Some(n) = number(ClientConfigKey::PoolMaxIdlePerHost)? {
        builder = builder.pool_max_idle_per_host(n);
    }
    if let Some(t) = duration(ClientConfigKey::Http2KeepAliveInterval)? {
        builder = builder.http2_keep_alive_interval(t);
    }
    if let Some(t) = duration(ClientConfigKey::Http2KeepAliveTimeout)? {
        builder = builder.http2_keep_alive_timeout(t);
    }
    if flag(ClientConfigKey::Http2KeepAliveWhileIdle)? {
        builder = builder.http2_keep_alive_while_idle(true);
    }
    if let Some(n) = number(ClientConfigKey::Http2MaxFrameSize)? {
        let n = u32::try_from(n).map_err(|_| config_error(format!("Http2MaxFrameSize: {n} is over u32")))?;
        builder = builder.http2_max_frame_size(Some(n));
    }
    if flag(ClientConfigKey::Http1Only)? {
        builder = builder.http1_only();
    }
    if flag(ClientConfigKey::Http2Only)? {
        builder = builder.http2_prior_knowledge();
    }
    if flag(ClientConfigKey::AllowInvalidCertificates)? {
        builder = builder.danger_accept_invalid_certs(true);
    }
    // object_store's default: connections spread over a name's addresses.
    if flag(ClientConfigKey::RandomizeAddresses)? {
        builder = builder.dns_resolver(Arc::new(Rotating::default()));
    }
    let allow_http = flag(ClientConfigKey::AllowHttp)?;
    builder
        // Compression would change Content-Length, by which object_store sizes values.
        .no_gzip()
        .no_brotli()
        .no_zstd()
        .no_deflate()
        .https_only(!allow_http)
        .redirect(policy(redirects))
        .build()
        .map_err(failed)
}

/// `url`'s origin, as messages show it.
fn origin(url: &reqwest::Url) -> String {
    url.origin().ascii_serialization()
}

fn policy(redirects: Redirects) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let Some(from) = attempt.previous().last() else { return attempt.follow() };
        let to = attempt.url();
        let same = from.origin() == to.origin();
        let allowed = match redirects {
            Redirects::SameOrigin => same,
            Redirects::Anywhere => same || to.scheme() == "https" || is_loopback(to.as_str()),
        };
        if allowed {
            attempt.follow()
        } else {
            let refused = RedirectRefused { from: origin(from), to: origin(to) };
            attempt.error(refused)
        }
    })
}

/// Whether `url`'s host is this machine: 127.0.0.0/8, ::1 (or an IPv4-mapped loopback
/// address), or `localhost`. Plain HTTP to it never crosses a network.
pub(crate) fn is_loopback(url: &str) -> bool {
    match url::Url::parse(url).ok().as_ref().and_then(url::Url::host) {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        Some(url::Host::Domain(name)) => name.trim_end_matches('.').eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// A resolver that hands each lookup a name's addresses in turn from a different one, as
/// object_store's default does by shuffling: connections spread over a service's front ends.
#[derive(Default)]
struct Rotating(AtomicUsize);

impl reqwest::dns::Resolve for Rotating {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let turn = self.0.fetch_add(1, Ordering::Relaxed);
        let host = name.as_str().to_string();
        Box::pin(async move {
            let lookup = tokio::task::spawn_blocking(move || (host.as_str(), 0).to_socket_addrs());
            let mut addresses: Vec<SocketAddr> = lookup.await??.collect();
            if !addresses.is_empty() {
                let n = addresses.len();
                addresses.rotate_left(turn % n);
            }
            Ok(Box::new(addresses.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_127_8_ipv6_one_and_localhost_only() {
        for url in [
            "http://127.0.0.1:9000",
            "http://127.3.4.5/x",
            "http://[::1]:80/",
            "http://LocalHost:1/a",
            "http://localhost./",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "http://10.0.0.1:9000",
            "http://128.0.0.1/",
            "http://[::2]/",
            "http://localhost.example.com/",
            "http://mylocalhost/",
            "http://0.0.0.0/",
            "not a url",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }
}
