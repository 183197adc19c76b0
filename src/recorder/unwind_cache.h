// The per-thread stack cache and the pool that hands caches to threads:
// a thread's last stack with its link checks, the segments above it
// (unwind_segments.h), near rules, the memo and the local keys
// (docs/design/stack-capture.md). Any thread may use any cache for a walk:
// what it holds is checked against memory before use, never trusted.
//
// The pool: kStackCaches caches. A recording thread owns the lowest free
// one until its exit hook; a thread past its exit hook, or a signal
// handler interrupting a walk, borrows a free one for one walk, so no two
// users ever share one. More recording threads than caches walk without
// one (slower, same stacks). Past kSpareCaches free ones an exiting thread
// unmaps its own, so the memory follows the threads alive.
#pragma once

#include <cstdint>

#include "recorder/unwind.h"
#include "recorder/unwind_segments.h"
#include "recorder/unwind_step.h"

namespace heapsnap::recorder::unwinder {

// A frame and the step from it to its caller, as last walked.
struct CachedFrame {
    Frame frame;
    Reads reads;
    FrameRule rule;
    bool is_own;  // not reported
    // The walk from this frame outward depends on its rbp (bp_matters):
    // only then is its rbp compared when the frame is met again or
    // checked as a caller.
    bool bp_needed;
    uint64_t hash;  // stack_hash of the reported ips from the outermost frame to this one
};

// `f` is the cached frame but for an rbp the walk does not depend on.
inline bool same_as_cached(const CachedFrame& cached, const Frame& f) {
    return cached.frame.sp == f.sp && cached.frame.ip == f.ip && (cached.frame.bp == f.bp || !cached.bp_needed);
}

// The step from `callee` gives `caller` again if the memory it read still
// holds what it held: the step is a function of the frame, its rule and
// those words.
// `bp_matters` false: the rbp read is not compared (Segment::rbp_unchecked_mask).
inline bool reads_hold(const Reads& r, const Frame& caller, bool bp_matters = true) {
    return (!r.cfa_at || load(r.cfa_at) == caller.sp) && load(r.ra_at) == caller.ip &&
           (!r.bp_at || !bp_matters || load(r.bp_at) == caller.bp);
}

inline bool link_holds(const CachedFrame& callee, const CachedFrame& caller) {
    return reads_hold(callee.reads, caller.frame);
}

// link_holds of a frame and its caller, as a word to re-read and what it
// must hold: the return address, for most links all they read that the
// walk depends on. A link that reads a second word (an rbp the walk
// depends on) has both checks in the stack cache's slow_links[i] and, in
// the run of checks, one that never holds (stop_check), which stops
// the run there; a link with a CFA word too (a realigned frame, rare) has
// a second check made to fail and is checked with link_holds instead.
// So the run compares one word a link and needs no flag test, and ends
// at checks[0] without a bound. One word and 16 bytes a link, not two and
// 32: the checks are most of what a hit does.
struct LinkCheck {
    uint64_t at;
    uint64_t value;
};

// The checks of a link that are not one word: the first, and the second
// (for a realigned frame, stop_check()).
struct SlowLinkChecks {
    LinkCheck first;
    LinkCheck second;
};

// The check of the link from `callee` to `caller` in the run of checks,
// and in `slow` the link's two checks where it has two.
LinkCheck checks_of(const CachedFrame& callee, const CachedFrame& caller, SlowLinkChecks& slow);

// Rules this cache looked up lately, by address: the few call sites a
// thread allocates from (the recorder's own frames among them) stay on
// lines the walk touches anyway instead of the shared table's.
struct NearRule {
    uint64_t pc;
    FrameRule rule;
};
// 2048: a compiler allocates from thousands of call sites, and a rule
// missed here is a lookup in the shared table.
inline constexpr unsigned kNearBits = 11;

// intern_now() results for recent stacks, by the hash of their reported
// ips, which is kept per frame, so it costs the fresh frames only. An
// entry keeps the token intern_now() set, not the ips: memo_matches()
// compares the stack with it (in the recorder, with the stack's record in
// the stack table). Small entries make a large memo, and each miss is a
// lookup in a table far larger than the caches.
struct Memo {
    uint64_t hash;
    const void* token;
    int count;
    uint32_t key;  // 0: empty
};
inline constexpr unsigned kMemoBits = 11;

// The rules of the first frames of the last few hooks (the few places
// that call malloc), for the walk's first step and the segment tag's:
// there the near rule has mostly been evicted by the program's work since
// the last allocation. Eight: an interpreter takes turns among more than
// four.
inline constexpr int kFirstFrames = 8;
struct alignas(64) FirstFrames {
    uint64_t pcs[kFirstFrames];  // ip of the frame; 0: empty
    FrameRule rules[kFirstFrames];
    uint32_t next;
};
// First frames whose segments are tagged with their caller's ip too
// (keep_segment), by the hash of their ip; others hold something else.
inline constexpr unsigned kByCallerBits = 6;

struct StackCache {
    FirstFrames first_frames;
    uint32_t local_next;  // the counter of the next local key (unwind.h)
    DefinedStack last_defined;
    // `writes` when `last_defined` was last made from this cache's last
    // stack, every frame of it in the ips handed on (not cut at the walk's
    // max): while `writes` has not moved on, the frames a walk keeps of the
    // last stack are the outermost ones of `last_defined`
    // (define_local_key's `known`).
    uint64_t defined_writes;
    uint64_t by_caller[1u << kByCallerBits];
    int count;          // frames of the last stack, outermost first, so a new
                        // stack that shares its outer part rewrites only the top
    int keyed_max;      // max of the walks the memos were made for
    uint32_t last_key;  // the key of the last stack; 0: unknown
    // The last walk with the cache went past kMaxFrames: walks stop at max
    // (a stack deeper than the cache would be walked whole every time)
    // until one ends within max.
    bool deep;
    CachedFrame frames[kMaxFrames];
    uint64_t sps[kMaxFrames];  // frames[i].frame.sp, densely, for the search by sp
    // What the reuse of a stack reads, densely, for the frames an
    // interpreter reuses on every allocation:
    // [i]: link_holds(frames[i], frames[i - 1]), i >= 1; [0]: stop_check(),
    // which ends a run of checks down to the outermost frame without a
    // bound to compare.
    LinkCheck checks[kMaxFrames];
    SlowLinkChecks slow_links[kMaxFrames];   // [i]: the link's checks where checks[i] is a stop check
    uint64_t reversed_ips[kMaxFrames];       // frames[i].frame.ip at kMaxFrames - 1 - i: a run of
                                             // frames innermost first is one memcpy
    uint16_t own_counts[kMaxFrames];         // own frames in frames[0..i]
    uint64_t writes;                         // frames written so far
    uint64_t prefix_generation[kMaxFrames];  // `writes` when one of frames[0..i] was last written
    SegmentBucket segments[1u << kSegmentBucketBits];
    uint32_t next_way;
    // The segment tag prefetch_stack_key worked out for the hook whose
    // frame is `pending_from` and whose caller is at `pending_ip` (null:
    // none). Only a hint of where to look: a segment found is checked in
    // full all the same.
    const void* pending_from;
    uint64_t pending_ip;
    uint64_t pending_tag;
    uint32_t pending_rule;          // the index of pending_ip's rule in first_frames
    CachedFrame fresh[kMaxFrames];  // the new stack above its kept part, innermost first
    NearRule near[1u << kNearBits];
    Memo memos[1u << kMemoBits];
};

inline NearRule& near_rule(StackCache* c, uint64_t pc) { return c->near[mix(0, pc) >> (64 - kNearBits)]; }

// The bucket of segments with `tag`.
inline SegmentBucket& segment_bucket(StackCache* c, uint64_t tag) {
    return c->segments[tag >> (64 - kSegmentBucketBits)];
}

// The rule of the code at `pc`: from the cache's near rules, else the
// shared table (frame_rule), kept in the near rules then.
const FrameRule& rule_for(StackCache* c, uint64_t pc);

// How far the last stack's frames from `top` down still hold: the lowest
// t >= lo with every link from frames[top] down to frames[t] checked
// against memory (LinkCheck, or link_holds for a realigned frame).
int holds_down_to(const StackCache* c, int top, int lo);

// The last stack's frames from `top` down to its outermost one still hold,
// and it ended at the outermost frame (not cut by the depth limit).
bool holds_to_outermost(const StackCache* c, int top);

// The key of the last stack if it starts at `first` and its links hold
// (what a walk would find, without the walk); 0 otherwise.
uint32_t same_stack_key(const StackCache* c, const Frame& first);

// The rule of a hook's first frame, from first_frames (taken in there if
// it was not).
const FrameRule& first_frame_rule(StackCache* c, uint64_t ip);

// Whether prefetch_stack_key's pending_* are for the hook whose frame is
// `from` and whose caller is `first`.
bool pending_for(const StackCache* c, const Frame& first, const void* from);

// first_frame_rule for the hook whose frame is `from`, without the search
// where prefetch_stack_key made it.
const FrameRule& hook_first_rule(StackCache* c, const Frame& first, const void* from);

// ---- the pool -------------------------------------------------------------------

struct Borrowed {
    StackCache* cache;  // null: walk without one
    uint32_t slot;
    bool owned;
};

// A cache for one walk: the one the thread owns, or else a free one near
// its usual slot, which it then owns unless it is past its exit hook.
// Null cache when all tried are busy or there is no memory: the walk then
// looks every rule up.
Borrowed borrow();
// The cache the thread owns, borrowed with plain stores; `owned` false
// when it owns none or is inside a walk already (a signal handler).
Borrowed borrow_owned();
void give_back(const Borrowed& b);

// Whether this walk may hand out `key`: any interned one; a local one
// only from the cache that made it, owned, and fresh.
bool key_usable(const Borrowed& b, uint32_t key);
// The next local key of the cache the thread owns (unwind.h).
uint32_t next_local_key(const Borrowed& b);

}  // namespace heapsnap::recorder::unwinder
