// LZ4 block decoder: one warp per block. Every lane parses the same token (the walk is uniform
// across the warp, so no shuffles); literal and match copies are spread over the lanes. The same
// text runs on the CPU (host_shim.cpp), where one lane does a warp's work: loops over lanes go
// through LZ4_FOR_LANES, so both run this very code. NVRTC compiles it with no standard headers.
//
// Acceptance is LZ4_decompress_safe's strictest reading (lz4/block.rs's walk, rule for rule): a
// block decodes only if it is exactly `expected` bytes, every offset within the bytes written,
// and the end-of-block rules hold; so what lz4_flex rejects is an error here too. Every read of
// the input and write of the output is bounded by the lengths given; every turn of the loop
// consumes input, so the work is bounded by the input and output lengths.

#ifndef LZ4_HOST_SHIM
#define LZ4_LANES 32u
#define LZ4_LANE (threadIdx.x & 31u)
#define LZ4_SYNC() __syncwarp()
#define LZ4_FN __device__ __forceinline__
// i over [0, n), spread over the lanes of the warp: each lane's first i is its lane index.
#define LZ4_FOR_LANES(i, n) for (unsigned long long i = LZ4_LANE; i < (n); i += LZ4_LANES)
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

// Decode the block in[0, n) into out[0, expected); *written: the bytes decoded before it ended.
LZ4_FN unsigned int lz4_block(const unsigned char* in, unsigned long long n, unsigned char* out,
                              unsigned long long expected, unsigned long long* written) {
    unsigned long long ip = 0, op = 0;
    unsigned int status = LZ4_OK;
    for (;;) {
        if (ip >= n) { status = LZ4_INPUT_ENDS; break; }  // empty input
        const unsigned int token = in[ip];
        ip += 1;
        unsigned long long literals = token >> 4;
        if (!lz4_length(in, n, &ip, &literals)) { status = LZ4_INPUT_ENDS; break; }
        if (literals > n - ip) { status = LZ4_LITERALS_PAST_INPUT; break; }
        if (literals > expected - op) { status = LZ4_PAST_CAPACITY; break; }
        {
            const unsigned char* src = in + ip;
            unsigned char* dst = out + op;
            LZ4_FOR_LANES(i, literals) dst[i] = src[i];
        }
        ip += literals;
        op += literals;
        if (ip == n) break;  // the last sequence: literals only
        // A match follows: it starts at least 12 bytes before the end, and at least 8 input
        // bytes follow the literals (the offset, a last token, 5 literals).
        if (expected - op < 12 || n - ip < 8) { status = LZ4_END_RULES; break; }
        const unsigned long long offset = (unsigned long long)in[ip] | ((unsigned long long)in[ip + 1] << 8);
        ip += 2;
        if (offset == 0 || offset > op) { status = LZ4_BAD_OFFSET; break; }
        unsigned long long matched = token & 15u;
        if (!lz4_length(in, n, &ip, &matched)) { status = LZ4_INPUT_ENDS; break; }
        // An extension leaves at least 4 input bytes.
        if ((token & 15u) == 15u && n - ip < 4) { status = LZ4_END_RULES; break; }
        matched += 4;
        if (matched > expected - op) { status = LZ4_PAST_CAPACITY; break; }
        // The match ends at least 5 bytes before the end (the last 5 bytes are literals).
        if (expected - op - matched < 5) { status = LZ4_END_RULES; break; }
        // The bytes the match reads, written by any lane, are seen by all.
        LZ4_SYNC();
        unsigned char* dst = out + op;
        const unsigned char* src = dst - offset;
        if (offset >= matched) {
            LZ4_FOR_LANES(i, matched) dst[i] = src[i];
        } else {
            // Overlapping: byte i repeats byte i % offset of the `offset` bytes before the match,
            // all written before it, so every lane copies at once, no rounds.
            const unsigned long long step = LZ4_LANES % offset;
            unsigned long long r = 0;
            LZ4_FOR_LANES(i, matched) {
                if (i < LZ4_LANES) r = i % offset;  // a lane's first byte
                dst[i] = src[r];
                r += step;
                if (r >= offset) r -= offset;
            }
        }
        op += matched;
    }
    LZ4_SYNC();
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
    unsigned long long written = 0;
    unsigned int status = lz4_block(inputs[k], input_sizes[k], outputs[k], capacities[k], &written);
    if (status != LZ4_OK && tags != 0) status |= tags[k];
    if (LZ4_LANE == 0) {
        statuses[k] = status;
        decoded[k] = written;
    }
}

// The names stay out of the sources compiled after this one.
#undef LZ4_FOR_LANES
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
#endif
