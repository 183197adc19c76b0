// Byte sampling (`heapsnap run --sample-bytes N`, HEAPSNAP_SAMPLE_BYTES):
// for processes where even exact recording costs too much.
//
// Poisson sampling by bytes, as tcmalloc and heapprofd do: every byte the
// program allocates is a sample point with probability 1/N, independently,
// so a block of s bytes is recorded with probability p(s) = 1 - exp(-s/N)
// and stands for s / p(s) bytes and 1 / p(s) blocks of its call site (the
// replay does the scaling; formats/hslog.md, Sampling). Blocks of N bytes or
// more are always recorded (p = 1): the large blocks, where a leak hurts
// most, stay exact. Each thread draws the distance to its next sample point
// from an exponential distribution with mean N, so the decision costs a
// subtraction per allocation and is independent of other threads.
//
// A free is recorded only if its block was: the addresses of live sampled
// blocks are kept in a set. Lookups are lock-free (every free looks); the
// rare inserts and removals take a lock. Rejected: recording every free
// (half of all events, and each would cost the writer and the log what
// sampling is meant to save).
//
// mmap/munmap are always recorded exactly.
#pragma once

#include <cstddef>
#include <cstdint>

namespace heapsnap::recorder {

// True when sampling is on (sample_bytes > 0 in the configuration).
bool sampling();

// Decides whether the allocation of `size` bytes at `addr` is recorded; if
// so, remembers addr as a live sampled block.
bool sample_allocation(uint64_t addr, uint64_t size);

// Remembers addr as a live sampled block whatever its size (a failed
// realloc whose old block was recorded as freed is recorded again).
void keep_sampled(uint64_t addr);

// Whether addr is a live sampled block; forgets it if so (its free is to be
// recorded).
bool release_sampled(uint64_t addr);

// fork: the parent holds the set's lock across fork; the child starts with
// an empty set (its log starts empty, as in exact mode).
void sampler_before_fork();
void sampler_after_fork_parent();
void sampler_after_fork_child();

}  // namespace heapsnap::recorder
