// Does a zstd block's sequence bitstream resynchronise? A decoder started at a wrong place (a bit
// position of the stream with states read there, or the right position with one state wrong)
// is followed until it meets the true decode (the same bit position and the same three states),
// for 40 starts a block. If it met it within a few sequences, a block's sequences could be split
// over lanes (each lane starting anywhere, the earlier lane's run confirming the later's); it
// does not (benches/RESULTS.md, thirty-third session).
//
// Built by benches/fse_resync.sh against the device kernels' own sources and the crate's CPU shim,
// blocks.cu given a hook that calls exp_block once a block's three tables are built.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>
// The crate's CPU shim of the zstd kernels (their sources, blocks.cu with the hook).
#include "zstd/host_shim.cpp"

namespace {
const zs_u8* S;
const zs_u64 *LLT, *MLT;
const zs_u32* OFT;
long trials = 0, fails = 0;
std::vector<int> dists;
int mode = 0;

// n bits ending at bit L (exclusive), the stream read backwards.
unsigned rd(zs_u64& L, unsigned n) {
    if (n == 0) return 0;
    if (L < n) {
        L = 0;
        return 0;
    }
    const zs_u64 lo = L - n;
    unsigned v = 0;
    for (unsigned i = 0; i < n; ++i) v |= ((S[(lo + i) >> 3] >> ((lo + i) & 7)) & 1u) << i;
    L = lo;
    return v;
}

struct State {
    zs_u64 L;
    unsigned ll, of, ml;
};

// One sequence: its offset's, match and literal lengths' extra bits, then the three updates.
void step(State& s) {
    const zs_u64 le = LLT[s.ll], me = MLT[s.ml];
    const zs_u32 oe = OFT[s.of];
    const unsigned llh = (unsigned)(le >> 32), mlh = (unsigned)(me >> 32);
    rd(s.L, oe & 0xFF);
    rd(s.L, (mlh >> 8) & 0xFF);
    rd(s.L, (llh >> 8) & 0xFF);
    const unsigned a = rd(s.L, llh & 0xFF), b = rd(s.L, mlh & 0xFF), c = rd(s.L, (oe >> 8) & 0xFF);
    s.ll = (llh >> 16) + a;
    s.ml = (mlh >> 16) + b;
    s.of = (oe >> 16) + c;
}
}  // namespace

void exp_block(const zs_u64* ll_t, const zs_u64* ml_t, const zs_u32* of_t, zs_u32 ll_log, zs_u32 of_log,
               zs_u32 ml_log, const zs_u8* stream, zs_u64 len, zs_u64 count) {
    S = stream;
    LLT = ll_t;
    MLT = ml_t;
    OFT = of_t;
    State s{8 * (len - 1) + zs_highbit(stream[len - 1]), 0, 0, 0};
    s.ll = rd(s.L, ll_log);
    s.of = rd(s.L, of_log);
    s.ml = rd(s.L, ml_log);
    std::unordered_map<zs_u64, State> truth;  // by bit position, before each sequence
    std::vector<zs_u64> at;
    for (zs_u64 k = 0; k < count; ++k) {
        truth[s.L] = s;
        at.push_back(s.L);
        if (k + 1 < count) step(s);
    }
    for (int j = 1; j < 40; ++j) {
        State q{at[0] * j / 40, 0, 0, 0};
        if (mode == 1) {
            q = truth[at[count * j / 40]];
            q.ll ^= 1;
        } else {
            q.ll = rd(q.L, ll_log);
            q.of = rd(q.L, of_log);
            q.ml = rd(q.L, ml_log);
        }
        trials += 1;
        int met = -1;
        for (int k = 0; k < 5000 && q.L > 0; ++k) {
            const auto it = truth.find(q.L);
            if (it != truth.end() && it->second.ll == q.ll && it->second.of == q.of && it->second.ml == q.ml) {
                met = k;
                break;
            }
            step(q);
        }
        if (met < 0) fails += 1;
        else dists.push_back(met);
    }
}

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fse_resync FRAME.zst MODE (0: anywhere, 1: one state wrong)\n");
        return 2;
    }
    mode = std::atoi(argv[2]);
    std::vector<zs_u8> in(64 << 20);
    FILE* f = std::fopen(argv[1], "rb");
    if (!f) return 2;
    const size_t n = std::fread(in.data(), 1, in.size(), f);
    std::fclose(f);
    static ZsFramePlan frame;
    static ZsBlockPlan blocks[4096];
    frame.block_slots = 4096;
    frame.lit_slots = 1ull << 30;
    frame.seq_slots = 1ull << 30;
    zs_plan_frame(in.data(), n, 1ull << 20, 0, &frame, blocks);  // the chunks decode to 1 MiB
    std::vector<zs_u8> lits(1 << 22);
    std::vector<zs_u32> seqs(3u << 22);
    static ZsShared sh;
    for (zs_u32 b = 0; b < frame.blocks; ++b)
        if (blocks[b].kind == 2) zs_block_sequences(&sh, in.data(), frame.block_max, &blocks[b], lits.data(), seqs.data());
    std::sort(dists.begin(), dists.end());
    std::printf("%s: %u blocks, %ld starts, %ld never met the true decode within 5,000 sequences", argv[1], frame.blocks,
                trials, fails);
    if (!dists.empty()) std::printf("; the others met it after %d (median)", dists[dists.size() / 2]);
    std::printf("\n");
    return 0;
}
