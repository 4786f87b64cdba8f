use zarrs::array::ArrayError;
use zarrs_gds_store::DeviceReadError;

/// An error from device retrieval.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No usable CUDA driver or device.
    #[error("no CUDA device available: {0}")]
    NoCuda(String),
    /// A CUDA driver call failed.
    #[error("CUDA error while {what}: {source}")]
    Cuda {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// Reading chunk bytes into device memory failed.
    #[error(transparent)]
    Read(DeviceReadError),
    /// zarrs failed (metadata, subset, host decoding, storage).
    #[error(transparent)]
    Array(#[from] ArrayError),
    /// The element type does not match the array's data type.
    #[error("element type {element} ({size} bytes) does not match the array's data type {data_type}")]
    ElementType {
        /// The Rust element type.
        element: &'static str,
        /// Its size.
        size: usize,
        /// The array's data type.
        data_type: String,
    },
    /// A chunk's stored bytes are not what its codecs promise (corrupt, truncated, wrong size, bad
    /// checksum); nothing reached the output.
    #[error("chunk {key}: {reason}")]
    Chunk {
        /// The chunk's store key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An nvCOMP call failed.
    #[error(transparent)]
    Nvcomp(#[from] nvcomp_sys::NvcompError),
    /// The device's CUDA context can no longer be used: a kernel faulted (after which every CUDA
    /// call of the process on that device fails) or a batch never finished. Only a new process
    /// can use the device again.
    #[error("the CUDA context of device {device} is lost ({reason}): restart the process to use this device again")]
    ContextLost {
        /// The device.
        device: usize,
        /// What lost it.
        reason: String,
    },
    /// A device batch did not finish within its time bound; its chunks are named.
    #[error("device batch of {count} chunks ({chunks}) did not finish within {seconds:.0} s")]
    Timeout {
        /// How many chunks the batch holds.
        count: usize,
        /// The first chunks' names.
        chunks: String,
        /// The bound that passed.
        seconds: f64,
    },
    /// The read needs more device memory than is free.
    #[error("the read needs {needed} bytes of device memory but only {free} are free on device {device}")]
    OutOfMemory {
        /// Bytes needed.
        needed: u64,
        /// Bytes free.
        free: u64,
        /// The device.
        device: usize,
    },
}

impl GpuError {
    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

impl From<DeviceReadError> for GpuError {
    fn from(err: DeviceReadError) -> Self {
        match err {
            DeviceReadError::NoCuda(msg) => Self::NoCuda(msg),
            other => Self::Read(other),
        }
    }
}

impl From<GpuError> for ArrayError {
    fn from(err: GpuError) -> Self {
        match err {
            GpuError::Array(err) => err,
            other => ArrayError::Other(other.to_string()),
        }
    }
}
