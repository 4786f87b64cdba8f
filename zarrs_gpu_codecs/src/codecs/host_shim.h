// CUDA's names for the device kernels compiled for the CPU (lz4/host_shim.cpp, zstd/host_shim.cpp):
// a thread block (LZ4) or a warp (zstd) runs on one thread, so the qualifiers are nothing and the
// grid's indices are variables that each host entry sets as it runs the grid block by block.
#ifndef ZARRS_GPU_HOST_SHIM_H
#define ZARRS_GPU_HOST_SHIM_H

#define __global__
#define __device__
#define __forceinline__

namespace {
struct Dim3 {
    unsigned int x, y, z;
};
// Per thread: test threads run grids side by side.
__attribute__((unused)) thread_local Dim3 blockIdx, blockDim, threadIdx, gridDim;
}  // namespace

// A batch's item arrays as the host entries take them (codecs::HostItemPointers): inputs,
// their sizes, capacities, outputs, and where the decoded lengths and statuses go.
struct HostItemPointers {
    const unsigned char* const* inputs;
    const unsigned long long* input_sizes;
    const unsigned long long* capacities;
    unsigned char* const* outputs;
    unsigned long long* decoded;
    unsigned int* statuses;
};

#endif
