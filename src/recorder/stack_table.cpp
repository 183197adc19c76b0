#include "recorder/stack_table.h"

#include <atomic>

#include "format/codec.h"
#include "format/hslog.h"
#include "recorder/frame_code.h"
#include "recorder/metadata_queue.h"
#include "recorder/modules.h"
#include "recorder/raw_alloc.h"
#include "recorder/spinlock.h"

namespace heapsnap::recorder {
namespace {

// A stack keeps its return addresses only: the (module, offset) form the
// log wants is computed when its record is queued, which is once, plus once
// more in a fork child. Keeping it as well would triple the table.
// The header is followed by its frames' code (frame_code.h).
struct Record {
    uint32_t id;
    uint32_t n;  // frames
    const uint8_t* code() const { return reinterpret_cast<const uint8_t*>(this + 1); }
    uint8_t* code() { return reinterpret_cast<uint8_t*>(this + 1); }
};

// tag 0: empty. A slot's record is stored before its tag is published
// (release), so a lookup that sees the tag (acquire) sees the record.
struct Slot {
    std::atomic<uint64_t> tag;
    std::atomic<const Record*> record;
};

struct Table {
    Slot* slots;
    uint64_t mask;
};

// stack_hash folds frames with one multiply each, so its low bits are
// weak; the tag mixes the high half down. Never 0 (empty).
uint64_t tag_of(uint64_t hash) {
    uint64_t t = hash ^ (hash >> 31);
    t *= 0xbf58476d1ce4e5b9ull;
    return (t ^ (t >> 29)) | 1;
}
uint64_t home(uint64_t tag, uint64_t mask) { return (tag >> 1) & mask; }

constexpr uint32_t kChunkBits = 16;
constexpr uint32_t kChunkSize = 1u << kChunkBits;
constexpr uint32_t kMaxChunks = 4096;  // 268M stacks

// Records by id, for queue_pending_stacks (the writer, and requeue_all_stacks).
const Record** g_chunks[kMaxChunks];
std::atomic<Table*> g_table{nullptr};
// The tables, one per size: a lookup reads its table's slots and mask
// first, before it can start on the slot, so they sit here beside
// g_table rather than on a page of their own (another TLB entry and a
// miss ahead of every lookup on a compiler). Capacity doubles from 2^15
// slots: 40 sizes are more than kMaxChunks ids need.
constexpr size_t kMaxTables = 40;
Table g_tables[kMaxTables];
size_t g_tables_used = 0;  // g_insert_lock
// Inserts take a lock of their own: the writer holds the metadata lock
// whenever it encodes Stack records (queue_pending_stacks), and on a
// compile the thread that interned 87 000 stacks spent about 3 % of the
// recorder's time waiting for it.
SpinLock g_insert_lock;
// Ids 1..g_count are in use, their records complete: stored (release)
// under g_insert_lock before the stack can be found in the table, so the
// writer, which reads it (acquire) after the ring heads of a round, sees
// every stack an event of the round names.
std::atomic<uint32_t> g_count{0};
uint32_t g_queued = 0;  // ids 1..g_queued have their Stack records queued (metadata lock)

uint8_t* g_arena = nullptr;  // records, bump-allocated in pieces (kArenaPiece)
size_t g_arena_left = 0;

const Record* record_of(uint32_t id) { return g_chunks[(id - 1) >> kChunkBits][(id - 1) & (kChunkSize - 1)]; }

bool same_frames(const Record& r, const uint64_t* ips, uint32_t n) {
    if (r.n != n) return false;
    uint32_t matched = 0;
    frame_code::decode(r.code(), r.n, [&](uint64_t ip) {
        if (ip != ips[matched]) return false;
        ++matched;
        return true;
    });
    return matched == n;
}

const Record* find(const Table* table, uint64_t tag, const uint64_t* ips, uint32_t n) {
    if (!table) return nullptr;
    for (uint64_t i = home(tag, table->mask);; i = (i + 1) & table->mask) {
        uint64_t t = table->slots[i].tag.load(std::memory_order_acquire);
        if (!t) return nullptr;
        if (t != tag) continue;
        const Record* r = table->slots[i].record.load(std::memory_order_relaxed);
        if (same_frames(*r, ips, n)) return r;
    }
}

void place(Table* table, uint64_t tag, const Record* r) {
    uint64_t i = home(tag, table->mask);
    while (table->slots[i].tag.load(std::memory_order_relaxed)) i = (i + 1) & table->mask;
    table->slots[i].record.store(r, std::memory_order_relaxed);
    table->slots[i].tag.store(tag, std::memory_order_release);
}

bool grow_table_if_needed() {
    Table* old = g_table.load(std::memory_order_relaxed);
    uint64_t capacity = old ? (old->mask + 1) : 0;
    if (old && (g_count.load(std::memory_order_relaxed) + 1) * 2 <= capacity) return true;
    uint64_t fresh_capacity = capacity ? capacity * 2 : (1u << 15);
    if (g_tables_used == kMaxTables) return false;
    auto* slots = static_cast<Slot*>(raw_map_huge_populated(fresh_capacity * sizeof(Slot)));
    if (!slots) return false;
    Table* table = &g_tables[g_tables_used++];
    table->slots = slots;
    table->mask = fresh_capacity - 1;
    for (uint64_t i = 0; i < capacity; ++i) {
        uint64_t tag = old->slots[i].tag.load(std::memory_order_relaxed);
        if (tag) place(table, tag, old->slots[i].record.load(std::memory_order_relaxed));
    }
    g_table.store(table, std::memory_order_release);
    return true;
}

constexpr size_t kArenaPiece = 256u << 10;

// Room for `bytes` at the arena's end, aligned for a Record; arena_keep
// then takes what was used of it.
uint8_t* arena_room(size_t bytes) {
    if (bytes > g_arena_left) {
        size_t piece = bytes > kArenaPiece ? bytes : kArenaPiece;
        // Small pages: with huge ones, the 2 MiB page being filled is
        // resident whole (on a compile, +2 MiB of peak RSS for no
        // measurable time). Populated a piece at a time: one syscall
        // instead of a fault per page first written. A compile's 12 MiB of
        // records took 3 000 faults, which cost the program's thread
        // 10 M cycles; the price is at most a piece resident ahead of use.
        g_arena = static_cast<uint8_t*>(raw_map_populated(piece));
        if (!g_arena) {
            g_arena_left = 0;
            return nullptr;
        }
        g_arena_left = piece;
    }
    return g_arena;
}
void arena_keep(size_t bytes) {
    bytes = (bytes + alignof(Record) - 1) & ~(alignof(Record) - 1);
    g_arena += bytes;
    g_arena_left -= bytes;
}

void queue_stack_record(const Record& r) {
    codec::Writer w(nullptr, 0);
    if (!metadata_reserve(2 * codec::kMaxVarint + 1 + r.n * 2 * codec::kMaxVarint, &w)) return;
    hslog::put_stack_header(w, r.id, r.n);
    frame_code::decode(r.code(), r.n, [&](uint64_t ip) {
        ResolvedFrame f = resolve_frame(ip);
        hslog::put_stack_frame(w, f.module, f.vaddr);
        return true;
    });
    metadata_commit(w);
}

const Record* insert_locked(uint64_t tag, const uint64_t* ips, uint32_t n) {
    if (const Record* r = find(g_table.load(std::memory_order_acquire), tag, ips, n)) return r;
    uint32_t id = g_count.load(std::memory_order_relaxed) + 1;
    if (id >= kMaxChunks * kChunkSize || !grow_table_if_needed()) return nullptr;
    const Record**& chunk = g_chunks[(id - 1) >> kChunkBits];
    if (!chunk) chunk = static_cast<const Record**>(raw_map(sizeof(Record*) * kChunkSize));
    // The arena keeps the slack the decoder reads past a record's code.
    uint8_t* room = arena_room(sizeof(Record) + n * frame_code::kMaxBytesPerFrame + frame_code::kReadSlack);
    if (!chunk || !room) return nullptr;
    auto* r = reinterpret_cast<Record*>(room);
    r->id = id;
    r->n = n;
    arena_keep(sizeof(Record) + frame_code::encode(ips, n, r->code()) + frame_code::kReadSlack);
    // A module loaded since the last scan gets known before the writer
    // resolves this stack's frames; a module unloaded since has the
    // stacks before this one resolved first (queue_pending_stacks).
    rescan_modules_if_changed();
    chunk[(id - 1) & (kChunkSize - 1)] = r;
    g_count.store(id, std::memory_order_release);
    place(g_table.load(std::memory_order_relaxed), tag, r);
    return r;
}

}  // namespace

SpinLock& stack_insert_lock() { return g_insert_lock; }

uint32_t intern_stack(const uint64_t* ips, uint32_t n, uint64_t hash, const void** record) {
    uint64_t tag = tag_of(hash);
    const Record* r = find(g_table.load(std::memory_order_acquire), tag, ips, n);
    if (!r) {
        LockGuard guard(g_insert_lock);
        r = insert_locked(tag, ips, n);
    }
    if (record) *record = r;
    return r ? r->id : 0;
}

uint32_t stack_id_of(const void* record, const uint64_t* ips, uint32_t n) {
    const auto* r = static_cast<const Record*>(record);
    return same_frames(*r, ips, n) ? r->id : 0;
}

void prefetch_stack(uint64_t hash) {
    const Table* table = g_table.load(std::memory_order_acquire);
    if (table) __builtin_prefetch(&table->slots[home(tag_of(hash), table->mask)]);
}

bool queue_pending_stacks(uint32_t max) {
    uint32_t count = g_count.load(std::memory_order_acquire);
    uint32_t last = count - g_queued > max ? g_queued + max : count;
    for (uint32_t id = g_queued + 1; id <= last; ++id) queue_stack_record(*record_of(id));
    g_queued = last;
    return g_queued < count;
}

void requeue_all_stacks() {
    g_queued = 0;
    queue_pending_stacks(UINT32_MAX);
}

}  // namespace heapsnap::recorder
