#include "recorder/block_ids.h"

#include <cstring>

#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

struct Entry {
    uint64_t address;  // 0: empty (malloc never returns a block at 0)
    uint64_t id;
};

constexpr size_t kInitialCapacity = 4096;  // entries; 64 KiB

Entry* g_table = nullptr;
size_t g_capacity = 0;  // a power of two
size_t g_size = 0;
uint32_t* g_free = nullptr;  // freed ids, the next to reuse last
size_t g_free_count = 0;
size_t g_free_capacity = 0;
uint32_t g_next_id = 1;

// Blocks are at least 16-byte aligned: drop the low bits, then mix.
size_t home(uint64_t address) {
    return static_cast<size_t>(((address >> 4) * 0x9e3779b97f4a7c15ull) >> 32) & (g_capacity - 1);
}

bool grow_table() {
    size_t capacity = g_capacity ? g_capacity * 2 : kInitialCapacity;
    auto* fresh = static_cast<Entry*>(raw_map(capacity * sizeof(Entry)));
    if (!fresh) return false;
    Entry* old = g_table;
    size_t old_capacity = g_capacity;
    g_table = fresh;
    g_capacity = capacity;
    for (size_t i = 0; i < old_capacity; ++i) {
        if (!old[i].address) continue;
        size_t j = home(old[i].address);
        while (g_table[j].address) j = (j + 1) & (g_capacity - 1);
        g_table[j] = old[i];
    }
    raw_unmap(old, old_capacity * sizeof(Entry));
    return true;
}

// The free list can hold every id ever given out, so a free never needs
// memory: it grows when a fresh id would exceed it.
bool reserve_fresh_id() {
    if (g_next_id <= g_free_capacity) return true;
    size_t capacity = g_free_capacity ? g_free_capacity * 2 : 16384;
    auto* fresh = static_cast<uint32_t*>(raw_map(capacity * sizeof(uint32_t)));
    if (!fresh) return false;
    if (g_free) memcpy(fresh, g_free, g_free_count * sizeof(uint32_t));
    raw_unmap(g_free, g_free_capacity * sizeof(uint32_t));
    g_free = fresh;
    g_free_capacity = capacity;
    return true;
}

void push_free(uint32_t id) { g_free[g_free_count++] = id; }

uint32_t take_id() { return g_free_count ? g_free[--g_free_count] : g_next_id++; }

// Removes the entry at index i, pulling later members of its probe run
// into the hole (no tombstones: long churn does not slow the table down).
void erase_at(size_t i) {
    size_t mask = g_capacity - 1;
    for (size_t hole = i, j = (i + 1) & mask;; j = (j + 1) & mask) {
        if (!g_table[j].address) {
            g_table[hole].address = 0;
            return;
        }
        size_t h = home(g_table[j].address);
        // Entry j may move to the hole if its home is not in (hole, j].
        if (((j - h) & mask) >= ((j - hole) & mask)) {
            g_table[hole] = g_table[j];
            hole = j;
        }
    }
}

}  // namespace

BlockAlloc block_ids_alloc(uint64_t address) {
    BlockAlloc r;
    if ((g_size + 1) * 2 > g_capacity && !grow_table()) return r;
    if (!g_free_count && !reserve_fresh_id()) return r;
    size_t i = home(address);
    while (g_table[i].address && g_table[i].address != address) i = (i + 1) & (g_capacity - 1);
    if (g_table[i].address) {
        r.replaced = static_cast<uint32_t>(g_table[i].id);
        push_free(r.replaced);
    } else {
        g_size++;
    }
    r.id = take_id();
    g_table[i] = Entry{address, r.id};
    r.ok = true;
    return r;
}

uint32_t block_ids_free(uint64_t address) {
    if (!g_capacity) return 0;
    size_t i = home(address);
    while (g_table[i].address != address) {
        if (!g_table[i].address) return 0;
        i = (i + 1) & (g_capacity - 1);
    }
    auto id = static_cast<uint32_t>(g_table[i].id);
    push_free(id);
    erase_at(i);
    g_size--;
    return id;
}

void block_ids_reset() {
    raw_unmap(g_table, g_capacity * sizeof(Entry));
    raw_unmap(g_free, g_free_capacity * sizeof(uint32_t));
    g_table = nullptr;
    g_capacity = 0;
    g_size = 0;
    g_free = nullptr;
    g_free_count = 0;
    g_free_capacity = 0;
    g_next_id = 1;
}

}  // namespace heapsnap::recorder
