// The recorder's own memory (src/recorder/raw_alloc.h): raw_map_huge_populated's
// mapping is aligned, whole, writable and counted, and the slack it was
// cut from is gone. Linked with the unwinder's library, which carries
// raw_alloc.cpp (tests/meson.build).
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>

#include "recorder/raw_alloc.h"

using namespace heapsnap::recorder;

namespace {

// Whether the page at `at` is mapped (mincore fails with ENOMEM if not).
bool mapped(uintptr_t at) {
    unsigned char resident;
    return mincore(reinterpret_cast<void*>(at), 4096, &resident) == 0 || errno != ENOMEM;
}

}  // namespace

TEST_CASE("raw_map_huge_populated: 2 MiB-aligned, rounded up, written through, counted as the recorder's") {
    uint64_t before = raw_mapped_bytes();
    void* mem = raw_map_huge_populated(5u << 20);
    REQUIRE(mem != nullptr);
    auto* p = static_cast<volatile uint8_t*>(mem);
    auto start = reinterpret_cast<uintptr_t>(mem);
    CHECK(start % kHugePage == 0);
    CHECK(raw_mapped_bytes() - before == 6u << 20);
    p[0] = 1;
    p[(6u << 20) - 1] = 2;
    CHECK(p[(6u << 20) - 1] == 2);
    CHECK(overlaps_recorder(start, start + 1));
    CHECK(overlaps_recorder(start + (6u << 20) - 1, start + (6u << 20)));
    // The slack on either side was unmapped.
    CHECK(!mapped(start + (6u << 20)));
    CHECK(!mapped(start - 4096));
}

TEST_CASE("raw_map_huge_populated below 2 MiB: small pages, as raw_map_populated") {
    uint64_t before = raw_mapped_bytes();
    void* mem = raw_map_huge_populated(10000);
    REQUIRE(mem != nullptr);
    auto* p = static_cast<volatile uint8_t*>(mem);
    CHECK(reinterpret_cast<uintptr_t>(mem) % 4096 == 0);
    CHECK(raw_mapped_bytes() - before == 12288);
    p[12287] = 3;
    CHECK(p[12287] == 3);
}
