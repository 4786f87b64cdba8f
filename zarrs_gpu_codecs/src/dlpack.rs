//! DLPack: device arrays handed to other libraries (PyTorch, CuPy, JAX, ...) without a copy, and
//! their device tensors wrapped as device arrays.

use std::any::TypeId;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use dlpark::ffi::{DataType as DlType, DataTypeCode, Device, DeviceType, Flags};
use dlpark::traits::{RowMajorCompactLayout, TensorLike, TensorView};
use dlpark::{SafeManagedTensor, SafeManagedTensorVersioned};
use zarrs::array::{DataType, ElementOwned};

use crate::device::current_context::CurrentContextGuard;
use crate::device_array::{check_element, DeviceArray, ReleaseOrder};
use crate::error::GpuError;

/// How the consumer of a DLPack tensor orders its use of the data after the work that wrote it
/// (the `stream` argument of the Python array API's `__dlpack__`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DlpackStream {
    /// Wait on the host until the array's stream has finished: safe for any consumer.
    Synchronize,
    /// The consumer orders its work itself (`stream=-1`).
    NoSync,
    /// The consumer's work will run on this stream: it waits on the array's stream (an event, no
    /// host wait). `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2) are streams here too.
    Stream(sys::CUstream),
}

impl DlpackStream {
    /// The `stream` argument of `__dlpack__` for a CUDA array, as the Python array API defines it:
    /// None is the legacy default stream, -1 no synchronisation, 1 and 2 the legacy and the
    /// per-thread default streams, other values a stream handle.
    ///
    /// # Errors
    /// Returns an error for 0, which the standard forbids for CUDA (it is ambiguous), and for
    /// other negative values.
    pub fn from_protocol(stream: Option<i64>) -> Result<Self, GpuError> {
        match stream {
            None => Ok(Self::Stream(1 as sys::CUstream)),
            Some(-1) => Ok(Self::NoSync),
            Some(n) if n > 0 => Ok(Self::Stream(n as usize as sys::CUstream)),
            Some(n) => Err(GpuError::Unsupported(format!(
                "__dlpack__(stream={n}): a CUDA stream is -1, 1 (legacy default), 2 (per-thread default) or a stream handle"
            ))),
        }
    }
}

/// The DLPack data type of element type `T`.
fn dl_type<T: 'static>() -> Option<DlType> {
    let t = TypeId::of::<T>();
    let types: [(TypeId, DlType); 14] = [
        (TypeId::of::<bool>(), DlType::BOOL),
        (TypeId::of::<i8>(), DlType::I8),
        (TypeId::of::<i16>(), DlType::I16),
        (TypeId::of::<i32>(), DlType::I32),
        (TypeId::of::<i64>(), DlType::I64),
        (TypeId::of::<u8>(), DlType::U8),
        (TypeId::of::<u16>(), DlType::U16),
        (TypeId::of::<u32>(), DlType::U32),
        (TypeId::of::<u64>(), DlType::U64),
        (TypeId::of::<half::f16>(), DlType::F16),
        (TypeId::of::<half::bf16>(), DlType::BF16),
        (TypeId::of::<f32>(), DlType::F32),
        (TypeId::of::<f64>(), DlType::F64),
        (TypeId::of::<num_complex::Complex<f32>>(), DlType { code: DataTypeCode::Complex, bits: 64, lanes: 1 }),
    ];
    if t == TypeId::of::<num_complex::Complex<f64>>() {
        return Some(DlType { code: DataTypeCode::Complex, bits: 128, lanes: 1 });
    }
    types.iter().find(|(id, _)| *id == t).map(|(_, dl)| *dl)
}

fn unsupported<T>() -> GpuError {
    GpuError::Unsupported(format!("DLPack has no data type for {}", std::any::type_name::<T>()))
}

/// What the release of a tensor exported as `stream` says must finish before its memory is
/// freed: the consumer may have queued work on the memory and still call the deleter now
/// (PyTorch does). A consumer that declared its stream works there (the free is ordered after
/// it, no host wait); for one that did not (`stream=-1`, or the Rust caller's `Synchronize`)
/// its streams are unknown: the whole device.
pub(crate) fn release_order(stream: DlpackStream) -> ReleaseOrder {
    match stream {
        DlpackStream::Stream(theirs) => ReleaseOrder::AfterStream(theirs),
        DlpackStream::NoSync | DlpackStream::Synchronize => ReleaseOrder::WholeDevice,
    }
}

