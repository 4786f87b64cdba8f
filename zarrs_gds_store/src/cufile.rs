//! cuFile (GPUDirect Storage), loaded at run time: the driver opened once per process, files
//! registered one by one, reads straight into device memory.
//!
//! cudarc's cuFile loader does not try `libcufile.so.0` (the pip wheel's name) and panics when no
//! library loads, so the few entry points used here are loaded with libloading; the C structs are
//! cudarc's.

use std::ffi::{c_int, c_void};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::OnceLock;

use cudarc::cufile::sys::{CUfileDescr_t, CUfileDescr_t__bindgen_ty_1, CUfileDrvProps_t, CUfileFileHandleType};

use crate::error::ReadError;

/// The environment variable naming the cuFile library to load, before the usual names.
pub const CUFILE_LIBRARY_ENV: &str = "CUFILE_LIBRARY_PATH";

const CANDIDATES: &[&str] = &["libcufile.so.0", "libcufile.so", "/usr/local/cuda/lib64/libcufile.so.0"];

/// `CUfileError_t` with plain integers: the library may return codes the Rust enum lacks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Status {
    err: c_int,
    cu_err: c_int,
}

impl Status {
    fn check(self, what: &'static str) -> Result<(), ReadError> {
        if self.err == 0 {
            Ok(())
        } else {
            Err(ReadError::CuFile { what, detail: describe(self.err, self.cu_err) })
        }
    }
}

fn describe(err: c_int, cu_err: c_int) -> String {
    let name = match err {
        5001 => "CU_FILE_DRIVER_NOT_INITIALIZED",
        5008 => "CU_FILE_DRIVER_ALREADY_OPEN",
        5009 => "CU_FILE_PLATFORM_NOT_SUPPORTED",
        5010 => "CU_FILE_IO_NOT_SUPPORTED",
        5011 => "CU_FILE_DEVICE_NOT_SUPPORTED",
        5012 => "CU_FILE_NVFS_DRIVER_ERROR",
        5013 => "CU_FILE_CUDA_DRIVER_ERROR",
        5014 => "CU_FILE_CUDA_POINTER_INVALID",
        5015 => "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        5016 => "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        5017 => "CU_FILE_CUDA_CONTEXT_MISMATCH",
        5018 => "CU_FILE_INVALID_MAPPING_SIZE",
        5021 => "CU_FILE_INVALID_VALUE",
        5025 => "CU_FILE_INTERNAL_ERROR",
        5026 => "CU_FILE_HANDLE_ALREADY_REGISTERED",
        5027 => "CU_FILE_HANDLE_NOT_REGISTERED",
        5030 => "CU_FILE_INVALID_FILE_TYPE",
        5031 => "CU_FILE_INVALID_FILE_OPEN_FLAG",
        5032 => "CU_FILE_DIO_NOT_SET",
        _ => "cuFile error",
    };
    format!("{name} ({err}, CUDA {cu_err})")
}

type DriverOpen = unsafe extern "C" fn() -> Status;
type DriverGetProperties = unsafe extern "C" fn(*mut CUfileDrvProps_t) -> Status;
type HandleRegister = unsafe extern "C" fn(*mut *mut c_void, *mut CUfileDescr_t) -> Status;
type HandleDeregister = unsafe extern "C" fn(*mut c_void);
type Read = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, libc::off_t, libc::off_t) -> isize;

/// The cuFile driver, opened once per process.
pub(crate) struct CuFileDriver {
    _lib: libloading::Library,
    handle_register: HandleRegister,
    handle_deregister: HandleDeregister,
    read: Read,
    /// nvidia-fs kernel driver version; 0.0 means it is not loaded (cuFile compat mode only).
    pub(crate) nvfs_version: (u32, u32),
}

