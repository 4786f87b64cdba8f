//! DLPack: device arrays handed to other libraries (PyTorch, CuPy, JAX, ...) without a copy, and
//! their device tensors wrapped as device arrays.

use std::sync::Arc;

use cudarc::driver::{result, sys};
use dlpark::ffi::{DataType as DlType, DataTypeCode, Device, DeviceType, Flags};
use dlpark::traits::{RowMajorCompactLayout, TensorLike, TensorView};
use dlpark::{SafeManagedTensor, SafeManagedTensorVersioned};
use zarrs::array::{DataType, ElementOwned};

use crate::device::current_context::CurrentContextGuard;
use crate::device_array::{check_element, DeviceArray, DeviceBytes, ReleaseOrder};
use crate::element::element_type;
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

/// The DLPack data type of `data_type`'s elements (one read to the device).
fn dl_type(data_type: &DataType) -> Option<DlType> {
    let complex = |bits| DlType { code: DataTypeCode::Complex, bits, lanes: 1 };
    Some(match element_type(data_type)?.0 {
        "bool" => DlType::BOOL,
        "int8" => DlType::I8,
        "int16" => DlType::I16,
        "int32" => DlType::I32,
        "int64" => DlType::I64,
        "uint8" => DlType::U8,
        "uint16" => DlType::U16,
        "uint32" => DlType::U32,
        "uint64" => DlType::U64,
        "float16" => DlType::F16,
        "bfloat16" => DlType::BF16,
        "float32" => DlType::F32,
        "float64" => DlType::F64,
        "complex64" => complex(64),
        "complex128" => complex(128),
        _ => return None,
    })
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
struct Exported<A: AsRef<DeviceBytes>> {
    array: Arc<A>,
    dl_type: DlType,
    /// How the consumer orders its work: what the release waits for.
    release: ReleaseOrder,
}

impl<A: AsRef<DeviceBytes>> Exported<A> {
    fn bytes(&self) -> &DeviceBytes {
        (*self.array).as_ref()
    }
}

impl<A: AsRef<DeviceBytes>> Drop for Exported<A> {
    fn drop(&mut self) {
        // A context lost (to a hung batch) or a device-wide wait that does not end leaves the
        // memory leaked.
        let _current = CurrentContextGuard::new();
        self.bytes().release_after(self.release);
    }
}

impl<A: AsRef<DeviceBytes>> TensorLike<RowMajorCompactLayout> for Exported<A> {
    type Error = GpuError;

    fn data_ptr(&self) -> *mut std::ffi::c_void {
        self.bytes().device_ptr() as usize as *mut std::ffi::c_void
    }

    fn memory_layout(&self) -> RowMajorCompactLayout {
        // Checked when exported: every extent fits in i64.
        RowMajorCompactLayout::new(self.bytes().shape().iter().map(|&n| n as i64).collect())
    }

    fn device(&self) -> Result<Device, GpuError> {
        Ok(Device::cuda(self.bytes().stream().context().ordinal()))
    }

    fn data_type(&self) -> Result<DlType, GpuError> {
        Ok(self.dl_type)
    }

    fn byte_offset(&self) -> u64 {
        0
    }
}

impl DeviceBytes {
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
    /// Returns an error when an extent does not fit in i64, or the ordering fails.
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

    /// As [`Self::into_dlpack`] for an array (untyped or typed) that stays shared: the tensor
    /// holds one more reference, and every holder sees the same memory (as `__dlpack__` called
    /// twice on one Python array).
    ///
    /// # Errors
    /// As [`Self::into_dlpack`].
    pub fn share_dlpack<A: AsRef<Self> + Send + Sync + 'static>(
        array: &Arc<A>,
        stream: DlpackStream,
    ) -> Result<SafeManagedTensorVersioned, GpuError> {
        SafeManagedTensorVersioned::with_flags(export(array, stream)?, Flags::empty())
    }

    /// As [`Self::share_dlpack`], unversioned (DLPack 0.x).
    ///
    /// # Errors
    /// As [`Self::into_dlpack`].
    pub fn share_dlpack_legacy<A: AsRef<Self> + Send + Sync + 'static>(
        array: &Arc<A>,
        stream: DlpackStream,
    ) -> Result<SafeManagedTensor, GpuError> {
        SafeManagedTensor::new(export(array, stream)?)
    }

    /// Wrap a CUDA DLPack tensor another library owns, as an array of `data_type` (the tensor's
    /// element type must be its), without a copy; the tensor is released when the array is
    /// dropped. The tensor's data must be ready for work on its device's default stream (the
    /// producer's `__dlpack__(stream=...)` orders that). The array releases the tensor where it is
    /// dropped: drop it where the producer's deleter may run (a Python producer's, with the GIL
    /// held).
    ///
    /// # Errors
    /// Returns an error when the tensor is not in CUDA memory, not C-contiguous, of another data
    /// type, or read-only.
    pub fn from_dlpack(tensor: SafeManagedTensorVersioned, data_type: DataType) -> Result<Self, GpuError> {
        let _current = CurrentContextGuard::new();
        let expected = dl_type(&data_type)
            .ok_or_else(|| GpuError::Unsupported(format!("DLPack has no data type for {data_type}")))?;
        if tensor.read_only() {
            return Err(GpuError::Unsupported("the DLPack tensor is read-only".into()));
        }
        let dl = *tensor.dl_tensor();
        if dl.device.device_type != DeviceType::Cuda {
            return Err(GpuError::Unsupported(format!("the DLPack tensor is on {:?}, not a CUDA device", dl.device)));
        }
        if dl.dtype != expected {
            return Err(GpuError::Unsupported(format!(
                "the DLPack tensor holds {:?}, not {data_type} ({expected:?})",
                dl.dtype
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
        // DLPack's element bits are the data type's size (the type matched above).
        let elem = u64::from(expected.bits) / 8;
        let num_bytes = crate::pipeline::plan::checked_bytes(&shape, elem)
            .ok_or_else(|| GpuError::bytes_overflow("a DLPack tensor of shape", &shape, elem))?;
        let ordinal = usize::try_from(dl.device.device_id)
            .map_err(|_| GpuError::Unsupported(format!("DLPack device id {}", dl.device.device_id)))?;
        let stream = crate::reader::cuda_context(ordinal)?.default_stream();
        let ptr = (dl.data as usize as u64)
            .checked_add(dl.byte_offset)
            .ok_or_else(|| GpuError::Overflow("the DLPack tensor's address and offset".into()))?;
        let len = (num_bytes / elem.max(1)) as usize;
        // SAFETY: the tensor describes `len` C-contiguous elements of `data_type` (checked above)
        // in CUDA memory of device `ordinal`, valid while the tensor lives; the array keeps it.
        Ok(unsafe { Self::from_foreign(ptr, len, shape, data_type, stream, Box::new(Owner { _tensor: tensor })) })
    }
}

impl<T: ElementOwned> DeviceArray<T> {
    /// [`DeviceBytes::into_dlpack`] of the typed array.
    ///
    /// # Errors
    /// As [`DeviceBytes::into_dlpack`].
    pub fn into_dlpack(self, stream: DlpackStream) -> Result<SafeManagedTensorVersioned, GpuError> {
        self.into_bytes().into_dlpack(stream)
    }

    /// [`DeviceBytes::into_dlpack_legacy`] of the typed array.
    ///
    /// # Errors
    /// As [`DeviceBytes::into_dlpack`].
    pub fn into_dlpack_legacy(self, stream: DlpackStream) -> Result<SafeManagedTensor, GpuError> {
        self.into_bytes().into_dlpack_legacy(stream)
    }

    /// [`DeviceBytes::from_dlpack`] checked against `T`: `data_type` must be `T`'s.
    ///
    /// # Errors
    /// As [`DeviceBytes::from_dlpack`], and [`GpuError::ElementType`] where `T` is not the
    /// element type of `data_type`.
    pub fn from_dlpack(tensor: SafeManagedTensorVersioned, data_type: DataType) -> Result<Self, GpuError> {
        check_element::<T>(&data_type)?;
        DeviceBytes::from_dlpack(tensor, data_type)?.try_into()
    }
}

/// The tensor of a shared array: the consumer's work ordered after the array's stream.
fn export<A: AsRef<DeviceBytes>>(array: &Arc<A>, stream: DlpackStream) -> Result<Exported<A>, GpuError> {
    let _current = CurrentContextGuard::new();
    let bytes = (**array).as_ref();
    let dl_type = dl_type(bytes.data_type())
        .ok_or_else(|| GpuError::Unsupported(format!("DLPack has no data type for {}", bytes.data_type())))?;
    if bytes.shape().iter().any(|&n| i64::try_from(n).is_err()) {
        return Err(GpuError::Overflow(format!("shape {:?}: an extent exceeds DLPack's i64", bytes.shape())));
    }
    let ours = bytes.stream().clone();
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
        use zarrs::array::data_type;
        assert_eq!(dl_type(&data_type::float32()), Some(DlType::F32));
        assert_eq!(dl_type(&data_type::bfloat16()), Some(DlType::BF16));
        assert_eq!(dl_type(&data_type::complex128()).map(|t| t.bits), Some(128));
        assert_eq!(dl_type(&data_type::string()), None);
        // Every type read to the device has one, of its size.
        for (name, _) in crate::element::ELEMENT_TYPES {
            let dt = zarrs::array::DataType::from_metadata(&zarrs::metadata::v3::MetadataV3::new(*name)).unwrap();
            let dl = dl_type(&dt).expect(name);
            assert_eq!(usize::from(dl.bits) / 8, dt.fixed_size().unwrap().max(1), "{name}");
        }
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
