// zstd frames decoded block by block side by side (compiled after decode.cu, whose parts it
// uses), in three launches over a batch:
// 1. zstd_plan, one warp per frame (lane 0): walks the frame and block headers and writes a
//    plan of every block: where its parts lie, and for treeless literals and repeated tables
//    which earlier description is in effect (the only state a block takes from the blocks
//    before it, but for repeat offsets and the bytes its matches copy).
// 2. zstd_decode_blocks, one warp per block, all blocks of all frames at once: its literals into
//    scratch (four streams on four lanes), its three tables built on three lanes, then its
//    sequences decoded by one lane into records of (offset, literal length, match length). A
//    repeat offset that reaches before the block stays symbolic: "incoming repeat offset i,
//    less d".
// 3. zstd_execute, one warp per frame: its blocks in order, each sequence's offset resolved from
//    the repeat offsets its block inherits; the sequences copied 32 at a time, one to a lane,
//    where a match reads no byte the same round writes (else that sequence by the whole warp).
// Scratch (sized by the host from the frames, decode.rs `BlockPlan`): frame plans, block
// plans, sequence records (12 bytes each), literals (those not stored raw).
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

// A frame's plan: the first five words from the host (its scratch slots), the rest from
// zstd_plan.
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

// Block p's literals into the scratch and its sequences into records; its status, size and
// repeat offsets into p.
ZS_FN zs_u32 zs_block_sequences(ZsShared* sh, const zs_u8* in, zs_u32 block_max, ZsBlockPlan* p, zs_u8* lit_scratch,
                                 zs_u32* seq_scratch) {
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
        sh->huf_valid = 1;
    }
    const zs_u8* lits = 0;
    zs_u64 lit_count = 0, taken = 0;
    zs_u32 status = zs_literals(sh, blk, len, lit_scratch + p->lits_at, 0, p->lit_slots, block_max, &lits, &lit_count,
                                &taken);
    if (status != ZS_OK) return status;
    if (ZS_LANE == 0) p->lit_in_at = (blk[0] & 3) == 0 ? (zs_u32)(lits - in) : ZS_NONE;
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
    // The three tables on three lanes, from the descriptions in effect.
    ZsFse* tables[3] = {&sh->ll, &sh->of, &sh->ml};
    ZS_FOR_LANES(t, 3) {
        const zs_u32 at = p->tab_at[t];
        const zs_u32 mode = p->tab_mode[t];
        const zs_u64 used = zs_sequence_table(tables[t], (zs_u32)t, mode, at == ZS_NONE ? in : in + at,
                                              at == ZS_NONE ? 0 : p->in_at + p->in_size - at, 1);
        sh->stream_status[t] = used != ~0ull;
    }
    ZS_SYNC();
    const zs_u32 built = sh->stream_status[0] & sh->stream_status[1] & sh->stream_status[2];
    ZS_SYNC();
    if (!built) return ZS_BAD_SEQUENCES;
    // One read a state: literal and match length entries of 8 bytes (the code's baseline; the
    // update's bits, the code's extra bits, the update's base) where the Huffman table was,
    // offset entries of 4 (code, update bits, update base) where the literal length table was
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
        const zs_u32 v = u < (1u << of_log) ? sh->of.symbol[u] | ((zs_u32)sh->of.bits[u] << 8) | ((zs_u32)sh->of.base[u] << 16) : 0;
        ZS_SYNC();
        of_t[u] = v;
    }
    ZS_SYNC();
    if (ZS_LANE == 0) {
        status = ZS_OK;
        ZsBits b;
        zs_u32* rec = seq_scratch + ZS_RECORD * p->seqs_at;
        if (p->stream_at > p->in_at + len || !zs_bits_init(&b, in + p->stream_at, p->in_at + len - p->stream_at)) {
            status = ZS_BAD_SEQUENCE_STREAM;
        } else {
            zs_bits_ensure(&b, 32);
            zs_u32 ll_state = zs_bits_read(&b, ll_log);
            zs_u32 of_state = zs_bits_read(&b, of_log);
            zs_bits_ensure(&b, 32);
            zs_u32 ml_state = zs_bits_read(&b, ml_log);
            zs_u32 lp = 0, matched = 0;
            const zs_u32 lits_n = (zs_u32)lit_count;
            zs_u64 r0 = ZS_REP(1, 0), r1 = ZS_REP(2, 0), r2 = ZS_REP(3, 0);
            const zs_u32 n_seq = (zs_u32)count;
            for (zs_u32 k = 0; k < n_seq; ++k) {
                const zs_u64 le = ll_t[ll_state], me = ml_t[ml_state];
                const zs_u32 oe = of_t[of_state];
                const zs_u32 of_code = oe & 0xFF;
                const zs_u32 ll_base = (zs_u32)le, ll_hi = (zs_u32)(le >> 32);
                const zs_u32 ml_base = (zs_u32)me, ml_hi = (zs_u32)(me >> 32);
                const zs_u32 ll_bits = (ll_hi >> 8) & 0xFF, ml_bits = (ml_hi >> 8) & 0xFF;
                const zs_u32 lb = ll_hi & 0xFF, mb = ml_hi & 0xFF, ob = (oe >> 8) & 0xFF;
                // The sequence's bits in stream order: its offset's (offset code 1 reads the one
                // bit that picks a repeat offset, 0 none), its lengths', its state updates' (none
                // after the last). Read from the window at once where it holds them all (one
                // refill check a sequence: the branches are what a lone lane pays for).
                const zs_u32 ext_bits = ml_bits + ll_bits;
                const zs_u32 state_bits = k + 1 < n_seq ? lb + mb + ob : 0;
                const zs_u32 need = of_code + ext_bits + state_bits;
                if (b.avail < need && b.at > 0) zs_bits_fill(&b);
                zs_u32 v_off, v_ext, v_st;
                if (need <= b.avail) {
                    const zs_u64 w = b.word;
                    zs_u32 at = b.avail - of_code;
                    v_off = (zs_u32)(w >> (at & 63)) & zs_mask(of_code);
                    at -= ext_bits;
                    v_ext = (zs_u32)(w >> (at & 63)) & zs_mask(ext_bits);
                    at -= state_bits;
                    v_st = (zs_u32)(w >> (at & 63)) & zs_mask(state_bits);
                    b.avail = at;
                } else {
                    // More than a window's bits (long offsets), or past the stream's start.
                    zs_bits_ensure(&b, 32);
                    v_off = zs_bits_read(&b, of_code);
                    zs_bits_ensure(&b, 32);
                    v_ext = zs_bits_read(&b, ext_bits);
                    zs_bits_ensure(&b, 32);
                    v_st = zs_bits_read(&b, state_bits);
                }
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
                const zs_u32 ll = ll_base + (v_ext & zs_mask(ll_bits));
                ll_state = (ll_hi >> 16) + (v_st >> (mb + ob));
                ml_state = (ml_hi >> 16) + ((v_st >> ob) & zs_mask(mb));
                of_state = (oe >> 16) + (v_st & zs_mask(ob));
                // Literals within the block's; the block within block_max (each length under
                // 2^18: no wrap).
                bad |= (ll > lits_n - lp) | (ml > block_max) | (lits_n + matched + ml > block_max);
                if (bad) {
                    status = b.overflow ? ZS_BAD_SEQUENCE_STREAM : ZS_BAD_SEQUENCE;
                    break;
                }
                zs_u32* r = rec + ZS_RECORD * k;
                r[0] = (zs_u32)offset;
                r[1] = ll | (zs_u32)((offset >> 32) << 30);
                r[2] = ml;
                lp += ll;
                matched += ml;
            }
            if (status == ZS_OK && (b.overflow || zs_bits_left(&b) != 0)) status = ZS_BAD_SEQUENCE_STREAM;
            if (status == ZS_OK) {
                p->out_size = (zs_u32)(lit_count + matched);
                p->rep_tag = (zs_u32)(r0 >> 32) | (zs_u32)((r1 >> 32) << 2) | (zs_u32)((r2 >> 32) << 4);
                p->rep[0] = (zs_u32)r0;
                p->rep[1] = (zs_u32)r1;
                p->rep[2] = (zs_u32)r2;
            }
        }
        sh->status = status;
    }
    ZS_SYNC();
    status = sh->status;
    ZS_SYNC();
    return status;
}

