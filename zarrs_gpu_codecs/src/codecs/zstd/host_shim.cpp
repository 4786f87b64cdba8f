// The zstd kernels (entropy.cu, decode.cu, blocks.cu, bytes.cu) compiled for the CPU, for the
// tests: CUDA's names defined so that a warp runs on one thread doing every lane's work in order
// (lane-strided loops become plain loops, __syncwarp nothing), and host entries that run each
// kernel's grid block by block.
#define ZS_HOST_SHIM
#define ZS_LANES 1u
#define ZS_LANE 0u
#define ZS_SYNC() ((void)0)
#define ZS_FN static inline
#define ZS_SHARED static thread_local
#define ZS_CONST static const
#define ZS_FOR_LANES(i, n) for (unsigned long long i = 0; i < (n); ++i)
#include "../host_shim.h"

#include "entropy.cu"
#include "decode.cu"
#include "blocks.cu"
#include "bytes.cu"

// Runs the kernel over n frames as a grid of one warp per thread block would.
extern "C" void zstd_decode_frames_on_host(const HostItemPointers* a, unsigned long long n) {
    blockDim.x = 32;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_decode_frames(a->inputs, a->input_sizes, a->capacities, a->outputs, a->decoded, a->statuses, n);
    }
}

// The block-parallel decoder's launches, each grid run block by block.
extern "C" void zstd_plan_on_host(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                                  const unsigned long long* capacities, void* frames, void* blocks,
                                  unsigned long long n) {
    blockDim.x = 32;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_plan(inputs, input_sizes, capacities, (ZsFramePlan*)frames, (ZsBlockPlan*)blocks, n);
    }
}

extern "C" void zstd_decode_blocks_on_host(const unsigned char* const* inputs, const void* frames, void* blocks,
                                           unsigned char* lit_scratch, unsigned int* seq_scratch,
                                           unsigned long long n_blocks, unsigned long long split,
                                           const unsigned int* chains, unsigned long long literals_done,
                                           unsigned int* tables) {
    blockDim.x = 32;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n_blocks; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_decode_blocks(inputs, (const ZsFramePlan*)frames, (ZsBlockPlan*)blocks, lit_scratch, seq_scratch, n_blocks,
                           split, chains, literals_done, tables);
    }
}

// A lane a block: a thread block of one thread each.
extern "C" void zstd_sequence_lanes_on_host(const unsigned char* const* inputs, const void* frames, void* blocks,
                                            unsigned int* seq_scratch, const unsigned int* tables,
                                            unsigned long long n_blocks) {
    blockDim.x = 1;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n_blocks; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_sequence_lanes(inputs, (const ZsFramePlan*)frames, (ZsBlockPlan*)blocks, seq_scratch, tables, n_blocks);
    }
    blockDim.x = 32;
}

extern "C" void zstd_block_literals_on_host(const unsigned char* const* inputs, const void* frames, void* blocks,
                                            unsigned char* lit_scratch, unsigned long long n_blocks) {
    blockDim.x = 32;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n_blocks; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_block_literals(inputs, (const ZsFramePlan*)frames, (ZsBlockPlan*)blocks, lit_scratch, n_blocks);
    }
}

extern "C" void zstd_execute_on_host(const unsigned char* const* inputs, const unsigned long long* capacities,
                                     unsigned char* const* outputs, unsigned long long* decoded, unsigned int* statuses,
                                     const void* frames, const void* blocks, const unsigned char* lit_scratch,
                                     const unsigned int* seq_scratch, unsigned long long n, unsigned int threads) {
    blockDim.x = threads;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_execute(inputs, capacities, outputs, decoded, statuses, (const ZsFramePlan*)frames,
                     (const ZsBlockPlan*)blocks, lit_scratch, seq_scratch, n);
    }
}

// The jump path's launches (decode.rs launches them in this order on the device).
extern "C" void zstd_link_on_host(const unsigned long long* capacities, unsigned long long* decoded,
                                  unsigned int* statuses, const void* frames, void* blocks, unsigned int* pass_flags,
                                  unsigned int passes, unsigned long long n) {
    blockDim.x = 32;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n; ++k) {
        blockIdx.x = (unsigned int)k;
        zstd_link(capacities, decoded, statuses, (const ZsFramePlan*)frames, (ZsBlockPlan*)blocks, pass_flags, passes,
                  n);
    }
}

extern "C" void zstd_entries_on_host(const unsigned char* const* inputs, unsigned long long* decoded,
                                     unsigned int* statuses, const void* frames, const void* blocks,
                                     const unsigned char* lit_scratch, const unsigned int* seq_scratch,
                                     unsigned int* entries, unsigned long long n_blocks, unsigned int parts) {
    blockDim.x = 32;
    threadIdx.x = 0;
    gridDim.y = parts;
    for (unsigned long long k = 0; k < n_blocks; ++k) {
        blockIdx.x = (unsigned int)k;
        // A block's parts last first: a part must not lean on an earlier one's writes.
        for (unsigned int y = parts; y-- > 0;) {
            blockIdx.y = y;
            zstd_entries(inputs, decoded, statuses, (const ZsFramePlan*)frames, (const ZsBlockPlan*)blocks,
                         lit_scratch, seq_scratch, entries, n_blocks);
        }
    }
    gridDim.y = 1;
    blockIdx.y = 0;
}

extern "C" void zstd_jump_on_host(unsigned int* entries, unsigned long long total, unsigned int* pass_flags,
                                  unsigned int passes) {
    // One thread block taking every tile (the kernel runs them last first here).
    blockDim.x = 32;
    threadIdx.x = 0;
    blockIdx.x = 0;
    gridDim.x = 1;
    for (unsigned int t = 0; t < passes; ++t) zstd_jump(entries, total, pass_flags, t);
}

extern "C" void zstd_write_on_host(const unsigned long long* capacities, unsigned char* const* outputs,
                                   unsigned long long* decoded, unsigned int* statuses, const void* frames,
                                   const unsigned int* entries, unsigned long long n, unsigned int grid_y) {
    blockDim.x = 32;
    threadIdx.x = 0;
    gridDim.y = grid_y;
    for (unsigned long long k = 0; k < n; ++k) {
        for (unsigned int y = 0; y < grid_y; ++y) {
            blockIdx.x = (unsigned int)k;
            blockIdx.y = y;
            zstd_write(capacities, outputs, decoded, statuses, (const ZsFramePlan*)frames, entries, n);
        }
    }
    blockIdx.y = 0;
}

extern "C" unsigned long long zstd_plan_sizes_on_host(void) {
    return (unsigned long long)sizeof(ZsFramePlan) | ((unsigned long long)sizeof(ZsBlockPlan) << 32);
}