/// A device array inside a DLPack tensor: released by the consumer's call of the deleter (freed
/// with the last tensor or owner that shares it).
struct Exported<T: ElementOwned> {
    array: Arc<DeviceArray<T>>,
    dl_type: DlType,
    /// How the consumer orders its work: what the release waits for.
    release: ReleaseOrder,
}

impl<T: ElementOwned> Drop for Exported<T> {
    fn drop(&mut self) {
        // A context lost (to a hung batch) or a device-wide wait that does not end leaves the
        // memory leaked.
        let _current = CurrentContextGuard::new();
        self.array.release_after(self.release);
    }
}

impl<T: ElementOwned> TensorLike<RowMajorCompactLayout> for Exported<T> {
    type Error = GpuError;

    fn data_ptr(&self) -> *mut std::ffi::c_void {
        self.array.device_ptr() as usize as *mut std::ffi::c_void
    }

    fn memory_layout(&self) -> RowMajorCompactLayout {
        // Checked when exported: every extent fits in i64.
        RowMajorCompactLayout::new(self.array.shape().iter().map(|&n| n as i64).collect())
    }

    fn device(&self) -> Result<Device, GpuError> {
        Ok(Device::cuda(self.array.stream().context().ordinal()))
    }

    fn data_type(&self) -> Result<DlType, GpuError> {
        Ok(self.dl_type)
    }

    fn byte_offset(&self) -> u64 {
        0
    }
}

