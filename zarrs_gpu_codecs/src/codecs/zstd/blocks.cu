// zstd frames decoded block by block side by side (compiled after entropy.cu and decode.cu,
// whose parts it uses; bytes.cu follows), in launches over a batch:
// 1. zstd_plan, one warp per frame (lane 0): walks the frame and block headers and writes a
//    plan of every block: where its parts lie, and for treeless literals and repeated tables
//    which earlier description is in effect (the only state a block takes from the blocks
//    before it, but for repeat offsets and the bytes its matches copy).
// 2. zstd_decode_blocks, one warp per block, all blocks of all frames at once: its literals into
//    scratch (four streams on four lanes), its three tables built on three lanes, then its
//    sequences decoded into records of (offset, literal length, match length): in a launch of
//    few blocks, lane 0 walks their state chain alone and a lane a span of them decodes it
//    whole (ZsSpans); in a launch of many, the warp leaves the block's tables in the scratch
//    (2 bytes a state) and zstd_sequence_lanes decodes its sequences on one lane, a few blocks a
//    thread block (a warp a block left 31 lanes idle). A repeat offset that reaches before the block stays
//    symbolic: "incoming repeat offset i, less d".
// 3. the frame's bytes (bytes.cu): each sequence's offset resolved from the repeat offsets its
//    block inherits; then every byte resolved by pointer jumps (batches of 64 MiB or less), or
//    each frame's sequences executed by a thread block, a round of 32 to 128 at a time.
// Scratch (sized by the host from the frames, decode.rs `BlockPlan`): frame plans, block
// plans, sequence records (12 bytes each), literals (those not stored raw), and, for a lane a
// block, each block's tables (ZS_TABLE_WORDS words).
//
// Every check of decode.cu is made by one of the three, so a frame is an error here wherever it
// is there (the first error in stream order is the one reported, as there).

#define ZS_NONE 0xFFFFFFFFu
// Words of a sequence record: offset (or how much less than an incoming repeat offset), literal
// length (and the repeat offset's tag in its top 2 bits), match length.
#define ZS_RECORD 3u
#ifdef ZS_HOST_SHIM
#define ZS_UNROLL
#else
#define ZS_UNROLL _Pragma("unroll")
#endif

// A frame's plan: its scratch slots and its first entry from the host, the rest from zstd_plan.
struct ZsFramePlan {
    zs_u64 lits_at;     // its literals' first byte in the literal scratch
    zs_u64 lit_slots;   // bytes there
    zs_u64 seqs_at;     // its first sequence record
    zs_u64 seq_slots;   // records there
    zs_u32 block_first; // its first block plan
    zs_u32 block_slots; // block plans there
    zs_u32 blocks;      // blocks walked whole (their plans valid)
    zs_u32 status;      // the walk's status after them (ZS_OK: the whole frame)
    zs_u32 block_max;   // the largest block the window allows
    zs_u32 unused;
    zs_u64 entries_at;  // (host) its first byte's entry, where the bytes are resolved by jumps
};

// A block's plan: zstd_plan writes the first part, zstd_decode_blocks the rest.
struct ZsBlockPlan {
    zs_u64 lits_at;        // its literals in the literal scratch (RLE and Huffman-coded)
    zs_u64 seqs_at;        // its first sequence record
    zs_u32 frame;          // its frame's index
    zs_u32 in_at;          // its body (after the 3-byte header) in the frame
    zs_u32 in_size;        // body bytes
    zs_u32 kind;           // 0 raw, 1 RLE, 2 compressed, ZS_NONE: an unused slot
    zs_u32 size;           // the header's size field
    zs_u32 huf_at;         // the Huffman tree description in effect (ZS_NONE: none)
    zs_u32 tab_at[3];      // each sequence table's description in effect
    zs_u32 tab_mode[3];    // and its mode (0 predefined, 1 RLE, 2 FSE)
    zs_u32 lit_slots;      // regenerated literals
    zs_u32 seq_slots;      // sequences
    // zstd_decode_blocks:
    zs_u32 status;
    zs_u32 out_size;       // bytes the block decodes to
    zs_u32 lit_in_at;      // raw literals' place in the frame (ZS_NONE: in the scratch)
    zs_u32 rep_tag;        // per repeat offset out (2 bits each): 0 a value, i + 1 incoming i less
    zs_u32 rep[3];         // the value, or how much less
    zs_u32 stream_at;      // (zstd_plan) its sequences bitstream in the frame
    zs_u32 lit_count;      // (its literals' decode) literals regenerated
    zs_u32 lit_taken;      // and the bytes their section takes
    // zstd_link:
    zs_u32 out_at;         // its first byte in the frame
    zs_u32 rin[3];         // the repeat offsets it starts with
};

// The repeat offsets after block p, from those it starts with (rep, updated in place); a value
// that would fall to 0 or below is a damaged frame (it was some sequence's offset).
ZS_FN zs_u32 zs_next_reps(const ZsBlockPlan* p, zs_u64* rep) {
    zs_u64 next[3];
    for (zs_u32 j = 0; j < 3; ++j) {
        const zs_u32 tag = (p->rep_tag >> (2 * j)) & 3;
        const zs_u64 v = p->rep[j];
        next[j] = tag == 0 ? v : (rep[tag - 1] > v ? rep[tag - 1] - v : 0);
        if (next[j] == 0) return ZS_BAD_SEQUENCE;
    }
    rep[0] = next[0];
    rep[1] = next[1];
    rep[2] = next[2];
    return ZS_OK;
}

// ---- 1. The plan --------------------------------------------------------------------------

