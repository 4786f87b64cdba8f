// The frame's bytes, after blocks.cu's launches (the last of our zstd sources): either each
// frame's sequences executed by a thread block, a round of sequences at a time (zstd_execute),
// or, for batches of 64 MiB or less, every output byte given an entry, a value or a pointer to an
// earlier byte, and the pointers resolved by passes over all entries at once (zstd_link,
// zstd_entries, zstd_jump, zstd_write).

// ---- 3. The frame's bytes -----------------------------------------------------------------

// A round of up to 32 sequences, one to a lane.
struct ZsRound {
    zs_u64 op[32];   // where each sequence's bytes start in the output
    zs_u64 lp[32];   // where its literals start
    zs_u32 ll[32], ml[32];
    zs_u32 flag[32];
};

#ifndef ZS_HOST_SHIM
// The sum of x over this lane and the lanes below it in its warp.
ZS_FN zs_u64 zs_warp_inclusive_sum(zs_u64 x) {
    const zs_u32 lane = ZS_LANE;
    for (zs_u32 d = 1; d < 32; d <<= 1) {
        const zs_u64 t = __shfl_up_sync(0xFFFFFFFFu, x, d);
        if (lane >= d) x += t;
    }
    return x;
}
#endif

// Exclusive prefix sums of a[0, m) into s (m at most 32), plus `base`.
ZS_FN void zs_prefix(const zs_u32* a, zs_u64* s, zs_u32 m, zs_u64 base) {
#ifdef ZS_HOST_SHIM
    zs_u64 sum = base;
    for (zs_u32 i = 0; i < m; ++i) {
        s[i] = sum;
        sum += a[i];
    }
#else
    const zs_u32 lane = ZS_LANE;
    const zs_u64 v = lane < m ? a[lane] : 0;
    const zs_u64 x = zs_warp_inclusive_sum(v);
    if (lane < m) s[lane] = base + x - v;
    __syncwarp();
#endif
}

// Bytes p[0, n) (n at most 16) into w, little-endian (w[0] holds p[0] to p[3]); the rest of w
// unspecified. By the one or two aligned 16-byte loads that hold them, where a load a byte made a
// warp's 32 lanes' scattered sources 32 of the L1's wavefronts a byte: the aligned 16 bytes
// holding a byte of an allocation lie within its mapped granule (its base is aligned); the bytes
// beside the wanted ones are read and not used (compute-sanitizer's memcheck may report those
// past an allocation's requested end). On the CPU the same words, each byte outside p[0, n) 0xA5
// (a use of one would show), and the same shifts.
ZS_FN void zs_load16(const zs_u8* p, zs_u32 n, zs_u32* w) {
    if (n == 0) return;
    const zs_u64 a = (zs_u64)p;
    const zs_u32 sh = (zs_u32)(a & 15);
    zs_u32 u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#ifdef ZS_HOST_SHIM
    for (zs_u32 b = 0; b < (sh + n > 16 ? 32u : 16u); ++b)
        u[b >> 2] |= (zs_u32)(b >= sh && b < sh + n ? p[b - sh] : 0xA5u) << (8 * (b & 3));
#else
    const uint4* q = (const uint4*)(a & ~15ull);
    const uint4 x = q[0];
    u[0] = x.x, u[1] = x.y, u[2] = x.z, u[3] = x.w;
    if (sh + n > 16) {
        const uint4 y = q[1];
        u[4] = y.x, u[5] = y.y, u[6] = y.z, u[7] = y.w;
    }
#endif
    const zs_u32 ws = sh >> 2, bs = (sh & 3) * 8;
    zs_u32 t[5];
ZS_UNROLL
    for (zs_u32 j = 0; j < 5; ++j) t[j] = ws == 0 ? u[j] : ws == 1 ? u[j + 1] : ws == 2 ? u[j + 2] : u[j + 3];
ZS_UNROLL
    for (zs_u32 j = 0; j < 4; ++j) {
#ifdef ZS_HOST_SHIM
        w[j] = (zs_u32)((((zs_u64)t[j + 1] << 32) | t[j]) >> bs);
#else
        w[j] = __funnelshift_r(t[j], t[j + 1], bs);
#endif
    }
}

// Byte i of words w (little-endian).
ZS_FN zs_u8 zs_byte(const zs_u32* w, zs_u32 i) { return (zs_u8)(w[i >> 2] >> (8 * (i & 3))); }

