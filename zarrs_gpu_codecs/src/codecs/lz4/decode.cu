// LZ4 block decoder: one thread block per LZ4 block, in rounds of up to LZ4_ROUND tokens.
// 1. The tokens: for every input position of a tile, a step table says where the next token
//    starts were a token there (for every token a match follows whose length extensions are
//    short), and a jump table where the LZ4_JUMP-th next one starts; thread 0 follows them from
//    the block's start (one shared-memory read for LZ4_JUMP tokens) and parses only the other
//    tokens whole; then a thread an anchor fills in the tokens a jump passed.
// 2. A thread a token parses it; an exclusive prefix sum of the tokens' lengths places each in
//    the output, and each is checked there as the walk (lz4/block.rs) checks it: the first
//    failing token, in token order, ends the block with its status.
// 3. The round's bytes, in windows of LZ4_WINDOW: each byte gets an entry, its value (a literal,
//    or a byte before the window, written already) or the place in the window of the byte its
//    match copies; the pointers, all to earlier bytes, are followed until every entry is a
//    value, and the window is written out.
// The same text runs on the CPU (host_shim.cpp), where one thread does the thread block's work:
// loops over threads go through LZ4_FOR_THREADS, so both run this very code. NVRTC compiles it
// with no standard headers.
//
// Acceptance is LZ4_decompress_safe's strictest reading (lz4/block.rs's walk, rule for rule): a
// block decodes only if it is exactly `expected` bytes, every offset within the bytes written,
// and the end-of-block rules hold; so what lz4_flex rejects is an error here too. Every read of
// the input and write of the output is bounded by the lengths given; every round consumes input
// and every loop is bounded by the round's sizes, so the work is bounded by the input and output
// lengths.

#ifndef LZ4_HOST_SHIM
#define LZ4_THREADS blockDim.x  // the launch picks them (lz4/decode.rs)
#define LZ4_TID threadIdx.x
#define LZ4_SYNC() __syncthreads()
#define LZ4_FN __device__ __forceinline__
#define LZ4_SHARED __shared__
#define LZ4_ATOMIC_MIN(p, v) atomicMin((p), (v))
#define LZ4_ATOMIC_ADD(p, v) atomicAdd((p), (v))
// i over [0, n), spread over the threads of the block: each thread's first i is its index.
#define LZ4_FOR_THREADS(i, n) for (unsigned int i = LZ4_TID; i < (n); i += LZ4_THREADS)
#endif

// Statuses (0: decoded); the Rust side names them (lz4/decode.rs).
#define LZ4_OK 0u
#define LZ4_LITERALS_PAST_INPUT 1u
#define LZ4_BAD_OFFSET 2u
#define LZ4_PAST_CAPACITY 3u
#define LZ4_INPUT_ENDS 4u
#define LZ4_LENGTH_MISMATCH 5u
#define LZ4_END_RULES 6u
#define LZ4_TOO_LARGE 7u

#define LZ4_TILE 4096u     // input positions a step table covers
#define LZ4_SLACK 64u      // input bytes past the tile kept with it (tokens near its end)
#define LZ4_JUMP 8u        // tokens a jump passes
#define LZ4_EXTENSION 16u  // length extension bytes a step looks through
#define LZ4_STEP_MAX 0xFFFFu
#define LZ4_ROUND 512u     // tokens a round
#define LZ4_WINDOW 4096u   // output bytes resolved at once (at most LZ4_RESOLVED)
#define LZ4_LARGEST 0x7FFFFFFFu  // input and output lengths the u32 places take
#define LZ4_RESOLVED 0x8000u  // above every window place
#define LZ4_HOPS 32u
// The place and capacity of a token parsed before its place is known: only the checks on the
// input apply.
#define LZ4_UNPLACED (1ull << 40)

typedef unsigned int lz4_u32;
typedef char lz4_window_fits_an_entry[LZ4_WINDOW <= LZ4_RESOLVED ? 1 : -1];
typedef unsigned long long lz4_u64;

