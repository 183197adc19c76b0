#include "recorder/alloc_infos.h"

#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

// Open addressing with linear probing, at most half full, and
// backward-shift deletion (no tombstones: long churn does not slow the
// tables down). Key 0 (address 0, info 0) marks an empty slot.

struct LiveEntry {
    uint64_t address;  // 0: empty (malloc never returns a block at 0)
    uint32_t name;     // info id or kAddressedBlock
};

// 16 bytes, four to a cache line: the lookup per allocation misses the
// cache whenever sizes vary, so fewer lines is faster.
struct InfoEntry {
    uint64_t size_fn;  // size << 8 | fn (sizes are far below 2^56)
    uint32_t stack;
    uint32_t info;  // 0: empty
};

uint64_t size_fn(uint64_t size, hslog::AllocFn fn) { return size << 8 | static_cast<uint8_t>(fn); }

constexpr size_t kInitialLive = 4096;   // entries; 64 KiB
constexpr size_t kInitialInfos = 2048;  // entries; 32 KiB

// The writer changes these on every event: a line of their own, away from
// what the hooks read (spinlock.h says why).
struct alignas(64) Tables {
    LiveEntry* live = nullptr;
    size_t live_capacity = 0;  // a power of two
    size_t live_size = 0;
    InfoEntry* infos = nullptr;
    size_t infos_capacity = 0;  // a power of two
    size_t infos_size = 0;      // also the highest info id given out
};
Tables g_tables;

// Blocks are at least 16-byte aligned: drop the low bits. The number of
// the block's 256-byte run is mixed, its offset within the run is not, so
// neighbouring blocks (which malloc hands out and takes back together)
// share a few lines of the table: a round of churn touches a handful of
// lines per run, where a fully mixed hash cost a cache miss per event
// (most of the writer's time on tools/bench-programs/churn.py). Runs, not
// pages: a page full of small blocks took 256 adjacent slots, and the
// pages landing on or next to each other made probe chains of dozens of
// slots (cc1plus: 310 M of the writer's instructions).
size_t live_home(uint64_t address, size_t capacity) {
    uint64_t run = ((address >> 8) * 0x9e3779b97f4a7c15ull) >> 32;
    return static_cast<size_t>(run + ((address >> 4) & 0xf)) & (capacity - 1);
}

size_t info_home(hslog::AllocFn fn, uint64_t size, uint32_t stack, size_t capacity) {
    uint64_t h = (size * 0x9e3779b97f4a7c15ull) ^ ((uint64_t{stack} << 8 | static_cast<uint8_t>(fn)) * 0xc2b2ae3d27d4eb4full);
    return static_cast<size_t>((h ^ (h >> 29)) >> 16) & (capacity - 1);
}
size_t info_home(const InfoEntry& e, size_t capacity) {
    return info_home(static_cast<hslog::AllocFn>(e.size_fn & 0xff), e.size_fn >> 8, e.stack, capacity);
}

// Doubles a table (or creates it), reinserting every entry.
template <class Entry, class Used, class Home>
bool grow(Entry*& table, size_t& capacity, size_t initial, Used used, Home home) {
    size_t fresh_capacity = capacity ? capacity * 2 : initial;
    auto* fresh = static_cast<Entry*>(raw_map_populated(fresh_capacity * sizeof(Entry)));
    if (!fresh) return false;
    for (size_t i = 0; i < capacity; ++i) {
        if (!used(table[i])) continue;
        size_t j = home(table[i], fresh_capacity);
        while (used(fresh[j])) j = (j + 1) & (fresh_capacity - 1);
        fresh[j] = table[i];
    }
    raw_unmap(table, capacity * sizeof(Entry));
    table = fresh;
    capacity = fresh_capacity;
    return true;
}

bool grow_live() {
    return grow(
        g_tables.live, g_tables.live_capacity, kInitialLive, [](const LiveEntry& e) { return e.address != 0; },
        [](const LiveEntry& e, size_t capacity) { return live_home(e.address, capacity); });
}

