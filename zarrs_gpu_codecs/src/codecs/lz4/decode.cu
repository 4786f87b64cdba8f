// LZ4 block decoder: one warp per block. Every lane parses the same tokens (the walk is uniform
// across the warp, so no shuffles), a batch of up to 32 before any is copied; then the batch's
// literals and matches are copied a lane per token (the whole warp on a long one), a match that
// reads an earlier one's bytes in a later round. The same text runs on the CPU (host_shim.cpp),
// where one lane does a warp's work: loops over lanes go through LZ4_FOR_LANES, so both run this
// very code. NVRTC compiles it with no standard headers.
//
// Acceptance is LZ4_decompress_safe's strictest reading (lz4/block.rs's walk, rule for rule): a
// block decodes only if it is exactly `expected` bytes, every offset within the bytes written,
// and the end-of-block rules hold; so what lz4_flex rejects is an error here too. Every read of
// the input and write of the output is bounded by the lengths given; every turn of the loop
// consumes input, and a batch's copy rounds are at most its tokens, so the work is bounded by the
// input and output lengths.

#ifndef LZ4_HOST_SHIM
#define LZ4_LANES 32u
#define LZ4_LANE (threadIdx.x & 31u)
#define LZ4_SYNC() __syncwarp()
#define LZ4_FN __device__ __forceinline__
// i over [0, n), spread over the lanes of the warp: each lane's first i is its lane index.
#define LZ4_FOR_LANES(i, n) for (unsigned long long i = LZ4_LANE; i < (n); i += LZ4_LANES)
#define LZ4_SHARED __shared__
// Warps a thread block holds (decode.rs launches 128 threads), and this warp's index among them.
#define LZ4_WARPS 4u
#define LZ4_WARP (threadIdx.x >> 5)
#endif

// Statuses (0: decoded); the Rust side names them (lz4/decode.rs).
#define LZ4_OK 0u
#define LZ4_LITERALS_PAST_INPUT 1u
#define LZ4_BAD_OFFSET 2u
#define LZ4_PAST_CAPACITY 3u
#define LZ4_INPUT_ENDS 4u
#define LZ4_LENGTH_MISMATCH 5u
#define LZ4_END_RULES 6u

// A length whose nibble is 15 continues in the bytes at *ip (each added, until one is not 255).
// Returns 0 when the input ends first.
LZ4_FN int lz4_length(const unsigned char* in, unsigned long long n, unsigned long long* ip,
                      unsigned long long* len) {
    if (*len != 15) return 1;
    for (;;) {
        if (*ip >= n) return 0;
        const unsigned int b = in[*ip];
        *ip += 1;
        *len += b;
        if (b != 255) return 1;
    }
}

// Tokens parsed before their copies: a warp parses up to LZ4_BATCH tokens (every lane alike: the
// walk reads only the input, so it never waits on a copy), then copies their literals and matches
// with a lane per token where they are short, all lanes on one where long. A match may read the
// bytes of an earlier match of its batch: it copies in a later round than that one (rounds end in
// a __syncwarp; the first token not yet copied is always ready, so a batch takes at most
// LZ4_BATCH rounds). A lone lane walking token by token waited a device-memory round trip for
// each token's match before parsing the next (B1's streams: about 770 cycles a token).
#define LZ4_BATCH 32u
// Copies at least this long take the whole warp.
#define LZ4_LONG 64u

// A batch's tokens, per warp: where each one's literals are in the input, how many, where its
// output starts, its match's offset and length (0: literals only, the block's last token or one
// whose match is in error), and the copy rounds' state.
struct Lz4Batch {
    unsigned long long lit_at[LZ4_BATCH];
    unsigned long long lits[LZ4_BATCH];
    unsigned long long op[LZ4_BATCH];
    unsigned long long offset[LZ4_BATCH];
    unsigned long long matched[LZ4_BATCH];
    unsigned int deps[LZ4_BATCH];   // the earlier tokens of the batch whose match bytes it reads
    unsigned int done[LZ4_BATCH];   // its match copied (or none)
    unsigned int ready[LZ4_BATCH];  // copied in this round
};