extern "C" __global__ void zstd_decode_blocks(const unsigned char* const* inputs, const ZsFramePlan* frames,
                                              ZsBlockPlan* blocks, unsigned char* lit_scratch, unsigned int* seq_scratch,
                                              unsigned long long n_blocks) {
    ZS_SHARED ZsShared shared;
    const unsigned long long k = blockIdx.x;
    if (k >= n_blocks) return;
    ZsBlockPlan* p = &blocks[k];
    const zs_u32 kind = p->kind;
    zs_u32 status = ZS_OK;
    if (kind == 2) {
        status = zs_block_sequences(&shared, inputs[p->frame], frames[p->frame].block_max, p, lit_scratch, seq_scratch);
    } else if (ZS_LANE == 0) {
        p->out_size = kind == ZS_NONE ? 0 : p->size;
        p->rep_tag = 1 | (2 << 2) | (3 << 4);
        p->rep[0] = p->rep[1] = p->rep[2] = 0;
    }
    if (ZS_LANE == 0) p->status = status;
}

// ---- 3. The frame's bytes -----------------------------------------------------------------

// A round of up to 32 sequences, one to a lane.
struct ZsRound {
    zs_u64 op[32];   // where each sequence's bytes start in the output
    zs_u64 lp[32];   // where its literals start
    zs_u64 off[32];  // its offset (0: invalid)
    zs_u32 ll[32], ml[32];
    zs_u32 flag[32];
    zs_u32 status;
};

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
    zs_u64 x = v;
    for (zs_u32 d = 1; d < 32; d <<= 1) {
        const zs_u64 t = __shfl_up_sync(0xFFFFFFFFu, x, d);
        if (lane >= d) x += t;
    }
    if (lane < m) s[lane] = base + x - v;
    __syncwarp();
