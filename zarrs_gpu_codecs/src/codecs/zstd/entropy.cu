// The parts our zstd kernels share (RFC 8878), the first of their sources, which are compiled in
// this order as one text: entropy.cu, decode.cu, blocks.cu, bytes.cu. Here: the names that let
// the same text run on the CPU (host_shim.cpp, where one lane does a warp's work and loops over
// lanes go through ZS_FOR_LANES), the statuses, the shared memory of a warp, the bit readers,
// FSE table descriptions and tables, and Huffman trees and streams. NVRTC compiles it with no
// standard headers. Every read is bounded by the lengths given and every loop by sizes checked
// before it, so damaged input ends as a status.

#ifndef ZS_HOST_SHIM
#define ZS_LANES 32u
#define ZS_LANE (threadIdx.x & 31u)
#define ZS_SYNC() __syncwarp()
#define ZS_FN __device__ __forceinline__
#define ZS_SHARED __shared__
#define ZS_CONST __constant__ const
// i over [0, n), spread over the lanes of the warp: each lane's first i is its lane index.
#define ZS_FOR_LANES(i, n) for (unsigned long long i = ZS_LANE; i < (n); i += ZS_LANES)
#endif

typedef unsigned char zs_u8;
typedef unsigned short zs_u16;
typedef unsigned int zs_u32;
typedef unsigned long long zs_u64;

// Statuses (0: decoded); the Rust side names them (zstd/decode.rs).
#define ZS_OK 0u
#define ZS_TRUNCATED 1u
#define ZS_BAD_FRAME 2u
#define ZS_BAD_BLOCK 3u
#define ZS_BAD_LITERALS 4u
#define ZS_BAD_HUFFMAN 5u
#define ZS_BAD_LITERAL_STREAM 6u
#define ZS_BAD_SEQUENCES 7u
#define ZS_BAD_SEQUENCE_STREAM 8u
#define ZS_BAD_SEQUENCE 9u
#define ZS_PAST_CAPACITY 10u
#define ZS_SIZE_MISMATCH 11u
// (blocks.cu) a block whose sequences zstd_sequence_lanes decodes next: never a frame's status.
#define ZS_PENDING 12u

#define ZS_MAX_BLOCK (128u << 10)
#define ZS_HUF_MAX_LOG 12u

// A sequence code's decoding table: per state its symbol, the bits of its next state's update
// and that update's base. Offsets use at most 256 states, lengths 512.
// Symbols of a sequence code's table at most (match lengths: 53).
#define ZS_SPREAD_SYMBOLS 64u

struct ZsFse {
    zs_u16 base[512];
    zs_u8 symbol[512];
    zs_u8 bits[512];
    zs_u32 log;
};

struct ZsShared {
    // Huffman decoding table of the literals: 1 << huf_log entries.
    // Its symbols, then their code lengths; the block-parallel decoder keeps its packed sequence
    // tables here once the literals are decoded.
    zs_u32 huf_area[(2u << ZS_HUF_MAX_LOG) / 4];
    zs_u32 huf_log;
    zs_u32 huf_valid;  // a tree was read in this frame (treeless literals repeat it)
    // The tree as lane 0 read it, for the warp to fill the table (zs_huffman_fill): the codes of
    // weight w take the entries from huf_class[w] (huf_class[huf_log + 1]: the table's size),
    // their symbols, in order, huf_order from huf_first[w].
    zs_u32 huf_class[ZS_HUF_MAX_LOG + 2], huf_first[ZS_HUF_MAX_LOG + 2];
    zs_u8 huf_order[256];
    ZsFse ll, of, ml;
    zs_u32 tables_valid;  // sequence tables exist in this frame (repeat mode)
    zs_u32 status;        // lane 0's verdict, read by all after a sync
    zs_u64 value;         // lane 0's result (bytes read), read by all after a sync
    zs_u32 stream_status[4];
};

#define ZS_HUF_SYMBOL(sh) ((zs_u8*)(sh)->huf_area)
#define ZS_HUF_BITS(sh) ((zs_u8*)(sh)->huf_area + (1u << ZS_HUF_MAX_LOG))

ZS_FN zs_u32 zs_highbit(zs_u32 x) {
    zs_u32 r = 0;
    while (x >>= 1) ++r;
    return r;
}