// len bytes from src to dst, which starts `dist` bytes after src (dist >= 1): byte i repeats byte
// i % dist of the dist bytes before dst, all written before the copy, so every read is of a byte
// this copy does not write, and eight are read before they are written.
LZ4_FN void lz4_copy(unsigned char* dst, const unsigned char* src, unsigned long long len, unsigned long long dist) {
    if (dist >= len || dist >= 8) {
        unsigned long long i = 0;
        if (dist >= 8) {
            for (; i + 8 <= len; i += 8) {
                unsigned char t[8];
                for (unsigned int k = 0; k < 8; ++k) t[k] = src[i + k];
                for (unsigned int k = 0; k < 8; ++k) dst[i + k] = t[k];
            }
        }
        for (; i < len; ++i) dst[i] = src[i];
    } else {
        unsigned long long r = 0;
        for (unsigned long long i = 0; i < len; ++i) {
            dst[i] = src[r];
            r = r + 1 == dist ? 0 : r + 1;
        }
    }
}

// The tokens not yet done, as a mask (every lane alike).
LZ4_FN unsigned int lz4_pending(const Lz4Batch* t, unsigned int count) {
    unsigned int pending = 0;
    for (unsigned int j = 0; j < count; ++j) pending |= (t->done[j] ? 0u : 1u) << j;
    return pending;
}

// The batch's `count` tokens copied: literals first (they read only the input), then matches in
// rounds.
LZ4_FN void lz4_copy_batch(Lz4Batch* t, unsigned int count, const unsigned char* in, unsigned char* out) {
    LZ4_SYNC();  // the records, written by lane 0, seen by all
    LZ4_FOR_LANES(j, count) {
        if (t->lits[j] < LZ4_LONG) lz4_copy(out + t->op[j], in + t->lit_at[j], t->lits[j], ~0ull);
    }
    for (unsigned int j = 0; j < count; ++j) {
        if (t->lits[j] >= LZ4_LONG) {
            const unsigned char* src = in + t->lit_at[j];
            unsigned char* dst = out + t->op[j];
            LZ4_FOR_LANES(i, t->lits[j]) dst[i] = src[i];
        }
    }
    // Each match's sources before its own bytes, against the earlier matches' bytes.
    LZ4_FOR_LANES(j, count) {
        unsigned int deps = 0;
        const unsigned long long at = t->op[j] + t->lits[j];
        const unsigned long long from = at - t->offset[j];
        const unsigned long long to = from + t->matched[j] < at ? from + t->matched[j] : at;
        for (unsigned int k = 0; k < j && t->matched[j] > 0; ++k) {
            const unsigned long long k_at = t->op[k] + t->lits[k];
            if (t->matched[k] > 0 && k_at < to && k_at + t->matched[k] > from) deps |= 1u << k;
        }
        t->deps[j] = deps;
        t->done[j] = t->matched[j] == 0;
    }
    LZ4_SYNC();  // the literals written, the dependencies seen by all
    for (;;) {
        const unsigned int pending = lz4_pending(t, count);
        if (pending == 0) break;
        LZ4_FOR_LANES(j, count) t->ready[j] = ((pending >> j) & 1u) && (t->deps[j] & pending) == 0;
        LZ4_SYNC();
        LZ4_FOR_LANES(j, count) {
            if (t->ready[j] && t->matched[j] < LZ4_LONG) {
                unsigned char* dst = out + t->op[j] + t->lits[j];
                lz4_copy(dst, dst - t->offset[j], t->matched[j], t->offset[j]);
            }
        }
        for (unsigned int j = 0; j < count; ++j) {
            if (!t->ready[j] || t->matched[j] < LZ4_LONG) continue;
            unsigned char* dst = out + t->op[j] + t->lits[j];
            const unsigned long long offset = t->offset[j];
            const unsigned char* src = dst - offset;
            if (offset >= t->matched[j]) {
                LZ4_FOR_LANES(i, t->matched[j]) dst[i] = src[i];
            } else {
                // Byte i repeats byte i % offset of the `offset` bytes before the match, all
                // written before it, so every lane copies at once.
                const unsigned long long step = LZ4_LANES % offset;
                unsigned long long r = 0;
                LZ4_FOR_LANES(i, t->matched[j]) {
                    if (i < LZ4_LANES) r = i % offset;  // a lane's first byte
                    dst[i] = src[r];
                    r += step;
                    if (r >= offset) r -= offset;
                }
            }
        }
        LZ4_SYNC();  // this round's bytes seen by all, and its flags read before they change
        LZ4_FOR_LANES(j, count) {
            if (t->ready[j]) t->done[j] = 1;
        }
        LZ4_SYNC();
    }
}

