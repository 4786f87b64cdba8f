// zstd frame decoder (RFC 8878), one warp per frame, compiled after entropy.cu, whose parts it
// uses; the block-parallel decoder (blocks.cu, bytes.cu) shares its section parsers. The frame,
// block and section headers are parsed by every lane alike; lane 0 reads table descriptions and
// builds the decoding tables in shared memory; the four Huffman literal streams decode on four
// lanes side by side into the tail of the frame's output; the sequences are decoded by every
// lane alike (each with its own bit reader over the shared tables) and their literal and match
// copies are spread over the lanes. The same text runs on the CPU (host_shim.cpp).
//
// Acceptance follows libzstd's one-shot decoder, and the format where that is stricter: a frame
// decodes only to exactly `capacity` bytes (and its content size, where it says one); every
// bitstream is used up exactly; every literal length, offset and match stays within the
// literals and the bytes decoded before it. Every read of the input and write of the output is
// bounded by the lengths given; every loop is bounded by sizes checked before it (the input's
// length, 128 KiB blocks, a block's literals and sequences), so damaged input ends as a status.
// The frame's content checksum, where it has one, is verified by the caller (xxhash.rs).

// Copy n bytes from src to dst, dst <= src where they overlap (literals moving down the output).
ZS_FN void zs_copy_down(zs_u8* dst, const zs_u8* src, zs_u64 n) {
    if (n == 0) return;
    if (dst + n <= src || src + n <= dst) {
        ZS_FOR_LANES(i, n) dst[i] = src[i];
        ZS_SYNC();
        return;
    }
    // Overlapping: a round of lanes reads before any of it writes; each round's writes lie
    // below the next round's reads.
    for (zs_u64 r = 0; r < n; r += ZS_LANES) {
        const zs_u64 k = r + ZS_LANE;
        zs_u8 v = 0;
        if (ZS_LANES == 1) {
            for (zs_u64 j = r; j < n && j < r + ZS_LANES; ++j) dst[j] = src[j];
            continue;
        }
        if (k < n) v = src[k];
        ZS_SYNC();
        if (k < n) dst[k] = v;
        ZS_SYNC();
    }
}

// A match of n bytes at dst from `offset` bytes before it (offset <= bytes before dst).
ZS_FN void zs_match(zs_u8* dst, zs_u64 offset, zs_u64 n) {
    const zs_u8* src = dst - offset;
    if (offset >= n) {
        ZS_FOR_LANES(i, n) dst[i] = src[i];
    } else {
        // Byte i repeats byte i % offset of the `offset` bytes before the match, all written
        // before it: every lane copies at once.
        const zs_u64 step = ZS_LANES % offset;
        zs_u64 r = 0;
        ZS_FOR_LANES(i, n) {
            if (i < ZS_LANES) r = i % offset;
            dst[i] = src[r];
            r += step;
            if (r >= offset) r -= offset;
        }
    }
    ZS_SYNC();
}

