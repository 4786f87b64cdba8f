use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cudarc::driver::{result, sys, CudaSlice, CudaStream, CudaView, DriverError};
use zarrs::array::{ArrayBytes, ArrayError, DataType, ElementOwned, FromArrayBytes};

use crate::config::GpuConfig;
use crate::device::context::GpuContext;
use crate::device::current_context::CurrentContextGuard;
use crate::element::type_name;
use crate::error::GpuError;

/// An array in CUDA device memory: C-order elements of a Zarr data type, with their shape; what
/// every read returns at its core. [`DeviceArray<T>`] is a view of it checked against a Rust
/// element type.
///
/// It owns its memory (what reads return), or wraps memory another library owns and keeps that
/// owner alive ([`DeviceBytes::from_dlpack`]). [`DeviceBytes::into_dlpack`] hands it to other
/// libraries without a copy.
pub struct DeviceBytes {
    /// None when the memory is another library's (`owner`).
    data: Option<CudaSlice<u8>>,
    /// Dropped by hand in `drop`, inside its context guard: a stream's destruction binds its
    /// context on the dropping thread.
    stream: std::mem::ManuallyDrop<Arc<CudaStream>>,
    ptr: sys::CUdeviceptr,
    /// Elements, each `data_type`'s fixed size.
    len: usize,
    shape: Vec<u64>,
    data_type: DataType,
    /// What keeps wrapped memory alive (a DLPack tensor); dropped with the array.
    owner: Option<Box<dyn Send + Sync>>,
    /// Device work that may still write the memory was left running (a read that timed out, a
    /// release whose wait did not end): the memory is never freed or handed back to its owner.
    /// Atomic: any holder of a shared array may find that out.
    abandoned: AtomicBool,
    /// The memory is ours and freed stream-ordered on `stream` (a read's result or a view of one),
    /// so a free ordered after a consumer's stream ([`DeviceBytes::order_release_after`]) is safe.
    stream_ordered_free: bool,
    /// `stream` waits for a consumer's work: the free is not followed by a wait for it.
    consumer_ordered: AtomicBool,
}

/// A typed array in CUDA device memory: [`DeviceBytes`] whose data type is `T`'s, checked when
/// made. Everything untyped (shape, data type, device address, DLPack) comes through `Deref`.
pub struct DeviceArray<T> {
    bytes: DeviceBytes,
    _marker: PhantomData<T>,
}

/// What a device read returns: [`DeviceBytes`] of any fixed-size data type, or a
/// [`DeviceArray<T>`] of `T`'s (as zarrs' `FromArrayBytes` picks `ArrayBytes`, `Vec<T>` or an
/// ndarray).
pub trait FromDeviceBytes: Sized {
    /// Whether this output takes elements of `data_type`: asked before a read starts.
    ///
    /// # Errors
    /// Returns an error naming both where it does not.
    fn check_data_type(data_type: &DataType) -> Result<(), GpuError>;

    /// The output over `bytes`.
    ///
    /// # Errors
    /// Returns an error where `bytes`' data type does not pass [`Self::check_data_type`].
    fn from_device_bytes(bytes: DeviceBytes) -> Result<Self, GpuError>;
}

impl FromDeviceBytes for DeviceBytes {
    fn check_data_type(data_type: &DataType) -> Result<(), GpuError> {
        check_device_type(data_type)
    }

    fn from_device_bytes(bytes: DeviceBytes) -> Result<Self, GpuError> {
        Ok(bytes)
    }
}

impl<T: ElementOwned> FromDeviceBytes for DeviceArray<T> {
    fn check_data_type(data_type: &DataType) -> Result<(), GpuError> {
        check_element::<T>(data_type)
    }

    fn from_device_bytes(bytes: DeviceBytes) -> Result<Self, GpuError> {
        Self::try_from(bytes)
    }
}

impl<T: ElementOwned> TryFrom<DeviceBytes> for DeviceArray<T> {
    type Error = GpuError;

    /// The typed view of `bytes`, where `T` is their data type's element type.
    fn try_from(bytes: DeviceBytes) -> Result<Self, GpuError> {
        check_element::<T>(&bytes.data_type)?;
        Ok(Self { bytes, _marker: PhantomData })
    }
}

