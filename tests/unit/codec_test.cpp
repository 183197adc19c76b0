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