impl CuFileDriver {
    /// The process's driver, or why there is none.
    pub(crate) fn get() -> Result<&'static Self, String> {
        static DRIVER: OnceLock<Result<CuFileDriver, String>> = OnceLock::new();
        DRIVER.get_or_init(Self::open).as_ref().map_err(Clone::clone)
    }

    fn open() -> Result<Self, String> {
        let env = std::env::var(CUFILE_LIBRARY_ENV).ok().filter(|p| !p.is_empty());
        let mut tried = Vec::new();
        let lib = env
            .iter()
            .map(String::as_str)
            .chain(CANDIDATES.iter().copied())
            .find_map(|name| {
                // SAFETY: loading libcufile runs its initialisers, which have no preconditions.
                unsafe { libloading::Library::new(name) }.map_err(|e| tried.push(format!("{name}: {e}"))).ok()
            })
            .ok_or_else(|| {
                format!(
                    "libcufile was not found (tried {}); install the CUDA toolkit's cuFile or `pip install nvidia-cufile`",
                    tried.join("; ")
                )
            })?;
        // SAFETY: the symbols are looked up with the signatures of cufile.h.
        let (driver_open, get_properties, handle_register, handle_deregister, read) = unsafe {
            let sym = |name: &str| format!("libcufile lacks {name}");
            (
                *lib.get::<DriverOpen>(b"cuFileDriverOpen\0").map_err(|_| sym("cuFileDriverOpen"))?,
                *lib.get::<DriverGetProperties>(b"cuFileDriverGetProperties\0")
                    .map_err(|_| sym("cuFileDriverGetProperties"))?,
                *lib.get::<HandleRegister>(b"cuFileHandleRegister\0").map_err(|_| sym("cuFileHandleRegister"))?,
                *lib.get::<HandleDeregister>(b"cuFileHandleDeregister\0").map_err(|_| sym("cuFileHandleDeregister"))?,
                *lib.get::<Read>(b"cuFileRead\0").map_err(|_| sym("cuFileRead"))?,
            )
        };
        // SAFETY: cuFileDriverOpen takes no arguments; it is called once (OnceLock).
        unsafe { driver_open() }.check("opening the cuFile driver").map_err(|e| e.to_string())?;
        // SAFETY: properties is a plain C struct the call fills in.
        let mut properties: CUfileDrvProps_t = unsafe { std::mem::zeroed() };
        unsafe { get_properties(&raw mut properties) }
            .check("reading the cuFile driver properties")
            .map_err(|e| e.to_string())?;
        Ok(Self {
            _lib: lib,
            handle_register,
            handle_deregister,
            read,
            nvfs_version: (properties.nvfs.major_version, properties.nvfs.minor_version),
        })
    }

    /// Whether the nvidia-fs kernel driver is loaded (native GDS possible).
    pub(crate) fn has_nvfs(&self) -> bool {
        self.nvfs_version != (0, 0)
    }

    /// Open `path` with O_DIRECT and register it with cuFile.
    pub(crate) fn register(&'static self, path: &Path) -> Result<CuFileHandle, ReadError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|source| ReadError::Io { path: path.to_path_buf(), source })?;
        let mut descr = CUfileDescr_t {
            type_: CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
            handle: CUfileDescr_t__bindgen_ty_1 { fd: file.as_raw_fd() },
            fs_ops: std::ptr::null(),
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: descr describes an open fd that outlives the handle (both owned by CuFileHandle).
        unsafe { (self.handle_register)(&raw mut handle, &raw mut descr) }.check("registering a file")?;
        Ok(CuFileHandle { driver: self, handle, file })
    }
}

/// A file registered with cuFile; deregistered on drop.
pub(crate) struct CuFileHandle {
    driver: &'static CuFileDriver,
    handle: *mut c_void,
    file: File,
}

// SAFETY: cuFile handles may be used from any thread (cufile.h: thread-safe API).
unsafe impl Send for CuFileHandle {}
// SAFETY: as above; cuFileRead on one handle from several threads is allowed.
unsafe impl Sync for CuFileHandle {}

impl CuFileHandle {
    /// The registered (O_DIRECT) descriptor's file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Read `len` bytes at `offset` of the file to device memory at `dst`. Unaligned offsets and
    /// sizes are allowed (cuFile bounces them through its own buffers); a short read is an error.
    ///
    /// # Safety
    /// `dst` must be device memory valid for `len` bytes that nothing else uses meanwhile, of the
    /// CUDA context current on the calling thread.
    pub(crate) unsafe fn read(&self, path: &Path, offset: u64, dst: u64, len: usize) -> Result<(), ReadError> {
        let mut done = 0usize;
        while done < len {
            // SAFETY: dst is device memory valid for len bytes (the caller's contract); the
            // handle is registered and alive.
            let n = unsafe {
                (self.driver.read)(
                    self.handle,
                    dst as *mut c_void,
                    len - done,
                    (offset + done as u64) as libc::off_t,
                    done as libc::off_t,
                )
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => {
                    return Err(ReadError::PastEnd {
                        what: path.display().to_string(),
                        start: offset,
                        end: offset + len as u64,
                        size: offset + done as u64,
                    })
                }
                -1 => return Err(ReadError::Io { path: path.to_path_buf(), source: std::io::Error::last_os_error() }),
                n => return Err(ReadError::CuFile { what: "cuFileRead", detail: describe(-(n as c_int), 0) }),
            }
        }
        Ok(())
    }
}

impl Drop for CuFileHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was registered by this value and is deregistered once, before the fd closes.
        unsafe { (self.driver.handle_deregister)(self.handle) };
    }
}
