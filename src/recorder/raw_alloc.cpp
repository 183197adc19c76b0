#include "recorder/raw_alloc.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace heapsnap::recorder {
namespace {

std::atomic<uint64_t> g_mapped{0};

size_t page_round(size_t bytes) {
    const size_t page = 4096;
    return (bytes + page - 1) & ~(page - 1);
}

}  // namespace

// The syscall is used instead of mmap() because mmap itself is interposed
// (direct anonymous mmaps of the program are recorded).
void* raw_map(size_t bytes) {
    bytes = page_round(bytes);
    long r = syscall(SYS_mmap, nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r < 0 && r > -4096) return nullptr;
    void* p = reinterpret_cast<void*>(r);
    if (p == MAP_FAILED) return nullptr;
    g_mapped.fetch_add(bytes, std::memory_order_relaxed);
    return p;
}

void raw_unmap(void* p, size_t bytes) {
    if (!p) return;
    bytes = page_round(bytes);
    syscall(SYS_munmap, p, bytes);
    g_mapped.fetch_sub(bytes, std::memory_order_relaxed);
}

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
