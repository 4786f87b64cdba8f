"""Our zstd kernels on the GPU through NVRTC (CuPy), no Rust build needed there: every case the CPU
shim decoded (`dump_cases_for_the_gpu_harness`, the block-parallel decoder) must give the same
status, length and bytes; then decoder-only timings on Z2-like frames (1 MiB float32 chunks,
zstd level 3), device input to device output, medians of 9: the block-parallel decoder (its three
launches, and each launch's share) and the one-warp decoder, in the same run.

    ZSTD_DUMP=$PWD/zcases.bin cargo test -p zarrs_gpu_codecs --lib \
        codecs::zstd::decode::tests::dump_cases_for_the_gpu_harness -- --ignored
    python3 benches/zstd_decoder.py zcases.bin [--json rows.jsonl] [--source DIR] [--label L] [--cycles]
        [--frames 1,16,64,1024,8192] [--decoders 'blocks,blocks executed,one warp']

`--source DIR`: the four .cu files from DIR (another build's kernels, to compare in one call);
`--split N`: a block's sequences in at most N spans (default: decode.rs' rule, 32 for launches of
3,072 blocks or fewer (`--split-blocks`), else 0: a lane a block, `zstd_sequence_lanes`, in sources that have it, else 1);
`--lane-threads N`: threads a thread block of `zstd_sequence_lanes` (default: decode.rs' `LANE_THREADS`, 8; 4 for older sources);
`--exec-threads N`: threads (and a round's sequences) of `zstd_execute` (default: decode.rs'
`exec_threads` of the launch's frames; sources before the thread block executor, a warp);
`--lineinfo`: the kernels compiled with line information (for ncu's source counters);
`--cycles`: also the instrumented block decode (clock64 cycles of each phase of a block's warp:
literals, tables, packing, chain walk, spans, rest), for --cycles-frames (default 1,16).
"""
import gzip, json, os, struct, sys, time
import numpy as np, cupy as cp

dump = sys.argv[1] if len(sys.argv) > 1 else "zcases.bin"
opt = lambda name, default=None: sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default
rows_path = opt("--json")
source_dir = opt("--source", "zarrs_gpu_codecs/src/codecs/zstd")
label = opt("--label", "")
SPLIT = opt("--split")  # spans a block's sequences split into at most (the kernels before them: ignored)

src = "".join(open(f"{source_dir}/{name}.cu").read() for name in ("entropy", "decode", "blocks", "bytes"))
# The jump passes' rule (decode.rs `jump_passes` and JUMP_GRID), or, for sources before it, one
# link a pass over a thread block a tile.
HOPS = 32 if "#define ZS_HOPS 32u" in src else None
CHAINS = "const unsigned int* chains" in src
# Warps a block's entries take side by side (decode.rs ENTRY_PARTS; sources before it: one).
ENTRY_PARTS = 8 if "gridDim.y warps per block" in src else 1
# Compiled as the crate does (NVRTC); a name defined after it checks its #undefs.
# --lineinfo: the kernels compiled with their source lines, for ncu's source counters.
NVRTC_OPTIONS = ("-lineinfo",) if "--lineinfo" in sys.argv else ()
mod = cp.RawModule(code=src + "\n#define ZS_OK 12345\n", backend="nvrtc", options=NVRTC_OPTIONS)
# Threads of zstd_execute's thread blocks: --exec-threads, else decode.rs' `exec_threads` of the
# launch's frames; sources before the thread block executor: a warp.
EXEC_BLOCK = "ZS_EXEC_THREADS" in src


def exec_threads(frames):
    if not EXEC_BLOCK:
        return 32
    return int(opt("--exec-threads", 128 if frames <= 512 else 64 if frames <= 2048 else 32))


kern = mod.get_function("zstd_decode_frames")
k_plan, k_blocks, k_exec, k_link, k_entries, k_jump, k_write = (mod.get_function(f) for f in (
    "zstd_plan", "zstd_decode_blocks", "zstd_execute", "zstd_link", "zstd_entries", "zstd_jump", "zstd_write"))