// The 8 bytes from q, all within the input, as a little-endian word. On the device: the one or
// two aligned words that hold them (each holds a byte of the input, so it lies in the input's
// allocation), where 8 byte loads and their assembly cost a sequence about 50 instructions.
ZS_FN zs_u64 zs_load8(const zs_u8* q) {
#ifdef ZS_HOST_SHIM
    zs_u64 w;
    __builtin_memcpy(&w, q, 8);
    return w;
#else
    const zs_u64 a = (zs_u64)q;
    const zs_u32 s = 8u * (zs_u32)(a & 7u);
    const zs_u64* w = (const zs_u64*)(a - (a & 7u));
    const zs_u64 lo = w[0];
    if (s == 0) return lo;
    return (lo >> s) | (w[1] << (64u - s));
#endif
}

// The 8 bytes from `at` as a little-endian word, zeros past `len`.
ZS_FN zs_u64 zs_word(const zs_u8* p, zs_u64 len, zs_u64 at) {
    if (at < len && len - at >= 8) return zs_load8(p + at);
    zs_u64 w = 0;
    for (zs_u32 k = 0; k < 8; ++k) {
        if (at + k < len) w |= (zs_u64)p[at + k] << (8 * k);
    }
    return w;
}

// n (at most 32) bits at bit `pos`, least significant first, zeros past `len` bytes.
ZS_FN zs_u32 zs_forward_bits(const zs_u8* p, zs_u64 len, zs_u64 pos, zs_u32 n) {
    return (zs_u32)((zs_word(p, len, pos >> 3) >> (pos & 7)) & ((1ull << n) - 1));
}

// A bitstream read backwards from its end mark (the highest set bit of its last byte): `left`
// bits remain before it. A read of more bits than remain sets `overflow` (the bits below the
// start read as zeros).
struct ZsBack {
    const zs_u8* p;
    zs_u64 len;
    zs_u64 left;
    zs_u32 overflow;
    // A cached window: the 8 bytes from byte `at`.
    zs_u64 word;
    zs_u64 at;
};

// 0 for an empty stream or one whose last byte is zero (no end mark).
ZS_FN zs_u32 zs_back_init(ZsBack* b, const zs_u8* p, zs_u64 len) {
    b->p = p;
    b->len = len;
    b->overflow = 0;
    b->left = 0;
    b->at = ~0ull;
    b->word = 0;
    if (len == 0 || p[len - 1] == 0) return 0;
    b->left = 8 * (len - 1) + zs_highbit(p[len - 1]);
    return 1;
}

// The n (at most 32) bits below position `left`, zeros below the start.
ZS_FN zs_u32 zs_back_peek(ZsBack* b, zs_u32 n) {
    if (n == 0) return 0;
    if (b->left >= n) {
        const zs_u64 start = b->left - n;
        const zs_u64 byte = start >> 3;
        if (b->at == ~0ull || byte < b->at || ((start + n + 7) >> 3) > b->at + 8) {
            // Reload so that the bits below (read next) are in the window too.
            b->at = (start + n + 7) >> 3 >= 8 ? ((start + n + 7) >> 3) - 8 : 0;
            if (b->at > byte) b->at = byte;
            b->word = zs_word(b->p, b->len, b->at);
        }
        return (zs_u32)((b->word >> (start - 8 * b->at)) & ((1ull << n) - 1));
    }
    // Fewer than n bits remain: they are the high ones, zeros below.
    const zs_u32 have = (zs_u32)b->left;
    const zs_u32 bits = have == 0 ? 0u : zs_forward_bits(b->p, b->len, 0, have);
    return bits << (n - have);
}

ZS_FN void zs_back_skip(ZsBack* b, zs_u32 n) {
    if (n > b->left) {
        b->overflow = 1;
        b->left = 0;
    } else {
        b->left -= n;
    }
}

ZS_FN zs_u32 zs_back_read(ZsBack* b, zs_u32 n) {
    const zs_u32 v = zs_back_peek(b, n);
    zs_back_skip(b, n);
    return v;
}

