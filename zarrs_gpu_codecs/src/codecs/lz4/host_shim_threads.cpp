// host_shim.cpp with the thread block's 256 threads emulated one after the other.
#define LZ4_EMULATE_THREADS
#include "host_shim.cpp"
