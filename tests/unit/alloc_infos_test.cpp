// The writer's allocation-info tables (src/recorder/alloc_infos.h) against
// a plain model: every free and every missed free must name exactly the
// info the block was allocated with, whichever of the two address tables
// holds it (8-byte entries for 16-byte aligned blocks below 2^47 with an
// info id under 2^21 - 1; a 16-byte side table for every other block).
// Built into the recorder-side test library (tests/meson.build).
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <tuple>

#include "recorder/alloc_infos.h"
#include "recorder/raw_alloc.h"

using namespace heapsnap::recorder;
using heapsnap::hslog::AllocFn;
using heapsnap::hslog::kAddressedAllocSize;

namespace {

// The writer's contract, kept the simplest way: a map of live blocks and
// a map of triples numbered in order of first use.
struct Model {
    std::map<uint64_t, uint32_t> live;
    std::map<std::tuple<AllocFn, uint64_t, uint32_t>, uint32_t> infos;

    InfoAlloc alloc(uint64_t address, AllocFn fn, uint64_t size, uint32_t stack) {
        InfoAlloc r;
        r.ok = true;
        if (auto it = live.find(address); it != live.end()) r.replaced = it->second;
        if (size >= kAddressedAllocSize) {
            r.info = kAddressedBlock;
        } else {
            auto [it, fresh] = infos.try_emplace({fn, size, stack}, static_cast<uint32_t>(infos.size() + 1));
            r.info = it->second;
            r.fresh = fresh;
        }
        live[address] = r.info;
        return r;
    }
    uint32_t free(uint64_t address) {
        auto it = live.find(address);
        if (it == live.end()) return 0;
        uint32_t name = it->second;
        live.erase(it);
        return name;
    }
};

}  // namespace

TEST_CASE("alloc_infos: random churn names every block as the model does, in both address tables") {
    alloc_infos_reset();
    Model model;
    std::mt19937_64 rng(42);
    // Addresses crowded into a few pages (long probe runs, many backward
    // shifts), some 8-byte aligned and some above 2^47 (the side table).
    auto address = [&] {
        uint64_t base = uint64_t{0x5555'0000'0000} + (rng() % 64) * 4096;
        uint64_t offset = (rng() % 256) * 16;
        switch (rng() % 8) {
            case 0: return base + offset + 8;                    // 8-byte aligned
            case 1: return (uint64_t{1} << 47) + base + offset;  // above 2^47
            default: return base + offset;
        }
    };
    for (int step = 0; step < 400'000; ++step) {
        uint64_t at = address();
        if (rng() % 2) {
            uint64_t size = rng() % 4 == 0 ? kAddressedAllocSize + rng() % 100 : 1 + rng() % 200;
            auto fn = static_cast<AllocFn>(rng() % 3);
            auto stack = static_cast<uint32_t>(1 + rng() % 50);
            InfoAlloc want = model.alloc(at, fn, size, stack);
            InfoAlloc got = alloc_infos_alloc(at, fn, size, stack);
            REQUIRE(got.ok);
            REQUIRE(got.info == want.info);
            REQUIRE(got.fresh == want.fresh);
            REQUIRE(got.replaced == want.replaced);
        } else {
            REQUIRE(alloc_infos_free(at) == model.free(at));
        }
    }
    // Drained, the tables answer 0 for everything.
    for (auto [at, name] : std::map(model.live)) REQUIRE(alloc_infos_free(at) == name);
    CHECK(alloc_infos_free(0x5555'0000'0010) == 0);
    CHECK(alloc_infos_free((uint64_t{1} << 47) + 0x5555'0000'0010) == 0);
    alloc_infos_reset();
}

TEST_CASE("alloc_infos: a block and its 8-byte neighbour, and the same offset above 2^47, are three blocks") {
    alloc_infos_reset();
    uint64_t at = 0x7f00'1234'5670;
    uint64_t high = at | uint64_t{1} << 47;
    CHECK(alloc_infos_alloc(at, AllocFn::Malloc, 24, 1).info == 1);
    CHECK(alloc_infos_alloc(at + 8, AllocFn::Malloc, 24, 2).info == 2);
    CHECK(alloc_infos_alloc(high, AllocFn::Malloc, 24, 3).info == 3);
    CHECK(alloc_infos_free(at + 8) == 2);
    CHECK(alloc_infos_free(at + 8) == 0);
    CHECK(alloc_infos_free(high) == 3);
    CHECK(alloc_infos_free(at) == 1);
    CHECK(alloc_infos_free(at) == 0);
    alloc_infos_reset();
}

