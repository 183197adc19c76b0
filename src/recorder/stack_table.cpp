#include "recorder/stack_table.h"

#include <atomic>
#include <cstring>

#include "format/hslog.h"
#include "recorder/metadata_queue.h"
#include "recorder/modules.h"
#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

// A stack keeps its return addresses only: the (module, offset) form the
// log wants is computed when its record is queued, which is once, plus once
// more in a fork child. Keeping it as well would triple the table (16 bytes
// a frame beside 8; tens of MiB on a compiler).
struct Entry {
    uint64_t hash;
    const uint64_t* ips;
    uint32_t n;
};

// A slot holds a stack's id in its low half and the high half of the
// stack's hash in its high half, so a probe compares hashes without
// touching the stack's entry (a cache miss on a compiler's 90 000 stacks);
// 0 is empty. A stack's home slot comes from the hash's low bits above bit
// 0, which is always set.
struct Table {
    std::atomic<uint64_t>* slots;
    uint64_t mask;
};

uint64_t home(uint64_t hash, uint64_t mask) { return (hash >> 1) & mask; }
uint64_t slot_value(uint32_t id, uint64_t hash) { return (hash & 0xffffffff00000000ull) | id; }

constexpr uint32_t kChunkBits = 16;
constexpr uint32_t kChunkSize = 1u << kChunkBits;
constexpr uint32_t kMaxChunks = 4096;  // 268M stacks

Entry* g_chunks[kMaxChunks];
std::atomic<Table*> g_table{nullptr};
uint32_t g_count = 0;  // ids 1..g_count are in use (guarded by the metadata lock)

uint8_t* g_arena = nullptr;  // frame storage, bump-allocated in 4 MiB pieces
size_t g_arena_left = 0;

uint64_t hash_frames(const uint64_t* ips, uint32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (uint32_t i = 0; i < n; ++i) {
        h ^= ips[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h | 1;  // never 0
}

const Entry& entry(uint32_t id) { return g_chunks[(id - 1) >> kChunkBits][(id - 1) & (kChunkSize - 1)]; }

uint32_t find(const Table* table, uint64_t hash, const uint64_t* ips, uint32_t n) {
    if (!table) return 0;
    for (uint64_t i = home(hash, table->mask);; i = (i + 1) & table->mask) {
        uint64_t v = table->slots[i].load(std::memory_order_acquire);
        if (!v) return 0;
        if ((v ^ hash) >> 32) continue;
        auto id = static_cast<uint32_t>(v);
        const Entry& e = entry(id);
        if (e.hash == hash && e.n == n && std::memcmp(e.ips, ips, n * sizeof(uint64_t)) == 0) return id;
    }
}

void place(Table* table, uint32_t id, uint64_t hash) {
    uint64_t i = home(hash, table->mask);
    while (table->slots[i].load(std::memory_order_relaxed)) i = (i + 1) & table->mask;
    table->slots[i].store(slot_value(id, hash), std::memory_order_release);
}

bool grow_table_if_needed() {
    Table* old = g_table.load(std::memory_order_relaxed);
    uint64_t capacity = old ? (old->mask + 1) : 0;
    if (old && (g_count + 1) * 2 <= capacity) return true;
    uint64_t fresh_capacity = capacity ? capacity * 2 : (1u << 16);
    auto* table = static_cast<Table*>(raw_map(sizeof(Table)));
    auto* slots = static_cast<std::atomic<uint64_t>*>(raw_map_populated(fresh_capacity * sizeof(uint64_t)));
    if (!table || !slots) return false;
    table->slots = slots;
    table->mask = fresh_capacity - 1;
    for (uint32_t id = 1; id <= g_count; ++id) place(table, id, entry(id).hash);
    g_table.store(table, std::memory_order_release);
    return true;
}

void* arena_take(size_t bytes) {
    bytes = (bytes + 7) & ~size_t{7};
    if (bytes > g_arena_left) {
        size_t piece = bytes > (4u << 20) ? bytes : (4u << 20);
        g_arena = static_cast<uint8_t*>(raw_map(piece));
        if (!g_arena) {
            g_arena_left = 0;
            return nullptr;
        }
        g_arena_left = piece;
    }
    void* p = g_arena;
    g_arena += bytes;
    g_arena_left -= bytes;
    return p;
}

void queue_stack_record(uint32_t id, const Entry& e) {
    codec::Writer w(nullptr, 0);
    if (!metadata_reserve(2 * codec::kMaxVarint + 1 + e.n * 2 * codec::kMaxVarint, &w)) return;
    hslog::put_stack_header(w, id, e.n);
    for (uint32_t i = 0; i < e.n; ++i) {
        ResolvedFrame f = resolve_frame(e.ips[i]);
        hslog::put_stack_frame(w, f.module, f.vaddr);
    }
    metadata_commit(w);
}

uint32_t insert_locked(uint64_t hash, const uint64_t* ips, uint32_t n) {
    if (uint32_t id = find(g_table.load(std::memory_order_acquire), hash, ips, n)) return id;
    if (g_count + 1 >= kMaxChunks * kChunkSize || !grow_table_if_needed()) return 0;
    uint32_t id = g_count + 1;
    Entry*& chunk = g_chunks[(id - 1) >> kChunkBits];
    if (!chunk) chunk = static_cast<Entry*>(raw_map(sizeof(Entry) * kChunkSize));
    auto* stored_ips = static_cast<uint64_t*>(arena_take(n * sizeof(uint64_t)));
    if (!chunk || (n && !stored_ips)) return 0;
    std::memcpy(stored_ips, ips, n * sizeof(uint64_t));
    rescan_modules(false);  // a module loaded since the last scan
    Entry& e = chunk[(id - 1) & (kChunkSize - 1)];
    e = Entry{hash, stored_ips, n};
    g_count = id;
    queue_stack_record(id, e);
    place(g_table.load(std::memory_order_relaxed), id, hash);
    return id;
}

}  // namespace

uint32_t intern_stack(const uint64_t* ips, uint32_t n) {
    uint64_t hash = hash_frames(ips, n);
    if (uint32_t id = find(g_table.load(std::memory_order_acquire), hash, ips, n)) return id;
    LockGuard guard(metadata_lock());
    return insert_locked(hash, ips, n);
}

void requeue_all_stacks() {
    for (uint32_t id = 1; id <= g_count; ++id) queue_stack_record(id, entry(id));
}

}  // namespace heapsnap::recorder