// n bytes (at most 16) from src to dst, every one read before any is written.
ZS_FN void zs_copy16(zs_u8* dst, const zs_u8* src, zs_u32 n) {
    zs_u32 w[4] = {0, 0, 0, 0};
    zs_load16(src, n, w);
ZS_UNROLL
    for (zs_u32 i = 0; i < 16; ++i)
        if (i < n) dst[i] = zs_byte(w, i);
}

// One lane's whole sequence: ll literals from lit, then ml bytes from `off` before. Match byte i
// is byte i % off of the `off` bytes before the match (a match longer than its offset repeats
// them), so its first 16 bytes are read from bytes written before this sequence or from its
// literals, never from its own match: one wait on the memory for their loads, where reading
// each byte from the one `off` before made each load wait for the store before it.
ZS_FN void zs_lane_sequence(zs_u8* dst, const zs_u8* lit, zs_u32 ll, zs_u32 ml, zs_u64 off) {
    if (ll <= 16 && ml <= 16) {
        // Every byte read before any is written.
        zs_u32 lw[4] = {0, 0, 0, 0}, mw[4] = {0, 0, 0, 0};
        zs_load16(lit, ll, lw);
        const zs_u8* before = dst + ll - off;  // the bytes the match repeats
        if (off >= (zs_u64)ll + ml) {
            // The match lies wholly before this sequence (most of them).
            zs_load16(before, ml, mw);
        } else {
            // Byte i % off of those before the match: in this sequence's literals (read from
            // lit instead) or before the sequence.
            zs_u64 r = 0;  // i % off
ZS_UNROLL
            for (zs_u32 i = 0; i < 16; ++i) {
                if (i < ml) mw[i >> 2] |= (zs_u32)(ll + r >= off ? lit[ll + r - off] : before[r]) << (8 * (i & 3));
                r = r + 1 == off ? 0 : r + 1;
            }
        }
ZS_UNROLL
        for (zs_u32 i = 0; i < 16; ++i)
            if (i < ll) dst[i] = zs_byte(lw, i);
ZS_UNROLL
        for (zs_u32 i = 0; i < 16; ++i)
            if (i < ml) dst[ll + i] = zs_byte(mw, i);
        return;
    }
    // 16 bytes at a time, each batch read whole before it is written.
    for (zs_u32 i = 0; i < ll; i += 16) zs_copy16(dst + i, lit + i, ll - i < 16 ? ll - i : 16);
    zs_u8* m = dst + ll;
    const zs_u8* s = m - off;
    zs_u64 step = off;  // a period of the match's bytes: each batch reads only bytes before its own
    zs_u32 i = 0;
    if (off < 16) {
        // The first 16 bytes as byte i % off of those before the match (written: literals
        // included); then the bytes repeat with a period of the multiple of off from 16 to 30.
        zs_u8 v[16] = {0};
        zs_u64 r = 0;
ZS_UNROLL
        for (zs_u32 j = 0; j < 16; ++j) {
            if (j < ml) v[j] = s[r];
            r = r + 1 == off ? 0 : r + 1;
        }
ZS_UNROLL
        for (zs_u32 j = 0; j < 16; ++j)
            if (j < ml) m[j] = v[j];
        while (step < 16) step += off;
        i = 16;
    }
    for (; i < ml; i += 16) zs_copy16(m + i, m + i - step, ml - i < 16 ? ml - i : 16);
}

// ---- 3a. A frame's sequences executed by a thread block ------------------------------------
// A thread block a frame (32, 64 or 128 threads, ZS_EXEC_THREADS at most: decode.rs picks by the
// launch's frames), a round of as many sequences at a time, one to a thread. A sequence whose
// match reads bytes that sequences of its round write waits for them: the round runs in phases,
// each executing every sequence whose sources are written (the lowest sequence not done always
// is, so a round ends within as many phases as sequences). On
// Z2's frames a round of 128 took 1,100 to 2,400 phases a frame where a warp's rounds of 32 took
// 3,900 to 8,100 steps (benches/zstd_rounds.sh). A sequence longer than 64 bytes waits until it
// is the lowest not done, then the whole block copies it. The sequences done are a bit each in
// shared memory, a word a warp, kept twice: a phase reads one copy and its warps' votes write
// the other, so a phase takes one barrier, and a thread tests its range of sources, and finds
// the lowest not done, in registers.

#define ZS_EXEC_THREADS 128u
#define ZS_EXEC_WARPS (ZS_EXEC_THREADS / 32u)
// (On the CPU a round takes blockDim.x sequences too: the host entry sets it.)
#define ZS_EXEC_LONG 64u  // a sequence longer than this is copied by the whole block

