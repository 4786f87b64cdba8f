// How many dependent steps a zstd frame's sequences need when executed R at a time (bytes.cu
// zstd_execute), and whether its blocks could be executed side by side. The sequences come from
// libzstd itself (ZSTD_generateSequences, level 3, the blocks' ends marked), positions in the
// decoded frame; nothing of ours runs here. Built and run by benches/zstd_rounds.sh.
//
// For each round size R: "warp rule" counts the steps of a warp's executor (3143014's and before: a round of
// 32 cut at each sequence that reads its round's bytes or is longer than 64 bytes, that one
// copied by the warp alone); "phases" the steps of the thread block executor now (each phase
// runs every sequence whose sources are written; a long one only as the lowest not done; one
// reading more than 8 of its round's sequences waits for all before it, as 24d44dd's did; or not,
// as the done bits since let any range be tested); "levels" the critical
// path (no executor does better). Then the blocks: matches reading before their block's start,
// sequences that depend on such bytes (transitively), and the steps if each block had a warp of
// its own that waited on the others' progress.
#define ZSTD_STATIC_LINKING_ONLY
#include "zstd.h"
#include <stdio.h>
#include <stdlib.h>

typedef unsigned long long u64;
static u64 *op, *bstart;
static unsigned *ll, *ml, *off, *blk;
static size_t nq;
static int nb;

static int is_long(size_t i) { return ll[i] + ml[i] > 64; }

// The dependent waits on memory of sequence i's copy by one thread (bytes.cu zs_lane_sequence):
// a wait for each batch of loads whose stores the next batch's loads come after. way 0: as
// 24d44dd copies (16 bytes a batch, but a match of an offset under 16 a byte at a time, and a
// match of an offset under its length within the fast path the same); way 1: every match byte
// read from the `off` bytes before the match (i % off), so a batch never waits on its own stores.
static long waits(size_t i, int way) {
    const long l = ll[i], m = ml[i], o = off[i];
    if (l <= 16 && m <= 16 && (o >= m || way == 1)) return 1;
    long w = (l + 15) / 16;
    if (way == 1 || o >= 16) return w + (m + 15) / 16;
    return w + m;
}

// The bytes before sequence i's own output that its match reads: [*from, *end), empty if none
// before `start`.
static int reads(size_t i, u64 start, u64* from, u64* end) {
    const u64 src = op[i] + ll[i] - off[i];
    *end = src + ml[i] < op[i] ? src + ml[i] : op[i];
    *from = src > start ? src : start;
    return *end > *from;
}

static long warp_rule(size_t R) {
    long steps = 0;
    for (size_t base = 0; base < nq; base += R) {
        size_t e = base + R < nq ? base + R : nq, from = base;
        while (from < e) {
            size_t stop = e;
            u64 a, b;
            for (size_t i = from; i < e && stop == e; ++i)
                if (is_long(i) || reads(i, op[from], &a, &b)) stop = i;
            steps += 1 + (stop < e);
            from = stop + 1;
        }
    }
    return steps;
}

static long phase_waits[2];  // the last phases() run's waits: each phase its slowest sequence's

static int wait_rule = 0;  // 24d44dd's executor: a sequence reading more than 8 of its round's waits for all before it

static long phases(size_t R, int levels) {
    long total = 0;
    phase_waits[0] = phase_waits[1] = 0;
    int* done = calloc(R, sizeof(int));
    int* ready = calloc(R, sizeof(int));
    long *lo = calloc(R, sizeof(long)), *hi = calloc(R, sizeof(long)), *lev = calloc(R, sizeof(long));
    for (size_t base = 0; base < nq; base += R) {
        const size_t m = base + R < nq ? R : nq - base;
        for (size_t t = 0; t < m; ++t) {
            u64 a, b;
            done[t] = 0;
            lo[t] = hi[t] = 0;
            if (reads(base + t, op[base], &a, &b))
                for (size_t j = 0; j < t; ++j) {
                    if (op[base + j] <= a) lo[t] = j;
                    if (op[base + j] < b) hi[t] = j + 1;
                }
        }
        if (levels) {
            long most = 0;
            for (size_t t = 0; t < m; ++t) {
                lev[t] = 1;
                for (long j = lo[t]; j < hi[t]; ++j)
                    if (lev[j] + 1 > lev[t]) lev[t] = lev[j] + 1;
                if (lev[t] > most) most = lev[t];
            }
            total += most;
            continue;
        }
        for (;;) {
            size_t open = m;
            for (size_t t = 0; t < m && open == m; ++t)
                if (!done[t]) open = t;
            if (open == m) break;
            total++;
            long worst[2] = {0, 0};
            for (size_t t = 0; t < m; ++t) {
                int ok = !done[t] && (t == open || !is_long(base + t));
                if (ok && hi[t] > (long)open) {
                    if (wait_rule && hi[t] - lo[t] > 8) ok = 0;
                    for (long j = lo[t]; ok && j < hi[t]; ++j) ok = done[j];
                }
                ready[t] = ok;
                for (int w = 0; ok && !is_long(base + t) && w < 2; ++w)
                    if (waits(base + t, w) > worst[w]) worst[w] = waits(base + t, w);
            }
            // A long sequence: the block's copy, a wait for its literals and one a block's width.
            const long lw = is_long(base + open) ? 1 + (ml[base + open] + R - 1) / R : 0;
            for (int w = 0; w < 2; ++w) phase_waits[w] += worst[w] + lw;
            for (size_t t = 0; t < m; ++t) done[t] |= ready[t];
        }
    }
    free(done), free(ready), free(lo), free(hi), free(lev);
    return total;
}