#endif
}

// The first i in [from, m) with flag[i] set, else m.
ZS_FN zs_u32 zs_first_flag(const zs_u32* flag, zs_u32 from, zs_u32 m) {
#ifdef ZS_HOST_SHIM
    for (zs_u32 i = from; i < m; ++i)
        if (flag[i]) return i;
    return m;
#else
    const zs_u32 lane = ZS_LANE;
    const unsigned mask = __ballot_sync(0xFFFFFFFFu, lane >= from && lane < m && flag[lane] != 0);
    return mask ? (zs_u32)(__ffs(mask) - 1) : m;
#endif
}

// One lane's whole sequence: ll literals from lit, then ml bytes from `off` before.
ZS_FN void zs_lane_sequence(zs_u8* dst, const zs_u8* lit, zs_u32 ll, zs_u32 ml, zs_u64 off) {
    if (ll <= 16 && ml <= 16 && off >= ml) {
        // Every byte read before any is written: the match lies before this sequence, or (off
        // at most ll + i, and off >= ml) in its own literals, read from the literals instead.
        zs_u8 v[32] = {0};
ZS_UNROLL
        for (zs_u32 i = 0; i < 16; ++i)
            if (i < ll) v[i] = lit[i];
        const zs_u8* src = dst + ll - off;
ZS_UNROLL
        for (zs_u32 i = 0; i < 16; ++i)
            if (i < ml) v[16 + i] = (zs_u64)ll + i >= off ? lit[ll + i - off] : src[i];
ZS_UNROLL
        for (zs_u32 i = 0; i < 16; ++i)
            if (i < ll) dst[i] = v[i];
ZS_UNROLL
        for (zs_u32 i = 0; i < 16; ++i)
            if (i < ml) dst[ll + i] = v[16 + i];
        return;
    }
    for (zs_u32 i = 0; i < ll; ++i) dst[i] = lit[i];
    zs_u8* m = dst + ll;
    const zs_u8* s = m - off;
    for (zs_u32 i = 0; i < ml; ++i) m[i] = s[i];
}

