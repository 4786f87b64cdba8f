//! `zarrs_gpu.Array`: a Zarr array opened for reads to the GPU and writes from it.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyString, PyTuple};
use zarrs::array::{Array, ArraySubset};
use zarrs_gds_store::AnyStore;
use zarrs_gpu::zarrs_gpu_codecs::{tile_subsets, TileOrder};
use zarrs_gpu::{GpuConfig, GpuError};
use zarrs_gpu_codecs::{Cancel, Coalescer};

use crate::device_array::PyDeviceArray;
use crate::dlpack::{check_device_destination, on_cuda_device, versioned_capsule};
use crate::read_ahead::{Pending, PyPendingRead, PyReadAhead};
use crate::reads::{
    element_type, numpy_dtype, read, read_into, read_many, write_from, Boxes, PendingTile, Read, TileReads,
};
use crate::reports::{report_dict, write_report_dict};
use crate::selection::{index_to_subset, key_to_subset};
use crate::util::{interruptible, py_err, py_len, subset_text};

/// A Zarr array in a filesystem store, opened for reads to the GPU: numpy-style indexing returns
/// device arrays.
#[pyclass(name = "Array", module = "zarrs_gpu", frozen)]
pub(crate) struct PyZarrArray {
    pub(crate) array: Arc<Array<AnyStore>>,
    pub(crate) config: GpuConfig,
    /// Reads from many threads gathered into requests, where the configuration's coalesce window
    /// is set (`ZARRS_GPU_COALESCE_WINDOW_US`).
    pub(crate) coalescer: Arc<Coalescer<(ArraySubset, Vec<u64>), Read>>,
    pub(crate) path: PathBuf,
    pub(crate) node: String,
    /// Opened with mode "r+": writes are allowed.
    pub(crate) writable: bool,
    /// The metadata file as read just before opening.
    pub(crate) opened_metadata: Option<Vec<u8>>,
}

/// The metadata file (`zarr.json`, else `.zarray`) of the array at `node` of `store`, as stored.
pub(crate) fn stored_metadata(store: &AnyStore, node: &str) -> Result<Option<Vec<u8>>, String> {
    let node = node.trim_matches('/');
    for name in ["zarr.json", ".zarray"] {
        let key = if node.is_empty() { name.to_string() } else { format!("{node}/{name}") };
        let key = zarrs_storage::StoreKey::new(key).map_err(|e| e.to_string())?;
        if let Some(bytes) = zarrs_storage::ReadableStorageTraits::get(store, &key).map_err(|e| e.to_string())? {
            return Ok(Some(bytes.to_vec()));
        }
    }
    Ok(None)
}

impl PyZarrArray {
    /// The shape of the chunk grid's first chunk (of every chunk, on a regular grid).
    fn grid_chunk_shape(&self) -> PyResult<Vec<u64>> {
        let first = vec![0u64; self.array.dimensionality()];
        let shape = self.array.chunk_shape(&first).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(shape.iter().map(|n| n.get()).collect())
    }

    /// The inner chunk shape when the array's codecs are sharding alone (zarr-python's rule for
    /// `chunks` and `shards`: a codec before or after it makes the grid's chunks the chunks).
    fn sharding(&self) -> PyResult<Option<Vec<u64>>> {
        use zarrs::array::codec::ShardingCodecConfiguration;
        let zarrs::metadata::ArrayMetadata::V3(metadata) = self.array.metadata() else { return Ok(None) };
        let [codec] = metadata.codecs.as_slice() else { return Ok(None) };
        if codec.name() != "sharding_indexed" {
            return Ok(None);
        }
        let configuration: ShardingCodecConfiguration = codec
            .to_configuration()
            .map_err(|e| PyValueError::new_err(format!("sharding_indexed configuration: {e}")))?;
        let ShardingCodecConfiguration::V1(c) = configuration else {
            return Err(PyValueError::new_err("this sharding_indexed configuration version is not supported"));
        };
        Ok(Some(c.chunk_shape.iter().map(|n| n.get()).collect()))
    }