// An FSE table description (RFC 8878 4.1.1) of symbols 0..=max_symbol, accuracy log at most
// max_log, from src[0, len): the counts into norm (-1: "less than one"), the symbols described
// into *symbols, the log into *log; returns the bytes it takes, or 0 when it is damaged. Bits past
// the section read as zeros; a description that reaches past it is damaged (libzstd reads wrapped
// bits there; we refuse).
ZS_FN zs_u64 zs_read_counts(const zs_u8* src, zs_u64 len, zs_u32 max_symbol, zs_u32 max_log, short* norm,
                            zs_u32* symbols, zs_u32* log_out) {
    if (len == 0) return 0;
    const zs_u64 end = 8 * (len > 8 ? len : 8);
    const zs_u32 log = zs_forward_bits(src, len, 0, 4) + 5;
    if (log > max_log) return 0;
    const zs_u32 limit = max_symbol + 1;
    zs_u64 pos = 4;
    zs_u32 n = 0;
    int zero = 0;
    int remaining = (1 << log) + 1;
    int threshold = 1 << log;
    zs_u32 nb = log + 1;
    for (zs_u32 s = 0; s < 256; ++s) norm[s] = 0;
    for (;;) {
        if (zero) {
            // Runs of zero counts: 2-bit repeat codes, 3 meaning "3 more, and go on".
            for (;;) {
                const zs_u32 r = zs_forward_bits(src, len, pos, 2);
                pos += 2;
                n += r;
                if (r != 3) break;
                if (pos >= end || n > limit) return 0;
            }
            if (n >= limit) break;
            if (pos >= end) return 0;
        }
        const int max = 2 * threshold - 1 - remaining;
        const int low = (int)zs_forward_bits(src, len, pos, nb - 1);
        int count;
        if (low < max) {
            pos += nb - 1;
            count = low;
        } else {
            const int c = (int)zs_forward_bits(src, len, pos, nb);
            pos += nb;
            count = c >= threshold ? c - max : c;
        }
        count -= 1;
        remaining -= count < 0 ? -count : count;
        if (n >= 256) return 0;
        norm[n] = (short)count;
        n += 1;
        zero = count == 0;
        if (remaining < threshold) {
            if (remaining <= 1) break;
            nb = zs_highbit((zs_u32)remaining) + 1;
            threshold = 1 << (nb - 1);
        }
        if (n >= limit) break;
        if (pos >= end) return 0;
    }
    if (remaining != 1 || n > limit) return 0;
    const zs_u64 bytes = (pos + 7) >> 3;
    if (pos > end || bytes > len) return 0;
    *symbols = n;
    *log_out = log;
    return bytes;
}

// The symbols of the decoding table of counts norm[0, symbols) at accuracy `log` (RFC 8878
// 4.1.1) spread over its 1 << log states, and each symbol's first counter into next (room for
// `symbols`): the serial half of a table's build, one lane's chain of steps.
ZS_FN void zs_spread(const short* norm, zs_u32 symbols, zs_u32 log, zs_u8* symbol, zs_u32* next) {
    const zs_u32 size = 1u << log;
    const zs_u32 mask = size - 1;
    int high = (int)size - 1;
    for (zs_u32 s = 0; s < symbols; ++s) {
        if (norm[s] == -1) {
            if (high >= 0) symbol[high] = (zs_u8)s;
            high -= 1;
            next[s] = 1;
        } else {
            next[s] = norm[s] > 0 ? (zs_u32)norm[s] : 0;
        }
    }
    const zs_u32 step = (size >> 1) + (size >> 3) + 3;
    zs_u32 pos = 0;
    if (high >= 0) {
        for (zs_u32 s = 0; s < symbols; ++s) {
            for (int k = 0; k < norm[s]; ++k) {
                symbol[pos & mask] = (zs_u8)s;
                pos = (pos + step) & mask;
                while ((int)pos > high) pos = (pos + step) & mask;
            }
        }
    }
}

// zs_spread's table by the warp, in two halves. zs_spread visits the states in the order
// p_k = k * step mod size (step is odd: every state once), skips those left to the
// low-probability symbols (above `high`) and gives the n-th state it keeps the symbol whose run of
// counts holds n. So state p_k, kept, takes the symbol of n = k less the left states visited
// before it: each state on its own, from a few numbers lane 0 makes first (zs_spread_prepare):
// the runs' starts (`cum`, a symbol's first n) and the visit index of each left state (`late`).
// No lane reads another's result, so the CPU's one lane runs the same arithmetic. (The serial
// spread was about 80% of a block's tables, run DX3.)
struct ZsSpread {
    zs_u32 cum[ZS_SPREAD_SYMBOLS];   // symbol s's first n (counts of the symbols before it)
    zs_u32 late[ZS_SPREAD_SYMBOLS];  // the visit index k of each state left to a low-probability symbol
    zs_u32 symbols, lates;
    int high;
};