// Lane 0: the frame in[0, n) of `capacity` bytes walked into its plan and its blocks' plans.
ZS_FN void zs_plan_frame(const zs_u8* in, zs_u64 n, zs_u64 capacity, zs_u32 index, ZsFramePlan* f,
                         ZsBlockPlan* blocks) {
    zs_u32 count = 0, status = ZS_OK, block_max = 0;
    zs_u64 lits = 0, seqs = 0;
    // The descriptions in effect: Huffman tree, and per sequence table (offset, mode).
    zs_u32 huf_at = ZS_NONE, tab_at[3] = {ZS_NONE, ZS_NONE, ZS_NONE}, tab_mode[3] = {0, 0, 0};
    zs_u32 tables_valid = 0;
    short norm[256];
    for (;;) {
        if (n == 0) {
            status = capacity == 0 ? ZS_OK : ZS_SIZE_MISMATCH;
            break;
        }
        zs_u64 ip = 0;
        zs_u32 checksum = 0;
        status = zs_frame_header(in, n, capacity, &ip, &block_max, &checksum);
        if (status != ZS_OK) break;
        // Block offsets are kept in 32 bits.
        if (n > 0xFFFFFFF0ull) {
            status = ZS_BAD_FRAME;
            break;
        }
        for (;;) {
            if (n - ip < 3) {
                status = ZS_TRUNCATED;
                break;
            }
            const zs_u32 bh = in[ip] | ((zs_u32)in[ip + 1] << 8) | ((zs_u32)in[ip + 2] << 16);
            ip += 3;
            const zs_u32 last = bh & 1, type = (bh >> 1) & 3, size = bh >> 3;
            if (type == 3) {
                status = ZS_BAD_BLOCK;
                break;
            }
            if (count >= f->block_slots) {
                status = ZS_BAD_BLOCK;  // more blocks than the host found: not the same bytes
                break;
            }
            ZsBlockPlan* p = &blocks[count];
            const zs_u64 body = type == 1 ? 1 : size;
            if (body > n - ip) {
                status = ZS_TRUNCATED;
                break;
            }
            if (type != 2 && size > block_max) {
                status = ZS_BAD_BLOCK;
                break;
            }
            p->frame = index;
            p->in_at = (zs_u32)ip;
            p->in_size = (zs_u32)body;
            p->kind = type;
            p->size = size;
            p->huf_at = ZS_NONE;
            p->lit_slots = 0;
            p->seq_slots = 0;
            p->lits_at = f->lits_at + lits;
            p->seqs_at = f->seqs_at + seqs;
            for (zs_u32 t = 0; t < 3; ++t) {
                p->tab_at[t] = ZS_NONE;
                p->tab_mode[t] = 0;
            }
            if (type == 2) {
                const zs_u8* blk = in + ip;
                const zs_u64 len = size;
                if (len < 2 || len > block_max) {
                    status = ZS_BAD_BLOCK;
                    break;
                }
                // The literals section: its size and regenerated size.
                zs_u32 kind = 0;
                zs_u64 head = 0, regenerated = 0, csize = 0;
                status = zs_literals_head(blk, len, &kind, &head, &regenerated, &csize);
                if (status != ZS_OK) break;
                const zs_u64 taken = head + csize;
                if (kind == 2) huf_at = (zs_u32)(ip + head);
                else if (kind == 3 && huf_at == ZS_NONE) {
                    status = ZS_BAD_HUFFMAN;
                    break;
                }
                if (kind >= 2) p->huf_at = huf_at;
                if (regenerated > block_max) {
                    status = ZS_BAD_LITERALS;
                    break;
                }
                if (taken > len) {
                    status = ZS_BAD_LITERALS;
                    break;
                }
                p->lit_slots = (zs_u32)regenerated;
                const zs_u64 scratch_lits = kind == 0 ? 0 : regenerated;
                if (scratch_lits > f->lit_slots - lits) {
                    status = ZS_BAD_LITERALS;  // more than the host found: not the same bytes
                    break;
                }
                lits += scratch_lits;
                // The sequences section: count, modes and the table descriptions.
                const zs_u8* seq = blk + taken;
                const zs_u64 seq_len = len - taken;
                zs_u64 nseq = 0, shead = 0;
                status = zs_sequence_count(seq, seq_len, &nseq, &shead);
                if (status != ZS_OK) break;
                if (nseq > f->seq_slots - seqs) {
                    status = ZS_BAD_SEQUENCES;  // more than the host found: not the same bytes
                    break;
                }
                p->seq_slots = (zs_u32)nseq;
                seqs += nseq;
                if (nseq > 0) {
                    if (shead >= seq_len) {
                        status = ZS_BAD_SEQUENCES;
                        break;
                    }
                    const zs_u32 modes = seq[shead];
                    if (modes & 3) {
                        status = ZS_BAD_SEQUENCES;
                        break;
                    }
                    zs_u64 pos = shead + 1;
                    for (zs_u32 t = 0; t < 3 && status == ZS_OK; ++t) {
                        const zs_u32 mode = (modes >> (6 - 2 * t)) & 3;
                        const zs_u32 at = (zs_u32)(ip + taken + pos);
                        if (mode == 0) {
                            tab_at[t] = ZS_NONE;
                            tab_mode[t] = 0;
                        } else if (mode == 1) {
                            if (pos >= seq_len) status = ZS_BAD_SEQUENCES;
                            tab_at[t] = at;
                            tab_mode[t] = 1;
                            pos += 1;
                        } else if (mode == 2) {
                            const zs_u32 max_symbol = t == 0 ? 35u : t == 1 ? 31u : 52u;
                            const zs_u32 max_log = t == 1 ? 8u : 9u;
                            zs_u32 symbols = 0, log = 0;
                            const zs_u64 bytes =
                                zs_read_counts(seq + pos, seq_len - pos, max_symbol, max_log, norm, &symbols, &log);
                            if (bytes == 0) status = ZS_BAD_SEQUENCES;
                            tab_at[t] = at;
                            tab_mode[t] = 2;
                            pos += bytes;
                        } else if (!tables_valid) {
                            status = ZS_BAD_SEQUENCES;
                        }
                        if (pos > seq_len) status = ZS_BAD_SEQUENCES;
                        p->tab_at[t] = tab_at[t];
                        p->tab_mode[t] = tab_mode[t];
                    }
                    if (status != ZS_OK) break;
                    tables_valid = 1;
                    p->stream_at = (zs_u32)(ip + taken + pos);
                }
            }
            count += 1;
            ip += body;
            if (last) break;
        }
        if (status != ZS_OK) break;
        if (checksum) {
            if (n - ip < 4) {
                status = ZS_TRUNCATED;
                break;
            }
            ip += 4;
        }
        if (ip != n) status = ZS_BAD_FRAME;  // bytes after the frame (another frame, or damage)
        break;
    }
    // Slots past the walk are unused.
    for (zs_u32 b = count; b < f->block_slots; ++b) {
        blocks[b].kind = ZS_NONE;
        blocks[b].frame = index;
    }
    f->blocks = count;
    f->status = status;
    f->block_max = block_max;
}

extern "C" __global__ void zstd_plan(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                                     const unsigned long long* capacities, ZsFramePlan* frames, ZsBlockPlan* blocks,
                                     unsigned long long n) {
    const unsigned long long k = blockIdx.x;
    if (k >= n || ZS_LANE != 0) return;
    ZsFramePlan* f = &frames[k];
    zs_plan_frame(inputs[k], input_sizes[k], capacities[k], (zs_u32)k, f, blocks + f->block_first);
}

// ---- 2. Each block's literals and sequences -----------------------------------------------

// A repeat offset while a block's sequences decode: a value (tag 0), or incoming repeat offset
// tag - 1 less the value.
#define ZS_REP(tag, value) (((zs_u64)(tag) << 32) | (zs_u64)(value))

// A block's sequences in spans. Their bitstream is one chain: each sequence's three states say
// how many bits it and the next one take, and no place in it lets a decoder start without the
// states before (benches/fse_resync.sh). So lane 0 first walks that chain alone (the states and
// the bit counts: a third of a sequence's work), noting the bits and states where each span of
// sequences starts; then a lane a span decodes its sequences whole from there, its repeat
// offsets relative to the span's start ("the span's incoming repeat offset i, less d", as a
// block's are to the block's); lane 0 links the spans' repeat offsets in order and each lane
// rewrites its records that hold span-relative ones. The checks on sums over the sequences
// (literals used, the block's size) are made on the spans' sums, and the first failing sequence
// in stream order gives the status, as one lane walking them all finds it. A launch of many
// blocks keeps one span a block: one lane walks it, no chain walked twice.
#define ZS_SPANS 32u     // spans a block at most: a lane each
#define ZS_SPAN_MIN 64u  // sequences a span at least

struct ZsSpans {
    zs_u32 left[ZS_SPANS];       // bits unread before the span's first sequence (the chain's walk)
    zs_u32 states[ZS_SPANS];     // the states then: literal length | offset << 10 | match length << 20
    zs_u32 lits[ZS_SPANS];       // literal lengths summed, before its first failing sequence
    zs_u32 matched[ZS_SPANS];    // match lengths summed, likewise
    zs_u32 bad[ZS_SPANS];        // its first failing sequence, ZS_NONE for none
    zs_u32 bad_bits[ZS_SPANS];   // that one's bits ran out
    zs_u32 symbolic[ZS_SPANS];   // the end of its records that may hold span-relative offsets
    zs_u32 fixed_bad[ZS_SPANS];  // its first record whose offset resolves to 0 or below
    zs_u32 out_left[ZS_SPANS];   // bits unread after its last sequence (a chain's link: the next
    zs_u32 out_states[ZS_SPANS]; // span's left and states), and the states then
    zs_u32 out_tag[ZS_SPANS][3], out_rep[ZS_SPANS][3];          // repeat offsets out, span-relative
    zs_u32 in_tag[ZS_SPANS + 1][3], in_rep[ZS_SPANS + 1][3];    // repeat offsets in, block-relative
    zs_u32 reach;          // spans the chain reached (bits ran out in the last, or none did)
    zs_u32 matched_total;  // every span's match lengths
    zs_u32 end_left;       // bits unread after the last sequence
    zs_u32 end_overflow;   // bits ran out
};
typedef char zs_spans_fit[sizeof(ZsSpans) <= 2 * sizeof(ZsFse) ? 1 : -1];

