# Our LZ4 kernel, e98499b's one-token walk against this build's batches, on B1's 8 streams (each
# alone, one chunk, 64 and 1,024 chunks): the same bytes from both, then kernel times, medians.
import struct, sys
import numpy as np, cupy as cp
srcs = {"e98499b": open(sys.argv[2]).read(), "batches": open("zarrs_gpu_codecs/src/codecs/lz4/decode.cu").read()}
b1 = open(sys.argv[1], "rb").read(); p = 0; streams = []
while p < len(b1):
    nin, cap = struct.unpack_from("<2I", b1, p); p += 8
    streams.append((b1[p:p+nin], cap)); p += nin
def timed(kern, blocks, caps, reps=9):
    n = len(blocks)
    in_off = np.zeros(n + 1, np.int64); in_off[1:] = np.cumsum([len(x) for x in blocks])
    out_off = np.zeros(n + 1, np.int64); out_off[1:] = np.cumsum(caps)
    d_in = cp.asarray(np.frombuffer(b"".join(blocks) + b"\0", np.uint8)); d_out = cp.zeros(int(out_off[-1]) + 1, cp.uint8)
    ins = cp.asarray((d_in.data.ptr + in_off[:-1]).astype(np.uint64)); outs = cp.asarray((d_out.data.ptr + out_off[:-1]).astype(np.uint64))
    sizes = cp.asarray(np.array([len(x) for x in blocks], np.uint64)); capsd = cp.asarray(np.array(caps, np.uint64))
    dec = cp.zeros(n, cp.uint64); st = cp.full(n, 0xFFFFFFFF, cp.uint32)
    args = (ins, sizes, capsd, outs, dec, st, np.uint64(0), np.uint64(n))
    ts = []
    for r in range(reps + 1):
        e0 = cp.cuda.Event(); e1 = cp.cuda.Event(); e0.record(); kern(((n + 3) // 4,), (128,), args); e1.record(); e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    assert int(st.max()) == 0, "a B1 stream failed"
    ts = sorted(ts[1:]); return ts[len(ts) // 2], ts[int(len(ts) * 0.9)], d_out.get()
print("B1 streams (stored, decoded):", [(len(s), c) for s, c in streams])
outs = {}
for name, src in srcs.items():
    kern = cp.RawModule(code=src, backend="nvrtc").get_function("lz4_decode_blocks")
    alone = [timed(kern, [s], [c])[0] for s, c in streams]
    row = [f"{name:8} streams alone (ms) " + " ".join(f"{t:.3f}" for t in alone)]
    for chunks in (1, 16, 64, 1024):
        med, p90, out = timed(kern, [s for s, _ in streams] * chunks, [c for _, c in streams] * chunks, 9 if chunks < 1024 else 5)
        if chunks == 64: outs[name] = out
        row.append(f"{chunks} chunks {med:.3f} (p90 {p90:.3f})")
    print(" | ".join(row))
print("same bytes from both (64 chunks):", bool(np.array_equal(outs["e98499b"], outs["batches"])))
