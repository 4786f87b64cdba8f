"""Our LZ4 kernel on the GPU through NVRTC (CuPy), no Rust build needed there: every case the
CPU shim decoded (`dump_cases_for_the_gpu_harness`) must give the same status, length and bytes;
then decoder-only timings on B1's streams (c-blosc lz4 5, byte shuffle, 1 MiB float32 chunks),
device input to device output, one launch per batch, medians of 12.

    LZ4_DUMP=$PWD/lz4cases.bin cargo test -p zarrs_gpu_codecs --lib dump_cases_for_the_gpu_harness -- --ignored
    python3 benches/lz4_decoder.py lz4cases.bin

LZ4_PHASES=1: then a copy of the kernel with clock64 around its phases (thread 0's cycles, each
phase ending at a barrier: the tables, the token chain, a round's parse/place/check, its
windows), per stream of one B1 chunk, in microseconds: the chunk alone, and the mean over a batch
of 1,024 chunks (where blocks share the SMs).
"""
import gzip, struct, sys, time
import numpy as np, cupy as cp

from lz4_batch import Batch, b1_streams

dump = sys.argv[1] if len(sys.argv) > 1 else "lz4cases.bin"

import os
# LZ4_SOURCE: another version of the kernel to time (LZ4_TIMINGS_ONLY=1: its statuses may differ
# from the dump's, which the current source wrote), launched as LZ4_SHAPE says (lz4_batch.SHAPES).
src = open(os.environ.get("LZ4_SOURCE", "zarrs_gpu_codecs/src/codecs/lz4/decode.cu")).read()
timings_only = os.environ.get("LZ4_TIMINGS_ONLY") == "1"
shape = os.environ.get("LZ4_SHAPE", "block")
# Compiled as the crate does: NVRTC, the codecs' sources concatenated (here ours alone twice
# separated, to check the #undefs leave nothing behind).
mod = cp.RawModule(code=src + "\n#define LZ4_OK 12345\n", backend="nvrtc")
kern = mod.get_function("lz4_decode_blocks")

def run(blocks, caps, tags=None):
    batch = Batch(cp, blocks, caps, tags, shape)
    return kern, batch.grid, batch.args, batch.out, batch.out_off, batch.statuses, batch.decoded, batch

import lzma
raw = (gzip.open(dump) if dump.endswith(".gz") else lzma.open(dump) if dump.endswith(".xz") else open(dump, "rb")).read()
p = 0; cases = []
while p < len(raw):
    nin, cap, status, decoded = struct.unpack_from("<4I", raw, p); p += 16
    blk = raw[p:p+nin]; p += nin
    out = raw[p:p+cap]; p += cap
    cases.append((blk, cap, status, decoded, out))
k, grid, args, d_out, out_off, st, dec, batch0 = run([c[0] for c in cases], [c[1] for c in cases])
k(grid, batch0.block, args); cp.cuda.Device().synchronize()
st = st.get(); dec = dec.get(); host_out = d_out.get()
bad = 0; codes = {}
for i, (blk, cap, status, decoded, out) in enumerate(cases):
    codes[status] = codes.get(status, 0) + 1
    ok = st[i] == status and dec[i] == decoded
    if status == 0:
        ok = ok and host_out[out_off[i]:out_off[i] + cap].tobytes() == out
    if not ok:
        bad += 1
        if bad < 5: print("MISMATCH", i, cap, len(blk), "gpu", st[i], dec[i], "cpu", status, decoded)
print(f"{len(cases)} cases, {bad} mismatches with the CPU shim; statuses {sorted(codes.items())}")
# Tags or-ed into failing statuses.
k2, grid2, args2, _, _, st2, _, _ = run([b"\xf0", b"\x30xyz"], [20, 3], tags=[0x40000100, 0x40000200])
k2(grid2, batch0.block, args2); cp.cuda.Device().synchronize()
tagged = [int(x) for x in st2.get()]
print("tagged statuses", [hex(x) for x in tagged])
if (bad or tagged != [0x40000104, 0]) and not timings_only:
    sys.exit("the GPU and the CPU shim disagree")

streams = b1_streams(dump.removesuffix(".gz").removesuffix(".xz") + ".b1")
print(f"B1 chunk: {len(streams)} streams, {sum(len(s[0]) for s in streams)} stored bytes")
alone = []
for s in streams:
    times = Batch(cp, [s[0]], [s[1]], shape=shape).timed(cp, kern, 12)
    alone.append(f"{len(s[0])} B {times[len(times) // 2]:.3f}")