impl<T: ElementOwned + 'static> DeviceArray<T> {
    /// Hand the array to another library as a DLPack tensor (DLPack 1.x, writable), without a
    /// copy: the tensor owns the memory, and the consumer's deleter frees it. `stream` orders the
    /// consumer's work after the read that wrote the array, and the free after the consumer's
    /// work: for [`DlpackStream::Stream`] the free waits, on the device, for that stream as it is
    /// when the deleter runs (no host wait; the stream must still live then); otherwise the
    /// deleter waits for the whole device (bounded, [`crate::RELEASE_WAIT`]).
    ///
    /// The tensor's `Deref` to bytes reads host memory: never use it on a device tensor.
    ///
    /// # Errors
    /// Returns an error when `T` has no DLPack data type, an extent does not fit in i64, or the
    /// ordering fails.
    pub fn into_dlpack(self, stream: DlpackStream) -> Result<SafeManagedTensorVersioned, GpuError> {
        Self::share_dlpack(&Arc::new(self), stream)
    }

    /// As [`Self::into_dlpack`], as an unversioned (DLPack 0.x) tensor for consumers that take no
    /// other.
    ///
    /// # Errors
    /// As [`Self::into_dlpack`].
    pub fn into_dlpack_legacy(self, stream: DlpackStream) -> Result<SafeManagedTensor, GpuError> {
        Self::share_dlpack_legacy(&Arc::new(self), stream)
    }

    /// As [`Self::into_dlpack`] for an array that stays shared: the tensor holds one more
    /// reference, and every holder sees the same memory (as `__dlpack__` called twice on one
    /// Python array).
    ///
    /// # Errors
    /// As [`Self::into_dlpack`].
    pub fn share_dlpack(array: &Arc<Self>, stream: DlpackStream) -> Result<SafeManagedTensorVersioned, GpuError> {
        SafeManagedTensorVersioned::with_flags(Self::export(array, stream)?, Flags::empty())
    }

    /// As [`Self::share_dlpack`], unversioned (DLPack 0.x).
    ///
    /// # Errors
    /// As [`Self::into_dlpack`].
    pub fn share_dlpack_legacy(array: &Arc<Self>, stream: DlpackStream) -> Result<SafeManagedTensor, GpuError> {
        SafeManagedTensor::new(Self::export(array, stream)?)
    }

    fn export(array: &Arc<Self>, stream: DlpackStream) -> Result<Exported<T>, GpuError> {
        let _current = CurrentContextGuard::new();
        let dl_type = dl_type::<T>().ok_or_else(unsupported::<T>)?;
        if array.shape().iter().any(|&n| i64::try_from(n).is_err()) {
            return Err(GpuError::Overflow(format!("shape {:?}: an extent exceeds DLPack's i64", array.shape())));
        }
        let ours = array.stream().clone();
        match stream {
            DlpackStream::Synchronize => {
                ours.synchronize().map_err(GpuError::cuda("waiting for the array's stream"))?;
            }
            DlpackStream::NoSync => {}
            DlpackStream::Stream(theirs) => {
                let event = ours.record_event(None).map_err(GpuError::cuda("recording an event"))?;
                // SAFETY: both handles are live streams of this context (the consumer's word for
                // theirs); the event may be destroyed once the wait is queued.
                unsafe {
                    result::stream::wait_event(theirs, event.cu_event(), sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
                }
                .map_err(GpuError::cuda("ordering the consumer's stream after the read"))?;
            }
        }
        Ok(Exported { array: array.clone(), dl_type, release: release_order(stream) })
    }

    /// Wrap a CUDA DLPack tensor another library owns, as an array of `data_type` (whose element
    /// type must be `T`), without a copy; the tensor is released when the array is dropped. The
    /// tensor's data must be ready for work on its device's default stream (the producer's
    /// `__dlpack__(stream=...)` orders that). The array releases the tensor where it is dropped:
    /// drop it where the producer's deleter may run (a Python producer's, with the GIL held).
    ///
    /// # Errors
    /// Returns an error when the tensor is not in CUDA memory, not C-contiguous, of another data
    /// type, or read-only.
    pub fn from_dlpack(tensor: SafeManagedTensorVersioned, data_type: DataType) -> Result<Self, GpuError> {
        let _current = CurrentContextGuard::new();
        check_element::<T>(&data_type)?;
        if tensor.read_only() {
            return Err(GpuError::Unsupported("the DLPack tensor is read-only".into()));
        }
        let dl = *tensor.dl_tensor();
        if dl.device.device_type != DeviceType::Cuda {
            return Err(GpuError::Unsupported(format!("the DLPack tensor is on {:?}, not a CUDA device", dl.device)));
        }
        if Some(dl.dtype) != dl_type::<T>() {
            return Err(GpuError::Unsupported(format!(
                "the DLPack tensor holds {:?}, not {} ({data_type})",
                dl.dtype,
                std::any::type_name::<T>()
            )));
        }
        let shape: Vec<u64> =
            tensor.shape().iter().map(|&n| u64::try_from(n)).collect::<Result<_, _>>().map_err(|_| {
                GpuError::Unsupported(format!("the DLPack tensor's shape {:?} is negative", tensor.shape()))
            })?;
        if let Some(strides) = tensor.strides().filter(|s| !c_contiguous(tensor.shape(), s)) {
            return Err(GpuError::Unsupported(format!(
                "the DLPack tensor is not C-contiguous (shape {:?}, strides {strides:?})",
                tensor.shape()
            )));
        }
        let elem = std::mem::size_of::<T>() as u64;
        let num_bytes = crate::pipeline::plan::checked_bytes(&shape, elem)
            .ok_or_else(|| GpuError::bytes_overflow("a DLPack tensor of shape", &shape, elem))?;
        let ordinal = usize::try_from(dl.device.device_id)
            .map_err(|_| GpuError::Unsupported(format!("DLPack device id {}", dl.device.device_id)))?;
        let stream = crate::reader::cuda_context(ordinal)?.default_stream();
        let ptr = (dl.data as usize as u64)
            .checked_add(dl.byte_offset)
            .ok_or_else(|| GpuError::Overflow("the DLPack tensor's address and offset".into()))?;
        let len = (num_bytes / elem.max(1)) as usize;
        // SAFETY: the tensor describes `len` C-contiguous elements of T (checked above) in CUDA
        // memory of device `ordinal`, valid while the tensor lives; the array keeps it.
        Ok(unsafe { Self::from_foreign(ptr, len, shape, data_type, stream, Box::new(Owner { _tensor: tensor })) })
    }
}

/// Whether elements of `shape` laid out with `strides` (in elements) are in C order without gaps.
/// A tensor of no elements is, whatever its strides (numpy and CuPy give those of extents of 1 in
/// place of the zeros); extents of 1 take any stride.
fn c_contiguous(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&n, &stride) in shape.iter().zip(strides).rev() {
        if n != 1 && stride != expected {
            return false;
        }
        expected = expected.saturating_mul(n);
    }
    true
}

/// The wrapped tensor, kept alive by the array and released (its deleter called) with it.
struct Owner {
    _tensor: SafeManagedTensorVersioned,
}
// SAFETY: the tensor is only held and finally dropped (its deleter called once), never read
// through. Where the deleter may run is the producer's rule, which `from_dlpack` passes on to
// the caller (a Python producer's needs the GIL).
unsafe impl Send for Owner {}
// SAFETY: as above: no access through a shared reference.
unsafe impl Sync for Owner {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_map_to_dlpack() {
        assert_eq!(dl_type::<f32>(), Some(DlType::F32));
        assert_eq!(dl_type::<half::bf16>(), Some(DlType::BF16));
        assert_eq!(dl_type::<num_complex::Complex<f64>>().map(|t| t.bits), Some(128));
        assert_eq!(dl_type::<[u8; 3]>(), None);
    }

