"""PyTorch datasets of crops that zarrs_gpu reads on the GPU: ``CropDataset``, a map-style dataset
whose items are CUDA tensors on this process's GPU (DLPack, no copy), and ``CropLoader``, which
batches them with the reads of the next batches kept in flight while the caller trains on this one.

    import torch, zarrs_gpu.torch as zt
    torch.cuda.set_device(local_rank)                    # one process per GPU: the dataset follows
    ds = zt.CropDataset(["data.zarr/raw", "data.zarr/label"], (64, 128, 128), crops=1000, seed=0)
    sampler = torch.utils.data.DistributedSampler(ds)    # or any iterable of indices
    loader = zt.CropLoader(ds, batch_size=4, sampler=sampler, prefetch=2)
    for epoch in range(epochs):
        loader.set_epoch(epoch)                          # forwards to sampler.set_epoch
        for x, y in loader:                              # (4, 64, 128, 128) CUDA tensors
            ...

Crops (``CropPlan``) are boxes of ``crop_shape`` over the last ``len(crop_shape)`` axes of every
array (axes before those, channels say, are read whole): a regular grid, N random crops fixed by a
seed, or starts you give. The list is a pure function of (shape, crop_shape, crops, seed, stride,
edge), computed on demand, so index ``i`` means the same crop in every process: what
``DistributedSampler`` needs for each rank to read only its own crops.

A batch is one request per array (``Array.read_many(keys, stack=True)``): planned once, each chunk
that several crops meet read and decoded once, the batch landing as one tensor of shape
``(batch, *crop)`` with no stacking copy. ``CropLoader`` merges the batches it reads ahead into
larger requests; ``DataLoader(ds, batch_size=..., collate_fn=zarrs_gpu.torch.collate)`` gets the
same one-request batches through ``CropDataset.__getitems__``.

Arrays are opened lazily, on first use, on GPU ``device`` (default: ``torch.cuda.current_device()``
at that moment), so a dataset made before ``torch.cuda.set_device`` or pickled to another process
reads on that process's GPU. A plain ``torch.utils.data.DataLoader(ds, batch_size=..., sampler=...)``
works too (``num_workers=0``: reads run on zarrs_gpu's own threads, and CUDA does not work in the
forked worker processes ``num_workers > 0`` starts; ``pin_memory`` is for host tensors, leave it off;
``collate_fn=zarrs_gpu.torch.collate`` keeps the batch as read, where the default collate copies it).

torch is imported when a dataset first reads, so ``import zarrs_gpu.torch`` works without it (the read
then says to ``pip install 'zarrs-gpu[torch]'``).
Tests without a GPU replace ``backend`` (where tensors come from: see ``TorchBackend``).
"""

import math
import operator
import os
from typing import Any, Iterable, Iterator, Optional, Sequence

from ._common import box_text, require
from ._common import with_context as _with_context

