#!/usr/bin/env python3
"""Read back arrays written by zarrs_gpu with zarr-python and tensorstore, and compare each with
the values it was written from, element for element.

    python3 tests/interop/read_back.py WRITTEN.json

WRITTEN.json lists {"name", "path" (the array), "expected" (a .npy file of the values), "source"
(the array it was copied from, written by zarr-python or tensorstore)}. Both readers are required
(tensorstore's zarr driver for v2 arrays, zarr3 for v3); an array whose source tensorstore cannot
open either (numcodecs filters, which it does not implement) is read by zarr-python alone, and
counted. Prints one line per mismatch or failure and exits 1 if there is any.
"""
import json
import os
import sys

import numpy as np
import tensorstore as ts
import zarr


def tensorstore_read(path):
    driver = "zarr3" if os.path.exists(os.path.join(path, "zarr.json")) else "zarr"
    spec = {"driver": driver, "kvstore": {"driver": "file", "path": os.path.abspath(path)}}
    return ts.open(spec, open=True, read=True).result().read().result()


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    nan = a.dtype.kind in "fc" and b.dtype.kind in "fc"
    return bool(np.array_equal(a, b, equal_nan=nan))


def main(listing):
    with open(listing) as f:
        written = json.load(f)
    failures = unsupported = 0
    for case in written:
        want = np.load(case["expected"])
        readers = [("zarr-python", lambda p: zarr.open_array(p, mode="r")[...])]
        try:
            tensorstore_read(case["source"])
            readers.append(("tensorstore", tensorstore_read))
        except ValueError:
            unsupported += 1
        for reader, read in readers:
            try:
                got = read(case["path"])
            except Exception as e:  # a reader's failure is a finding too
                print(f"{case['name']}: {reader} could not read it: {type(e).__name__}: {e}")
                failures += 1
                continue
            if not same(got, want):
                print(f"{case['name']}: {reader} reads other values")
                failures += 1
    print(f"read back {len(written)} arrays with zarr-python and {len(written) - unsupported} with tensorstore "
          f"(it cannot open the other sources): {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