struct Lz4Shared {
    unsigned char near[LZ4_TILE + LZ4_SLACK];  // the input from s->tile on (what the tables read)
    unsigned short step[LZ4_TILE];  // bytes from a token at tile + r to the next; 0: parse it
    unsigned short jump[LZ4_TILE];  // bytes from tile + r to LZ4_JUMP tokens on; 0: none
    unsigned char filled[LZ4_ROUND];  // token i starts a jump: the next LZ4_JUMP - 1 to fill in
    lz4_u32 tok[LZ4_ROUND];        // the round's token places in the input
    lz4_u32 op[LZ4_ROUND + 1];     // where each token's bytes start; op[count]: the round's end
    lz4_u32 lits[LZ4_ROUND], lit_at[LZ4_ROUND], match[LZ4_ROUND], offset[LZ4_ROUND];
    unsigned short entry[LZ4_WINDOW];  // a byte's value | LZ4_RESOLVED, or the window place it copies
    lz4_u32 tile, span, pos, count, done, need_tile, base, first, exec, end, finished, status;
    lz4_u32 more[3];
};

// The input, with the bytes near the tile in shared memory: [from, from + have) of in.
struct Lz4In {
    const unsigned char* in;
    const unsigned char* near;
    lz4_u32 from, have;
};

LZ4_FN lz4_u32 lz4_at(const Lz4In* x, lz4_u64 i) {
    const lz4_u64 r = i - x->from;  // wraps past have below the tile
    return r < x->have ? x->near[r] : x->in[i];
}

struct Lz4Token {
    lz4_u64 lits, match;  // lengths accepted (0 until their checks pass)
    lz4_u32 lit_at, offset, next, last;
};

// A length whose nibble is 15 continues in the bytes at *ip (each added, until one is not 255).
// Returns 0 when the input ends first.
LZ4_FN int lz4_length(const Lz4In* in, lz4_u64 n, lz4_u64* ip, lz4_u64* len) {
    if (*len != 15) return 1;
    // Four bytes a step while all are 255 (a long run's match: thousands of them), their reads
    // independent; then byte by byte.
    while (*ip + 4 <= n && (lz4_at(in, *ip) & lz4_at(in, *ip + 1) & lz4_at(in, *ip + 2) & lz4_at(in, *ip + 3)) == 255) {
        *ip += 4;
        *len += 4 * 255;
    }
    for (;;) {
        if (*ip >= n) return 0;
        const unsigned int b = lz4_at(in, *ip);
        *ip += 1;
        *len += b;
        if (b != 255) return 1;
    }
}

// The token at ip of in[0, n), its bytes placed at op of an output of `expected`, checked as the
// walk checks it: its status (OK: a match follows, or t->last and the block ends well). The
// bytes written before the block ended there: op + t->lits.
LZ4_FN lz4_u32 lz4_token(const Lz4In* in, lz4_u64 n, lz4_u64 ip, lz4_u64 op, lz4_u64 expected, Lz4Token* t) {
    t->lits = 0;
    t->match = 0;
    t->lit_at = 0;
    t->offset = 0;
    t->next = 0;
    t->last = 0;
    if (ip >= n) return LZ4_INPUT_ENDS;  // empty input, or a match ending the input
    const unsigned int token = lz4_at(in, ip);
    ip += 1;
    lz4_u64 literals = token >> 4;
    if (!lz4_length(in, n, &ip, &literals)) return LZ4_INPUT_ENDS;
    if (literals > n - ip) return LZ4_LITERALS_PAST_INPUT;
    if (literals > expected - op) return LZ4_PAST_CAPACITY;
    t->lits = literals;
    t->lit_at = (lz4_u32)ip;
    ip += literals;
    op += literals;
    if (ip == n) {  // the last sequence: literals only
        t->last = 1;
        t->next = (lz4_u32)n;
        return op == expected ? LZ4_OK : LZ4_LENGTH_MISMATCH;
    }
    // A match follows: it starts at least 12 bytes before the end, and at least 8 input bytes
    // follow the literals (the offset, a last token, 5 literals).
    if (expected - op < 12 || n - ip < 8) return LZ4_END_RULES;
    const lz4_u64 offset = (lz4_u64)lz4_at(in, ip) | ((lz4_u64)lz4_at(in, ip + 1) << 8);
    ip += 2;
    if (offset == 0 || offset > op) return LZ4_BAD_OFFSET;
    lz4_u64 matched = token & 15u;
    if (!lz4_length(in, n, &ip, &matched)) return LZ4_INPUT_ENDS;
    // An extension leaves at least 4 input bytes.
    if ((token & 15u) == 15u && n - ip < 4) return LZ4_END_RULES;
    matched += 4;
    if (matched > expected - op) return LZ4_PAST_CAPACITY;
    // The match ends at least 5 bytes before the end (the last 5 bytes are literals).
    if (expected - op - matched < 5) return LZ4_END_RULES;
    t->match = matched;
    t->offset = (lz4_u32)offset;
    t->next = (lz4_u32)ip;
    return LZ4_OK;
}

