use std::fmt;
use std::str::FromStr;

/// The environment variable that overrides [`IoBackend`] for every store and read.
pub const BACKEND_ENV: &str = "ZARRS_GDS_BACKEND";

/// Which I/O path a device read may take, as asked for by the caller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoBackend {
    /// Native GPUDirect Storage where it works for a file, else the pread fallback.
    #[default]
    Auto,
    /// Native GPUDirect Storage only: an error where it is not usable.
    Gds,
    /// The pread + pinned memory + async copy path only (what kvikio calls compat mode).
    Posix,
}

impl IoBackend {
    /// The backend named by the `ZARRS_GDS_BACKEND` environment variable, if set.
    ///
    /// # Errors
    /// Returns the variable's value when it is not `auto`, `gds` or `posix`.
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(BACKEND_ENV) {
            Ok(value) if !value.is_empty() => value.parse().map(Some),
            _ => Ok(None),
        }
    }

    /// `self`, unless the environment variable overrides it.
    ///
    /// # Errors
    /// Returns a message when the environment variable holds an unknown value.
    pub fn resolve(self) -> Result<Self, String> {
        Ok(Self::from_env()?.unwrap_or(self))
    }
}

impl FromStr for IoBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "gds" => Ok(Self::Gds),
            "posix" | "compat" => Ok(Self::Posix),
            other => Err(format!("unknown I/O backend {other:?} (expected auto, gds or posix)")),
        }
    }
}

impl fmt::Display for IoBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Gds => "gds",
            Self::Posix => "posix",
        })
    }
}

/// The I/O path a device read took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IoPath {
    /// cuFile reads straight from storage into device memory.
    Gds,
    /// Parallel preads into pinned host memory, then async copies to the device.
    Posix,
    /// A non-GDS zarrs store: its reads staged through pinned host memory.
    Staged,
    /// An object store: many ranged GETs in flight, each value copied through pinned host memory
    /// to the device as it arrives.
    Remote,
}

impl fmt::Display for IoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Gds => "gds (cuFile)",
            Self::Posix => "posix (parallel pread + pinned + async copy)",
            Self::Staged => "staged (store reads + pinned + async copy)",
            Self::Remote => "remote (concurrent ranged GETs + pinned + async copy)",
        })
    }
}

/// Which path a read took, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoStatus {
    /// The path.
    pub path: IoPath,
    /// Why that path: the backend asked for, or why native GDS was not used.
    pub reason: String,
}

impl IoStatus {
    /// The path a read took and why.
    #[must_use]
    pub fn new(path: IoPath, reason: impl Into<String>) -> Self {
        Self { path, reason: reason.into() }
    }
}

impl fmt::Display for IoStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.path, self.reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_backends() {
        assert_eq!("auto".parse::<IoBackend>(), Ok(IoBackend::Auto));
        assert_eq!(" GDS ".parse::<IoBackend>(), Ok(IoBackend::Gds));
        assert_eq!("posix".parse::<IoBackend>(), Ok(IoBackend::Posix));
        assert_eq!("compat".parse::<IoBackend>(), Ok(IoBackend::Posix));
        let err = "fast".parse::<IoBackend>().unwrap_err();
        assert!(err.contains("\"fast\""), "{err}");
        assert_eq!(IoBackend::Posix.to_string().parse::<IoBackend>(), Ok(IoBackend::Posix));
    }
}
