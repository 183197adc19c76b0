#include "recorder/modules.h"

#include <elf.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include "format/hslog.h"
#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/metadata_queue.h"
#include "recorder/raw_alloc.h"
#include "recorder/stack_table.h"

namespace heapsnap::recorder {
namespace {

constexpr size_t kMaxPath = 1024;
constexpr size_t kMaxBuildId = 64;

struct Module {
    uint32_t id;
    bool loaded;
    bool seen;  // scratch for a rescan
    uint64_t bias;
    uint64_t start;
    uint64_t end;
    uint32_t path_len;
    uint32_t build_id_len;
    char path[kMaxPath];
    uint8_t build_id[kMaxBuildId];
};

SpinLock g_lock;
// dl_iterate_phdr's counters of objects ever loaded and unloaded: when they
// have not moved, the module list is current. Written under the metadata
// lock; rescan_modules_if_changed reads them without it.
std::atomic<uint64_t> g_scanned_adds{UINT64_MAX};
std::atomic<uint64_t> g_scanned_subs{UINT64_MAX};

Module* g_modules = nullptr;  // index = id - 1
uint32_t g_count = 0;
uint32_t g_capacity = 0;
uint32_t* g_sorted = nullptr;  // indices of loaded modules by start address
uint32_t g_sorted_count = 0;
// 1 + the index of the module find_loaded found last (0: none): a stack's
// frames mostly lie in one module, so most lookups end here.
uint32_t g_last_found = 0;

char g_exe[kMaxPath];
size_t g_exe_len = 0;

bool reserve_modules(uint32_t needed) {
    if (needed <= g_capacity) return true;
    uint32_t capacity = g_capacity ? g_capacity * 2 : 256;
    while (capacity < needed) capacity *= 2;
    auto* modules = static_cast<Module*>(raw_map(sizeof(Module) * capacity));
    auto* sorted = static_cast<uint32_t*>(raw_map(sizeof(uint32_t) * capacity));
    if (!modules || !sorted) return false;
    if (g_count) std::memcpy(modules, g_modules, sizeof(Module) * g_count);
    if (g_sorted_count) std::memcpy(sorted, g_sorted, sizeof(uint32_t) * g_sorted_count);
    raw_unmap(g_modules, sizeof(Module) * g_capacity);
    raw_unmap(g_sorted, sizeof(uint32_t) * g_capacity);
    g_modules = modules;
    g_sorted = sorted;
    g_capacity = capacity;
    return true;
}

void queue_load(const Module& m) {
    codec::Writer w(nullptr, 0);
    if (!metadata_reserve(64 + m.path_len + m.build_id_len, &w)) return;
    hslog::put_module_load(w, now_ns() - start_time_ns(), m.id, m.bias, m.start, m.end, m.path, m.path_len, m.build_id,
                           m.build_id_len);
    metadata_commit(w);
}

void queue_unload(const Module& m) {
    codec::Writer w(nullptr, 0);
    if (!metadata_reserve(32, &w)) return;
    hslog::put_module_unload(w, now_ns() - start_time_ns(), m.id);
    metadata_commit(w);
}

void read_build_id(const dl_phdr_info* info, Module& m) {
    m.build_id_len = 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_NOTE) continue;
        auto* p = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
        const uint8_t* end = p + ph.p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            ElfW(Nhdr) note;
            std::memcpy(&note, p, sizeof note);
            const uint8_t* name = p + sizeof note;
            const uint8_t* desc = name + ((note.n_namesz + 3) & ~3u);
            const uint8_t* next = desc + ((note.n_descsz + 3) & ~3u);
            if (next > end) break;
            if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0 &&
                note.n_descsz <= kMaxBuildId) {
                std::memcpy(m.build_id, desc, note.n_descsz);
                m.build_id_len = note.n_descsz;
                return;
            }
            p = next;
        }
    }
}

char g_resolved[PATH_MAX];

// The executable has no name in the list; a plugin opened by a relative
// path keeps it there ("./libplugin.so"), which a reader in another
// directory could not open: make it absolute (against the current
// directory, the best there is after the fact).
const char* module_name(const dl_phdr_info* info, size_t* len) {
    const char* name = info->dlpi_name;
    if (!name || !*name) {
        *len = g_exe_len;
        return g_exe;
    }
    if (name[0] != '/' && std::strchr(name, '/') && realpath(name, g_resolved)) name = g_resolved;
    *len = std::strlen(name);
    return name;
}