// Where a length extension starting at *ip ends, looked for in at most LZ4_EXTENSION bytes:
// 0 where the input or those bytes end first.
LZ4_FN lz4_u32 lz4_skip_extension(const Lz4In* in, lz4_u32 n, lz4_u32* ip, lz4_u32* len) {
    for (lz4_u32 k = 0; k < LZ4_EXTENSION; ++k) {
        if (*ip >= n) return 0;
        const lz4_u32 b = lz4_at(in, *ip);
        *ip += 1;
        *len += b;
        if (b != 255) return 1;
    }
    return 0;
}

// The step table's entry for a token at p: the bytes to the next token where a match follows
// its literals (which end inside the input before its last byte) and its length extensions
// are at most LZ4_EXTENSION bytes each; else 0. What lz4_token finds when its checks pass.
LZ4_FN lz4_u32 lz4_step(const Lz4In* in, lz4_u32 n, lz4_u32 p) {
    if (p >= n) return 0;
    const lz4_u32 t = lz4_at(in, p);
    lz4_u32 ip = p + 1, lits = t >> 4, matched = t & 15u;
    if (lits == 15u && !lz4_skip_extension(in, n, &ip, &lits)) return 0;
    if (ip >= n || lits >= n - ip) return 0;  // the last token's literals, or past the end
    ip += lits + 2;                           // the literals and the offset
    if (matched == 15u && !lz4_skip_extension(in, n, &ip, &matched)) return 0;
    return ip - p <= LZ4_STEP_MAX ? ip - p : 0u;
}

// The input as the tile at s->tile sees it (s->near holding its bytes).
LZ4_FN Lz4In lz4_input(const Lz4Shared* s, const unsigned char* in, lz4_u32 n) {
    Lz4In x;
    x.in = in;
    x.near = s->near;
    x.from = s->tile;
    x.have = s->tile >= n ? 0u : (n - s->tile < LZ4_TILE + LZ4_SLACK ? n - s->tile : LZ4_TILE + LZ4_SLACK);
    return x;
}

// The tables of the tile starting at input place s->tile, as far as the input reaches (s->span
// entries; past them every entry would be 0), and its bytes in s->near: each position's step
// reads a few bytes near it, one load from shared memory each.
LZ4_FN void lz4_tables(Lz4Shared* s, const unsigned char* in, lz4_u32 n) {
    const lz4_u32 tile = s->tile;
    const lz4_u32 span = tile >= n ? 0u : (n - tile < LZ4_TILE ? n - tile : LZ4_TILE);
    const Lz4In x = lz4_input(s, in, n);
    // Four bytes a thread, their loads issued before any is stored (one byte's load from device
    // memory waited on before the next was the copy's time).
    LZ4_FOR_THREADS(q, (x.have + 3) / 4) {
        const lz4_u32 r = 4 * q, m = x.have - r;  // m >= 1
        const unsigned char* p = in + tile + r;
        const unsigned char b0 = p[0], b1 = m > 1 ? p[1] : 0, b2 = m > 2 ? p[2] : 0, b3 = m > 3 ? p[3] : 0;
        s->near[r] = b0;
        if (m > 1) s->near[r + 1] = b1;
        if (m > 2) s->near[r + 2] = b2;
        if (m > 3) s->near[r + 3] = b3;
    }
    LZ4_SYNC();
    LZ4_FOR_THREADS(r, span) s->step[r] = (unsigned short)lz4_step(&x, n, tile + r);
    LZ4_SYNC();
    // LZ4_JUMP steps from r, each from a place inside the tile (the last may land outside).
    LZ4_FOR_THREADS(r, span) {
        lz4_u32 at = r, ok = 1;
        for (lz4_u32 j = 0; j < LZ4_JUMP && ok; ++j) {
            const lz4_u32 st = at < span ? s->step[at] : 0u;
            ok = st != 0;
            at += st;
        }
        s->jump[r] = (unsigned short)(ok && at - r <= LZ4_STEP_MAX ? at - r : 0u);
    }
    if (LZ4_TID == 0) s->span = span;
    LZ4_SYNC();
}

