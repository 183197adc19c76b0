#include "recorder/allocator.h"

#include <dlfcn.h>
#include <string.h>

#include "recorder/spinlock.h"
#include "recorder/thread_buffer.h"

namespace heapsnap::recorder {
namespace {

using hslog::AllocatorKind;
using hslog::AllocatorStats;

AllocatorKind g_kind = AllocatorKind::Unknown;

using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);
using TcmallocPropertyFn = int (*)(const char*, size_t*);
using MiProcessInfoFn = void (*)(size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*, size_t*);
MallctlFn g_mallctl = nullptr;
TcmallocPropertyFn g_tc_property = nullptr;
MiProcessInfoFn g_mi_process_info = nullptr;

// Whether `symbol` is defined in the object that holds `base` (dladdr's
// dli_fbase), so a second allocator loaded beside the one in use is not
// taken for it.
void* symbol_in(const void* base, const char* symbol) {
    void* p = dlsym(RTLD_DEFAULT, symbol);
    Dl_info info;
    if (!p || !dladdr(p, &info) || info.dli_fbase != base) return nullptr;
    return p;
}

// The allocator's own mappings, [start, end). A cut in the middle of one
// takes a second slot.
constexpr size_t kMaxMappings = 4096;
struct Mapping {
    uint64_t start;
    uint64_t end;
};
SpinLock g_mappings_lock;
Mapping g_mappings[kMaxMappings];
size_t g_mapping_count = 0;

}  // namespace

void detect_allocator(void* real_malloc) {
    Dl_info info;
    if (!real_malloc || !dladdr(real_malloc, &info) || !info.dli_fname) return;
    const char* slash = strrchr(info.dli_fname, '/');
    const char* name = slash ? slash + 1 : info.dli_fname;
    if (strncmp(name, "libc.so", 7) == 0) {
        g_kind = AllocatorKind::Glibc;
    } else if ((g_mallctl = reinterpret_cast<MallctlFn>(symbol_in(info.dli_fbase, "mallctl")))) {
        g_kind = AllocatorKind::Jemalloc;
    } else if ((g_tc_property = reinterpret_cast<TcmallocPropertyFn>(
                    symbol_in(info.dli_fbase, "MallocExtension_GetNumericProperty")))) {
        g_kind = AllocatorKind::Tcmalloc;
    } else if ((g_mi_process_info = reinterpret_cast<MiProcessInfoFn>(symbol_in(info.dli_fbase, "mi_process_info")))) {
        g_kind = AllocatorKind::Mimalloc;
    }
}

AllocatorKind allocator_kind() { return g_kind; }

void note_allocator_mapping(uint64_t start, uint64_t end) {
    if (start >= end) return;
    LockGuard guard(g_mappings_lock);
    if (g_mapping_count < kMaxMappings) g_mappings[g_mapping_count++] = Mapping{start, end};
}

bool forget_allocator_mapping(uint64_t start, uint64_t end) {
    bool found = false;
    LockGuard guard(g_mappings_lock);
    for (size_t i = 0; i < g_mapping_count;) {
        Mapping m = g_mappings[i];
        if (m.end <= start || end <= m.start) {
            ++i;
            continue;
        }
        found = true;
        bool below = m.start < start, above = end < m.end;
        if (below && above) {
            g_mappings[i] = Mapping{m.start, start};
            if (g_mapping_count < kMaxMappings) g_mappings[g_mapping_count++] = Mapping{end, m.end};
            ++i;
        } else if (below) {
            g_mappings[i++] = Mapping{m.start, start};
        } else if (above) {
            g_mappings[i++] = Mapping{end, m.end};
        } else {
            g_mappings[i] = g_mappings[--g_mapping_count];
        }
    }
    return found;
}

bool overlaps_allocator_mapping(uint64_t start, uint64_t end) {
    LockGuard guard(g_mappings_lock);
    for (size_t i = 0; i < g_mapping_count; ++i)
        if (g_mappings[i].start < end && start < g_mappings[i].end) return true;
    return false;
}

void allocator_forget_after_fork() { g_mappings_lock.reset(); }

bool read_allocator_stats(AllocatorStats& out) {
    out = AllocatorStats{};
    out.kind = g_kind;
    // The allocator may map memory for itself while it answers.
    ThreadState& t = thread_state();
    t.in_allocator++;
    if (g_kind == AllocatorKind::Jemalloc && g_mallctl) {
        // The numbers are those of the last epoch: advance it first.
        uint64_t epoch = 1;
        size_t len = sizeof epoch;
        g_mallctl("epoch", &epoch, &len, &epoch, len);
        struct Field {
            const char* name;
            uint64_t* value;
            uint8_t bit;
        } fields[] = {{"stats.allocated", &out.allocated, AllocatorStats::kAllocated},
                      {"stats.active", &out.active, AllocatorStats::kActive},
                      {"stats.resident", &out.resident, AllocatorStats::kResident},
                      {"stats.mapped", &out.mapped, AllocatorStats::kMapped}};
        for (const Field& f : fields) {
            size_t v = 0;
            len = sizeof v;
            if (g_mallctl(f.name, &v, &len, nullptr, 0) == 0) {
                *f.value = v;
                out.present |= f.bit;
            }
        }
    } else if (g_kind == AllocatorKind::Tcmalloc && g_tc_property) {
        size_t allocated = 0, heap = 0, free_bytes = 0, unmapped = 0, physical = 0;
        if (g_tc_property("generic.current_allocated_bytes", &allocated)) {
            out.allocated = allocated;
            out.present |= AllocatorStats::kAllocated;
        }
        if (g_tc_property("generic.heap_size", &heap)) {
            out.mapped = heap;
            out.present |= AllocatorStats::kMapped;
            if (g_tc_property("tcmalloc.pageheap_free_bytes", &free_bytes) &&
                g_tc_property("tcmalloc.pageheap_unmapped_bytes", &unmapped) && free_bytes + unmapped <= heap) {
                out.active = heap - free_bytes - unmapped;
                out.present |= AllocatorStats::kActive;
            }
        }
        if (g_tc_property("generic.total_physical_bytes", &physical)) {
            out.resident = physical;
            out.present |= AllocatorStats::kResident;
        }
    } else if (g_kind == AllocatorKind::Mimalloc && g_mi_process_info) {
        size_t elapsed = 0, user = 0, system = 0, rss = 0, peak_rss = 0, commit = 0, peak_commit = 0, faults = 0;
        g_mi_process_info(&elapsed, &user, &system, &rss, &peak_rss, &commit, &peak_commit, &faults);
        out.committed = commit;
        out.present |= AllocatorStats::kCommitted;
    }
    t.in_allocator--;
    return out.present != 0;
}

}  // namespace heapsnap::recorder
