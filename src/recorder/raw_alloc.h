// Memory for the recorder itself, taken straight from the kernel.
//
// The recorder runs inside malloc; it can never call malloc for its own
// buffers (that would recurse, and would show up as the program's memory).
// Everything it keeps (thread rings, the stack table, zstd contexts, the
// output buffer) comes from here: whole pages via the mmap syscall, counted
// so markers can report the recorder's own footprint separately from the
// program's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace heapsnap::recorder {

// Page-granular, zero-filled. Returns nullptr on failure (never aborts).
void* raw_map(size_t bytes);
// The same with every page faulted in writable at once (MAP_POPULATE), for
// tables probed by reads before their first write at a random place: a
// page first read maps the shared zero page, and the write after it takes
// a write-protect fault whose TLB flush interrupts, by IPI, every CPU
// running another thread of the process (on cc1plus, most of the writer
// thread's kernel time once the membarrier was gone). Also for memory
// filled page after page on a hot path (the stack table's record arena),
// where one syscall costs less than a fault per page.
void* raw_map_populated(size_t bytes);
// raw_map_populated, but from 2 MiB on rounded up to and aligned on 2 MiB
// and advised for transparent huge pages (small pages where the kernel has
// none or THP is off) before it is written in full. Never unmapped. For
// tables a big program makes the recorder read at random, populated
// anyway: the stack table's slots, whose lookups stall on the TLB with
// small pages (a nested page walk in a VM). A fault there may wait
// for the kernel to compact memory into a huge page (THP defrag
// "madvise"): a few such faults a process.
inline constexpr size_t kHugePage = 2u << 20;
void* raw_map_huge_populated(size_t bytes);
void raw_unmap(void* p, size_t bytes);

// In a fork child: the parent's writer thread may have held the range
// table's lock at the fork; the child (which unmaps the parent's allocation-info
// table when it opens its own log) must not wait for it.
void raw_forget_after_fork();

// Bytes currently mapped through raw_map.
uint64_t raw_mapped_bytes();

// Whether [start, end) overlaps memory the recorder holds (its mappings and
// the writer thread's stack), so markers can show it as the recorder's own
// row instead of the program's anonymous memory.
bool overlaps_recorder(uint64_t start, uint64_t end);
// Registers memory the recorder did not map itself (the writer's stack).
void note_recorder_range(uint64_t start, uint64_t end);
// Drops a registered range that [start, end) exactly or partly covers
// (libunwind unmapping its cache); true if there was one.
bool forget_recorder_range(uint64_t start, uint64_t end);

// Small-object allocator for zstd's customMem: each block carries its size
// in a header and is mapped on its own (zstd allocates a handful of
// contexts once, so there is no point in a free list).
void* raw_block_alloc(void* opaque, size_t bytes);
void raw_block_free(void* opaque, void* p);

}  // namespace heapsnap::recorder
