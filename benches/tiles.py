#!/usr/bin/env python3
"""Random tiles to the GPU, the Python peers: the tile case of the benchmark of record (issue 17).

Reads tiles of 64 x 256 x 256 (16 MiB of float32) of one benchmark array (written by `bench`,
benches/bench.rs) at random starts, at chunk-aligned starts, and single stored chunks (a shard's
inner chunk for sharded arrays), each read then synchronised (cupy.cuda.Device().synchronize()),
with each peer; then a tile loop with a compute step, without and with prefetch.

Tile starts. Both this script and `bench --tiles N` draw them the same way, so that their rows
are the same tiles: every list (random tiles, aligned tiles, single chunks) comes from a fresh
splitmix64 generator (Steele, Lea and Flood 2014, Vigna's splitmix64.c) seeded with 17, tile by
tile and within a tile dimension by dimension; a draw from 0..n is (next() * n) >> 64. A random
start is a draw from 0..shape-extent (inclusive); an aligned one is a draw from 0..shape//extent,
times the extent. A list of N tiles is the first N of any longer one.

Peers (--peers, all by default), each array opened once and every read one index of it:
  zarrs-gpu-python  "zarrs_gpu (Python API)": zarrs_gpu.open(path)[key], then cupy.asarray
  zarr-gpu-zarrs    "zarr-python in gpu_zarr_context()": zarr.open_array(path)[key] inside
                    `with zarrs_gpu.gpu_zarr_context():`
  zarr-gpu          "zarr-python enable_gpu()": the same inside `with zarr.config.enable_gpu():`
  zarr-host         "zarr-python host + cupy.asarray": a host read, then one copy
Every row's read of a tile ends with a device synchronisation; the first two tiles of a list are
read once, untimed, before the list is timed. zarr-python's async.concurrency is 64, as in
benches/peers.py.

Tile loop (--loop-tiles, 32 random tiles, this project's Python API): a CuPy kernel on each tile
(every element through k steps of v = v * 1.0001 + 0.5, on a non-blocking stream, so that it does
not wait on the reader's streams), k calibrated so that one step takes the median read time of a
tile (or --compute-ms). Rows: the read alone, the compute alone, read then compute (no prefetch),
Array.read_ahead(keys, prefetch=2) (zarrs_gpu's read-ahead) where the package has it, and a baseline prefetch
with a Python thread (one reader thread, up to --prefetch tiles ahead, the plain API). Each loop
step ends with the compute stream synchronised. Loop rows: seconds (and gib_s) per tile, the
median of --loop-repeat runs' totals over the tiles; read_ms, compute_ms the read-only and
compute-only loops' mean per tile; median_ms, p90_ms of the steps; efficiency = max(read_ms,
compute_ms) / loop_ms (issue 17's target: at least 0.8 with prefetch).

Usage:
  python3 benches/tiles.py --array /tmp/b/z2.zarr [--tiles 48] [--loop-tiles 32] [--json OUT.jsonl]
                           [--peers zarrs-gpu-python,zarr-gpu-zarrs,zarr-gpu,zarr-host]
                           [--kinds random,aligned,chunk] [--no-loop] [--compute-ms MS]
  python3 benches/tiles.py --self-test    # host only: tile starts, keys, loops (numpy if present)

Output: one JSON object per row on stdout (and appended to --json), with the keys of
benches/peers.py (peer, case, bytes, seconds, gib_s, runs) and median_ms, p90_ms, tiles; a failing
peer prints {"peer": ..., "case": ..., "error": ...} (or "skipped") and the rest go on. A table
of the rows closes the output.
"""
import argparse
import collections
import concurrent.futures
import contextlib
import json
import os
import statistics
import sys
import time

from common import emit, median_p90, parse_args

TILE = (64, 256, 256)
SEED = 17
WARMUP = 2
_MASK = (1 << 64) - 1