impl<T> From<DeviceArray<T>> for DeviceBytes {
    fn from(array: DeviceArray<T>) -> Self {
        array.bytes
    }
}

impl<T> std::ops::Deref for DeviceArray<T> {
    type Target = DeviceBytes;

    fn deref(&self) -> &DeviceBytes {
        &self.bytes
    }
}

impl AsRef<DeviceBytes> for DeviceBytes {
    fn as_ref(&self) -> &DeviceBytes {
        self
    }
}

impl<T> AsRef<DeviceBytes> for DeviceArray<T> {
    fn as_ref(&self) -> &DeviceBytes {
        &self.bytes
    }
}

impl Drop for DeviceBytes {
    fn drop(&mut self) {
        // Freeing, the owner's release (a DLPack deleter) and the stream's destruction bind the
        // context on this thread: all of them happen inside the guard.
        let _current = CurrentContextGuard::new();
        if *self.abandoned.get_mut() {
            if let Some(data) = self.data.take() {
                data.leak();
            }
            std::mem::forget(self.owner.take());
        } else if let Some(data) = self.data.take() {
            // Our memory goes back to the device's output pool; beyond the pool's idle bound it
            // goes on to the driver now, for other libraries sharing the device.
            drop(data);
            // After a consumer's work (which may run long) the next read trims instead.
            if let Some(context) =
                GpuContext::existing(self.stream.context().ordinal()).filter(|_| !*self.consumer_ordered.get_mut())
            {
                if context.holds_freed_beyond_bound() {
                    run_release_wait(&mut || context.after_free(&self.stream));
                }
            }
        }
        drop(self.owner.take());
        // SAFETY: dropped once, here; the field is not used after.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.stream) };
    }
}

/// One allocation of ours that several arrays view ([`DeviceArray::views_of`]): freed with the
/// last of them, as an array's own memory is.
struct SharedBytes {
    data: Option<CudaSlice<u8>>,
    stream: Arc<CudaStream>,
}

impl Drop for SharedBytes {
    fn drop(&mut self) {
        let _current = CurrentContextGuard::new();
        if let Some(data) = self.data.take() {
            drop(data);
            if let Some(context) = GpuContext::existing(self.stream.context().ordinal()) {
                if context.holds_freed_beyond_bound() {
                    run_release_wait(&mut || context.after_free(&self.stream));
                }
            }
        }
    }
}

impl std::fmt::Debug for DeviceBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBytes")
            .field("shape", &self.shape)
            .field("data_type", &self.data_type.to_string())
            .field("device", &self.stream.context().ordinal())
            .finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for DeviceArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceArray").field("element", &std::any::type_name::<T>()).field("bytes", &self.bytes).finish()
    }
}

/// Check that `data_type` is one read to the device: any of a fixed size (numbers, raw bits,
/// fixed-length strings: bytes as zarrs' host read gives them), not those of variable size.
pub(crate) fn check_device_type(data_type: &DataType) -> Result<(), GpuError> {
    match data_type.fixed_size() {
        Some(_) => Ok(()),
        None => Err(GpuError::Unsupported(format!(
            "data type {data_type} is not read to the device (fixed-size types are)"
        ))),
    }
}

/// Check that a destination's data type is the array's (a v2 array's float32 is a v3 one's).
pub(crate) fn check_same_type(destination: &DataType, array: &DataType) -> Result<(), GpuError> {
    if type_name(destination) == type_name(array) && destination.fixed_size() == array.fixed_size() {
        return Ok(());
    }
    Err(GpuError::Unsupported(format!("a destination of {destination} for an array of {array}")))
}

/// Check that `T` is the element type of `data_type`.
pub(crate) fn check_element<T: ElementOwned>(data_type: &DataType) -> Result<(), GpuError> {
    let size = std::mem::size_of::<T>();
    if T::validate_data_type(data_type).is_err() || data_type.fixed_size() != Some(size) {
        return Err(GpuError::ElementType {
            element: std::any::type_name::<T>(),
            size,
            data_type: data_type.to_string(),
        });
    }
    Ok(())
}