// Repeat offset r of a span (a value, or tag i + 1: the span's incoming i less the value) in
// terms of the block's, given the span's incoming ones (each a value, or the block's incoming
// one less a value): ~0 where it comes to 0 or below.
ZS_FN zs_u64 zs_rep_link(zs_u64 r, const zs_u32* in_tag, const zs_u32* in_rep) {
    const zs_u32 tag = (zs_u32)(r >> 32), d = (zs_u32)r;
    if (tag == 0) return r;
    const zs_u32 t = in_tag[tag - 1], v = in_rep[tag - 1];
    if (t != 0) return ZS_REP(t, v + d);
    return v > d ? (zs_u64)(v - d) : ~0ull;
}

// The low n (under 32: an offset code's extra bits, a length's, a sequence's state bits) bits
// of a word.
ZS_FN zs_u32 zs_low_bits(zs_u32 v, zs_u32 n) { return v & ((1u << n) - 1u); }

// A sequence's bits in stream order: its offset's (offset code 1 reads the one bit that picks
// a repeat offset, 0 none), its lengths', its state updates' (none after the last). Read from
// the window at once where it holds them all (one refill check a sequence: the branches are what
// a lone lane pays for).
ZS_FN void zs_sequence_bits(ZsBits* b, zs_u32 of_code, zs_u32 ext_bits, zs_u32 state_bits, zs_u32* v_off,
                            zs_u32* v_ext, zs_u32* v_st) {
    const zs_u32 need = of_code + ext_bits + state_bits;
    if (b->avail < need && b->at > 0) zs_bits_fill(b);
    if (need <= b->avail) {
        const zs_u64 w = b->word;
        zs_u32 at = b->avail - of_code;
        *v_off = zs_low_bits((zs_u32)(w >> (at & 63)), of_code);
        at -= ext_bits;
        *v_ext = (zs_u32)(w >> (at & 63)) & zs_mask(ext_bits);
        at -= state_bits;
        *v_st = zs_low_bits((zs_u32)(w >> (at & 63)), state_bits);
        b->avail = at;
    } else {
        // More than a window's bits (long offsets), or past the stream's start.
        zs_bits_ensure(b, 32);
        *v_off = zs_bits_read(b, of_code);
        zs_bits_ensure(b, 32);
        *v_ext = zs_bits_read(b, ext_bits);
        zs_bits_ensure(b, 32);
        *v_st = zs_bits_read(b, state_bits);
    }
}

// The three states after a sequence, from their entries' update fields and its state bits.
ZS_FN void zs_next_states(zs_u32 ll_hi, zs_u32 ml_hi, zs_u32 oe, zs_u32 v_st, zs_u32* ll_state, zs_u32* ml_state,
                          zs_u32* of_state) {
    const zs_u32 mb = ml_hi & 0xFF, ob = oe & 0xFF;
    *ll_state = (ll_hi >> 16) + (v_st >> (mb + ob));
    *ml_state = (ml_hi >> 16) + zs_low_bits(v_st >> ob, mb);
    *of_state = (oe >> 16) + zs_low_bits(v_st, ob);
}

// The chain's reader: only the state bits are read, each sequence's other bits skipped, from the
// two aligned 32-bit words at the bits' place (a funnel shift). The four words below the unread
// bits' top are loaded as a step starts, beside its table reads: a sequence takes at most
// ZS_SEQUENCE_BITS, so its state bits lie in two of them, selected in registers once the
// sequence's bits are known (a load there took half of run DX3's step). Bit a of the words is
// bit a - lead of the stream (lead: the bits of the first word before the stream's first byte).
// On the CPU the words are assembled from the stream's bytes, ones outside it 0xFF: a read that
// took any of those bits would show.
struct ZsChainBits {
    const zs_u8* p;
    zs_u32 len, lead;
};
// A sequence's bits at most: its offset code's (31 at most, as the offset table's build allows),
// its lengths' extra bits (16 each), its states' update bits (the tables' logs: 9, 9 and 8). So
// where the top unread bit is bit 32j + r of the words, the lowest is bit 32j + r + 1 - 89 or
// above: in word j - 3 or above.
#define ZS_SEQUENCE_BITS 89u

// Word i (at least 0, at most the last holding a byte of the stream).
ZS_FN zs_u32 zs_chain_word(const ZsChainBits* c, int i) {
#ifdef ZS_HOST_SHIM
    zs_u32 w = 0;
    for (zs_u32 k = 0; k < 4; ++k) {
        const long long at = 4ll * i + k - (long long)(c->lead / 8);
        w |= (zs_u32)(at >= 0 && at < (long long)c->len ? c->p[at] : 0xFFu) << (8 * k);
    }
    return w;
#else
    // The aligned words holding the stream's bytes lie within its input's allocation.
    const zs_u32* words = (const zs_u32*)((zs_u64)c->p & ~3ull);
    return __ldg(words + i);
#endif
}

// The words lo, hi at bit a, where bits [a, a + n) lie, shifted to bit 0.
ZS_FN zs_u32 zs_funnel(zs_u32 lo, zs_u32 hi, int a) {
#ifdef ZS_HOST_SHIM
    return (zs_u32)((((zs_u64)hi << 32) | lo) >> (a & 31));
#else
    return __funnelshift_r(lo, hi, (zs_u32)a & 31u);
#endif
}

// The reader of stream p of len bytes (len at least 1).
ZS_FN void zs_chain_bits_at(ZsChainBits* c, const zs_u8* p, zs_u32 len) {
    c->p = p;
    c->len = len;
    c->lead = 8u * (zs_u32)((zs_u64)p & 3u);
}

// The chain alone, from the states after the stream's first bits: each span's bits and states.
// It stops where the bits run out (the span it is in decodes to that point and fails there).
ZS_FN void zs_sequence_chain(const ZsBits* b, const zs_u64* ll_t, const zs_u64* ml_t, const zs_u32* of_t,
                             zs_u32 n_seq, zs_u32 span, zs_u32 spans, zs_u32 ll_state, zs_u32 of_state,
                             zs_u32 ml_state, ZsSpans* sp) {
    zs_u32 reach = 0;
    const zs_u32 left = zs_bits_left(b);
    ZsChainBits c;
    zs_chain_bits_at(&c, b->p, b->len);
    int a = (int)(c.lead + left);  // the unread bits' top, in the words (under 2^24)
    for (zs_u32 k0 = 0; k0 < n_seq; k0 += span) {
        sp->left[reach] = (zs_u32)a - c.lead;
        sp->states[reach] = ll_state | (of_state << 10) | (ml_state << 20);
        ++reach;
        if (spans == 1) break;  // one span: its lane walks the chain itself
        const zs_u32 k1 = n_seq - k0 < span ? n_seq : k0 + span;
        for (zs_u32 k = k0; k < k1; ++k) {
            // The words of the top unread bit (j) and the three below (word 0 for none: not
            // taken, the bits below a lying within the stream).
            const int j = (a - 1) >> 5;
            const zs_u32 w0 = zs_chain_word(&c, j < 0 ? 0 : j), w1 = zs_chain_word(&c, j < 1 ? 0 : j - 1),
                         w2 = zs_chain_word(&c, j < 2 ? 0 : j - 2), w3 = zs_chain_word(&c, j < 3 ? 0 : j - 3);
            const zs_u32 ll_hi = (zs_u32)(ll_t[ll_state] >> 32), ml_hi = (zs_u32)(ml_t[ml_state] >> 32);
            const zs_u32 oe = of_t[of_state];
            // The entries' low bytes summed: the state bits; their second bytes: the extra bits.
            const zs_u32 sum = ll_hi + ml_hi + oe;
            const zs_u32 state_bits = sum & (k + 1 < n_seq ? 0xFFu : 0u);
            const zs_u32 need = ((sum >> 8) & 0xFF) + state_bits;
            // Bits run out: this sequence's span's lane fails on them. (More than a sequence's
            // bits: never, as its tables are built; the words are not read below the four.) The
            // step is finished first, its states then dropped, so that it is one run of
            // instructions: its word loads issued with its table reads, not after the check.
            const bool out = need > (zs_u32)a - c.lead || need > ZS_SEQUENCE_BITS;
            a -= (int)need;
            // The state bits are the lowest of the sequence's: [a, a + state_bits), within words
            // i and i + 1 (within i alone where i is j), i from j - 3 to j.
            const int i = a >> 5;
            const zs_u32 lo = i == j ? w0 : i == j - 1 ? w1 : i == j - 2 ? w2 : w3;
            const zs_u32 hi = i == j - 1 ? w0 : i == j - 2 ? w1 : i == j - 3 ? w2 : w0;
            const zs_u32 v_st = zs_low_bits(zs_funnel(lo, hi, a), state_bits);
            zs_next_states(ll_hi, ml_hi, oe, v_st, &ll_state, &ml_state, &of_state);
            if (out) {
                sp->reach = reach;
                return;
            }
        }
    }
    sp->reach = reach;
}