// Decode the block in[0, n) into out[0, expected); *written: the bytes decoded before it ended
// (a token's literals count once they are checked, as LZ4_decompress_safe writes them before
// reading the match).
LZ4_FN unsigned int lz4_block(Lz4Batch* t, const unsigned char* in, unsigned long long n, unsigned char* out,
                              unsigned long long expected, unsigned long long* written) {
    unsigned long long ip = 0, op = 0;
    unsigned int status = LZ4_OK, end = 0;
    while (!end) {
        unsigned int count = 0;
        while (count < LZ4_BATCH) {
            if (ip >= n) { status = LZ4_INPUT_ENDS; end = 1; break; }  // empty input
            const unsigned int token = in[ip];
            ip += 1;
            unsigned long long literals = token >> 4;
            if (!lz4_length(in, n, &ip, &literals)) { status = LZ4_INPUT_ENDS; end = 1; break; }
            if (literals > n - ip) { status = LZ4_LITERALS_PAST_INPUT; end = 1; break; }
            if (literals > expected - op) { status = LZ4_PAST_CAPACITY; end = 1; break; }
            // The literals are the token's; its match is added once checked.
            if (LZ4_LANE == 0) {
                t->lit_at[count] = ip;
                t->lits[count] = literals;
                t->op[count] = op;
                t->offset[count] = 0;
                t->matched[count] = 0;
            }
            count += 1;
            ip += literals;
            op += literals;
            if (ip == n) { end = 1; break; }  // the last sequence: literals only
            // A match follows: it starts at least 12 bytes before the end, and at least 8 input
            // bytes follow the literals (the offset, a last token, 5 literals).
            if (expected - op < 12 || n - ip < 8) { status = LZ4_END_RULES; end = 1; break; }
            const unsigned long long offset = (unsigned long long)in[ip] | ((unsigned long long)in[ip + 1] << 8);
            ip += 2;
            if (offset == 0 || offset > op) { status = LZ4_BAD_OFFSET; end = 1; break; }
            unsigned long long matched = token & 15u;
            if (!lz4_length(in, n, &ip, &matched)) { status = LZ4_INPUT_ENDS; end = 1; break; }
            // An extension leaves at least 4 input bytes.
            if ((token & 15u) == 15u && n - ip < 4) { status = LZ4_END_RULES; end = 1; break; }
            matched += 4;
            if (matched > expected - op) { status = LZ4_PAST_CAPACITY; end = 1; break; }
            // The match ends at least 5 bytes before the end (the last 5 bytes are literals).
            if (expected - op - matched < 5) { status = LZ4_END_RULES; end = 1; break; }
            if (LZ4_LANE == 0) {
                t->offset[count - 1] = offset;
                t->matched[count - 1] = matched;
            }
            op += matched;
        }
        lz4_copy_batch(t, count, in, out);
    }
    if (status == LZ4_OK && op != expected) status = LZ4_LENGTH_MISMATCH;
    *written = op;
    return status;
}

// Block k of n: warp k of the grid (warps of consecutive threads). Its status and decoded length
// go to statuses[k] and decoded[k]; a failing status is or-ed with tags[k] where tags is not
// null (the caller's mark of which stream failed).
extern "C" __global__ void lz4_decode_blocks(const unsigned char* const* inputs,
                                             const unsigned long long* input_sizes,
                                             const unsigned long long* capacities, unsigned char* const* outputs,
                                             unsigned long long* decoded, unsigned int* statuses,
                                             const unsigned int* tags, unsigned long long n) {
    const unsigned long long k =
        ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    if (k >= n) return;  // the whole warp: k is the warp's
    LZ4_SHARED Lz4Batch batches[LZ4_WARPS];
    unsigned long long written = 0;
    unsigned int status =
        lz4_block(&batches[LZ4_WARP], inputs[k], input_sizes[k], outputs[k], capacities[k], &written);
    if (status != LZ4_OK && tags != 0) status |= tags[k];
    if (LZ4_LANE == 0) {
        statuses[k] = status;
        decoded[k] = written;
    }
}

// The names stay out of the sources compiled after this one.
#undef LZ4_FOR_LANES
#undef LZ4_BATCH
#undef LZ4_LONG
#undef LZ4_OK
#undef LZ4_LITERALS_PAST_INPUT
#undef LZ4_BAD_OFFSET
#undef LZ4_PAST_CAPACITY
#undef LZ4_INPUT_ENDS
#undef LZ4_LENGTH_MISMATCH
#undef LZ4_END_RULES
#ifndef LZ4_HOST_SHIM
#undef LZ4_LANES
#undef LZ4_LANE
#undef LZ4_SYNC
#undef LZ4_FN
#undef LZ4_SHARED
#undef LZ4_WARPS
#undef LZ4_WARP
#endif