// (On the CPU a phase's threads run last first: a sequence let run before the bytes it reads
// are written would read them unwritten there too, and the tests see other bytes.)
#ifdef ZS_HOST_SHIM
#define ZS_FOR_THREADS(t, n) for (unsigned long long t = 0; t < (n); ++t)
#define ZS_FOR_THREADS_LAST_FIRST(t, n) for (unsigned long long t = (n); t-- > 0;)
#else
#define ZS_FOR_THREADS(t, n) for (unsigned long long t = threadIdx.x; t < (n); t += blockDim.x)
#define ZS_FOR_THREADS_LAST_FIRST(t, n) ZS_FOR_THREADS(t, n)
#endif

struct ZsExecRound {
    zs_u64 op[ZS_EXEC_THREADS];   // where each sequence's bytes start in the frame's output
    zs_u64 src[ZS_EXEC_THREADS];  // where its match reads from (first its offset)
    zs_u64 lp[ZS_EXEC_THREADS];   // where its literals start in the block's
    zs_u32 ll[ZS_EXEC_THREADS], ml[ZS_EXEC_THREADS];
    zs_u32 lo[ZS_EXEC_THREADS], hi[ZS_EXEC_THREADS];  // the round's sequences it reads from: [lo, hi)
    zs_u32 done[2][ZS_EXEC_WARPS];  // the sequences done, a bit each (those past the round's set)
    zs_u64 warp_sum[ZS_EXEC_WARPS];
    zs_u32 bad;
};

// The round's places by the block, in one scan (m at most its threads): each sequence's
// literals' start lp[i] (lp_base plus the literal lengths before it) and its bytes' start op[i]
// (op_base plus the lengths ll + ml before it, which len holds). Both sums of a round fit 32 bits
// (128 sequences of at most 2^18 bytes), so one 64-bit scan carries the two.
ZS_FN void zs_round_places(ZsExecRound* r, const zs_u32* len, zs_u32 m, zs_u64 lp_base, zs_u64 op_base) {
#ifdef ZS_HOST_SHIM
    zs_u64 e = 0;  // the same packed sums, one sequence after another
    for (zs_u32 i = 0; i < m; ++i) {
        r->lp[i] = lp_base + (zs_u32)e;
        r->op[i] = op_base + (e >> 32);
        e += ((zs_u64)len[i] << 32) | r->ll[i];
    }
#else
    const zs_u32 t = threadIdx.x, lane = t & 31u, w = t >> 5;
    const zs_u64 v = t < m ? ((zs_u64)len[t] << 32) | r->ll[t] : 0;
    const zs_u64 x = zs_warp_inclusive_sum(v);
    if (lane == 31 && w < ZS_EXEC_WARPS) r->warp_sum[w] = x;
    __syncthreads();
    zs_u64 before = 0;
    for (zs_u32 j = 0; j < w; ++j) before += r->warp_sum[j];
    const zs_u64 e = before + x - v;
    if (t < m) {
        r->lp[t] = lp_base + (zs_u32)e;
        r->op[t] = op_base + (e >> 32);
    }
    __syncthreads();
#endif
}

// The lowest sequence not done in `words` words of done bits (32 * words where all are).
ZS_FN zs_u32 zs_exec_open(const zs_u32* done, zs_u32 words) {
    for (zs_u32 k = 0; k < words; ++k) {
        const zs_u32 open = ~done[k];
#ifdef ZS_HOST_SHIM
        if (open != 0) return 32u * k + (zs_u32)__builtin_ctz(open);
#else
        if (open != 0) return 32u * k + (zs_u32)__ffs(open) - 1u;
#endif
    }
    return 32u * words;
}

// Whether sequences [lo, hi) (lo < hi) are all done.
ZS_FN zs_u32 zs_exec_all_done(const zs_u32* done, zs_u32 lo, zs_u32 hi) {
    const zs_u32 last = hi - 1;
    for (zs_u32 k = lo >> 5; k <= last >> 5; ++k) {
        const zs_u32 from = k == lo >> 5 ? lo & 31u : 0u, to = k == last >> 5 ? last & 31u : 31u;
        const zs_u32 want = (0xFFFFFFFFu >> (31u - to)) & (0xFFFFFFFFu << from);
        if ((done[k] & want) != want) return 0;
    }
    return 1;
}

// The done bits after a phase: those before it (`done`) and each sequence run in it (`ran`, the
// thread's own), into `next`. On the CPU the phase set them already.
ZS_FN void zs_exec_mark(const zs_u32* done, zs_u32* next, zs_u32 words, zs_u32 ran) {
#ifdef ZS_HOST_SHIM
    (void)done, (void)next, (void)words, (void)ran;
#else
    const zs_u32 w = threadIdx.x >> 5;
    const unsigned votes = __ballot_sync(0xFFFFFFFFu, ran);
    if ((threadIdx.x & 31u) == 0 && w < words) next[w] = done[w] | votes;
#endif
}