// Baselines and extra bits of literal length codes 0..35 and match length codes 32..52 (codes
// below 32 are lengths 3 to 34 without extra bits).
ZS_CONST zs_u32 zs_ll_base[36] = {0,  1,  2,  3,  4,  5,  6,  7,  8,   9,   10,  11,   12,   13,   14,   15,   16,    18,
                                  20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
ZS_CONST zs_u8 zs_ll_bits[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  0,  0,  0,  1,  1,
                                 1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
ZS_CONST zs_u32 zs_ml_base[21] = {35,  37,  39,  41,   43,   47,   51,   59,    67,    83,   99,
                                  131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
ZS_CONST zs_u8 zs_ml_bits[21] = {1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

ZS_FN void zs_ll(zs_u32 code, zs_u32* base, zs_u32* bits) {
    *base = zs_ll_base[code];
    *bits = zs_ll_bits[code];
}

ZS_FN void zs_ml(zs_u32 code, zs_u32* base, zs_u32* bits) {
    if (code < 32) {
        *base = code + 3;
        *bits = 0;
        return;
    }
    *base = zs_ml_base[code - 32];
    *bits = zs_ml_bits[code - 32];
}

// The literals section header of the block blk[0, len) (RFC 8878 3.1.1.3.1.1): its type, its
// header bytes, its regenerated size and the bytes after the header (raw: the size, RLE: 1,
// compressed: the streams and tree); ZS_BAD_LITERALS where the header does not fit.
ZS_FN zs_u32 zs_literals_head(const zs_u8* blk, zs_u64 len, zs_u32* kind, zs_u64* head, zs_u64* size,
                              zs_u64* csize) {
    const zs_u32 b0 = blk[0];
    const zs_u32 format = (b0 >> 2) & 3;
    *kind = b0 & 3;
    if (*kind < 2) {
        if (format == 0 || format == 2) {
            *head = 1;
            *size = b0 >> 3;
        } else if (format == 1) {
            *head = 2;
            if (len < 2) return ZS_BAD_LITERALS;
            *size = (b0 | ((zs_u32)blk[1] << 8)) >> 4;
        } else {
            *head = 3;
            if (len < 3) return ZS_BAD_LITERALS;
            *size = (b0 | ((zs_u32)blk[1] << 8) | ((zs_u32)blk[2] << 16)) >> 4;
        }
        *csize = *kind == 0 ? *size : 1;
        return ZS_OK;
    }
    if (len < 5) return ZS_BAD_LITERALS;
    const zs_u32 word = b0 | ((zs_u32)blk[1] << 8) | ((zs_u32)blk[2] << 16) | ((zs_u32)blk[3] << 24);
    if (format < 2) {
        *head = 3;
        *size = (word >> 4) & 0x3FF;
        *csize = (word >> 14) & 0x3FF;
    } else if (format == 2) {
        *head = 4;
        *size = (word >> 4) & 0x3FFF;
        *csize = word >> 18;
    } else {
        *head = 5;
        *size = (word >> 4) & 0x3FFFF;
        *csize = (word >> 22) | ((zs_u32)blk[4] << 10);
    }
    return ZS_OK;
}

// The sequences section's count at seq[0, len) and the bytes that say it; ZS_BAD_SEQUENCES
// where they do not fit.
ZS_FN zs_u32 zs_sequence_count(const zs_u8* seq, zs_u64 len, zs_u64* count, zs_u64* head) {
    if (len < 1) return ZS_BAD_SEQUENCES;
    const zs_u32 c0 = seq[0];
    if (c0 < 128) {
        *count = c0;
        *head = 1;
    } else if (c0 < 255) {
        if (len < 2) return ZS_BAD_SEQUENCES;
        *count = ((c0 - 128) << 8) + seq[1];
        *head = 2;
    } else {
        if (len < 3) return ZS_BAD_SEQUENCES;
        *count = seq[1] + ((zs_u64)seq[2] << 8) + 0x7F00;
        *head = 3;
    }
    return ZS_OK;
}

// The literals section of the compressed block blk[0, len) whose output starts at out + op, in
// a frame whose output may reach `capacity`: its literals into *lits (the input's bytes for raw
// literals; else decoded into the tail of the output, below capacity), their count into
// *lit_count, the section's size into *taken. Returns a status.
ZS_FN zs_u32 zs_literals(ZsShared* sh, const zs_u8* blk, zs_u64 len, zs_u8* out, zs_u64 op, zs_u64 capacity,
                         zs_u32 block_max, const zs_u8** lits, zs_u64* lit_count, zs_u64* taken) {
    zs_u32 kind = 0;
    zs_u64 head = 0, size = 0, csize = 0;
    const zs_u32 status = zs_literals_head(blk, len, &kind, &head, &size, &csize);
    if (status != ZS_OK) return status;
    const zs_u32 format = (blk[0] >> 2) & 3;
    const zs_u64 room = capacity - op;
    if (kind < 2) {
        if (size > block_max) return ZS_BAD_LITERALS;
        if (size > room) return ZS_PAST_CAPACITY;
        if (head + csize > len) return ZS_BAD_LITERALS;
        if (kind == 0) {
            *lits = blk + head;
        } else {
            zs_u8* tail = out + capacity - size;
            const zs_u8 v = blk[head];
            ZS_FOR_LANES(i, size) tail[i] = v;
            ZS_SYNC();
            *lits = tail;
        }
        *taken = head + csize;
        *lit_count = size;
        return ZS_OK;
    }
    if (size > block_max) return ZS_BAD_LITERALS;
    if (size > room) return ZS_PAST_CAPACITY;
    const zs_u32 streams = format == 0 ? 1u : 4u;
    if (streams == 4 && size < 6) return ZS_BAD_LITERALS;
    if (head + csize > len) return ZS_BAD_LITERALS;
    const zs_u8* section = blk + head;
    zs_u64 tree = 0;
    if (kind == 3) {
        if (!sh->huf_valid) return ZS_BAD_HUFFMAN;
    } else {
        if (ZS_LANE == 0) sh->value = zs_huffman_tree(sh, section, csize);
        ZS_SYNC();
        tree = sh->value;
        ZS_SYNC();
        if (tree == 0 || tree >= csize) return ZS_BAD_HUFFMAN;
        zs_huffman_fill(sh);
        sh->huf_valid = 1;
    }
    const zs_u8* data = section + tree;
    const zs_u64 data_len = csize - tree;
    zs_u8* tail = out + capacity - size;
    if (streams == 1) {
        if (ZS_LANE == 0) sh->stream_status[0] = zs_huffman_stream(sh, data, data_len, tail, size);
        ZS_SYNC();
        const zs_u32 ok = sh->stream_status[0];
        ZS_SYNC();
        if (!ok) return ZS_BAD_LITERAL_STREAM;
    } else {
        if (data_len < 10) return ZS_BAD_LITERAL_STREAM;
        const zs_u64 l1 = data[0] | ((zs_u64)data[1] << 8);
        const zs_u64 l2 = data[2] | ((zs_u64)data[3] << 8);
        const zs_u64 l3 = data[4] | ((zs_u64)data[5] << 8);
        if (l1 + l2 + l3 > data_len - 6) return ZS_BAD_LITERAL_STREAM;
        const zs_u64 l4 = data_len - 6 - l1 - l2 - l3;
        const zs_u64 segment = (size + 3) / 4;
        if (3 * segment > size) return ZS_BAD_LITERAL_STREAM;
        ZS_FOR_LANES(s, 4) {
            const zs_u64 at = 6 + (s > 0 ? l1 : 0) + (s > 1 ? l2 : 0) + (s > 2 ? l3 : 0);
            const zs_u64 n = s == 0 ? l1 : s == 1 ? l2 : s == 2 ? l3 : l4;
            const zs_u64 count = s < 3 ? segment : size - 3 * segment;
            sh->stream_status[s] = zs_huffman_stream(sh, data + at, n, tail + s * segment, count);
        }
        ZS_SYNC();
        const zs_u32 ok = sh->stream_status[0] & sh->stream_status[1] & sh->stream_status[2] & sh->stream_status[3];
        ZS_SYNC();
        if (!ok) return ZS_BAD_LITERAL_STREAM;
    }
    *lits = tail;
    *lit_count = size;
    *taken = head + csize;
    return ZS_OK;
}

// A compressed block blk[0, len) decoded at out + op (frame output from out + frame_start),
// at most `capacity` bytes of output in all; *op advances. rep: the repeat offsets.
ZS_FN zs_u32 zs_compressed_block(ZsShared* sh, const zs_u8* blk, zs_u64 len, zs_u8* out, zs_u64* op_io,
                                 zs_u64 frame_start, zs_u64 capacity, zs_u32 block_max, zs_u64* rep) {
    if (len < 2 || len > block_max) return ZS_BAD_BLOCK;
    const zs_u64 op0 = *op_io;
    const zs_u8* lits = 0;
    zs_u64 lit_count = 0, taken = 0;
    zs_u32 status = zs_literals(sh, blk, len, out, op0, capacity, block_max, &lits, &lit_count, &taken);
    if (status != ZS_OK) return status;
    const zs_u8* seq = blk + taken;
    const zs_u64 seq_len = len - taken;
    if (seq_len < 1) return ZS_BAD_SEQUENCES;
    zs_u64 count = 0, head = 0;
    status = zs_sequence_count(seq, seq_len, &count, &head);
    if (status != ZS_OK) return status;
    // Every sequence copies a match of 3 bytes or more after the block's literals.
    const zs_u64 least = lit_count + 3 * count;
    const zs_u64 limit = capacity - op0 < block_max ? capacity - op0 : block_max;
    if (least > limit) return least > capacity - op0 ? ZS_PAST_CAPACITY : ZS_BAD_SEQUENCES;
    zs_u8* dst = out + op0;
    const int lits_in_out = lits >= out && lits < out + capacity;
    if (count == 0) {
        if (head != seq_len) return ZS_BAD_SEQUENCES;
        if (lits_in_out) zs_copy_down(dst, lits, lit_count);
        else {
            ZS_FOR_LANES(i, lit_count) dst[i] = lits[i];
            ZS_SYNC();
        }
        *op_io = op0 + lit_count;
        return ZS_OK;
    }
    if (head >= seq_len) return ZS_BAD_SEQUENCES;
    const zs_u32 modes = seq[head];
    if (modes & 3) return ZS_BAD_SEQUENCES;
    zs_u64 pos = head + 1;
    // Lane 0 builds the three tables (literal lengths, offsets, match lengths, in that order).
    ZsFse* tables[3] = {&sh->ll, &sh->of, &sh->ml};
    for (zs_u32 t = 0; t < 3; ++t) {
        const zs_u32 mode = (modes >> (6 - 2 * t)) & 3;
        if (ZS_LANE == 0) sh->value = zs_sequence_table(tables[t], t, mode, seq + pos, seq_len - pos, sh->tables_valid);
        ZS_SYNC();
        const zs_u64 used = sh->value;
        ZS_SYNC();
        if (used == ~0ull) return ZS_BAD_SEQUENCES;
        pos += used;
        if (pos > seq_len) return ZS_BAD_SEQUENCES;
    }
    sh->tables_valid = 1;
    ZsBack b;
    if (!zs_back_init(&b, seq + pos, seq_len - pos)) return ZS_BAD_SEQUENCE_STREAM;
    zs_u32 ll_state = zs_back_read(&b, sh->ll.log);
    zs_u32 of_state = zs_back_read(&b, sh->of.log);
    zs_u32 ml_state = zs_back_read(&b, sh->ml.log);
    zs_u64 op = op0, lp = 0, matched = 0;
    // The repeat offsets in registers for the block (an array indexed by a code would live in
    // local memory).
    zs_u64 r0 = rep[0], r1 = rep[1], r2 = rep[2];
    for (zs_u64 k = 0; k < count; ++k) {
        if (b.overflow) return ZS_BAD_SEQUENCE_STREAM;
        const zs_u32 of_code = sh->of.symbol[of_state];
        const zs_u32 ll_code = sh->ll.symbol[ll_state];
        const zs_u32 ml_code = sh->ml.symbol[ml_state];
        zs_u64 offset;
        if (of_code > 1) {
            offset = (1ull << of_code) + zs_back_read(&b, of_code) - 3;
            r2 = r1;
            r1 = r0;
            r0 = offset;
        } else {
            const zs_u32 ll0 = ll_code == 0;
            if (of_code == 0) {
                // Repeat offset 1, or 2 (swapped to the front) after no literals.
                offset = ll0 ? r1 : r0;
                r1 = ll0 ? r0 : r1;
                r0 = offset;
            } else {
                const zs_u32 index = 1 + ll0 + zs_back_read(&b, 1);
                const zs_u64 value = index == 3 ? r0 - 1 : index == 2 ? r2 : r1;
                if (value == 0) return ZS_BAD_SEQUENCE;
                if (index != 1) r2 = r1;
                r1 = r0;
                r0 = value;
                offset = value;
            }
        }
        zs_u32 ml_base, ml_bits, ll_base, ll_bits;
        zs_ml(ml_code, &ml_base, &ml_bits);
        zs_ll(ll_code, &ll_base, &ll_bits);
        // The match length's extra bits, then the literal length's, in one read (at most 32).
        const zs_u32 extra = zs_back_read(&b, ml_bits + ll_bits);
        const zs_u64 ml = ml_base + (extra >> ll_bits);
        const zs_u64 ll = ll_base + (extra & ((1u << ll_bits) - 1));
        if (k + 1 < count) {
            // The three state updates (literal length, match length, offset), one read of at
            // most 26 bits.
            const zs_u32 lb = sh->ll.bits[ll_state], mb = sh->ml.bits[ml_state], ob = sh->of.bits[of_state];
            const zs_u32 v = zs_back_read(&b, lb + mb + ob);
            ll_state = sh->ll.base[ll_state] + (v >> (mb + ob));
            ml_state = sh->ml.base[ml_state] + ((v >> ob) & ((1u << mb) - 1));
            of_state = sh->of.base[of_state] + (v & ((1u << ob) - 1));
        }
        if (b.overflow) return ZS_BAD_SEQUENCE_STREAM;
        // Literals within the block's, the match within the capacity left once every literal
        // is placed (so that it never reaches the literals still to copy), the offset within
        // the frame's output.
        if (ll > lit_count - lp) return ZS_BAD_SEQUENCE;
        matched += ml;
        if (matched > capacity - op0 - lit_count) return ZS_PAST_CAPACITY;
        if (lit_count + matched > block_max) return ZS_BAD_SEQUENCE;
        if (offset > op + ll - frame_start) return ZS_BAD_SEQUENCE;
        const zs_u64 n = ll + ml;
        if (offset >= n && (!lits_in_out || lits + lp >= out + op + n)) {
            // The match lies wholly before this sequence's bytes and the literals apart from
            // them: literals and match in one pass (one round trip to memory, not two).
            // (op + i - offset: at least 0 for i >= ll, the offset being within op + ll.)
            const zs_u8* lit = lits + lp;
            ZS_FOR_LANES(i, n) out[op + i] = i < ll ? lit[i] : out[op + i - offset];
            ZS_SYNC();
            op += n;
            lp += ll;
            continue;
        }
        if (lits_in_out) zs_copy_down(out + op, lits + lp, ll);
        else {
            ZS_FOR_LANES(i, ll) out[op + i] = lits[lp + i];
            ZS_SYNC();
        }
        op += ll;
        lp += ll;
        zs_match(out + op, offset, ml);
        op += ml;
    }
    if (b.overflow || b.left != 0) return ZS_BAD_SEQUENCE_STREAM;
    rep[0] = r0;
    rep[1] = r1;
    rep[2] = r2;
    const zs_u64 rest = lit_count - lp;
    if (lits_in_out) zs_copy_down(out + op, lits + lp, rest);
    else {
        ZS_FOR_LANES(i, rest) out[op + i] = lits[lp + i];
        ZS_SYNC();
    }
    *op_io = op + rest;
    return ZS_OK;
}

// The frame in[0, n) decoded into out[0, capacity); *written: the bytes decoded before it ended.
// The frame header of in[0, n) (RFC 8878 3.1.1.1), n at least 1, for an output of `capacity`
// bytes: where its first block starts, the largest block its window allows, whether a content
// checksum ends the frame; a status.
ZS_FN zs_u32 zs_frame_header(const zs_u8* in, zs_u64 n, zs_u64 capacity, zs_u64* first_block, zs_u32* block_max,
                             zs_u32* checksum) {
    if (n < 5) return ZS_TRUNCATED;
    const zs_u32 magic = in[0] | ((zs_u32)in[1] << 8) | ((zs_u32)in[2] << 16) | ((zs_u32)in[3] << 24);
    if (magic != 0xFD2FB528u) return ZS_BAD_FRAME;
    const zs_u32 fhd = in[4];
    if (fhd & 0x08) return ZS_BAD_FRAME;  // reserved bit
    const zs_u32 fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, dict_flag = fhd & 3;
    *checksum = (fhd >> 2) & 1;
    const zs_u64 dict_bytes = dict_flag == 0 ? 0 : dict_flag == 1 ? 1 : dict_flag == 2 ? 2 : 4;
    const zs_u64 fcs_bytes = fcs_flag == 0 ? (single ? 1 : 0) : fcs_flag == 1 ? 2 : fcs_flag == 2 ? 4 : 8;
    zs_u64 ip = 5;
    const zs_u64 header = ip + (single ? 0 : 1) + dict_bytes + fcs_bytes;
    if (header > n) return ZS_TRUNCATED;
    zs_u64 window = 0;
    if (!single) {
        const zs_u32 wd = in[ip++];
        const zs_u32 log = 10 + (wd >> 3);
        if (log > 31) return ZS_BAD_FRAME;
        const zs_u64 base = 1ull << log;
        window = base + (base >> 3) * (wd & 7);
    }
    zs_u64 dict = 0;
    for (zs_u64 k = 0; k < dict_bytes; ++k) dict |= (zs_u64)in[ip + k] << (8 * k);
    ip += dict_bytes;
    if (dict != 0) return ZS_BAD_FRAME;  // a dictionary we do not have
    zs_u64 content = 0;
    for (zs_u64 k = 0; k < fcs_bytes; ++k) content |= (zs_u64)in[ip + k] << (8 * k);
    if (fcs_flag == 1) content += 256;
    ip += fcs_bytes;
    if (single) window = content;
    *block_max = window < ZS_MAX_BLOCK ? (zs_u32)window : ZS_MAX_BLOCK;
    *first_block = ip;
    if (fcs_bytes > 0 && content != capacity) return ZS_SIZE_MISMATCH;
    return ZS_OK;
}

ZS_FN zs_u32 zs_frame(ZsShared* sh, const zs_u8* in, zs_u64 n, zs_u8* out, zs_u64 capacity, zs_u64* written) {
    *written = 0;
    if (n == 0) return capacity == 0 ? ZS_OK : ZS_SIZE_MISMATCH;
    zs_u64 ip = 0;
    zs_u32 block_max = 0, checksum = 0;
    const zs_u32 head = zs_frame_header(in, n, capacity, &ip, &block_max, &checksum);
    if (head != ZS_OK) return head;
    sh->huf_valid = 0;
    sh->tables_valid = 0;
    zs_u64 rep[3] = {1, 4, 8};
    zs_u64 op = 0;
    for (;;) {
        if (n - ip < 3) return ZS_TRUNCATED;
        const zs_u32 bh = in[ip] | ((zs_u32)in[ip + 1] << 8) | ((zs_u32)in[ip + 2] << 16);
        ip += 3;
        const zs_u32 last = bh & 1, type = (bh >> 1) & 3;
        const zs_u64 size = bh >> 3;
        zs_u32 status = ZS_OK;
        if (type == 3) return ZS_BAD_BLOCK;
        if (type == 1) {
            // RLE: one byte, `size` times.
            if (n - ip < 1) return ZS_TRUNCATED;
            if (size > block_max) return ZS_BAD_BLOCK;
            if (size > capacity - op) return ZS_PAST_CAPACITY;
            const zs_u8 v = in[ip];
            ZS_FOR_LANES(i, size) out[op + i] = v;
            ZS_SYNC();
            op += size;
            ip += 1;
        } else {
            if (size > n - ip) return ZS_TRUNCATED;
            if (type == 0) {
                if (size > block_max) return ZS_BAD_BLOCK;
                if (size > capacity - op) return ZS_PAST_CAPACITY;
                ZS_FOR_LANES(i, size) out[op + i] = in[ip + i];
                ZS_SYNC();
                op += size;
            } else {
                status = zs_compressed_block(sh, in + ip, size, out, &op, 0, capacity, block_max, rep);
            }
            ip += size;
        }
        *written = op;
        if (status != ZS_OK) return status;
        if (last) break;
    }
    if (checksum) {
        if (n - ip < 4) return ZS_TRUNCATED;
        ip += 4;
    }
    if (ip != n) return ZS_BAD_FRAME;  // bytes after the frame (another frame, or damage)
    if (op != capacity) return ZS_SIZE_MISMATCH;
    return ZS_OK;
}

// Frame k of n: thread block k (one warp). Its status and decoded length go to statuses[k] and
// decoded[k].
extern "C" __global__ void zstd_decode_frames(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                                              const unsigned long long* capacities, unsigned char* const* outputs,
                                              unsigned long long* decoded, unsigned int* statuses,
                                              unsigned long long n) {
    ZS_SHARED ZsShared shared;
    const unsigned long long k = blockIdx.x;
    if (k >= n) return;
    zs_u64 written = 0;
    const zs_u32 status = zs_frame(&shared, inputs[k], input_sizes[k], outputs[k], capacities[k], &written);
    if (ZS_LANE == 0) {
        statuses[k] = status;
        decoded[k] = written;
    }
}