    fn read_ranges(&self, py: Python<'_>, ranges: &[Range<u64>], out_shape: Vec<u64>) -> PyResult<PyDeviceArray> {
        let (dtype, typestr) = element_type(&self.array)?;
        let subset = ArraySubset::new_with_ranges(ranges);
        let (array, config) = (self.array.clone(), self.config.clone());
        // The reads run without the interpreter lock (other Python threads go on meanwhile), on
        // their own thread: Ctrl-C interrupts the wait.
        if config.coalesce_window().is_none() {
            let cancel = Cancel::new();
            let config = config.with_cancel(cancel.clone());
            let (data, report) =
                interruptible(py, Some((&cancel, Duration::ZERO)), move || read(&array, &subset, &config, out_shape))?
                    .map_err(py_err)?;
            return Ok(PyDeviceArray::new(data, (dtype, typestr), report));
        }
        // With the reads of other threads that arrive while a request is in flight, as one.
        let coalescer = self.coalescer.clone();
        // Not cancelled when interrupted: the request may carry other threads' reads.
        let ((data, report), _) = interruptible(py, None, move || {
            let many = |boxes: &[(ArraySubset, Vec<u64>)]| {
                let (arrays, report) = read_many(&array, boxes, &config, false)?;
                Ok::<Vec<_>, GpuError>(report.shared_by(arrays))
            };
            coalescer.read((subset, out_shape), many)
        })?
        .map_err(py_err)?;
        Ok(PyDeviceArray::new(data, (dtype, typestr), report))
    }

    /// The boxes `keys` select (each with the shape its key selects), every key checked: a bad
    /// one raises, naming its position.
    fn boxes_of(&self, keys: &Bound<'_, PyAny>) -> PyResult<Boxes> {
        if keys.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err("keys is a list of keys, not one string key: pass [key]"));
        }
        let mut boxes = Vec::new();
        for (n, key) in keys.try_iter()?.enumerate() {
            let key = key?;
            let (ranges, out_shape) = key_to_subset(Some(&key), self.array.shape()).map_err(|err| {
                let py = key.py();
                PyErr::from_type(err.get_type(py), format!("keys[{n}]: {}", err.value(py)))
            })?;
            boxes.push((ArraySubset::new_with_ranges(&ranges), out_shape));
        }
        Ok(boxes)
    }

    /// Read `boxes` (each with the shape its key selects) in order on a background thread, at
    /// most `prefetch` ahead of the caller.
    pub(crate) fn start_read_ahead(&self, boxes: Boxes, prefetch: i64) -> PyResult<PyReadAhead> {
        let depth = usize::try_from(prefetch).ok().filter(|&n| n >= 1).ok_or_else(|| {
            PyValueError::new_err(format!(
                "prefetch={prefetch}: the number of reads kept ahead of the one in use is 1 or more"
            ))
        })?;
        let types = element_type(&self.array)?;
        let count = boxes.len();
        // The queue's slots are allocated up front: no more than there are reads.
        let reads = TileReads::start(self.array.clone(), boxes, self.config.clone(), depth.min(count.max(1)));
        Ok(PyReadAhead {
            reads: Mutex::new(Some(reads)),
            closed: AtomicBool::new(false),
            types,
            count,
            prefetch: depth,
        })
    }
}

