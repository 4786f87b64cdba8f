//! Every environment variable this crate reads, in one table ([`ENVIRONMENT`]), and the one place
//! that reads them: the rest of the crate asks a variable of the table for its parsed value, and a
//! value that cannot be used is an error naming the variable, what it held and what it may hold.

/// One environment variable: its name, what it sets, and the values it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnvVar {
    /// The variable's name.
    pub name: &'static str,
    /// What it sets.
    pub sets: &'static str,
    /// The values it may hold.
    pub expected: &'static str,
}

/// A variable's value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?} cannot be used: expected {expected}")]
pub struct EnvError {
    /// The variable.
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What it may hold.
    pub expected: &'static str,
}

const fn var(name: &'static str, sets: &'static str, expected: &'static str) -> EnvVar {
    EnvVar { name, sets, expected }
}

/// [`GpuConfig::with_decode_trust`](crate::GpuConfig::with_decode_trust).
pub const DECODE_TRUST: EnvVar =
    var("ZARRS_GPU_DECODE_TRUST", "which stored chunks the device may decode", "verified, checked or trusted");
/// [`GpuConfig::with_staging_bytes`](crate::GpuConfig::with_staging_bytes).
pub const STAGING_BYTES: EnvVar =
    var("ZARRS_GPU_STAGING_BYTES", "the device staging budget of a batch", "a byte count of at least 1048576");
/// [`GpuConfig::with_host_decode_fraction`](crate::GpuConfig::with_host_decode_fraction).
pub const HOST_DECODE_FRACTION: EnvVar = var(
    "ZARRS_GPU_HOST_DECODE_FRACTION",
    "the share of large zstd chunks decoded on host threads",
    "a number from 0 to 1",
);
/// [`GpuConfig::with_host_encode_level`](crate::GpuConfig::with_host_encode_level).
pub const HOST_ENCODE_LEVEL: EnvVar = var(
    "ZARRS_GPU_HOST_ENCODE_LEVEL",
    "the codec level from which writes encode on host threads",
    "a codec level (an integer)",
);
/// [`GpuConfig::with_trace`](crate::GpuConfig::with_trace).
pub const TRACE: EnvVar = var(
    "ZARRS_GPU_TRACE",
    "phase timings printed to stderr after each decoded read",
    "1, true, on, yes, 0, false, off or no",
);
/// [`GpuConfig::with_row_reads`](crate::GpuConfig::with_row_reads).
pub const ROW_READS: EnvVar = var(
    "ZARRS_GPU_ROW_READS",
    "row reads of uncompressed tiles (on by default)",
    "1, true, on, yes, 0, false, off or no",
);
/// [`GpuConfig::with_remote_batch_bytes`](crate::GpuConfig::with_remote_batch_bytes).
pub const REMOTE_BATCH_BYTES: EnvVar = var(
    "ZARRS_GPU_REMOTE_BATCH_BYTES",
    "the most decoded bytes of a batch read from an object store",
    "a byte count (0: none)",
);
/// [`GpuConfig::with_coalesce_window`](crate::GpuConfig::with_coalesce_window).
pub const COALESCE_WINDOW_US: EnvVar = var(
    "ZARRS_GPU_COALESCE_WINDOW_US",
    "the window in which reads of one array from many threads gather into requests",
    "microseconds from 0 to 1000000",
);
/// [`GpuConfig::with_pool_keep_bytes`](crate::GpuConfig::with_pool_keep_bytes), and each device's
/// own bound.
pub const POOL_KEEP_BYTES: EnvVar =
    var("ZARRS_GPU_POOL_KEEP_BYTES", "the idle device and pinned memory the pools keep between reads", "a byte count");
/// [`ZstdDecoder`](crate::zstd_decode::ZstdDecoder).
pub const ZSTD_DECODER: EnvVar =
    var("ZARRS_GPU_ZSTD_DECODER", "the device decoder of zstd frames and Blosc's zstd streams", "auto, ours or nvcomp");
/// [`Lz4Decoder`](crate::lz4_decode::Lz4Decoder) (auto: ours).
pub const LZ4_DECODER: EnvVar =
    var("ZARRS_GPU_LZ4_DECODER", "the device decoder of Blosc's LZ4 streams", "auto, ours or nvcomp");
/// How pinned host memory is made (`PinnedBuffer`).
pub const PINNED_PAGES: EnvVar = var(
    "ZARRS_GPU_PINNED_PAGES",
    "how pinned host memory is made: transparent huge pages registered, or cuMemHostAlloc",
    "huge or alloc",
);
/// `DeviceReaderOptions::threads`.
pub const GDS_NTHREADS: EnvVar =
    var("ZARRS_GDS_NTHREADS", "the reader threads of each device", "a thread count from 1 to 256");
/// `DeviceReaderOptions::task_size`.
pub const GDS_TASK_SIZE: EnvVar =
    var("ZARRS_GDS_TASK_SIZE", "the bytes of one read task", "a byte count of at least 4096");
