"""Our zstd kernel on the GPU through NVRTC (CuPy), no Rust build needed there: every case the CPU
shim decoded (`dump_cases_for_the_gpu_harness`) must give the same status, length and bytes; then
decoder-only timings on Z2-like frames (1 MiB float32 chunks, zstd level 3), device input to
device output, one launch per batch, medians of 9.

    ZSTD_DUMP=$PWD/zcases.bin cargo test -p zarrs_gpu_codecs --lib \
        codecs::zstd::decode::tests::dump_cases_for_the_gpu_harness -- --ignored
    python3 benches/zstd_decoder.py zcases.bin [--json rows.jsonl]
"""
import gzip, json, struct, sys, time
import numpy as np, cupy as cp

dump = sys.argv[1] if len(sys.argv) > 1 else "zcases.bin"
rows_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None

src = open("zarrs_gpu_codecs/src/codecs/zstd/decode.cu").read()
# Compiled as the crate does (NVRTC); a name defined after it checks its #undefs.
mod = cp.RawModule(code=src + "\n#define ZS_OK 12345\n", backend="nvrtc")
kern = mod.get_function("zstd_decode_frames")


def arrays(frames, caps, repeat_inputs=None):
    """Device arrays for `frames` (bytes) decoding into outputs of `caps` bytes."""
    n = len(caps)
    blobs = frames if repeat_inputs is None else repeat_inputs
    in_off = np.zeros(len(blobs) + 1, np.int64)
    in_off[1:] = np.cumsum([len(b) for b in blobs])
    d_in = cp.asarray(np.frombuffer(b"".join(blobs) + b"\0", np.uint8))
    which = np.arange(n) % len(blobs)
    out_off = np.zeros(n + 1, np.int64)
    out_off[1:] = np.cumsum(caps)
    d_out = cp.full(int(out_off[-1]) + 1, 0xA5, dtype=cp.uint8)
    ins = cp.asarray((d_in.data.ptr + in_off[which]).astype(np.uint64))
    outs = cp.asarray((d_out.data.ptr + out_off[:-1]).astype(np.uint64))
    sizes = cp.asarray(np.array([len(blobs[w]) for w in which], np.uint64))
    capsd = cp.asarray(np.array(caps, np.uint64))
    dec = cp.zeros(n, cp.uint64)
    st = cp.full(n, 0xFFFFFFFF, cp.uint32)
    keep = (d_in, d_out)
    return (ins, sizes, capsd, outs, dec, st, np.uint64(n)), d_out, out_off, st, dec, keep


raw = gzip.open(dump).read() if dump.endswith(".gz") else open(dump, "rb").read()
p = 0
cases = []
while p < len(raw):
    nin, cap, status, decoded = struct.unpack_from("<4I", raw, p)
    p += 16
    frame = raw[p:p + nin]
    p += nin
    out = raw[p:p + cap]
    p += cap
    cases.append((frame, cap, status, decoded, out))
args, d_out, out_off, st, dec, keep = arrays([c[0] for c in cases], [c[1] for c in cases])
kern((len(cases),), (32,), args)
cp.cuda.Device().synchronize()
st = st.get()
dec = dec.get()
host_out = d_out.get()
bad = 0
codes = {}
for i, (frame, cap, status, decoded, out) in enumerate(cases):
    codes[int(status)] = codes.get(int(status), 0) + 1
    ok = st[i] == status and dec[i] == decoded
    if status == 0:
        ok = ok and host_out[out_off[i]:out_off[i] + cap].tobytes() == out
    if not ok:
        bad += 1
        if bad < 6:
            print("MISMATCH", i, cap, len(frame), "gpu", st[i], dec[i], "cpu", status, decoded)
guard = host_out[int(out_off[-1])]
print(f"{len(cases)} cases, {bad} mismatches with the CPU shim; statuses {sorted(codes.items())}; guard {guard:#x}")

# Decoder-only timings: Z2-like chunks (a float32 random walk, 1 MiB each, zstd level 3).
import numcodecs

rng = np.random.default_rng(5)
codec = numcodecs.Zstd(level=3)
chunks = []
for k in range(64):
    walk = np.cumsum(rng.integers(-3, 4, 262144)).astype(np.float32) * 0.25 + k
    chunks.append(walk.tobytes())
frames = [codec.encode(c) for c in chunks]
ratio = sum(len(c) for c in chunks) / sum(len(f) for f in frames)
print(f"Z2-like frames: 64 distinct, ratio {ratio:.2f}, mean {np.mean([len(f) for f in frames]) / 1024:.0f} KiB")
rows = []
for n in (1, 16, 64, 1024, 8192):
    args, d_out, out_off, st, dec, keep = arrays(None, [1 << 20] * n, repeat_inputs=frames)
    times = []
    for rep in range(10):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        kern((n,), (32,), args)
        cp.cuda.Device().synchronize()
        if rep:
            times.append((time.perf_counter() - t) * 1e3)
    s = st.get()
    assert (s == 0).all(), f"{n} frames: statuses {np.unique(s)}"
    got = d_out[: 64 << 20].get() if n >= 64 else d_out[: n << 20].get()
    for k in range(min(n, 64)):
        assert got[k << 20:(k + 1) << 20].tobytes() == chunks[k], f"frame {k} differs"
    med = float(np.median(times))
    gib = n / 1024 / (med / 1e3)
    print(f"ours, {n} frames of 1 MiB: median {med:.2f} ms, p90 {np.percentile(times, 90):.2f} ms, {gib:.2f} GiB/s")
    rows.append(dict(decoder="ours", frames=n, median_ms=med, p90_ms=float(np.percentile(times, 90)), gib_s=gib))
    del args, d_out, keep
# Where one frame's time goes: the same kernel with parts taken out of its text (the statuses
# stay those of a full decode: lengths are still counted and checked).
variants = {
    "without the sequences' copies": [
        ("zs_copy_down(out + op, lits + lp, ll);", ";"),
        ("zs_match(out + op, offset, ml);", ";"),
        ("ZS_FOR_LANES(i, n) out[op + i] = i < ll ? lit[i] : out[op + i - offset];", ";"),
    ],
}
variants["without the copies and the Huffman streams"] = variants["without the sequences' copies"] + [
    ("sh->stream_status[s] = zs_huffman_stream(sh, data + at, n, tail + s * segment, count);",
     "sh->stream_status[s] = 1;"),
    ("if (ZS_LANE == 0) sh->stream_status[0] = zs_huffman_stream(sh, data, data_len, tail, size);",
     "if (ZS_LANE == 0) sh->stream_status[0] = 1;"),
]
for name, edits in variants.items():
    text = src
    for old_text, new_text in edits:
        assert old_text in text, old_text
        text = text.replace(old_text, new_text)
    k2 = cp.RawModule(code=text, backend="nvrtc").get_function("zstd_decode_frames")
    for n in (1, 1024):
        args, d_out, out_off, st, dec, keep = arrays(None, [1 << 20] * n, repeat_inputs=frames)
        times = []
        for rep in range(6):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            k2((n,), (32,), args)
            cp.cuda.Device().synchronize()
            if rep:
                times.append((time.perf_counter() - t) * 1e3)
        print(f"ours {name}, {n} frames: median {float(np.median(times)):.2f} ms")
        del args, d_out, keep
if rows_path:
    with open(rows_path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