// A block's chain as the host walked it (`chain.rs`: the spans, then each span's bits left and
// states), taken where it has the spans this walk would note, each span's bits at most the one's
// before and its states within the tables; span 0 is lane 0's own reading (left, states). Else 0:
// lane 0 walks the chain itself. What the spans then decode is checked link by link
// (zs_spans_status).
#define ZS_CHAIN_WORDS (1u + 2u * ZS_SPANS)
ZS_FN zs_u32 zs_host_chain(const zs_u32* hc, zs_u32 left, zs_u32 states, zs_u32 reach, zs_u32 ll_log, zs_u32 of_log,
                           zs_u32 ml_log, ZsSpans* sp) {
    if (hc[0] != reach || reach > ZS_SPANS) return 0;
    sp->left[0] = left;
    sp->states[0] = states;
    for (zs_u32 j = 1; j < reach; ++j) {
        const zs_u32 l = hc[1 + j], st = hc[1 + ZS_SPANS + j];
        if (l > sp->left[j - 1] || (st & 0x3FF) >> ll_log || ((st >> 10) & 0x3FF) >> of_log || (st >> 20) >> ml_log)
            return 0;
        sp->left[j] = l;
        sp->states[j] = st;
    }
    sp->reach = reach;
    return 1;
}

// What the decode of a run of sequences leaves: its sums, its first failing sequence, its
// repeat offsets out (relative to the run's start) and where its bits and states end.
struct ZsRunEnd {
    zs_u32 lits;      // literal lengths summed, before its first failing sequence
    zs_u32 matched;   // match lengths summed, likewise
    zs_u32 bad;       // its first failing sequence, ZS_NONE for none
    zs_u32 bad_bits;  // that one's bits ran out
    zs_u32 symbolic;  // the end of its records that may hold run-relative offsets
    zs_u32 left;      // bits unread after its last sequence
    zs_u32 states;    // the states then
    zs_u32 overflow;  // bits ran out
    zs_u64 rep[3];    // repeat offsets out (ZS_REP)
};

// A block's decoding tables as a warp a block packs them in its shared memory: a literal or
// match length state's entry of 8 bytes (the code's baseline; its state's bits, the code's extra
// bits, its state's base, a byte each but the base, 16 bits), an offset state's of 4 (its state's
// bits, the code (its extra bits), base): the three high words summed hold a sequence's state
// bits in their low byte and its other bits in the next.
struct ZsWideTables {
    const zs_u64* ll;
    const zs_u64* ml;
    const zs_u32* of;
};

// The same for a lane a block, 2 bytes a state so that a thread block's lanes' tables fit its
// shared memory (80 lanes an H100 multiprocessor, where 4 bytes a state held 40): a state's entry
// is its symbol (the code, 6 bits) and the symbol's counter x at it (10 bits: the table's build,
// entropy.cu zs_state), from which its update's bits (log - highbit(x)) and base ((x << bits) -
// 2^log) follow; the code's baseline and extra bits from a table of the thread block's (codes:
// baseline | extra << 24, 64 codes each for literal and match lengths).
struct ZsCompactTables {
    const zs_u16* ll;
    const zs_u16* ml;
    const zs_u16* of;
    const zs_u32* ll_codes;
    const zs_u32* ml_codes;
    zs_u32 ll_log, of_log, ml_log;
};

// The highest set bit of x (0 for 0 and 1): one instruction on the device where zs_highbit loops.
ZS_FN zs_u32 zs_top_bit(zs_u32 x) {
#ifdef ZS_HOST_SHIM
    return zs_highbit(x);
#else
    return 31u - (zs_u32)__clz(x | 1u);
#endif
}

// A compact entry's state update as the wide entries hold it: bits | base << 16.
ZS_FN zs_u32 zs_compact_update(zs_u32 e, zs_u32 log) {
    const zs_u32 x = e >> 6, nb = log - zs_top_bit(x);
    return nb | (((x << nb) - (1u << log)) << 16);
}

// A length state's entry of either: the code's baseline, and the rest as the wide entry's high
// word has it (bits | extra << 8 | base << 16); an offset state's (bits | code << 8 | base << 16).
ZS_FN void zs_ll_entry(const ZsWideTables& t, zs_u32 state, zs_u32* base, zs_u32* hi) {
    const zs_u64 e = t.ll[state];
    *base = (zs_u32)e;
    *hi = (zs_u32)(e >> 32);
}
ZS_FN void zs_ml_entry(const ZsWideTables& t, zs_u32 state, zs_u32* base, zs_u32* hi) {
    const zs_u64 e = t.ml[state];
    *base = (zs_u32)e;
    *hi = (zs_u32)(e >> 32);
}
ZS_FN zs_u32 zs_of_entry(const ZsWideTables& t, zs_u32 state) { return t.of[state]; }

ZS_FN void zs_compact_length(zs_u32 e, zs_u32 log, const zs_u32* codes, zs_u32* base, zs_u32* hi) {
    const zs_u32 c = codes[e & 63];
    *base = c & 0xFFFFFFu;
    *hi = zs_compact_update(e, log) | ((c >> 24) << 8);
}
ZS_FN void zs_ll_entry(const ZsCompactTables& t, zs_u32 state, zs_u32* base, zs_u32* hi) {
    zs_compact_length(t.ll[state], t.ll_log, t.ll_codes, base, hi);
}
ZS_FN void zs_ml_entry(const ZsCompactTables& t, zs_u32 state, zs_u32* base, zs_u32* hi) {
    zs_compact_length(t.ml[state], t.ml_log, t.ml_codes, base, hi);
}
ZS_FN zs_u32 zs_of_entry(const ZsCompactTables& t, zs_u32 state) {
    const zs_u32 e = t.of[state], u = zs_compact_update(e, t.of_log);
    return (u & 0xFFu) | ((e & 63) << 8) | (u & 0xFFFF0000u);
}

