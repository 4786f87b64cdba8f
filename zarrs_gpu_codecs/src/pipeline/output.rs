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
    /// The destination of a result of `bytes` bytes: where a caller's destination has another
    /// length, an error (the one place that checks it).
    pub(crate) fn holding(self, bytes: u64) -> Result<Destination, GpuError> {
        match self {
            Output::Into { len, .. } if len as u64 != bytes => {
                Err(GpuError::Unsupported(format!("the destination holds {len} bytes, {bytes} expected")))
            }
            _ => Ok(Destination { output: self, bytes }),
        }
    }
}

/// An [`Output`] for a result of `bytes` bytes, its length checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Destination {
    pub(crate) output: Output,
    pub(crate) bytes: u64,
}

impl Destination {
    /// Device memory the result allocates: all of it for a new output, none for a caller's
    /// destination (it exists already, outside the free memory).
    pub(crate) fn allocated(self) -> u64 {
        match self.output {
            Output::New => self.bytes,
            Output::Into { .. } => 0,
        }
    }

    /// The buffer (a new one, returned) and its address.
    fn buffer(self, context: &GpuContext, stream: &Arc<CudaStream>) -> Result<(Option<CudaSlice<u8>>, u64), GpuError> {
        match self.output {
            Output::New => {
                let (out, ptr) = context.alloc_output(stream, self.bytes as usize)?;
                Ok((Some(out), ptr))
            }
            Output::Into { ptr, .. } => Ok((None, ptr)),
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
    /// The destination's buffer: a large new one (`meanwhile`: nothing is read
    /// straight into it before placement) is allocated on a thread of `scope`, on a stream of
    /// its own (the read's stream has the batches' work queued, which its allocation would wait
    /// for), anything else now.
    pub(crate) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        destination: Destination,
        context: &'env GpuContext,
        stream: &Arc<CudaStream>,
        meanwhile: bool,
    ) -> Result<Self, GpuError> {
        let out_bytes = destination.bytes;
        let state = match destination.output {
            Output::New if meanwhile && out_bytes >= ALLOCATE_MEANWHILE => {
                State::Allocating(scope.spawn(move || -> Allocated {
                    let own = context.new_stream()?;
                    context.alloc_output(&own, out_bytes as usize)
                }))
            }
            _ => {
                let (out, ptr) = destination.buffer(context, stream)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_must_hold_the_result_and_only_a_new_output_allocates() {
        assert_eq!(Output::New.holding(96).unwrap().allocated(), 96);
        let into = Output::Into { ptr: 0x1000, len: 96 };
        assert_eq!(into.holding(96).unwrap().allocated(), 0);
        let err = into.holding(95).unwrap_err().to_string();
        assert!(err.contains("holds 96 bytes, 95 expected"), "{err}");
        assert!(Output::Into { ptr: 0x1000, len: 4 }.holding(0).is_err(), "an empty result needs an empty destination");
    }
}
