// The LZ4 kernel (decode.cu) compiled for the CPU, for the tests: CUDA's names defined so that a
// warp runs on one thread, and a host entry that runs the kernel's grid warp by warp. Two
// builds: one thread doing the warp's work in order (lane-strided loops become plain loops), and
// (LZ4_EMULATE_LANES, host_shim_lanes.cpp) the 32 lanes' strided loops run one lane after the
// other, so that the device's index arithmetic runs here too. __syncwarp is nothing: one thread.
// The entry of this build, lz4_decode_blocks_on_host, runs either.
#define LZ4_HOST_SHIM
#define LZ4_LANE 0u
#define LZ4_SYNC() ((void)0)
#define LZ4_FN static inline
#ifdef LZ4_EMULATE_LANES
#define LZ4_LANES 32u
#define LZ4_FOR_LANES(i, n)                                               \
    for (unsigned int lz4_lane = 0; lz4_lane < LZ4_LANES; ++lz4_lane) \
        for (unsigned long long i = lz4_lane; i < (n); i += LZ4_LANES)
#define lz4_decode_blocks lz4_decode_blocks_lanes
#define LZ4_HOST_ENTRY lz4_decode_blocks_on_host_lanes
#else
#define LZ4_LANES 1u
#define LZ4_FOR_LANES(i, n) for (unsigned long long i = 0; i < (n); ++i)
#define LZ4_HOST_ENTRY lz4_decode_blocks_one_thread
#endif
#include "../host_shim.h"

#include "decode.cu"

// Runs the kernel over n blocks as a grid of one warp per thread block would.
extern "C" void LZ4_HOST_ENTRY(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                               const unsigned long long* capacities, unsigned char* const* outputs,
                               unsigned long long* decoded, unsigned int* statuses, const unsigned int* tags,
                               unsigned long long n) {
    blockDim.x = 32;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n; ++k) {
        blockIdx.x = (unsigned int)k;
        lz4_decode_blocks(inputs, input_sizes, capacities, outputs, decoded, statuses, tags, n);
    }
}

#ifndef LZ4_EMULATE_LANES
extern "C" void lz4_decode_blocks_on_host_lanes(const unsigned char* const* inputs,
                                                const unsigned long long* input_sizes,
                                                const unsigned long long* capacities, unsigned char* const* outputs,
                                                unsigned long long* decoded, unsigned int* statuses,
                                                const unsigned int* tags, unsigned long long n);

// The kernel over n blocks, a warp's lanes emulated one after the other where `lanes` is not 0.
extern "C" void lz4_decode_blocks_on_host(const HostItemPointers* a, const unsigned int* tags, unsigned long long n,
                                          unsigned int lanes) {
    (lanes ? lz4_decode_blocks_on_host_lanes : lz4_decode_blocks_one_thread)(
        a->inputs, a->input_sizes, a->capacities, a->outputs, a->decoded, a->statuses, tags, n);
}
#endif
