// Interning of call stacks: each distinct stack gets a small dense id and is
// written to the log once; events carry only the id.
//
// Lookups are lock-free (an open-addressing table of ids, read with acquire
// loads); inserting a new stack takes the metadata lock, resolves its frames
// to (module, vaddr) and queues its Stack record. When the table passes half
// full, a table of twice the size is filled and published; the old one is
// kept (never freed) so a lookup racing the switch still reads valid memory
// and, at worst, misses and retries under the lock.
//
// Memory: a stack of n frames costs 12n + 32 bytes plus 8 bytes of table,
// all from raw_map and counted as recorder overhead.
#pragma once

#include <cstdint>

namespace heapsnap::recorder {

// Returns the id (>= 1) of the stack `ips[0..n)` (innermost first), or 0 if
// memory for a new stack could not be had.
uint32_t intern_stack(const uint64_t* ips, uint32_t n);

// After fork: the child's new log must define every stack again. Frames
// are resolved against the modules loaded now, which the child's log
// describes; a frame in a module unloaded before the fork is written as a
// bare address (hslog::kNoModule).
void requeue_all_stacks();

}  // namespace heapsnap::recorder