// Sequences [k0, k1) of a block's n_seq decoded whole into their records, from the stream's
// bits (`left` unread) and states where the run starts; the checks on sums within the run.
template <class Tables>
ZS_FN void zs_sequence_run(const zs_u8* stream, zs_u32 stream_len, zs_u32 left, zs_u32 states, const Tables& t,
                           zs_u32 n_seq, zs_u32 k0, zs_u32 k1, zs_u32 lits_n, zs_u32 block_max, zs_u32* rec,
                           ZsRunEnd* e) {
    ZsBits b;
    zs_bits_at(&b, stream, stream_len, left);
    zs_u32 ll_state = states & 0x3FF, of_state = (states >> 10) & 0x3FF, ml_state = states >> 20;
    zs_u32 lp = 0, matched = 0, bad_at = ZS_NONE, symbolic = k0;
    zs_u64 r0 = ZS_REP(1, 0), r1 = ZS_REP(2, 0), r2 = ZS_REP(3, 0);
    e->bad_bits = 0;
    for (zs_u32 k = k0; k < k1; ++k) {
        zs_u32 ll_base, ll_hi, ml_base, ml_hi;
        zs_ll_entry(t, ll_state, &ll_base, &ll_hi);
        zs_ml_entry(t, ml_state, &ml_base, &ml_hi);
        const zs_u32 oe = zs_of_entry(t, of_state);
        const zs_u32 of_code = (oe >> 8) & 0xFF;
        const zs_u32 ll_bits = (ll_hi >> 8) & 0xFF, ml_bits = (ml_hi >> 8) & 0xFF;
        const zs_u32 state_bits = (ll_hi + ml_hi + oe) & (k + 1 < n_seq ? 0xFFu : 0u);
        zs_u32 v_off, v_ext, v_st;
        zs_sequence_bits(&b, of_code, ml_bits + ll_bits, state_bits, &v_off, &v_ext, &v_st);
        // Literal length code 0 is the only one of baseline 0.
        const zs_u32 ll0 = ll_base == 0;
        zs_u64 offset;
        zs_u32 bad = b.overflow;
        if (of_code > 1) {
            offset = (1ull << of_code) + v_off - 3;
            r2 = r1;
            r1 = r0;
            r0 = offset;
        } else if (of_code == 0) {
            offset = ll0 ? r1 : r0;
            r1 = ll0 ? r0 : r1;
            r0 = offset;
        } else {
            const zs_u32 index = 1 + ll0 + v_off;
            // Repeat offset 1 less one: a value less one, or one more less.
            const zs_u64 minus = (r0 >> 32) ? r0 + 1 : r0 - 1;
            offset = index == 3 ? minus : index == 2 ? r2 : r1;
            bad |= offset == 0;
            r2 = index != 1 ? r1 : r2;
            r1 = r0;
            r0 = offset;
        }
        const zs_u32 ml = ml_base + (v_ext >> ll_bits);
        const zs_u32 ll = ll_base + zs_low_bits(v_ext, ll_bits);
        zs_next_states(ll_hi, ml_hi, oe, v_st, &ll_state, &ml_state, &of_state);
        // Literals within the block's; the block within block_max (each length under 2^18: no
        // wrap). Sums within the run here; a split block's runs' sums are checked when they are
        // linked.
        bad |= (ll > lits_n - lp) | (ml > block_max) | (lits_n + matched + ml > block_max);
        if (bad) {
            bad_at = k;
            e->bad_bits = b.overflow;
            break;
        }
        zs_u32* r = rec + ZS_RECORD * k;
        r[0] = (zs_u32)offset;
        r[1] = ll | (zs_u32)((offset >> 32) << 30);
        r[2] = ml;
        if (offset >> 32) symbolic = k + 1;
        lp += ll;
        matched += ml;
    }
    e->bad = bad_at;
    e->lits = lp;
    e->matched = matched;
    e->symbolic = symbolic;
    e->rep[0] = r0;
    e->rep[1] = r1;
    e->rep[2] = r2;
    e->left = zs_bits_left(&b);
    e->overflow = b.overflow;
    e->states = ll_state | (of_state << 10) | (ml_state << 20);
}

// Span j's sequences decoded whole into their records, from its bits and states; its sums, its
// repeat offsets out and its first failing sequence into sp (checks on sums: within the span).
ZS_FN void zs_sequence_span(const zs_u8* stream, zs_u32 stream_len, const zs_u64* ll_t, const zs_u64* ml_t,
                            const zs_u32* of_t, zs_u32 n_seq, zs_u32 j, zs_u32 span, zs_u32 lits_n, zs_u32 block_max,
                            zs_u32* rec, ZsSpans* sp) {
    const zs_u32 k0 = j * span, k1 = n_seq - k0 < span ? n_seq : k0 + span;
    ZsRunEnd e;
    const ZsWideTables t = {ll_t, ml_t, of_t};
    zs_sequence_run(stream, stream_len, sp->left[j], sp->states[j], t, n_seq, k0, k1, lits_n, block_max, rec, &e);
    sp->bad[j] = e.bad;
    sp->bad_bits[j] = e.bad_bits;
    sp->lits[j] = e.lits;
    sp->matched[j] = e.matched;
    sp->symbolic[j] = e.symbolic;
    for (zs_u32 i = 0; i < 3; ++i) {
        sp->out_tag[j][i] = (zs_u32)(e.rep[i] >> 32);
        sp->out_rep[j][i] = (zs_u32)e.rep[i];
    }
    sp->out_left[j] = e.left;
    sp->out_states[j] = e.states;
    if (k1 == n_seq) {
        sp->end_left = e.left;
        sp->end_overflow = e.overflow;
    }
}

// Lane 0: each span's incoming repeat offsets in the block's terms, from the one before it.
ZS_FN void zs_spans_link(ZsSpans* sp, zs_u32 reach) {
    for (zs_u32 i = 0; i < 3; ++i) {
        sp->in_tag[0][i] = i + 1;
        sp->in_rep[0][i] = 0;
    }
    for (zs_u32 j = 0; j < reach; ++j) {
        for (zs_u32 i = 0; i < 3; ++i) {
            // A link to 0 or below is some record's offset, which the span's fix finds.
            const zs_u64 r = zs_rep_link(ZS_REP(sp->out_tag[j][i], sp->out_rep[j][i]), sp->in_tag[j], sp->in_rep[j]);
            sp->in_tag[j + 1][i] = r == ~0ull ? 0u : (zs_u32)(r >> 32);
            sp->in_rep[j + 1][i] = r == ~0ull ? 1u : (zs_u32)r;
        }
    }
}

// Span j's records that hold span-relative offsets, rewritten in the block's terms (the first
// span's are already); the first that comes to 0 or below noted.
ZS_FN void zs_span_fix(zs_u32* rec, zs_u32 j, zs_u32 span, ZsSpans* sp) {
    zs_u32 fixed_bad = ZS_NONE;
    const zs_u32 end = sp->symbolic[j] < sp->bad[j] ? sp->symbolic[j] : sp->bad[j];
    for (zs_u32 k = j * span; j > 0 && k < end; ++k) {
        zs_u32* r = rec + ZS_RECORD * k;
        const zs_u32 tag = r[1] >> 30;
        if (tag == 0) continue;
        const zs_u64 v = zs_rep_link(ZS_REP(tag, r[0]), sp->in_tag[j], sp->in_rep[j]);
        if (v == ~0ull) {
            fixed_bad = k;
            break;
        }
        r[0] = (zs_u32)v;
        r[1] = (r[1] & 0x3FFFFFFFu) | ((zs_u32)(v >> 32) << 30);
    }
    sp->fixed_bad[j] = fixed_bad;
}