#[pymethods]
impl PyZarrArray {
    /// The array's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.array.shape())
    }

    /// numpy's dtype of what reads return, as zarr-python's `Array.dtype` but in native byte order
    /// (a big-endian array's reads are native): `numpy.dtype("float32")`, ... bfloat16, which
    /// numpy lacks, is ml_dtypes' where that is installed, else the name `"bfloat16"`.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_dtype(py, element_type(&self.array)?.0, "dtype")
    }

    /// The number of elements (the product of the shape), as zarr-python's `Array.size`.
    #[getter]
    fn size<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // Python's integers: a shape's product may pass 2^64.
        py.import("math")?.call_method1("prod", (PyTuple::new(py, self.array.shape())?,))
    }

    /// The bytes of the whole array: `size` times the element size, as zarr-python's
    /// `Array.nbytes` (not what its chunks take in the store).
    #[getter]
    fn nbytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let element = self.array.data_type().fixed_size().ok_or_else(|| {
            PyTypeError::new_err(format!("data type {} has no fixed element size", self.array.data_type()))
        })?;
        self.size(py)?.mul(element)
    }

    /// The array's attributes (`zarr.json`'s `attributes`, a v2 array's `.zattrs`), as
    /// zarr-python's `Array.attrs` holds them: a new dict at each call, changed in memory only.
    #[getter]
    fn attrs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let loads = py.import("json")?.getattr("loads")?;
        let attrs = PyDict::new(py);
        for (key, value) in self.array.attributes() {
            // A JSON value displays as its JSON text.
            attrs.set_item(key, loads.call1((value.to_string(),))?)?;
        }
        Ok(attrs)
    }

    /// The fill value, as zarr-python's `Array.fill_value`: a numpy scalar of `dtype`, or None
    /// where a v2 array's metadata says `null` (zarrs then fills with zeros). bfloat16 without
    /// ml_dtypes: a Python float.
    #[getter]
    fn fill_value<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let zarrs::metadata::ArrayMetadata::V2(metadata) = self.array.metadata() {
            if metadata.fill_value.is_null() {
                return Ok(py.None().into_bound(py));
            }
        }
        let (name, _) = element_type(&self.array)?;
        let bytes = self.array.fill_value().as_ne_bytes();
        let expected = self.array.data_type().fixed_size();
        if expected != Some(bytes.len()) {
            return Err(PyValueError::new_err(format!(
                "the fill value of {} has {} bytes, its data type {} {expected:?}",
                self.path.display(),
                bytes.len(),
                self.array.data_type()
            )));
        }
        let dtype = numpy_dtype(py, name, "fill_value")?;
        if dtype.is_instance_of::<PyString>() {
            let bits: [u8; 2] = bytes.try_into().map_err(|_| PyValueError::new_err("a bfloat16 has 2 bytes"))?;
            return Ok(PyFloat::new(py, half::bf16::from_ne_bytes(bits).to_f64()).into_any());
        }
        let numpy = py.import("numpy")?;
        numpy.call_method1("frombuffer", (PyBytes::new(py, bytes), dtype))?.get_item(0)
    }

    /// The shape of the chunks a read decodes, as zarr-python's `Array.chunks`: for an array
    /// whose one codec is sharding, the shards' inner chunk shape (the outermost shard's, when
    /// shards nest); else the chunk grid's. On an irregular grid, the first chunk's shape.
    #[getter]
    fn chunks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        match self.sharding()? {
            Some(inner) => PyTuple::new(py, inner),
            None => PyTuple::new(py, self.grid_chunk_shape()?),
        }
    }

    /// The shard shape (the chunk grid's) of an array whose one codec is sharding, else None: as
    /// zarr-python's `Array.shards`.
    #[getter]
    fn shards<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        if self.sharding()?.is_none() || self.regular_chunks(py)?.is_none() {
            return Ok(None);
        }
        PyTuple::new(py, self.grid_chunk_shape()?).map(Some)
    }

    /// The number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.array.dimensionality()
    }

    /// The GPU this array's reads land on (`open`'s `device`).
    #[getter]
    fn device(&self) -> usize {
        self.config.device()
    }

    /// The chunk grid's chunk shape (the shard shape of a sharded array) when every chunk has it
    /// (a regular grid: every v2 array, v3 arrays with the "regular" chunk grid), else None.
    #[getter]
    fn regular_chunks<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let regular = match self.array.metadata() {
            zarrs::metadata::ArrayMetadata::V2(_) => true,
            zarrs::metadata::ArrayMetadata::V3(m) => m.chunk_grid.name() == "regular",
        };
        if !regular {
            return Ok(None);
        }
        PyTuple::new(py, self.grid_chunk_shape()?).map(Some)
    }

    /// Read `subset` (numpy-style slices as a string, `"0:64, :, :"`, or an index as for
    /// `array[...]`; None: the whole array) to the device.
    #[pyo3(signature = (subset=None))]
    pub(crate) fn read(&self, py: Python<'_>, subset: Option<&Bound<'_, PyAny>>) -> PyResult<PyDeviceArray> {
        let (ranges, out_shape) = key_to_subset(subset, self.array.shape())?;
        self.read_ranges(py, &ranges, out_shape)
    }

    /// Read the selection `key` (an index as for `array[...]`, or `read`'s string form; None: the
    /// whole array) into `out`, a C-contiguous CUDA array of the selection's shape and this
    /// array's dtype that another library owns (a CuPy array or a PyTorch CUDA tensor: any DLPack
    /// 1.0 producer on a CUDA device; host arrays are a TypeError), in place. Returns the read's
    /// report.
    #[pyo3(signature = (out, key=None))]
    fn read_into<'py>(
        &self,
        py: Python<'py>,
        out: &Bound<'py, PyAny>,
        key: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        check_device_destination(out)?;
        let (ranges, selected) = key_to_subset(key, self.array.shape())?;
        // The destination's shape must be the selection's, as numpy's `out=` asks (not only as
        // many elements).
        let out_shape: Vec<u64> = out.getattr("shape")?.extract()?;
        if out_shape != selected {
            return Err(PyValueError::new_err(format!("out has shape {out_shape:?}, the selection {selected:?}")));
        }
        let tensor = versioned_capsule(py, out, "out")?;
        let subset = ArraySubset::new_with_ranges(&ranges);
        let report = read_into(py, &self.array, &subset, &self.config, tensor)?;
        report_dict(py, &report)
    }

    /// Start reading the selection `key` (as for `read`; None: the whole array) on a background
    /// thread and return at once: a `PendingRead` whose `result()` waits for the array. A bad key
    /// raises here, a failed read in `result()`.
    #[pyo3(signature = (key=None))]
    fn read_async(&self, key: Option<&Bound<'_, PyAny>>) -> PyResult<PyPendingRead> {
        let (ranges, out_shape) = key_to_subset(key, self.array.shape())?;
        let types = element_type(&self.array)?;
        let subset = ArraySubset::new_with_ranges(&ranges);
        let what = subset_text(&subset);
        let read = PendingTile::start(self.array.clone(), subset, out_shape, self.config.clone());
        Ok(PyPendingRead { state: Mutex::new(Pending::Running(read)), types, what })
    }

    /// Read the selections `keys` (a finite iterable of keys as for `array[...]` or `read`'s
    /// string form: random crops, say) in order on a background thread, `prefetch` ahead of the
    /// one in use. Every key is checked now (a bad one raises here, naming its position); the
    /// iterator yields `(key, DeviceArray)` with `key` the tuple of slices of the box read.
    #[pyo3(signature = (keys, *, prefetch=2))]
    fn read_ahead(&self, keys: &Bound<'_, PyAny>, prefetch: i64) -> PyResult<PyReadAhead> {
        let boxes = self.boxes_of(keys)?;
        self.start_read_ahead(boxes, prefetch)
    }

    /// Read the selections `keys` (a finite iterable of keys as for `array[...]` or `read`'s
    /// string form) as one request: planned once, a chunk that several selections meet read and
    /// decoded once. Returns a list of `DeviceArray`s, one per key (views of one allocation, freed
    /// with the last), or with `stack=True` one `DeviceArray` of shape `(len(keys), *shape)`,
    /// where every key selects `shape` (a training batch: no stacking copy). Every key is checked
    /// before anything is read.
    #[pyo3(signature = (keys, *, stack=false))]
    fn read_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>, stack: bool) -> PyResult<Py<PyAny>> {
        let boxes = self.boxes_of(keys)?;
        if stack {
            if let Some((n, (_, other))) = boxes.iter().enumerate().find(|(_, (_, shape))| *shape != boxes[0].1) {
                return Err(PyValueError::new_err(format!(
                    "stack=True needs keys of one shape: keys[0] selects {:?}, keys[{n}] {other:?}",
                    boxes[0].1
                )));
            }
            if boxes.is_empty() {
                return Err(PyValueError::new_err("stack=True needs at least one key (the shape comes from it)"));
            }
        }
        let types = element_type(&self.array)?;
        let cancel = Cancel::new();
        let (array, config) = (self.array.clone(), self.config.clone().with_cancel(cancel.clone()));
        // The read runs without the interpreter lock (other Python threads go on meanwhile), on
        // its own thread: Ctrl-C interrupts the wait, and stops the read.
        let (arrays, report) =
            interruptible(py, Some((&cancel, Duration::ZERO)), move || read_many(&array, &boxes, &config, stack))?
                .map_err(py_err)?;
        let mut arrays: Vec<PyDeviceArray> =
            arrays.into_iter().map(|data| PyDeviceArray::new(data, types, report.clone())).collect();
        if stack {
            return Ok(Py::new(py, arrays.remove(0))?.into_any());
        }
        let list = pyo3::types::PyList::empty(py);
        for array in arrays {
            list.append(Py::new(py, array)?)?;
        }
        Ok(list.into_any().unbind())
    }

    /// For benches/python_tile.py: read each of `keys` as benches/bench.rs does (the read, which
    /// ends synchronized, then the array dropped), all in Rust on this thread without the
    /// interpreter lock; the seconds each took. The Rust bench's loop inside this process, to
    /// tell the Python API's own cost from the process's.
    fn _time_reads(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<f64>> {
        let boxes = self.boxes_of(keys)?;
        let (array, config) = (&self.array, &self.config);
        py.allow_threads(|| {
            boxes
                .into_iter()
                .map(|(subset, shape)| {
                    let start = Instant::now();
                    drop(read(array, &subset, config, shape)?);
                    Ok(start.elapsed().as_secs_f64())
                })
                .collect::<Result<Vec<f64>, GpuError>>()
        })
        .map_err(py_err)
    }

    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyDeviceArray> {
        let (ranges, out_shape) = index_to_subset(key, self.array.shape())?;
        self.read_ranges(py, &ranges, out_shape)
    }

    /// `a[key] = value`: see `write`.
    fn __setitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.write(py, key, value).map(|_| ())
    }

    /// Store `value` into the selection `key` (numpy's basic indexing, as `a[key]` reads) and
    /// return the write's report. From device memory (a CuPy array, a PyTorch CUDA tensor: any
    /// DLPack 1.0 producer on a CUDA device, of the array's dtype and the selection's shape,
    /// C-contiguous), its chunks assembled and encoded on the device where the array's codecs
    /// allow; from anything else numpy takes (broadcast to the selection and cast to the array's
    /// dtype, as numpy's assignment does), written by zarrs on the host. Needs `mode="r+"`.
    fn write<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if !self.writable {
            return Err(PyValueError::new_err(format!(
                "{} was opened for reading (mode=\"r\"): open it with mode=\"r+\" to write",
                self.node
            )));
        }
        let (ranges, selected) = index_to_subset(key, self.array.shape())?;
        let subset = ArraySubset::new_with_ranges(&ranges);
        if on_cuda_device(value)? {
            let shape: Vec<u64> = value.getattr("shape")?.extract()?;
            if shape != selected {
                return Err(PyValueError::new_err(format!(
                    "the value has shape {shape:?}, the selection {selected:?}"
                )));
            }
            let tensor = versioned_capsule(py, value, "the value")?;
            let report = write_from(py, &self.array, &subset, &self.config, tensor)?;
            return write_report_dict(py, &report);
        }
        // Host memory: numpy's own assignment (its broadcasting, casting and errors) into an array
        // of the selection, then zarrs' own write of its bytes.
        let numpy = py.import("numpy")?;
        let dtype = self.dtype(py)?;
        if dtype.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err(format!(
                "{} holds {dtype}, which numpy knows only with ml_dtypes installed: write it from device memory",
                self.node
            )));
        }
        let host = numpy.call_method1("empty", (PyTuple::new(py, &selected)?, dtype))?;
        host.set_item(pyo3::types::PyEllipsis::get(py), value)?;
        // Its bytes where numpy keeps them (no copy: 1 GiB took three before).
        let (ptr, _): (usize, bool) = host.getattr("__array_interface__")?.get_item("data")?.extract()?;
        let len: usize = host.getattr("nbytes")?.extract()?;
        let bytes: &[u8] = if len == 0 || ptr == 0 {
            &[]
        } else {
            // SAFETY: `host` is the C-contiguous array of `len` bytes numpy.empty made above; no
            // one else refers to it, and it lives (held here) until the write below has returned.
            unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
        };
        let array = &self.array;
        let config = &self.config;
        py.allow_threads(|| {
            // Locked as the device writer locks (two writes of this process sharing a chunk never
            // lose either's update), each chunk read checked against another process's write.
            let bytes = zarrs::array::ArrayBytes::new_flen(std::borrow::Cow::Borrowed(bytes));
            zarrs_gpu_codecs::store_array_subset_host(array, &subset, bytes, config).map_err(py_err)
        })?;
        drop(host);
        let report = PyDict::new(py);
        report.set_item("path", "host")?;
        report.set_item("reason", "the value is in host memory: zarrs encodes and writes it")?;
        Ok(report)
    }

    fn __len__(&self) -> PyResult<usize> {
        py_len(self.array.shape())
    }

    /// The array's metadata file (`zarr.json`, else `.zarray`) as its store holds it now, fetched
    /// through the array's own store; None when neither is there. Cached arrays compare it with
    /// `_opened_metadata` (an object store has no modification time to ask).
    fn _stored_metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let storage = self.array.storage();
        let bytes = py.allow_threads(|| stored_metadata(&storage, &self.node)).map_err(PyValueError::new_err)?;
        Ok(bytes.map(|b| PyBytes::new(py, &b)))
    }

    /// The metadata file's bytes read just before the array was opened (None: not read).
    fn _opened_metadata<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.opened_metadata.as_ref().map(|b| PyBytes::new(py, b))
    }

    fn __repr__(&self) -> String {
        format!(
            "zarrs_gpu.Array({:?}, array={:?}, shape={:?}, dtype={}, device={})",
            self.path.display().to_string(),
            self.node,
            self.array.shape(),
            self.array.data_type(),
            self.config.device()
        )
    }
}