__all__ = ["CropDataset", "CropLoader", "CropPlan", "TorchBackend", "backend", "batches", "collate", "shuffled"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """splitmix64's output function (Steele, Lea and Flood 2014)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _draw(seed: int, n: int, bound: int) -> int:
    """The ``n``-th draw (from 0) of a splitmix64 generator seeded with ``seed``, reduced to
    ``0..bound`` as ``(next() * bound) >> 64``. Counter-based: any draw without the ones before, so
    crop ``i`` is found without drawing crops ``0..i``."""
    return (_mix((seed + (n + 1) * _GOLDEN) & _MASK) * bound) >> 64


def _positive_ints(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a sequence of integers, not {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool):
            raise TypeError(f"{what} must hold integers, not {v!r}")
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(f"{what} must hold integers, not {v!r}") from None
        if v < 1:
            raise ValueError(f"{what} must hold integers of 1 or more, not {tuple(value)}")
        out.append(v)
    if not out:
        raise ValueError(f"{what} is empty: give one extent per cropped axis")
    return tuple(out)


class CropPlan:
    """The crops of an array of ``shape`` (its cropped axes): a sequence of boxes, each a tuple of
    ``(start, stop)`` per axis with ``stop - start == crop_shape``. Made from nothing but its
    arguments, so every process that makes it gets the same boxes in the same order.

    ``crops``:
      ``"grid"`` (or None): a regular grid in C order, starts ``0, stride, 2 * stride, ...`` on each
        axis (``stride`` defaults to ``crop_shape``). ``edge="shift"`` (the default) adds a last
        crop that ends at the array's edge where the grid stops short of it (it overlaps the one
        before), so with ``stride <= crop_shape`` every element is in some crop and every crop
        has the full shape; ``edge="drop"`` leaves that remainder out.
      an int N (1 or more): N random crops, start ``d`` of crop ``i`` being draw ``i * ndim + d`` of
        a splitmix64 generator seeded with ``seed``, reduced to ``0..shape - crop`` (the tile
        starts of ``benches/tiles.py`` and ``bench --tiles``, for the same seed).
      a sequence of starts: those crops, in that order (each start in bounds).
    """

    def __init__(self, shape: Sequence[int], crop_shape: Sequence[int], crops: Any = "grid", *, seed: int = 0,
                 stride: Optional[Sequence[int]] = None, edge: str = "shift"):
        self.shape = tuple(operator.index(n) for n in shape)
        self.crop_shape = _positive_ints(crop_shape, "crop_shape")
        if len(self.crop_shape) != len(self.shape):
            raise ValueError(f"crop_shape {self.crop_shape} has {len(self.crop_shape)} axes, the shape "
                             f"{self.shape} {len(self.shape)}")
        for axis, (n, c) in enumerate(zip(self.shape, self.crop_shape)):
            if c > n:
                raise ValueError(f"crop_shape {self.crop_shape} is larger than the array's extent {self.shape} "
                                 f"on axis {axis} ({c} > {n})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, not {seed!r}")
        self.seed = seed & _MASK
        if edge not in ("shift", "drop"):
            raise ValueError(f"edge must be 'shift' or 'drop', not {edge!r}")
        if crops is None:
            crops = "grid"
        self._count: Optional[int] = None
        self._starts: Optional[list[tuple[int, ...]]] = None
        self._grid: Optional[list[list[int]]] = None
        self.stride = None
        self.edge = edge
        if isinstance(crops, str):
            if crops != "grid":
                raise ValueError(f"crops must be 'grid', a number of random crops or a list of starts, not {crops!r}")
            self.kind = "grid"
            self.stride = self.crop_shape if stride is None else _positive_ints(stride, "stride")
            if len(self.stride) != len(self.shape):
                raise ValueError(f"stride {self.stride} has {len(self.stride)} axes, the crops {len(self.shape)}")
            self._grid = []
            for n, c, s in zip(self.shape, self.crop_shape, self.stride):
                starts = list(range(0, n - c + 1, s))
                if edge == "shift" and starts[-1] + c < n:
                    starts.append(n - c)
                self._grid.append(starts)
            return
        if stride is not None or edge != "shift":
            raise ValueError("stride and edge are for crops='grid'")
        if isinstance(crops, bool):
            raise TypeError(f"crops must be 'grid', a number of random crops or a list of starts, not {crops!r}")
        if isinstance(crops, int):
            if crops < 1:
                raise ValueError(f"crops={crops}: the number of random crops is 1 or more")
            self.kind = "random"
            self._count = crops
            return
        if not isinstance(crops, Iterable):
            raise TypeError(f"crops must be 'grid', a number of random crops or a list of starts, not "
                            f"{type(crops).__name__}")
        self.kind = "starts"
        self._starts = []
        for n, start in enumerate(crops):
            try:
                start = tuple(operator.index(s) for s in start)
            except TypeError:
                raise TypeError(f"crops[{n}] must be a start (integers, one per cropped axis), not {start!r}") from None
            if len(start) != len(self.shape) or any(
                    s < 0 or s + c > e for s, c, e in zip(start, self.crop_shape, self.shape)):
                raise ValueError(f"crops[{n}]: a crop of {self.crop_shape} at {start} does not lie within "
                                 f"{self.shape}")
            self._starts.append(start)
        if not self._starts:
            raise ValueError("crops is an empty list of starts")

    def __len__(self) -> int:
        if self._grid is not None:
            return math.prod(len(s) for s in self._grid)
        if self._starts is not None:
            return len(self._starts)
        return self._count  # type: ignore[return-value]

    def start(self, i: int) -> tuple[int, ...]:
        """Crop ``i``'s start (negative ``i`` counts from the end)."""
        n = len(self)
        i = operator.index(i)
        if not -n <= i < n:
            raise IndexError(f"crop {i} is out of range for {n} crops")
        i %= n
        if self._grid is not None:
            out = []
            for starts in reversed(self._grid):
                i, r = divmod(i, len(starts))
                out.append(starts[r])
            return tuple(reversed(out))
        if self._starts is not None:
            return self._starts[i]
        ndim = len(self.shape)
        return tuple(_draw(self.seed, i * ndim + d, n - c + 1)
                     for d, (n, c) in enumerate(zip(self.shape, self.crop_shape)))

    def __getitem__(self, i: int) -> tuple[tuple[int, int], ...]:
        """Crop ``i``'s box: ``(start, stop)`` per axis."""
        return tuple((s, s + c) for s, c in zip(self.start(i), self.crop_shape))

    def __iter__(self) -> Iterator[tuple[tuple[int, int], ...]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CropPlan) and (self.shape, self.crop_shape, self.kind, len(self)) ==
                (other.shape, other.crop_shape, other.kind, len(other)) and list(self) == list(other))

    def __repr__(self) -> str:
        what = {"grid": f"grid, stride={self.stride}, edge={self.edge!r}", "random": f"random, seed={self.seed}",
                "starts": "given starts"}[self.kind]
        return f"zarrs_gpu.torch.CropPlan(shape={self.shape}, crop_shape={self.crop_shape}, {len(self)} crops, {what})"


