// The varint codec: exact byte encodings and refusal of malformed input.
#include <doctest/doctest.h>

#include <vector>

#include "format/codec.h"

using namespace heapsnap::codec;

TEST_CASE("varint: exact LEB128 bytes") {
    uint8_t buf[32];
    Writer w(buf, sizeof buf);
    w.varint(0);
    w.varint(127);
    w.varint(128);
    w.varint(300);
    CHECK(w.size() == 6);
    std::vector<uint8_t> bytes(buf, buf + w.size());
    CHECK(bytes == std::vector<uint8_t>{0x00, 0x7f, 0x80, 0x01, 0xac, 0x02});
}

TEST_CASE("varint: 64-bit extremes round-trip") {
    uint8_t buf[32];
    Writer w(buf, sizeof buf);
    w.varint(UINT64_MAX);
    CHECK(w.size() == kMaxVarint);
    Reader r(buf, w.size());
    CHECK(r.varint() == UINT64_MAX);
    CHECK(r.ok());
    CHECK(r.at_end());
}

TEST_CASE("varint: every length reads the same with eight bytes after it or not") {
    // The reader takes varints of 2 to 8 bytes as one word when eight
    // bytes are left, byte by byte otherwise.
    for (int length = 1; length <= 10; ++length) {
        for (uint64_t low : {uint64_t{0}, uint64_t{1}, uint64_t{0x55}, uint64_t{0x7f}}) {
            uint64_t value = length == 1 ? low : (uint64_t{1} << (7 * (length - 1))) | low;
            if (length == 10) value |= uint64_t{1} << 63;
            uint8_t buf[32];
            Writer w(buf, sizeof buf);
            w.varint(value);
            REQUIRE(w.size() == static_cast<size_t>(length));
            w.varint(300);  // what follows is left where it is
            for (size_t size : {w.size(), sizeof buf}) {
                Reader r(buf, size);
                CHECK(r.varint() == value);
                CHECK(r.varint() == 300);
                CHECK(r.ok());
            }
        }
    }
}

TEST_CASE("skip_varints: ends where as many varint() calls end, and fails where they fail") {
    // Runs of varints of every length from 1 to 11 bytes (11: malformed),
    // cut at every length, skipped 1 to all at a time.
    uint64_t seed = 12345;
    for (int round = 0; round < 2000; ++round) {
        std::vector<uint8_t> buf;
        int varints = 1 + round % 12;
        for (int i = 0; i < varints; ++i) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int length = 1 + static_cast<int>((seed >> 33) % (round % 7 == 0 ? 11 : 10));
            for (int b = 1; b < length; ++b) buf.push_back(static_cast<uint8_t>(0x80 | (seed >> (b % 8))));
            buf.push_back(static_cast<uint8_t>((seed >> 40) & 0x7f));
        }
        size_t cut = round % 3 == 0 ? static_cast<size_t>(seed % (buf.size() + 1)) : buf.size();
        for (int n = 1; n <= varints; ++n) {
            Reader one(buf.data(), cut), all(buf.data(), cut);
            for (int i = 0; i < n; ++i) one.varint();
            all.skip_varints(static_cast<uint64_t>(n));
            CHECK(all.ok() == one.ok());
            CHECK(all.remaining() == one.remaining());
        }
    }
}

TEST_CASE("skip_varints: long runs, 64 bytes at a time, agree with varint() to the byte") {
    // Stack records of up to 512 frames: hundreds of varints, mostly short,
    // some 10 bytes long, and in some rounds one of 11 (malformed) at a
    // random place, which may straddle a 64-byte block; cut anywhere, and
    // skipped from several starting offsets so every alignment is seen.
    uint64_t seed = 777;
    auto next = [&] {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        return seed >> 33;
    };
    for (int round = 0; round < 600; ++round) {
        std::vector<uint8_t> buf;
        int varints = 1 + static_cast<int>(next() % 1024);
        int bad = round % 4 == 0 ? static_cast<int>(next() % static_cast<uint64_t>(varints)) : -1;
        for (int i = 0; i < varints; ++i) {
            uint64_t pick = next() % 16;
            int length = i == bad ? 11 : pick < 10 ? 1 + static_cast<int>(pick % 3) : static_cast<int>(pick - 5);
            for (int b = 1; b < length; ++b) buf.push_back(static_cast<uint8_t>(0x80 | next()));
            buf.push_back(static_cast<uint8_t>(next() & 0x7f));
        }
        size_t cut = round % 3 == 0 ? static_cast<size_t>(next() % (buf.size() + 1)) : buf.size();
        size_t start = 0;
        for (int i = 0; i < static_cast<int>(next() % 4) && start < cut; ++i) {  // a few varints in
            Reader r(buf.data() + start, cut - start);
            r.varint();
            if (!r.ok()) break;
            start = static_cast<size_t>(r.position() - buf.data());
        }
        for (uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{64}, uint64_t{65}, next() % 1100, uint64_t{1100}}) {
            if (n == 0) continue;
            Reader one(buf.data() + start, cut - start), all(buf.data() + start, cut - start);
            for (uint64_t i = 0; i < n && one.ok(); ++i) one.varint();
            all.skip_varints(n);
            CHECK(all.ok() == one.ok());
            CHECK(all.remaining() == one.remaining());
        }
    }
}

TEST_CASE("zigzag: signed deltas") {
    CHECK(zigzag(0) == 0);
    CHECK(zigzag(-1) == 1);
    CHECK(zigzag(1) == 2);
    CHECK(zigzag(-2) == 3);
    CHECK(unzigzag(zigzag(INT64_MIN)) == INT64_MIN);
    CHECK(unzigzag(zigzag(INT64_MAX)) == INT64_MAX);
    uint8_t buf[16];
    Writer w(buf, sizeof buf);
    w.svarint(-4096);
    Reader r(buf, w.size());
    CHECK(r.svarint() == -4096);
}

TEST_CASE("strings and fixed-width fields") {
    uint8_t buf[64];
    Writer w(buf, sizeof buf);
    w.str("heap");
    w.u32le(0x01020304);
    w.u64le(0x1122334455667788ull);
    CHECK(buf[0] == 4);
    CHECK(buf[5] == 0x04);
    CHECK(buf[8] == 0x01);
    Reader r(buf, w.size());
    CHECK(r.str() == "heap");
    CHECK(r.u32le() == 0x01020304u);
    CHECK(r.u64le() == 0x1122334455667788ull);
    CHECK(r.ok());
}

TEST_CASE("reader: truncated varint fails and stays failed") {
    const uint8_t data[] = {0x80, 0x80};
    Reader r(data, sizeof data);
    CHECK(r.varint() == 0);
    CHECK_FALSE(r.ok());
    CHECK(r.u8() == 0);
    CHECK_FALSE(r.ok());
}

TEST_CASE("reader: an 11-byte varint is malformed") {
    std::vector<uint8_t> data(11, 0xff);
    data.back() = 0x01;
    Reader r(data.data(), data.size());
    r.varint();
    CHECK_FALSE(r.ok());
}

TEST_CASE("reader: a string longer than the buffer fails without reading past it") {
    const uint8_t data[] = {0x05, 'a', 'b'};
    Reader r(data, sizeof data);
    CHECK(r.str().empty());
    CHECK_FALSE(r.ok());
}

TEST_CASE("reader: a count the rest of the buffer cannot hold is refused") {
    uint8_t buf[16];
    Writer w(buf, sizeof buf);
    w.varint(1000000);
    w.u8(1);
    Reader r(buf, w.size());
    CHECK(r.count(2) == 0);
    CHECK_FALSE(r.ok());
}
