#include "recorder/raw_alloc.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "recorder/spinlock.h"

namespace heapsnap::recorder {
namespace {

std::atomic<uint64_t> g_mapped{0};

// The live recorder ranges. Few and long-lived (rings, tables, buffers);
// a full table only costs precision of the marker's Recorder row.
constexpr size_t kMaxRanges = 4096;
struct Range {
    uint64_t start;
    uint64_t end;
};
SpinLock g_ranges_lock;
Range g_ranges[kMaxRanges];
size_t g_range_count = 0;

void add_range(uint64_t start, uint64_t end) {
    LockGuard guard(g_ranges_lock);
    if (g_range_count < kMaxRanges) g_ranges[g_range_count++] = Range{start, end};
}

void remove_range(uint64_t start) {
    LockGuard guard(g_ranges_lock);
    for (size_t i = 0; i < g_range_count; ++i) {
        if (g_ranges[i].start == start) {
            g_ranges[i] = g_ranges[--g_range_count];
            return;
        }
    }
}

size_t page_round(size_t bytes) {
    const size_t page = 4096;
    return (bytes + page - 1) & ~(page - 1);
}

// The syscall is used instead of mmap() because mmap itself is interposed
// (direct anonymous mmaps of the program are recorded). MADV_DONTDUMP keeps
// the kernel from merging these mappings with the program's own anonymous
// ones (it merges only neighbours with the same flags; jemalloc maps its
// heap MAP_NORESERVE, as the recorder does), so /proc shows the recorder's
// memory apart; and a core dump of the program leaves the recorder's
// buffers out.
void* mmap_syscall(size_t bytes, int extra_flags) {
    long r = syscall(SYS_mmap, nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
    if (r < 0 && r > -4096) return nullptr;
    void* p = reinterpret_cast<void*>(r);
    if (p == MAP_FAILED) return nullptr;
    syscall(SYS_madvise, p, bytes, MADV_DONTDUMP);
    return p;
}

void* counted(void* p, size_t bytes) {
    g_mapped.fetch_add(bytes, std::memory_order_relaxed);
    add_range(reinterpret_cast<uint64_t>(p), reinterpret_cast<uint64_t>(p) + bytes);
    return p;
}

void* map_pages(size_t bytes, int extra_flags) {
    bytes = page_round(bytes);
    void* p = mmap_syscall(bytes, extra_flags);
    return p ? counted(p, bytes) : nullptr;
}

}  // namespace

void* raw_map(size_t bytes) { return map_pages(bytes, 0); }

void* raw_map_populated(size_t bytes) { return map_pages(bytes, MAP_POPULATE); }

void* raw_map_huge_populated(size_t bytes) {
    if (bytes < kHugePage) return map_pages(bytes, MAP_POPULATE);
    bytes = (bytes + kHugePage - 1) & ~(kHugePage - 1);
    // Mapped with a huge page of slack, then trimmed to the aligned part.
    auto* raw = static_cast<uint8_t*>(mmap_syscall(bytes + kHugePage, 0));
    if (!raw) return nullptr;
    auto base = reinterpret_cast<uint64_t>(raw);
    uint64_t start = (base + kHugePage - 1) & ~uint64_t{kHugePage - 1};
    if (start > base) syscall(SYS_munmap, raw, start - base);
    syscall(SYS_munmap, start + bytes, base + kHugePage - start);  // never empty: start < base + kHugePage
    auto* p = reinterpret_cast<uint8_t*>(start);
    syscall(SYS_madvise, p, bytes, MADV_HUGEPAGE);  // refused where THP is off: small pages then
    // Written, not read, first: a page read first maps the zero page and
    // faults again on the write (raw_map_populated).
    for (size_t at = 0; at < bytes; at += 4096) reinterpret_cast<volatile uint8_t*>(p)[at] = 0;
    return counted(p, bytes);
}

void raw_unmap(void* p, size_t bytes) {
    if (!p) return;
    bytes = page_round(bytes);
    remove_range(reinterpret_cast<uint64_t>(p));
    syscall(SYS_munmap, p, bytes);
    g_mapped.fetch_sub(bytes, std::memory_order_relaxed);
}

bool overlaps_recorder(uint64_t start, uint64_t end) {
    LockGuard guard(g_ranges_lock);
    for (size_t i = 0; i < g_range_count; ++i)
        if (g_ranges[i].start < end && start < g_ranges[i].end) return true;
    return false;
}

void note_recorder_range(uint64_t start, uint64_t end) { add_range(start, end); }

bool forget_recorder_range(uint64_t start, uint64_t end) {
    LockGuard guard(g_ranges_lock);
    for (size_t i = 0; i < g_range_count; ++i) {
        if (g_ranges[i].start < end && start < g_ranges[i].end) {
            g_ranges[i] = g_ranges[--g_range_count];
            return true;
        }
    }
    return false;
}

void raw_forget_after_fork() { g_ranges_lock.reset(); }

uint64_t raw_mapped_bytes() { return g_mapped.load(std::memory_order_relaxed); }

void* raw_block_alloc(void*, size_t bytes) {
    auto* base = static_cast<uint64_t*>(raw_map(bytes + 16));
    if (!base) return nullptr;
    base[0] = bytes + 16;
    return base + 2;
}

void raw_block_free(void*, void* p) {
    if (!p) return;
    auto* base = static_cast<uint64_t*>(p) - 2;
    raw_unmap(base, base[0]);
}

}  // namespace heapsnap::recorder
