//! The options of a [`RemoteStore`](super::RemoteStore) as object_store names and spells them
//! (fsspec's names translated, an AWS profile's settings, plain HTTP allowed only on loopback or
//! when asked), and URLs made safe to show.

use std::fmt;

use object_store::ObjectStoreScheme;
use zarrs_storage::StorageError;

use crate::aws_profile::with_profile;

/// The options of [`RemoteStore::from_url`](super::RemoteStore::from_url) for `url` as object_store names and spells them:
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
pub(super) fn allow_plain_http(
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

pub(super) fn option_name(key: &str) -> &str {
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
pub(super) fn option_value(value: &str) -> String {
    match value {
        "True" => "true".to_string(),
        "False" => "false".to_string(),
        other => other.to_string(),
    }
}

pub(super) fn config_error(url: &str, what: impl fmt::Display) -> StorageError {
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