// Lane 0: the block's status from its spans, as the one-lane walk finds it: the first failing
// sequence in stream order (its bits ran out: a bad stream; else a bad sequence), then the
// stream's end.
ZS_FN zs_u32 zs_spans_status(const zs_u32* rec, zs_u32 reach, zs_u32 span, zs_u32 n_seq, zs_u32 lits_n,
                             zs_u32 block_max, ZsSpans* sp) {
    zs_u32 lp = 0, matched = 0;  // before span j (at most 32 spans of sums each at most 2^17)
    for (zs_u32 j = 0; j < reach; ++j) {
        zs_u32 first = sp->fixed_bad[j] < sp->bad[j] ? sp->fixed_bad[j] : sp->bad[j];
        if (lp + sp->lits[j] > lits_n || lits_n + matched + sp->matched[j] > block_max) {
            // A sum over the spans fails within this one: at the first record past it.
            zs_u32 l = lp, m = matched;
            const zs_u32 k0 = j * span, k_end = n_seq - k0 < span ? n_seq : k0 + span;
            const zs_u32 k1 = sp->bad[j] < k_end ? sp->bad[j] : k_end;
            for (zs_u32 k = k0; k < k1 && k < first; ++k) {
                l += rec[ZS_RECORD * k + 1] & 0x3FFFFFFFu;
                m += rec[ZS_RECORD * k + 2];
                if (l > lits_n || lits_n + m > block_max) {
                    first = k;
                    break;
                }
            }
        }
        if (first != ZS_NONE) return first == sp->bad[j] && sp->bad_bits[j] ? ZS_BAD_SEQUENCE_STREAM : ZS_BAD_SEQUENCE;
        // The next span starts where this one ended (so where the chain's walk put it: a chain
        // from the host that did not is an error, not bytes).
        if (j + 1 < reach && (sp->out_left[j] != sp->left[j + 1] || sp->out_states[j] != sp->states[j + 1]))
            return ZS_BAD_SEQUENCE_STREAM;
        lp += sp->lits[j];
        matched += sp->matched[j];
    }
    sp->matched_total = matched;
    return sp->end_overflow || sp->end_left != 0 ? ZS_BAD_SEQUENCE_STREAM : ZS_OK;
}

// A block's sequence tables in a launch of a lane a block (zstd_sequence_lanes), in 32-bit
// words of two entries (ZsCompactTables): literal length entries (512 at most), match length
// entries (likewise), offset entries (256), then the three logs (literal length | offset << 4 |
// match length << 8), 2,576 bytes in all (decode.rs TABLE_BYTES).
#define ZS_TABLE_ML 256u
#define ZS_TABLE_OF 512u
#define ZS_TABLE_LOGS 640u
#define ZS_TABLE_WORDS 644u

// Where entry i of a block's three tables, one after another (ll_n literal length entries, then
// ml_n match length, then offset), lies in its region, in 2-byte units.
ZS_FN zs_u32 zs_table_half_at(zs_u32 i, zs_u32 ll_n, zs_u32 ml_n) {
    return i < ll_n ? i : i < ll_n + ml_n ? 2 * ZS_TABLE_ML + (i - ll_n) : 2 * ZS_TABLE_OF + (i - ll_n - ml_n);
}

// Block p's literals into the scratch (the first part of its decode, which a launch of its own
// may run while the host walks the chains): their count and the bytes their section takes into
// p, for the rest (zs_block_sequences); its status.
ZS_FN zs_u32 zs_block_literals(ZsShared* sh, const zs_u8* in, zs_u32 block_max, ZsBlockPlan* p, zs_u8* lit_scratch) {
    const zs_u8* blk = in + p->in_at;
    const zs_u64 len = p->in_size;
    // Treeless literals: the tree of an earlier block, rebuilt here.
    sh->huf_valid = 0;
    if ((blk[0] & 3) == 3) {
        if (ZS_LANE == 0) sh->value = zs_huffman_tree(sh, in + p->huf_at, p->in_at - p->huf_at);
        ZS_SYNC();
        const zs_u64 tree = sh->value;
        ZS_SYNC();
        if (tree == 0) return ZS_BAD_HUFFMAN;
        zs_huffman_fill(sh);
        sh->huf_valid = 1;
    }
    const zs_u8* lits = 0;
    zs_u64 lit_count = 0, taken = 0;
    const zs_u32 status = zs_literals(sh, blk, len, lit_scratch + p->lits_at, 0, p->lit_slots, block_max, &lits,
                                      &lit_count, &taken);
    if (status != ZS_OK) return status;
    if (ZS_LANE == 0) {
        p->lit_in_at = (blk[0] & 3) == 0 ? (zs_u32)(lits - in) : ZS_NONE;
        // (Both within the block: at most its 128 KiB.)
        p->lit_count = (zs_u32)lit_count;
        p->lit_taken = (zs_u32)taken;
    }
    ZS_SYNC();
    return ZS_OK;
}

// Where a block's table builds keep their numbers in the Huffman table's words: the symbols'
// counters (256 words), the spread's (ZsSpread), the counts (256 shorts).
#define ZS_SPREAD_AT 256u
#define ZS_NORM_AT 400u
typedef char zs_spread_fits[4 * ZS_SPREAD_AT + sizeof(ZsSpread) <= 4 * ZS_NORM_AT &&
                                    4 * ZS_NORM_AT + 2 * 256 <= sizeof(((ZsShared*)0)->huf_area)
                                ? 1
                                : -1];