# (Sources with zstd_block_literals: a block plan holds its literals' count and section.)
FRAME_PLAN, BLOCK_PLAN, RECORD, ALIGN, JUMP_MAX = 64, 128 if "lit_taken" in src else 120, 12, 256, 64 << 20
# Sources whose block decode may find the literals decoded by a launch before (zstd_block_literals,
# as the crate launches it where the host walks the chains): a Blocks' `literals_first`.
SPLITS_LITERALS = "literals_done" in src
k_lits = mod.get_function("zstd_block_literals") if SPLITS_LITERALS else None
# Sources whose launches of many blocks decode the sequences a lane a block (split 0), from the
# packed tables the block decode leaves in a region of their own (decode.rs TABLE_BYTES a block).
LANES = "zstd_sequence_lanes" in src
# Blocks a launch at most whose sequences split into spans (decode.rs `SPLIT_BLOCKS`; 1,024 in
# builds before run DX1): --split-blocks.
SPLIT_BLOCKS = int(opt("--split-blocks", "3072"))
k_lanes = mod.get_function("zstd_sequence_lanes") if LANES else None
# (Sources whose lanes read their tables from shared memory, the launch's dynamic shared memory:
# 2 bytes a state, or before 98eac0a's successor 4.)
LANE_SHARED = "ZS_LANE_TABLES" in src
HALF_TABLES = "#define ZS_TABLE_WORDS 644u" in src
TABLE_BYTES = 4 * 644 if HALF_TABLES else 4 * (512 + 512 + 256 + 4) if LANE_SHARED else 4 * (2048 + 256 + 4)
# Threads a thread block of zstd_sequence_lanes: --lane-threads, or decode.rs' LANE_THREADS (8; 4
# for sources of 4 bytes a state).
LANE_THREADS = int(opt("--lane-threads", "8" if HALF_TABLES else "4"))


def slots(frame):
    """decode.rs `slots`: block plans, sequence records and literal bytes a frame takes."""
    blocks = seqs = lits = 0
    if len(frame) < 5 or frame[:4] != b"\x28\xb5\x2f\xfd":
        return 0, 0, 0
    fhd = frame[4]
    single = (fhd >> 5) & 1
    pos = 5 + (1 - single) + [0, 1, 2, 4][fhd & 3] + [single, 2, 4, 8][fhd >> 6]
    b = lambda blk, i: blk[i] if i < len(blk) else 0
    while pos + 3 <= len(frame):
        h = int.from_bytes(frame[pos:pos + 3], "little")
        last, kind, size = h & 1, (h >> 1) & 3, h >> 3
        if kind == 3:
            break
        blocks += 1
        body = 1 if kind == 1 else size
        if pos + 3 + body > len(frame):
            break
        blk = frame[pos + 3:pos + 3 + body]
        if kind == 2 and len(blk) >= 2:
            lk, fmt = blk[0] & 3, (blk[0] >> 2) & 3
            if lk < 2:
                head, n = {0: (1, blk[0] >> 3), 2: (1, blk[0] >> 3), 1: (2, (blk[0] | b(blk, 1) << 8) >> 4)}.get(
                    fmt, (3, (blk[0] | b(blk, 1) << 8 | b(blk, 2) << 16) >> 4))
                taken = head + (n if lk == 0 else 1)
            else:
                w = blk[0] | b(blk, 1) << 8 | b(blk, 2) << 16 | b(blk, 3) << 24
                if fmt < 2:
                    head, n, cs = 3, (w >> 4) & 0x3FF, (w >> 14) & 0x3FF
                elif fmt == 2:
                    head, n, cs = 4, (w >> 4) & 0x3FFF, w >> 18
                else:
                    head, n, cs = 5, (w >> 4) & 0x3FFFF, (w >> 22) | b(blk, 4) << 10
                taken = head + cs
            if lk != 0:
                lits += n
            if taken < len(blk):
                c0 = blk[taken]
                seqs += c0 if c0 < 128 else (b(blk, taken + 1) + (b(blk, taken + 2) << 8) + 0x7F00 if c0 == 255
                                             else ((c0 - 128) << 8) + b(blk, taken + 1))
        pos += 3 + body
        if last:
            break
    return blocks, seqs, lits


