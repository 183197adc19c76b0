// The stack cache's segments (unwind_segments.h): how a hook's stack is
// found among them, and how the frames a walk stepped afresh are kept.
#include "recorder/unwind_segments.h"

#include <algorithm>
#include <cstring>

#include "recorder/unwind_cache.h"

namespace heapsnap::recorder::unwinder {
namespace {

// Segment::rbp_unchecked_mask of the fresh frames of a walk. Their top
// frame's rbp, if handed on, reaches the cached stack below, whose checks
// compare it: never unchecked.
uint32_t rbp_unchecked_mask_of(const CachedFrame* fresh, int count) {
    uint32_t mask = 0;
    bool above_needs = true;  // the caller of frames[i] depends on the rbp it gets
    for (int i = count - 1; i >= 0; --i) {
        const FrameRule& r = fresh[i].rule;
        bool needs = r.kind != FrameRule::Step || uses_bp(r) || (r.rbp_base == FrameRule::Same && above_needs);
        if (!needs) mask |= 1u << i;
        above_needs = needs;
    }
    return mask;
}

// Where StackCache::by_caller may hold `ip`.
uint64_t& by_caller_slot(StackCache* c, uint64_t ip) { return c->by_caller[mix(0, ip) >> (64 - kByCallerBits)]; }

// What a segment keeps of the last stack's frames `join`..0 (Segment::
// outer_ips, base_generation), and whether they are still what it kept:
// the keeping and the check, side by side so they stay one definition.
size_t outer_bytes(int join) { return sizeof(uint64_t) * static_cast<size_t>(std::min(join + 1, kSegmentOuter)); }
const uint64_t* outer_ips_of(const StackCache* c, int join) { return &c->reversed_ips[kMaxFrames - 1 - join]; }
uint64_t base_generation_of(const StackCache* c, int join) {
    return join >= kSegmentOuter ? c->prefix_generation[join - kSegmentOuter] : 0;
}

void keep_outer(const StackCache* c, Segment& sg, int join) {
    sg.base_generation = base_generation_of(c, join);
    memcpy(sg.outer_ips, outer_ips_of(c, join), outer_bytes(join));
}

bool same_outer(const StackCache* c, const Segment& sg, int join) {
    return base_generation_of(c, join) == sg.base_generation &&
           memcmp(sg.outer_ips, outer_ips_of(c, join), outer_bytes(join)) == 0;
}

}  // namespace

// The tag of the segments of the stack that starts at `first`.
uint64_t first_tag(StackCache* c, const Frame& first, const FrameRule& first_rule) {
    // A tag by caller costs a step, which a hit checks again anyway.
    uint64_t caller_ip = 0;
    const FrameRule& rule = walk_rule(first_rule, first, first.sp);  // as the walk saw it
    if (by_caller_slot(c, first.ip) == first.ip && rule.kind == FrameRule::Step) {
        Reads reads;
        caller_ip = step(rule, first, reads).ip;
    }
    return segment_tag(first, caller_ip);
}

// The key of the stack that starts at `first`, if a segment and the last
// stack still hold it; 0 otherwise. The stack is then the one keyed: the
// segment's frames and the last stack's frames 0..join, each link checked
// against memory, and frames 0..join unchanged in the cache since.
// `from`: the hook's frame, for the tag prefetch_stack_key left.
uint32_t segment_key(StackCache* c, const Frame& first, const FrameRule& first_rule, const void* from) {
    uint64_t tag = pending_for(c, first, from) ? c->pending_tag : first_tag(c, first, first_rule);
    c->pending_from = nullptr;
    SegmentBucket& bucket = segment_bucket(c, tag);
    for (unsigned way = 0; way < kSegmentWays; ++way) {
        if (bucket.tags[way] != tag) continue;
        Segment& sg = bucket.ways[way];
        if (!sg.key || !same_segment_frame(sg, 0, first)) continue;
        int join = sg.join;
        if (join >= c->count) continue;
        // The last stack's frame there must be the segment's caller. The
        // link check re-reads its ip (and its bp, if the step reads it);
        // its sp follows from the step, as does its bp when not read, so
        // those must equal what they were when keyed (a frame of another
        // stack, say of a thread gone, can hold the same ip and bp).
        const Frame& at_join = c->frames[join].frame;
        const bool join_bp_needed = c->frames[join].bp_needed;
        const SegmentFrame& last_frame = sg.frames[sg.count - 1];
        if (at_join.sp != sg.join_sp || (!last_frame.bp_at && join_bp_needed && at_join.bp != sg.join_bp)) continue;
        bool holds = true;
        for (int i = 0; holds && i + 1 < sg.count; ++i) {
            const SegmentFrame& caller = sg.frames[i + 1];
            holds = segment_link_holds(sg.frames[i], caller.ip, caller.bp, !(sg.rbp_unchecked_mask >> (i + 1) & 1));
        }
        if (!holds || !segment_link_holds(last_frame, at_join.ip, at_join.bp, join_bp_needed)) continue;
        if (c->prefix_generation[join] != sg.generation) {
            if (!same_outer(c, sg, join)) continue;
            sg.generation = c->prefix_generation[join];  // the same frames, written again
        }
        return holds_to_outermost(c, join) ? sg.key : 0;
    }
    return 0;
}

// Remembers the fresh frames of the walk just made, keyed `key`. A first
// frame with a new path while its bucket holds two of its segments already
// (a wrapper such as xmalloc, called from everywhere at one depth) has its
// segments tagged by caller from then on, spread over the buckets; the
// others are not, which spares their lookups a step.
void keep_segment(StackCache* c, int fresh, int kept, uint32_t key) {
    if (kept < 0 || fresh < 1 || fresh > kSegmentFrames) return;
    for (int i = 0; i < fresh; ++i)
        if (c->fresh[i].reads.cfa_at) return;  // a realigned frame (SegmentFrame)
    const Frame& first = c->fresh[0].frame;
    uint64_t& by_caller_pc = by_caller_slot(c, first.ip);
    bool by_caller = by_caller_pc == first.ip;
    uint64_t caller_ip = 0;
    if (c->fresh[0].rule.kind == FrameRule::Step)
        caller_ip = fresh > 1 ? c->fresh[1].frame.ip : c->frames[kept].frame.ip;
    uint64_t tag = segment_tag(first, by_caller ? caller_ip : 0);
    // A segment on the same path (the frames both have are the same: only
    // its join moved) is replaced; one that parts from it anywhere is
    // another path, kept beside it: two paths that share their first
    // frames and part below them would otherwise evict each other
    // (tests/programs/shared_tops.c).
    auto same_path = [&](const Segment& sg) {
        for (int i = 0; i < fresh && i < sg.count; ++i)
            if (!same_segment_frame(sg, i, c->fresh[i].frame)) return false;
        return true;
    };
    auto find_way = [&](const SegmentBucket& bucket) {
        unsigned way = 0;
        while (way < kSegmentWays && !(bucket.tags[way] == tag && same_path(bucket.ways[way]))) ++way;
        return way;
    };
    SegmentBucket* bucket = &segment_bucket(c, tag);
    unsigned way = find_way(*bucket);
    if (way == kSegmentWays && !by_caller && caller_ip) {
        unsigned same_first = 0;
        for (uint64_t t : bucket->tags) same_first += t == tag;
        if (same_first >= 2) {
            by_caller_pc = first.ip;
            tag = segment_tag(first, caller_ip);
            bucket = &segment_bucket(c, tag);
            way = find_way(*bucket);
        }
    }
    if (way == kSegmentWays) way = c->next_way++ % kSegmentWays;
    Segment& sg = bucket->ways[way];
    bucket->tags[way] = tag;
    sg.count = static_cast<uint8_t>(fresh);
    sg.join = static_cast<uint16_t>(kept);
    sg.generation = c->prefix_generation[kept];
    sg.first_sp = first.sp;
    sg.join_sp = c->frames[kept].frame.sp;
    sg.join_bp = c->frames[kept].frame.bp;
    for (int i = 0; i < fresh; ++i) {
        const CachedFrame& f = c->fresh[i];
        sg.frames[i] = SegmentFrame{f.frame.ip, f.frame.bp, f.reads.ra_at, f.reads.bp_at};
    }
    sg.rbp_unchecked_mask = static_cast<uint8_t>(rbp_unchecked_mask_of(c->fresh, fresh));
    keep_outer(c, sg, kept);
    sg.key = key;
}

}  // namespace heapsnap::recorder::unwinder