/// The tiles of `tile_shape` covering `array` (edge tiles clipped to its shape), read in `order`
/// ("C": row-major over the tile grid; "random": a permutation fixed by `seed`) on a background
/// thread, `prefetch` ahead of the one in use. Yields `(key, DeviceArray)`; `key` is the tile's
/// tuple of slices. Bad arguments raise here.
#[pyfunction]
#[pyo3(signature = (array, tile_shape, *, order="C", prefetch=2, seed=0))]
#[allow(clippy::needless_pass_by_value)] // extracted from Python as it is
pub(crate) fn tiles(
    array: &PyZarrArray,
    tile_shape: Vec<i128>,
    order: &str,
    prefetch: i64,
    seed: i128,
) -> PyResult<PyReadAhead> {
    let order = match order {
        "C" => TileOrder::C,
        "random" => TileOrder::Random {
            seed: u64::try_from(seed)
                .map_err(|_| PyValueError::new_err(format!("seed={seed}: a seed is an integer from 0 to 2^64 - 1")))?,
        },
        other => {
            return Err(PyValueError::new_err(format!("order={other:?}: the tile orders are \"C\" and \"random\"")))
        }
    };
    if tile_shape.iter().any(|&n| n < 1) {
        return Err(PyValueError::new_err(format!("tile_shape={tile_shape:?}: every tile extent is 1 or more")));
    }
    // An extent beyond 2^64 covers any array as 2^64 - 1 does.
    let tile_shape: Vec<u64> = tile_shape.iter().map(|&n| u64::try_from(n).unwrap_or(u64::MAX)).collect();
    let subsets = tile_subsets(array.array.shape(), &tile_shape, order).map_err(py_err)?;
    let boxes = subsets.into_iter().map(|subset| {
        let shape = subset.shape().to_vec();
        (subset, shape)
    });
    array.start_read_ahead(boxes.collect(), prefetch)
}
