#include "recorder/alloc_infos.h"

#include <utility>

#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

// Open addressing with linear probing, at most half full, and
// backward-shift deletion (no tombstones: long churn does not slow the
// tables down). A zero entry marks an empty slot.

// A live block in 8 bytes: its address >> 4 above kNameBits bits of its
// name. Fits every block glibc's malloc hands out (16-byte aligned, below
// 2^47) whose info id is below kPackedAddressed: those of the log's first
// two million distinct triples. Half the size of a plain entry: on
// tools/bench-programs/churn.pl (920 000 live blocks) the table is 16 MiB
// where 16-byte entries took 32, which was most of the recorder's memory.
struct PackedLive {
    static constexpr unsigned kNameBits = 21;
    static constexpr uint32_t kPackedAddressed = (1u << kNameBits) - 1;  // stands for kAddressedBlock
    static constexpr uint64_t kAddressEnd = uint64_t{1} << (64 - kNameBits + 4);

    uint64_t bits;  // 0: empty (malloc never returns a block at 0)

    static bool fits(uint64_t address, uint32_t name) {
        return (address & 0xf) == 0 && address < kAddressEnd && (name < kPackedAddressed || name == kAddressedBlock);
    }
    static PackedLive of(uint64_t address, uint32_t name) {
        return {(address >> 4) << kNameBits | (name == kAddressedBlock ? kPackedAddressed : name)};
    }
    bool used() const { return bits != 0; }
    // Always 16-byte aligned and below kAddressEnd, so an address that
    // does not fit never matches one that does.
    uint64_t address() const { return bits >> kNameBits << 4; }
    uint32_t name() const {
        auto code = static_cast<uint32_t>(bits & kPackedAddressed);
        return code == kPackedAddressed ? kAddressedBlock : code;
    }
};

// Any other live block (an allocator with 8-byte alignment, an info id
// past two million): empty, and never mapped, in most programs.
struct WideLive {
    uint64_t address_;  // 0: empty
    uint32_t name_;

    static WideLive of(uint64_t address, uint32_t name) { return {address, name}; }
    bool used() const { return address_ != 0; }
    uint64_t address() const { return address_; }
    uint32_t name() const { return name_; }
};

// The size of a live block of 64 KiB or more (addressed: no info says
// its size), for the count of live bytes.
struct SizedLive {
    uint64_t address_;  // 0: empty
    uint64_t size_;

    static SizedLive of(uint64_t address, uint64_t size) { return {address, size}; }
    bool used() const { return address_ != 0; }
    uint64_t address() const { return address_; }
    uint64_t name() const { return size_; }
};

// 16 bytes, four to a cache line: the lookup per allocation misses the
// cache whenever sizes vary, so fewer lines is faster.
struct InfoEntry {
    uint64_t size_fn;  // size << 8 | fn (sizes are far below 2^56)
    uint32_t stack;
    uint32_t info;  // 0: empty
};

uint64_t size_fn(uint64_t size, hslog::AllocFn fn) { return size << 8 | static_cast<uint8_t>(fn); }

// Blocks are mostly 16-byte aligned: drop the low bits. The number of
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
    uint64_t h =
        (size * 0x9e3779b97f4a7c15ull) ^ ((uint64_t{stack} << 8 | static_cast<uint8_t>(fn)) * 0xc2b2ae3d27d4eb4full);
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

// Address -> name, in PackedLive or WideLive entries (-> size in SizedLive ones).
template <class Entry, size_t kInitial>
struct LiveTable {
    using Value = decltype(std::declval<const Entry&>().name());

    Entry* slots = nullptr;
    size_t capacity = 0;  // a power of two
    size_t size = 0;

    // The slot holding `address`, or the empty slot ending its probe run.
    // Needs a capacity.
    size_t find(uint64_t address) const {
        size_t i = live_home(address, capacity);
        while (slots[i].used() && slots[i].address() != address) i = (i + 1) & (capacity - 1);
        return i;
    }

    // Room for one more entry: false when out of memory.
    bool make_room() {
        if ((size + 1) * 2 <= capacity) return true;
        return grow(
            slots, capacity, kInitial, [](const Entry& e) { return e.used(); },
            [](const Entry& e, size_t cap) { return live_home(e.address(), cap); });
    }

    // Empties slot i, pulling later members of its probe run into the hole.
    void erase_at(size_t i) {
        size_t mask = capacity - 1;
        size--;
        for (size_t hole = i, j = (i + 1) & mask;; j = (j + 1) & mask) {
            if (!slots[j].used()) {
                slots[hole] = Entry{};
                return;
            }
            size_t h = live_home(slots[j].address(), capacity);
            // Entry j may move to the hole if its home is not in (hole, j].
            if (((j - h) & mask) >= ((j - hole) & mask)) {
                slots[hole] = slots[j];
                hole = j;
            }
        }
    }

    // Removes `address`, returning its name; 0 if it is not here.
    Value take(uint64_t address) {
        if (!size) return 0;
        size_t i = find(address);
        if (!slots[i].used()) return 0;
        Value name = slots[i].name();
        erase_at(i);
        return name;
    }

    // Adds `address`, which is not here; needs make_room first.
    void put(uint64_t address, Value name) {
        slots[find(address)] = Entry::of(address, name);
        size++;
    }

    void release() {
        raw_unmap(slots, capacity * sizeof(Entry));
        *this = LiveTable{};
    }
};