// Block p's sequences into records, after its literals (zs_block_literals, whose count and
// section p holds); its status, size and repeat offsets into p.
ZS_FN zs_u32 zs_block_sequences(ZsShared* sh, const zs_u8* in, zs_u32 block_max, ZsBlockPlan* p,
                                 zs_u32* seq_scratch, zs_u32 split, const zs_u32* host_chain, zs_u32* packed_out) {
    const zs_u8* blk = in + p->in_at;
    const zs_u64 len = p->in_size;
    const zs_u64 lit_count = p->lit_count, taken = p->lit_taken;
    zs_u32 status = ZS_OK;
    const zs_u8* seq = blk + taken;
    const zs_u64 seq_len = len - taken;
    zs_u64 count = 0, head = 0;
    status = zs_sequence_count(seq, seq_len, &count, &head);
    if (status != ZS_OK) return status;
    const zs_u64 least = lit_count + 3 * count;
    if (least > block_max) return ZS_BAD_SEQUENCES;
    if (ZS_LANE == 0) {
        p->rep_tag = 1 | (2 << 2) | (3 << 4);
        p->rep[0] = p->rep[1] = p->rep[2] = 0;
        p->out_size = (zs_u32)lit_count;
    }
    if (count == 0) return head == seq_len ? ZS_OK : ZS_BAD_SEQUENCES;
    // The three tables from the descriptions in effect, one after another: each one's counts
    // read by lane 0, its symbols spread and its states' bits and bases made by the warp (three
    // lanes building a table each took 194,000 cycles a Z2 block, run DT1; lane 0 spreading was
    // most of the rest, DX3), their counters and the spread's numbers where the Huffman table
    // was (read no more; the packed tables take it after).
    ZsFse* tables[3] = {&sh->ll, &sh->of, &sh->ml};
    zs_u32* next = sh->huf_area;
    ZsSpread* spread = (ZsSpread*)(void*)(sh->huf_area + ZS_SPREAD_AT);
    short* norm = (short*)(void*)(sh->huf_area + ZS_NORM_AT);
    zs_u32 built = 1;
    for (zs_u32 t = 0; t < 3; ++t) {
        const zs_u32 at = p->tab_at[t];
        const zs_u32 mode = p->tab_mode[t];
        if (ZS_LANE == 0) {
            zs_u32 symbols = 0;
            const zs_u64 used = zs_sequence_counts(tables[t], t, mode, at == ZS_NONE ? in : in + at,
                                                   at == ZS_NONE ? 0 : p->in_at + p->in_size - at, 1, norm, &symbols);
            if (used != ~0ull && (mode == 0 || mode == 2))
                zs_spread_prepare(norm, symbols, tables[t]->log, tables[t]->symbol, next, spread);
            sh->stream_status[t] = used != ~0ull;
        }
        ZS_SYNC();
        const zs_u32 ok = sh->stream_status[t];
        const zs_u32 log = tables[t]->log;
        ZS_SYNC();
        built &= ok;
        if (ok && (mode == 0 || mode == 2)) {
            zs_spread_states(spread, log, tables[t]->symbol);
            ZS_SYNC();
            zs_fill_states(log, tables[t]->symbol, tables[t]->bits, tables[t]->base, next);
        }
        ZS_SYNC();
    }
    if (!built) return ZS_BAD_SEQUENCES;
    // A launch of a lane a block: the tables to the block's region, 2 bytes a state
    // (ZsCompactTables: code | x << 6, the state's counter x = (base + 2^log) >> bits, exactly
    // as zs_state made them), for zstd_sequence_lanes.
    if (packed_out != 0) {
        zs_u16* half = (zs_u16*)packed_out;
        const zs_u32 ll_n = 1u << sh->ll.log, ml_n = 1u << sh->ml.log, of_n = 1u << sh->of.log;
        ZS_FOR_LANES(i, ll_n + ml_n + of_n) {
            const zs_u32 which = i < ll_n ? 0u : i < ll_n + ml_n ? 1u : 2u;
            const ZsFse* f = which == 0 ? &sh->ll : which == 1 ? &sh->ml : &sh->of;
            const zs_u32 u = (zs_u32)(which == 0 ? i : which == 1 ? i - ll_n : i - ll_n - ml_n);
            const zs_u32 x = ((zs_u32)f->base[u] + (1u << f->log)) >> f->bits[u];
            half[zs_table_half_at((zs_u32)i, ll_n, ml_n)] = (zs_u16)(f->symbol[u] | (x << 6));
        }
        if (ZS_LANE == 0) packed_out[ZS_TABLE_LOGS] = sh->ll.log | (sh->of.log << 4) | (sh->ml.log << 8);
        ZS_SYNC();
        return ZS_PENDING;
    }
    // One read a state: literal and match length entries of 8 bytes (the code's baseline; the
    // update's bits, the code's extra bits, the update's base) where the Huffman table was,
    // offset entries of 4 (update bits, code, update base) where the literal length table was
    // built, once that is packed.
    zs_u64* ll_t = (zs_u64*)sh->huf_area;
    zs_u64* ml_t = ll_t + 512;
    zs_u32* of_t = (zs_u32*)sh->ll.base;
    const zs_u32 ll_log = sh->ll.log, of_log = sh->of.log, ml_log = sh->ml.log;
    ZS_FOR_LANES(i, 1024) {
        const ZsFse* t = i < 512 ? &sh->ll : &sh->ml;
        const zs_u32 u = (zs_u32)(i < 512 ? i : i - 512);
        if (u < (1u << t->log)) {
            zs_u32 base, extra;
            if (i < 512) zs_ll(t->symbol[u], &base, &extra);
            else zs_ml(t->symbol[u], &base, &extra);
            ll_t[i] = base | ((zs_u64)t->bits[u] << 32) | ((zs_u64)extra << 40) | ((zs_u64)t->base[u] << 48);
        }
    }
    ZS_SYNC();
    // (The offset table's own arrays are read here, its entries written where the literal
    // length table's were: 1 KiB within its 2.)
    ZS_FOR_LANES(u, 256) {
        const zs_u32 v = u < (1u << of_log) ? sh->of.bits[u] | ((zs_u32)sh->of.symbol[u] << 8) | ((zs_u32)sh->of.base[u] << 16) : 0;
        ZS_SYNC();
        of_t[u] = v;
    }
    ZS_SYNC();
    // The spans (in the offset and match length tables' place: packed, those are read no more).
    ZsSpans* sp = (ZsSpans*)(void*)&sh->of;
    const zs_u32 n_seq = (zs_u32)count, lits_n = (zs_u32)lit_count;
    const zs_u32 stream_len = p->stream_at > p->in_at + len ? 0u : (zs_u32)(p->in_at + len - p->stream_at);
    const zs_u8* stream = in + p->stream_at;
    const zs_u32 want = n_seq / ZS_SPAN_MIN;  // split: at most ZS_SPANS
    const zs_u32 spans = want < 1 ? 1u : want < split ? want : split < 1 ? 1u : split;
    const zs_u32 span = (n_seq + spans - 1) / spans;
    if (ZS_LANE == 0) {
        ZsBits b;
        sp->reach = 0;
        sp->end_left = 0;
        sp->end_overflow = 1;  // until the last span's lane says
        if (stream_len == 0 || !zs_bits_init(&b, stream, stream_len)) {
            sh->status = ZS_BAD_SEQUENCE_STREAM;
        } else {
            zs_bits_ensure(&b, 32);
            const zs_u32 ll_state = zs_bits_read(&b, ll_log);
            const zs_u32 of_state = zs_bits_read(&b, of_log);
            zs_bits_ensure(&b, 32);
            const zs_u32 ml_state = zs_bits_read(&b, ml_log);
            // Bits ran out before the first sequence: that sequence fails on them.
            sh->status = b.overflow ? ZS_BAD_SEQUENCE_STREAM : ZS_OK;
            const zs_u32 states = ll_state | (of_state << 10) | (ml_state << 20);
            const zs_u32 taken = !b.overflow && spans > 1 && host_chain != 0 &&
                                 zs_host_chain(host_chain, zs_bits_left(&b), states, (n_seq + span - 1) / span, ll_log,
                                               of_log, ml_log, sp);
            if (!b.overflow && !taken)
                zs_sequence_chain(&b, ll_t, ml_t, of_t, n_seq, span, spans, ll_state, of_state, ml_state, sp);
        }
    }
    ZS_SYNC();
    const zs_u32 reach = sp->reach;
    zs_u32* rec = seq_scratch + ZS_RECORD * p->seqs_at;
    ZS_FOR_LANES(j, reach) {
        zs_sequence_span(stream, stream_len, ll_t, ml_t, of_t, n_seq, (zs_u32)j, span, lits_n, block_max, rec, sp);
    }
    ZS_SYNC();
    if (ZS_LANE == 0) zs_spans_link(sp, reach);
    ZS_SYNC();
    ZS_FOR_LANES(j, reach) zs_span_fix(rec, (zs_u32)j, span, sp);
    ZS_SYNC();
    if (ZS_LANE == 0 && sh->status == ZS_OK) {
        status = zs_spans_status(rec, reach, span, n_seq, lits_n, block_max, sp);
        if (status == ZS_OK) {
            p->out_size = lits_n + sp->matched_total;
            p->rep_tag = sp->in_tag[reach][0] | (sp->in_tag[reach][1] << 2) | (sp->in_tag[reach][2] << 4);
            p->rep[0] = sp->in_rep[reach][0];
            p->rep[1] = sp->in_rep[reach][1];
            p->rep[2] = sp->in_rep[reach][2];
        }
        sh->status = status;
    }
    ZS_SYNC();
    status = sh->status;
    ZS_SYNC();
    return status;
}

// The literals of every compressed block, apart (their status into its plan): what
// zstd_decode_blocks, told so, then skips.
extern "C" __global__ void zstd_block_literals(const unsigned char* const* inputs, const ZsFramePlan* frames,
                                               ZsBlockPlan* blocks, unsigned char* lit_scratch,
                                               unsigned long long n_blocks) {
    ZS_SHARED ZsShared shared;
    const unsigned long long k = blockIdx.x;
    if (k >= n_blocks) return;
    ZsBlockPlan* p = &blocks[k];
    if (p->kind != 2) return;
    const zs_u32 status = zs_block_literals(&shared, inputs[p->frame], frames[p->frame].block_max, p, lit_scratch);
    if (ZS_LANE == 0) p->status = status;
}

