// The recorder's clock.
//
// Event order across threads is reconstructed from timestamps (see
// thread_buffer.h), so the clock must be one system-wide monotonic clock.
// When the kernel's clocksource is "tsc", the kernel has checked that the
// TSC is invariant and synchronized across CPUs, and the recorder stamps
// events with the TSC directly (lfence; rdtsc: ~8 ns, ordered after every
// earlier instruction as the ordering rule needs). Otherwise it stamps with
// CLOCK_MONOTONIC (vDSO, ~20 ns). Stamps are "ticks"; the writer converts
// them to nanoseconds with a rate calibrated at start and refined on every
// merge round, so reported times are CLOCK_MONOTONIC nanoseconds either way.
#pragma once

#include <time.h>
#include <x86intrin.h>

#include <cstdint>

namespace heapsnap::recorder {

inline uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

extern bool g_clock_is_tsc;

inline uint64_t now_ticks() {
    if (g_clock_is_tsc) {
        _mm_lfence();
        return __rdtsc();
    }
    return now_ns();
}

// A stamp for a process with one recording thread (thread_buffer.h, "One
// thread"): the same clock without the lfence.
inline uint64_t now_ticks_unordered() {
    if (g_clock_is_tsc) return __rdtsc();
    return now_ns();
}

// Chooses the clock and calibrates the TSC (about 200 us). Call once at
// start, before any event.
void init_clock();
// Converts a stamp to CLOCK_MONOTONIC nanoseconds.
uint64_t ticks_to_ns(uint64_t ticks);
// Refines the conversion rate with a fresh (ticks, ns) pair (writer).
void recalibrate_clock();

}  // namespace heapsnap::recorder
