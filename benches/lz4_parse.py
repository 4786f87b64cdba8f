"""How much of our LZ4 kernel's walk is its checks and its 64-bit arithmetic, on the GPU through
NVRTC (CuPy): the kernel (`codecs/lz4/decode.cu`), and variants made from its text: 32-bit
positions and lengths, the checks taken off the walk (these trust their input: valid streams
only), each with and without the copies. B1's streams (1 MiB float32 chunks, c-blosc lz4 5, byte
shuffle), kernel alone, medians of 9, ms; "bytes" against the kernel's.

    LZ4_DUMP=$PWD/lz4cases.bin cargo test -p zarrs_gpu_codecs --lib dump_cases_for_the_gpu_harness -- --ignored
    python3 benches/lz4_parse.py lz4cases.bin.b1

The record of what the walk costs and why this is the next measurement: benches/RESULTS.md,
thirty-third session (run DO2).
"""
import re, sys
import numpy as np, cupy as cp

from lz4_batch import Batch, b1_streams
src0 = open("zarrs_gpu_codecs/src/codecs/lz4/decode.cu").read()
lit = "LZ4_FOR_LANES(i, literals) dst[i] = src[i];"
def no_copies(s):
    a = s.index("        if (offset >= matched) {"); b = s.index("        op += matched;\n    }")
    return (s[:a] + s[b:]).replace(lit, "")
def bits32(s):
    head, rest = s.split("LZ4_FN int lz4_length", 1)
    body, tail = rest.split("// Block k of n: warp k of the grid", 1)
    body = body.replace("unsigned long long* written", "WRITTEN_PTR")
    body = body.replace("unsigned long long", "unsigned int")
    body = body.replace("WRITTEN_PTR", "unsigned long long* written")
    return head + "LZ4_FN int lz4_length" + body + "// Block k of n: warp k of the grid" + tail
checks = [r"        if \(literals > n - ip\) \{ status = LZ4_LITERALS_PAST_INPUT; break; \}\n",
          r"        if \(literals > expected - op\) \{ status = LZ4_PAST_CAPACITY; break; \}\n",
          r"        if \(expected - op < 12 \|\| n - ip < 8\) \{ status = LZ4_END_RULES; break; \}\n",
          r"        if \(offset == 0 \|\| offset > op\) \{ status = LZ4_BAD_OFFSET; break; \}\n",
          r"        if \(\(token & 15u\) == 15u && n - ip < 4\) \{ status = LZ4_END_RULES; break; \}\n",
          r"        if \(matched > expected - op\) \{ status = LZ4_PAST_CAPACITY; break; \}\n",
          r"        if \(expected - op - matched < 5\) \{ status = LZ4_END_RULES; break; \}\n",
          r"        // The bytes the match reads, written by any lane, are seen by all.\n        LZ4_SYNC\(\);\n"]
def no_checks(s):
    for c in checks:
        s, k = re.subn(c, "", s); assert k == 1, c
    return s
variants = {"walk": src0, "no copies": no_copies(src0), "32-bit": bits32(src0), "32-bit, no copies": no_copies(bits32(src0)),
            "no checks": no_checks(src0), "no checks, no copies": no_copies(no_checks(src0)),
            "32-bit, no checks, no copies": no_copies(no_checks(bits32(src0)))}
streams = b1_streams(sys.argv[1])
def timed(kern, blocks, caps, reps=9):
    """The median of `reps` launches, ms, and the decoded bytes."""
    batch = Batch(cp, blocks, caps)
    times = batch.timed(cp, kern, reps)
    return times[len(times) // 2], batch.out.get()
print("B1 streams (stored, decoded):", [(len(s), c) for s, c in streams])
ref = None
for name, src in variants.items():
    try:
        kern = cp.RawModule(code=src, backend="nvrtc").get_function("lz4_decode_blocks")
        alone = [timed(kern, [s], [c])[0] for s, c in streams]
        one, out = timed(kern, [s for s, _ in streams], [c for _, c in streams])
        if ref is None: ref = out
        print(f"{name:30} streams alone (ms) " + " ".join(f"{t:.3f}" for t in alone) + f" | 1 chunk {one:.3f} | bytes {'same' if np.array_equal(ref, out) else 'differ'}", flush=True)
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