    #[test]
    fn host_and_read_only_tensors_are_refused() {
        let float32 = zarrs::array::data_type::float32();
        // Read-only (dlpark's default flags), then writable but in host memory.
        let err =
            DeviceArray::<f32>::from_dlpack(SafeManagedTensorVersioned::new(vec![1f32; 4]).unwrap(), float32.clone())
                .unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
        let host = SafeManagedTensorVersioned::with_flags(vec![1f32; 4], Flags::empty()).unwrap();
        let err = DeviceArray::<f32>::from_dlpack(host, float32).unwrap_err();
        assert!(err.to_string().contains("not a CUDA device"), "{err}");
        // The element type must be the data type's.
        let host = SafeManagedTensorVersioned::with_flags(vec![1u16; 4], Flags::empty()).unwrap();
        let err = DeviceArray::<f32>::from_dlpack(host, zarrs::array::data_type::uint16()).unwrap_err();
        assert!(matches!(err, GpuError::ElementType { .. }), "{err}");
    }

    /// A CUDA tensor of no elements, with the strides numpy and CuPy give one of shape [3, 0, 4]
    /// (in elements: as if the zero were 1), and no memory behind it.
    struct EmptyCuda;

    impl TensorLike<dlpark::traits::StridedLayout> for EmptyCuda {
        type Error = GpuError;

        fn data_ptr(&self) -> *mut std::ffi::c_void {
            std::ptr::null_mut()
        }

        fn memory_layout(&self) -> dlpark::traits::StridedLayout {
            dlpark::traits::StridedLayout::new(vec![3, 0, 4, 4, 4, 1])
        }

        fn device(&self) -> Result<Device, GpuError> {
            Ok(Device::cuda(0))
        }

        fn data_type(&self) -> Result<DlType, GpuError> {
            Ok(DlType::F32)
        }

        fn byte_offset(&self) -> u64 {
            0
        }
    }

    #[test]
    fn empty_tensors_are_contiguous_whatever_their_strides() {
        // numpy's and CuPy's strides of shape [3, 0, 4] (as if the zero were 1).
        assert!(c_contiguous(&[3, 0, 4], &[4, 4, 1]));
        assert!(c_contiguous(&[0], &[7]));
        // With elements the strides count: C order (extents of 1 free), not F order or gaps.
        assert!(c_contiguous(&[3, 1, 4], &[4, 99, 1]));
        assert!(c_contiguous(&[], &[]));
        assert!(!c_contiguous(&[3, 2, 4], &[1, 3, 6]), "F order");
        assert!(!c_contiguous(&[3, 4], &[8, 1]), "rows with gaps");
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn empty_tensors_wrap_as_empty_arrays() {
        let tensor = SafeManagedTensorVersioned::with_flags(EmptyCuda, Flags::empty()).unwrap();
        let array = DeviceArray::<f32>::from_dlpack(tensor, zarrs::array::data_type::float32()).unwrap();
        assert!(array.is_empty());
        assert_eq!(array.shape(), [3, 0, 4]);
        assert_eq!(array.to_host().unwrap(), Vec::<f32>::new());
    }

    #[test]
    fn releases_wait_for_the_declared_stream_else_the_whole_device() {
        let theirs = 0x1234 as sys::CUstream;
        assert_eq!(release_order(DlpackStream::Stream(theirs)), ReleaseOrder::AfterStream(theirs));
        let legacy = DlpackStream::from_protocol(None).unwrap();
        assert_eq!(release_order(legacy), ReleaseOrder::AfterStream(1 as sys::CUstream));
        assert_eq!(release_order(DlpackStream::NoSync), ReleaseOrder::WholeDevice);
        assert_eq!(release_order(DlpackStream::Synchronize), ReleaseOrder::WholeDevice);
    }

    #[test]
    fn protocol_streams() {
        assert_eq!(DlpackStream::from_protocol(Some(-1)).ok(), Some(DlpackStream::NoSync));
        assert_eq!(DlpackStream::from_protocol(None).ok(), Some(DlpackStream::Stream(1 as sys::CUstream)));
        assert!(DlpackStream::from_protocol(Some(0)).is_err());
        assert!(DlpackStream::from_protocol(Some(-2)).is_err());
    }
}