/// [`GpuConfig::with_backend`](crate::GpuConfig::with_backend) (stores read it too).
pub const GDS_BACKEND: EnvVar =
    var(zarrs_gds_store::BACKEND_ENV, "the I/O backend of file stores", "auto, gds or posix");

/// Every variable this crate reads. (`zarrs_gds_store` reads `ZARRS_GDS_BACKEND` and
/// `CUFILE_LIBRARY_PATH` for stores used alone; `nvcomp-sys` reads `NVCOMP_LIBRARY_PATH`.)
pub const ENVIRONMENT: &[EnvVar] = &[
    DECODE_TRUST,
    STAGING_BYTES,
    HOST_DECODE_FRACTION,
    HOST_ENCODE_LEVEL,
    TRACE,
    ROW_READS,
    REMOTE_BATCH_BYTES,
    COALESCE_WINDOW_US,
    POOL_KEEP_BYTES,
    ZSTD_DECODER,
    LZ4_DECODER,
    PINNED_PAGES,
    GDS_NTHREADS,
    GDS_TASK_SIZE,
    GDS_BACKEND,
];

impl EnvVar {
    /// The value set, if set and not only blanks (trimmed).
    fn value(self) -> Result<Option<String>, EnvError> {
        match std::env::var(self.name) {
            Ok(value) if value.trim().is_empty() => Ok(None),
            Ok(value) => Ok(Some(value.trim().to_string())),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(value)) => Err(self.error(&value.to_string_lossy())),
        }
    }

    /// The value set, parsed by `parse` (None where it cannot be used: an error naming the
    /// variable); None where unset or empty.
    pub(crate) fn parse<T>(self, parse: impl FnOnce(&str) -> Option<T>) -> Result<Option<T>, EnvError> {
        self.value()?.map(|value| parse(&value).ok_or_else(|| self.error(&value))).transpose()
    }

    fn error(self, value: &str) -> EnvError {
        EnvError { variable: self.name, value: value.to_string(), expected: self.expected }
    }
}

/// An on/off value.
pub(crate) fn switch(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => None,
    }
}

/// [`POOL_KEEP_BYTES`], where set.
pub(crate) fn pool_keep() -> Result<Option<u64>, EnvError> {
    POOL_KEEP_BYTES.parse(|v| v.parse().ok())
}

/// Whether [`PINNED_PAGES`] asks for `cuMemHostAlloc` only (`Some(true)`) or huge pages
/// (`Some(false)`); None where unset.
pub(crate) fn pinned_alloc() -> Result<Option<bool>, EnvError> {
    PINNED_PAGES.parse(alloc_or_huge)
}

fn alloc_or_huge(value: &str) -> Option<bool> {
    match value {
        "alloc" => Some(true),
        "huge" => Some(false),
        _ => None,
    }
}

/// [`GDS_NTHREADS`], where set.
pub(crate) fn reader_threads() -> Result<Option<usize>, EnvError> {
    GDS_NTHREADS.parse(|v| v.parse().ok().filter(|n| (1..=256).contains(n)))
}

/// [`GDS_TASK_SIZE`], where set.
pub(crate) fn reader_task_size() -> Result<Option<usize>, EnvError> {
    GDS_TASK_SIZE.parse(|v| v.parse().ok().filter(|&n| n >= 4096))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_variable_once_and_says_what_it_takes() {
        let mut names: Vec<_> = ENVIRONMENT.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ENVIRONMENT.len());
        for v in ENVIRONMENT {
            assert!(v.name.starts_with("ZARRS_G"), "{}", v.name);
            assert!(!v.sets.is_empty() && !v.expected.is_empty(), "{}", v.name);
        }
    }

    /// The settings page's table lists every variable, in the table's order.
    #[test]
    fn the_settings_page_lists_the_table() {
        let page = include_str!("../../docs/settings.md");
        let rows: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .filter(|name| name.starts_with("ZARRS_G"))
            .collect();
        let names: Vec<&str> = ENVIRONMENT.iter().map(|v| v.name).collect();
        assert_eq!(rows, names);
    }

    #[test]
    fn parsers_accept_what_the_table_says_and_refuse_the_rest() {
        for (value, on) in [("1", true), ("TRUE", true), ("on", true), ("no", false), ("Off", false), ("0", false)] {
            assert_eq!(switch(value), Some(on), "{value}");
        }
        assert_eq!(switch("2"), None);
        assert_eq!(
            (alloc_or_huge("alloc"), alloc_or_huge("huge"), alloc_or_huge("2M")),
            (Some(true), Some(false), None)
        );
        let error = TRACE.error("2");
        assert_eq!(
            error.to_string(),
            "ZARRS_GPU_TRACE=\"2\" cannot be used: expected 1, true, on, yes, 0, false, off or no"
        );
    }
}