impl DeviceBytes {
    /// Take ownership of `bytes` (C-order elements of `data_type`, `shape`) on the device.
    ///
    /// # Safety
    /// `bytes` must hold `shape.iter().product()` valid elements of `data_type`, written by work
    /// ordered before any later use on `bytes`' stream.
    pub(crate) unsafe fn from_cuda_slice(
        bytes: CudaSlice<u8>,
        shape: Vec<u64>,
        data_type: DataType,
    ) -> Result<Self, GpuError> {
        let elem = element_size(&data_type)?;
        let Some(num_bytes) = crate::pipeline::plan::checked_bytes(&shape, elem) else {
            return Err(GpuError::bytes_overflow("a device array of shape", &shape, elem));
        };
        if bytes.len() as u64 != num_bytes {
            let reason = format!("{} device bytes for shape {shape:?} ({num_bytes} bytes)", bytes.len());
            return Err(GpuError::Array(ArrayError::Other(reason)));
        }
        let len = (num_bytes / elem.max(1)) as usize;
        let stream = bytes.stream().clone();
        let ptr = bytes.leak();
        // SAFETY: ptr is the allocation just leaked, on this stream, of num_bytes bytes.
        let data = unsafe { stream.upgrade_device_ptr::<u8>(ptr, num_bytes as usize) };
        Ok(Self {
            data: Some(data),
            stream: std::mem::ManuallyDrop::new(stream),
            ptr,
            len,
            shape,
            data_type,
            owner: None,
            abandoned: AtomicBool::new(false),
            stream_ordered_free: true,
            consumer_ordered: AtomicBool::new(false),
        })
    }

    /// Wrap `len` elements at `ptr`, which `owner` keeps alive, as an array of `shape`.
    ///
    /// # Safety
    /// `ptr` must be device memory of `stream`'s context holding `len` valid elements of
    /// `data_type` (C order, `shape`), usable on `stream`, and valid while `owner` lives.
    pub(crate) unsafe fn from_foreign(
        ptr: sys::CUdeviceptr,
        len: usize,
        shape: Vec<u64>,
        data_type: DataType,
        stream: Arc<CudaStream>,
        owner: Box<dyn Send + Sync>,
    ) -> Self {
        Self {
            data: None,
            stream: std::mem::ManuallyDrop::new(stream),
            ptr,
            len,
            shape,
            data_type,
            owner: Some(owner),
            abandoned: AtomicBool::new(false),
            stream_ordered_free: false,
            consumer_ordered: AtomicBool::new(false),
        }
    }

    /// Views of `bytes`, one per `(byte offset, shape)` of `views`, sharing it: the allocation
    /// goes back to the pool (or, beyond its bound, the driver) once the last view is dropped.
    ///
    /// # Safety
    /// Each view's bytes must hold valid elements of `data_type` (C order, its shape), written by
    /// work ordered before any later use on `bytes`' stream.
    pub(crate) unsafe fn views_of(
        bytes: CudaSlice<u8>,
        views: &[(u64, Vec<u64>)],
        data_type: &DataType,
    ) -> Result<Vec<Self>, GpuError> {
        let elem = element_size(data_type)?;
        let total = bytes.len() as u64;
        let mut lens = Vec::with_capacity(views.len());
        for (offset, shape) in views {
            let num_bytes = crate::pipeline::plan::checked_bytes(shape, elem)
                .ok_or_else(|| GpuError::bytes_overflow("a device array of shape", shape, elem))?;
            if offset.checked_add(num_bytes).is_none_or(|end| end > total) || offset % elem.max(1) != 0 {
                let reason = format!("a view of shape {shape:?} at byte {offset} of {total} device bytes");
                return Err(GpuError::Array(ArrayError::Other(reason)));
            }
            lens.push((num_bytes / elem.max(1)) as usize);
        }
        let stream = bytes.stream().clone();
        let len = bytes.len();
        let base = bytes.leak();
        // SAFETY: the allocation just leaked, on this stream, of `len` bytes.
        let bytes = unsafe { stream.upgrade_device_ptr::<u8>(base, len) };
        let shared = Arc::new(SharedBytes { data: Some(bytes), stream: stream.clone() });
        Ok(views
            .iter()
            .zip(lens)
            .map(|((offset, shape), len)| {
                let owner: Box<dyn Send + Sync> = Box::new(shared.clone());
                // SAFETY: within `bytes` (checked above), which `owner` keeps alive; valid
                // elements by the caller's word.
                let mut view = unsafe {
                    Self::from_foreign(base + offset, len, shape.clone(), data_type.clone(), stream.clone(), owner)
                };
                // `shared` frees on this same stream.
                view.stream_ordered_free = true;
                view
            })
            .collect())
    }