// A compressed block's sequences (records rec[0, count)) and its literals executed at out + *op
// of a frame output of `capacity`; rin: its incoming repeat offsets.
ZS_FN zs_u32 zs_execute_sequences(ZsRound* r, const zs_u32* rec, zs_u64 count, const zs_u8* lits, zs_u64 lit_count,
                                  zs_u8* out, zs_u64* op_io, const zs_u64* rin) {
    zs_u64 op = *op_io, lp = 0;
    for (zs_u64 base = 0; base < count; base += 32) {
        const zs_u32 m = (zs_u32)(count - base < 32 ? count - base : 32);
        ZS_FOR_LANES(i, m) {
            const zs_u32* q = rec + ZS_RECORD * (base + i);
            const zs_u32 value = q[0], tag = q[1] >> 30;
            r->ll[i] = q[1] & 0x3FFFFFFFu;
            r->ml[i] = q[2];
            r->off[i] = tag == 0 ? value : (rin[tag - 1] > value ? rin[tag - 1] - value : 0);
        }
        ZS_SYNC();
        zs_prefix(r->ll, r->lp, m, lp);
        ZS_FOR_LANES(i, m) r->flag[i] = r->ll[i] + r->ml[i];
        ZS_SYNC();
        zs_prefix(r->flag, r->op, m, op);
        ZS_SYNC();
        // Offsets within the bytes before each match.
        ZS_FOR_LANES(i, m) r->flag[i] = r->off[i] == 0 || r->off[i] > r->op[i] + r->ll[i];
        ZS_SYNC();
        if (zs_first_flag(r->flag, 0, m) < m) return ZS_BAD_SEQUENCE;
        ZS_SYNC();
        const zs_u64 end_op = r->op[m - 1] + r->ll[m - 1] + r->ml[m - 1];
        const zs_u64 end_lp = r->lp[m - 1] + r->ll[m - 1];
        zs_u32 from = 0;
        while (from < m) {
            // A sequence waits for the round before it when its match reads bytes written in
            // this round by sequences before it, or when it is long (the warp copies it).
            const zs_u64 start = r->op[from];
            ZS_FOR_LANES(i, m) {
                const zs_u64 own = r->op[i] + r->ll[i];
                const zs_u64 src = own - r->off[i];
                const zs_u64 src_end = src + r->ml[i] < r->op[i] ? src + r->ml[i] : r->op[i];
                r->flag[i] = (r->ll[i] + r->ml[i] > 64) || (src < r->op[i] && src_end > start);
            }
            ZS_SYNC();
            const zs_u32 stop = zs_first_flag(r->flag, from, m);
            ZS_SYNC();
            ZS_FOR_LANES(i, m) {
                if (i >= from && i < stop) zs_lane_sequence(out + r->op[i], lits + r->lp[i], r->ll[i], r->ml[i], r->off[i]);
            }
            ZS_SYNC();
            if (stop < m) {
                // The warp copies this one, its sources all written now.
                const zs_u64 o = r->op[stop], l = r->ll[stop];
                const zs_u8* lit = lits + r->lp[stop];
                ZS_FOR_LANES(i, l) out[o + i] = lit[i];
                ZS_SYNC();
                zs_match(out + o + l, r->off[stop], r->ml[stop]);
            }
            from = stop + 1;
        }
        op = end_op;
        lp = end_lp;
        ZS_SYNC();
    }
    const zs_u64 rest = lit_count - lp;
    ZS_FOR_LANES(i, rest) out[op + i] = lits[lp + i];
    ZS_SYNC();
    *op_io = op + rest;
    return ZS_OK;
}

extern "C" __global__ void zstd_execute(const unsigned char* const* inputs, const unsigned long long* capacities,
                                        unsigned char* const* outputs, unsigned long long* decoded,
                                        unsigned int* statuses, const ZsFramePlan* frames, const ZsBlockPlan* blocks,
                                        const unsigned char* lit_scratch, const unsigned int* seq_scratch,
                                        unsigned long long n) {
    ZS_SHARED ZsRound round;
    const unsigned long long k = blockIdx.x;
    if (k >= n) return;
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
            ZS_FOR_LANES(i, size) out[op + i] = src[i];
            ZS_SYNC();
            op += size;
        } else if (p->kind == 1) {
            const zs_u8 v = in[p->in_at];
            ZS_FOR_LANES(i, size) out[op + i] = v;
            ZS_SYNC();
            op += size;
        } else {
            const zs_u8* lits = p->lit_in_at == ZS_NONE ? lit_scratch + p->lits_at : in + p->lit_in_at;
            status = zs_execute_sequences(&round, seq_scratch + ZS_RECORD * p->seqs_at, p->seq_slots, lits, p->lit_slots, out,
                                          &op, rep);
            if (status != ZS_OK) break;
            status = zs_next_reps(p, rep);
            if (status != ZS_OK) break;
        }
    }
    if (status == ZS_OK) status = f->status;
    if (status == ZS_OK && op != capacity) status = ZS_SIZE_MISMATCH;
    if (ZS_LANE == 0) {
        statuses[k] = status;
        decoded[k] = op;
    }
}
// ---- 3'. The frame's bytes resolved by jumps (small batches) -------------------------------
// Every output byte gets an entry: its value (ZS_RESOLVED set) or the index of an earlier byte it
// copies (a match's source; within a match that overlaps itself, the byte of the period before
// the match). Each pass replaces a pointer by its target's entry, so that after pass t every
// chain of up to 2^t links is resolved: ceil(log2(the largest frame)) + 1 passes resolve all.