// Lane 0: the low-probability symbols into the table's top states, each symbol's first counter
// into next, and the numbers the warp's half takes into w.
ZS_FN void zs_spread_prepare(const short* norm, zs_u32 symbols, zs_u32 log, zs_u8* symbol, zs_u32* next,
                             ZsSpread* w) {
    const zs_u32 size = 1u << log;
    const zs_u32 mask = size - 1;
    const zs_u32 step = (size >> 1) + (size >> 3) + 3;
    // step's inverse modulo 2^32 (so modulo size): Newton's iteration, exact after 5 steps for
    // an odd number.
    zs_u32 inverse = step;
    for (zs_u32 i = 0; i < 5; ++i) inverse *= 2u - step * inverse;
    int high = (int)size - 1;
    zs_u32 n = 0, lates = 0;
    for (zs_u32 s = 0; s < symbols && s < ZS_SPREAD_SYMBOLS; ++s) {
        w->cum[s] = n;
        if (norm[s] == -1) {
            if (high >= 0) {
                symbol[high] = (zs_u8)s;
                w->late[lates++] = ((zs_u32)high * inverse) & mask;
            }
            high -= 1;
            next[s] = 1;
        } else {
            next[s] = norm[s] > 0 ? (zs_u32)norm[s] : 0;
            n += next[s];
        }
    }
    w->symbols = symbols < ZS_SPREAD_SYMBOLS ? symbols : ZS_SPREAD_SYMBOLS;
    w->lates = lates;
    w->high = high;
}

// The warp: the kept states' symbols (zs_spread's layout), from lane 0's numbers in w.
ZS_FN void zs_spread_states(const ZsSpread* w, zs_u32 log, zs_u8* symbol) {
    const zs_u32 size = 1u << log;
    const zs_u32 step = (size >> 1) + (size >> 3) + 3;
    const int high = w->high;
    const zs_u32 symbols = w->symbols, lates = w->lates;
    if (high < 0 || symbols == 0) return;
    ZS_FOR_LANES(k, size) {
        const zs_u32 pos = ((zs_u32)k * step) & (size - 1);
        if ((int)pos > high) continue;
        zs_u32 n = (zs_u32)k;
        for (zs_u32 i = 0; i < lates; ++i) n -= w->late[i] < k;
        // The last symbol whose run starts at n or before (runs of no counts are empty: the
        // last of equal starts is the one with counts).
        zs_u32 lo = 0, hi = symbols;  // cum[lo] <= n; the answer in [lo, hi)
        while (hi - lo > 1) {
            const zs_u32 mid = (lo + hi) >> 1;
            if (w->cum[mid] <= n) lo = mid;
            else hi = mid;
        }
        symbol[pos] = (zs_u8)lo;
    }
}

// State u's update bits and base, its symbol's counter x at it (the states before it with that
// symbol counted).
ZS_FN void zs_state(zs_u32 log, zs_u32 u, zs_u32 x, zs_u8* bits, zs_u16* base) {
    const zs_u32 size = 1u << log;
    const zs_u32 hb = zs_highbit(x);
    const zs_u32 nb = log > hb ? log - hb : 0;
    bits[u] = (zs_u8)nb;
    const zs_u32 shifted = x << nb;
    base[u] = (zs_u16)(shifted >= size ? shifted - size : 0);
}

// The states' bits and bases of a table whose symbols zs_spread laid out (its counters in
// next), by one lane walking the states in order.
ZS_FN void zs_states(zs_u32 log, const zs_u8* symbol, zs_u8* bits, zs_u16* base, zs_u32* next) {
    for (zs_u32 u = 0; u < (1u << log); ++u) {
        const zs_u32 s = symbol[u];
        const zs_u32 x = next[s] == 0 ? 1u : next[s];
        next[s] = x + 1;
        zs_state(log, u, x, bits, base);
    }
}

// The decoding table of counts norm[0, symbols) at accuracy `log` into symbol/bits/base of
// 1 << log states, by one lane. next: room for `symbols` counters.
ZS_FN void zs_build_table(const short* norm, zs_u32 symbols, zs_u32 log, zs_u8* symbol, zs_u8* bits,
                          zs_u16* base, zs_u32* next) {
    zs_spread(norm, symbols, log, symbol, next);
    zs_states(log, symbol, bits, base, next);
}

// The lanes below this one with the same key (of 9 bits), and all lanes with it: a warp's
// match, made of ballots (which every architecture NVRTC may target has). One lane on the CPU.
ZS_FN void zs_same_key(zs_u32 key, zs_u32* below, zs_u32* all) {
#ifdef ZS_HOST_SHIM
    (void)key;
    *below = 0;
    *all = 1;
#else
    zs_u32 peers = 0xFFFFFFFFu;
    for (zs_u32 b = 0; b < 9; ++b) {
        const zs_u32 ones = __ballot_sync(0xFFFFFFFFu, (key >> b) & 1u);
        peers &= (key >> b) & 1u ? ones : ~ones;
    }
    *below = (zs_u32)__popc(peers & ((1u << ZS_LANE) - 1u));
    *all = (zs_u32)__popc(peers);
#endif
}