// The last of s[0, n) at most `at` (s ascending, s[0] at most `at`, n at least 1).
ZS_FN zs_u32 zs_last_at_most(const zs_u64* s, zs_u32 n, zs_u64 at) {
    zs_u32 lo = 0, hi = n;  // s[lo] <= at, and s[j] > at for every j >= hi
    while (hi - lo > 1) {
        const zs_u32 mid = lo + (hi - lo) / 2;
        if (s[mid] <= at) lo = mid;
        else hi = mid;
    }
    return lo;
}

// ml bytes at dst repeating the `off` bytes before it (off < ml), by the block.
ZS_FN void zs_block_match(zs_u8* dst, zs_u64 off, zs_u64 ml) {
    const zs_u8* src = dst - off;
    if (off >= ml) {
        ZS_FOR_THREADS(i, ml) dst[i] = src[i];
    } else {
        // (off < ml: both below 2^32, a record's lengths are.)
        ZS_FOR_THREADS(i, ml) dst[i] = src[(zs_u32)i % (zs_u32)off];
    }
    ZS_BLOCK_SYNC();
}

// A compressed block's sequences (records rec[0, count)) and its literals executed at out + *op
// of a frame output of `capacity`, `round` sequences at a time (the block's threads); rin: its
// incoming repeat offsets. Every thread returns the same status.
ZS_FN zs_u32 zs_execute_block(ZsExecRound* r, zs_u32 round, const zs_u32* rec, zs_u64 count, const zs_u8* lits,
                              zs_u64 lit_count, zs_u8* out, zs_u64 capacity, zs_u64* op_io, const zs_u64* rin) {
    zs_u64 op = *op_io, lp = 0;
    for (zs_u64 base = 0; base < count; base += round) {
        const zs_u32 m = (zs_u32)(count - base < round ? count - base : round);
        ZS_FOR_THREADS(i, m) {
            const zs_u32* q = rec + ZS_RECORD * (base + i);
            const zs_u32 value = q[0], tag = q[1] >> 30;
            r->ll[i] = q[1] & 0x3FFFFFFFu;
            r->ml[i] = q[2];
            r->src[i] = tag == 0 ? value : (rin[tag - 1] > value ? rin[tag - 1] - value : 0);
            r->hi[i] = r->ll[i] + r->ml[i];  // (the sequence's length, for the sums)
        }
        // (Each thread scans the sequence it loaded; the scan's barriers order the rest.)
        if (threadIdx.x == 0) r->bad = 0;
        zs_round_places(r, r->hi, m, lp, op);
        const zs_u64 end_op = r->op[m - 1] + r->ll[m - 1] + r->ml[m - 1];
        const zs_u64 end_lp = r->lp[m - 1] + r->ll[m - 1];
        // Offsets within the bytes before each match; literals and bytes within the block's.
        const zs_u32 short_of = end_lp > lit_count ? ZS_BAD_SEQUENCE : end_op > capacity ? ZS_PAST_CAPACITY : ZS_OK;
        ZS_FOR_THREADS(i, m) {
            const zs_u64 own = r->op[i] + r->ll[i], off = r->src[i];
            if (off == 0 || off > own) r->bad = 1;
            r->src[i] = own - off;
            // The round's sequences whose bytes the match reads before its own: [lo, hi).
            const zs_u64 from = r->src[i] > r->op[0] ? r->src[i] : r->op[0];
            const zs_u64 end = r->src[i] + r->ml[i] < r->op[i] ? r->src[i] + r->ml[i] : r->op[i];
            r->lo[i] = r->hi[i] = 0;
            if (off != 0 && off <= own && end > from) {
                r->lo[i] = zs_last_at_most(r->op, (zs_u32)i, from);
                r->hi[i] = zs_last_at_most(r->op, (zs_u32)i, end - 1) + 1;
            }
        }
        // None done; the bits past the round's sequences set.
        const zs_u32 words = (m + 31u) / 32u;
        ZS_FOR_THREADS(k, words) {
            const zs_u32 in_round = m - 32u * (zs_u32)k;
            r->done[0][k] = r->done[1][k] = in_round >= 32u ? 0u : 0xFFFFFFFFu << in_round;
        }
        ZS_BLOCK_SYNC();
        if (r->bad) return ZS_BAD_SEQUENCE;
        if (short_of != ZS_OK) return short_of;
        // Phases until every sequence of the round is done: at least the lowest not done each.
        for (zs_u32 c = 0;; c ^= 1u) {
            const zs_u32* done = r->done[c];
            zs_u32* next = r->done[c ^ 1u];
            const zs_u32 open = zs_exec_open(done, words);
            if (open >= m) break;
            const zs_u32 long_now = r->ll[open] + r->ml[open] > ZS_EXEC_LONG;
#ifdef ZS_HOST_SHIM
            for (zs_u32 k = 0; k < words; ++k) next[k] = done[k];
#endif
            zs_u32 ran = 0;
            ZS_FOR_THREADS_LAST_FIRST(i, m) {
                const zs_u32 bit = 1u << (i & 31u);
                zs_u32 ok = !(done[i >> 5] & bit) && (i == open || r->ll[i] + r->ml[i] <= ZS_EXEC_LONG);
                if (ok && r->hi[i] > open) ok = zs_exec_all_done(done, r->lo[i], r->hi[i]);
                if (ok && !(long_now && i == open)) {
                    const zs_u64 at = r->op[i];
                    zs_lane_sequence(out + at, lits + r->lp[i], r->ll[i], r->ml[i], at + r->ll[i] - r->src[i]);
                }
#ifdef ZS_HOST_SHIM
                if (ok) next[i >> 5] |= bit;
#endif
                ran = ok;
            }
            if (long_now) {
                // (It reads only bytes of the sequences before it, all done; the others of the
                // phase write after it and read none of its bytes.)
                const zs_u64 at = r->op[open], ll = r->ll[open];
                const zs_u8* lit = lits + r->lp[open];
                ZS_FOR_THREADS(i, ll) out[at + i] = lit[i];
                ZS_BLOCK_SYNC();
                zs_block_match(out + at + ll, at + ll - r->src[open], r->ml[open]);
            }
            zs_exec_mark(done, next, words, ran);
            ZS_BLOCK_SYNC();
        }
        op = end_op;
        lp = end_lp;
        ZS_BLOCK_SYNC();
    }
    const zs_u64 rest = lit_count - lp;
    if (rest > capacity - op) return ZS_PAST_CAPACITY;
    ZS_FOR_THREADS(i, rest) out[op + i] = lits[lp + i];
    ZS_BLOCK_SYNC();
    *op_io = op + rest;
    return ZS_OK;
}

