// Which malloc the traced process runs on, the memory it maps for itself,
// and its own statistics.
//
// The recorder works whatever implements malloc: glibc's, or one linked or
// preloaded after the recorder (jemalloc, tcmalloc, mimalloc), which the
// hooks reach through dlsym(RTLD_NEXT). Two things differ between them:
//   - glibc maps its arenas and large blocks with internal calls the hooks
//     never see; the others call mmap through the PLT, so the mmap hook
//     sees their mappings. One made while a hook is inside the real
//     allocator (ThreadState::in_allocator) is the allocator's own heap:
//     not an mmap of the program's, kept here so that a marker can call the
//     region Heap (RegionHint::Heap);
//   - each has its own statistics: glibc's mallinfo2, jemalloc's mallctl
//     ("stats.allocated", "stats.active", "stats.resident", "stats.mapped"
//     after an "epoch" refresh), tcmalloc's
//     MallocExtension_GetNumericProperty, mimalloc's mi_process_info. A
//     marker records those of the allocator in use, never glibc's numbers
//     for another allocator's heap.
#pragma once

#include <cstdint>

#include "format/hslog.h"

namespace heapsnap::recorder {

// Looks the allocator up from the module that defines `real_malloc` (the
// function the malloc hook calls). Calls dlsym and dladdr, which may
// allocate: once, at start, outside any allocation.
void detect_allocator(void* real_malloc);
hslog::AllocatorKind allocator_kind();

// The allocator's own mappings. Safe inside the allocator: a fixed table
// under a spin lock, no allocation. A full table (4096 ranges) loses only
// the Heap hint of the ranges it could not keep.
void note_allocator_mapping(uint64_t start, uint64_t end);
// Removes [start, end) from the table, splitting a range it cuts in two;
// true if any of it was there.
bool forget_allocator_mapping(uint64_t start, uint64_t end);
bool overlaps_allocator_mapping(uint64_t start, uint64_t end);
void allocator_forget_after_fork();

// The allocator's statistics now; false if it offers none the recorder can
// read (glibc's are mallinfo2, read by the marker itself).
bool read_allocator_stats(hslog::AllocatorStats& out);

}  // namespace heapsnap::recorder
