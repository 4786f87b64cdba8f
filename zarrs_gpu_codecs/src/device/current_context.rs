//! The calling thread's current CUDA context, put back as it was: cudarc makes a context current
//! on the thread that uses it (`bind_to_thread`) and never restores the one before, so a read on
//! device 1 would leave PyTorch and CuPy on the caller's thread allocating on device 1.

use cudarc::driver::{result, sys};

/// Saves the calling thread's current CUDA context when made and makes it current again when
/// dropped (on errors and panics too). Hold one across every call that may bind a context on the
/// caller's thread.
#[must_use = "the context is restored when the guard is dropped"]
pub struct CurrentContextGuard {
    /// The context to restore (null: none was current); None when there is nothing to restore
    /// (no driver library, or the driver would not say).
    saved: Option<sys::CUcontext>,
}

impl CurrentContextGuard {
    /// Remember the calling thread's current context.
    pub fn new() -> Self {
        // SAFETY: only probes whether the driver library can be loaded; cudarc panics on its
        // first driver call without it.
        if !unsafe { sys::is_culib_present() } {
            return Self { saved: None };
        }
        let saved = match result::ctx::get_current() {
            Ok(current) => Some(current.unwrap_or(std::ptr::null_mut())),
            // Before cuInit no context can be current on any thread.
            Err(result::DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_INITIALIZED)) => Some(std::ptr::null_mut()),
            Err(_) => None,
        };
        Self { saved }
    }
}

impl Default for CurrentContextGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CurrentContextGuard {
    fn drop(&mut self) {
        let Some(saved) = self.saved else { return };
        // Nothing to do (and no driver call) when the context did not change.
        if result::ctx::get_current().is_ok_and(|now| now.unwrap_or(std::ptr::null_mut()) == saved) {
            return;
        }
        // SAFETY: `saved` was current on this thread (or null: none), and a context the caller
        // made current is the caller's to keep alive.
        let _ = unsafe { result::ctx::set_current(saved) };
    }
}

impl std::fmt::Debug for CurrentContextGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CurrentContextGuard").field("saved", &self.saved).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_nothing_is_saved_or_called() {
        // SAFETY: as in `new`.
        if unsafe { sys::is_culib_present() } {
            return;
        }
        // Would panic inside cudarc if it called the driver.
        let guard = CurrentContextGuard::new();
        assert!(guard.saved.is_none());
        drop(guard);
    }
}
