// One step of the stack walk, shared by the unwinder's files (unwind.cpp,
// unwind_cache.cpp, unwind_segments.cpp): a frame, the CFI rule it is
// stepped with (frame_rules.h), and the stack words the step read, which
// the stack cache re-reads to check a link. Inline: every walk steps
// through these once per frame.
#pragma once

#include <cstdint>

#include "recorder/frame_rules.h"
#include "recorder/lifecycle.h"

namespace heapsnap::recorder::unwinder {

// What a step from one frame to its caller needs, and all it produces.
// Its rule is that of ip - 1 (frame_rule).
struct Frame {
    uint64_t ip;  // the return address into the frame's function
    uint64_t sp;  // rsp in this frame: the CFA of its callee
    uint64_t bp;
};

// The memory a step read: where the caller's sp (deref CFA only), ip and
// bp (if saved) came from. 0: not read.
struct Reads {
    uint64_t cfa_at;
    uint64_t ra_at;
    uint64_t bp_at;
};

inline uint64_t load(uint64_t addr) {
    uint64_t v;
    __builtin_memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
    return v;
}

inline Frame step(const FrameRule& r, const Frame& f, Reads& reads) {
    uint64_t cfa = (r.cfa_base == FrameRule::Rsp ? f.sp : f.bp) + static_cast<int64_t>(r.cfa_offset);
    reads.cfa_at = 0;
    if (r.cfa_deref) {
        reads.cfa_at = cfa;
        cfa = load(cfa);
    }
    auto at = [&](FrameRule::Base base, int32_t offset) {
        return (base == FrameRule::Cfa ? cfa : base == FrameRule::Rsp ? f.sp : f.bp) + static_cast<int64_t>(offset);
    };
    reads.ra_at = at(r.ra_base, r.ra_offset);
    uint64_t ip = load(reads.ra_at);
    reads.bp_at = r.rbp_base == FrameRule::Same ? 0 : at(r.rbp_base, r.rbp_offset);
    uint64_t bp = reads.bp_at ? load(reads.bp_at) : f.bp;
    return Frame{ip, cfa, bp};
}

// The frame of the caller of the function whose frame pointer is `fp`. The
// recorder is built with frame pointers, so its own frames have the
// standard layout: saved rbp at fp, return address above it.
inline Frame caller_of(const uint64_t* fp) { return Frame{fp[1], reinterpret_cast<uint64_t>(fp + 2), fp[0]}; }

inline bool uses_bp(const FrameRule& r) {
    return r.cfa_base == FrameRule::Rbp || r.ra_base == FrameRule::Rbp || r.rbp_base == FrameRule::Rbp;
}

// Whether the walk from a frame with rule `r` outward depends on the
// frame's rbp: its step reads through rbp, or hands rbp on unchanged to a
// caller that needs it (`caller_needs`; true where the caller is unknown).
inline bool bp_matters(const FrameRule& r, bool caller_needs) {
    if (r.kind == FrameRule::Outermost) return false;
    // NoInfo (the stack ends there, for its rbp: walk_rule), Unsupported: always.
    if (r.kind != FrameRule::Step) return true;
    return uses_bp(r) || (r.rbp_base == FrameRule::Same && caller_needs);
}

// Whether a walk whose first frame is at `first_sp` may read [from, to)
// beyond what the rules read (unwind.cpp).
bool readable(uint64_t first_sp, uint64_t from, uint64_t to);

// The rule a walk steps `f` with, whose rule by address is `r`. For a
// frame no FDE covers (NoInfo), libunwind's unw_step ends the stack there
// (the frame itself reported) if its rbp is 0, lies below the frame's sp
// or more than 0x4000 above it; otherwise it guesses the caller by the
// frame pointer: CFA = rbp + 16, return address at CFA - 8, rbp at CFA -
// 16, every read checked for a mapped page. The walk does the same: a
// NoInfo frame is the stack's end where libunwind's is, and is stepped
// with kGuessedRule where all that step reads, rbp's 16 bytes, is known to
// be mapped: on the page of the frame's return-address slot below sp
// (f.sp - 8, which the callee's call wrote), or within what is readable
// from the walk's first frame (at `first_sp`). The rest goes to the full
// CFI walk (kFullWalkRule; cfi_walk.h), which checks each read. So JIT
// code without CFI that keeps rbp chains (node's V8) is walked here, not
// handed on stack by stack.
// One difference in kind: libunwind's trace cache decides for an address
// once, the first time its thread meets it, and keeps that decision for
// the frames met there later, whatever their rbp; the walk decides per
// frame (and compares the rbp of a NoInfo frame wherever it meets the
// frame again: bp_matters).
inline constexpr FrameRule kGuessedRule{
    FrameRule::Step, FrameRule::Rbp, false, FrameRule::Cfa, FrameRule::Cfa, 16, -8, -16};
inline constexpr FrameRule kFullWalkRule{
    FrameRule::Unsupported, FrameRule::Rsp, false, FrameRule::Cfa, FrameRule::Same, 0, 0, 0};

inline const FrameRule& walk_rule(const FrameRule& r, const Frame& f, uint64_t first_sp) {
    if (r.kind != FrameRule::NoInfo || f.bp == 0 || f.bp < f.sp || f.bp - f.sp > 0x4000) return r;
    if ((f.bp + 15) >> 12 == (f.sp - 8) >> 12) return kGuessedRule;
    return readable(first_sp, f.sp, f.bp + 16) ? kGuessedRule : kFullWalkRule;
}

// A frame with this rule is the stack's last. A NoInfo frame is walked as
// such only where libunwind ends the stack at it (walk_rule), and its rbp,
// on which that depends, is compared wherever it is met again
// (bp_matters), so one in the cache is the stack's end as well.
inline bool ends_stack(const FrameRule& r) { return r.kind == FrameRule::Outermost || r.kind == FrameRule::NoInfo; }

// The most frames a walk takes: the deepest HEAPSNAP_DEPTH and room for
// the recorder's own frames above the program's.
inline constexpr int kMaxFrames = static_cast<int>(kMaxDepth) + 8;

// The hash step of the cache's tables (near rules, segment tags).
inline uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x9e3779b97f4a7c15ull; }

}  // namespace heapsnap::recorder::unwinder
