// host_shim.cpp with the warp's 32 lanes emulated one after the other.
#define LZ4_EMULATE_LANES
#include "host_shim.cpp"
