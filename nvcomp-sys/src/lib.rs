//! Raw bindings to NVIDIA [nvCOMP](https://docs.nvidia.com/cuda/nvcomp/), loaded at run time.
//!
//! This crate finds and loads `libnvcomp.so.6` so that nothing links against nvCOMP at build
//! time: [`NvcompLibrary::get`] tries `NVCOMP_LIBRARY_PATH`, then the Python packages' copy
//! (`nvidia/libnvcomp/lib64` under each `sys.path` entry, as `pip install nvidia-libnvcomp-cu13`
//! places it), then the system loader. A missing library is an error that lists what was tried and
//! how to install it. The function bindings (generated with bindgen from the wheel's headers) come
//! with device zstd decoding.
//!
//! ## Licence
//! `nvcomp-sys` is licensed under either of the Apache License, Version 2.0 or the MIT license, at
//! your option. nvCOMP itself is NVIDIA's and is neither bundled nor redistributed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The environment variable naming the nvCOMP library file to load first.
pub const LIBRARY_ENV: &str = "NVCOMP_LIBRARY_PATH";
/// The shared library's name (nvCOMP 6).
pub const SONAME: &str = "libnvcomp.so.6";
/// Where the PyPI wheel puts the library, relative to a `sys.path` entry.
pub const WHEEL_DIR: &str = "nvidia/libnvcomp/lib64";

/// nvCOMP could not be loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "nvCOMP ({SONAME}) could not be loaded; tried: {}. Install it with `pip install nvidia-libnvcomp-cu13` \
     or set {LIBRARY_ENV} to the library file",
    tried.join("; ")
)]
pub struct LoadError {
    /// Each candidate and why it failed.
    pub tried: Vec<String>,
}

/// The loaded nvCOMP library.
#[derive(Debug)]
pub struct NvcompLibrary {
    library: libloading::Library,
    path: String,
}

impl NvcompLibrary {
    /// The process's nvCOMP, loaded on first use from [`candidates`].
    ///
    /// # Errors
    /// Returns what was tried when no candidate loads.
    pub fn get() -> Result<&'static Self, LoadError> {
        static LIBRARY: OnceLock<Result<NvcompLibrary, LoadError>> = OnceLock::new();
        LIBRARY.get_or_init(|| Self::load_first(&candidates())).as_ref().map_err(Clone::clone)
    }

    /// Load the first of `candidates` (file paths, or bare names for the system loader) that loads.
    ///
    /// # Errors
    /// Returns each candidate with its error when none loads.
    pub fn load_first(candidates: &[String]) -> Result<Self, LoadError> {
        let mut tried = Vec::new();
        for candidate in candidates {
            // SAFETY: loading nvCOMP runs its initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(candidate) } {
                Ok(library) => return Ok(Self { library, path: candidate.clone() }),
                Err(err) => tried.push(format!("{candidate} ({err})")),
            }
        }
        Err(LoadError { tried })
    }

    /// The candidate that loaded.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The library, for symbol lookups.
    #[must_use]
    pub fn library(&self) -> &libloading::Library {
        &self.library
    }
}

/// Where to look for nvCOMP, in order: `NVCOMP_LIBRARY_PATH`, the wheel's directory under each
/// entry of `PYTHONPATH` and of the Python interpreter's `sys.path`, then [`SONAME`] for the
/// system loader (`LD_LIBRARY_PATH`, the ld cache).
#[must_use]
pub fn candidates() -> Vec<String> {
    let mut out: Vec<String> = std::env::var(LIBRARY_ENV).ok().filter(|p| !p.is_empty()).into_iter().collect();
    let mut roots: Vec<PathBuf> =
        std::env::var_os("PYTHONPATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    roots.extend(python_sys_path());
    out.extend(wheel_candidates(&roots));
    out.push(SONAME.to_string());
    out.dedup();
    out
}

/// The wheel's library file under each of `roots` that has one.
#[must_use]
pub fn wheel_candidates(roots: &[PathBuf]) -> Vec<String> {
    roots
        .iter()
        .map(|root| root.join(WHEEL_DIR).join(SONAME))
        .filter(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

/// `sys.path` of `python3`, if there is one (empty otherwise).
fn python_sys_path() -> Vec<PathBuf> {
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys; print('\\n'.join(p for p in sys.path if p))"])
        .stderr(std::process::Stdio::null())
        .output();
    match output {
        Ok(out) if out.status.success() => {
            String::from_utf8_lossy(&out.stdout).lines().map(|l| Path::new(l.trim()).to_path_buf()).collect()
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_clear_error() {
        let err = NvcompLibrary::load_first(&["/nonexistent/libnvcomp.so.6".into()]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/libnvcomp.so.6"), "{text}");
        assert!(text.contains("pip install nvidia-libnvcomp-cu13") && text.contains(LIBRARY_ENV), "{text}");
    }

    #[test]
    fn wheel_layout_is_found_under_python_roots() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join(WHEEL_DIR);
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join(SONAME), b"not really a library").unwrap();
        let other = tempfile::tempdir().unwrap();
        let found = wheel_candidates(&[other.path().to_path_buf(), dir.path().to_path_buf()]);
        assert_eq!(found, vec![lib.join(SONAME).to_string_lossy().into_owned()]);
        // A file that is not a library fails to load with its path in the error.
        let err = NvcompLibrary::load_first(&found).unwrap_err();
        assert!(err.tried[0].contains(SONAME), "{err}");
        // The system loader's name is always the last resort.
        assert_eq!(candidates().last().map(String::as_str), Some(SONAME));
    }

    #[test]
    #[ignore = "needs the nvCOMP library (the GPU host's .gpu/run provides it)"]
    fn loads_the_installed_library() {
        let library = NvcompLibrary::get().unwrap();
        // SAFETY: only looks the symbol up.
        let symbol = unsafe { library.library().get::<unsafe extern "C" fn()>(b"nvcompBatchedZstdDecompressAsync\0") };
        assert!(symbol.is_ok(), "{} lacks the zstd entry points", library.path());
    }
}