def batches(indices: Sequence[int], batch_size: int, drop_last: bool = False) -> list[list[int]]:
    """``indices`` in batches of ``batch_size``, in order; the last one shorter, or left out with
    ``drop_last`` (as ``torch.utils.data.BatchSampler``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int of 1 or more, not {batch_size!r}")
    out = [list(indices[k:k + batch_size]) for k in range(0, len(indices), batch_size)]
    if drop_last and out and len(out[-1]) < batch_size:
        out.pop()
    return out


def shuffled(n: int, seed: int = 0, epoch: int = 0) -> list[int]:
    """A permutation of ``range(n)``, a function of ``seed + epoch`` only (Fisher-Yates with
    splitmix64 draws): ``CropLoader``'s order with ``shuffle=True`` and no sampler."""
    key = (seed + epoch) & _MASK
    order = list(range(n))
    for k, i in enumerate(range(n - 1, 0, -1)):
        j = _draw(key, k, i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def _torch(module: str = "torch") -> Any:
    """torch (or its ``module``), imported at first use; without it, an ImportError saying what
    installs it."""
    return require(module, "zarrs_gpu.torch", "torch")


class TorchBackend:
    """Where ``CropDataset`` and ``CropLoader`` get arrays and tensors: zarrs_gpu reads, torch
    tensors. ``zarrs_gpu.torch.backend`` is the one used; tests without a GPU put one in its place
    whose arrays read on the host (zarr-python) and whose tensors are numpy arrays."""

    def current_device(self) -> int:
        """The device reads go to when the dataset was given none: torch's current CUDA device."""
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError("zarrs_gpu.torch reads to a CUDA GPU, and torch sees none "
                               "(torch.cuda.is_available() is False)")
        return torch.cuda.current_device()

    def open(self, path: Any, array: str, device: int) -> Any:
        """The array at ``array`` in the store at ``path`` (a directory, or a RemoteLocation: an
        object store's URL and options), read on GPU ``device``."""
        from ._arrays import open_at

        return open_at(path, array, device=device)

    def as_tensor(self, x: Any) -> Any:
        """A read array as a tensor, without a copy (DLPack: torch's current stream on the array's
        device waits for the read, which is complete when handed out anyway)."""
        return _torch().from_dlpack(x)

    def in_worker(self) -> bool:
        """Whether this runs in a DataLoader worker process."""
        return _torch("torch.utils.data").get_worker_info() is not None

    def default_collate(self, samples: Any) -> Any:
        """torch's own collate, for batches ``collate`` did not read."""
        return _torch("torch.utils.data").default_collate(samples)


#: What the dataset and the loader use to open arrays and make tensors (see ``TorchBackend``).
backend: Any = TorchBackend()


class _Releaser:
    """Drops what it is given (the reads of batches handed out, once the loader is past them) on a
    thread of its own. Freeing a tensor that zarrs_gpu shared through DLPack with a declared
    stream (``torch.from_dlpack`` declares torch's current one) is ordered after that stream on
    the device, without a host wait; a release of an export with no declared stream waits for the
    whole device. The releases still run here, off the training thread, so that such a wait (and
    any other host work of a free) never drains the step just queued before the next batch is
    handed out; with a 40 ms step a ``CropLoader`` kept 0.79 of the slower of its reads and the
    step (run AQ) when they ran on the training thread. Whether this thread still earns its
    place now that declared releases do not wait is not yet measured."""

    def __init__(self):
        import queue
        import threading

        self._queue: Any = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: Any = None

    def release(self, things: Any) -> None:
        """Drop ``things`` (the last references to them) on the releasing thread."""
        import threading

        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="zarrs_gpu.torch releaser", daemon=True)
                self._thread.start()
        self._queue.put(things)

    def _run(self) -> None:
        while True:
            things = self._queue.get()
            del things  # the deleters' waits run here

    def drained(self) -> None:
        """Wait until what was given so far is dropped (for tests)."""
        import threading

        done = threading.Event()
        self.release(_Signal(done))
        done.wait()