extern "C" __global__ void zstd_decode_blocks(const unsigned char* const* inputs, const ZsFramePlan* frames,
                                              ZsBlockPlan* blocks, unsigned char* lit_scratch, unsigned int* seq_scratch,
                                              unsigned long long n_blocks, unsigned long long split,
                                              const unsigned int* chains, unsigned long long literals_done,
                                              unsigned int* tables) {
    ZS_SHARED ZsShared shared;
    const unsigned long long k = blockIdx.x;
    if (k >= n_blocks) return;
    ZsBlockPlan* p = &blocks[k];
    const zs_u32 kind = p->kind;
    zs_u32 status = ZS_OK;
    if (kind == 2) {
        const zs_u8* in = inputs[p->frame];
        const zs_u32 block_max = frames[p->frame].block_max;
        // The literals decoded here, or by zstd_block_literals before (its status in p, read by
        // every lane before lane 0 writes the block's).
        if (literals_done) {
            status = p->status;
            ZS_SYNC();
        } else {
            status = zs_block_literals(&shared, in, block_max, p, lit_scratch);
        }
        if (status == ZS_OK)
            status = zs_block_sequences(&shared, in, block_max, p, seq_scratch,
                                        (zs_u32)(split < ZS_SPANS ? split : ZS_SPANS),
                                        chains != 0 ? chains + k * ZS_CHAIN_WORDS : (const zs_u32*)0,
                                        tables != 0 ? tables + k * ZS_TABLE_WORDS : (zs_u32*)0);
    } else if (ZS_LANE == 0) {
        p->out_size = kind == ZS_NONE ? 0 : p->size;
        p->rep_tag = 1 | (2 << 2) | (3 << 4);
        p->rep[0] = p->rep[1] = p->rep[2] = 0;
    }
    if (ZS_LANE == 0) p->status = status;
}

// Block p's sequences into records on one lane, from its tables (t, copied from where
// zstd_decode_blocks put them) and its literals' count and section in p; its status, size and
// repeat offsets into p as zs_block_sequences leaves them with one span.
ZS_FN zs_u32 zs_lane_sequences(const zs_u8* in, zs_u32 block_max, ZsBlockPlan* p, zs_u32* seq_scratch,
                                const ZsCompactTables& t) {
    const zs_u64 len = p->in_size, taken = p->lit_taken;
    zs_u64 count = 0, head = 0;
    // (zstd_decode_blocks checked the section's header and its tables before leaving it.)
    if (taken > len || zs_sequence_count(in + p->in_at + taken, len - taken, &count, &head) != ZS_OK || count == 0)
        return ZS_BAD_SEQUENCES;
    const zs_u32 ll_log = t.ll_log, of_log = t.of_log, ml_log = t.ml_log;
    const zs_u32 n_seq = (zs_u32)count, lits_n = p->lit_count;
    const zs_u32 stream_len = p->stream_at > p->in_at + len ? 0u : (zs_u32)(p->in_at + len - p->stream_at);
    const zs_u8* stream = in + p->stream_at;
    ZsBits b;
    if (stream_len == 0 || !zs_bits_init(&b, stream, stream_len)) return ZS_BAD_SEQUENCE_STREAM;
    zs_bits_ensure(&b, 32);
    const zs_u32 ll_state = zs_bits_read(&b, ll_log);
    const zs_u32 of_state = zs_bits_read(&b, of_log);
    zs_bits_ensure(&b, 32);
    const zs_u32 ml_state = zs_bits_read(&b, ml_log);
    // Bits ran out before the first sequence: that sequence fails on them.
    if (b.overflow) return ZS_BAD_SEQUENCE_STREAM;
    ZsRunEnd e;
    zs_sequence_run(stream, stream_len, zs_bits_left(&b), ll_state | (of_state << 10) | (ml_state << 20), t, n_seq, 0,
                    n_seq, lits_n, block_max, seq_scratch + ZS_RECORD * p->seqs_at, &e);
    if (e.bad != ZS_NONE) return e.bad_bits ? ZS_BAD_SEQUENCE_STREAM : ZS_BAD_SEQUENCE;
    if (e.overflow || e.left != 0) return ZS_BAD_SEQUENCE_STREAM;
    // One run from the block's start: its repeat offsets out are the block's.
    p->out_size = lits_n + e.matched;
    p->rep_tag = (zs_u32)(e.rep[0] >> 32) | ((zs_u32)(e.rep[1] >> 32) << 2) | ((zs_u32)(e.rep[2] >> 32) << 4);
    p->rep[0] = (zs_u32)e.rep[0];
    p->rep[1] = (zs_u32)e.rep[1];
    p->rep[2] = (zs_u32)e.rep[2];
    return ZS_OK;
}

#ifdef ZS_HOST_SHIM
#define ZS_BLOCK_SYNC() ((void)0)
#define ZS_LANE_TABLES(name) static thread_local zs_u32 name[ZS_TABLE_WORDS]
#else
#define ZS_BLOCK_SYNC() __syncthreads()
#define ZS_LANE_TABLES(name) extern __shared__ zs_u32 name[]
#endif

// The sequences of the blocks zstd_decode_blocks left pending (a launch of many blocks given a
// tables region), a lane a block: a block's sequences are one state chain, walked in order
// whoever walks it, so a thread block of a few lanes issues one instruction for as many
// blocks' steps where a warp a block issued one for one (31 lanes idle). The blocks' tables are
// copied to the thread block's shared memory (ZS_TABLE_WORDS words a lane, the launch's dynamic
// shared memory; read from global memory, 32 lanes' 32 tables missed the caches: run DU1), and
// the lengths' baselines beside them.
extern "C" __global__ void zstd_sequence_lanes(const unsigned char* const* inputs, const ZsFramePlan* frames,
                                               ZsBlockPlan* blocks, unsigned int* seq_scratch,
                                               const unsigned int* tables, unsigned long long n_blocks) {
    ZS_SHARED zs_u32 codes[128];
    ZS_LANE_TABLES(lane_tables);
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x;
    for (zs_u32 c = threadIdx.x; c < 128; c += blockDim.x) {
        zs_u32 base = 0, extra = 0;
        if (c < 36) zs_ll(c, &base, &extra);
        else if (c >= 64 && c < 64 + 53) zs_ml(c - 64, &base, &extra);
        codes[c] = base | (extra << 24);
    }
    // Each pending block's tables, by the thread block's threads together.
    for (zs_u32 j = 0; j < blockDim.x && first + j < n_blocks; ++j) {
        if (blocks[first + j].status != ZS_PENDING) continue;
        const zs_u32* src = tables + (first + j) * ZS_TABLE_WORDS;
        zs_u32* dst = lane_tables + (zs_u64)j * ZS_TABLE_WORDS;
        const zs_u16* src_half = (const zs_u16*)src;
        zs_u16* dst_half = (zs_u16*)dst;
        const zs_u32 logs = src[ZS_TABLE_LOGS];
        const zs_u32 ll_n = 1u << (logs & 15), of_n = 1u << ((logs >> 4) & 15), ml_n = 1u << ((logs >> 8) & 15);
        // (Logs of at most 9, 8 and 9: the table's build checked them.)
        for (zs_u32 i = threadIdx.x; i < ll_n + ml_n + of_n; i += blockDim.x) {
            const zs_u32 at = zs_table_half_at(i, ll_n, ml_n);
            dst_half[at] = src_half[at];
        }
        if (threadIdx.x == 0) dst[ZS_TABLE_LOGS] = logs;
    }
    ZS_BLOCK_SYNC();
    const unsigned long long k = first + threadIdx.x;
    if (k >= n_blocks) return;
    ZsBlockPlan* p = &blocks[k];
    if (p->status != ZS_PENDING) return;
    const zs_u32* mine = lane_tables + (zs_u64)threadIdx.x * ZS_TABLE_WORDS;
    const zs_u32 logs = mine[ZS_TABLE_LOGS];
    const zs_u16* half = (const zs_u16*)mine;
    const ZsCompactTables t = {half, half + 2 * ZS_TABLE_ML, half + 2 * ZS_TABLE_OF, codes, codes + 64,
                               logs & 15, (logs >> 4) & 15, (logs >> 8) & 15};
    p->status = zs_lane_sequences(inputs[p->frame], frames[p->frame].block_max, p, seq_scratch, t);
}
