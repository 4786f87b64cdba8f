//! `redact_url` never panics, and never shows four characters in a row of a URL's password,
//! whatever the password, user, scheme and rest hold (unless that text is also the URL's own).
//!
//! Input: a byte picking the form (`scheme://user:password@rest`, without `//`, or the bytes as
//! they are), then the user, the password and the rest, split at the first two 0xFF bytes
//! (invalid UTF-8 replaced).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrs_gpu::zarrs_gds_store::redact_url;

fuzz_target!(|data: &[u8]| {
    let Some((&form, rest)) = data.split_first() else { return };
    let mut parts = rest.splitn(3, |&b| b == 0xFF).map(|p| String::from_utf8_lossy(p).into_owned());
    let (user, password, tail) = (parts.next().unwrap_or_default(), parts.next(), parts.next().unwrap_or_default());
    let scheme = ["http", "https", "s3", "file", "x+y"][usize::from(form >> 2) % 5];
    let Some(password) = password else {
        // Any text at all: never a panic.
        let _ = redact_url(&user);
        return;
    };
    let slashes = if form & 1 == 0 { "://" } else { ":" };
    let url = format!("{scheme}{slashes}{user}:{password}@{tail}");
    let shown = redact_url(&url);
    let public = format!("{scheme}{slashes}***@{tail}");
    let chars: Vec<char> = password.chars().collect();
    for window in chars.windows(4) {
        let window: String = window.iter().collect();
        // The marker is made of `*`: a password of stars shows as much of itself.
        if window.contains('*') || public.contains(&window) {
            continue;
        }
        assert!(!shown.contains(&window), "{url:?} shows {shown:?}, with {window:?} of the password");
    }
});
