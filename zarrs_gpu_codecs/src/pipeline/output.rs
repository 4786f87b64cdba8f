//! Where a retrieval's elements go: a new buffer of the context's output pool, or a caller's
//! device memory; and, for large new outputs, the allocation made on another thread while the
//! first batch is read.

use std::sync::{Arc, Mutex};
use std::thread::{Scope, ScopedJoinHandle};

use cudarc::driver::{CudaSlice, CudaStream};

use crate::device::context::GpuContext;
use crate::error::GpuError;

/// Where a retrieval's elements go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Output {
    /// A new allocation of the context's, returned.
    New,
    /// `len` bytes of device memory at `ptr` that the caller holds, of the context's device,
    /// with its earlier work done; written in place (unspecified after an error).
    Into { ptr: u64, len: usize },
}

impl Output {
    /// The output's buffer (a new one, returned) and its address, for `out_bytes` bytes.
    fn buffer(
        self,
        context: &GpuContext,
        stream: &Arc<CudaStream>,
        out_bytes: u64,
    ) -> Result<(Option<CudaSlice<u8>>, u64), GpuError> {
        self.fits(out_bytes)?;
        match self {
            Output::New => {
                let (out, ptr) = context.alloc_output(stream, out_bytes as usize)?;
                Ok((Some(out), ptr))
            }
            Output::Into { ptr, .. } => Ok((None, ptr)),
        }
    }

    /// Device memory the output allocates for `out_bytes` bytes: all of them for a new one,
    /// none for a caller's destination (it exists already, outside the free memory).
    pub(crate) fn allocated(self, out_bytes: u64) -> u64 {
        match self {
            Output::New => out_bytes,
            Output::Into { .. } => 0,
        }
    }

    /// Whether the output takes `out_bytes` bytes (a caller's destination must be that long).
    pub(crate) fn fits(self, out_bytes: u64) -> Result<(), GpuError> {
        match self {
            Output::Into { len, .. } if len as u64 != out_bytes => {
                Err(GpuError::Unsupported(format!("the destination holds {len} bytes, {out_bytes} expected")))
            }
            _ => Ok(()),
        }
    }
}

/// New outputs at least this large are allocated on another thread while the first batch is
/// read: the pool maps memory it gave back at about 1 ms a GiB (H200: 8 GiB in 8 to 10 ms,
/// `cudaMalloc` of 12 GiB in 0.5), and only placement needs the output. A thread costs tens of
/// microseconds: small reads allocate at once.
const ALLOCATE_MEANWHILE: u64 = 256 << 20;

/// The output's buffer and address: ready, or being allocated on another thread until first
/// needed.
pub(crate) struct OutputBuffer<'scope> {
    state: Mutex<State<'scope>>,
}

type Allocated = Result<(CudaSlice<u8>, u64), GpuError>;

enum State<'scope> {
    Ready(Option<CudaSlice<u8>>, u64),
    Allocating(ScopedJoinHandle<'scope, Allocated>),
    Failed,
}

impl<'scope> OutputBuffer<'scope> {
    /// `output`'s buffer for `out_bytes` bytes: a large new one (`meanwhile`: nothing is read
    /// straight into it before placement) is allocated on a thread of `scope`, on a stream of
    /// its own (the read's stream has the batches' work queued, which its allocation would wait
    /// for), anything else now.
    pub(crate) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        output: Output,
        context: &'env GpuContext,
        stream: &Arc<CudaStream>,
        out_bytes: u64,
        meanwhile: bool,
    ) -> Result<Self, GpuError> {
        output.fits(out_bytes)?;
        let state = match output {
            Output::New if meanwhile && out_bytes >= ALLOCATE_MEANWHILE => {
                State::Allocating(scope.spawn(move || -> Allocated {
                    let own = context.new_stream()?;
                    context.alloc_output(&own, out_bytes as usize)
                }))
            }
            _ => {
                let (out, ptr) = output.buffer(context, stream, out_bytes)?;
                State::Ready(out, ptr)
            }
        };
        Ok(Self { state: Mutex::new(state) })
    }

    /// Make the new buffer's own stream, where it is freed when dropped, wait for `stream`'s
    /// work, which writes it: a read that fails may leave work there that must not find the
    /// memory freed (an allocation on the read's stream was freed after it by construction). A
    /// buffer whose free cannot be ordered so is leaked.
    pub(crate) fn order_free_after(&self, stream: &CudaStream) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let State::Ready(Some(out), _) = &*state else { return };
        if std::ptr::eq(out.stream().as_ref(), stream) {
            return;
        }
        if stream.record_event(None).and_then(|done| out.stream().wait(&done)).is_err() {
            if let State::Ready(out, _) = std::mem::replace(&mut *state, State::Failed) {
                std::mem::forget(out);
            }
        }
    }

    /// The new buffer (None for a caller's destination), once allocated.
    pub(crate) fn into_buffer(self) -> Result<Option<CudaSlice<u8>>, GpuError> {
        self.ptr()?;
        match self.state.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
            State::Ready(out, _) => Ok(out),
            _ => Err(GpuError::Unsupported("the output could not be allocated".into())),
        }
    }
}

/// The output's device address, once its allocation is complete (what the batches see of an
/// [`OutputBuffer`], whatever the lifetime of the thread allocating it).
pub(crate) trait OutputAddress: Sync {
    fn ptr(&self) -> Result<u64, GpuError>;
}

impl OutputAddress for OutputBuffer<'_> {
    fn ptr(&self) -> Result<u64, GpuError> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let State::Allocating(_) = &*state {
            let State::Allocating(handle) = std::mem::replace(&mut *state, State::Failed) else { unreachable!() };
            let (out, ptr) = handle
                .join()
                .map_err(|_| GpuError::Unsupported("the thread allocating the output panicked".into()))??;
            *state = State::Ready(Some(out), ptr);
        }
        match &*state {
            State::Ready(_, ptr) => Ok(*ptr),
            _ => Err(GpuError::Unsupported("the output could not be allocated".into())),
        }
    }
}