    /// Never free this memory nor hand it back to its owner: device work that may still write
    /// it was left running (a timed-out read into it; the context is lost then).
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    /// Whether [`Self::abandon`] was called.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }

    /// Before a share of this memory goes whose consumer declared the stream it works on
    /// (DLPack's `stream`): order the memory's free after the work queued on `consumer` so far,
    /// without a wait on the host. The free is stream-ordered on the array's stream, which waits
    /// for an event recorded on `consumer` now; the memory pool hands the memory out again only
    /// after that point. Returns false where this cannot serve (memory that is not freed
    /// stream-ordered, a lost context, a failed call): the caller waits as
    /// [`Self::settle_for_release`] does.
    ///
    /// # Safety
    /// `consumer` must be a live stream of the array's context, or `CU_STREAM_LEGACY` (1) or
    /// `CU_STREAM_PER_THREAD` (2).
    pub(crate) unsafe fn order_release_after(&self, consumer: sys::CUstream) -> bool {
        if self.is_abandoned() || !self.stream_ordered_free {
            return false;
        }
        let _current = CurrentContextGuard::new();
        let ctx = self.stream.context();
        if GpuContext::existing(ctx.ordinal()).is_some_and(|c| c.check_alive().is_err()) {
            return false;
        }
        let Ok(event) = ctx.new_event(None) else { return false };
        // SAFETY: a live stream of this context, by the caller's word; the event is ours.
        if unsafe { result::event::record(event.cu_event(), consumer) }.is_err() || self.stream.wait(&event).is_err() {
            return false;
        }
        self.consumer_ordered.store(true, Ordering::Relaxed);
        true
    }

    /// Before a share of this memory goes that another library may still be using on streams
    /// we do not know (a DLPack consumer that declared none, `stream=-1`; the owner of memory
    /// handed out through the CUDA array interface): wait until all work on the device has
    /// finished, for at most [`RELEASE_WAIT`] and only while the device's context is usable.
    /// Where the wait does not end so, the array is marked never to be freed (leaked), since
    /// kernels may still write it. Returns whether the memory may be freed.
    ///
    /// The wait runs through the wrapper of [`set_release_wait_wrapper`] (a Python binding's
    /// releases the interpreter lock) and leaves the thread's current context as it was.
    pub fn settle_for_release(&self) -> bool {
        if self.is_abandoned() {
            return false;
        }
        let ctx = self.stream.context().clone();
        let ordinal = ctx.ordinal();
        let lost = || GpuContext::existing(ordinal).is_some_and(|c| c.check_alive().is_err());
        let mut settled = Settled::Lost;
        let mut wait = || {
            let deadline = Instant::now() + RELEASE_WAIT;
            let ctx = ctx.clone();
            settled = wait_bounded(move || ctx.synchronize(), deadline, &lost);
        };
        run_release_wait(&mut wait);
        if settled != Settled::Idle {
            self.abandon();
        }
        !self.is_abandoned()
    }

    /// Before a share of this memory goes to a consumer that ordered its work as `how` says:
    /// after its declared stream without a host wait where that serves, else after the whole
    /// device ([`Self::settle_for_release`]). Returns whether the memory may be freed.
    pub(crate) fn release_after(&self, how: ReleaseOrder) -> bool {
        if let ReleaseOrder::AfterStream(stream) = how {
            // SAFETY: a stream the consumer declared for its work on this memory (the DLPack
            // protocol's word), which it released after its last use there.
            if unsafe { self.order_release_after(stream) } {
                return true;
            }
        }
        self.settle_for_release()
    }

    /// The shape.
    #[must_use]
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The same elements with another shape of as many elements (C order): dimensions of extent
    /// 1 dropped or added, say.
    ///
    /// # Errors
    /// Returns an error when `shape` holds another number of elements.
    pub fn reshape(mut self, shape: Vec<u64>) -> Result<Self, GpuError> {
        let count = shape.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
        if count != Some(self.len as u64) {
            return Err(GpuError::Unsupported(format!(
                "an array of {} elements cannot take shape {shape:?}",
                self.len
            )));
        }
        self.shape = shape;
        Ok(self)
    }

