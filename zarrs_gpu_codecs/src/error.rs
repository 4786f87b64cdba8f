use crate::env::EnvError;
use crate::reader::DeviceReadError;
use zarrs::array::ArrayError;

/// An error from device retrieval.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No usable CUDA driver or device.
    #[error("no CUDA device available: {0}")]
    NoCuda(String),
    /// nvCOMP's library is needed (a codec chain it decodes) but could not be loaded.
    #[error("nvCOMP is not available: {0}")]
    NoNvcomp(String),
    /// NVRTC (which compiles our kernels) is needed but not available.
    #[error("NVRTC is not available: {0}")]
    NoNvrtc(String),
    /// A device codec cannot do what the read asks of it.
    #[error("{0}")]
    Unsupported(String),
    /// An environment variable of the configuration holds a value that cannot be used.
    #[error("{variable}={value:?} cannot be used: expected {expected}")]
    Config {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: String,
    },
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
        /// The chunk's store key (and, for an inner chunk, its indices in the shard).
        key: String,
        /// What is wrong with it.
        reason: String,
        /// The typed cause, where there is one (a [`FrameError`](crate::zstd_frame::FrameError)
        /// of the zstd host check, a device codec's error).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
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
    /// A size computed from metadata, a subset, a shard index or a file does not fit in 64 bits
    /// (hostile or corrupt metadata, or a request beyond any device): refused before any read.
    #[error("{0}")]
    Overflow(String),
    /// The read's [`Cancel`](crate::Cancel) was thrown: it stopped between two stages and
    /// writes nothing more into its output.
    #[error("the read was cancelled")]
    Cancelled,
}

impl GpuError {
    /// Chunk `key` is not what its codecs promise.
    pub(crate) fn chunk(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Chunk { key: key.into(), reason: reason.into(), source: None }
    }

    /// `shape` elements of `elem` bytes (what `what` names) do not fit in u64 bytes.
    pub(crate) fn bytes_overflow(what: &str, shape: &[u64], elem: u64) -> Self {
        Self::Overflow(format!("{what} {shape:?}: {} elements of {elem} bytes overflow u64", count(shape)))
    }

    pub(crate) fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Self {
        move |source| Self::Cuda { what, source }
    }
}

/// The element count of `shape`, for messages: exact when it fits in u128 (as a power of two when
/// it is one), else its order of magnitude.
fn count(shape: &[u64]) -> String {
    match shape.iter().try_fold(1u128, |acc, &n| acc.checked_mul(u128::from(n))) {
        Some(n) if n.is_power_of_two() && n > 1 << 20 => format!("2^{}", n.trailing_zeros()),
        Some(n) => n.to_string(),
        None => format!("about 2^{:.0}", shape.iter().map(|&n| (n as f64).log2()).sum::<f64>()),
    }
}

impl From<DeviceReadError> for GpuError {
    fn from(err: DeviceReadError) -> Self {
        match err {
            DeviceReadError::NoCuda(msg) => Self::NoCuda(msg),
            DeviceReadError::Config { variable, value, expected } => {
                Self::Config { variable, value, expected: expected.to_string() }
            }
            other => Self::Read(other),
        }
    }
}

impl From<EnvError> for GpuError {
    fn from(EnvError { variable, value, expected }: EnvError) -> Self {
        Self::Config { variable, value, expected: expected.to_string() }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_messages_name_the_size() {
        let e = GpuError::bytes_overflow("the subset of shape", &[1 << 40, 1 << 40], 4);
        assert_eq!(
            e.to_string(),
            "the subset of shape [1099511627776, 1099511627776]: 2^80 elements of 4 bytes overflow u64"
        );
        assert!(count(&[3, 1 << 63]).starts_with("27670116110564327424"));
        assert_eq!(count(&[u64::MAX, u64::MAX, 1 << 32]), "about 2^160");
        assert_eq!(count(&[1024]), "1024");
    }
}
