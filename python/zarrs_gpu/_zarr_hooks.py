"""The private zarr-python methods zarrs_gpu replaces, in one place (the rest of the integration is
zarr-python's public codec pipeline API: ``zarrs_gpu.pipeline.GpuCodecPipeline``).

- ``AsyncArray._get_selection``: a selection that is one box goes to zarrs_gpu before zarr-python
  walks its chunks one by one (tens of ms for thousands of small chunks), and coordinate, mask and
  orthogonal selections are gathered on the device;
- ``Array.get_coordinate_selection``: its result reshaped on the device (zarr-python's reshape
  goes through numpy, which a CuPy result refuses);
- ``AsyncArray._set_selection``: a device value written into a box goes to zarrs_gpu's device
  writer, where zarr-python encodes every chunk on the host.

Each replacement is installed only for the zarr-python versions in ``SUPPORTED`` (those the
package is tested with: the oldest in CI's CPU tests, the newest in the GPU tests) and where the
method has the signature it was written against; anywhere else zarr-python's own method stays,
and those reads and writes are zarr-python's (correct, on the host). Each applies only to arrays
whose codec pipeline is ``GpuCodecPipeline``.
"""
import asyncio
import re

#: The zarr-python versions (major, minor) the replacements were written against, oldest and newest.
SUPPORTED = ((3, 1), (3, 4))


def supported(version):
    """Whether zarr-python `version` (its ``__version__``) is one of ``SUPPORTED``'s range."""
    match = re.match(r"(\d+)\.(\d+)", str(version))
    if match is None:
        return False
    major_minor = (int(match.group(1)), int(match.group(2)))
    return SUPPORTED[0] <= major_minor <= SUPPORTED[1]


def install(p, version=None):
    """Install the replacements for `p`, the pipeline module (its plans and `GpuCodecPipeline`),
    where zarr-python's version (`version`, else its own) is supported; the names of the methods
    replaced (none for another version, or where a method's signature is not the one expected)."""
    if version is None:
        import zarr

        version = zarr.__version__
    if not supported(version):
        return []
    hooks = (("AsyncArray._get_selection", _install_selection_hook),
             ("Array.get_coordinate_selection", _install_coordinate_hook),
             ("AsyncArray._set_selection", _install_set_hook))
    return [name for name, hook in hooks if hook(p)]


def _install_selection_hook(p):
    """zarr-python walks every chunk of a selection in Python (an indexer projection and a store
    path each) before it calls the codec pipeline: 4096 small chunks cost tens of ms. For arrays
    whose pipeline is this one, a whole box is handed to zarrs_gpu before that walk; anything else
    goes on as zarr-python's own. Installed only where AsyncArray._get_selection has the shape
    this was written against."""
    import inspect

    from zarr.core.array import AsyncArray

    original = AsyncArray._get_selection
    if getattr(original, "_zarrs_gpu", False):
        return True
    if list(inspect.signature(original).parameters) != ["self", "indexer", "prototype", "out", "fields"]:
        return False

    async def _get_selection(self, indexer, *, prototype, out=None, fields=None):
        plan = p._selection_plan(self, indexer, prototype, out, fields)
        if plan is None:
            advanced = p._advanced_plan(self, indexer, prototype, fields)
            if advanced is None:
                return await original(self, indexer, prototype=prototype, out=out, fields=fields)
            gpu_array, pieces, dtype = advanced
            result = await p._read_advanced(gpu_array, indexer, pieces, dtype)
            if out is None:
                return result
            out.as_ndarray_like()[...] = result
            return out.as_ndarray_like()
        gpu_array, key, buffer = plan
        await asyncio.to_thread(gpu_array.read_into, buffer.as_ndarray_like(), key)
        with p.GpuCodecPipeline._lock:
            p.GpuCodecPipeline.device_reads += 1
        if indexer.shape == () and type(indexer).__name__ == "BasicIndexer":
            return buffer.as_scalar()
        return buffer.as_ndarray_like()

    _get_selection._zarrs_gpu = True
    AsyncArray._get_selection = _get_selection
    return True


def _install_coordinate_hook(p):
    """zarr-python's `Array.get_coordinate_selection` (what `vindex` with integer arrays calls)
    reshapes its result with `np.array(...)`, which a CuPy result refuses ("Implicit conversion to
    a NumPy array is not allowed"). For arrays whose pipeline is this one the reshape is the
    result's own. Installed only where the method has the signature this was written against."""
    import inspect

    import numpy as np
    from zarr.core.array import Array
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.indexing import CoordinateIndexer
    from zarr.core.sync import sync

    original = Array.get_coordinate_selection
    if getattr(original, "_zarrs_gpu", False):
        return True
    if list(inspect.signature(original).parameters) != ["self", "selection", "out", "fields", "prototype"]:
        return False

    def get_coordinate_selection(self, selection, *, out=None, fields=None, prototype=None):
        if not isinstance(self.async_array.codec_pipeline, p.GpuCodecPipeline):
            return original(self, selection, out=out, fields=fields, prototype=prototype)
        if prototype is None:
            prototype = default_buffer_prototype()
        try:
            indexer = CoordinateIndexer(selection, self.shape, p._indexer_chunk_grid(self))
        except (AttributeError, AssertionError, TypeError):
            # The indexer refused the grid (a zarr-python whose internals this does not know): its
            # own method, whole (a CuPy result may then meet its host-only reshape).
            return original(self, selection, out=out, fields=fields, prototype=prototype)
        result = sync(self.async_array._get_selection(indexer=indexer, out=out, fields=fields, prototype=prototype))
        if hasattr(result, "shape"):
            # As zarr-python: a copy on the host; on the device, the result as it is.
            result = (np.array(result) if isinstance(result, np.ndarray) else result).reshape(indexer.sel_shape)
        return result

    get_coordinate_selection._zarrs_gpu = True
    get_coordinate_selection.__doc__ = original.__doc__
    Array.get_coordinate_selection = get_coordinate_selection
    return True


def _install_set_hook(p):
    """zarr-python encodes every chunk of a write on the host, even from a CuPy value. For arrays
    whose pipeline is this one, a device value written into a box goes to zarrs_gpu's device
    writer (`_write_plan`); anything else goes on as zarr-python's own. Installed only where
    AsyncArray._set_selection has the shape this was written against (zarr-python 3.1 to 3.4)."""
    import inspect

    from zarr.core.array import AsyncArray

    original = AsyncArray._set_selection
    if getattr(original, "_zarrs_gpu", False):
        return True
    if list(inspect.signature(original).parameters) != ["self", "indexer", "value", "prototype", "fields"]:
        return False

    async def _set_selection(self, indexer, value, *, prototype, fields=None):
        plan = p._write_plan(self, indexer, value, fields)
        if plan is None:
            return await original(self, indexer, value, prototype=prototype, fields=fields)
        gpu_array, key = plan
        await asyncio.to_thread(gpu_array.write, key, value)
        with p.GpuCodecPipeline._lock:
            p.GpuCodecPipeline.device_writes += 1
        return None

    _set_selection._zarrs_gpu = True
    AsyncArray._set_selection = _set_selection
    return True