class _Signal:
    """Sets its event when dropped: the releaser has reached it."""

    def __init__(self, event: Any):
        self.event = event

    def __del__(self):
        self.event.set()


_releaser = _Releaser()


def _device_ordinal(device: Any) -> Optional[int]:
    """A CUDA device ordinal from an int, ``"cuda"``, ``"cuda:N"`` or a ``torch.device`` (None:
    the current device, at first use)."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise TypeError(f"device must be a CUDA device (an ordinal, 'cuda:N' or a torch.device), not {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device must be a GPU ordinal (0 or more), not {device}")
        return device
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if isinstance(device, str):
        kind, _, rest = device.partition(":")
        index = int(rest) if rest.isdigit() else None
        if rest and index is None:
            raise ValueError(f"device {device!r} is not 'cuda' or 'cuda:N'")
    if kind != "cuda":
        raise ValueError(f"zarrs_gpu.torch reads to a CUDA device, not {device!r}")
    return index


class _Source:
    """One array of a dataset: a path (and the array's path in that store), opened lazily, or a
    ``zarrs_gpu.Array`` given open."""

    def __init__(self, spec: Any, n: int, storage_options: Optional[dict] = None):
        import zarrs_gpu

        from ._arrays import ZARR_PYTHON_STORES, location, open_at, zarr_python_root

        self.opened = None
        # The GPU a given Array reads to (paths are opened on the dataset's).
        self.device: Optional[int] = None
        if isinstance(spec, zarrs_gpu.Array):
            self.path, self.array, self.opened = None, None, spec
            self.device = spec.device
            self.name = repr(spec)
            meta = spec
        else:
            if isinstance(spec, (str, os.PathLike)):
                # A directory, or an object store's URL (its options travel with it, unshown).
                self.path, self.array = location(spec, storage_options, f"zarrs_gpu.torch: arrays[{n}]"), "/"
            else:
                # A zarr-python array in a local store or an ObjectStore zarrs_gpu can read: where its
                # store is (a directory or a RemoteLocation) and its path there.
                store = getattr(getattr(spec, "store_path", None), "store", None)
                root = None if store is None else zarr_python_root(store)
                if root is None:
                    where = f" in a {type(store).__name__}" if store is not None else ""
                    raise TypeError(f"arrays[{n}]: expected a path, a zarrs_gpu.Array or a zarr-python array in "
                                    f"{ZARR_PYTHON_STORES}, not a {type(spec).__name__}{where}")
                self.path = os.path.abspath(root) if isinstance(root, str) else root
                self.array = "/" + spec.store_path.path.strip("/")
            shown = getattr(self.path, "shown", self.path)
            self.name = str(shown) if self.array == "/" else f"{shown} (array {self.array!r})"
            try:
                meta = open_at(self.path, self.array)  # metadata only: no GPU needed
            except Exception as err:
                new = _with_context(err, f"zarrs_gpu.torch: arrays[{n}], {self.name}")
                if new is err:
                    raise
                raise new from err
        # numpy's name ("float32"; "bfloat16", which numpy lacks, too), whatever meta's dtype is.
        self.shape, self.dtype = tuple(meta.shape), str(meta.dtype)

    def __getstate__(self):
        if self.path is None:
            raise TypeError(f"a zarrs_gpu.torch dataset holding an open zarrs_gpu.Array ({self.name}) does not "
                            "pickle: give its path instead, which each process opens for itself")
        state = dict(self.__dict__)
        state["opened"] = None
        return state


class CropDataset:
    """A map-style dataset of crops of one or several arrays, read by zarrs_gpu on the GPU.

    ``arrays``: one array, or a list (tuple) of arrays; each a path (the array's directory, or a
    store whose root is the array: ``"data.zarr/raw"``), an object store's URL of one
    (``s3://bucket/data.zarr/raw``, with ``storage_options``), a ``zarrs_gpu.Array`` (read on the device
    it was opened for, which is then the dataset's; such a dataset does not pickle), or a
    zarr-python array in a local store or in an ``ObjectStore`` over obstore's S3, HTTP or local
    store.
    ``crop_shape`` crops the last ``len(crop_shape)`` axes of every array, which must have the same
    extents there (input and label of one grid, of any data types); axes before those are read
    whole. ``crops``, ``seed``, ``stride``, ``edge``: which crops (``CropPlan``). ``device``: the
    GPU paths are opened on (an ordinal, ``"cuda:N"``, a ``torch.device``; None: the given
    ``zarrs_gpu.Array``s' GPU, else torch's current device at the first read); given Arrays
    opened for another GPU are an error.

    ``ds[i]`` is crop ``i`` (``ds.plan[i]`` its box) as a CUDA tensor sharing the read's memory,
    or a tuple of them, one per array, when ``arrays`` is a list. ``ds.read_batch(indices)`` reads
    crops as one request per array, a tensor of shape ``(len(indices), ...)`` each; ``DataLoader``
    (torch 2) asks ``__getitems__`` for a whole batch, which reads it so too (see there).
    """

    def __init__(self, arrays: Any, crop_shape: Sequence[int], *, crops: Any = "grid", seed: int = 0,
                 stride: Optional[Sequence[int]] = None, edge: str = "shift", device: Any = None,
                 storage_options: Optional[dict] = None):
        self._single = not isinstance(arrays, (list, tuple))
        specs = [arrays] if self._single else list(arrays)
        if not specs:
            raise ValueError("arrays is empty: give one array or a list of them")
        self._device_arg = _device_ordinal(device)
        self._device: Optional[int] = None
        self._sources = [_Source(spec, n, storage_options) for n, spec in enumerate(specs)]
        self._device_arg = self._given_device(self._device_arg)
        crop_shape = _positive_ints(crop_shape, "crop_shape")
        k = len(crop_shape)
        for n, s in enumerate(self._sources):
            if len(s.shape) < k:
                raise ValueError(f"crop_shape {crop_shape} has {k} axes, arrays[{n}] ({s.name}) only "
                                 f"{len(s.shape)}: shape {s.shape}")
        cropped = [s.shape[len(s.shape) - k:] for s in self._sources]
        for n, (s, c) in enumerate(zip(self._sources, cropped)):
            if c != cropped[0]:
                raise ValueError(f"arrays[{n}] ({s.name}) has shape {s.shape} and arrays[0] ({self._sources[0].name}) "
                                 f"{self._sources[0].shape}: their last {k} axes, the cropped ones, differ")
        self.plan = CropPlan(cropped[0], crop_shape, crops, seed=seed, stride=stride, edge=edge)

    def _given_device(self, device: Optional[int]) -> Optional[int]:
        """The GPU the dataset reads on, where ``zarrs_gpu.Array``s were given: theirs, which must
        be one, and ``device`` where that is given too (a crop's arrays on two GPUs could not be
        stacked or trained on together)."""
        given = [(n, s) for n, s in enumerate(self._sources) if s.device is not None]
        for n, s in given:
            first_n, first = given[0]
            if s.device != first.device:
                raise ValueError(f"arrays[{n}] ({s.name}) reads to GPU {s.device} and arrays[{first_n}] "
                                 f"({first.name}) to GPU {first.device}: a dataset reads on one GPU")
        if not given:
            return device
        n, s = given[0]
        if device is not None and device != s.device:
            raise ValueError(f"device={device}, but arrays[{n}] ({s.name}) was opened for GPU {s.device}: "
                             f"give device={s.device}, or open it on GPU {device}")
        return s.device

    # ---- what it holds
    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each array's shape."""
        return [s.shape for s in self._sources]

    @property
    def dtypes(self) -> list[str]:
        """Each array's data type (numpy's name)."""
        return [s.dtype for s in self._sources]

    @property
    def crop_shape(self) -> tuple[int, ...]:
        return self.plan.crop_shape

    @property
    def device(self) -> Optional[int]:
        """The GPU paths are read on: the one given, or the one taken at the first read (None before)."""
        return self._device_arg if self._device_arg is not None else self._device

    def __len__(self) -> int:
        return len(self.plan)

    def keys(self, i: int) -> list[tuple[slice, ...]]:
        """What crop ``i`` reads of each array: slices, whole axes before the cropped ones."""
        box = self.plan[i]
        crop = tuple(slice(a, b) for a, b in box)
        return [(slice(None),) * (len(s.shape) - len(box)) + crop for s in self._sources]

    def __repr__(self) -> str:
        arrays = ", ".join(f"{s.name} {s.shape} {s.dtype}" for s in self._sources)
        return f"zarrs_gpu.torch.CropDataset([{arrays}], {self.plan!r}, device={self.device})"

    # ---- reads
    def _arrays(self) -> list[Any]:
        """The arrays, opened on first use on this process's device."""
        # Checked on every read: a forked worker inherits arrays its parent opened, and CUDA with them.
        if backend.in_worker():
            raise RuntimeError("zarrs_gpu.torch.CropDataset reads on the GPU in the process that iterates it: "
                               "use DataLoader(num_workers=0) (reads run on zarrs_gpu's own threads; CUDA "
                               "does not work in forked worker processes) or zarrs_gpu.torch.CropLoader")
        if any(s.opened is None for s in self._sources):
            if self._device is None:
                self._device = self._device_arg if self._device_arg is not None else backend.current_device()
            for n, s in enumerate(self._sources):
                if s.opened is None:
                    try:
                        s.opened = backend.open(s.path, s.array, self._device)
                    except Exception as err:
                        self._rethrow(err, f"opening arrays[{n}], {s.name}, on GPU {self._device}")
        return [s.opened for s in self._sources]

    @staticmethod
    def _rethrow(err: Exception, where: str):
        """Raise ``err`` with ``where`` before its message (or as it is, where its type cannot be
        remade from a message)."""
        new = _with_context(err, f"zarrs_gpu.torch: {where}")
        if new is err:
            raise err
        raise new from err

    def _where(self, n: int, i: int) -> str:
        return f"crop {i} {box_text(self.plan[i])} of arrays[{n}], {self._sources[n].name}"

    def _tensor(self, x: Any, n: int, i: int) -> Any:
        try:
            return backend.as_tensor(x)
        except Exception as err:
            self._rethrow(err, f"{self._where(n, i)} ({self._sources[n].dtype}) to a tensor")

    def _item(self, tensors: list) -> Any:
        return tensors[0] if self._single else tuple(tensors)

    def __getitem__(self, i: int) -> Any:
        i = operator.index(i)
        keys = self.keys(i)
        out = []
        for n, (a, key) in enumerate(zip(self._arrays(), keys)):
            try:
                x = a[key]
            except Exception as err:
                self._rethrow(err, f"reading {self._where(n, i)}")
            out.append(self._tensor(x, n, i))
        return self._item(out)

    def read_batch(self, indices: Sequence[int]) -> Any:
        """Crops ``indices`` as one batch: one request per array (``Array.read_many(keys,
        stack=True)``: planned once, a chunk that several crops meet read and decoded once, the
        host threads and the device sharing all of it), each a tensor of shape ``(len(indices),
        *axes_before_the_crop, *crop_shape)`` with crop ``indices[k]`` at ``k``, no stacking copy;
        a tuple of them when the dataset has a list of arrays."""
        indices = [operator.index(i) for i in indices]
        if not indices:
            raise ValueError("read_batch needs at least one crop index")
        for i in indices:
            self.plan.start(i)  # an IndexError naming the crop, before anything is read
        out = []
        for n, a in enumerate(self._arrays()):
            keys = [self.keys(i)[n] for i in indices]
            try:
                x = a.read_many(keys, stack=True)
            except Exception as err:
                self._rethrow(err, f"reading {self._where_batch(n, indices)}")
            try:
                out.append(backend.as_tensor(x))
            except Exception as err:
                self._rethrow(err, f"{self._where_batch(n, indices)} ({self._sources[n].dtype}) to a tensor")
        return self._item(out)

    def _where_batch(self, n: int, indices: list[int]) -> str:
        shown = ", ".join(f"{i} {box_text(self.plan[i])}" for i in indices[:3])
        more = f" and {len(indices) - 3} more" if len(indices) > 3 else ""
        return f"crops {shown}{more} of arrays[{n}], {self._sources[n].name}"

    def __getitems__(self, indices: Sequence[int]) -> list:
        """The items of ``indices`` (a DataLoader batch), read as one batch (``read_batch``): the
        items are views of its tensors, and ``collate`` gives those tensors back as the batch
        (torch's default collate copies the items into a new one)."""
        if not len(indices):
            return []
        batch = self.read_batch(indices)
        columns = [batch] if self._single else list(batch)
        return _Batch([self._item([c[k] for c in columns]) for k in range(len(indices))], batch)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_device"] = None  # taken again where it is next read (another process, another GPU)
        return state


class _Batch(list):
    """The items of one batch read by ``CropDataset.__getitems__``, with the batch as read."""

    def __init__(self, items: list, stacked: Any):
        super().__init__(items)
        self.stacked = stacked


def collate(samples: Any) -> Any:
    """``collate_fn`` for ``DataLoader(CropDataset(...), batch_size=..., collate_fn=collate)``: a
    batch that ``CropDataset.__getitems__`` read is handed on as read (one tensor per array, no
    copy); anything else goes to torch's ``default_collate``."""
    if isinstance(samples, _Batch):
        return samples.stacked
    return backend.default_collate(samples)


class CropLoader:
    """Batches of a ``CropDataset`` on the GPU, the reads of the next ``prefetch`` batches kept in
    flight while the caller uses this one.

    The order: ``sampler`` (a ``torch.utils.data.Sampler`` such as ``DistributedSampler``, or any
    iterable of dataset indices), iterated afresh on every pass, so ``sampler.set_epoch(epoch)``
    (or ``loader.set_epoch(epoch)``, which calls it) before a pass gives that epoch's order;
    without one, ``range(len(dataset))``, or with ``shuffle=True`` ``shuffled(n, seed, epoch)``.
    ``batch_size`` and ``drop_last`` as ``DataLoader``'s.

    A pass reads ``prefetch`` batches at a time as one request per array
    (``CropDataset.read_batch``: each chunk read and decoded once, the device's batch rate rather
    than one crop's latency), on a thread of its own, the next request in flight while the caller
    uses the batches of the one before. It yields a batch: a tensor of shape ``(batch,
    *array_shape_before_crop, *crop_shape)``, a view of the request's (no stacking copy), or a
    tuple of those, one per array, when the dataset has a list of arrays; with
    ``return_indices`` the pair ``(indices, batch)``. Each batch is complete on the device when
    handed out, ready for any kernel on any stream. ``prefetch=0`` reads each batch as one request
    when it is asked for. Device memory: up to ``3 * max(prefetch, 1)`` batches per array (the
    request in flight, the one in use, the one before, freed off the training thread once the
    pass is past it). Leaving a pass early (``break``) stops its reads."""

    def __init__(self, dataset: CropDataset, batch_size: int = 1, *, sampler: Optional[Iterable[int]] = None,
                 shuffle: bool = False, seed: int = 0, drop_last: bool = False, prefetch: int = 2,
                 return_indices: bool = False):
        if not isinstance(dataset, CropDataset):
            raise TypeError(f"CropLoader reads a zarrs_gpu.torch.CropDataset, not a {type(dataset).__name__} "
                            "(use torch.utils.data.DataLoader for other datasets)")
        batches([], batch_size)  # checks batch_size
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int of 0 or more (batches read ahead), not {prefetch!r}")
        if sampler is not None and shuffle:
            raise ValueError("sampler and shuffle=True exclude each other (as in DataLoader): shuffle in the sampler")
        if sampler is not None and not isinstance(sampler, Iterable):
            raise TypeError(f"sampler must be an iterable of dataset indices, not a {type(sampler).__name__}")
        if sampler is not None and isinstance(sampler, Iterator):
            # An iterator (a generator, say) is used up by the first pass: every later epoch
            # would be empty.
            raise TypeError(f"sampler must be iterable afresh on every pass (a Sampler, a list, a range), "
                            f"not an iterator ({type(sampler).__name__}): pass list(...) of it")
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.drop_last = bool(drop_last)
        self.prefetch = prefetch
        self.return_indices = bool(return_indices)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next pass: ``sampler.set_epoch(epoch)`` where the sampler has it, and the
        shuffled order's epoch."""
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def indices(self) -> list[int]:
        """The dataset indices of the next pass, in order (the sampler iterated now), each checked."""
        n = len(self.dataset)
        if self.sampler is None:
            return shuffled(n, self.seed, self.epoch) if self.shuffle else list(range(n))
        out = []
        for k, i in enumerate(self.sampler):
            try:
                i = operator.index(i)
            except TypeError:
                raise TypeError(f"the sampler's item {k} is {i!r}, not a dataset index") from None
            if not 0 <= i < n:
                raise IndexError(f"the sampler's item {k} is {i}, out of range for a dataset of {n} crops")
            out.append(i)
        return out

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> "_Pass":
        return _Pass(self, batches(self.indices(), self.batch_size, self.drop_last))

    def __repr__(self) -> str:
        return (f"zarrs_gpu.torch.CropLoader({self.dataset!r}, batch_size={self.batch_size}, prefetch={self.prefetch}, "
                f"drop_last={self.drop_last}, sampler={self.sampler!r})")


class _Pass:
    """One pass of a ``CropLoader``: its reads start when it is made (``iter(loader)``)."""

    def __init__(self, loader: CropLoader, groups: list[list[int]]):
        import collections

        self.loader, self.groups, self.next_batch = loader, groups, 0
        span = max(1, loader.prefetch)
        # Consecutive batches read as one request per array.
        self.requests = [groups[k:k + span] for k in range(0, len(groups), span)]
        self.next_request = 0
        self.ready: Any = collections.deque()  # (indices, batch) of the request in use
        # Each request's tensors, kept until the pass is two requests past it: then the caller
        # has let go of its batches, and the release (a wait for the device) runs off this thread.
        self.held: Any = collections.deque()
        self.pending: Any = None
        self.pool: Any = None
        loader.dataset._arrays()  # opened here, on the caller's thread (and its device)
        if loader.prefetch and self.requests:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(1, thread_name_prefix="zarrs_gpu.torch reads")
            self.pending = self.pool.submit(self._read, 0)

    def _read(self, r: int) -> list:
        """Request ``r``: each array's tensor over its batches' crops."""
        ds = self.loader.dataset
        batch = ds.read_batch([i for g in self.requests[r] for i in g])
        return [batch] if ds._single else list(batch)

    def __iter__(self) -> "_Pass":
        return self

    def __next__(self) -> Any:
        if self.next_batch >= len(self.groups):
            self.close()
            raise StopIteration
        if not self.ready:
            try:
                self._advance()
            except BaseException:
                self.close()
                raise
        indices, batch = self.ready.popleft()
        self.next_batch += 1
        return (list(indices), batch) if self.loader.return_indices else batch

    def _advance(self) -> None:
        """The next request's batches, ready to hand out; the one after it started."""
        r = self.next_request
        tensors = self.pending.result() if self.pool is not None else self._read(r)
        self.pending = None
        self.next_request += 1
        if self.pool is not None and self.next_request < len(self.requests):
            self.pending = self.pool.submit(self._read, self.next_request)
        ds = self.loader.dataset
        at = 0
        for group in self.requests[r]:
            self.ready.append((group, ds._item([t[at:at + len(group)] for t in tensors])))
            at += len(group)
        self.held.append(tensors)
        del tensors
        while len(self.held) > 2:
            _releaser.release(self.held.popleft())

    def close(self) -> None:
        """Stop the reads still ahead (the batches handed out stay valid)."""
        if self.pool is not None:
            if self.pending is not None:
                self.pending.cancel()
            # A read already running finishes (its result is dropped with the rest).
            self.pool.shutdown(wait=True)
            self.pool = None
        if self.pending is not None and self.pending.done() and not self.pending.cancelled() \
                and self.pending.exception() is None:
            self.held.append(self.pending.result())
        self.pending = None
        self.ready.clear()
        while self.held:
            _releaser.release(self.held.popleft())
        self.next_batch = len(self.groups)

    def __len__(self) -> int:
        return len(self.groups) - self.next_batch