// Thread 0: the round's token places from s->pos on, up to LZ4_ROUND, until the tile's end
// (s->need_tile) or a token that ends the block or fails its input's checks (s->done).
LZ4_FN void lz4_chain(Lz4Shared* s, const unsigned char* in, lz4_u32 n) {
    const lz4_u32 tile = s->tile, span = s->span;
    const Lz4In x = lz4_input(s, in, n);
    lz4_u32 pos = s->pos, count = 0;
    while (count < LZ4_ROUND) {
        const lz4_u32 r = pos - tile;  // pos >= tile
        if (r >= LZ4_TILE) {
            s->need_tile = 1;
            break;
        }
        const lz4_u32 j = r < span ? s->jump[r] : 0u;
        s->tok[count] = pos;
        if (j != 0 && count + LZ4_JUMP <= LZ4_ROUND) {
            s->filled[count] = 1;
            for (lz4_u32 m = 1; m < LZ4_JUMP; ++m) s->filled[count + m] = 0;
            count += LZ4_JUMP;
            pos += j;
            continue;
        }
        s->filled[count] = 0;
        count += 1;
        const lz4_u32 st = r < span ? s->step[r] : 0u;
        if (st != 0) {
            pos += st;
            continue;
        }
        Lz4Token t;
        if (lz4_token(&x, n, pos, LZ4_UNPLACED, 2 * LZ4_UNPLACED, &t) != LZ4_OK || t.last) {
            s->done = 1;
            break;
        }
        pos = t.next;
    }
    s->pos = pos;
    s->count = count;
}

// op[i] = base + the lengths before token i (in s->match), op[count] = the round's end: a
// scan of doubling strides between op and lits (free until the checks fill them), the same text
// on the CPU as on the device. s->match is left holding the inclusive sums.
LZ4_FN void lz4_places(Lz4Shared* s, lz4_u32 count, lz4_u32 base) {
    lz4_u32* x = s->op;
    lz4_u32* y = s->lits;
    LZ4_FOR_THREADS(i, count) x[i] = s->match[i];
    LZ4_SYNC();
    for (lz4_u32 d = 1; d < count; d <<= 1) {
        LZ4_FOR_THREADS(i, count) y[i] = x[i] + (i >= d ? x[i - d] : 0u);
        LZ4_SYNC();
        lz4_u32* t = x;
        x = y;
        y = t;
    }
    LZ4_FOR_THREADS(i, count) s->match[i] = x[i];
    LZ4_SYNC();
    LZ4_FOR_THREADS(i, count) s->op[i + 1] = base + s->match[i];
    if (LZ4_TID == 0) s->op[0] = base;
}

// The entry of output byte b of token i, in the window starting at w0: its value (a literal, or
// a byte before the window, written already) or the window place of the byte it copies.
LZ4_FN lz4_u32 lz4_entry(const Lz4Shared* s, lz4_u32 i, lz4_u32 b, lz4_u32 w0, const Lz4In* in,
                         const unsigned char* out) {
    const lz4_u32 r = b - s->op[i];
    // Literals mostly lie in the tile's bytes, in shared memory (the round's tokens start there).
    if (r < s->lits[i]) return LZ4_RESOLVED | lz4_at(in, s->lit_at[i] + r);
    // Byte k of a match at offset d repeats byte k % d of the d bytes before the match (the
    // offset is within the bytes before it): a pointer never into the match itself, so runs
    // make no chains.
    const lz4_u32 k = r - s->lits[i], d = s->offset[i];
    const lz4_u32 src = b - k - d + (k < d ? k : k % d);
    if (src < w0) return LZ4_RESOLVED | out[src];
    return src - w0;
}

