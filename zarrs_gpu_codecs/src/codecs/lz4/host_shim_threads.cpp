// host_shim.cpp with a thread block's threads (as many as the launch takes) emulated one after
// the other.
#define LZ4_EMULATE_THREADS
#include "host_shim.cpp"