PEERS = {
    "zarrs-gpu-python": "zarrs_gpu (Python API)",
    "zarr-gpu-zarrs": "zarr-python in gpu_zarr_context()",
    "zarr-gpu": "zarr-python enable_gpu()",
    "zarr-host": "zarr-python host + cupy.asarray",
}
KINDS = ("random", "aligned", "chunk")
# What each kind's list holds, in the rows' "subset" (as bench.rs words it).
KIND_WORDS = {"random": "random starts", "aligned": "chunk-aligned starts", "chunk": "random chunks"}
# Case names of benches/bench.rs by array directory (the rest: the name upper-cased).
CASE_NAMES = {"z2c": "Z2 checksummed", "s1r": "S1 uncompressed", "s1g": "S1 gzip"}


# ---------------------------------------------------------------- tiles
class SplitMix64:
    """splitmix64, as zarrs_gpu_codecs' random_crops draws (bench.rs takes its tile starts from it)."""

    def __init__(self, seed):
        self.state = seed & _MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n):
        """A draw from 0..n (n at least 1): the high 64 bits of next() * n."""
        return (self.next() * n) >> 64


def tile_starts(shape, extent, count, aligned, seed=SEED):
    """count starts of boxes of extent (at most shape) inside shape (see the module's text)."""
    rng = SplitMix64(seed)
    out = []
    for _ in range(count):
        out.append(tuple(rng.below(n // e) * e if aligned else rng.below(n - e + 1)
                         for n, e in zip(shape, extent)))
    return out


def units_met(start, extent, unit):
    """Chunks of shape unit (a regular grid from the origin) that the box start, extent meets."""
    count = 1
    for s, e, u in zip(start, extent, unit):
        count *= (s + e - 1) // u - s // u + 1
    return count


def make_key(start, extent):
    """The index of the box start, extent: a tuple of slices."""
    return tuple(slice(s, s + e) for s, e in zip(start, extent))


def dims(extent):
    return "x".join(map(str, extent))


def read_meta(path):
    """Shape, chunk shape (a shard's for sharded arrays), stored chunk shape, codec names."""
    with open(os.path.join(path, "zarr.json")) as f:
        meta = json.load(f)
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise ValueError(f"{path} is not a Zarr v3 array")
    chunks = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
    codecs = meta["codecs"]
    sharded = codecs[0].get("name") == "sharding_indexed"
    unit = tuple(codecs[0]["configuration"]["chunk_shape"]) if sharded else chunks
    names = [c.get("name") for c in (codecs[0]["configuration"]["codecs"] if sharded else codecs)]
    return {"shape": tuple(meta["shape"]), "chunks": chunks, "unit": unit, "sharded": sharded,
            "codecs": names, "data_type": meta["data_type"]}


def case_name(path):
    base = os.path.basename(os.path.normpath(path))
    base = base[:-5] if base.endswith(".zarr") else base
    return CASE_NAMES.get(base, base.upper())


def kind_lists(meta, tile, count, kinds=KINDS):
    """(kind, case suffix, extent, starts) for each kind asked, as bench.rs names its rows."""
    shape = meta["shape"]
    extent = tuple(min(t, n) for t, n in zip(tile, shape))
    unit = tuple(min(u, n) for u, n in zip(meta["unit"], shape))
    one = "one inner chunk" if meta["sharded"] else "one chunk"
    table = {
        "random": (f"random tile {dims(extent)}", extent, False),
        "aligned": (f"aligned tile {dims(extent)}", extent, True),
        "chunk": (f"{one} {dims(unit)}", unit, True),
    }
    return [(k, table[k][0], table[k][1], tile_starts(shape, table[k][1], count, table[k][2])) for k in kinds]


# ---------------------------------------------------------------- peers
def device_sync(xp):
    if xp.__name__ != "numpy":
        xp.cuda.Device().synchronize()


def _on_device(out, xp):
    if not isinstance(out, xp.ndarray):
        raise TypeError(f"the read returned {type(out).__name__}, not {xp.__name__}.ndarray")
    return out


@contextlib.contextmanager
def open_peer(peer, path, xp):
    """A read(key) giving the tile as an xp array, for peer; its array opened once."""
    gpu = xp.__name__ != "numpy"
    if peer != "zarr-host" and not gpu:
        raise RuntimeError(f"{peer} reads to the GPU (needs cupy)")
    if peer == "zarrs-gpu-python":
        import zarrs_gpu
        array = zarrs_gpu.open(path)
        yield lambda key: xp.asarray(array[key])
    elif peer == "zarr-gpu-zarrs":
        import zarr
        import zarrs_gpu
        # The pipeline is taken when the array is opened, GPU buffers when it is read: both inside.
        with zarrs_gpu.gpu_zarr_context():
            array = zarr.open_array(path, mode="r")
            yield lambda key: _on_device(array[key], xp)
    elif peer == "zarr-gpu":
        import zarr
        with zarr.config.enable_gpu():
            array = zarr.open_array(path, mode="r")
            yield lambda key: _on_device(array[key], xp)
    elif peer == "zarr-host":
        import zarr
        array = zarr.open_array(path, mode="r")
        yield lambda key: xp.asarray(array[key])
    else:
        raise ValueError(f"unknown peer {peer!r} (one of {', '.join(PEERS)})")


def time_reads(read, keys, xp):
    """Seconds of each read of keys (each then synchronised), after WARMUP untimed ones."""
    for key in keys[:WARMUP]:
        out = read(key)
        device_sync(xp)
        del out
    runs = []
    for key in keys:
        t0 = time.perf_counter()
        out = read(key)
        device_sync(xp)
        runs.append(time.perf_counter() - t0)
        del out
    return runs


def row(peer, case, subset, nbytes, runs, count, **extra):
    med, p90 = median_p90(runs)
    return {"peer": peer, "case": case, "subset": subset, "bytes": nbytes, "seconds": med,
            "gib_s": nbytes / 2**30 / med if med > 0 else None, "runs": runs,
            "median_ms": med * 1e3, "p90_ms": p90 * 1e3, "tiles": count, **extra}


def error_row(peer, case, err):
    if isinstance(err, NotImplementedError):
        return {"peer": peer, "case": case, "skipped": str(err)}
    text = f"{type(err).__name__}: {err}"
    return {"peer": peer, "case": case, "error": text if len(text) <= 600 else text[:300] + " ... " + text[-300:]}


def bench_peer(peer, path, meta, tile, count, kinds, xp):
    """The rows of one peer: one per kind of tile list."""
    name, rows = case_name(path), []
    try:
        opened = open_peer(peer, path, xp)
        read = opened.__enter__()
    except Exception as e:  # noqa: BLE001 - the peer's error row
        return [error_row(PEERS.get(peer, peer), name, e)]
    with contextlib.ExitStack() as stack:
        stack.push(opened)
        for kind, suffix, extent, starts in kind_lists(meta, tile, count, kinds):
            case = f"{name} {suffix}"
            try:
                keys = [make_key(s, extent) for s in starts]
                runs = time_reads(read, keys, xp)
                first = read(keys[0])
                nbytes = int(first.nbytes)
                checksum = float(xp.sum(first, dtype=xp.float64))
                del first
                subset = f"{count} {KIND_WORDS[kind]} of {dims(extent)}, splitmix64 seed {SEED}"
                rows.append(row(PEERS[peer], case, subset, nbytes, runs, count,
                                chunks_per_tile=median_p90([units_met(s, extent, meta["unit"]) for s in starts])[0],
                                checksum=checksum))
            except Exception as e:  # noqa: BLE001 - report and go on with the next kind
                rows.append(error_row(PEERS[peer], case, e))
            if xp.__name__ != "numpy":
                xp.get_default_memory_pool().free_all_blocks()
    return rows


# ---------------------------------------------------------------- tile loop
def as_array(item, xp):
    """A tile from zarrs_gpu.tiles' iterator (an array, or a tuple holding one) as an xp array."""
    if isinstance(item, tuple):
        arrays = [i for i in item if hasattr(i, "__cuda_array_interface__") or hasattr(i, "__dlpack__")
                  or isinstance(i, xp.ndarray)]
        if not arrays:
            raise TypeError(f"zarrs_gpu.tiles yielded a tuple without an array: {[type(i).__name__ for i in item]}")
        item = arrays[-1]
    if not hasattr(item, "__cuda_array_interface__") and hasattr(item, "__dlpack__") and hasattr(xp, "from_dlpack"):
        return xp.from_dlpack(item)
    return xp.asarray(item)


def tiles_api(module, array, keys, prefetch):
    """The package's read-ahead over explicit keys, `array.read_ahead(keys, prefetch=prefetch)`
    (it yields `(key, DeviceArray)`), or NotImplementedError saying why not."""
    fn = getattr(array, "read_ahead", None)
    if fn is None:
        raise NotImplementedError("no Array.read_ahead in this zarrs_gpu")
    return fn(keys, prefetch=prefetch)


def run_loop(items, compute, sync):
    """Compute on each item of items (an iterator of tiles), each step synchronised: (total
    seconds, per-step seconds, steps)."""
    steps = []
    t0 = last = time.perf_counter()
    for x in items:
        compute(x)
        sync()
        now = time.perf_counter()
        steps.append(now - last)
        last = now
    return time.perf_counter() - t0, steps


def sequential(read, keys):
    for key in keys:
        yield read(key)


def thread_prefetch(read, keys, prefetch):
    """The tiles of keys in order, read by one Python thread up to prefetch tiles ahead."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = collections.deque(pool.submit(read, key) for key in keys[:prefetch])
        ahead = prefetch
        try:
            while pending:
                x = pending.popleft().result()
                if ahead < len(keys):
                    pending.append(pool.submit(read, keys[ahead]))
                    ahead += 1
                yield x
        finally:
            for fut in pending:
                fut.cancel()


def api_prefetch(module, array, keys, prefetch, xp):
    count = 0
    for item in tiles_api(module, array, keys, prefetch):
        count += 1
        yield as_array(item, xp)
    if count != len(keys):
        raise RuntimeError(f"read_ahead gave {count} tiles for {len(keys)} keys")


def loop_variants(read, module, array, keys, prefetch, xp):
    """(variant, what, a function of keys giving the iterator of tiles) of the tile loop."""
    return [
        ("no prefetch", "no prefetch", lambda ks: sequential(read, ks)),
        (f"read_ahead prefetch={prefetch}", "zarrs_gpu's Array.read_ahead",
         lambda ks: api_prefetch(module, array, ks, prefetch, xp)),
        (f"thread prefetch={prefetch}", "a Python thread, the plain API",
         lambda ks: thread_prefetch(read, ks, prefetch)),
    ]


def efficiency(read_s, compute_s, loop_s):
    """max(read, compute) / loop, per tile (1: the slower of the two hides the other)."""
    return max(read_s, compute_s) / loop_s if loop_s > 0 else None


def make_compute(xp):
    """k steps of v = v * 1.0001 + 0.5 on every element, one kernel, on a non-blocking stream."""
    kernel = xp.ElementwiseKernel("float32 x, int32 k", "float32 y",
                                  "float v = x; for (int i = 0; i < k; ++i) { v = v * 1.0001f + 0.5f; } y = v;",
                                  "zarrs_gpu_bench_tile_compute")
    stream = xp.cuda.Stream(non_blocking=True)

    def compute(x, k):
        with stream:
            return kernel(x, xp.int32(k))
    return compute, stream.synchronize


def calibrate(compute, sync, x, target_s, reps=5):
    """k such that compute(x, k) takes about target_s: (k, seconds of one step at k)."""
    def timed(k):
        compute(x, k)
        sync()
        runs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            compute(x, k)
            sync()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)
    k = 64
    t = timed(k)
    for _ in range(8):
        if abs(t - target_s) <= 0.05 * target_s:
            break
        k = max(1, min(1 << 28, round(k * target_s / max(t, 1e-7))))
        t = timed(k)
    return k, t


def tile_loop(path, meta, tile, count, prefetch, repeat, compute_ms, xp):
    """The tile loop's rows (this project's Python API)."""
    import zarrs_gpu
    name, peer = case_name(path), PEERS["zarrs-gpu-python"]
    _, _, extent, starts = kind_lists(meta, tile, count, ("random",))[0]
    keys = [make_key(s, extent) for s in starts]
    array = zarrs_gpu.open(path)
    read = lambda key: xp.asarray(array[key])  # noqa: E731
    compute, sync = make_compute(xp)
    base = f"{name} tile loop {dims(extent)}"
    subset = f"{count} {KIND_WORDS['random']} of {dims(extent)}, splitmix64 seed {SEED}"
    rows = []
    # The read alone (each tile then synchronised), per tile.
    read_runs = time_reads(read, keys, xp)
    read_s = sum(read_runs) / len(read_runs)
    x = read(keys[0])
    nbytes = int(x.nbytes)
    target = compute_ms / 1e3 if compute_ms else statistics.median(read_runs)
    k, _ = calibrate(compute, sync, x, target)
    step = lambda t: compute(t, k)  # noqa: E731
    compute_total, compute_steps = run_loop(iter([x] * len(keys)), step, sync)
    compute_s = compute_total / len(keys)
    common = {"compute_k": k, "read_ms": read_s * 1e3, "compute_ms": compute_s * 1e3}
    for what, runs, per_tile in (("read only", read_runs, read_s), ("compute only", compute_steps, compute_s)):
        r = row(peer, f"{base}: {what}", subset, nbytes, runs, count, **common, loop_ms=per_tile * 1e3)
        r.update(seconds=per_tile, gib_s=nbytes / 2**30 / per_tile)
        rows.append(r)
    del x
    for variant, what, tiles_of in loop_variants(read, zarrs_gpu, array, keys, prefetch, xp):
        case = f"{base}: {variant}"
        try:
            run_loop(tiles_of(keys[:WARMUP]), step, sync)  # warm-up
            totals, steps = [], []
            for _ in range(repeat):
                total, s = run_loop(tiles_of(keys), step, sync)
                totals.append(total)
                steps.extend(s)
            per_tile = statistics.median(totals) / len(keys)
            r = row(peer, case, subset, nbytes, steps, count, **common,
                    prefetch=0 if what == "no prefetch" else prefetch, prefetch_by=what, loop_ms=per_tile * 1e3,
                    efficiency=efficiency(read_s, compute_s, per_tile), loop_runs=totals)
            # A loop's figure (seconds, gib_s) is its time per tile, not a step's median.
            r.update(seconds=per_tile, gib_s=nbytes / 2**30 / per_tile)
            rows.append(r)
        except Exception as e:  # noqa: BLE001 - report and go on with the next variant
            rows.append(error_row(peer, case, e))
        xp.get_default_memory_pool().free_all_blocks()
    return rows


# ---------------------------------------------------------------- run
def configure_zarr():
    import zarr
    zarr.config.set({"async.concurrency": 64})


def table(rows):
    """The rows as a table, for people."""
    lines = [f"{'who':<36} {'case':<58} {'median ms':>9} {'p90 ms':>8} {'GiB/s':>7}  loop"]
    for r in rows:
        if "median_ms" not in r:
            lines.append(f"{r.get('peer', ''):<36} {r.get('case', ''):<58} {r.get('error') or r.get('skipped')}")
            continue
        extra = f"{r['loop_ms']:.2f} ms/tile" if "loop_ms" in r else ""
        if r.get("efficiency") is not None:
            extra += f", read {r['read_ms']:.2f}, compute {r['compute_ms']:.2f}, efficiency {r['efficiency']:.2f}"
        lines.append(f"{r['peer']:<36} {r['case'][:58]:<58} {r['median_ms']:9.2f} {r['p90_ms']:8.2f} "
                     f"{r['gib_s'] or 0:7.2f}  {extra}")
    return "\n".join(lines)


def run(args):
    import cupy as xp
    try:
        configure_zarr()
    except ImportError as e:  # the zarr peers report it themselves
        print(f"warning: zarr unavailable: {e}", file=sys.stderr)
    meta = read_meta(args.array)
    tile = tuple(int(t) for t in args.tile.split(","))
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if any(k not in KINDS for k in kinds):
        raise SystemExit(f"--kinds: one of {', '.join(KINDS)}")
    rows = []
    for peer in [p.strip() for p in args.peers.split(",") if p.strip()]:
        try:
            got = bench_peer(peer, args.array, meta, tile, args.tiles, kinds, xp)
        except Exception as e:  # noqa: BLE001 - report and go on with the next peer
            got = [error_row(PEERS.get(peer, peer), case_name(args.array), e)]
        for r in got:
            emit(r, args.json)
        rows.extend(got)
        xp.get_default_memory_pool().free_all_blocks()
    if not args.no_loop:
        try:
            got = tile_loop(args.array, meta, tile, args.loop_tiles, args.prefetch, args.loop_repeat,
                            args.compute_ms, xp)
        except Exception as e:  # noqa: BLE001
            got = [error_row(PEERS["zarrs-gpu-python"], f"{case_name(args.array)} tile loop", e)]
        for r in got:
            emit(r, args.json)
        rows.extend(got)
    print(table(rows))


# ---------------------------------------------------------------- self-test
def self_test():
    """Host only: the generator, tile starts, keys, statistics, metadata, loops (numpy and zarr
    where installed)."""
    import tempfile
    ok = 0

    def check(cond, what):
        nonlocal ok
        if not cond:
            raise AssertionError(what)
        ok += 1

    # splitmix64: Vigna's splitmix64.c from seed 0, and the values random_crops gives (checked in
    # zarrs_gpu_codecs' read_ahead tests).
    check(SplitMix64(0).next() == 0xE220A8397B1DCDAF, "splitmix64(0)")
    rng = SplitMix64(1234567)
    check([rng.next() for _ in range(3)] == [6457827717110365317, 3203168211198807973, 9817491932198370423],
          "splitmix64(1234567)")
    shape = (512, 2048, 2048)
    check(tile_starts(shape, TILE, 3, False) == RUST_RANDOM_512, "random starts as bench.rs draws them")
    check(tile_starts(shape, TILE, 3, True) == RUST_ALIGNED_512, "aligned starts as bench.rs draws them")
    check(tile_starts(shape, (64, 64, 64), 3, True) == RUST_CHUNK_512, "chunk starts as bench.rs draws them")
    for aligned in (False, True):
        starts = tile_starts(shape, TILE, 200, aligned)
        check(starts == tile_starts(shape, TILE, 200, aligned), "deterministic")
        check(starts[:48] == tile_starts(shape, TILE, 48, aligned), "a list is the first tiles of a longer one")
        check(all(0 <= s and s + t <= n for st in starts for s, t, n in zip(st, TILE, shape)), "inside the array")
        check(len(set(starts)) > 150, "spread")
        if aligned:
            check(all(s % t == 0 for st in starts for s, t in zip(st, TILE)), "aligned starts")
        else:
            check(sum(all(s % t == 0 for s, t in zip(st, TILE)) for st in starts) < 3, "random starts not aligned")
    small = tile_starts((5, 3), (5, 3), 4, False) + tile_starts((5, 3), (5, 3), 4, True)
    check(small == [(0, 0)] * 8, "a tile as large as the array starts at 0")
    check(units_met((0, 0, 0), TILE, (64, 64, 64)) == 16, "aligned Z2 tile meets 16 chunks")
    check(units_met((1, 1, 1), TILE, (64, 64, 64)) == 50, "unaligned Z2 tile meets 2x5x5 chunks")
    check(units_met((64, 256, 0), TILE, (64, 256, 256)) == 1, "aligned U1 tile is one chunk")
    check(units_met((63, 255, 255), TILE, (64, 256, 256)) == 8, "unaligned U1 tile meets 8 chunks")
    check(make_key((3, 4, 5), (2, 2, 2)) == (slice(3, 5), slice(4, 6), slice(5, 7)), "key")
    check(median_p90([float(i) for i in range(10, 0, -1)]) == (5.5, 9.0), "median, p90 of 10")
    check(median_p90([3.0, 1.0, 2.0]) == (2.0, 3.0) and median_p90([4.0]) == (4.0, 4.0), "median, p90 of 3, 1")
    check(efficiency(4.0, 5.0, 6.25) == 0.8 and efficiency(1.0, 1.0, 0.0) is None, "efficiency")
    check(case_name("/tmp/b/z2.zarr/") == "Z2" and case_name("/tmp/b/s1g.zarr") == "S1 gzip", "case names")
    with tempfile.TemporaryDirectory(prefix="tiles-selftest-") as tmp:
        plain = os.path.join(tmp, "z2.zarr")
        os.makedirs(plain)
        with open(os.path.join(plain, "zarr.json"), "w") as f:
            json.dump({"zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": "float32",
                       "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [64, 64, 64]}},
                       "codecs": [{"name": "bytes"}, {"name": "zstd"}]}, f)
        sharded = os.path.join(tmp, "s1.zarr")
        os.makedirs(sharded)
        with open(os.path.join(sharded, "zarr.json"), "w") as f:
            json.dump({"zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": "float32",
                       "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [256, 256, 256]}},
                       "codecs": [{"name": "sharding_indexed", "configuration": {
                           "chunk_shape": [64, 64, 64], "codecs": [{"name": "bytes"}, {"name": "zstd"}]}}]}, f)
        m = read_meta(plain)
        check(m["unit"] == (64, 64, 64) and not m["sharded"] and m["codecs"] == ["bytes", "zstd"], "plain meta")
        m = read_meta(sharded)
        check(m["unit"] == (64, 64, 64) and m["chunks"] == (256, 256, 256) and m["sharded"], "sharded meta")
        lists = kind_lists(m, TILE, 4)
        check([c for _, c, _, _ in lists] == ["random tile 64x256x256", "aligned tile 64x256x256",
                                              "one inner chunk 64x64x64"], "row names as bench.rs")
        check(lists[2][3][:3] == RUST_CHUNK_512 and lists[0][3][:3] == RUST_RANDOM_512, "row lists")
    try:
        import numpy as np
    except ImportError:
        print("self-test: numpy not installed: the array checks are skipped", file=sys.stderr)
        np = None
    if np is not None:
        self_test_arrays(np, check)
    print(f"self-test: {ok} passed, 0 failed")


def self_test_arrays(np, check):
    """Keys against numpy's slicing; the loops with numpy tiles and a fake zarrs_gpu.tiles; the
    host peer on zarr arrays where zarr is installed."""
    import types
    data = np.arange(8 * 40 * 36, dtype=np.float32).reshape(8, 40, 36)
    tile, meta = (4, 16, 16), {"shape": data.shape, "unit": (4, 8, 8), "sharded": False}
    for kind, _, extent, starts in kind_lists(meta, tile, 20):
        for s in starts:
            got = data[make_key(s, extent)]
            want = data[s[0]:s[0] + extent[0], s[1]:s[1] + extent[1], s[2]:s[2] + extent[2]]
            check(got.shape == extent and np.array_equal(got, want), f"{kind} key {s}")
    keys = [make_key(s, tile) for s in tile_starts(data.shape, tile, 7, False)]
    read = lambda key: data[key].copy()  # noqa: E731
    seen = []
    compute = lambda x: seen.append(float(x.sum()))  # noqa: E731
    want = [float(data[k].sum()) for k in keys]
    run_loop(sequential(read, keys), compute, lambda: None)
    check(seen == want, "sequential loop order")
    for prefetch in (1, 2, 5, 9):
        seen.clear()
        total, steps = run_loop(thread_prefetch(read, keys, prefetch), compute, lambda: None)
        check(seen == want and len(steps) == len(keys) and total >= sum(steps) * 0.99, f"thread prefetch {prefetch}")
    fake = types.SimpleNamespace(read_ahead=lambda ks, prefetch: ((k, data[k]) for k in ks))
    seen.clear()
    run_loop(api_prefetch(None, fake, keys, 2, np), compute, lambda: None)
    check(seen == want, "read-ahead loop (fake, (key, array) items)")
    try:
        run_loop(api_prefetch(None, data, keys, 2, np), compute, lambda: None)
        check(False, "an array without read_ahead should be skipped")
    except NotImplementedError as e:
        check("no Array.read_ahead" in str(e), f"skip reason {e}")
    skipped = error_row("p", "c", NotImplementedError("no zarrs_gpu.tiles"))
    check(skipped == {"peer": "p", "case": "c", "skipped": "no zarrs_gpu.tiles"}, "skip row")
    try:
        import zarr
    except ImportError:
        print("self-test: zarr not installed: the host peer check is skipped", file=sys.stderr)
        return
    import tempfile
    configure_zarr()
    with tempfile.TemporaryDirectory(prefix="tiles-selftest-") as tmp:
        for name, shards in (("z2.zarr", None), ("s1.zarr", (8, 16, 16))):
            path = os.path.join(tmp, name)
            z = zarr.create_array(path, shape=data.shape, chunks=(4, 8, 8), shards=shards, dtype="float32",
                                  fill_value=0.0)
            z[...] = data
            meta = read_meta(path)
            check(meta["unit"] == (4, 8, 8) and meta["sharded"] == (shards is not None), f"{name} meta")
            rows = bench_peer("zarr-host", path, meta, tile, 5, KINDS, np)
            check([r.get("error") for r in rows] == [None] * 3, f"{name} host peer rows: {rows}")
            for r, (_, _, extent, starts) in zip(rows, kind_lists(meta, tile, 5)):
                check(r["checksum"] == float(data[make_key(starts[0], extent)].sum(dtype=np.float64)),
                      f"{name} {r['case']} checksum")
                check(len(r["runs"]) == 5 and r["bytes"] == 4 * int(np.prod(extent)), f"{name} {r['case']} row")
            check(rows[0]["case"] == ("S1" if shards else "Z2") + " random tile 4x16x16", "case name")
            rows = bench_peer("zarrs-gpu-python", path, meta, tile, 5, KINDS, np)
            check(len(rows) == 1 and "needs cupy" in rows[0]["error"], "a GPU peer without cupy is an error row")


# The first three tile starts that bench.rs's tile_starts draws for a (512, 2048, 2048) array
# (bench --gib 8): random and aligned tiles of 64x256x256, single chunks of 64x64x64.
RUST_RANDOM_512 = [(225, 701, 588), (100, 30, 146), (14, 1171, 45)]
RUST_ALIGNED_512 = [(256, 768, 512), (64, 0, 0), (0, 1280, 0)]
RUST_CHUNK_512 = [(256, 768, 640), (64, 0, 128), (0, 1280, 0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--array", help="a benchmark array's directory (has zarr.json), e.g. /tmp/b/z2.zarr")
    ap.add_argument("--tiles", type=int, default=48, help="tiles per row (default 48)")
    ap.add_argument("--tile", default=",".join(map(str, TILE)), help="tile shape (default 64,256,256)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="random, aligned, chunk (default all)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"default {','.join(PEERS)}")
    ap.add_argument("--loop-tiles", type=int, default=32, help="tiles in the tile loop (default 32)")
    ap.add_argument("--loop-repeat", type=int, default=3, help="timed runs of each loop (median; default 3)")
    ap.add_argument("--prefetch", type=int, default=2, help="tiles read ahead in the prefetching loops")
    ap.add_argument("--compute-ms", type=float, default=None,
                    help="the compute step's time (default: the median read time of a tile)")
    ap.add_argument("--no-loop", action="store_true", help="no tile loop")
    args = parse_args(ap, self_test)
    if args is None:
        return 0
    run(args)


if __name__ == "__main__":
    main()
