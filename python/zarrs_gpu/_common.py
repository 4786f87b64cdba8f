"""Helpers that zarrs_gpu.dask, zarrs_gpu.torch and zarrs_gpu.xarray share: error messages that
name where a read failed, and imports of optional dependencies that say what to install."""

import importlib
from types import ModuleType

#: What a missing CuPy means to zarrs_gpu.dask (its reads and its cluster's GPU count).
DASK_CUPY_NEEDED = ("zarrs_gpu.dask needs CuPy: its blocks are CuPy arrays on the GPU (install cupy-cuda12x or "
                    "cupy-cuda13x, the one for your CUDA version)")


def box_text(box: tuple[tuple[int, int], ...]) -> str:
    """A box as numpy-style slices: ``[0:64, 0:512]``."""
    return "[" + ", ".join(f"{start}:{stop}" for start, stop in box) + "]"


def with_context(err: Exception, where: str) -> Exception:
    """``err``'s type with ``where`` before its message, or ``err`` itself where its type cannot
    be made from one message. An OSError keeps its errno and file name (``FileNotFoundError``
    handlers read them)."""
    try:
        if isinstance(err, OSError) and err.errno is not None:
            new = type(err)(err.errno, f"{where}: {err.strerror}", *(() if err.filename is None else (err.filename,)))
        else:
            new = type(err)(f"{where}: {err}")
    except Exception:
        return err
    return new if isinstance(new, type(err)) else err


def missing_dependency(err: ImportError, user: str, extra: str) -> ImportError:
    """The error to raise for ``err``, an ImportError of an optional dependency of ``user`` (a
    module or function of this package): says to ``pip install 'zarrs-gpu[extra]'``, keeps the
    original message, and is a ModuleNotFoundError with the same ``name`` where ``err`` is one
    (``except ModuleNotFoundError`` and checks of ``.name`` go on working)."""
    # The package, not the submodule an import of which failed ("xarray.backends").
    missing = err.name.partition(".")[0] if err.name else "a dependency"
    kind = ModuleNotFoundError if isinstance(err, ModuleNotFoundError) else ImportError
    return kind(f"{user} needs {missing}: pip install 'zarrs-gpu[{extra}]' ({err})", name=err.name, path=err.path)


def require(module: str, user: str, extra: str) -> ModuleType:
    """``import module`` for ``user``, or the ImportError of ``missing_dependency``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_dependency(err, user, extra) from err
