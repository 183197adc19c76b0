// Scaling a sampled log (`heapsnap run --sample-bytes N`) back to estimates.
//
// The recorder records a block of s bytes with probability
// p(s) = 1 - exp(-s/N), and always when s >= N (src/recorder/sampler.h).
// The replay counts each recorded block as w blocks of s bytes, where w is
// 1/p(s) rounded up or down at random with the odds that keep the mean at
// exactly 1/p(s) (the Horvitz-Thompson estimate, in whole blocks so every
// total, per site and overall, stays an integer and adds up). The random
// choice is a hash of the block's address and time: replaying a log twice
// gives the same numbers.
#pragma once

#include <cmath>
#include <cstdint>

namespace heapsnap {

// 1/p(s), for a block recorded with probability p(s) < 1.
inline double sample_inverse(uint64_t size, uint64_t sample_bytes) {
    return 1.0 / -std::expm1(-static_cast<double>(size ? size : 1) / static_cast<double>(sample_bytes));
}

inline uint64_t sample_weight(uint64_t size, uint64_t sample_bytes, uint64_t salt) {
    if (!sample_bytes || size >= sample_bytes) return 1;
    double inverse = sample_inverse(size, sample_bytes);
    double whole = std::floor(inverse);
    salt ^= salt >> 33;
    salt *= 0xff51afd7ed558ccdULL;
    salt ^= salt >> 33;
    double uniform = static_cast<double>(salt >> 11) * 0x1.0p-53;  // [0, 1)
    return static_cast<uint64_t>(whole) + (uniform < inverse - whole ? 1 : 0);
}

// What sample_weight returns rounded down: every weight of a block of
// `size` bytes is this or one more.
inline uint64_t sample_weight_floor(uint64_t size, uint64_t sample_bytes) {
    if (!sample_bytes || size >= sample_bytes) return 1;
    return static_cast<uint64_t>(std::floor(sample_inverse(size, sample_bytes)));
}

}  // namespace heapsnap
