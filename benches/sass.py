"""The SASS of one of our zstd kernels, without a GPU: NVRTC (from NVIDIA's PyPI wheel) compiles
the kernels' sources as the crate concatenates them, for sm_90, and nvdisasm (also a PyPI wheel)
prints the function; with a line range of one source, only the instructions that range compiled
to (inlined code included), each with its source line.

    python3 benches/sass.py zstd_decode_blocks blocks.cu 372 449 > /tmp/loop.sass

The wheels are downloaded once into target/sass-tools (pip, network needed).
"""
import ctypes, os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "target", "sass-tools")
SOURCES = ["entropy.cu", "decode.cu", "blocks.cu", "bytes.cu"]  # decode.rs' SOURCE, in order
LIB = os.path.join(TOOLS, "nvidia", "cu13", "lib")


def tools():
    if not os.path.exists(os.path.join(LIB, "libnvrtc.so.13")):
        os.makedirs(TOOLS, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "-d", TOOLS, "nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-nvdisasm"],
                       check=True)
        for w in os.listdir(TOOLS):
            if w.endswith(".whl"):
                subprocess.run([sys.executable, "-m", "zipfile", "-e", os.path.join(TOOLS, w), TOOLS], check=True)
    nvdisasm = os.path.join(TOOLS, "nvidia", "cu13", "bin", "nvdisasm")
    os.chmod(nvdisasm, 0o755)  # zipfile keeps no modes
    return nvdisasm


def cubin(path):
    # libnvrtc finds its builtins library beside it only through the loader's path.
    ctypes.CDLL(os.path.join(LIB, "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(LIB, "libnvrtc.so.13"))
    here = os.path.join(ROOT, "zarrs_gpu_codecs", "src", "codecs", "zstd")
    src = b"".join(open(os.path.join(here, f), "rb").read() for f in SOURCES)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"zstd.cu", 0, None, None) == 0
    opts = [b"-arch=sm_90", b"-lineinfo"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"NVRTC failed ({rc}): {log.value.decode()}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, buf)
    open(path, "wb").write(buf.raw)


def main():
    if len(sys.argv) not in (2, 5):
        sys.exit(__doc__)
    fn = sys.argv[1]
    nvdisasm = tools()
    path = os.path.join(TOOLS, "zstd.cubin")
    cubin(path)
    text = subprocess.run([nvdisasm, "-c", "-gi", "-sf", path], check=True, capture_output=True, text=True).stdout
    lines, inside = [], False
    for line in text.split("\n"):
        if line.startswith(".text."):
            inside = line.startswith(f".text.{fn}:")
        elif inside:
            lines.append(line)
    if len(sys.argv) == 2:
        print("\n".join(lines))
        return
    # Lines of the concatenated source where the chosen file starts.
    here = os.path.join(ROOT, "zarrs_gpu_codecs", "src", "codecs", "zstd")
    first = 1 + sum(open(os.path.join(here, f)).read().count("\n") for f in SOURCES[: SOURCES.index(sys.argv[2])])
    lo, hi = first + int(sys.argv[3]) - 1, first + int(sys.argv[4]) - 1
    # A group of consecutive line comments is one instruction's inlining chain, innermost first.
    group, in_group, count = [], False, 0
    for line in lines:
        if "//##" in line:
            group = (group if in_group else []) + [int(x) for x in re.findall(r"line (\d+)", line)]
            in_group = True
            continue
        in_group = False
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
        hits = [x for x in group if lo <= x <= hi]
        if m and hits:
            count += 1
            print(f"{m.group(1)} {sys.argv[2]}:{hits[0] - first + 1:<5} {m.group(2)}")
        elif line.startswith(".L_x_") and hits:
            print(line)
    print(f"{count} instructions from {sys.argv[2]} lines {sys.argv[3]} to {sys.argv[4]}", file=sys.stderr)


main()
