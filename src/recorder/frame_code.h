// The stack table's in-memory form of a stack's return addresses
// (stack_table.cpp keeps every stack it interns this way).
//
// Per frame, innermost first, its return address minus the one before
// (the first: minus 0), as
//   2 bytes, bit 0 clear: a delta of 15 bits (signed) above it;
//   4 bytes, bits 0-1 = 01: a delta of 30 bits;
//   9 bytes, first byte 0x03: the address itself (a call from one module
//   into another far away, as libc's into main: a frame or two a stack).
// Little-endian, as the recorder only runs on x86-64.
//
// Why: return addresses of one module lie within a few MiB of each other,
// so on a compiler's stacks most frames take 2 or 4 bytes instead of 8.
// Varints would be a little smaller, but a frame of this code decodes
// without a loop or a branch on its width, and the stack table's lookups
// compare stacks frame by frame (figures: docs/bench-history.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace heapsnap::recorder::frame_code {

inline constexpr uint8_t kWide = 0x03;
inline constexpr size_t kMaxBytesPerFrame = 9;
// A frame is read as 4 bytes, two past a short one: a buffer decoded must
// have this many readable bytes after its code.
inline constexpr size_t kReadSlack = 2;

// Writes the code of ips[0..n) to out (room for n * kMaxBytesPerFrame)
// and returns its length.
inline size_t encode(const uint64_t* ips, uint32_t n, uint8_t* out) {
    uint8_t* at = out;
    uint64_t before = 0;
    for (uint32_t i = 0; i < n; ++i) {
        auto delta = static_cast<int64_t>(ips[i] - before);
        if (delta >= -(1 << 14) && delta < (1 << 14)) {
            auto word = static_cast<uint16_t>(static_cast<uint32_t>(delta) << 1);
            std::memcpy(at, &word, sizeof word);
            at += sizeof word;
        } else if (delta >= -(1 << 29) && delta < (1 << 29)) {
            uint32_t word = static_cast<uint32_t>(delta) << 2 | 1;
            std::memcpy(at, &word, sizeof word);
            at += sizeof word;
        } else {
            *at++ = kWide;
            std::memcpy(at, &ips[i], sizeof ips[i]);
            at += sizeof ips[i];
        }
        before = ips[i];
    }
    return static_cast<size_t>(at - out);
}

// Calls fn(ip) for each of the n frames of `code`, innermost first, while
// it returns true.
template <typename Fn>
void decode(const uint8_t* code, uint32_t n, Fn fn) {
    uint64_t ip = 0;
    for (uint32_t i = 0; i < n; ++i) {
        uint32_t word;
        std::memcpy(&word, code, sizeof word);
        if ((word & 0xff) != kWide) [[likely]] {
            bool short_delta = !(word & 1);
            int32_t delta = short_delta ? static_cast<int16_t>(word) >> 1 : static_cast<int32_t>(word) >> 2;
            ip += static_cast<uint64_t>(static_cast<int64_t>(delta));
            code += short_delta ? 2 : 4;
        } else {
            std::memcpy(&ip, code + 1, sizeof ip);
            code += 1 + sizeof ip;
        }
        if (!fn(ip)) return;
    }
}

}  // namespace heapsnap::recorder::frame_code
