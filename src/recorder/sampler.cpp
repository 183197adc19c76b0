// The sampled-block set is a linear-probing table of addresses with
// backward-shift deletion (no tombstones, so it never needs rebuilding at
// the same size) guarded by a sequence lock: writers (under g_lock, so
// with signals blocked: no handler looks while its own thread writes) make
// the sequence odd while they change the table, readers retry when it
// moved. Tables only grow, by doubling; an outgrown table is never unmapped
// (a reader may still be probing it), which costs at most the size of the
// current one.
#include "recorder/sampler.h"

#include <unistd.h>

#include <atomic>

#include "recorder/lifecycle.h"
#include "recorder/raw_alloc.h"
#include "recorder/spinlock.h"
#include "recorder/thread_state.h"

namespace heapsnap::recorder {
namespace {

struct Table {
    uint64_t mask;
    std::atomic<uint64_t> keys[1];  // mask + 1 of them; 0 = empty
};

constexpr uint64_t kInitialSlots = 4096;

SpinLock g_lock;
std::atomic<uint64_t> g_sequence{0};
std::atomic<Table*> g_table{nullptr};
uint64_t g_live = 0;  // guarded by g_lock

uint64_t hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return key;
}

Table* new_table(uint64_t slots) {
    auto* t = static_cast<Table*>(raw_map_populated(sizeof(Table) + (slots - 1) * sizeof(uint64_t)));
    if (t) t->mask = slots - 1;
    return t;
}

bool contains(const Table* t, uint64_t key) {
    for (uint64_t i = hash(key) & t->mask;; i = (i + 1) & t->mask) {
        uint64_t k = t->keys[i].load(std::memory_order_relaxed);
        if (k == key) return true;
        if (k == 0) return false;
    }
}

void put(Table* t, uint64_t key) {
    uint64_t i = hash(key) & t->mask;
    while (t->keys[i].load(std::memory_order_relaxed) != 0) i = (i + 1) & t->mask;
    t->keys[i].store(key, std::memory_order_relaxed);
}

// Removes key, moving later members of its probe run back so that every
// key stays reachable from its home slot without tombstones.
bool erase(Table* t, uint64_t key) {
    uint64_t i = hash(key) & t->mask;
    for (;; i = (i + 1) & t->mask) {
        uint64_t k = t->keys[i].load(std::memory_order_relaxed);
        if (k == 0) return false;
        if (k == key) break;
    }
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & t->mask;; j = (j + 1) & t->mask) {
        uint64_t k = t->keys[j].load(std::memory_order_relaxed);
        if (k == 0) break;
        uint64_t home = hash(k) & t->mask;
        // k may move into the hole unless its home lies cyclically in (hole, j].
        bool home_after_hole = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (home_after_hole) continue;
        t->keys[hole].store(k, std::memory_order_relaxed);
        hole = j;
    }
    t->keys[hole].store(0, std::memory_order_relaxed);
    return true;
}

// Writers bracket every change; readers see an odd or changed sequence and
// retry.
void begin_write() {
    g_sequence.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
}

void end_write() { g_sequence.fetch_add(1, std::memory_order_release); }

bool lookup(uint64_t key) {
    for (;;) {
        uint64_t before = g_sequence.load(std::memory_order_acquire);
        if (before & 1) continue;
        const Table* t = g_table.load(std::memory_order_acquire);
        bool found = t && contains(t, key);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (g_sequence.load(std::memory_order_relaxed) == before) return found;
    }
}

void insert(uint64_t key) {
    LockGuard guard(g_lock);
    Table* t = g_table.load(std::memory_order_relaxed);
    if (!t || (g_live + 1) * 2 > t->mask + 1) {
        Table* bigger = new_table(t ? (t->mask + 1) * 2 : kInitialSlots);
        if (!bigger) return;  // out of memory: this block's free goes unrecorded
        if (t)
            for (uint64_t i = 0; i <= t->mask; ++i)
                if (uint64_t k = t->keys[i].load(std::memory_order_relaxed)) put(bigger, k);
        begin_write();
        g_table.store(bigger, std::memory_order_release);
        end_write();
        t = bigger;
    }
    begin_write();
    put(t, key);
    end_write();
    g_live++;
}

// -ln(u) for u in (0, 1], without libm: u = m * 2^e with m in [1, 2), and
// ln(m) = 2 atanh((m - 1) / (m + 1)) by its series (|z| <= 1/3, error
// below 1e-6: plenty for a sampling distance).
double minus_ln(double u) {
    uint64_t bits;
    __builtin_memcpy(&bits, &u, sizeof bits);
    int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
    bits = (bits & ((uint64_t{1} << 52) - 1)) | (uint64_t{1023} << 52);
    double m;
    __builtin_memcpy(&m, &bits, sizeof m);
    double z = (m - 1) / (m + 1), z2 = z * z;
    double ln_m = 2 * z * (1 + z2 * (1.0 / 3 + z2 * (1.0 / 5 + z2 * (1.0 / 7 + z2 * (1.0 / 9 + z2 / 11)))));
    return -(exponent * 0.6931471805599453 + ln_m);
}

uint64_t next_random(SampleThread& s) {  // xorshift64*
    s.rng ^= s.rng >> 12;
    s.rng ^= s.rng << 25;
    s.rng ^= s.rng >> 27;
    return s.rng * 0x2545F4914F6CDD1DULL;
}

int64_t next_distance(SampleThread& s) {
    double u = static_cast<double>((next_random(s) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    return static_cast<int64_t>(minus_ln(u) * static_cast<double>(config().sample_bytes)) + 1;
}

}  // namespace

bool sampling() { return config().sample_bytes != 0; }

bool sample_allocation(uint64_t addr, uint64_t size) {
    SampleThread& s = thread_state().sample;
    if (!s.seeded) {
        s.rng = hash(static_cast<uint64_t>(gettid()) ^ __builtin_ia32_rdtsc() ^ reinterpret_cast<uint64_t>(&s)) | 1;
        s.countdown = next_distance(s);
        s.seeded = true;
    }
    if (size < config().sample_bytes) {
        s.countdown -= static_cast<int64_t>(size);
        if (s.countdown > 0) return false;
        s.countdown = next_distance(s);
    }
    insert(addr);
    return true;
}

void keep_sampled(uint64_t addr) { insert(addr); }

bool release_sampled(uint64_t addr) {
    if (!lookup(addr)) return false;
    LockGuard guard(g_lock);
    Table* t = g_table.load(std::memory_order_relaxed);
    begin_write();
    bool erased = erase(t, addr);
    end_write();
    if (erased) g_live--;
    return erased;
}

void sampler_before_fork() { g_lock.lock(); }

void sampler_after_fork_parent() { g_lock.unlock(); }

void sampler_after_fork_child() {
    g_lock.reset();
    if (Table* t = g_table.load(std::memory_order_relaxed))
        for (uint64_t i = 0; i <= t->mask; ++i) t->keys[i].store(0, std::memory_order_relaxed);
    g_live = 0;
}

}  // namespace heapsnap::recorder