// Thread block k (32, 64 or 128 threads): frame k's blocks in order into its output.
extern "C" __global__ void zstd_execute(const unsigned char* const* inputs, const unsigned long long* capacities,
                                        unsigned char* const* outputs, unsigned long long* decoded,
                                        unsigned int* statuses, const ZsFramePlan* frames, const ZsBlockPlan* blocks,
                                        const unsigned char* lit_scratch, const unsigned int* seq_scratch,
                                        unsigned long long n) {
    ZS_SHARED ZsExecRound round;
    const unsigned long long k = blockIdx.x;
    if (k >= n) return;
    if (blockDim.x == 0 || blockDim.x > ZS_EXEC_THREADS || blockDim.x % 32u != 0) {
        // A launch of another shape (not one decode.rs makes): an error for every frame, never
        // a write past the round's arrays.
        if (threadIdx.x == 0) {
            statuses[k] = ZS_BAD_FRAME;
            decoded[k] = 0;
        }
        return;
    }
    const ZsFramePlan* f = &frames[k];
    const zs_u8* in = inputs[k];
    zs_u8* out = outputs[k];
    const zs_u64 capacity = capacities[k];
    zs_u64 op = 0;
    zs_u64 rep[3] = {1, 4, 8};
    zs_u32 status = ZS_OK;
    const zs_u32 walked = f->blocks;
    for (zs_u32 b = 0; b < walked; ++b) {
        const ZsBlockPlan* p = &blocks[f->block_first + b];
        status = p->status;
        if (status != ZS_OK) break;
        const zs_u64 size = p->out_size;
        if (size > capacity - op) {
            status = ZS_PAST_CAPACITY;
            break;
        }
        if (p->kind == 0) {
            const zs_u8* src = in + p->in_at;
            ZS_FOR_THREADS(i, size) out[op + i] = src[i];
            ZS_BLOCK_SYNC();
            op += size;
        } else if (p->kind == 1) {
            const zs_u8 v = in[p->in_at];
            ZS_FOR_THREADS(i, size) out[op + i] = v;
            ZS_BLOCK_SYNC();
            op += size;
        } else {
            const zs_u8* lits = p->lit_in_at == ZS_NONE ? lit_scratch + p->lits_at : in + p->lit_in_at;
            status = zs_execute_block(&round, blockDim.x, seq_scratch + ZS_RECORD * p->seqs_at, p->seq_slots, lits,
                                      p->lit_slots, out, capacity, &op, rep);
            if (status != ZS_OK) break;
            status = zs_next_reps(p, rep);
            if (status != ZS_OK) break;
        }
    }
    if (status == ZS_OK) status = f->status;
    if (status == ZS_OK && op != capacity) status = ZS_SIZE_MISMATCH;
    if (threadIdx.x == 0) {
        statuses[k] = status;
        decoded[k] = op;
    }
}
// ---- 3'. The frame's bytes resolved by jumps (small batches) -------------------------------
// Every output byte gets an entry: its value (ZS_RESOLVED set) or the index of an earlier byte it
// copies (a match's source; within a match that overlaps itself, the byte of the period before
// the match). A pass follows each pointer up to ZS_HOPS links (reading its targets as they are,
// moved on by this pass or not) and keeps where it got: after pass k every pointer left spans at
// least (ZS_HOPS + 1)^k links of its chain, and chains of up to (ZS_HOPS + 1)^k - 1 links are
// resolved (decode.rs `jump_passes`).