int scan_one(dl_phdr_info* info, size_t, void*) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type != PT_LOAD) continue;
        uint64_t s = info->dlpi_addr + ph.p_vaddr;
        if (s < lo) lo = s;
        if (s + ph.p_memsz > hi) hi = s + ph.p_memsz;
    }
    if (hi <= lo) return 0;
    size_t len;
    const char* name = module_name(info, &len);
    if (len >= kMaxPath) len = kMaxPath - 1;
    for (uint32_t i = 0; i < g_count; ++i) {
        Module& m = g_modules[i];
        if (m.loaded && m.bias == info->dlpi_addr && m.start == lo && m.path_len == len &&
            std::memcmp(m.path, name, len) == 0) {
            m.seen = true;
            return 0;
        }
    }
    if (!reserve_modules(g_count + 1)) return 0;
    Module& m = g_modules[g_count];
    m.id = g_count + 1;
    m.loaded = true;
    m.seen = true;
    m.bias = info->dlpi_addr;
    m.start = lo;
    m.end = hi;
    m.path_len = static_cast<uint32_t>(len);
    std::memcpy(m.path, name, len);
    m.path[len] = 0;
    read_build_id(info, m);
    g_count++;
    queue_load(m);
    return 0;
}

void rebuild_sorted() {
    g_sorted_count = 0;
    g_last_found = 0;
    for (uint32_t i = 0; i < g_count; ++i) {
        if (!g_modules[i].loaded) continue;
        uint32_t j = g_sorted_count++;
        while (j > 0 && g_modules[g_sorted[j - 1]].start > g_modules[i].start) {
            g_sorted[j] = g_sorted[j - 1];
            --j;
        }
        g_sorted[j] = i;
    }
}

const Module* find_loaded(uint64_t ip) {
    if (g_last_found) {
        const Module& last = g_modules[g_last_found - 1];
        if (ip >= last.start && ip < last.end) return &last;
    }
    uint32_t lo = 0, hi = g_sorted_count;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (g_modules[g_sorted[mid]].start <= ip)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return nullptr;
    const Module& m = g_modules[g_sorted[lo - 1]];
    if (ip >= m.end) return nullptr;
    g_last_found = g_sorted[lo - 1] + 1;
    return &m;
}

}  // namespace

SpinLock& metadata_lock() { return g_lock; }

namespace {

struct Counters {
    uint64_t adds;
    uint64_t subs;
};

int read_counters(dl_phdr_info* info, size_t size, void* out) {
    auto* c = static_cast<Counters*>(out);
    if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
        c->adds = info->dlpi_adds;
        c->subs = info->dlpi_subs;
    }
    return 1;  // the counters are the same in every entry: one is enough
}

Counters loader_counters() {
    Counters now{0, 0};
    dl_iterate_phdr(read_counters, &now);
    return now;
}

bool scanned(const Counters& now) {
    return now.adds == g_scanned_adds.load(std::memory_order_relaxed) &&
           now.subs == g_scanned_subs.load(std::memory_order_relaxed);
}

}  // namespace

void rescan_modules(bool force) {
    Counters now = loader_counters();
    if (!force && scanned(now)) return;
    // Stacks interned before the change are resolved against the list
    // before it. (A forced scan is a fresh start: at initialization there
    // are no stacks, and a fork child queues all of them again after it.)
    if (!force) queue_pending_stacks(UINT32_MAX);
    g_scanned_adds.store(now.adds, std::memory_order_relaxed);
    g_scanned_subs.store(now.subs, std::memory_order_relaxed);
    for (uint32_t i = 0; i < g_count; ++i) g_modules[i].seen = false;
    dl_iterate_phdr(scan_one, nullptr);
    for (uint32_t i = 0; i < g_count; ++i) {
        Module& m = g_modules[i];
        if (m.loaded && !m.seen) {
            m.loaded = false;
            queue_unload(m);
        }
    }
    rebuild_sorted();
}

void rescan_modules_if_changed() {
    if (scanned(loader_counters())) return;
    LockGuard guard(g_lock);
    rescan_modules(false);
}

ResolvedFrame resolve_frame(uint64_t ip) {
    const Module* m = find_loaded(ip);
    if (!m) return {hslog::kNoModule, ip};
    return {m->id, ip - m->bias};
}

void requeue_all_modules() {
    for (uint32_t i = 0; i < g_count; ++i)
        if (g_modules[i].loaded) queue_load(g_modules[i]);
}

void init_exe_path() {
    ssize_t n = readlink("/proc/self/exe", g_exe, sizeof g_exe - 1);
    g_exe_len = n > 0 ? static_cast<size_t>(n) : 0;
    g_exe[g_exe_len] = 0;
}

const char* exe_path() { return g_exe; }

}  // namespace heapsnap::recorder
