"""What the LZ4 kernel's harness (benches/lz4_decoder.py) uses: B1's streams as dumped by
`dump_cases_for_the_gpu_harness`, and a batch laid out as the kernel takes it (imported as a
sibling module)."""
import struct

import numpy as np


def b1_streams(path):
    """The dumped B1 chunk's LZ4 streams: (stored bytes, decoded length) each."""
    raw = open(path, "rb").read()
    p, streams = 0, []
    while p < len(raw):
        nin, cap = struct.unpack_from("<2I", raw, p)
        p += 8
        streams.append((raw[p:p + nin], cap))
        p += nin
    return streams


# How the kernel is launched: (LZ4 blocks a thread block, threads a thread block; None: as
# decode.rs' `threads_for` picks them on an H100). The kernel of today takes a thread block per
# LZ4 block; "warp": the one-warp-a-block walk of e98499b, for timings against it.
SHAPES = {"block": (1, None), "warp": (4, 128)}


class Batch:
    """`blocks` (stored bytes) and their decoded lengths `caps` in device memory, with the
    kernel's arguments (`args`, for a grid of `grid` thread blocks of `block` threads, launched
    as `shape` says), its outputs (`out`, item k at `out_off[k]`, guarded by 0xA5) and where it
    writes statuses and lengths."""

    def __init__(self, cp, blocks, caps, tags=None, shape="block"):
        n = len(blocks)
        in_off = np.zeros(n + 1, np.int64)
        in_off[1:] = np.cumsum([len(b) for b in blocks])
        self.out_off = np.zeros(n + 1, np.int64)
        self.out_off[1:] = np.cumsum(caps)
        self._in = cp.asarray(np.frombuffer(b"".join(blocks) + b"\0", np.uint8))
        self.out = cp.full(int(self.out_off[-1]) + 1, 0xA5, dtype=cp.uint8)
        ins = cp.asarray((self._in.data.ptr + in_off[:-1]).astype(np.uint64))
        outs = cp.asarray((self.out.data.ptr + self.out_off[:-1]).astype(np.uint64))
        sizes = cp.asarray(np.array([len(b) for b in blocks], np.uint64))
        capacities = cp.asarray(np.array(caps, np.uint64))
        self.decoded = cp.zeros(n, cp.uint64)
        self.statuses = cp.full(n, 0xFFFFFFFF, cp.uint32)
        self._tags = cp.asarray(np.array(tags, np.uint32)) if tags is not None else None
        tag_arg = self._tags if self._tags is not None else np.uint64(0)
        self.args = (ins, sizes, capacities, outs, self.decoded, self.statuses, tag_arg, np.uint64(n))
        per_block, threads = SHAPES[shape]
        self.grid = ((n + per_block - 1) // per_block,)
        self.block = (threads or (1024 if n <= 132 else 512),)

    def timed(self, cp, kern, reps):
        """Kernel times of `reps` launches after one untimed, ms, sorted; every item decoded."""
        times = []
        for r in range(reps + 1):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            kern(self.grid, self.block, self.args)
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        assert int(self.statuses.max()) == 0, "a B1 stream failed"
        return sorted(times[1:])