    /// The Zarr data type of the elements.
    #[must_use]
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }

    /// The number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no elements.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size in bytes.
    #[must_use]
    pub fn num_bytes(&self) -> usize {
        self.len * self.data_type.fixed_size().unwrap_or(0)
    }

    /// The device buffer's bytes, to hand on to other CUDA code; None for memory another library
    /// owns (use [`Self::device_ptr`]).
    #[must_use]
    pub fn as_cuda_bytes(&self) -> Option<&CudaSlice<u8>> {
        self.data.as_ref()
    }

    /// The device buffer and the shape; the array back for memory another library owns.
    ///
    /// # Errors
    /// Returns `self` when it wraps memory it does not own, or work left running after a timed-out
    /// read may still write it.
    #[allow(clippy::result_large_err)] // the array itself, handed back as `Arc::try_unwrap` does
    pub fn into_parts(mut self) -> Result<(CudaSlice<u8>, Vec<u64>), Self> {
        if *self.abandoned.get_mut() {
            return Err(self);
        }
        match self.data.take() {
            Some(data) => Ok((data, std::mem::take(&mut self.shape))),
            None => Err(self),
        }
    }

    /// The raw device address of the first element (valid while `self` lives).
    #[must_use]
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The stream the buffer belongs to.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Copy the elements' bytes back to the host (C order, the array's in-memory byte order:
    /// little-endian on the platforms CUDA runs on).
    ///
    /// # Errors
    /// Returns the driver's error when the copy fails.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>, GpuError> {
        let _current = CurrentContextGuard::new();
        let mut bytes = vec![0u8; self.num_bytes()];
        self.stream().synchronize().map_err(GpuError::cuda("waiting for the array's stream"))?;
        self.stream().context().bind_to_thread().map_err(GpuError::cuda("binding the CUDA context"))?;
        if !bytes.is_empty() {
            // SAFETY: ptr is valid for num_bytes bytes while self lives; the stream is synchronized.
            unsafe { result::memcpy_dtoh_sync(&mut bytes, self.ptr) }.map_err(GpuError::cuda("copying to the host"))?;
        }
        Ok(bytes)
    }
}

impl<T: ElementOwned> DeviceArray<T> {
    /// The same elements with another shape of as many elements (C order): dimensions of extent
    /// 1 dropped or added, say.
    ///
    /// # Errors
    /// Returns an error when `shape` holds another number of elements.
    pub fn reshape(self, shape: Vec<u64>) -> Result<Self, GpuError> {
        Ok(Self { bytes: self.bytes.reshape(shape)?, _marker: PhantomData })
    }

    /// The untyped array.
    #[must_use]
    pub fn into_bytes(self) -> DeviceBytes {
        self.bytes
    }

    /// The device buffer, to hand on to other CUDA code (cudarc kernels, cuBLAS, ...); None for
    /// memory another library owns (use [`DeviceBytes::device_ptr`]).
    #[must_use]
    pub fn as_cuda_slice(&self) -> Option<CudaView<'_, T>> {
        // SAFETY: the bytes hold `len` elements of `T` (the data type checked when made).
        self.bytes.data.as_ref().and_then(|data| unsafe { data.transmute::<T>(self.bytes.len) })
    }

    /// The device buffer and the shape; the array back for memory another library owns.
    ///
    /// # Errors
    /// Returns `self` when it wraps memory it does not own, or work left running after a timed-out
    /// read may still write it.
    #[allow(clippy::result_large_err)] // the array itself, handed back as `Arc::try_unwrap` does
    pub fn into_parts(self) -> Result<(CudaSlice<T>, Vec<u64>), Self> {
        let len = self.bytes.len;
        match self.bytes.into_parts() {
            Ok((data, shape)) => {
                let stream = data.stream().clone();
                let ptr = data.leak();
                // SAFETY: the allocation just leaked, on this stream, of `len` elements of `T`.
                Ok((unsafe { stream.upgrade_device_ptr::<T>(ptr, len) }, shape))
            }
            Err(bytes) => Err(Self { bytes, _marker: PhantomData }),
        }
    }

    /// Copy the elements back to the host.
    ///
    /// # Errors
    /// Returns the driver's error when the copy fails.
    pub fn to_host(&self) -> Result<Vec<T>, GpuError> {
        let bytes = self.to_host_bytes()?;
        T::from_array_bytes(&self.data_type, ArrayBytes::new_flen(bytes)).map_err(|e| GpuError::Array(e.into()))
    }
}