def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Blocks:
    """The block-parallel decoder's scratch and launches for one batch (decode.rs `BlockPlan`):
    its bytes resolved by jumps where the batch decodes to 64 MiB or less (unless `execute`),
    else each frame's sequences executed by a warp."""

    def __init__(self, frames_for_slots, caps, args, execute=False, split=None, literals_first=False):
        words, tb, ts, tl, te = [], 0, 0, 0, 0
        for f, c in zip(frames_for_slots, caps):
            nb, ns, nl = slots(f)
            words += [tl, nl, ts, ns, tb | nb << 32, 0, 0, te]
            tb, ts, tl, te = tb + nb, ts + ns, tl + nl, te + c
        n = len(frames_for_slots)
        self.n, self.nblocks, self.entries = n, tb, te
        self.jump = te <= JUMP_MAX and not execute
        blocks_at = align(n * FRAME_PLAN)
        records_at = blocks_at + align(tb * BLOCK_PLAN)
        lits_at = records_at + align(ts * RECORD)
        tables_at = lits_at + align(tl)
        # The most spans a block's sequences split into: `split`, --split's, or decode.rs' rule
        # (`split_for`); 0: a lane a block.
        self.split = int(split or SPLIT or (32 if tb <= SPLIT_BLOCKS else 0 if LANES else 1))
        self.len = tables_at + (align(tb * TABLE_BYTES) if self.split == 0 else 0)
        self.largest = max(caps) if caps else 0
        if HOPS:
            self.passes, span = 1, HOPS + 1
            while span - 1 < max(self.largest - 1, 0):
                self.passes, span = self.passes + 1, span * (HOPS + 1)
        else:
            self.passes = 65 - (64 - max(self.largest, 1).bit_length())
        entries_at, flags_at = self.len, self.len + align(4 * te)
        if self.jump:
            self.len = flags_at + align(4 * self.passes)
        # Reused memory holds anything: here entries that point far outside (0x37373737).
        self.scratch = cp.full(self.len + 8, 0x37, cp.uint8)
        base = self.scratch.data.ptr
        self.table = cp.asarray(np.array(words, np.uint64))
        self.frames, self.blocks, self.records, self.lits, self.ents, self.flags, self.tables = (
            np.uint64(base + a) for a in (0, blocks_at, records_at, lits_at, entries_at, flags_at, tables_at))
        self.args = args
        self.literals_first = literals_first and SPLITS_LITERALS

    def run(self, events=None, blocks_only=False):
        """Its launches; events (6) mark plan | blocks | link and entries | passes | write (the
        executor: all in the third). `blocks_only`: the plan and the block decode alone (for
        variants that leave the records unwritten)."""
        ins, sizes, caps, outs, dec, st, n = self.args
        cp.cuda.runtime.memcpyAsync(int(self.frames), self.table.data.ptr, self.table.nbytes, 3,
                                    cp.cuda.get_current_stream().ptr)
        if events: events[0].record()
        k_plan((self.n,), (32,), (ins, sizes, caps, self.frames, self.blocks, n))
        if self.literals_first and self.nblocks:
            k_lits((self.nblocks,), (32,), (ins, self.frames, self.blocks, self.lits, np.uint64(self.nblocks)))
        if events: events[1].record()
        if self.nblocks:
            # (No host chains here: lane 0 walks each block's; sources before them take no such argument.)
            chains = (np.uint64(0),) if CHAINS else ()
            done = (np.uint64(1 if self.literals_first else 0),) if SPLITS_LITERALS else ()
            tables = (np.uint64(self.tables if self.split == 0 else 0),) if LANES else ()
            k_blocks((self.nblocks,), (32,), (ins, self.frames, self.blocks, self.lits, self.records, np.uint64(self.nblocks),
                                               np.uint64(self.split)) + chains + done + tables)
            if self.split == 0:
                t = LANE_THREADS
                k_lanes(((self.nblocks + t - 1) // t,), (t,), (ins, self.frames, self.blocks, self.records, self.tables,
                                                               np.uint64(self.nblocks)),
                        shared_mem=t * TABLE_BYTES if LANE_SHARED else 0)
        if events: events[2].record()
        if blocks_only:
            pass
        elif not self.jump:
            k_exec((self.n,), (exec_threads(self.n),), (ins, caps, outs, dec, st, self.frames, self.blocks, self.lits, self.records, n))
        else:
            k_link((self.n,), (32,), (caps, dec, st, self.frames, self.blocks, self.flags, np.uint32(self.passes), n))
            if self.nblocks:
                k_entries((self.nblocks, ENTRY_PARTS), (32,), (ins, dec, st, self.frames, self.blocks, self.lits,
                                                                self.records, self.ents, np.uint64(self.nblocks)))
            if events: events[3].record()
            tiles = max(1, (self.entries + 255) // 256)
            grid = min(tiles, 8192) if HOPS else tiles
            for t in range(self.passes):
                k_jump((grid,), (32,), (self.ents, np.uint64(self.entries), self.flags, np.uint32(t)))
            if events: events[4].record()
            y = min(max(1, (self.largest + 4095) // 4096), 1024)
            k_write((self.n, y), (32,), (caps, outs, dec, st, self.frames, self.ents, n))
        if events:
            if blocks_only or not self.jump:
                events[3].record()
                events[4].record()
            events[5].record()


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


import lzma
raw = (gzip.open(dump) if dump.endswith(".gz") else lzma.open(dump) if dump.endswith(".xz") else open(dump, "rb")).read()
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
bad = 0
# Replayed with a block's sequences in 32 spans and in one (the dump's statuses are both's), and
# in 32 with the literals decoded by a launch of their own first.
# (The cases decode to less than 64 MiB: their bytes resolved by jumps, and, in the last mode, each
# frame's sequences executed by a warp as larger batches do, their blocks' a lane a block.)
modes = [("32", False, False), ("1", False, False)] + ([("32", True, False)] if SPLITS_LITERALS else []) + (
    [("0", False, False), ("0", False, True)] if LANES else [])
for replay_split, first, executed in [] if os.environ.get("ZSTD_SKIP_REPLAY") else modes:
    args, d_out, out_off, st, dec, keep = arrays([c[0] for c in cases], [c[1] for c in cases])
    Blocks([c[0] for c in cases], [c[1] for c in cases], args, split=replay_split, literals_first=first,
           execute=executed).run()
    cp.cuda.Device().synchronize()
    st = st.get()
    dec = dec.get()
    host_out = d_out.get()
    codes = {}
    for i, (frame, cap, status, decoded, out) in enumerate(cases):
        codes[int(status)] = codes.get(int(status), 0) + 1
        # (Executed, a damaged frame may fail on another check, as decode/tests.rs `ours` allows.)
        ok = (st[i] == 0) == (status == 0) if executed else st[i] == status and dec[i] == decoded
        if status == 0:
            ok = ok and host_out[out_off[i]:out_off[i] + cap].tobytes() == out
        if not ok:
            bad += 1
            if bad < 6:
                print("MISMATCH", i, cap, len(frame), "gpu", st[i], dec[i], "cpu", status, decoded)
    guard = host_out[int(out_off[-1])]
    print(f"split {replay_split}{', literals first' if first else ''}{', executed' if executed else ''}: {len(cases)} cases, {bad} mismatches with the CPU shim; statuses {sorted(codes.items())}; "
          f"guard {guard:#x}")
if os.environ.get("ZSTD_REPLAY_ONLY"):
    sys.exit(1 if bad else 0)

# Decoder-only timings: Z2-like chunks (a float32 random walk, 1 MiB each, zstd level 3).
# --chunks DIR: instead, the first 64 chunk files of a Z2 array (1 MiB zstd frames as `bench`
# writes them; no numcodecs needed), their bytes checked against the first decoder's.
chunk_dir = opt("--chunks")
if chunk_dir:
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(chunk_dir) for f in fs if not f.startswith("zarr."))[:64]
    frames = [open(q, "rb").read() for q in paths]
    chunks = None
    ratio = len(frames) * (1 << 20) / sum(len(f) for f in frames)
    print(f"Z2 frames of {chunk_dir}: {len(frames)}, ratio {ratio:.2f}, mean {np.mean([len(f) for f in frames]) / 1024:.0f} KiB")
else:
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
first_bytes = {}
counts = [int(v) for v in opt("--frames", "1,16,64,1024,8192").split(",")]
decoders = opt("--decoders", "blocks,blocks executed,one warp").split(",")
for n, decoder in [(n, d) for n in counts for d in decoders]:
    args, d_out, out_off, st, dec, keep = arrays(None, [1 << 20] * n, repeat_inputs=frames)
    times, phases = [], []
    plan = (Blocks([frames[k % len(frames)] for k in range(n)], [1 << 20] * n, args, execute=decoder == "blocks executed")
            if decoder != "one warp" else None)
    for rep in range(10):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        if plan is None:
            kern((n,), (32,), args)
            cp.cuda.Device().synchronize()
        else:
            ev = [cp.cuda.Event() for _ in range(6)]
            plan.run(ev)
            ev[5].synchronize()
            phases.append([cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) for i in range(5)])
        if rep:
            times.append((time.perf_counter() - t) * 1e3)
    s = st.get()
    assert (s == 0).all(), f"{n} frames: statuses {np.unique(s)}"
    got = d_out[: 64 << 20].get() if n >= 64 else d_out[: n << 20].get()
    for k in range(min(n, 64)):
        mine = got[k << 20:(k + 1) << 20].tobytes()
        if chunks is None:  # --chunks: the first decoder's bytes of a frame are the others'
            assert first_bytes.setdefault(k, mine) == mine, f"frame {k} differs"
        else:
            assert mine == chunks[k], f"frame {k} differs"
    med = float(np.median(times))
    gib = n / 1024 / (med / 1e3)
    share, row_phases = "", {}
    if phases:
        ph = np.median(np.array(phases[1:]), axis=0)
        if plan.jump:
            row_phases = dict(plan_ms=ph[0], blocks_ms=ph[1], entries_ms=ph[2], passes_ms=ph[3], write_ms=ph[4])
            share = (f" (plan {ph[0]:.2f}, blocks {ph[1]:.2f}, jumps {ph[2] + ph[3] + ph[4]:.2f} ms: link and entries "
                     f"{ph[2]:.2f}, {plan.passes} passes {ph[3]:.2f}, write {ph[4]:.2f}; scratch {plan.len / 2**20:.1f} MiB)")
        else:
            row_phases = dict(plan_ms=ph[0], blocks_ms=ph[1], execute_ms=ph[2])
            share = f" (plan {ph[0]:.2f}, blocks {ph[1]:.2f}, execute {ph[2]:.2f} ms; scratch {plan.len / 2**20:.1f} MiB)"
    name = decoder if decoder != "blocks" or (plan and not plan.jump) else "blocks, jumps"
    name = f"{name}{f', split {plan.split}' if plan else ''}{f', execute {exec_threads(n)}' if plan and not plan.jump else ''}{', ' + label if label else ''}"
    print(f"ours ({name}), {n} frames of 1 MiB: median {med:.2f} ms, p90 {np.percentile(times, 90):.2f} ms, {gib:.2f} GiB/s{share}")
    rows.append(dict(decoder=f"ours ({name})", frames=n, median_ms=med, p90_ms=float(np.percentile(times, 90)), gib_s=gib,
                     **{k: float(v) for k, v in row_phases.items()}))
    del args, d_out, keep, plan
# Where one frame's block decode goes (the kernel's text instrumented here, not in the crate):
# lane 0's clock64 at each phase's end of every block's warp (literals, tables, their packing,
# the chain walk, the spans' decode, the rest), beside its literal and sequence counts.
PHASES = ("literals", "tables", "packing", "chain", "spans", "rest")


def instrumented(text):
    mark = lambda i: f"    if (ZS_LANE == 0) p->cyc[{i}] = clock64();\n"
    edits = [
        ("    zs_u32 rin[3];         // the repeat offsets it starts with\n",
         "    zs_u32 rin[3];         // the repeat offsets it starts with\n    zs_u64 cyc[8];\n"),
        ("    ZsBlockPlan* p = &blocks[k];\n    const zs_u32 kind = p->kind;\n",
         "    ZsBlockPlan* p = &blocks[k];\n    const zs_u32 kind = p->kind;\n    const zs_u64 c_all = clock64();\n"
         "    if (ZS_LANE == 0) for (int i = 1; i < 7; ++i) p->cyc[i] = 0;\n"),
        ("        p->rep[0] = p->rep[1] = p->rep[2] = 0;\n    }\n    if (ZS_LANE == 0) p->status = status;\n}",
         "        p->rep[0] = p->rep[1] = p->rep[2] = 0;\n    }\n"
         "    if (ZS_LANE == 0) { p->status = status; p->cyc[0] = c_all; p->cyc[7] = clock64(); }\n}"),
        # (The literals' end: in zs_block_literals, or in older sources'
        # zs_block_sequences.)
        ("    if (status != ZS_OK) return status;\n    if (ZS_LANE == 0) {\n        p->lit_in_at"
         if "lit_taken" in text else "    if (status != ZS_OK) return status;\n    if (ZS_LANE == 0) p->lit_in_at",
         "    if (status != ZS_OK) return status;\n" + mark(1) + ("    if (ZS_LANE == 0) {\n        p->lit_in_at"
         if "lit_taken" in text else "    if (ZS_LANE == 0) p->lit_in_at")),
        ("    if (!built) return ZS_BAD_SEQUENCES;\n", "    if (!built) return ZS_BAD_SEQUENCES;\n" + mark(2)),
        ("    // The spans (in the offset", mark(3) + "    // The spans (in the offset"),
        ("    const zs_u32 reach = sp->reach;\n", "    const zs_u32 reach = sp->reach;\n" + mark(4)),
        ("    }\n    ZS_SYNC();\n    if (ZS_LANE == 0) zs_spans_link(sp, reach);\n",
         "    }\n    ZS_SYNC();\n" + mark(5) + "    if (ZS_LANE == 0) p->cyc[6] = lits_n | ((zs_u64)n_seq << 32);\n"
         "    if (ZS_LANE == 0) zs_spans_link(sp, reach);\n"),
    ]
    # The Huffman tree's build inside the literals (lane 0), into a device array by block.
    edits.append(("        if (ZS_LANE == 0) sh->value = zs_huffman_tree(sh, section, csize);\n",
                  "        const zs_u64 c_tree = clock64();\n"
                  "        if (ZS_LANE == 0) sh->value = zs_huffman_tree(sh, section, csize);\n"
                  "        if (ZS_LANE == 0 && blockIdx.x < 65536) zs_tree_cycles[blockIdx.x] = clock64() - c_tree;\n"))
    for a, b in edits:
        assert text.count(a) == 1, a
        text = text.replace(a, b)
    return "extern \"C\" { __device__ unsigned long long zs_tree_cycles[65536]; }\n" + text


def cycles_of(text, name):
    global k_plan, k_blocks, k_exec, k_link, k_entries, k_jump, k_write, BLOCK_PLAN
    saved = (k_plan, k_blocks, k_exec, k_link, k_entries, k_jump, k_write, BLOCK_PLAN)
    m = cp.RawModule(code=text, backend="nvrtc", options=NVRTC_OPTIONS)
    k_plan, k_blocks, k_exec, k_link, k_entries, k_jump, k_write = (m.get_function(f) for f in (
        "zstd_plan", "zstd_decode_blocks", "zstd_execute", "zstd_link", "zstd_entries", "zstd_jump", "zstd_write"))
    plain = BLOCK_PLAN
    BLOCK_PLAN = plain + 64
    for n in [int(v) for v in opt("--cycles-frames", "1,16").split(",")]:
        args, d_out, out_off, st, dec, keep = arrays(None, [1 << 20] * n, repeat_inputs=frames)
        plan = Blocks([frames[k % len(frames)] for k in range(n)], [1 << 20] * n, args)
        times, per = [], []
        for rep in range(5):
            ev = [cp.cuda.Event() for _ in range(6)]
            plan.run(ev, blocks_only=True)
            ev[5].synchronize()
            times.append(cp.cuda.get_elapsed_time(ev[1], ev[2]))
            raw_plans = plan.scratch.get().tobytes()
            blocks_at = align(n * FRAME_PLAN)
            rows_ = []
            for b in range(plan.nblocks):
                c = struct.unpack_from("<8Q", raw_plans, blocks_at + b * BLOCK_PLAN + plain)
                if not all(c[1:6]):
                    continue  # a raw or RLE block, or no sequences
                marks = [c[0], *c[1:6], c[7]]
                rows_.append(([marks[i + 1] - marks[i] for i in range(6)], c[6] & 0xFFFFFFFF, c[6] >> 32))
            per.append(rows_)
        ms = float(np.median(times[1:]))
        rows_ = per[-1]
        cyc = np.array([r[0] for r in rows_], np.float64)
        whole = cyc.sum(axis=1)
        worst = int(np.argmax(whole))
        print(f"{name}, {n} frames, split {plan.split}: blocks launch {ms:.3f} ms, {len(rows_)} compressed blocks; "
              f"slowest block {whole[worst]:.0f} cycles ({whole[worst] / ms / 1e6:.2f} GHz if it sets the time)")
        print("   cycles, median block (slowest block): " + ", ".join(
            f"{ph} {np.median(cyc[:, i]):.0f} ({cyc[worst, i]:.0f})" for i, ph in enumerate(PHASES)))
        tree = cp.ndarray((65536,), cp.uint64, m.get_global("zs_tree_cycles"))[:plan.nblocks].get()
        print(f"   the Huffman tree's build (lane 0, blocks with a tree of their own): median {np.median(tree[tree > 0]) if (tree > 0).any() else 0:.0f} cycles, "
              f"max {tree.max()}")
        lits = np.array([r[1] for r in rows_]); seqs = np.array([r[2] for r in rows_])
        print(f"   a block's literals {np.median(lits):.0f} (max {lits.max()}), sequences {np.median(seqs):.0f} "
              f"(max {seqs.max()}); literals {np.median(cyc[:, 0] / np.maximum(lits, 1)):.1f} cycles a literal a stream-lane "
              f"x4, chain {np.median(cyc[:, 3] / np.maximum(seqs, 1)):.0f} a sequence, spans "
              f"{np.median(cyc[:, 4] / np.maximum(seqs, 1)):.0f} a sequence")
        del args, d_out, keep, plan
    (k_plan, k_blocks, k_exec, k_link, k_entries, k_jump, k_write, BLOCK_PLAN) = saved


if rows_path:
    with open(rows_path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
if "--cycles" not in sys.argv:
    sys.exit(0)
cycles_of(instrumented(src), "instrumented")
