// The LZ4 kernel (decode.cu) compiled for the CPU, for the tests: CUDA's names defined so that a
// thread block runs on one thread, and a host entry that runs the kernel's grid block by block.
// Two builds: one thread doing the block's work in order (thread-strided loops become plain
// loops), and (LZ4_EMULATE_THREADS, host_shim_threads.cpp) a launch's threads' strided loops run
// one thread after the other, so that the device's index arithmetic and the pointer passes' other
// orders run here too. __syncthreads is nothing: one thread. The entry of this build,
// lz4_decode_blocks_on_host, runs either.
#define LZ4_HOST_SHIM
#define LZ4_TID 0u
#define LZ4_SYNC() ((void)0)
#define LZ4_FN static inline
#define LZ4_SHARED static thread_local
#define LZ4_ATOMIC_MIN(p, v) lz4_host_min((p), (v))
#define LZ4_ATOMIC_ADD(p, v) lz4_host_add((p), (v))
#ifdef LZ4_EMULATE_THREADS
static thread_local unsigned int lz4_emulated_threads = 256;  // the launch's blockDim.x
#define LZ4_THREADS lz4_emulated_threads
#define LZ4_FOR_THREADS(i, n)                                                   \
    for (unsigned int lz4_thread = 0; lz4_thread < LZ4_THREADS; ++lz4_thread) \
        for (unsigned int i = lz4_thread; i < (n); i += LZ4_THREADS)
#define lz4_decode_blocks lz4_decode_blocks_threads
#define LZ4_HOST_ENTRY lz4_decode_blocks_on_host_threads
#else
#define LZ4_THREADS 1u
#define LZ4_FOR_THREADS(i, n) for (unsigned int i = 0; i < (n); ++i)
#define LZ4_HOST_ENTRY lz4_decode_blocks_one_thread
#endif
#include "../host_shim.h"

static inline void lz4_host_min(unsigned int* p, unsigned int v) {
    if (v < *p) *p = v;
}

static inline unsigned int lz4_host_add(unsigned int* p, unsigned int v) {
    const unsigned int old = *p;
    *p += v;
    return old;
}

#include "decode.cu"

// Runs the kernel over n blocks as a grid of one thread block per LZ4 block would, with `threads`
// threads a block (emulated; the one-thread build takes 1).
extern "C" void LZ4_HOST_ENTRY(const unsigned char* const* inputs, const unsigned long long* input_sizes,
                               const unsigned long long* capacities, unsigned char* const* outputs,
                               unsigned long long* decoded, unsigned int* statuses, const unsigned int* tags,
                               unsigned long long n, unsigned int threads) {
#ifdef LZ4_EMULATE_THREADS
    lz4_emulated_threads = threads;
#else
    (void)threads;
#endif
    blockDim.x = LZ4_THREADS;
    threadIdx.x = 0;
    for (unsigned long long k = 0; k < n; ++k) {
        blockIdx.x = (unsigned int)k;
        lz4_decode_blocks(inputs, input_sizes, capacities, outputs, decoded, statuses, tags, n);
    }
}

#ifndef LZ4_EMULATE_THREADS
extern "C" void lz4_decode_blocks_on_host_threads(const unsigned char* const* inputs,
                                                  const unsigned long long* input_sizes,
                                                  const unsigned long long* capacities, unsigned char* const* outputs,
                                                  unsigned long long* decoded, unsigned int* statuses,
                                                  const unsigned int* tags, unsigned long long n,
                                                  unsigned int threads);

// The kernel over n blocks, a thread block's `threads` threads emulated one after the other
// where it is not 0.
extern "C" void lz4_decode_blocks_on_host(const HostItemPointers* a, const unsigned int* tags, unsigned long long n,
                                          unsigned int threads) {
    (threads ? lz4_decode_blocks_on_host_threads : lz4_decode_blocks_one_thread)(
        a->inputs, a->input_sizes, a->capacities, a->outputs, a->decoded, a->statuses, tags, n, threads);
}
#endif
