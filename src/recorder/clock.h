// The recorder's one clock: CLOCK_MONOTONIC in nanoseconds.
//
// Event order across threads is reconstructed from these timestamps (see
// thread_buffer.h), so the clock must be one system-wide monotonic clock,
// not a per-CPU counter. The vDSO makes it a ~20 ns call without a syscall.
#pragma once

#include <time.h>

#include <cstdint>

namespace heapsnap::recorder {

inline uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace heapsnap::recorder