// Each block on a warp of its own, a round of 32 a step, waiting while a match reads bytes of an
// earlier block that its warp has not written yet.
static long blocks_side_by_side(long* serial) {
    size_t* first = calloc(nb + 1, sizeof(size_t));
    size_t* at = calloc(nb, sizeof(size_t));
    u64* written = calloc(nb, sizeof(u64));
    u64* next = calloc(nb, sizeof(u64));
    for (size_t i = 0, b = 0; b <= (size_t)nb; ++b) {
        first[b] = i;
        while (i < nq && blk[i] == b) i++;
    }
    *serial = 0;
    for (int b = 0; b < nb; ++b) *serial += (first[b + 1] - first[b] + 31) / 32, at[b] = first[b];
    long steps = 0;
    for (int busy = 1; busy;) {
        busy = 0;
        for (int b = 0; b < nb; ++b) {
            next[b] = written[b];
            if (at[b] >= first[b + 1]) continue;
            busy = 1;
            const size_t e = at[b] + 32 < first[b + 1] ? at[b] + 32 : first[b + 1];
            int ok = 1;
            for (size_t i = at[b]; i < e && ok; ++i) {
                const u64 src = op[i] + ll[i] - off[i], end = src + ml[i];
                for (int j = 0; j < b && ok; ++j)
                    if (src < bstart[j + 1] && end > bstart[j] && at[j] < first[j + 1] &&
                        written[j] < (end < bstart[j + 1] ? end : bstart[j + 1]) - bstart[j])
                        ok = 0;
            }
            if (ok) {
                at[b] = e;
                next[b] = e >= first[b + 1] ? bstart[b + 1] - bstart[b] : op[e] - bstart[b];
            }
        }
        steps += busy;
        for (int b = 0; b < nb; ++b) written[b] = next[b];
    }
    free(first), free(at), free(written), free(next);
    return steps;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: zstd_rounds CHUNK.raw (a decoded chunk; compressed here at level 3)\n");
        return 2;
    }
    FILE* f = fopen(argv[1], "rb");
    if (!f) return 2;
    static unsigned char raw[64 << 20];
    const size_t n = fread(raw, 1, sizeof raw, f);
    fclose(f);
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(c, ZSTD_c_blockDelimiters, ZSTD_sf_explicitBlockDelimiters);
    const size_t cap = ZSTD_sequenceBound(n);
    ZSTD_Sequence* s = malloc(cap * sizeof *s);
    const size_t got = ZSTD_generateSequences(c, s, cap, raw, n);
    if (ZSTD_isError(got)) {
        fprintf(stderr, "%s\n", ZSTD_getErrorName(got));
        return 1;
    }
    op = malloc(got * sizeof(u64)), bstart = calloc(got + 2, sizeof(u64));
    ll = malloc(got * 4), ml = malloc(got * 4), off = malloc(got * 4), blk = malloc(got * 4);
    u64 pos = 0;
    for (size_t i = 0; i < got; ++i) {
        if (s[i].offset == 0 && s[i].matchLength == 0) {  // a block's end: its last literals
            pos += s[i].litLength;
            bstart[++nb] = pos;
            continue;
        }
        op[nq] = pos, ll[nq] = s[i].litLength, ml[nq] = s[i].matchLength, off[nq] = s[i].offset, blk[nq] = nb;
        pos += ll[nq] + ml[nq];
        nq++;
    }
    printf("%s: %d blocks, %zu sequences\n", argv[1], nb, nq);
    const size_t sizes[] = {32, 64, 128, 256, 512};
    for (int k = 0; k < 5; ++k) {
        wait_rule = 1;
        const long ph8 = phases(sizes[k], 0);
        const long w8[2] = {phase_waits[0], phase_waits[1]};
        wait_rule = 0;
        const long lv = phases(sizes[k], 1), ph = phases(sizes[k], 0);
        printf("  R=%3zu: warp rule %5ld, phases %5ld (ranges over 8 waiting: %5ld), levels %5ld; waits in phases "
               "%6ld (%6ld) as 24d44dd copies, %6ld (%6ld) by i %% off\n",
               sizes[k], warp_rule(sizes[k]), ph, ph8, lv, phase_waits[0], w8[0], phase_waits[1], w8[1]);
    }
    long slow[4] = {0, 0, 0, 0};  // fast path; offset under the match's 16 or fewer; under 16, longer; rest
    for (size_t i = 0; i < nq; ++i) {
        if (is_long(i)) continue;
        if (ll[i] <= 16 && ml[i] <= 16) slow[off[i] >= ml[i] ? 0 : 1]++;
        else slow[off[i] < 16 && off[i] < ml[i] ? 2 : 3]++;
    }
    printf("  sequences of 64 bytes or fewer: fast path %ld, offset under a match of 16 or fewer %ld, "
           "offset under 16 of a longer match %ld, other slow %ld\n", slow[0], slow[1], slow[2], slow[3]);
    unsigned char* late = calloc(pos, 1);  // bytes that depend on a byte before their block
    long cross = 0, waiting = 0;
    for (size_t i = 0; i < nq; ++i) {
        const u64 src = op[i] + ll[i] - off[i], bs = bstart[blk[i]];
        int any = 0;
        cross += src < bs;
        for (unsigned j = 0; j < ml[i]; ++j) any |= late[op[i] + ll[i] + j] = src + j < bs || late[src + j];
        waiting += any;
    }
    long serial;
    const long side = blocks_side_by_side(&serial);
    printf("  blocks: matches reading before their block %.1f%%, sequences depending on such bytes %.1f%%; "
           "a warp a block waiting on the others: %ld steps, one warp: %ld\n",
           100.0 * cross / nq, 100.0 * waiting / nq, side, serial);
    return 0;
}
