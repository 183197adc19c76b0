// The stack of the calling thread, for the recorder's hooks: return
// addresses, innermost first, exactly those libunwind's unw_backtrace
// reports, without the frames of the recorder itself.
//
// Why not unw_backtrace. A context save, unw_init_local and a cache probe
// per frame cost about 200 ns on a 25-frame stack, and interning the
// result as much again: together the largest cost of recording. But
// consecutive allocations of a thread share most of their stack, and most
// allocations come from a few stacks. So:
//   - every frame is stepped with its CFI rule (frame_rules.h), and each
//     thread's cache keeps its last stack: per frame its registers, its
//     rule and the stack words the step read;
//   - once the walk meets a frame of the last stack (same sp, ip and bp),
//     the rest of the last stack is reused link by link, each link checked
//     by re-reading the one to three words it was computed from (return
//     address slot, saved rbp, the CFA of a realigned frame). A step is a
//     function of the frame, its rule and those words, so equal words mean
//     an equal caller: a reused stack is the stack a full unwind gives,
//     never a guess. A link that no longer holds (the same leaf called from
//     another caller at the same depth, a longjmp, a frame returned from
//     and entered again) is stepped afresh and the walk goes on;
//   - a thread that owns its cache hands each stack it walks on to be
//     interned by the writer (keyer.define, "Local keys" below) under a
//     key of the cache's own; the others key it at once (key()), and
//     remember key() per stack (the memo), checked against the stack's
//     record in full, so a stack seen lately is not hashed and looked up
//     in the shared table again;
//   - a hook's stack whose first frame is the last stack's top one (a
//     loop allocating at one place) is the last stack if its links hold:
//     its key without a walk;
//   - the frames walked afresh above the last stack are kept per first
//     frame (and its caller, where many callers share one) with the key
//     of their whole stack (a segment), so a place an interpreter
//     allocates from again (a dict, a string, a list in turn) costs only
//     its link checks: no step, no rewrite, no memo. It holds while the
//     last stack's frames it joined have not been rewritten (or hold the
//     same return addresses again; of a deep join, the 32 innermost of
//     them, and those below have not been rewritten).
//     A segment frame's rbp is compared only where the walk depends on it
//     (its rule reads through rbp, or hands rbp on to a frame that does):
//     code that keeps data in rbp, as python3's does, calls the same place
//     with other values in it, and comparing them lost a quarter of the
//     hits (76 % of python3's allocations hit a segment, 99 % since);
//   - the same goes for the last stack's frames (CachedFrame::bp_needed):
//     a frame is met again, and a link checked, without its rbp where the
//     walk from it outward does not depend on it. On a compile (cc1plus,
//     built without frame pointers, so rbp is one more register) 90 000 of
//     the 247 000 links that failed had only such an rbp changed, and
//     walks went from 406 000 to 382 000; python3's from 70 500 to 64 500.
//     Where a walk steps on from a reused frame, the rbps of the frames it
//     reused are taken again from memory (their callers may now need them);
//   - a stack deeper than the frames asked for is still walked to its end
//     for the cache (up to kMaxDepth + 8 frames), so that it is reused and
//     rejoined like any other; only the frames asked for are reported.
// The recorder's own frames at the top are skipped: a hook passes its
// frame address and the walk starts with the hook's caller (the recorder
// keeps frame pointers); without one they are followed by frame pointer.
// They are not cached, so the cache starts with the program's frame. The
// reuse reads dense copies of what it checks (LinkCheck) and copies the
// reused ips in one memcpy: on python3, ~12 frames reused a stack.
// On tools/bench-programs/alloc_bench.c (20-frame recursion) unwinding
// and interning drop from ~440 to ~125 ns per allocation, on python3
// (PYTHONMALLOC=malloc, tools/bench-programs/churn.py) from ~250 to ~160.
//
// A frame the rules do not cover (unusual CFI, a signal frame, code
// without CFI whose frame pointer cannot be followed safely: unwind.cpp,
// walk_rule) sends its whole stack to unw_backtrace, filtered the same way.
// Rejected: a frame-pointer walk checked against the CFI per return
// address (right only where every function keeps a frame pointer; the
// check costs what the rule lookup costs); trusting frames "probably
// unchanged" without re-reading them (a stack reused unread can be wrong);
// keeping the cache in TLS (it would sit on every thread's stack: static
// TLS comes out of thread stacks) or per thread until exit (no exit hook
// here, and churning threads would leak it).
//
// The caches: a pool of 128. A recording thread owns one until its exit
// hook (borrowed then with plain stores): the lowest free one, so threads
// that come and go reuse the caches of those gone. One past its exit
// hook, or a signal handler interrupting a walk, borrows a free one for
// one walk with an atomic flag; so a thread, a signal handler interrupting
// it, another thread or a fork child never use one at the same time.
// Nothing in them is trusted without the link check, so any thread may
// take any of them. More than 128 recording threads at once: the rest walk
// without a cache (slower, same stacks). About 530 KiB each (370 KiB of it
// segments), mapped on first use and populated then (raw_map_populated: a
// page first read, then written, would cost a second fault and a TLB
// shootdown), and counted as recorder memory. A freed cache waits for the
// next thread; past 8 free ones, an exiting thread unmaps its own, so the
// caches mapped follow the threads alive, not every thread there was.
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

