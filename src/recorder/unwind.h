// The stack of the calling thread, for the recorder's hooks: return
// addresses, innermost first, exactly those libunwind's unw_backtrace
// reports, without loading libunwind, and without the frames of the
// recorder itself. A thread that owns a stack cache hands the stacks it
// walks to the writer under a local key (below) instead of interning them.
// How it is done and why: docs/design/stack-capture.md; the parts:
// unwind_step.h (one step), unwind_cache.h (the per-thread caches and
// their pool), unwind_segments.h (segments), unwind.cpp (the walk),
// cfi_walk.h (stacks the walk's rules do not cover).
#pragma once

#include <cstdint>

#include "recorder/lifecycle.h"

namespace heapsnap::recorder {

// Fills ips with the calling thread's stack, starting with the return
// address into the caller of unwind_stack, without the frames of the
// module this unwinder is linked into (the recorder: its hooks above the
// program's frames, its pthread_create hook inside a stack). At most max
// frames are walked, those left out included. Returns the count.
int unwind_stack(uint64_t* ips, int max);

// What a stack cache keeps of the last stack it handed on (define_local_key), and
// the writer of the last it took from that cache, to carry only the frames
// a stack does not share with the one before (a walk rewrites the top of
// the last stack): its n frames, right-aligned, innermost first, in
// ips[kDefinedRoom - n, kDefinedRoom). n is 0 after the cache changes
// owner or crosses a fork: the next stack is carried whole. whole: the n
// frames are all the stack's, not its innermost ones cut to a depth.
inline constexpr uint32_t kDefinedRoom = kMaxDepth + 8;
struct DefinedStack {
    uint32_t n;
    bool whole;
    uint64_t ips[kDefinedRoom];
};

// What unwind_stack_key hands a stack to. intern_now(ips, n, hash, &token)
// returns its key; hash is stack_hash(ips, n), mostly kept per frame by
// the cache, not taken again. prefetch_intern(hash), if not null, is
// called as soon as the hash is known, before the cache is brought up to
// date and the memo looked at, so that intern_now's lookup by hash can
// start early (a prefetch). The memo of recent stacks keeps, per stack,
// its key and the token intern_now set: memo_matches(token, ips, n) says
// whether ips[0..n) is the stack behind that token, and so gets its key
// again (the recorder's token is the stack's record in the stack table).
// memo_matches only sees tokens of nonzero keys, which are remembered;
// without it there is no memo.
struct StackKeyer {
    uint32_t (*intern_now)(uint64_t* ips, int n, uint64_t hash, const void** token);
    void (*prefetch_intern)(uint64_t hash);
    bool (*memo_matches)(const void* token, const uint64_t* ips, int n);
    // If not null: hands ips[0..n) (hash as for intern_now) to be interned
    // later under the local key `local` (below), instead of intern_now;
    // false if it cannot, and intern_now is called. `last` is the stack the
    // cache handed on last (DefinedStack), which define_local_key keeps up
    // to date. If `last` is whole, its outermost `known` frames are known
    // to be those of ips[0..n) (the frames the walk kept of the cache's
    // last stack, which `last` was): they need not be compared.
    bool (*define_local_key)(const uint64_t* ips, int n, uint64_t hash, uint32_t local, uint32_t known,
                             DefinedStack& last) = nullptr;
};

// Local keys. A thread that owns its stack cache does not intern the
// stacks it walks: keyer.define_local_key hands each walked stack on (the recorder
// appends it to the thread's ring, and the writer interns it there) under
// a key of the cache's own, which the segments and the last stack keep
// like any other.
// A local key: kLocalKey | the cache's pool slot << 24 | a counter of the
// cache's walks (24 bits, never all ones, so that no key is the
// recorder's kDeferredStack). Only the cache's owner hands one out, so
// every event naming it comes after its definition in the same ring; and
// only kLocalWindow - 1 walks back, so the writer keeps kLocalWindow of
// them a cache (local_key_index). Every kLocalWindow walks the cache
// drops the keys older than that, so none lives until the counter comes
// round again. A cache that changes owner, or crosses a fork, moves its
// counter on by the window and drops every local key it held.
inline constexpr uint32_t kLocalKey = 1u << 31;
inline constexpr uint32_t kLocalWindow = 1u << 16;
inline constexpr uint32_t kStackCaches = 128;
inline bool is_local_key(uint32_t key) { return (key & kLocalKey) != 0 && key != UINT32_MAX; }
inline uint32_t local_key_cache(uint32_t key) { return (key >> 24) & (kStackCaches - 1); }
inline uint32_t local_key_index(uint32_t key) { return key & (kLocalWindow - 1); }

// Unwinds like unwind_stack and returns keyer.intern_now for the stack;
// for a stack the memo holds (memo_matches says so), the earlier result
// without calling it. intern_now must depend on ips, n and max only, and may change
// ips; a 0 result is not remembered. ips gets at most max frames, though
// the walk may go on past them for the cache (unwind.cpp, walk). `from`,
// if not null, is the frame address of a function of this module (built
// with frame pointers) whose caller the walk starts with: a hook passes
// its own, so the recorder's frames between it and here are not walked.
uint32_t unwind_stack_key(uint64_t* ips, int max, const StackKeyer& keyer, const void* from);

// Called by a hook (`from`: its frame) before the real allocator: starts
// loading the segment bucket unwind_stack_key(.., from) will look in
// first, so that the allocator's own work hides the cache miss (on a
// compile, the largest single stall of the unwinder). Does nothing on a
// thread that owns no stack cache yet.
void prefetch_stack_key(const void* from);

// --unwind fp: follows the saved frame pointers, left out and limited the
// same way, reading nothing at or above `top` (the thread's stack top).
// Right only for code built with frame pointers: a function without one
// ends the stack or, worse, hides its caller, which is why it is the
// user's choice and not what auto picks.
int walk_frame_pointers(uint64_t* ips, int max, uint64_t top);

// HEAPSNAP_VERIFY_STACKS's reference unwinder: libunwind's unw_backtrace,
// loaded by load_reference_unwinder (a dlopen, from the recorder's start);
// false if it cannot be loaded. reference_unwinder: its unw_backtrace,
// null until loaded.
bool load_reference_unwinder();
const void* reference_unwinder();

// unw_backtrace's stack of the calling thread without the recorder's
// frames: its first `max` frames of the program (the recorder's above them
// do not count, as they do not for unwind_stack_key from a hook); -1 where
// the reference unwinder is not loaded. Slow: for HEAPSNAP_VERIFY_STACKS.
int libunwind_program_stack(uint64_t* ips, int max);

// Ages the local keys of the stack cache the calling thread owns as
// `walks` more walks would, dropping those they would drop (for tests: the
// window's edge without 65 536 walks, the counter's wrap without 2^24).
void skip_local_keys(uint32_t walks);

// The calling thread runs on a stack whose top is `hi` (its first frame)
// and of which [lo, hi) is mapped for its whole life (a thread the program
// started, on the stack glibc made for it or the one the program gave:
// hooks.cpp, thread_trampoline; lo == hi where that is not known): the
// walk may read there where the rules alone would not (unwind.cpp,
// readable). The main thread's is found without this.
void set_thread_stack(uint64_t lo, uint64_t hi);

// The top of the calling thread's stack (set_thread_stack, or the main
// thread's); 0 where unknown. --unwind fp reads nothing at or above it.
uint64_t thread_stack_top();

// A signal handler left the calling thread's hook by siglongjmp during a
// walk (or a prefetch_stack_key): the caches the walk held may be half
// updated, and are cleared and given back.
void abandon_stack_walk();

// The calling thread's exit hook: the stack cache it owns becomes free.
void release_stack_cache();
// In a fork child: the caches of the parent's other threads become free.
void reset_stack_caches_after_fork();

}  // namespace heapsnap::recorder
