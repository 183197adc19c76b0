// The stack table's frame code (src/recorder/frame_code.h): exact lengths
// at every width boundary, and every stack decodes to the frames encoded.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "recorder/frame_code.h"

namespace frame_code = heapsnap::recorder::frame_code;

namespace {

struct Encoded {
    std::vector<uint8_t> bytes;  // the code, then the decoder's read slack
    size_t length;
};

Encoded encode(const std::vector<uint64_t>& ips) {
    Encoded e;
    e.bytes.assign(ips.size() * frame_code::kMaxBytesPerFrame + frame_code::kReadSlack, 0xee);
    e.length = frame_code::encode(ips.data(), static_cast<uint32_t>(ips.size()), e.bytes.data());
    return e;
}

std::vector<uint64_t> decode(const Encoded& e, uint32_t n) {
    std::vector<uint64_t> ips;
    frame_code::decode(e.bytes.data(), n, [&](uint64_t ip) {
        ips.push_back(ip);
        return true;
    });
    return ips;
}

}  // namespace

TEST_CASE("frame code: a delta takes 2 bytes within 15 bits, 4 within 30, else 9 with the address") {
    const uint64_t base = 0x555555554000ull;  // a PIE's first frame: 9 bytes
    struct Case {
        int64_t delta;
        size_t bytes;
    };
    const Case cases[] = {
        {0, 2},
        {1, 2},
        {-1, 2},
        {(1 << 14) - 1, 2},
        {-(1 << 14), 2},
        {1 << 14, 4},
        {-(1 << 14) - 1, 4},
        {(1 << 29) - 1, 4},
        {-(1 << 29), 4},
        {1 << 29, 9},
        {-(1 << 29) - 1, 9},
        {INT64_C(1) << 40, 9},
    };
    for (const Case& c : cases) {
        CAPTURE(c.delta);
        std::vector<uint64_t> ips = {base, base + static_cast<uint64_t>(c.delta)};
        Encoded e = encode(ips);
        CHECK(e.length == 9 + c.bytes);
        CHECK(decode(e, 2) == ips);
    }
}

TEST_CASE("frame code: exact bytes, the first frame a delta from 0") {
    // 0x4000 from 0: long (0x4000 << 2 | 1); +1 and -1: short (delta << 1).
    std::vector<uint64_t> ips = {0x4000, 0x4001, 0x4000};
    Encoded e = encode(ips);
    CHECK(std::vector<uint8_t>(e.bytes.begin(), e.bytes.begin() + e.length) ==
          std::vector<uint8_t>{0x01, 0x00, 0x01, 0x00, 0x02, 0x00, 0xfe, 0xff});
    // A PIE's or a library's address: 0x03, then the address.
    std::vector<uint64_t> wide = {0x7ffff7a01234ull};
    e = encode(wide);
    CHECK(std::vector<uint8_t>(e.bytes.begin(), e.bytes.begin() + e.length) ==
          std::vector<uint8_t>{0x03, 0x34, 0x12, 0xa0, 0xf7, 0xff, 0x7f, 0x00, 0x00});
    CHECK(decode(e, 1) == wide);
}

TEST_CASE("frame code: random stacks across modules decode exactly") {
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    auto next = [&] {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    };
    const uint64_t modules[] = {0x400000, 0x555555554000ull, 0x7ffff7a00000ull, 0x7ffff7fc0000ull};
    for (int round = 0; round < 2000; ++round) {
        std::vector<uint64_t> ips(1 + next() % 64);
        for (uint64_t& ip : ips) ip = modules[next() % 4] + next() % (next() % 2 ? 0x4000 : 0x4000000);
        Encoded e = encode(ips);
        REQUIRE(decode(e, static_cast<uint32_t>(ips.size())) == ips);
    }
}

TEST_CASE("frame code: decode stops when fn returns false") {
    std::vector<uint64_t> ips = {0x1000, 0x2000, 0x3000};
    Encoded e = encode(ips);
    int calls = 0;
    frame_code::decode(e.bytes.data(), 3, [&](uint64_t ip) {
        ++calls;
        return ip != 0x2000;
    });
    CHECK(calls == 2);
}