// The bytes [w0, w1) of the round's first s->exec tokens: entries, pointers followed, written.
// A thread a byte: its token found by a binary search of the tokens' places (so every thread
// has the same work, however the bytes fall into tokens), its entry made.
LZ4_FN void lz4_window(Lz4Shared* s, const Lz4In* in, unsigned char* out, lz4_u32 w0, lz4_u32 w1) {
    const lz4_u32 exec = s->exec, len = w1 - w0;
    if (LZ4_TID == 0) {
        s->more[0] = 0;
        s->more[1] = 0;
    }
    // The window's bytes lie before the round's end: each in the last token i < exec with
    // op[i] <= b (the tokens before it that hold no bytes passed over).
    LZ4_FOR_THREADS(x, len) {
        const lz4_u32 b = w0 + x;
        lz4_u32 lo = 0, hi = exec;  // op[lo] <= b, and b is before token hi's place
        while (hi - lo > 1) {
            const lz4_u32 mid = (lo + hi) / 2;
            if (s->op[mid] <= b) lo = mid;
            else hi = mid;
        }
        s->entry[x] = (unsigned short)lz4_entry(s, lo, b, w0, in, out);
    }
    LZ4_SYNC();
    // Every pointer leads to an earlier byte, so each pass resolves at least the first
    // unresolved entry: the passes end. An entry is written only by its own thread; its targets
    // may move on while it reads them, from one pointer of the chain to a later one or to the
    // value (volatile, whole entries: an aligned 16-bit access is one).
    volatile unsigned short* e = s->entry;
    for (lz4_u32 pass = 0;; ++pass) {
        LZ4_FOR_THREADS(x, len) {
            lz4_u32 v = e[x];
            if (v & LZ4_RESOLVED) continue;
            for (lz4_u32 h = 0; h < LZ4_HOPS && !(v & LZ4_RESOLVED); ++h) v = e[v];
            e[x] = (unsigned short)v;
            if (!(v & LZ4_RESOLVED)) s->more[pass % 3] = 1;
        }
        // The flag the pass after next sets, cleared while no thread reads it.
        if (LZ4_TID == 0) s->more[(pass + 1) % 3] = 0;
        LZ4_SYNC();
        if (!s->more[pass % 3]) break;
    }
    LZ4_FOR_THREADS(x, len) out[w0 + x] = (unsigned char)e[x];
    LZ4_SYNC();
}

// One round: the tokens s->chain found, parsed, placed, checked and written out.
LZ4_FN void lz4_round(Lz4Shared* s, const unsigned char* in, lz4_u32 n, unsigned char* out, lz4_u32 expected) {
    const lz4_u32 count = s->count;
    const Lz4In x = lz4_input(s, in, n);  // the round's tokens start in the tile
    // The tokens a jump passed.
    LZ4_FOR_THREADS(i, count) {
        if (s->filled[i]) {
            lz4_u32 p = s->tok[i];
            for (lz4_u32 m = 1; m < LZ4_JUMP; ++m) {
                p += s->step[p - s->tile];
                s->tok[i + m] = p;
            }
        }
    }
    LZ4_SYNC();
    // Their lengths (the input's checks only: a token failing those fails placed too), placed.
    LZ4_FOR_THREADS(i, count) {
        Lz4Token t;
        lz4_token(&x, n, s->tok[i], LZ4_UNPLACED, 2 * LZ4_UNPLACED, &t);
        s->match[i] = (lz4_u32)(t.lits + t.match);
    }
    LZ4_SYNC();
    lz4_places(s, count, s->base);
    LZ4_SYNC();
    // Checked where they are; the first that ends the block, in token order.
    LZ4_FOR_THREADS(i, count) {
        Lz4Token t;
        const lz4_u32 status = lz4_token(&x, n, s->tok[i], s->op[i], expected, &t);
        s->lits[i] = (lz4_u32)t.lits;
        s->lit_at[i] = t.lit_at;
        s->match[i] = (lz4_u32)t.match;
        s->offset[i] = t.offset;
        if (status != LZ4_OK || t.last) LZ4_ATOMIC_MIN(&s->first, i);
    }
    LZ4_SYNC();
    if (LZ4_TID == 0) {
        const lz4_u32 f = s->first;
        if (f < count) {
            Lz4Token t;
            s->status = lz4_token(&x, n, s->tok[f], s->op[f], expected, &t);
            s->exec = f + 1;
            s->end = s->op[f] + (lz4_u32)t.lits;
            s->finished = 1;
        } else {
            s->exec = count;
            s->end = s->op[count];
            if (s->done) {  // never: the token that stops the chain ends the block
                s->status = LZ4_INPUT_ENDS;
                s->finished = 1;
            }
        }
    }
    LZ4_SYNC();
    const lz4_u32 base = s->base, end = s->end;
    for (lz4_u32 w0 = base; w0 < end; w0 += LZ4_WINDOW) lz4_window(s, &x, out, w0, end - w0 < LZ4_WINDOW ? end : w0 + LZ4_WINDOW);
    // Every thread has read s->base before the first window's barrier, or there was none and
    // base == end.
    if (LZ4_TID == 0) s->base = end;
    LZ4_SYNC();
}