constexpr size_t kInitialInfos = 2048;  // entries; 32 KiB

// The writer changes these on every event: a line of their own, away from
// what the hooks read (spinlock.h says why).
struct alignas(64) Tables {
    LiveTable<PackedLive, 8192> packed;   // 64 KiB to start
    LiveTable<WideLive, 256> wide;        // 4 KiB, at the first block that needs it
    LiveTable<SizedLive, 256> addressed;  // sizes of the live blocks of 64 KiB or more
    InfoEntry* infos = nullptr;
    size_t infos_capacity = 0;  // a power of two
    size_t infos_size = 0;      // also the highest info id given out
    // The size of each info, by id (infos are blocks below 64 KiB).
    uint16_t* info_sizes = nullptr;
    size_t info_sizes_capacity = 0;
    uint64_t live_bytes = 0;
};
Tables g_tables;

// Room for the size of info `id`.
bool info_size_room(size_t id) {
    if (id < g_tables.info_sizes_capacity) return true;
    size_t capacity = g_tables.info_sizes_capacity ? g_tables.info_sizes_capacity * 2 : kInitialInfos;
    auto* fresh = static_cast<uint16_t*>(raw_map(capacity * sizeof(uint16_t)));
    if (!fresh) return false;
    if (g_tables.info_sizes)
        __builtin_memcpy(fresh, g_tables.info_sizes, g_tables.info_sizes_capacity * sizeof(uint16_t));
    raw_unmap(g_tables.info_sizes, g_tables.info_sizes_capacity * sizeof(uint16_t));
    g_tables.info_sizes = fresh;
    g_tables.info_sizes_capacity = capacity;
    return true;
}

// The size of the live block named `name` at `address`, which leaves the
// live set now.
uint64_t forget_size(uint32_t name, uint64_t address) {
    if (name == kAddressedBlock) return g_tables.addressed.take(address);
    return g_tables.info_sizes[name];
}

bool grow_infos() {
    return grow(
        g_tables.infos, g_tables.infos_capacity, kInitialInfos, [](const InfoEntry& e) { return e.info != 0; },
        [](const InfoEntry& e, size_t capacity) { return info_home(e, capacity); });
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
    const auto& packed = g_tables.packed;
    if (!packed.capacity) return;
    __builtin_prefetch(&packed.slots[live_home(address, packed.capacity)]);
    if (alloc && size < hslog::kAddressedAllocSize && g_tables.infos_capacity)
        __builtin_prefetch(&g_tables.infos[info_home(fn, size, stack, g_tables.infos_capacity)]);
}

InfoAlloc alloc_infos_alloc(uint64_t address, hslog::AllocFn fn, uint64_t size, uint32_t stack) {
    InfoAlloc r;
    auto& packed = g_tables.packed;
    if (!packed.make_room()) return r;
    bool addressed = size >= hslog::kAddressedAllocSize;
    if (!addressed) {
        // An info id must never reach kAddressedBlock; 4 billion distinct
        // triples end the recording rather than the log's consistency.
        if (g_tables.infos_size + 1 >= kAddressedBlock) return r;
        if ((g_tables.infos_size + 1) * 2 > g_tables.infos_capacity && !grow_infos()) return r;
        if (!info_size_room(g_tables.infos_size + 1)) return r;
    }
    // Room for this block's size (a replaced block's leaves room).
    if (addressed && !g_tables.addressed.make_room()) return r;
    // A block still live at this address (its free was missed) is in
    // either table; the common case probes the packed one once.
    size_t i = packed.find(address);
    bool here = packed.slots[i].used();
    if (here)
        r.replaced = packed.slots[i].name();
    else
        r.replaced = g_tables.wide.take(address);
    r.info = addressed ? kAddressedBlock : info_of(fn, size, stack, &r.fresh);
    if (r.fresh) g_tables.info_sizes[r.info] = static_cast<uint16_t>(size);
    if (r.replaced) g_tables.live_bytes -= forget_size(r.replaced, address);
    if (addressed) g_tables.addressed.put(address, size);
    g_tables.live_bytes += size;
    if (PackedLive::fits(address, r.info)) {
        packed.slots[i] = PackedLive::of(address, r.info);
        if (!here) packed.size++;
    } else {
        if (here) packed.erase_at(i);
        if (!g_tables.wide.make_room()) return r;
        g_tables.wide.put(address, r.info);
    }
    r.ok = true;
    return r;
}

uint32_t alloc_infos_free(uint64_t address) {
    auto& packed = g_tables.packed;
    if (!packed.capacity) return 0;
    size_t i = packed.find(address);
    uint32_t name = 0;
    if (packed.slots[i].used()) {
        name = packed.slots[i].name();
        packed.erase_at(i);
    } else {
        name = g_tables.wide.take(address);
    }
    if (name) g_tables.live_bytes -= forget_size(name, address);
    return name;
}

uint64_t alloc_infos_live_bytes() { return g_tables.live_bytes; }

void alloc_infos_reset() {
    g_tables.packed.release();
    g_tables.wide.release();
    g_tables.addressed.release();
    raw_unmap(g_tables.infos, g_tables.infos_capacity * sizeof(InfoEntry));
    raw_unmap(g_tables.info_sizes, g_tables.info_sizes_capacity * sizeof(uint16_t));
    g_tables = Tables{};
}

}  // namespace heapsnap::recorder
