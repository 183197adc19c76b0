// ZeroedTable (util/zeroed_table.h), the replay's tables by stack and by
// allocation info, against a std::vector resized the way the replay
// resized them before: same entries after every growth, whether the
// mapping grew in place or moved, and every new entry zero.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "util/zeroed_table.h"

using heapsnap::ZeroedTable;

namespace {

struct Entry {
    uint64_t bytes = 0;
    uint32_t id = 0;
    uint32_t count = 0;
    bool operator==(const Entry&) const = default;
};

}  // namespace

TEST_CASE("zeroed table: grows as a zero-filled vector does and keeps what was written") {
    ZeroedTable<Entry> table;
    std::vector<Entry> model;
    CHECK(table.size() == 0);
    uint64_t seed = 99;
    for (uint32_t id = 1; id < 200'000; id += 1 + static_cast<uint32_t>(seed % 7)) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        if (id >= table.size()) {
            size_t size = std::max<size_t>(id + 1, table.size() * 2);
            table.grow(size);
            model.resize(size);
        }
        REQUIRE(table.size() == model.size());
        table[id].bytes += seed >> 20;
        table[id].id = id;
        table[id].count++;
        model[id].bytes += seed >> 20;
        model[id].id = id;
        model[id].count++;
        if (id % 997 == 0) {  // an older entry written again
            uint32_t old = id / 3;
            table[old].count += 5;
            model[old].count += 5;
        }
    }
    for (size_t i = 0; i < model.size(); ++i) REQUIRE(table[i] == model[i]);
    table.grow(10);  // never shrinks
    CHECK(table.size() == model.size());

    ZeroedTable<Entry> moved = std::move(table);
    CHECK(table.size() == 0);
    REQUIRE(moved.size() == model.size());
    for (size_t i = 0; i < model.size(); i += 101) REQUIRE(moved[i] == model[i]);
}