print("each stream alone, median ms:", ", ".join(alone))


def chunks_batch(chunks):
    """B1's chunk `chunks` times over, laid out as the kernel takes it."""
    return Batch(cp, [s[0] for s in streams] * chunks, [s[1] for s in streams] * chunks, shape=shape)


for chunks in [1, 16, 64, 1024, 8192]:
    batch = chunks_batch(chunks)
    times = batch.timed(cp, kern, 12)
    t0 = time.perf_counter(); kern(batch.grid, batch.block, batch.args); cp.cuda.Device().synchronize(); wall = (time.perf_counter() - t0) * 1e3
    med = times[len(times) // 2]
    print(f"chunks {chunks:5d} ({len(streams) * chunks} LZ4 blocks): median {med:.3f} ms, p90 {times[int(len(times)*0.9)]:.3f} ms, "
          f"wall {wall:.3f} ms, {chunks * (1 << 20) / med / 1e6:.1f} GB/s decoded")
    del batch

# The phases, from the kernel's text (each anchor must be found: the copy follows the kernel),
# the windows' own (their entries, the pointer passes, the write; passes and windows counted)
# and the tables' (the tile's bytes copied, the steps, the jumps; tiles counted).
PHASES = ["tables", "chain", "parse, place, check", "windows"]
WINDOW_PARTS = ["entries", "passes", "write"]
TABLE_PARTS = ["copy", "steps", "jumps"]
SLOTS = 14
if os.environ.get("LZ4_PHASES") == "1" and shape == "block":
    text = src
    # Summed over the batch per stream of the chunk (block k is stream k % streams).
    at = "&lz4_cycles[(blockIdx.x % LZ4_STREAMS) * 14 + {k}]"
    cyc = "if (threadIdx.x == 0) atomicAdd(" + at + ", (unsigned long long)(clock64() - {c}));"
    for old, new in [
        ("    lz4_tables(s, in, n);\n", "    { long long c0 = clock64(); lz4_tables(s, in, n); " + cyc.format(k=0, c="c0") + " }\n"),
        ("            lz4_chain(s, in, n);\n", "            { long long c1 = clock64(); lz4_chain(s, in, n); " + cyc.format(k=1, c="c1") + " }\n"),
        ("    const lz4_u32 count = s->count;\n", "    const lz4_u32 count = s->count;\n    const long long c2 = clock64();\n"),
        ("    const lz4_u32 base = s->base, end = s->end;\n",
         "    " + cyc.format(k=2, c="c2") + "\n    const long long c3 = clock64();\n    const lz4_u32 base = s->base, end = s->end;\n"),
        ("    if (LZ4_TID == 0) s->base = end;\n", "    " + cyc.format(k=3, c="c3") + "\n    if (LZ4_TID == 0) s->base = end;\n"),
        ("    const Lz4In x = lz4_input(s, in, n);\n    // Four bytes a thread",
         "    const Lz4In x = lz4_input(s, in, n);\n    long long tc = clock64();\n"
         "    if (threadIdx.x == 0) atomicAdd(" + at.format(k=10) + ", 1ull);\n    // Four bytes a thread"),
        ("    LZ4_SYNC();\n    LZ4_FOR_THREADS(r, span) s->step[r]", "    LZ4_SYNC();\n    " + cyc.format(k=11, c="tc") + " tc = clock64();\n    LZ4_FOR_THREADS(r, span) s->step[r]"),
        ("    LZ4_FOR_THREADS(r, span) s->step[r] = (unsigned short)lz4_step(&x, n, tile + r);\n    LZ4_SYNC();\n",
         "    LZ4_FOR_THREADS(r, span) s->step[r] = (unsigned short)lz4_step(&x, n, tile + r);\n    LZ4_SYNC();\n    " + cyc.format(k=12, c="tc") + " tc = clock64();\n"),
        ("    if (LZ4_TID == 0) s->span = span;\n    LZ4_SYNC();\n}", "    if (LZ4_TID == 0) s->span = span;\n    LZ4_SYNC();\n    " + cyc.format(k=13, c="tc") + "\n}"),
        ("    const lz4_u32 exec = s->exec, len = w1 - w0;\n", "    const lz4_u32 exec = s->exec, len = w1 - w0;\n    long long wc = clock64();\n"
         "    if (threadIdx.x == 0) atomicAdd(" + at.format(k=9) + ", 1ull);\n"),
        ("    // Every pointer leads to an earlier byte", "    " + cyc.format(k=4, c="wc") + " wc = clock64();\n    // Every pointer leads to an earlier byte"),
        ("        if (!s->more[pass % 3]) break;\n",
         "        if (!s->more[pass % 3]) { if (threadIdx.x == 0) atomicAdd(" + at.format(k=8) + ", pass + 1ull); break; }\n"),
        ("    LZ4_FOR_THREADS(x, len) out[w0 + x] = (unsigned char)e[x];\n    LZ4_SYNC();\n",
         "    " + cyc.format(k=5, c="wc") + " wc = clock64();\n    LZ4_FOR_THREADS(x, len) out[w0 + x] = (unsigned char)e[x];\n    LZ4_SYNC();\n    "
         + cyc.format(k=6, c="wc") + "\n"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    assert len(streams) <= 64
    head = f"#define LZ4_STREAMS {len(streams)}ull\n__device__ unsigned long long lz4_cycles[{SLOTS} * 64];\n"
    pmod = cp.RawModule(code=head + text, backend="nvrtc")
    pkern = pmod.get_function("lz4_decode_blocks")
    cycles = cp.ndarray((SLOTS * 64,), cp.uint64, pmod.get_global("lz4_cycles"))
    mhz = cp.cuda.Device().attributes["ClockRate"] / 1e3
    for chunks in [1, 1024]:
        batch = chunks_batch(chunks)
        batch.timed(cp, pkern, 1)  # two launches, one untimed: cycles are zeroed before the last
        cycles.fill(0)
        pkern(batch.grid, batch.block, batch.args); cp.cuda.Device().synchronize()
        c = cycles.get().reshape(64, SLOTS) / chunks
        for i, s in enumerate(streams):
            parts = ", ".join(f"{name} {c[i][k] / mhz:.1f}" for k, name in enumerate(PHASES))
            w = max(c[i][9], 1)
            inner = ", ".join(f"{name} {c[i][4 + k] / w:.0f}" for k, name in enumerate(WINDOW_PARTS))
            tl = max(c[i][10], 1)
            tables = ", ".join(f"{name} {c[i][11 + k] / tl:.0f}" for k, name in enumerate(TABLE_PARTS))
            print(f"phases of {chunks} chunks, stream {i} ({len(s[0])} B), us a stream at {mhz:.0f} MHz: {parts}; "
                  f"{c[i][9]:.0f} windows, cycles a window: {inner}, {c[i][8] / w:.1f} passes; "
                  f"{c[i][10]:.0f} tiles, cycles a tile: {tables}")
        tot = c[:len(streams)].sum(axis=0) / mhz
        print(f"phases of {chunks} chunks, a chunk's streams summed, us: " + ", ".join(f"{n} {t:.0f}" for n, t in zip(PHASES, tot)))
        del batch

# LZ4_VARIANTS="TILE=2048,WINDOW=2048;ROUND=256": the kernel with those of its #defines changed,
# timed on the same batches beside the source as it is, each variant's bytes equal to its.
import re
variants = [v for v in os.environ.get("LZ4_VARIANTS", "").split(";") if v]
if variants and shape == "block":
    ref = chunks_batch(1)
    kern(ref.grid, ref.block, ref.args); cp.cuda.Device().synchronize()
    want = ref.out.get()
    for v in [""] + variants:
        text = src
        for kv in [x for x in v.split(",") if x]:
            name, value = kv.split("=")
            if name == "THREADS":  # the kernel takes blockDim.x: the launch alone
                continue
            text, hits = re.subn(rf"#define LZ4_{name} \S+", f"#define LZ4_{name} {value}u", text, count=1)
            assert hits == 1, name
        vk = cp.RawModule(code=text, backend="nvrtc").get_function("lz4_decode_blocks")
        threads = dict(kv.split("=") for kv in v.split(",") if kv).get("THREADS")

        def batch_of(chunks):  # launched with the variant's threads a block
            b = chunks_batch(chunks)
            if threads:
                b.block = (int(threads),)
            return b

        one = batch_of(1)
        vk(one.grid, one.block, one.args); cp.cuda.Device().synchronize()
        same = bool((one.out.get() == want).all()) and int(one.statuses.max()) == 0
        row = []
        for chunks in [1, 64, 1024, 8192]:
            batch = batch_of(chunks)
            times = batch.timed(cp, vk, 8)
            row.append(f"{chunks}: {times[len(times) // 2]:.3f}")
            del batch
        print(f"variant {v or 'as it is'}: bytes {'equal' if same else 'DIFFER'}; median ms by chunks " + ", ".join(row))
