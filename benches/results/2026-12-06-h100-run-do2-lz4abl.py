# Where our LZ4 kernel's time goes (run DO2): e98499b's one-token walk, and the same text with
# parts taken out or qualified, on B1's 8 streams (each alone, one chunk, 64 chunks), medians of 9.
# Variants that drop copies write wrong bytes (timed only); "restrict" must give the same bytes.
import struct, sys
import numpy as np, cupy as cp
src0 = open("zarrs_gpu_codecs/src/codecs/lz4/decode.cu").read()
lit = "LZ4_FOR_LANES(i, literals) dst[i] = src[i];"
a = src0.index("        if (offset >= matched) {"); b = src0.index("        op += matched;\n    }")
restrict = (src0.replace("LZ4_FN int lz4_length(const unsigned char* in,", "LZ4_FN int lz4_length(const unsigned char* __restrict__ in,")
            .replace("LZ4_FN unsigned int lz4_block(const unsigned char* in, unsigned long long n, unsigned char* out,",
                     "LZ4_FN unsigned int lz4_block(const unsigned char* __restrict__ in, unsigned long long n, unsigned char* __restrict__ out,"))
smem = src0 + r"""
// Experiment kernels (one warp a thread block): the stream's input, or its output, in shared
// memory, so that the walk's loads (or the match copies' reads of bytes just written) are
// shared-memory loads.
extern "C" __global__ void lz4_smem_in(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                                       const unsigned long long* capacities, unsigned char* const* outputs,
                                       unsigned long long* decoded, unsigned int* statuses, const unsigned int* tags,
                                       unsigned long long n) {
    extern __shared__ unsigned char smem[];
    const unsigned long long k = blockIdx.x;
    if (k >= n) return;
    const unsigned long long len = input_sizes[k];
    for (unsigned long long i = threadIdx.x; i < len; i += 32) smem[i] = inputs[k][i];
    __syncwarp();
    unsigned long long written = 0;
    unsigned int status = lz4_block(smem, len, outputs[k], capacities[k], &written);
    if (threadIdx.x == 0) { statuses[k] = status; decoded[k] = written; }
}
extern "C" __global__ void lz4_smem_out(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                                        const unsigned long long* capacities, unsigned char* const* outputs,
                                        unsigned long long* decoded, unsigned int* statuses, const unsigned int* tags,
                                        unsigned long long n) {
    extern __shared__ unsigned char smem[];
    const unsigned long long k = blockIdx.x;
    if (k >= n) return;
    unsigned long long written = 0;
    unsigned int status = lz4_block(inputs[k], input_sizes[k], smem, capacities[k], &written);
    __syncwarp();
    for (unsigned long long i = threadIdx.x; i < written; i += 32) outputs[k][i] = smem[i];
    if (threadIdx.x == 0) { statuses[k] = status; decoded[k] = written; }
}
"""
variants = {"walk": src0, "restrict": restrict, "no literal copy": src0.replace(lit, ""),
            "no match copy": src0[:a] + src0[b:], "no copies": (src0[:a] + src0[b:]).replace(lit, ""),
            "batches (a491712)": open(sys.argv[2]).read()}
assert restrict != src0 and variants["no literal copy"] != src0
b1 = open(sys.argv[1], "rb").read(); p = 0; streams = []
while p < len(b1):
    nin, cap = struct.unpack_from("<2I", b1, p); p += 8
    streams.append((b1[p:p+nin], cap)); p += nin
def timed(kern, blocks, caps, reps=9, smem=None):
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
        e0 = cp.cuda.Event(); e1 = cp.cuda.Event(); e0.record()
        if smem is None: kern(((n + 3) // 4,), (128,), args)
        else: kern((n,), (32,), args, shared_mem=smem)
        e1.record(); e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    assert int(st.max()) == 0, "a B1 stream failed"
    ts = sorted(ts[1:]); return ts[len(ts) // 2], d_out.get()
print("B1 streams (stored, decoded):", [(len(s), c) for s, c in streams])
ref = None
for name, src in variants.items():
    kern = cp.RawModule(code=src, backend="nvrtc").get_function("lz4_decode_blocks")
    alone = [timed(kern, [s], [c])[0] for s, c in streams]
    one, out = timed(kern, [s for s, _ in streams], [c for _, c in streams])
    c64, _ = timed(kern, [s for s, _ in streams] * 64, [c for _, c in streams] * 64, 5)
    if ref is None: ref = out
    same = bool(np.array_equal(ref, out))
    print(f"{name:18} streams alone (ms) " + " ".join(f"{t:.3f}" for t in alone) + f" | 1 chunk {one:.3f} | 64 chunks {c64:.3f} | bytes {'same' if same else 'differ'}", flush=True)

# Shared-memory experiments (one warp a thread block, the most shared memory a block may ask).
mod = cp.RawModule(code=smem, backend="nvrtc")
for name, which in (("input in smem", "lz4_smem_in"), ("output in smem", "lz4_smem_out")):
    need = max(len(x) for x, _ in streams) if which == "lz4_smem_in" else max(c for _, c in streams)
    try:
        kern = mod.get_function(which)
        kern.max_dynamic_shared_size_bytes = need
        alone = [timed(kern, [x], [c], smem=need)[0] for x, c in streams]
        one, out = timed(kern, [x for x, _ in streams], [c for _, c in streams], smem=need)
        c64, _ = timed(kern, [x for x, _ in streams] * 64, [c for _, c in streams] * 64, 5, smem=need)
        same = bool(np.array_equal(ref, out))
        print(f"{name:18} streams alone (ms) " + " ".join(f"{t:.3f}" for t in alone) + f" | 1 chunk {one:.3f} | 64 chunks {c64:.3f} | bytes {'same' if same else 'differ'}", flush=True)
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {e}", flush=True)