#define ZS_RESOLVED 0x80000000u
#define ZS_HOPS 32u

// Lane 0 of frame k: its blocks' places and inherited repeat offsets, and its status where the
// plan or a block already knows it (decoded: the bytes before the first bad block).
extern "C" __global__ void zstd_link(const unsigned long long* capacities, unsigned long long* decoded,
                                     unsigned int* statuses, const ZsFramePlan* frames, ZsBlockPlan* blocks,
                                     unsigned int* pass_flags, unsigned int passes, unsigned long long n) {
    const unsigned long long k = blockIdx.x;
    if (k >= n || ZS_LANE != 0) return;
    if (k == 0)
        for (zs_u32 t = 0; t < passes; ++t) pass_flags[t] = 0;
    const ZsFramePlan* f = &frames[k];
    const zs_u64 capacity = capacities[k];
    zs_u64 op = 0, rep[3] = {1, 4, 8};
    zs_u32 status = ZS_OK;
    for (zs_u32 b = 0; b < f->blocks; ++b) {
        ZsBlockPlan* p = &blocks[f->block_first + b];
        status = p->status;
        if (status != ZS_OK) break;
        if (p->out_size > capacity - op) {
            status = ZS_PAST_CAPACITY;
            break;
        }
        p->out_at = (zs_u32)op;
        for (zs_u32 j = 0; j < 3; ++j) p->rin[j] = (zs_u32)rep[j];
        op += p->out_size;
        status = zs_next_reps(p, rep);
        if (status != ZS_OK) break;
    }
    if (status == ZS_OK) status = f->status;
    if (status == ZS_OK && op != capacity) status = ZS_SIZE_MISMATCH;
    statuses[k] = status;
    decoded[k] = op;
}

