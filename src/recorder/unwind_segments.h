// The stack cache's segments: the frames a walk stepped afresh above the
// last stack, kept by first frame with the key of their whole stack, so
// that a place an interpreter or a compiler allocates from again costs
// its link checks, not a walk (docs/design/stack-capture.md, "Segments").
// The layout (part of StackCache, unwind_cache.h) and the comparisons a
// hit makes are here; the lookup and the keeping are in
// unwind_segments.cpp.
#pragma once

#include <cstdint>

#include "recorder/unwind_step.h"

namespace heapsnap::recorder::unwinder {

struct StackCache;

// The frames walked afresh above the last stack the last time a stack
// started at `first`, and the key of that whole stack. An interpreter
// allocates from a few places in turn, each of which rewrites the top of
// the last stack; a segment lets a place met again skip the steps, the
// rewrite and the memo: its links are checked, then those of the last
// stack from `join` down, and if the last stack's frames 0..join are still
// the ones it joined (their write generation, or else their ips), the
// stack is the one keyed.
// A bucket is chosen by the first frame, and by its caller's ip too for a
// first frame many callers share (keep_segment): a compiler allocates
// through a few wrappers (xmalloc, operator new) from thousands of
// callers, which by the first frame alone would all fall into a few
// buckets of four ways.
inline constexpr int kSegmentFrames = 8;
inline constexpr int kSegmentOuter = 32;
inline constexpr unsigned kSegmentBucketBits = 7;
inline constexpr unsigned kSegmentWays = 4;
// A frame of a segment and the words its step to its caller read: what a
// hit compares, no more. Its sp is not kept but the first frame's
// (Segment::first_sp): each caller's sp follows from the frame below, its
// rule (by the ip the link compares) and the words compared. So a segment
// whose step reads a CFA from memory (a realigned frame, GCC's DRAP: rare)
// is not kept (keep_segment).
struct SegmentFrame {
    uint64_t ip;
    uint64_t bp;
    uint64_t ra_at;  // Reads::ra_at of the step to its caller
    uint64_t bp_at;  // Reads::bp_at of that step; 0: rbp handed on as it is
};
static_assert(kSegmentFrames <= 8 && kMaxFrames <= 65535, "Segment::count, rbp_unchecked_mask and join fit");
// What a lookup reads comes first, from a line's start: the 40 bytes a
// hit compares before the frames, then 32 bytes a frame, so a hit of
// three or four frames (an interpreter's usual) reads the tag line and
// three more.
struct alignas(64) Segment {
    uint32_t key;   // 0: empty
    uint8_t count;  // frames, innermost first; frames[count - 1]'s caller is frames[join] of the last stack
    // Bit i: the walk from frames[i] on does not depend on its rbp (its
    // rule neither uses rbp nor hands it on to a frame that does), so that
    // rbp is not compared: code that keeps data in rbp calls the same
    // places with other values in it.
    uint8_t rbp_unchecked_mask;
    uint16_t join;
    uint64_t generation;  // prefix_generation[join] of the last stack when keyed
    uint64_t first_sp;    // frames[0]'s sp
    // The last stack's frames[join] when keyed, the caller of
    // frames[count - 1]: its sp and rbp (its ip is outer_ips[0]).
    uint64_t join_sp;
    uint64_t join_bp;
    SegmentFrame frames[kSegmentFrames];  // frames[0]: the first frame
    uint64_t base_generation;             // prefix_generation[join - kSegmentOuter] when keyed, for a deeper join
    // The ips of the last stack's frames join..0 when keyed: when those
    // frames were rewritten since, equal ips still mean the same stack.
    // For a join deeper than kSegmentOuter, the ips of frames join down
    // to join - kSegmentOuter + 1 only, and the frames below those must
    // not have been rewritten since (base_generation): a compiler's
    // stacks run deeper than kSegmentOuter, and a recursion rewrites the
    // frames near its top and comes back to the same path
    // (tests/programs/deep_paths.c).
    uint64_t outer_ips[kSegmentOuter];
};
// The tags (a hash of the first frame; 0: empty) on one line, so a lookup
// reads one segment only.
struct SegmentBucket {
    alignas(64) uint64_t tags[kSegmentWays];
    Segment ways[kSegmentWays];
};

// Of the first frame and its caller's ip (0: not tagged by caller),
// without rbp, which may go unchecked (Segment::rbp_unchecked_mask).
inline uint64_t segment_tag(const Frame& first, uint64_t caller_ip) {
    return mix(mix(first.ip, first.sp), caller_ip) | 1;
}

// `f` is the segment's frames[i], but for an rbp the walk does not depend
// on; for i >= 1 given that frames[0..i - 1] are (then its sp, the CFA of
// the step from frames[i - 1], is too).
inline bool same_segment_frame(const Segment& sg, int i, const Frame& f) {
    const SegmentFrame& g = sg.frames[i];
    return g.ip == f.ip && (i || sg.first_sp == f.sp) && (g.bp == f.bp || (sg.rbp_unchecked_mask >> i & 1));
}

// reads_hold for a segment's link from `callee` to a caller with `ip`
// and `bp`: the rbp it reads is compared only if the walk depends on it.
inline bool segment_link_holds(const SegmentFrame& callee, uint64_t ip, uint64_t bp, bool bp_matters) {
    return load(callee.ra_at) == ip && (!callee.bp_at || !bp_matters || load(callee.bp_at) == bp);
}

// The segment tag of the stack that starts at `first` (with `first_rule`,
// its rule by address).
uint64_t first_tag(StackCache* c, const Frame& first, const FrameRule& first_rule);

// The key of the stack that starts at `first`, if a segment and the last
// stack still hold it; 0 otherwise. `from`: the hook's frame, for the tag
// prefetch_stack_key left.
uint32_t segment_key(StackCache* c, const Frame& first, const FrameRule& first_rule, const void* from);

// Remembers the `fresh` frames the walk just made (c->fresh) above the
// last stack's frames 0..kept, keyed `key`.
void keep_segment(StackCache* c, int fresh, int kept, uint32_t key);

}  // namespace heapsnap::recorder::unwinder
