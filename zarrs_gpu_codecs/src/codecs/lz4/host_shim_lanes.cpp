// The LZ4 kernel (decode.cu) with a thread block's threads as OS threads, for a test of its
// barriers: __syncthreads is a barrier of all the block's threads that have not returned (as on
// the device), after which every thread but thread 0 sleeps a while, so that thread 0 runs ahead
// of the others as a busy device may let it. A thread that reads shared state thread 0 has moved
// on from then reads it; each thread counts the barriers it passed, equal in a sound kernel.
// One block at a time (its shared memory is one static instance).
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#define LZ4_HOST_SHIM
#define LZ4_FN static inline
#define LZ4_SHARED static
namespace lanes {
thread_local unsigned int tid;
unsigned int threads = 1, ahead_us = 0, live = 0, arrived = 0, generation = 0;
std::mutex m;
std::condition_variable cv;
std::vector<unsigned int> barriers;

void release_if_full() {
    if (arrived > 0 && arrived >= live) {
        arrived = 0;
        ++generation;
        cv.notify_all();
    }
}

void sync() {
    {
        std::unique_lock<std::mutex> lock(m);
        ++barriers[tid];
        const unsigned int seen = generation;
        ++arrived;
        release_if_full();
        cv.wait(lock, [&] { return generation != seen; });
    }
    if (tid != 0 && ahead_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(ahead_us));
}

void exit_block() {
    std::lock_guard<std::mutex> lock(m);
    --live;
    release_if_full();
}

void atomic_min(unsigned int* p, unsigned int v) {
    unsigned int old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}
}  // namespace lanes

#define LZ4_THREADS lanes::threads
#define LZ4_TID lanes::tid
#define LZ4_SYNC() lanes::sync()
#define LZ4_ATOMIC_MIN(p, v) lanes::atomic_min((p), (v))
#define LZ4_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define LZ4_FOR_THREADS(i, n) for (unsigned int i = LZ4_TID; i < (n); i += LZ4_THREADS)
#define lz4_decode_blocks lz4_decode_blocks_lanes
#include "../host_shim.h"
#include "decode.cu"

// Decode one block in[0, n) into out[0, capacity) with `threads` threads (1 to 1,024), all but
// thread 0 sleeping `ahead_us` after each barrier: its status and decoded length, and the
// fewest and most barriers a thread passed.
extern "C" void lz4_decode_block_on_lanes(const unsigned char* in, unsigned long long n, unsigned char* out,
                                          unsigned long long capacity, unsigned int threads, unsigned int ahead_us,
                                          unsigned int* status, unsigned long long* decoded,
                                          unsigned int* fewest_barriers, unsigned int* most_barriers) {
    static std::mutex one_block;
    std::lock_guard<std::mutex> block(one_block);
    lanes::threads = threads < 1 ? 1 : threads > 1024 ? 1024 : threads;
    lanes::ahead_us = ahead_us;
    lanes::live = lanes::threads;
    lanes::arrived = 0;
    lanes::barriers.assign(lanes::threads, 0);
    const unsigned char* inputs[1] = {in};
    unsigned char* outputs[1] = {out};
    const unsigned long long sizes[1] = {n}, capacities[1] = {capacity};
    std::vector<std::thread> pool;
    for (unsigned int t = 0; t < lanes::threads; ++t) {
        pool.emplace_back([&, t] {
            lanes::tid = t;
            blockDim.x = lanes::threads;
            threadIdx.x = t;
            blockIdx.x = 0;
            lz4_decode_blocks_lanes(inputs, sizes, capacities, outputs, decoded, status, nullptr, 1);
            lanes::exit_block();
        });
    }
    for (std::thread& thread : pool) thread.join();
    *fewest_barriers = *most_barriers = lanes::barriers[0];
    for (unsigned int count : lanes::barriers) {
        if (count < *fewest_barriers) *fewest_barriers = count;
        if (count > *most_barriers) *most_barriers = count;
    }
}