TEST_CASE("alloc_infos: info ids past the packed entry's 21 bits move to the side table and back") {
    alloc_infos_reset();
    // 2^21 - 2 is the highest id an 8-byte entry holds; 2^21 - 1 is the
    // first that needs the side table.
    constexpr uint32_t kLastPacked = (1u << 21) - 2;
    uint64_t at = 0x5555'0000'0000;
    for (uint32_t id = 1; id <= kLastPacked + 1; ++id) {
        InfoAlloc r = alloc_infos_alloc(at, AllocFn::Malloc, 24, id);  // a new triple each time
        REQUIRE(r.ok);
        REQUIRE(r.info == id);
        REQUIRE(r.fresh);
        REQUIRE(r.replaced == (id == 1 ? 0 : id - 1));  // never freed: each replaces the last
    }
    // The block at `at` now has the first unpacked id; a packed one replaces it.
    InfoAlloc r = alloc_infos_alloc(at, AllocFn::Malloc, 24, 1);
    CHECK(r.info == 1);
    CHECK(!r.fresh);
    CHECK(r.replaced == kLastPacked + 1);
    // And an unpacked one replaces that again.
    r = alloc_infos_alloc(at, AllocFn::Malloc, 24, kLastPacked + 1);
    CHECK(r.info == kLastPacked + 1);
    CHECK(r.replaced == 1);
    CHECK(alloc_infos_free(at) == kLastPacked + 1);
    CHECK(alloc_infos_free(at) == 0);
    // An addressed block keeps its marker in the packed entry.
    CHECK(alloc_infos_alloc(at, AllocFn::Malloc, kAddressedAllocSize, 7).info == kAddressedBlock);
    CHECK(alloc_infos_free(at) == kAddressedBlock);
    alloc_infos_reset();
}

TEST_CASE("alloc_infos: the live bytes are the sizes of the blocks allocated and not freed") {
    alloc_infos_reset();
    CHECK(alloc_infos_live_bytes() == 0);
    const uint64_t a = 0x5555'0000'1000, b = 0x5555'0000'2000, big = 0x5555'1000'0000;
    REQUIRE(alloc_infos_alloc(a, AllocFn::Malloc, 100, 1).ok);
    REQUIRE(alloc_infos_alloc(b, AllocFn::Calloc, 300, 2).ok);
    REQUIRE(alloc_infos_alloc(big, AllocFn::Malloc, kAddressedAllocSize + 5, 1).ok);
    CHECK(alloc_infos_live_bytes() == 100 + 300 + kAddressedAllocSize + 5);
    CHECK(alloc_infos_free(b) == 2);
    CHECK(alloc_infos_live_bytes() == 100 + kAddressedAllocSize + 5);
    CHECK(alloc_infos_free(big) == kAddressedBlock);
    CHECK(alloc_infos_live_bytes() == 100);
    // A free never seen allocated changes nothing.
    CHECK(alloc_infos_free(0x7777'0000'0000) == 0);
    CHECK(alloc_infos_live_bytes() == 100);
    // A block allocated at a live block's address replaces it: the old
    // one counts as freed, small or addressed.
    InfoAlloc r = alloc_infos_alloc(a, AllocFn::Malloc, kAddressedAllocSize, 3);
    CHECK(r.replaced == 1);
    CHECK(alloc_infos_live_bytes() == kAddressedAllocSize);
    r = alloc_infos_alloc(a, AllocFn::Realloc, 40, 3);
    CHECK(r.replaced == kAddressedBlock);
    CHECK(alloc_infos_live_bytes() == 40);
    CHECK(alloc_infos_free(a) != 0);
    CHECK(alloc_infos_live_bytes() == 0);
    alloc_infos_reset();
    CHECK(alloc_infos_live_bytes() == 0);
}

TEST_CASE("alloc_infos: memory follows the live blocks, not the events") {
    alloc_infos_reset();
    uint64_t before = raw_mapped_bytes();
    // A million blocks allocated and freed one after another, never more
    // than two live: the first tables only (64 KiB of 8-byte entries,
    // 32 KiB of infos, 4 KiB of their sizes), no side table.
    for (uint64_t i = 0; i < 1'000'000; ++i) {
        uint64_t at = 0x5555'0000'0000 + i * 48;
        REQUIRE(alloc_infos_alloc(at, AllocFn::Malloc, 40, 1).ok);
        if (i) REQUIRE(alloc_infos_free(at - 48) == 1);
    }
    CHECK(raw_mapped_bytes() - before == (64 + 32 + 4) * 1024);
    // 10 000 live blocks: the packed table doubles to 32 768 entries.
    for (uint64_t i = 0; i < 10'000; ++i)
        REQUIRE(alloc_infos_alloc(0x6666'0000'0000 + i * 32, AllocFn::Malloc, 24, 1).ok);
    CHECK(raw_mapped_bytes() - before == (256 + 32 + 4) * 1024);
    alloc_infos_reset();
    CHECK(raw_mapped_bytes() == before);
}