// Decode in[0, n) into out[0, expected); *written: the bytes decoded before it ended.
LZ4_FN lz4_u32 lz4_block(Lz4Shared* s, const unsigned char* in, lz4_u32 n, unsigned char* out, lz4_u32 expected,
                         lz4_u32* written) {
    if (LZ4_TID == 0) {
        s->tile = 0;
        s->pos = 0;
        s->done = 0;
        s->base = 0;
        s->finished = 0;
        s->status = LZ4_OK;
    }
    LZ4_SYNC();
    lz4_tables(s, in, n);
    for (;;) {
        if (LZ4_TID == 0) {
            s->need_tile = 0;
            s->first = LZ4_ROUND;
            lz4_chain(s, in, n);
        }
        LZ4_SYNC();
        if (s->count > 0 || s->done) lz4_round(s, in, n, out, expected);
        // The flags read by every thread before thread 0 goes on: its next chain sets
        // s->need_tile, and a thread that read that instead would have entered the tile's move
        // alone, its barriers matched with the others' elsewhere (a valid block then failed, or
        // worse, on a busy device: run DT1).
        const lz4_u32 finished = s->finished, need_tile = s->need_tile;
        LZ4_SYNC();
        if (finished) break;
        if (need_tile) {
            if (LZ4_TID == 0) s->tile = s->pos;
            LZ4_SYNC();
            lz4_tables(s, in, n);
        }
    }
    *written = s->base;
    if (s->status == LZ4_OK && s->base != expected) return LZ4_LENGTH_MISMATCH;
    return s->status;
}

// Block k of n: thread block k of the grid. Its status and decoded length go to statuses[k] and
// decoded[k]; a failing status is or-ed with tags[k] where tags is not null (the caller's mark
// of which stream failed).
extern "C" __global__ void lz4_decode_blocks(const unsigned char* const* inputs,
                                             const unsigned long long* input_sizes,
                                             const unsigned long long* capacities, unsigned char* const* outputs,
                                             unsigned long long* decoded, unsigned int* statuses,
                                             const unsigned int* tags, unsigned long long n) {
    LZ4_SHARED Lz4Shared shared;
    const unsigned long long k = blockIdx.x;
    if (k >= n) return;  // the whole thread block: k is the block's
    lz4_u32 written = 0, status = LZ4_TOO_LARGE;
    if (input_sizes[k] <= LZ4_LARGEST && capacities[k] <= LZ4_LARGEST)
        status = lz4_block(&shared, inputs[k], (lz4_u32)input_sizes[k], outputs[k], (lz4_u32)capacities[k], &written);
    if (status != LZ4_OK && tags != 0) status |= tags[k];
    if (LZ4_TID == 0) {
        statuses[k] = status;
        decoded[k] = written;
    }
}

// The names stay out of the sources compiled after this one.
#undef LZ4_FOR_THREADS
#undef LZ4_OK
#undef LZ4_LITERALS_PAST_INPUT
#undef LZ4_BAD_OFFSET
#undef LZ4_PAST_CAPACITY
#undef LZ4_INPUT_ENDS
#undef LZ4_LENGTH_MISMATCH
#undef LZ4_END_RULES
#undef LZ4_TOO_LARGE
#undef LZ4_TILE
#undef LZ4_SLACK
#undef LZ4_JUMP
#undef LZ4_EXTENSION
#undef LZ4_STEP_MAX
#undef LZ4_ROUND
#undef LZ4_WINDOW
#undef LZ4_LARGEST
#undef LZ4_RESOLVED
#undef LZ4_HOPS
#undef LZ4_UNPLACED
#ifndef LZ4_HOST_SHIM
#undef LZ4_THREADS
#undef LZ4_TID
#undef LZ4_SYNC
#undef LZ4_FN
#undef LZ4_SHARED
#undef LZ4_ATOMIC_MIN
#undef LZ4_ATOMIC_ADD
#endif