#define ZS_RESOLVED 0x80000000u

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

// One warp per block: the entries of its bytes (frames already in error are left).
extern "C" __global__ void zstd_entries(const unsigned char* const* inputs, unsigned long long* decoded,
                                        unsigned int* statuses, const ZsFramePlan* frames, const ZsBlockPlan* blocks,
                                        const unsigned char* lit_scratch, const unsigned int* seq_scratch,
                                        unsigned int* entries, unsigned long long n_blocks) {
    ZS_SHARED zs_u32 bad;
    ZS_SHARED ZsRound round;
    const unsigned long long k = blockIdx.x;
    if (k >= n_blocks) return;
    const ZsBlockPlan* p = &blocks[k];
    if (p->kind == ZS_NONE || statuses[p->frame] != ZS_OK) return;
    const ZsFramePlan* f = &frames[p->frame];
    const zs_u8* in = inputs[p->frame];
    zs_u32* e = entries + f->entries_at + p->out_at;
    const zs_u64 size = p->out_size;
    if (p->kind == 0) {
        ZS_FOR_LANES(i, size) e[i] = ZS_RESOLVED | in[p->in_at + i];
        return;
    }
    if (p->kind == 1) {
        ZS_FOR_LANES(i, size) e[i] = ZS_RESOLVED | in[p->in_at];
        return;
    }
    const zs_u8* lits = p->lit_in_at == ZS_NONE ? lit_scratch + p->lits_at : in + p->lit_in_at;
    const zs_u32* rec = seq_scratch + ZS_RECORD * p->seqs_at;
    const zs_u64 count = p->seq_slots;
    if (ZS_LANE == 0) bad = 0;
    ZS_SYNC();
    zs_u32 flaw = 0;
    // 32 sequences a round, one to a lane: their first literals and bytes from prefix sums.
    zs_u64 lp = 0, pos = 0;
    for (zs_u64 base = 0; base < count; base += 32) {
        const zs_u32 n = (zs_u32)(count - base < 32 ? count - base : 32);
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
    const zs_u64 rest = p->lit_slots - lp;
    ZS_FOR_LANES(i, rest) e[pos + i] = ZS_RESOLVED | lits[lp + i];
    if (flaw) bad = 1;
    ZS_SYNC();
    if (ZS_LANE == 0 && bad) {
        statuses[p->frame] = ZS_BAD_SEQUENCE;
        decoded[p->frame] = 0;
    }
}

// Pass t over entries[0, total), 256 a thread block (skipped once a pass left none to resolve).
extern "C" __global__ void zstd_jump(unsigned int* entries, unsigned long long total, unsigned int* pass_flags,
                                     unsigned int t) {
    if (t > 0 && pass_flags[t - 1] == 0) return;
    const zs_u64 first = (zs_u64)blockIdx.x * 256;
    if (first >= total) return;
    const zs_u64 count = total - first < 256 ? total - first : 256;
    zs_u32 more = 0;
    ZS_FOR_LANES(i, count) {
        const zs_u32 v = entries[first + i];
        if (!(v & ZS_RESOLVED)) {
            // Entries of frames already in error were never written (the scratch is reused):
            // any value may be there, and is never followed outside the entries. Those frames'
            // bytes are not written out.
            const zs_u32 w = v < total ? entries[v] : ZS_RESOLVED;
            entries[first + i] = w;
            more |= !(w & ZS_RESOLVED);
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
#undef ZS_UNROLL
#ifndef ZS_HOST_SHIM
#undef ZS_LANES
#undef ZS_LANE
#undef ZS_SYNC
#undef ZS_FN
#undef ZS_SHARED
#undef ZS_CONST
#endif