/// The fixed size of an element of `data_type`, one read to the device.
pub(crate) fn element_size(data_type: &DataType) -> Result<u64, GpuError> {
    check_device_type(data_type)?;
    data_type
        .fixed_size()
        .map(|n| n as u64)
        .ok_or_else(|| GpuError::Unsupported(format!("data type {data_type} has no fixed size")))
}

/// What a release of shared memory waits for: the consumer's declared stream, or (streams
/// unknown) the whole device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReleaseOrder {
    /// The consumer works on this stream: the free is ordered after it, no host wait.
    AfterStream(sys::CUstream),
    /// The consumer's streams are unknown: wait (bounded) for the whole device.
    WholeDevice,
}

/// How long a release ([`DeviceBytes::settle_for_release`]) waits for the device before it
/// leaves the memory leaked: as long as a batch of a read may take before it times out.
pub const RELEASE_WAIT: Duration = Duration::from_mins(1);

/// How often a release's wait looks whether the context was lost meanwhile (a timed-out read on
/// another thread): a kernel that never ends keeps a context-wide wait blocked for good.
const RELEASE_POLL: Duration = Duration::from_millis(50);

/// What runs each blocking wait of a release, set once per process.
static RELEASE_WAIT_WRAPPER: OnceLock<fn(&mut dyn FnMut())> = OnceLock::new();

/// Run `wait` through the wrapper set by [`set_release_wait_wrapper`], if any.
fn run_release_wait(wait: &mut dyn FnMut()) {
    match RELEASE_WAIT_WRAPPER.get() {
        Some(wrapper) => wrapper(wait),
        None => wait(),
    }
}

/// Run every blocking wait of a release ([`DeviceBytes::settle_for_release`], DLPack deleters)
/// through `wrapper`, which must call the function it gets once, on the same thread: a Python
/// binding releases the interpreter lock around it, so that other threads (the one whose read
/// times out among them) go on. Returns false when a wrapper was set before (it stays).
pub fn set_release_wait_wrapper(wrapper: fn(&mut dyn FnMut())) -> bool {
    RELEASE_WAIT_WRAPPER.set(wrapper).is_ok()
}

/// How a bounded wait for the device ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The work finished: the memory may be freed.
    Idle,
    /// The wait failed (a faulted context).
    Failed,
    /// The deadline passed first.
    TimedOut,
    /// The context was (or became) lost: its work may never finish.
    Lost,
}