bool grow_infos() {
    return grow(
        g_tables.infos, g_tables.infos_capacity, kInitialInfos, [](const InfoEntry& e) { return e.info != 0; },
        [](const InfoEntry& e, size_t capacity) { return info_home(e, capacity); });
}

// Removes the live entry at index i, pulling later members of its probe
// run into the hole. Infos are never removed: an id stays defined for the
// rest of the log.
void erase_live_at(size_t i) {
    size_t mask = g_tables.live_capacity - 1;
    for (size_t hole = i, j = (i + 1) & mask;; j = (j + 1) & mask) {
        if (!g_tables.live[j].address) {
            g_tables.live[hole].address = 0;
            return;
        }
        size_t h = live_home(g_tables.live[j].address, g_tables.live_capacity);
        // Entry j may move to the hole if its home is not in (hole, j].
        if (((j - h) & mask) >= ((j - hole) & mask)) {
            g_tables.live[hole] = g_tables.live[j];
            hole = j;
        }
    }
}

// The info id of a triple, defining the next one if it is new.
uint32_t info_of(hslog::AllocFn fn, uint64_t size, uint32_t stack, bool* fresh) {
    size_t i = info_home(fn, size, stack, g_tables.infos_capacity);
    for (;; i = (i + 1) & (g_tables.infos_capacity - 1)) {
        InfoEntry& e = g_tables.infos[i];
        if (!e.info) break;
        if (e.size_fn == size_fn(size, fn) && e.stack == stack) {
            *fresh = false;
            return e.info;
        }
    }
    g_tables.infos[i] = InfoEntry{size_fn(size, fn), stack, static_cast<uint32_t>(++g_tables.infos_size)};
    *fresh = true;
    return g_tables.infos[i].info;
}

}  // namespace

void alloc_infos_prefetch(uint64_t address, bool alloc, hslog::AllocFn fn, uint64_t size, uint32_t stack) {
    if (!g_tables.live_capacity) return;
    __builtin_prefetch(&g_tables.live[live_home(address, g_tables.live_capacity)]);
    if (alloc && size < hslog::kAddressedAllocSize && g_tables.infos_capacity)
        __builtin_prefetch(&g_tables.infos[info_home(fn, size, stack, g_tables.infos_capacity)]);
}

InfoAlloc alloc_infos_alloc(uint64_t address, hslog::AllocFn fn, uint64_t size, uint32_t stack) {
    InfoAlloc r;
    if ((g_tables.live_size + 1) * 2 > g_tables.live_capacity && !grow_live()) return r;
    bool addressed = size >= hslog::kAddressedAllocSize;
    if (!addressed) {
        // An info id must never reach kAddressedBlock; 4 billion distinct
        // triples end the recording rather than the log's consistency.
        if (g_tables.infos_size + 1 >= kAddressedBlock) return r;
        if ((g_tables.infos_size + 1) * 2 > g_tables.infos_capacity && !grow_infos()) return r;
    }
    size_t i = live_home(address, g_tables.live_capacity);
    while (g_tables.live[i].address && g_tables.live[i].address != address) i = (i + 1) & (g_tables.live_capacity - 1);
    if (g_tables.live[i].address)
        r.replaced = g_tables.live[i].name;
    else
        g_tables.live_size++;
    r.info = addressed ? kAddressedBlock : info_of(fn, size, stack, &r.fresh);
    g_tables.live[i] = LiveEntry{address, r.info};
    r.ok = true;
    return r;
}

uint32_t alloc_infos_free(uint64_t address) {
    if (!g_tables.live_capacity) return 0;
    size_t i = live_home(address, g_tables.live_capacity);
    while (g_tables.live[i].address != address) {
        if (!g_tables.live[i].address) return 0;
        i = (i + 1) & (g_tables.live_capacity - 1);
    }
    uint32_t name = g_tables.live[i].name;
    erase_live_at(i);
    g_tables.live_size--;
    return name;
}

void alloc_infos_reset() {
    raw_unmap(g_tables.live, g_tables.live_capacity * sizeof(LiveEntry));
    raw_unmap(g_tables.infos, g_tables.infos_capacity * sizeof(InfoEntry));
    g_tables = Tables{};
}

}  // namespace heapsnap::recorder