// The states' bits and bases of a table whose symbols zs_spread laid out (its counters in next,
// shared), by the warp: 32 states a round, each lane's counter its symbol's before the round
// and the lanes below with that symbol, the lowest such lane moving the counter on. The same
// table as zs_build_table's one lane walking the states in order.
ZS_FN void zs_fill_states(zs_u32 log, const zs_u8* symbol, zs_u8* bits, zs_u16* base, zs_u32* next) {
    const zs_u32 size = 1u << log;
    for (zs_u32 u0 = 0; u0 < size; u0 += ZS_LANES) {
        const zs_u32 u = u0 + ZS_LANE;
        const zs_u32 s = u < size ? symbol[u] : 0u;
        zs_u32 below = 0, all = 0;
        zs_same_key(u < size ? s : 256u, &below, &all);  // lanes past the table: their own key
        const zs_u32 first = next[s] == 0 ? 1u : next[s];
        ZS_SYNC();
        if (u < size && below == 0) next[s] = first + all;
        ZS_SYNC();
        if (u < size) zs_state(log, u, first + below, bits, base);
    }
}

// The predefined distributions (RFC 8878 3.1.1.3.2.2): literal lengths (36 symbols, log 6),
// offsets (29 symbols, log 5), match lengths (53 symbols, log 6).
ZS_CONST signed char zs_ll_default[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                                          2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
ZS_CONST signed char zs_of_default[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                          1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};
ZS_CONST signed char zs_ml_default[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                          1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                          1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};

ZS_FN short zs_predefined(zs_u32 which, zs_u32 s) {
    if (which == 0) return zs_ll_default[s];
    if (which == 1) return zs_of_default[s];
    return zs_ml_default[s];
}

// Lane 0: a sequence code's table description (which: 0 literal lengths, 1 offsets, 2 match
// lengths) in `mode` from src[0, len) read: in modes 0 and 2 its counts into norm (room for 256;
// their number into *symbols, the table's log into t->log), for a spread to lay out; in mode 1
// the whole table into t. Returns the bytes the description takes, or ~0 when damaged.
ZS_FN zs_u64 zs_sequence_counts(ZsFse* t, zs_u32 which, zs_u32 mode, const zs_u8* src, zs_u64 len,
                                zs_u32 tables_valid, short* norm, zs_u32* symbols) {
    const zs_u32 max_symbol = which == 0 ? 35u : which == 1 ? 31u : 52u;
    const zs_u32 max_log = which == 1 ? 8u : 9u;
    if (mode == 0) {
        *symbols = which == 0 ? 36u : which == 1 ? 29u : 53u;
        for (zs_u32 s = 0; s < *symbols; ++s) norm[s] = zs_predefined(which, s);
        t->log = which == 1 ? 5u : 6u;
        return 0;
    }
    if (mode == 1) {
        if (len < 1 || src[0] > max_symbol) return ~0ull;
        t->symbol[0] = src[0];
        t->bits[0] = 0;
        t->base[0] = 0;
        t->log = 0;
        return 1;
    }
    if (mode == 2) {
        zs_u32 log = 0;
        const zs_u64 bytes = zs_read_counts(src, len, max_symbol, max_log, norm, symbols, &log);
        if (bytes == 0) return ~0ull;
        t->log = log;
        return bytes;
    }
    // Repeat: the table of the frame's last block with sequences.
    return tables_valid ? 0 : ~0ull;
}

// Lane 0: a sequence code's table in `mode` from src[0, len) into t (zs_sequence_counts), but
// for the states' bits and bases in modes 0 and 2: their symbols spread and their counters in
// next (room for 256), for zs_states or zs_fill_states to finish. Returns the bytes its
// description takes, or ~0 when damaged.
ZS_FN zs_u64 zs_sequence_symbols(ZsFse* t, zs_u32 which, zs_u32 mode, const zs_u8* src, zs_u64 len,
                                 zs_u32 tables_valid, zs_u32* next) {
    short norm[256];
    zs_u32 symbols = 0;
    const zs_u64 used = zs_sequence_counts(t, which, mode, src, len, tables_valid, norm, &symbols);
    if (used != ~0ull && (mode == 0 || mode == 2)) zs_spread(norm, symbols, t->log, t->symbol, next);
    return used;
}

// Lane 0: a sequence code's whole table (as zs_sequence_symbols, the states' bits and bases
// made by this lane). Returns the bytes its description takes, or ~0 when damaged.
ZS_FN zs_u64 zs_sequence_table(ZsFse* t, zs_u32 which, zs_u32 mode, const zs_u8* src, zs_u64 len,
                               zs_u32 tables_valid) {
    zs_u32 next[256];
    const zs_u64 used = zs_sequence_symbols(t, which, mode, src, len, tables_valid, next);
    if (used != ~0ull && (mode == 0 || mode == 2)) zs_states(t->log, t->symbol, t->bits, t->base, next);
    return used;
}

// Lane 0: the Huffman tree description at src[0, len) read, for zs_huffman_fill to lay out as
// the shared table; returns the bytes it takes, or 0 when damaged (libzstd's HUF_readStats rules).
ZS_FN zs_u64 zs_huffman_tree(ZsShared* sh, const zs_u8* src, zs_u64 len) {
    if (len == 0) return 0;
    zs_u8 weights[256];
    zs_u32 count = 0;
    zs_u64 taken = 0;
    const zs_u32 head = src[0];
    if (head >= 128) {
        // Direct: 4-bit weights, two to a byte.
        count = head - 127;
        const zs_u64 packed = (count + 1) / 2;
        if (1 + packed > len) return 0;
        for (zs_u32 i = 0; i < count; ++i) {
            const zs_u8 b = src[1 + i / 2];
            weights[i] = (i & 1) ? (b & 15) : (b >> 4);
        }
        taken = 1 + packed;
    } else {
        // FSE-compressed weights: two interleaved states until an update reads past the start.
        if (1 + (zs_u64)head > len) return 0;
        const zs_u8* body = src + 1;
        const zs_u64 body_len = head;
        short norm[256];
        zs_u32 next[256];
        zs_u32 symbols = 0, log = 0;
        const zs_u64 counts = zs_read_counts(body, body_len, 255, 6, norm, &symbols, &log);
        if (counts == 0) return 0;
        zs_u8 symbol[64], bits[64];
        zs_u16 base[64];
        zs_build_table(norm, symbols, log, symbol, bits, base, next);
        const zs_u32 mask = (1u << log) - 1;
        ZsBack b;
        if (!zs_back_init(&b, body + counts, body_len - counts)) return 0;
        zs_u32 state[2];
        state[0] = zs_back_read(&b, log);
        state[1] = zs_back_read(&b, log);
        if (b.overflow) return 0;
        for (zs_u32 turn = 0;; turn ^= 1) {
            if (count >= 254) return 0;
            const zs_u32 now = state[turn] & mask;
            weights[count++] = symbol[now];
            const zs_u32 update = zs_back_read(&b, bits[now]);
            if (b.overflow) {
                weights[count++] = symbol[state[turn ^ 1] & mask];
                break;
            }
            state[turn] = base[now] + update;
        }
        taken = 1 + body_len;
    }
    // The tree: weights up to 12, total a power of two once the implied last weight is added.
    zs_u32 total = 0, rank[ZS_HUF_MAX_LOG + 2];
    for (zs_u32 w = 0; w < ZS_HUF_MAX_LOG + 2; ++w) rank[w] = 0;
    for (zs_u32 i = 0; i < count; ++i) {
        if (weights[i] > ZS_HUF_MAX_LOG) return 0;
        rank[weights[i]] += 1;
        total += (1u << weights[i]) >> 1;
    }
    if (total == 0) return 0;
    const zs_u32 log = zs_highbit(total) + 1;
    if (log > ZS_HUF_MAX_LOG) return 0;
    const zs_u32 rest = (1u << log) - total;
    if (rest & (rest - 1)) return 0;
    const zs_u32 last = zs_highbit(rest) + 1;
    if (count >= 256) return 0;
    weights[count++] = (zs_u8)last;
    rank[last] += 1;
    if (rank[1] < 2 || (rank[1] & 1)) return 0;
    // Codes of weight w take 1 << (w - 1) entries, lowest weights first, symbols in order: each
    // class's first entry and its symbols, for the warp to fill the table (zs_huffman_fill).
    zs_u32 entry = 0, first = 0, at[ZS_HUF_MAX_LOG + 2];
    for (zs_u32 w = 1; w <= log; ++w) {
        sh->huf_class[w] = entry;
        sh->huf_first[w] = first;
        at[w] = first;
        entry += rank[w] << (w - 1);
        first += rank[w];
    }
    sh->huf_class[log + 1] = entry;  // 1 << log: the weights' total, checked above
    for (zs_u32 s = 0; s < count; ++s) {
        const zs_u32 w = weights[s];
        if (w != 0) sh->huf_order[at[w]++] = (zs_u8)s;
    }
    sh->huf_log = log;
    return taken;
}

// The whole warp, after lane 0 read a tree (zs_huffman_tree, its result checked): the table's
// entries, a lane an entry (lane 0 writing all 2 << log of them took most of a Z2 block's
// literals, run DT1). Entry e belongs to the class w whose entries hold it, and to the k-th
// symbol of that class, k its place there over the class's 1 << (w - 1) entries a symbol.
ZS_FN void zs_huffman_fill(ZsShared* sh) {
    const zs_u32 log = sh->huf_log;
    ZS_FOR_LANES(e, 1u << log) {
        zs_u32 w = 1;
        while (w < log && sh->huf_class[w + 1] <= e) ++w;
        const zs_u32 k = sh->huf_first[w] + (((zs_u32)e - sh->huf_class[w]) >> (w - 1));
        ZS_HUF_SYMBOL(sh)[e] = sh->huf_order[k];
        ZS_HUF_BITS(sh)[e] = (zs_u8)(log + 1 - w);
    }
    ZS_SYNC();
}

// A bitstream read backwards (as ZsBack), with a 64-bit window over the 8 bytes from `at`
// (zeros past the stream), refilled only where a read needs it: the sequence loop's reader, in
// 32-bit arithmetic but for the window (a block's stream is under 128 KiB). A refill takes its
// bytes from registers: the window and the 8 bytes below it, loaded at the refill before, so a
// lone lane does not wait for memory once a sequence.
struct ZsBits {
    const zs_u8* p;
    zs_u32 len;
    zs_u32 at;     // the window's first byte
    zs_u32 avail;  // unread bits in the window: its low `avail` bits (8 * at + avail unread in all)
    zs_u32 overflow;
    zs_u64 word;
    // The bytes [at - 8, at), zeros before the stream's start, as loaded: on the device two
    // aligned words (below, below_hi) to be shifted right by `shift` bits when the window next
    // moves, so that the loads' wait falls there, sequences later, not where they are issued
    // (the combined load waited there: 17% of the lanes' stalls, run DX3).
    zs_u64 below, below_hi;
    zs_u32 shift;
};

// The window at `at` whose unread bits number `left` in all: its byte first `at`, the highest
// with the unread bits' top byte within the window (the stream's bytes stop at that top byte:
// at + 8 <= len unless at is 0).
ZS_FN zs_u32 zs_bits_window(zs_u32 left) {
    const zs_u32 top = (left + 7) >> 3;
    return top >= 8 ? top - 8 : 0;
}

// The aligned 8-byte word at address `a` (a multiple of 8) that holds a byte of the stream: on
// the device read whole (the aligned words holding an input's bytes lie within its allocation);
// on the CPU assembled from the stream's bytes, those outside it 0xFF, so that a reader that took
// any of them would show.
ZS_FN zs_u64 zs_bits_aligned_word(const ZsBits* b, zs_u64 a) {
#ifdef ZS_HOST_SHIM
    zs_u64 w = 0;
    for (zs_u32 k = 0; k < 8; ++k) {
        const zs_u64 o = a + k - (zs_u64)b->p;  // wraps for bytes before the stream: outside
        w |= (zs_u64)(o < b->len ? b->p[o] : 0xFFu) << (8 * k);
    }
    return w;
#else
    return *(const zs_u64*)a;
#endif
}

// Load the 8 bytes below a window at b->at (within the stream, as zs_bits_window says).
ZS_FN void zs_bits_load_below(ZsBits* b) {
    const zs_u32 at = b->at;
    b->below_hi = 0;
    b->shift = 0;
    if (at >= 8) {
        const zs_u64 q = (zs_u64)(b->p + at - 8);
        b->shift = 8u * (zs_u32)(q & 7u);
        b->below = zs_bits_aligned_word(b, q & ~7ull);
        // (The word after holds bytes of [at - 8, at) where the shift is not 0.)
        if (b->shift != 0) b->below_hi = zs_bits_aligned_word(b, (q & ~7ull) + 8);
        return;
    }
    b->below = at > 0 ? zs_load8(b->p) << (8u * (8u - at)) : 0ull;
}

// The bytes [at - 8, at) zs_bits_load_below loaded.
ZS_FN zs_u64 zs_bits_below(const ZsBits* b) {
    return b->shift == 0 ? b->below : (b->below >> b->shift) | (b->below_hi << (64u - b->shift));
}

// Move the window down to the unread bits' top byte, from the window and the bytes below it: a
// read takes at most the window's bits, so it moves by 8 bytes at most.
ZS_FN void zs_bits_fill(ZsBits* b) {
    const zs_u32 left = 8 * b->at + b->avail;
    const zs_u32 at = zs_bits_window(left);
    const zs_u32 d = b->at - at;
    const zs_u64 below = zs_bits_below(b);
    b->word = d == 0 ? b->word : d >= 8 ? below : (below >> (8u * (8u - d))) | (b->word << (8u * d));
    b->at = at;
    b->avail = left - 8 * at;
    zs_bits_load_below(b);
}

// The reader of stream p of len bytes with `left` bits unread (as zs_bits_left says them): what
// it reads from there is what any reader of the stream with those bits left reads (the window's
// place aside).
ZS_FN void zs_bits_at(ZsBits* b, const zs_u8* p, zs_u64 len, zs_u32 left) {
    b->p = p;
    b->len = (zs_u32)len;
    b->overflow = 0;
    b->at = zs_bits_window(left);
    b->avail = left - 8 * b->at;
    b->word = zs_word(p, len, b->at);
    zs_bits_load_below(b);
}

// 0 for an empty stream, one whose last byte is zero (no end mark), or one of 128 KiB or more.
ZS_FN zs_u32 zs_bits_init(ZsBits* b, const zs_u8* p, zs_u64 len) {
    b->p = p;
    b->len = (zs_u32)len;
    b->overflow = 0;
    b->at = 0;
    b->avail = 0;
    b->word = 0;
    b->below = b->below_hi = 0;
    b->shift = 0;
    if (len == 0 || len >= (1u << 24) || p[len - 1] == 0) return 0;
    zs_bits_at(b, p, len, 8 * ((zs_u32)len - 1) + zs_highbit(p[len - 1]));
    return 1;
}

// Make the next `n` (at most 32) bits readable from the window.
ZS_FN void zs_bits_ensure(ZsBits* b, zs_u32 n) {
    if (b->avail < n && b->at > 0) zs_bits_fill(b);
}

// The next n (at most 32, ensured) bits; past the start: zeros, and overflow set.
ZS_FN zs_u32 zs_bits_read(ZsBits* b, zs_u32 n) {
    if (n > b->avail) {
        b->overflow = 1;
        b->avail = 0;
        return 0;
    }
    b->avail -= n;
    return (zs_u32)(b->word >> b->avail) & (n == 0 ? 0u : 0xFFFFFFFFu >> (32 - n));
}

// Bits left unread.
ZS_FN zs_u32 zs_bits_left(const ZsBits* b) {
    return 8 * b->at + b->avail;
}

// The low n (at most 32) bits of a word.
ZS_FN zs_u32 zs_mask(zs_u32 n) {
    return n == 0 ? 0u : 0xFFFFFFFFu >> (32 - n);
}

// The Huffman code at the top of the unread bits (`log` of them, zeros below the stream's start),
// its symbol written to *dst; 0 when its length reaches past the start.
ZS_FN zs_u32 zs_huffman_symbol(const ZsShared* sh, ZsBits* b, zs_u32 log, zs_u8* dst) {
    const zs_u32 a = b->avail;
    const zs_u32 at = a >= log ? (zs_u32)(b->word >> (a - log)) & zs_mask(log)
                               : ((zs_u32)b->word & zs_mask(a)) << (log - a);
    const zs_u32 nb = ZS_HUF_BITS(sh)[at];
    *dst = ZS_HUF_SYMBOL(sh)[at];
    if (nb > a) return 0;
    b->avail = a - nb;
    return 1;
}

// One Huffman stream src[0, len) of `count` literals into dst: 0 when it is damaged or not used
// up exactly. Four codes (of at most 11 bits) a refill check.
ZS_FN zs_u32 zs_huffman_stream(const ZsShared* sh, const zs_u8* src, zs_u64 len, zs_u8* dst, zs_u64 count) {
    ZsBits b;
    if (!zs_bits_init(&b, src, len)) return 0;
    const zs_u32 log = sh->huf_log;
    zs_u64 i = 0;
    zs_u32 ok = 1;
    for (; i + 4 <= count && ok; i += 4) {
        zs_bits_ensure(&b, 4 * log);
        ok &= zs_huffman_symbol(sh, &b, log, dst + i);
        ok &= zs_huffman_symbol(sh, &b, log, dst + i + 1);
        ok &= zs_huffman_symbol(sh, &b, log, dst + i + 2);
        ok &= zs_huffman_symbol(sh, &b, log, dst + i + 3);
    }
    for (; i < count && ok; ++i) {
        zs_bits_ensure(&b, log);
        ok &= zs_huffman_symbol(sh, &b, log, dst + i);
    }
    return ok && zs_bits_left(&b) == 0;
}