/// Run the blocking `wait` on a helper thread and wait for it until `deadline`, looking every
/// [`RELEASE_POLL`] whether `lost` says the context was lost. A blocking CUDA wait cannot time
/// out, and the work to wait for is the whole context's (a consumer's streams are not ours), so
/// no event serves as in `GpuContext::wait_until`; a helper left blocked stays so (the context
/// is lost or hung then anyway).
pub(crate) fn wait_bounded(
    wait: impl FnOnce() -> Result<(), DriverError> + Send + 'static,
    deadline: Instant,
    lost: &dyn Fn() -> bool,
) -> Settled {
    if lost() {
        return Settled::Lost;
    }
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(wait());
    });
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match waited.recv_timeout(left.min(RELEASE_POLL)) {
            Ok(Ok(())) => return Settled::Idle,
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => return Settled::Failed,
            Err(RecvTimeoutError::Timeout) if lost() => return Settled::Lost,
            Err(RecvTimeoutError::Timeout) if left <= RELEASE_POLL => return Settled::TimedOut,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// zarrs' generic retrieval (`array.retrieve_array_subset::<DeviceArray<T>>(..)`) decodes on the
/// host, then this copies the result to the device of the GPU mode in force
/// ([`with_gpu_config`](crate::with_gpu_config); outside it [`GpuConfig::from_env`]'s device). For reads straight from
/// storage to the device use [`ArrayDeviceExt`](crate::ArrayDeviceExt).
impl<T: ElementOwned> FromArrayBytes for DeviceArray<T> {
    fn from_array_bytes(bytes: ArrayBytes<'static>, shape: &[u64], data_type: &DataType) -> Result<Self, ArrayError> {
        check_element::<T>(data_type)?;
        Ok(DeviceBytes::from_array_bytes(bytes, shape, data_type)?.try_into()?)
    }
}

/// As for [`DeviceArray`], of any data type read to the device.
impl FromArrayBytes for DeviceBytes {
    fn from_array_bytes(bytes: ArrayBytes<'static>, shape: &[u64], data_type: &DataType) -> Result<Self, ArrayError> {
        check_device_type(data_type)?;
        let bytes =
            bytes.into_fixed().map_err(|_| ArrayError::Other("DeviceArray needs a fixed-size data type".into()))?;
        let config = GpuConfig::current()?;
        let _current = CurrentContextGuard::new();
        let context = GpuContext::get(config.device())?;
        context.check_alive()?;
        let device = context.upload(&bytes).map_err(|err| context.contain(err))?;
        // SAFETY: the bytes were copied synchronously and are `shape` elements of `data_type`.
        Ok(unsafe { Self::from_cuda_slice(device, shape.to_vec(), data_type.clone()) }?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    const BLOCKED: DriverError = DriverError(sys::cudaError_enum::CUDA_ERROR_UNKNOWN);

    /// Reads take every fixed-size data type (raw bits and fixed-length strings too, as bytes);
    /// a destination must be of the array's type, a v2 array's name matching a v3 one's.
    #[test]
    fn every_fixed_size_type_is_read_and_a_destination_is_of_the_arrays_type() {
        use zarrs::array::data_type;
        let utf32 = data_type::fixed_length_utf32(std::num::NonZeroU64::new(12).unwrap()).unwrap();
        for dt in [data_type::float32(), data_type::raw_bits(2), data_type::raw_bits(8), utf32.clone()] {
            check_device_type(&dt).unwrap();
            check_same_type(&dt, &dt).unwrap();
            assert_eq!(element_size(&dt).unwrap(), dt.fixed_size().unwrap() as u64);
        }
        let err = check_device_type(&data_type::string()).unwrap_err();
        assert!(err.to_string().contains("not read to the device"), "{err}");
        assert!(
            check_same_type(&data_type::uint16(), &data_type::raw_bits(2)).is_err(),
            "same size, not the same type"
        );
        assert!(check_same_type(&data_type::raw_bits(4), &data_type::raw_bits(2)).is_err());
        assert!(check_same_type(&data_type::uint32(), &utf32).is_err());
    }

    /// A wait that never ends by itself (a kernel that never finishes).
    fn never() -> impl FnOnce() -> Result<(), DriverError> + Send + 'static {
        || loop {
            std::thread::sleep(Duration::from_hours(1));
        }
    }

    #[test]
    fn a_release_wait_that_never_ends_gives_up_at_its_deadline() {
        let start = Instant::now();
        let settled = wait_bounded(never(), start + Duration::from_millis(300), &|| false);
        assert_eq!(settled, Settled::TimedOut);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_release_wait_ends_when_the_context_is_lost() {
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            flag.store(true, Ordering::Relaxed);
        });
        let start = Instant::now();
        let settled = wait_bounded(never(), start + Duration::from_mins(1), &|| lost.load(Ordering::Relaxed));
        assert_eq!(settled, Settled::Lost);
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
        // Lost before: no wait at all.
        assert_eq!(wait_bounded(|| Ok(()), Instant::now() + Duration::from_mins(1), &|| true), Settled::Lost);
    }

    #[test]
    fn a_release_wait_that_ends_frees_and_one_that_fails_does_not() {
        let far = Instant::now() + Duration::from_mins(1);
        assert_eq!(wait_bounded(|| Ok(()), far, &|| false), Settled::Idle);
        assert_eq!(wait_bounded(|| Err(BLOCKED), far, &|| false), Settled::Failed);
        let slow = || {
            std::thread::sleep(Duration::from_millis(150));
            Ok(())
        };
        assert_eq!(wait_bounded(slow, far, &|| false), Settled::Idle);
    }
}
