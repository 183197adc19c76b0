// Interning of call stacks: each distinct stack gets a small dense id and is
// written to the log once; events carry only the id.
//
// Who interns: the writer, for the stacks a program thread walked with the
// stack cache it owns (their StackDefs, unwind.h "Local keys"); the program
// thread itself for the rest (a signal handler's walk, a thread past its
// exit hook, HEAPSNAP_VERIFY_STACKS's libunwind stacks, --unwind fp).
//
// Lookups are lock-free (an open-addressing table of (tag, record) pairs,
// read with acquire loads); inserting a new stack takes a lock of its own
// (stack_insert_lock), not the metadata lock, which the writer holds while
// it resolves new stacks' frames to (module, vaddr) and encodes their
// Stack records (queue_pending_stacks). When
// the table passes half full, a table of twice the size is filled and
// published; the old one is kept (never freed) so a lookup racing the
// switch still reads valid memory and, at worst, misses and retries under
// the lock.
//
// A lookup touches two places: its slot, which holds the stack's full
// 64-bit tag beside a pointer to its record, and the record, whose frames
// follow its header. A program with many stacks misses the cache on each
// of them, so an indirection more would be a cache miss more per lookup.
//
// Memory: a record keeps its frames delta-encoded, innermost first, in 2,
// 4 or 9 bytes each (frame_code.h): return addresses of one module lie
// within a few MiB of each other, so most frames take 2 or 4 bytes, not
// 8: on a compiler the frames are most of the recorder's memory. Plus 16 bytes of table per slot (at most half of them
// used) and 8 per id.
#pragma once

#include <cstdint>

#include "recorder/spinlock.h"

namespace heapsnap::recorder {

// The hash of a stack, folded from its outermost frame in:
// stack_hash(ips, n) = step(... step(step(0, ips[n-1]), ips[n-2]) ..., ips[0]).
// So a walk that keeps the outer part of the stack before it extends the
// hash of the kept part by the frames above it only (unwind.cpp keeps it
// per frame), and intern_stack is handed it instead of hashing again.
inline uint64_t stack_hash_step(uint64_t below, uint64_t ip) { return (below ^ ip) * 0x9e3779b97f4a7c15ull; }
inline uint64_t stack_hash(const uint64_t* ips, uint32_t n) {
    uint64_t h = 0;
    for (uint32_t i = n; i-- > 0;) h = stack_hash_step(h, ips[i]);
    return h;
}

// Returns the id (>= 1) of the stack `ips[0..n)` (innermost first), or 0 if
// memory for a new stack could not be had. `hash` must be stack_hash(ips, n).
// `record`, if not null, receives the stack's record (null with id 0),
// which stack_id_of can check another stack against: a caller's cache of
// recent stacks keeps it instead of their frames.
uint32_t intern_stack(const uint64_t* ips, uint32_t n, uint64_t hash, const void** record = nullptr);

// The id of the stack `record` (from intern_stack) holds if that stack is
// exactly ips[0..n), else 0. Records live as long as the process.
uint32_t stack_id_of(const void* record, const uint64_t* ips, uint32_t n);

// Starts loading the table slot where intern_stack will look for a stack
// of this hash: a compiler's stacks fill a table far larger than the
// caches, and its lookups are mostly two misses (slot, then record).
void prefetch_stack(uint64_t hash);

// Queues the Stack records of stacks interned since the last call, at most
// `max` of them, in id order, each resolved against the modules known now;
// true if some are left. Caller holds the metadata lock. The writer calls
// it before taking the queued metadata of a round, so a stack is defined
// before any event read in that round, and rescan_modules calls it before
// it changes the module list, so a stack's frames are resolved against the
// modules loaded when it was interned.
bool queue_pending_stacks(uint32_t max);

// Held while a stack is inserted. Lock order: this one, then the metadata
// lock (an insert rescans the modules under it when they changed). Taken
// across fork so a child never inherits a half-inserted stack.
SpinLock& stack_insert_lock();

// After fork: the child's new log must define every stack again. Frames
// are resolved against the modules loaded now, which the child's log
// describes; a frame in a module unloaded before the fork is written as a
// bare address (hslog::kNoModule).
void requeue_all_stacks();

}  // namespace heapsnap::recorder
