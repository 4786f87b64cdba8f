"""Our zstd kernels compiled as the crate compiles them (NVRTC, the four .cu files, for this GPU's
architecture), written out as a cubin, so that the GPU host's `nvdisasm` can print the
machine code of a kernel's loop (`-g` for the source lines with --lineinfo):

    python3 benches/zstd_sass.py OUT_DIR [--source DIR] [--lineinfo]
    nvdisasm -c -g OUT_DIR/zstd.cubin > sass.txt
"""
import os, sys
import cupy as cp
from cupy_backends.cuda.libs import nvrtc

out = sys.argv[1]
opt = lambda name, default=None: sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default
source_dir = opt("--source", "zarrs_gpu_codecs/src/codecs/zstd")
src = "".join(open(f"{source_dir}/{name}.cu").read() for name in ("entropy", "decode", "blocks", "bytes"))
arch = f"sm_{cp.cuda.Device().compute_capability}"
options = [f"-arch={arch}"] + (["-lineinfo"] if "--lineinfo" in sys.argv else [])
prog = nvrtc.createProgram(src + "\n#define ZS_OK 12345\n", "zstd.cu", [], [])
try:
    nvrtc.compileProgram(prog, options)
except Exception as e:  # the log says why
    print(nvrtc.getProgramLog(prog))
    raise
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "zstd.cubin"), "wb") as f:
    f.write(nvrtc.getCUBIN(prog))
print(f"{arch} {options}: {os.path.getsize(os.path.join(out, 'zstd.cubin'))} bytes of cubin")
