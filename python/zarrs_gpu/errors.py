"""The exceptions of zarrs_gpu beyond Python's own (``RuntimeError``, ``IndexError``,
``ValueError``, ``TypeError``, ``FileNotFoundError``)."""

__all__ = ["ArrayNotFoundError"]


class ArrayNotFoundError(ValueError, FileNotFoundError):
    """No array or group at the node ``zarrs_gpu.open`` was given (the store is there). The message
    names the nearest group above the node, its arrays and its OME-Zarr multiscale levels.

    Both a ``FileNotFoundError`` and a ``ValueError``, as zarr-python 3's own
    ``zarr.errors.ArrayNotFoundError`` is (``NodeNotFoundError``: a ``BaseZarrError``, which is a
    ``ValueError``, and a ``FileNotFoundError``): ``except FileNotFoundError`` catches a missing
    node from either library, and code that caught the ``ValueError`` zarrs_gpu raised before
    still does. It is not zarr's class, so that it is the same with or without zarr installed and
    ``import zarrs_gpu`` never imports zarr."""