// What a stack cache keeps of the last stack it handed on (define), and
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

// What unwind_stack_key hands a stack to. key(ips, n, hash, &token)
// returns its key; hash is stack_hash(ips, n), mostly kept per frame by
// the cache, not taken again. prepare(hash), if not null, is called as
// soon as the hash is known, before the cache is brought up to date and
// the memo looked at, so that a lookup by key can start early (a
// prefetch). The memo of recent stacks keeps, per stack, its key and the
// token key set: recall(token, ips, n) says whether ips[0..n) gets that
// key again (the recorder's token is the stack's record in the stack
// table). recall only sees tokens of nonzero keys, which are remembered;
// without recall there is no memo.
struct StackKeyer {
    uint32_t (*key)(uint64_t* ips, int n, uint64_t hash, const void** token);
    void (*prepare)(uint64_t hash);
    bool (*recall)(const void* token, const uint64_t* ips, int n);
    // If not null: hands ips[0..n) (hash as for key) to be keyed later
    // under the local key `local` (below), instead of key() now; false if
    // it cannot, and key() is called. `last` is the stack the cache handed
    // on last (DefinedStack), for define to keep up to date. If `last` is
    // whole, its outermost `known` frames are known to be those of
    // ips[0..n) (the frames the walk kept of the cache's last stack, which
    // `last` was): define need not compare them.
    bool (*define)(const uint64_t* ips, int n, uint64_t hash, uint32_t local, uint32_t known,
                   DefinedStack& last) = nullptr;
};

// Local keys. A thread that owns its stack cache does not intern the
// stacks it walks: keyer.define hands each walked stack on (the recorder
// appends it to the thread's ring, and the writer interns it there) under
// a key of the cache's own, which the segments and the last stack keep
// like any other. Interning in the thread (the memo, its check against the
// stack's record, the shared table's lookup and insert) cost a compile
// (cc1plus -O2) about 28 % of the stack capture's cycles; handing the
// stacks on instead took the recorder's share of the program thread's
// cycles from 0.249 to 0.208 of the compiler's own, and 0.04 to 0.05 s
// of the recorded run's 0.35 s overhead (README, "Performance").
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

// Unwinds like unwind_stack and returns keyer.key for the stack; for a
// stack the memo holds (recall says so), the earlier result without
// calling key. key must depend on ips, n and max only, and may change
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

// unw_backtrace's stack of the calling thread without the recorder's
// frames: its first `max` frames of the program (the recorder's above them
// do not count, as they do not for unwind_stack_key from a hook). Slow:
// for HEAPSNAP_VERIFY_STACKS.
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

// The calling thread's exit hook: the stack cache it owns becomes free.
void release_stack_cache();
// In a fork child: the caches of the parent's other threads become free.
void reset_stack_caches_after_fork();

}  // namespace heapsnap::recorder