// A warp's sum of each lane's v (on the CPU one lane holds the whole sum already).
ZS_FN zs_u64 zs_warp_sum(zs_u64 v) {
#ifndef ZS_HOST_SHIM
    for (zs_u32 d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
#endif
    return v;
}

// gridDim.y warps per block (blockIdx.y: its part): the entries of the block's bytes (frames
// already in error are left). A part takes the block's sequences [count * y / parts, count * (y
// + 1) / parts): where its literals and bytes start is the sum of the lengths before, read by its
// lanes side by side; the last part writes the literals after the last sequence. One warp a
// block left each block's 12,800 sequences (a Z2 block) to 400 rounds of waits on the records
// and their scattered writes.
extern "C" __global__ void zstd_entries(const unsigned char* const* inputs, unsigned long long* decoded,
                                        unsigned int* statuses, const ZsFramePlan* frames, const ZsBlockPlan* blocks,
                                        const unsigned char* lit_scratch, const unsigned int* seq_scratch,
                                        unsigned int* entries, unsigned long long n_blocks) {
    ZS_SHARED zs_u32 bad;
    ZS_SHARED ZsRound round;
    const unsigned long long k = blockIdx.x;
    if (k >= n_blocks) return;
    const ZsBlockPlan* p = &blocks[k];
    if (p->kind == ZS_NONE) return;
    // Lane 0's read of the frame's status decides for the whole warp: another thread block of
    // the frame may fail it meanwhile, and lanes that decided apart would meet the shuffles and
    // barriers below with lanes gone.
#ifdef ZS_HOST_SHIM
    if (statuses[p->frame] != ZS_OK) return;
#else
    if (__shfl_sync(0xFFFFFFFFu, statuses[p->frame] != ZS_OK ? 1u : 0u, 0) != 0) return;
#endif
    const ZsFramePlan* f = &frames[p->frame];
    const zs_u8* in = inputs[p->frame];
    zs_u32* e = entries + f->entries_at + p->out_at;
    const zs_u64 parts = gridDim.y, part = blockIdx.y;
    if (p->kind <= 1) {
        // A raw or RLE block's bytes, a part's share of them.
        const zs_u64 a = p->out_size * part / parts, b = p->out_size * (part + 1) / parts;
        ZS_FOR_LANES(i, b - a) e[a + i] = ZS_RESOLVED | in[p->in_at + (p->kind == 0 ? a + i : 0)];
        return;
    }
    const zs_u8* lits = p->lit_in_at == ZS_NONE ? lit_scratch + p->lits_at : in + p->lit_in_at;
    const zs_u32* rec = seq_scratch + ZS_RECORD * p->seqs_at;
    const zs_u64 count = p->seq_slots;
    const zs_u64 first = count * part / parts, end = count * (part + 1) / parts;
    if (ZS_LANE == 0) bad = 0;
    ZS_SYNC();
    zs_u32 flaw = 0;
    // The literals and bytes of the sequences before this part's (each length under 2^18).
    zs_u64 lp = 0, pos = 0;
    ZS_FOR_LANES(i, first) {
        const zs_u32* r = rec + ZS_RECORD * i;
        const zs_u32 ll = r[1] & 0x3FFFFFFFu;
        lp += ll;
        pos += ll + r[2];
    }
    lp = zs_warp_sum(lp);
    pos = zs_warp_sum(pos);
    // 32 sequences a round, one to a lane: their first literals and bytes from prefix sums.
    for (zs_u64 base = first; base < end; base += 32) {
        const zs_u32 n = (zs_u32)(end - base < 32 ? end - base : 32);
        ZS_FOR_LANES(i, n) {
            const zs_u32* r = rec + ZS_RECORD * (base + i);
            round.ll[i] = r[1] & 0x3FFFFFFFu;
            round.ml[i] = r[2];
            round.flag[i] = round.ll[i] + round.ml[i];
        }
        ZS_SYNC();
        zs_prefix(round.ll, round.lp, n, lp);
        zs_prefix(round.flag, round.op, n, pos);
        ZS_SYNC();
        ZS_FOR_LANES(i, n) {
            const zs_u32* r = rec + ZS_RECORD * (base + i);
            const zs_u32 value = r[0], tag = r[1] >> 30, ll = round.ll[i], ml = round.ml[i];
            const zs_u64 at = round.op[i], lit = round.lp[i];
            const zs_u64 off = tag == 0 ? value : (p->rin[tag - 1] > value ? (zs_u64)p->rin[tag - 1] - value : 0);
            // The offset within the bytes before the match, in the frame.
            const zs_u64 start = (zs_u64)p->out_at + at + ll;
            if (off == 0 || off > start) {
                flaw = 1;
                continue;
            }
            for (zs_u32 j = 0; j < ll; ++j) e[at + j] = ZS_RESOLVED | lits[lit + j];
            const zs_u64 from = f->entries_at + start - off;
            zs_u32* m = e + at + ll;
            if (off >= ml) {
                for (zs_u32 j = 0; j < ml; ++j) m[j] = (zs_u32)(from + j);
            } else {
                zs_u64 r2 = 0;
                for (zs_u32 j = 0; j < ml; ++j) {
                    m[j] = (zs_u32)(from + r2);
                    r2 = r2 + 1 == off ? 0 : r2 + 1;
                }
            }
        }
        lp = round.lp[n - 1] + round.ll[n - 1];
        pos = round.op[n - 1] + round.ll[n - 1] + round.ml[n - 1];
        ZS_SYNC();
    }
    // The literals after the last sequence (the block decode checked that they fit).
    const zs_u64 rest = part + 1 == parts ? p->lit_slots - lp : 0;
    ZS_FOR_LANES(i, rest) e[pos + i] = ZS_RESOLVED | lits[lp + i];
    if (flaw) bad = 1;
    ZS_SYNC();
    if (ZS_LANE == 0 && bad) {
        statuses[p->frame] = ZS_BAD_SEQUENCE;
        decoded[p->frame] = 0;
    }
}

// Pass t over entries[0, total) in tiles of 256, a thread block taking every gridDim.x-th tile
// (the grid is capped: a pass after one that left nothing to resolve costs a launch, not a
// thread block a tile). Only an entry's own lane writes it; its targets, earlier entries, may move
// on while it reads them, from one valid pointer of the chain to a later one or to the value:
// those reads and the writes are volatile (relaxed), each a whole aligned word.
extern "C" __global__ void zstd_jump(unsigned int* entries, unsigned long long total, unsigned int* pass_flags,
                                     unsigned int t) {
    if (t > 0 && pass_flags[t - 1] == 0) return;
    volatile zs_u32* shared_entries = entries;
    const zs_u64 tiles = (total + 255) / 256;
    zs_u32 more = 0;
    for (zs_u64 step = blockIdx.x; step < tiles; step += gridDim.x) {
#ifdef ZS_HOST_SHIM
        // The last tile and entry first: every target is read before this pass moves it, the
        // order the pass count is made for.
        const zs_u64 tile = tiles - 1 - step;
#else
        const zs_u64 tile = step;
#endif
        const zs_u64 first = tile * 256;
        const zs_u64 count = total - first < 256 ? total - first : 256;
        ZS_FOR_LANES(j, count) {
#ifdef ZS_HOST_SHIM
            const zs_u64 i = first + count - 1 - j;
#else
            const zs_u64 i = first + j;
#endif
            zs_u32 v = entries[i];
            if (v & ZS_RESOLVED) continue;
            // Entries of frames already in error were never written (the scratch is reused): any
            // value may be there, a cycle too, and is never followed outside the entries nor more
            // than ZS_HOPS links. Those frames' bytes are not written out.
            for (zs_u32 h = 0; h < ZS_HOPS && !(v & ZS_RESOLVED); ++h)
                v = v < total ? shared_entries[v] : ZS_RESOLVED;
            shared_entries[i] = v;
            more |= !(v & ZS_RESOLVED);
        }
    }
    if (more) pass_flags[t] = 1;
}

// Frame k's bytes from its entries, 4096 a thread block (blockIdx.y: which 4096); a byte left
// unresolved (never, after enough passes) makes the frame an error, never a wrong byte.
extern "C" __global__ void zstd_write(const unsigned long long* capacities, unsigned char* const* outputs,
                                      unsigned long long* decoded, unsigned int* statuses, const ZsFramePlan* frames,
                                      const unsigned int* entries, unsigned long long n) {
    const unsigned long long k = blockIdx.x;
    if (k >= n || statuses[k] != ZS_OK) return;
    const zs_u64 capacity = capacities[k];
    for (zs_u64 first = (zs_u64)blockIdx.y * 4096; first < capacity; first += (zs_u64)gridDim.y * 4096) {
        const zs_u64 count = capacity - first < 4096 ? capacity - first : 4096;
        const zs_u32* e = entries + frames[k].entries_at + first;
        zs_u8* out = outputs[k] + first;
        zs_u32 lost = 0;
        ZS_FOR_LANES(i, count) {
            const zs_u32 v = e[i];
            lost |= !(v & ZS_RESOLVED);
            out[i] = (zs_u8)v;
        }
        if (lost) {
            statuses[k] = ZS_BAD_SEQUENCE;
            decoded[k] = 0;
        }
    }
}

// The names stay out of the sources compiled after this one.
#undef ZS_FOR_LANES
#undef ZS_OK
#undef ZS_TRUNCATED
#undef ZS_BAD_FRAME
#undef ZS_BAD_BLOCK
#undef ZS_BAD_LITERALS
#undef ZS_BAD_HUFFMAN
#undef ZS_BAD_LITERAL_STREAM
#undef ZS_BAD_SEQUENCES
#undef ZS_BAD_SEQUENCE_STREAM
#undef ZS_BAD_SEQUENCE
#undef ZS_PAST_CAPACITY
#undef ZS_SIZE_MISMATCH
#undef ZS_MAX_BLOCK
#undef ZS_HUF_MAX_LOG
#undef ZS_HUF_SYMBOL
#undef ZS_HUF_BITS
#undef ZS_NONE
#undef ZS_RECORD
#undef ZS_RESOLVED
#undef ZS_HOPS
#undef ZS_UNROLL
#undef ZS_REP
#undef ZS_SPANS
#undef ZS_SPAN_MIN
#undef ZS_SEQUENCE_BITS
#undef ZS_SPREAD_SYMBOLS
#undef ZS_SPREAD_AT
#undef ZS_NORM_AT
#ifndef ZS_HOST_SHIM
#undef ZS_LANES
#undef ZS_LANE
#undef ZS_SYNC
#undef ZS_FN
#undef ZS_SHARED
#undef ZS_CONST
#endif
