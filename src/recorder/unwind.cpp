#include "recorder/unwind.h"

#include <dlfcn.h>
#include <libunwind.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "recorder/frame_rules.h"
#include "recorder/lifecycle.h"
#include "recorder/raw_alloc.h"
#include "recorder/stack_table.h"
#include "recorder/thread_state.h"

namespace heapsnap::recorder {
namespace {

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

uint64_t load(uint64_t addr) {
    uint64_t v;
    __builtin_memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
    return v;
}

Frame step(const FrameRule& r, const Frame& f, Reads& reads) {
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
Frame caller_of(const uint64_t* fp) { return Frame{fp[1], reinterpret_cast<uint64_t>(fp + 2), fp[0]}; }

bool uses_bp(const FrameRule& r) {
    return r.cfa_base == FrameRule::Rbp || r.ra_base == FrameRule::Rbp || r.rbp_base == FrameRule::Rbp;
}

// Whether the walk from a frame with rule `r` outward depends on the
// frame's rbp: its step reads through rbp, or hands rbp on unchanged to a
// caller that needs it (`caller_needs`; true where the caller is unknown).
bool bp_matters(const FrameRule& r, bool caller_needs) {
    if (r.kind == FrameRule::Outermost) return false;
    // NoInfo (the stack ends there, for its rbp: walk_rule), Unsupported: always.
    if (r.kind != FrameRule::Step) return true;
    return uses_bp(r) || (r.rbp_base == FrameRule::Same && caller_needs);
}

// The calling thread's stack (UnwindThread::stack_lo, stack_hi): its top
// (0: unknown) and how far down from it the walk may read (lo == hi: not
// at all). The one record of it, for the frame-pointer walk's bound
// (thread_stack_top) as for readable.
struct ThreadStack {
    uint64_t lo, hi;
};

extern "C" void* __libc_stack_end;  // the main thread's stack top (ld.so)

// The thread's stack, the main thread's found the first time it is asked
// for. An unknown stack is looked for again on every call: a fork child's
// only thread is its main thread.
ThreadStack thread_stack() {
    UnwindThread& m = thread_state().unwind;
    if (!m.stack_hi && getpid() == gettid()) {
        rlimit limit{};
        uint64_t room = 8u << 20;
        if (getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) room = limit.rlim_cur;
        uint64_t hi = reinterpret_cast<uint64_t>(__libc_stack_end);
        m.stack_lo = hi > room ? hi - room : 0;
        m.stack_hi = hi;
    }
    return ThreadStack{m.stack_lo, m.stack_hi};
}

// Whether a walk whose first frame is at `first_sp` may read [from, to)
// unchecked beyond what the rules read: stack memory from that frame up to
// the top of the thread's stack, when the frame lies on it and the
// thread's stack is known:
//   - the main thread's: a stack is one mapping from its lowest frame to
//     its top, and the kernel keeps the stack rlimit below the top free of
//     other mappings, so [lo, hi) is mapped wherever lo is a frame's sp
//     within the rlimit below hi (__libc_stack_end, below argv and the
//     environment);
//   - that of a thread the program started (on a stack glibc made or one
//     it gave): what set_thread_stack was told (hooks.cpp,
//     thread_trampoline).
// Elsewhere (a thread started otherwise, a sigaltstack, a coroutine's
// stack) nothing is.
bool readable(uint64_t first_sp, uint64_t from, uint64_t to) {
    const ThreadStack m = thread_stack();
    return first_sp >= m.lo && first_sp < m.hi && from >= first_sp && to <= m.hi;
}

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
// from the walk's first frame (at `first_sp`). The rest goes to libunwind
// (kLibunwindRule). node's V8 code (JIT code and builtins without CFI,
// rbp chains throughout) sent 22 000 stacks a run there (tools/bench's
// churn.js), a JVM's compiled code (rbp a register like any other) as
// many as it allocated through it.
// One difference in kind: libunwind's trace cache decides for an address
// once, the first time its thread meets it, and keeps that decision for
// the frames met there later, whatever their rbp; the walk decides per
// frame (and compares the rbp of a NoInfo frame wherever it meets the
// frame again: bp_matters).
constexpr FrameRule kGuessedRule{FrameRule::Step, FrameRule::Rbp, false, FrameRule::Cfa, FrameRule::Cfa, 16, -8, -16};
constexpr FrameRule kLibunwindRule{FrameRule::Unsupported, FrameRule::Rsp, false, FrameRule::Cfa, FrameRule::Same, 0, 0, 0};

const FrameRule& walk_rule(const FrameRule& r, const Frame& f, uint64_t first_sp) {
    if (r.kind != FrameRule::NoInfo || f.bp == 0 || f.bp < f.sp || f.bp - f.sp > 0x4000) return r;
    if ((f.bp + 15) >> 12 == (f.sp - 8) >> 12) return kGuessedRule;
    return readable(first_sp, f.sp, f.bp + 16) ? kGuessedRule : kLibunwindRule;
}

// A frame with this rule is the stack's last. A NoInfo frame is walked as
// such only where libunwind ends the stack at it (walk_rule), and its rbp,
// on which that depends, is compared wherever it is met again
// (bp_matters), so one in the cache is the stack's end as well.
bool ends_stack(const FrameRule& r) { return r.kind == FrameRule::Outermost || r.kind == FrameRule::NoInfo; }

// ---- the per-thread stack cache -------------------------------------------------

constexpr int kMaxFrames = static_cast<int>(kMaxDepth) + 8;

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
bool same_as_cached(const CachedFrame& cached, const Frame& f) {
    return cached.frame.sp == f.sp && cached.frame.ip == f.ip && (cached.frame.bp == f.bp || !cached.bp_needed);
}

// The step from `callee` gives `caller` again if the memory it read still
// holds what it held: the step is a function of the frame, its rule and
// those words.
// `bp_matters` false: the rbp read is not compared (Segment::rbp_unchecked_mask).
bool reads_hold(const Reads& r, const Frame& caller, bool bp_matters = true) {
    return (!r.cfa_at || load(r.cfa_at) == caller.sp) && load(r.ra_at) == caller.ip &&
           (!r.bp_at || !bp_matters || load(r.bp_at) == caller.bp);
}

bool link_holds(const CachedFrame& callee, const CachedFrame& caller) { return reads_hold(callee.reads, caller.frame); }

// link_holds of a frame and its caller, as a word to re-read and what it
// must hold: the return address, for most links all they read that the
// walk depends on. A link that reads a second word (an rbp the walk
// depends on) has both checks in the stack cache's slow_links[i] and, in
// the run of checks, one that never holds (stop_check), which stops
// the run there; a link with a CFA word too (a realigned frame, rare) has
// a second check made to fail and is checked with link_holds instead.
// So the run compares one word a link and needs no flag test, and ends
// at checks[0] without a bound: 81 M fewer instructions on the small
// compile (holds_to_outermost 160 M -> 111 M, holds_down_to 107 M -> 75 M
// under cachegrind), 52 M on python3 (`churn.py 100`), 20 M on perl.
// One word and 16 bytes a link, not two and 32: the checks are most of
// what a hit does (a compile checks 23 links an allocation).
struct LinkCheck {
    uint64_t at;
    uint64_t value;
};

// A check that never holds (a function, not a constant: an address is no
// constant expression, and hooks run before the recorder's initializers).
const uint64_t g_stop_word = 0;
LinkCheck stop_check() { return LinkCheck{reinterpret_cast<uint64_t>(&g_stop_word), 1}; }

bool is_stop_check(const LinkCheck& k) { return k.at == reinterpret_cast<uint64_t>(&g_stop_word); }

bool check_fails(const LinkCheck& k) { return load(k.at) != k.value; }

// The checks of a link that are not one word: the first, and the second
// (for a realigned frame, stop_check()).
struct SlowLinkChecks {
    LinkCheck first;
    LinkCheck second;
};

// The check of the link from `callee` to `caller` in the run of checks,
// and in `slow` the link's two checks where it has two.
LinkCheck checks_of(const CachedFrame& callee, const CachedFrame& caller, SlowLinkChecks& slow) {
    const Reads& r = callee.reads;
    if (r.cfa_at) {
        slow = SlowLinkChecks{{r.ra_at, caller.frame.ip}, stop_check()};
        return stop_check();
    }
    if (!r.bp_at || !caller.bp_needed) return LinkCheck{r.ra_at, caller.frame.ip};
    slow = SlowLinkChecks{{r.ra_at, caller.frame.ip}, {r.bp_at, caller.frame.bp}};
    return stop_check();
}

// Rules this cache looked up lately, by address: the few call sites a
// thread allocates from (the recorder's own frames among them) stay on
// lines the walk touches anyway instead of the shared table's.
struct NearRule {
    uint64_t pc;
    FrameRule rule;
};
// python3 allocates from hundreds of call sites, a compiler from
// thousands: with 256 rules the compile's rule misses (the shared table's
// lookups behind them) were 1/10 of the unwinder's samples; 2048 took the
// recorder's share of cc1plus's samples from 19.7 % to 19.0 % (means of
// 4 runs).
constexpr unsigned kNearBits = 11;

// intern_now() results for recent stacks, by the hash of their reported ips,
// which is kept per frame, so it costs the fresh frames only. An entry
// keeps the token intern_now() set, not the ips: memo_matches() compares the stack
// with it (in the recorder, with the stack's record in the stack table).
// Small entries make a large memo: on a compile (cc1plus -O2, 87 000
// stacks of 41 frames on average, 630 000 walks) 32 entries of whole ips
// missed 75 % of the walks, 2048 of these miss 25 %, and each miss is a
// lookup in a table far larger than the caches.
struct Memo {
    uint64_t hash;
    const void* token;
    int count;
    uint32_t key;  // 0: empty
};
constexpr unsigned kMemoBits = 11;

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
// through a few wrappers (xmalloc, operator new: 22 first places on
// cc1plus) from thousands of callers, and with the first frame alone they
// all fell into a few buckets of four ways. 128 buckets keyed so: 410 000
// walks of 1.2 M allocations there instead of 685 000 with 32 buckets
// keyed by the first frame (580 000 with 32 keyed by caller as well).
constexpr int kSegmentFrames = 8;
constexpr int kSegmentOuter = 32;
constexpr unsigned kSegmentBucketBits = 7;
constexpr unsigned kSegmentWays = 4;
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
// three or four frames (python3's usual is three) reads the tag line and
// three more. With whole frames and reads (48 bytes) behind a 56-byte
// head it read four and five, and the capture took longer (TSC medians,
// alternating runs): python3 173 ms against 204 (8 runs) and 182 against
// 238 (10), the small compile 228 against 236 (8), 225 against 234 (12)
// and 210 against 216 (8), perl 38 against 43, clang++ 257 against 256.
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
    uint64_t base_generation;  // prefix_generation[join - kSegmentOuter] when keyed, for a deeper join
    // The ips of the last stack's frames join..0 when keyed: when those
    // frames were rewritten since, equal ips still mean the same stack.
    // For a join deeper than kSegmentOuter, the ips of frames join down
    // to join - kSegmentOuter + 1 only, and the frames below those must
    // not have been rewritten since (base_generation). A compiler's stacks
    // run 40 to 70 frames deep, and a recursion rewrites the frames near
    // its top and comes back to the same path: segments joined deeper
    // than kSegmentOuter, which were not kept before, made 389 000 of
    // clang++'s 486 000 walks. Kept so, clang++ (tools/bench's line)
    // walks 320 000 times instead of 483 000, python3 (churn.py 100)
    // 8 300 instead of 12 800; tests/programs/deep_paths.c shows it.
    uint64_t outer_ips[kSegmentOuter];
};
// The tags (a hash of the first frame; 0: empty) on one line, so a lookup
// reads one segment only.
struct SegmentBucket {
    alignas(64) uint64_t tags[kSegmentWays];
    Segment ways[kSegmentWays];
};

// The rules of the first frames of the last few hooks (the few places
// that call malloc: 22 on a compile), for the walk's first step and the
// segment tag's: there the near rule had mostly been evicted by the
// program's work since the last allocation (12 % of the unwinder's samples
// on a compile sat on that one load). Eight: python3 takes turns among
// more than four.
constexpr int kFirstFrames = 8;
struct alignas(64) FirstFrames {
    uint64_t pcs[kFirstFrames];  // ip of the frame; 0: empty
    FrameRule rules[kFirstFrames];
    uint32_t next;
};
// First frames whose segments are tagged with their caller's ip too
// (keep_segment), by the hash of their ip; others hold something else.
constexpr unsigned kByCallerBits = 6;

struct StackCache {
    FirstFrames first_frames;
    uint32_t local_next;  // the counter of the next local key (unwind.h)
    DefinedStack last_defined;
    // `writes` when `last_defined` was last made from this cache's last stack,
    // every frame of it in the ips handed on (not cut at the walk's max):
    // while `writes` has not moved on, the frames a walk keeps of the last
    // stack are the outermost ones of `last_defined` (define_local_key's `known`).
    uint64_t defined_writes;
    uint64_t by_caller[1u << kByCallerBits];
    int count;  // frames of the last stack, outermost first, so a new
                // stack that shares its outer part rewrites only the top
    int keyed_max;  // max of the walks the memos were made for
    uint32_t last_key;  // the key of the last stack; 0: unknown
    // The last walk with the cache went past kMaxFrames: walks stop at max
    // (a stack deeper than the cache would be walked whole every time)
    // until one ends within max.
    bool deep;
    CachedFrame frames[kMaxFrames];
    uint64_t sps[kMaxFrames];       // frames[i].frame.sp, densely, for the search by sp
    // What the reuse of a stack reads, densely, for the ~12 frames reused
    // on every allocation of an interpreter:
    // [i]: link_holds(frames[i], frames[i - 1]), i >= 1; [0]: stop_check(),
    // which ends a run of checks down to the outermost frame without a
    // bound to compare.
    LinkCheck checks[kMaxFrames];
    SlowLinkChecks slow_links[kMaxFrames];  // [i]: the link's checks where checks[i] is a stop check
    uint64_t reversed_ips[kMaxFrames];      // frames[i].frame.ip at kMaxFrames - 1 - i: a run of
                                            // frames innermost first is one memcpy
    uint16_t own_counts[kMaxFrames];        // own frames in frames[0..i]
    uint64_t writes;                          // frames written so far
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
    uint32_t pending_rule;  // the index of pending_ip's rule in first_frames
    CachedFrame fresh[kMaxFrames];  // the new stack above its kept part, innermost first
    NearRule near[1u << kNearBits];
    Memo memos[1u << kMemoBits];
};

// How far the last stack's frames from `top` down still hold: the lowest
// t >= lo with every link from frames[top] down to frames[t] checked
// against memory (LinkCheck, or link_holds for a realigned frame).
int holds_down_to(const StackCache* c, int top, int lo) {
    if (top <= lo) return top;
    // One link at a time: the words of frames[t - 1]'s link are known to be
    // this stack's only once frames[t]'s link held, both its words (the
    // cache may come from another thread's stack).
    const LinkCheck* k = &c->checks[top];
    const LinkCheck* const end = &c->checks[lo];
    for (;;) {
        if (lo == 0) {
            while (load(k->at) == k->value) --k;  // checks[0] ends it
        } else {
            while (k > end && load(k->at) == k->value) --k;
        }
        if (k <= end) return lo;
        auto t = static_cast<int>(k - c->checks);
        if (!is_stop_check(*k)) return t;
        const SlowLinkChecks& slow = c->slow_links[t];
        bool holds = is_stop_check(slow.second) ? link_holds(c->frames[t], c->frames[t - 1])  // a realigned frame
                                                : !check_fails(slow.first) && !check_fails(slow.second);
        if (!holds) return t;
        --k;
    }
}

// A local key of cache `slot` (its pool slot) that cache may still hand
// out: made within the window (unwind.h).
bool local_key_fresh(const StackCache* c, uint32_t slot, uint32_t key) {
    uint32_t age = (c->local_next - key) & 0xFFFFFF;
    return local_key_cache(key) == slot && age - 1 < kLocalWindow - 1;
}

// Forgets the local keys the cache cannot hand out any more, so that none
// outlives the window by so far that its 24-bit count comes round again
// (a segment of a place rarely met can stay for millions of walks): once
// every kLocalWindow walks, at a change of owner and after a fork.
void drop_stale_local_keys(StackCache* c, uint32_t slot) {
    auto stale = [&](uint32_t key) { return is_local_key(key) && !local_key_fresh(c, slot, key); };
    if (stale(c->last_key)) c->last_key = 0;
    for (SegmentBucket& bucket : c->segments) {
        for (unsigned way = 0; way < kSegmentWays; ++way) {
            if (!stale(bucket.ways[way].key)) continue;
            bucket.ways[way].key = 0;
            bucket.tags[way] = 0;
        }
    }
}

// Moves the cache's key counter on by `walks`, dropping the stale keys at
// every multiple of the window it reaches.
void advance_local_keys(StackCache* c, uint32_t slot, uint32_t walks) {
    while (walks) {
        uint32_t step = std::min(walks, kLocalWindow - (c->local_next & (kLocalWindow - 1)));
        c->local_next += step;
        walks -= step;
        if ((c->local_next & (kLocalWindow - 1)) == 0) drop_stale_local_keys(c, slot);
    }
}

// A cache's keys and definitions were another ring's (a new owner, a fork
// child): none of them is handed out again, and the next stack handed on
// is carried whole.
void forget_local_keys(StackCache* c, uint32_t slot) {
    c->local_next += kLocalWindow;
    c->last_defined.n = 0;
    drop_stale_local_keys(c, slot);
}

// A slot is either shared, borrowed for one walk with an atomic exchange
// of `busy`, or owned by one thread, which keeps `busy` set for as long as
// it lives and borrows with plain stores to `owner_walking`: a locked
// instruction per allocation waits for every store before it (the ring
// slot just written, often a cache miss) and cost about 5% of python3's
// time. Only the owner and its signal handlers touch owner_walking; a
// handler that finds it set borrows a shared slot instead.
//
// The pool is constinit: hooks run before the recorder's own initializers
// (a library initialized earlier, libstdc++ itself, allocates), so a
// dynamic initializer would reset a slot already owned. One did while
// owner_walking had no initializer: it set cache back to null under the
// thread that owned slot 0, which then walked without its cache, left
// owner_walking set and borrowed slot 0 as a shared one for the rest of
// the run, interning every stack in its own thread (clang++, whose
// libLLVM and libstdc++ allocate from their constructors, ran that way).
struct alignas(64) PoolSlot {
    std::atomic<bool> busy{false};
    bool owner_walking = false;
    std::atomic<StackCache*> cache{nullptr};
};

constexpr uint32_t kPoolSlots = kStackCaches;
// Free caches kept mapped for threads to come; a thread that exits past
// that many unmaps its own.
constexpr uint32_t kSpareCaches = 8;
constinit PoolSlot g_pool[kPoolSlots];
std::atomic<uint32_t> g_next_slot{0};

struct Borrowed {
    StackCache* cache;  // null: walk without one
    uint32_t slot;
    bool owned;
};

StackCache* cache_of(PoolSlot& s) {
    StackCache* c = s.cache.load(std::memory_order_relaxed);
    if (!c) {
        c = static_cast<StackCache*>(raw_map_populated(sizeof(StackCache)));
        if (c) c->checks[0] = stop_check();
        s.cache.store(c, std::memory_order_relaxed);
    }
    return c;
}

// The cache the thread owns, borrowed with plain stores; `owned` false
// when it owns none or is inside a walk already (a signal handler).
// In a hook (hook_state), or on a thread whose state is zero: a read only.
Borrowed borrow_owned() {
    if (uint32_t owned = hook_state().unwind.owned) {
        PoolSlot& s = g_pool[owned - 1];
        if (!s.owner_walking) {
            s.owner_walking = true;
            std::atomic_signal_fence(std::memory_order_seq_cst);
            return Borrowed{s.cache.load(std::memory_order_relaxed), owned - 1, true};
        }
    }
    return Borrowed{nullptr, 0, false};
}

// Makes slot i, whose busy flag the caller just took, the calling
// thread's own.
Borrowed make_owned(StackCache* c, uint32_t i) {
    g_pool[i].owner_walking = true;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    forget_local_keys(c, i);
    thread_state().unwind.owned = i + 1;
    return Borrowed{c, i, true};
}

// A thread's first walk: the lowest free slot whose cache is mapped, else
// the lowest free one, becomes its own. So threads that come and go reuse
// the caches of those gone, and no more are mapped than threads record at
// once, plus the spares release_stack_cache keeps. Null cache when every
// slot is busy or there is no memory.
Borrowed take_lowest_free() {
    for (bool mapped_only : {true, false}) {
        for (uint32_t i = 0; i < kPoolSlots; ++i) {
            PoolSlot& s = g_pool[i];
            if (mapped_only && !s.cache.load(std::memory_order_relaxed)) continue;
            if (s.busy.load(std::memory_order_relaxed) || s.busy.exchange(true, std::memory_order_acquire)) continue;
            StackCache* c = cache_of(s);
            if (!c) {
                s.busy.store(false, std::memory_order_release);
                return Borrowed{nullptr, 0, false};
            }
            thread_state().unwind.slot = i + 1;
            return make_owned(c, i);
        }
    }
    return Borrowed{nullptr, 0, false};
}

// Borrows a cache for one walk: the one the thread owns, or else a free
// one near its usual slot, which it then owns unless it is past its exit
// hook (it would never give it back).
// Null cache when all tried are busy or there is no memory: the walk then
// looks every rule up. Any thread may use any cache: what it holds is
// checked against memory before use, never trusted.
Borrowed borrow() {
    if (Borrowed b = borrow_owned(); b.owned) return b;
    UnwindThread& u = thread_state().unwind;
    const bool may_own = !u.owned && !u.released;
    if (!u.slot && may_own)
        if (Borrowed b = take_lowest_free(); b.cache) return b;
    if (!u.slot) u.slot = 1 + g_next_slot.fetch_add(1, std::memory_order_relaxed) % kPoolSlots;
    for (uint32_t tries = 0; tries < 4; ++tries) {
        uint32_t i = (u.slot - 1 + tries) % kPoolSlots;
        PoolSlot& s = g_pool[i];
        // One walk is not worth mapping a cache for (an exiting thread
        // may just have unmapped this one).
        if (!may_own && !s.cache.load(std::memory_order_relaxed)) continue;
        if (s.busy.load(std::memory_order_relaxed) || s.busy.exchange(true, std::memory_order_acquire)) continue;
        StackCache* c = cache_of(s);
        if (!c) {
            s.busy.store(false, std::memory_order_release);
            return Borrowed{nullptr, 0, false};
        }
        u.slot = i + 1;
        if (may_own) return make_owned(c, i);
        // A handler that leaves this walk by siglongjmp gives it back
        // (abandon_stack_walk).
        u.borrowed = i + 1;
        return Borrowed{c, i, false};
    }
    return Borrowed{nullptr, 0, false};
}

__attribute__((noinline)) void give_back_borrowed(uint32_t slot) {
    thread_state().unwind.borrowed = 0;
    g_pool[slot].busy.store(false, std::memory_order_release);
}

void give_back(const Borrowed& b) {
    if (!b.cache) return;
    if (b.owned) {
        std::atomic_signal_fence(std::memory_order_seq_cst);
        g_pool[b.slot].owner_walking = false;
    } else {
        give_back_borrowed(b.slot);
    }
}

// Whether this walk may hand out `key`: any interned one; a local one
// only from the cache that made it, owned, and fresh.
bool key_usable(const Borrowed& b, uint32_t key) {
    return !is_local_key(key) || (b.owned && local_key_fresh(b.cache, b.slot, key));
}

uint32_t next_local_key(const Borrowed& b) {
    StackCache* c = b.cache;
    if ((c->local_next & 0xFFFFFF) == 0xFFFFFF) advance_local_keys(c, b.slot, 1);
    uint32_t key = kLocalKey | b.slot << 24 | (c->local_next & 0xFFFFFF);
    advance_local_keys(c, b.slot, 1);
    return key;
}

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x9e3779b97f4a7c15ull; }

NearRule& near_rule(StackCache* c, uint64_t pc) { return c->near[mix(0, pc) >> (64 - kNearBits)]; }

const FrameRule& rule_for(StackCache* c, uint64_t pc) {
    if (!c) return *frame_rule(pc);
    NearRule& near = near_rule(c, pc);
    if (near.pc != pc) near = NearRule{pc, *frame_rule(pc)};
    return near.rule;
}

// ---- the unwinder's own frames ---------------------------------------------------

// The module this unwinder is linked into (the recorder) is never
// reported: its hooks at the top of every stack, and the pthread_create
// hook in the middle of a stack allocated under it.
std::atomic<uint64_t> g_own_start{0};
std::atomic<uint64_t> g_own_end{0};

void find_own_module() {
    dl_find_object found;
    if (_dl_find_object(reinterpret_cast<void*>(&find_own_module), &found) != 0) return;
    g_own_end.store(reinterpret_cast<uint64_t>(found.dlfo_map_end), std::memory_order_relaxed);
    g_own_start.store(reinterpret_cast<uint64_t>(found.dlfo_map_start), std::memory_order_release);
}

struct OwnRange {
    uint64_t start;
    uint64_t end;
    bool holds(uint64_t ip) const { return ip >= start && ip < end; }
};

OwnRange own_range() {
    uint64_t start = g_own_start.load(std::memory_order_acquire);
    if (!start) {
        find_own_module();
        start = g_own_start.load(std::memory_order_acquire);
    }
    return OwnRange{start, g_own_end.load(std::memory_order_relaxed)};
}

// ---- walking ---------------------------------------------------------------------

// A stack with a frame our rules do not cover, without our own frames.
__attribute__((noinline)) int libunwind_stack(uint64_t* ips, int max, OwnRange own) {
    void* all[kMaxFrames];
    int n = unw_backtrace(all, max);
    int count = 0;
    for (int i = 0; i < n; ++i)
        if (!own.holds(reinterpret_cast<uint64_t>(all[i]))) ips[count++] = reinterpret_cast<uint64_t>(all[i]);
    return count;
}

struct Walked {
    int count;       // frames in ips
    bool cached;     // the stack is now the cache's last one
    bool unchanged;  // ... and it was the last one before, frame for frame
    uint64_t hash;   // if cached: stack_hash of the whole stack walked
    int fresh = 0;   // if cached: frames walked afresh (the cache's fresh[]) above ...
    int kept = -1;   // ... the last stack's frames 0..kept, reused
    bool stopped_at_limit = false;  // the walk stopped at its limit, not at the stack's end
    bool ran_past_ips = false;      // it went on past the `max` frames ips holds
};

// Walks from `f`: at most max frames, our own ones included; the others
// go to ips. Our frames at the top are followed by frame pointer and left
// out of the cache, so the cached stack starts with the program's frame,
// whatever depth the program called from.
//
// With a cache, the walk may go on past max, up to `limit` frames, for the
// cache alone: a stack kept down to its outermost frame can be reused and
// rejoined, one cut at max cannot (its outermost cached frame is not the
// stack's end, so no reuse can prove the rest). ips still gets the first
// max frames only. A compiler's stacks run deeper than the recorder's
// default limit (64 frames) now and then: walked only to the limit, each
// allocation there stepped or copied all of its frames again, half the
// frames the unwinder handled on a compile (cc1plus -O2 of checkpoint.cpp:
// 5.3 M frames stepped or copied afresh, 3.0 M walked on to the end).
//
// With a cache: as soon as a frame equals one of the last stack (same sp,
// ip, bp and lookup address), the last stack's frames from there are
// reused for as long as their links hold (link_holds), which costs one or
// two compared words per frame instead of a rule lookup and a step. A
// broken link is stepped afresh and the walk goes on, matching again
// further out (a leaf called from a different caller rejoins the old stack
// one frame further up). A frame no rule covers sends the whole stack to
// libunwind.
Walked walk(Frame f, uint64_t* ips, int max, StackCache* c, void (*prefetch_intern)(uint64_t hash) = nullptr,
            int limit = 0, const FrameRule* first_rule = nullptr) {
    const uint64_t first_ip = f.ip;  // first_rule, if given, is its rule
    if (max > kMaxFrames) max = kMaxFrames;
    if (!c || limit < max) limit = max;
    if (limit > kMaxFrames) limit = kMaxFrames;
    const OwnRange own = own_range();
    int walked = 0;
    bool stopped_at_limit = true;
    // Our frames at the top (the hook and the calls down to here) keep
    // frame pointers (meson.build), so each caller is one load away: no
    // rule lookup for frames that are never reported.
    for (; walked < max && own.holds(f.ip); ++walked) f = caller_of(reinterpret_cast<const uint64_t*>(f.bp));
    const uint64_t first_sp = f.sp;
    CachedFrame* last = c ? c->frames : nullptr;
    CachedFrame* fresh = c ? c->fresh : nullptr;
    int last_count = c ? c->count : 0;
    int n = 0;
    int nf = 0;     // fresh frames
    int kept = -1;  // last[0..kept] stays: the new stack's outer part
    int j = last_count - 1;  // the last stack's frame at or above f.sp
    while (walked < limit) {
        while (j >= 0 && c->sps[j] < f.sp) --j;
        if (j >= 0 && c->sps[j] == f.sp && same_as_cached(last[j], f)) {
            // last[j] and its callers down to last[t] are reused: as many
            // as hold and the limit allows; those within max go to ips.
            int lo = j + 1 - (limit - walked);
            if (lo < 0) lo = 0;
            int t = holds_down_to(c, j, lo);
            int to_ips = std::min(j - t + 1, std::max(max - walked, 0));
            int b = j + 1 - to_ips;  // last[j..b] go to ips
            if (to_ips && c->own_counts[j] == (b ? c->own_counts[b - 1] : 0)) {
                memcpy(ips + n, &c->reversed_ips[kMaxFrames - 1 - j], sizeof(uint64_t) * static_cast<size_t>(to_ips));
                n += to_ips;
            } else {
                for (int i = j; i >= b; --i)
                    if (!last[i].is_own) ips[n++] = last[i].frame.ip;
            }
            walked += j - t + 1;
            if (t == 0 && ends_stack(last[0].rule)) {
                kept = j;
                stopped_at_limit = false;
                break;
            }
            // Cut by the limit, or a link broke, or the old stack ended
            // where memory may have changed since: what was reused becomes
            // part of the fresh frames, and the walk goes on.
            // Their rbps are taken again where the cache may hold another
            // (not compared where the walk did not depend on them): with
            // another caller below, it may.
            uint64_t bp = f.bp;
            for (int i = j; i >= t; --i) {
                CachedFrame& copy = fresh[nf++];
                copy = last[i];
                copy.frame.bp = bp;
                if (i > t && copy.reads.bp_at) bp = load(copy.reads.bp_at);
            }
            if (walked == limit) break;
            CachedFrame& from = fresh[nf - 1];
            f = step(from.rule, from.frame, from.reads);
            j = t - 1;
            if (f.ip < 0x4000) {  // where libunwind stops, too
                stopped_at_limit = false;
                break;
            }
            continue;
        }
        const FrameRule& rule =
            walk_rule(first_rule && f.ip == first_ip ? *first_rule : rule_for(c, f.ip - 1), f, first_sp);
        if (rule.kind == FrameRule::Unsupported) {
            if (walked >= max) break;  // past what ips holds: the cache keeps the stack cut here
            return Walked{libunwind_stack(ips, max, own), false, false, 0};
        }
        bool is_own = own.holds(f.ip);
        ++walked;
        if (!is_own && walked <= max) ips[n++] = f.ip;
        Frame caller = f;
        if (fresh) {
            CachedFrame& into = fresh[nf++];
            into.frame = f;
            into.rule = rule;
            into.is_own = is_own;
            if (rule.kind == FrameRule::Step)
                caller = step(rule, f, into.reads);
            else
                into.reads = Reads{};
        } else if (rule.kind == FrameRule::Step) {
            Reads reads;
            caller = step(rule, f, reads);
        }
        if (ends_stack(rule)) {
            stopped_at_limit = false;
            break;
        }
        f = caller;
        if (f.ip < 0x4000) {
            stopped_at_limit = false;
            break;
        }
        // Its rule's line, while the search below runs: a compiler's own
        // work evicts the near rules between two allocations.
        if (c) __builtin_prefetch(&near_rule(c, f.ip - 1));
    }
    const bool ran_past_ips = walked > max;
    if (!c) return Walked{n, false, false, 0, 0, -1, stopped_at_limit, ran_past_ips};
    // The fresh frames go above the kept ones. Those equal to what is
    // there already (a link broke further up, the same frames came back)
    // are left as they are: on equal frames below, their steps and hashes
    // are equal too.
    // The fresh frames' hashes, before the cache is brought up to date, so
    // the key's lookup can start meanwhile (StackKeyer::prefetch_intern).
    uint64_t hash = kept >= 0 ? last[kept].hash : 0;
    for (int i = nf - 1; i >= 0; --i) {
        if (!fresh[i].is_own) hash = stack_hash_step(hash, fresh[i].frame.ip);
        fresh[i].hash = hash;
    }
    if (prefetch_intern && !ran_past_ips) prefetch_intern(hash);
    // The memo's line, read once the cache is up to date; not where the
    // stack is handed on (no prefetch_intern then), which reads no memo.
    if (prefetch_intern) __builtin_prefetch(&c->memos[hash >> (64 - kMemoBits)]);
    bool same = true;
    for (int i = 0; i < nf; ++i) {
        int at = kept + 1 + i;
        const CachedFrame& frame = fresh[nf - 1 - i];
        same = same && at < last_count && same_as_cached(last[at], frame.frame);
        if (same) continue;
        last[at] = frame;
        last[at].bp_needed = bp_matters(frame.rule, at ? last[at - 1].bp_needed : true);
        c->sps[at] = frame.frame.sp;
        c->reversed_ips[kMaxFrames - 1 - at] = frame.frame.ip;
        c->own_counts[at] = static_cast<uint16_t>((at ? c->own_counts[at - 1] : 0) + frame.is_own);
        if (at) c->checks[at] = checks_of(frame, last[at - 1], c->slow_links[at]);
        c->prefix_generation[at] = ++c->writes;
    }
    bool unchanged = same && kept + 1 + nf == last_count;
    c->count = kept + 1 + nf;
    return Walked{n, true, unchanged, c->count ? last[c->count - 1].hash : 0, nf, kept, stopped_at_limit, ran_past_ips};
}

// Of the first frame and its caller's ip (0: not tagged by caller),
// without rbp, which may be free (Segment::rbp_unchecked_mask).
uint64_t segment_tag(const Frame& first, uint64_t caller_ip) { return mix(mix(first.ip, first.sp), caller_ip) | 1; }

// Segment::rbp_unchecked_mask of the fresh frames of a walk. Their top frame's rbp,
// if handed on, reaches the cached stack below, whose checks compare it:
// never free.
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

// `f` is the segment's frames[i], but for an rbp the walk does not depend
// on; for i >= 1 given that frames[0..i - 1] are (then its sp, the CFA of
// the step from frames[i - 1], is too).
bool same_segment_frame(const Segment& sg, int i, const Frame& f) {
    const SegmentFrame& g = sg.frames[i];
    return g.ip == f.ip && (i || sg.first_sp == f.sp) && (g.bp == f.bp || (sg.rbp_unchecked_mask >> i & 1));
}

// reads_hold for a segment's link from `callee` to a caller with `ip`
// and `bp`: the rbp it reads is compared only if the walk depends on it.
bool segment_link_holds(const SegmentFrame& callee, uint64_t ip, uint64_t bp, bool bp_matters) {
    return load(callee.ra_at) == ip && (!callee.bp_at || !bp_matters || load(callee.bp_at) == bp);
}

SegmentBucket& segment_bucket(StackCache* c, uint64_t tag) { return c->segments[tag >> (64 - kSegmentBucketBits)]; }

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

// The last stack's frames from `top` down to its outermost one still hold,
// and it ended at the outermost frame (not cut by the depth limit).
bool holds_to_outermost(const StackCache* c, int top) {
    return ends_stack(c->frames[0].rule) && holds_down_to(c, top, 0) == 0;
}

// The key of the last stack if it starts at `first` and its links hold
// (what a walk would find, without the walk); 0 otherwise. A last stack
// cut at the walk's limit (StackCache::deep) holds every frame its key was
// made of, so its links down to the cut are enough: a loop allocating at
// the bottom of a recursion deeper than the cache costs no walk.
uint32_t same_stack_key(const StackCache* c, const Frame& first) {
    int top = c->count - 1;
    // The dense ip first: other places fail there.
    if (top < 0 || c->reversed_ips[kMaxFrames - 1 - top] != first.ip || !c->last_key) return 0;
    if (!same_as_cached(c->frames[top], first)) return 0;
    if (c->deep ? holds_down_to(c, top, 0) != 0 : !holds_to_outermost(c, top)) return 0;
    return c->last_key;
}

// The rule of a hook's first frame, from first_frames (taken in there if
// it was not).
const FrameRule& first_frame_rule(StackCache* c, uint64_t ip) {
    FirstFrames& ff = c->first_frames;
    for (int i = 0; i < kFirstFrames; ++i)
        if (ff.pcs[i] == ip) return ff.rules[i];
    uint32_t i = ff.next++ % kFirstFrames;
    ff.rules[i] = rule_for(c, ip - 1);
    ff.pcs[i] = ip;
    return ff.rules[i];
}

// Whether prefetch_stack_key's pending_* are for the hook whose frame is
// `from` and whose caller is `first`.
bool pending_for(const StackCache* c, const Frame& first, const void* from) {
    return c->pending_from == from && c->pending_ip == first.ip;
}

// first_frame_rule for the hook whose frame is `from`: where
// prefetch_stack_key looked it up for that hook, and no other walk took
// another rule in there since (a signal handler's), without the search.
const FrameRule& hook_first_rule(StackCache* c, const Frame& first, const void* from) {
    FirstFrames& ff = c->first_frames;
    uint32_t i = c->pending_rule;
    if (pending_for(c, first, from) && i < kFirstFrames && ff.pcs[i] == first.ip)
        return ff.rules[i];
    return first_frame_rule(c, first.ip);
}

// Where StackCache::by_caller may hold `ip`.
uint64_t& by_caller_slot(StackCache* c, uint64_t ip) { return c->by_caller[mix(0, ip) >> (64 - kByCallerBits)]; }

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
// others are not, which spares their lookups a step (python3 spent ~10 %
// more recording with every tag by caller).
void keep_segment(StackCache* c, const Walked& w, uint32_t key) {
    if (w.kept < 0 || w.fresh < 1 || w.fresh > kSegmentFrames) return;
    for (int i = 0; i < w.fresh; ++i)
        if (c->fresh[i].reads.cfa_at) return;  // a realigned frame (SegmentFrame)
    const Frame& first = c->fresh[0].frame;
    uint64_t& by_caller_pc = by_caller_slot(c, first.ip);
    bool by_caller = by_caller_pc == first.ip;
    uint64_t caller_ip = 0;
    if (c->fresh[0].rule.kind == FrameRule::Step) caller_ip = w.fresh > 1 ? c->fresh[1].frame.ip : c->frames[w.kept].frame.ip;
    uint64_t tag = segment_tag(first, by_caller ? caller_ip : 0);
    // A segment on the same path (the frames both have are the same: only
    // its join moved) is replaced; one that parts from it anywhere is
    // another path, kept beside it. Replacing every segment that started
    // with the same three frames made two paths that part below those
    // evict each other: bash, looping over an associative array, reaches
    // xmalloc through such pairs and walked for 1.41 M of its 4.2 M
    // allocations; kept side by side, 161 000 (the small compile 368 000
    // -> 333 000, python3 32 000 -> 25 000; tests/programs/shared_tops.c).
    auto same_path = [&](const Segment& sg) {
        for (int i = 0; i < w.fresh && i < sg.count; ++i)
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
    sg.count = static_cast<uint8_t>(w.fresh);
    sg.join = static_cast<uint16_t>(w.kept);
    sg.generation = c->prefix_generation[w.kept];
    sg.first_sp = first.sp;
    sg.join_sp = c->frames[w.kept].frame.sp;
    sg.join_bp = c->frames[w.kept].frame.bp;
    for (int i = 0; i < w.fresh; ++i) {
        const CachedFrame& f = c->fresh[i];
        sg.frames[i] = SegmentFrame{f.frame.ip, f.frame.bp, f.reads.ra_at, f.reads.bp_at};
    }
    sg.rbp_unchecked_mask = static_cast<uint8_t>(rbp_unchecked_mask_of(c->fresh, w.fresh));
    keep_outer(c, sg, w.kept);
    sg.key = key;
}

}  // namespace

// Every read stays between this frame and `top`, so a garbage frame pointer
// ends the walk instead of faulting.
__attribute__((noinline)) int walk_frame_pointers(uint64_t* ips, int max, uint64_t top) {
    const OwnRange own = own_range();
    auto* fp = static_cast<const uint64_t*>(__builtin_frame_address(0));
    auto lo = reinterpret_cast<uint64_t>(fp);
    int n = 0;
    for (int walked = 0; walked < max; ++walked) {
        auto at = reinterpret_cast<uint64_t>(fp);
        if (at < lo || at + 16 > top || (at & 7)) break;
        uint64_t ret = fp[1];
        auto* next = reinterpret_cast<const uint64_t*>(fp[0]);
        if (!ret) break;
        if (!own.holds(ret)) ips[n++] = ret;
        if (reinterpret_cast<uint64_t>(next) <= at) break;
        fp = next;
    }
    return n;
}

__attribute__((noinline)) int unwind_stack(uint64_t* ips, int max) {
    Borrowed b = borrow();
    Walked w = walk(caller_of(static_cast<const uint64_t*>(__builtin_frame_address(0))), ips, max, b.cache);
    if (b.cache) b.cache->last_key = 0;  // the cache may hold another stack now
    give_back(b);
    return w.count;
}

__attribute__((noinline)) uint32_t unwind_stack_key(uint64_t* ips, int max, const StackKeyer& keyer,
                                                    const void* from) {
    Borrowed b = borrow();
    StackCache* c = b.cache;
    const bool from_hook = from != nullptr;
    if (!from) from = __builtin_frame_address(0);
    const Frame first = caller_of(static_cast<const uint64_t*>(from));
    if (c && c->keyed_max != max) {  // the keys depend on it
        memset(c->memos, 0, sizeof c->memos);
        for (SegmentBucket& bucket : c->segments)
            for (uint64_t& tag : bucket.tags) tag = 0;
        c->last_key = 0;
        c->keyed_max = max;
    }
    // The last stack again (a loop allocating at one place), or a place
    // allocated from lately: its key without a walk. (From a hook only:
    // `first` is then the program's frame.)
    const FrameRule* first_rule = nullptr;
    if (c && from_hook) {
        first_rule = &hook_first_rule(c, first, from);
        uint32_t k = same_stack_key(c, first);
        if (!k) k = segment_key(c, first, *first_rule, from);
        if (k && key_usable(b, k)) {
            give_back(b);  // the last stack and its key stay as they were
            return k;
        }
    }
    // Stacks this walk hands on (keyer.define_local_key) are not looked up here.
    const bool local = b.owned && keyer.define_local_key;
    const uint64_t writes_before = c ? c->writes : 0;
    Walked w = walk(first, ips, max, c, local ? nullptr : keyer.prefetch_intern, c && !c->deep ? kMaxFrames : max,
                    first_rule);
    if (c) c->deep = w.stopped_at_limit;
    const void* token = nullptr;
    if (!w.cached) {
        if (c) c->last_key = 0;
        give_back(b);
        return keyer.intern_now(ips, w.count, stack_hash(ips, static_cast<uint32_t>(w.count)), &token);
    }
    // The same stack as last time (a loop allocating at one place): its key
    // without hashing or comparing ips.
    if (w.unchanged && c->last_key && key_usable(b, c->last_key)) {
        uint32_t k = c->last_key;
        give_back(b);
        return k;
    }
    // The memo goes by the whole stack walked; intern_now() gets the hash of the
    // frames in ips.
    Memo* m = keyer.memo_matches && !local ? &c->memos[w.hash >> (64 - kMemoBits)] : nullptr;
    uint32_t k = 0;
    if (m && m->key && m->hash == w.hash && m->count == w.count && keyer.memo_matches(m->token, ips, w.count)) {
        k = m->key;
    } else {
        uint64_t hash = w.ran_past_ips ? stack_hash(ips, static_cast<uint32_t>(w.count)) : w.hash;
        if (local) {
            uint32_t key = next_local_key(b);
            // A compile's stack shares ~35 of its 41 frames with the one
            // before: comparing them cost a seventh of a walk's instructions.
            bool known_kept = c->defined_writes == writes_before && !w.ran_past_ips && w.kept >= 0;
            uint32_t known = known_kept ? static_cast<uint32_t>(w.kept + 1 - c->own_counts[w.kept]) : 0;
            bool handed = keyer.define_local_key(ips, w.count, hash, key, known, c->last_defined);
            c->defined_writes = handed && !w.ran_past_ips ? c->writes : 0;
            if (handed) k = key;
        }
        if (!k) k = keyer.intern_now(ips, w.count, hash, &token);
        if (m) *m = Memo{w.hash, token, w.count, k};
    }
    c->last_key = k;
    if (from_hook) keep_segment(c, w, k);
    give_back(b);
    return k;
}

void prefetch_stack_key(const void* from) {
    Borrowed b = borrow_owned();
    if (StackCache* c = b.cache) {
        const Frame first = caller_of(static_cast<const uint64_t*>(from));
        const FrameRule& rule = first_frame_rule(c, first.ip);
        c->pending_rule = static_cast<uint32_t>(&rule - c->first_frames.rules);
        c->pending_tag = first_tag(c, first, rule);
        c->pending_ip = first.ip;
        c->pending_from = from;
        const SegmentBucket& bucket = segment_bucket(c, c->pending_tag);
        __builtin_prefetch(&bucket.tags);
        for (const Segment& sg : bucket.ways) __builtin_prefetch(&sg);
    }
    give_back(b);
}

__attribute__((noinline)) int libunwind_program_stack(uint64_t* ips, int max) {
    // Room for the recorder's frames above the program's.
    constexpr int kOwnRoom = 32;
    if (max > kMaxFrames) max = kMaxFrames;
    const OwnRange own = own_range();
    void* all[kMaxFrames + kOwnRoom];
    int n = unw_backtrace(all, max + kOwnRoom);
    int count = 0;
    for (int i = 0; i < n && count < max; ++i)
        if (!own.holds(reinterpret_cast<uint64_t>(all[i]))) ips[count++] = reinterpret_cast<uint64_t>(all[i]);
    return count;
}

void skip_local_keys(uint32_t walks) {
    uint32_t owned = thread_state().unwind.owned;
    if (!owned) return;
    if (StackCache* c = g_pool[owned - 1].cache.load(std::memory_order_relaxed)) advance_local_keys(c, owned - 1, walks);
}

void set_thread_stack(uint64_t lo, uint64_t hi) {
    UnwindThread& u = thread_state().unwind;
    u.stack_lo = lo;
    u.stack_hi = hi;
}

uint64_t thread_stack_top() { return thread_stack().hi; }

void release_stack_cache() {
    UnwindThread& u = thread_state().unwind;
    u.released = true;
    if (!u.owned) return;
    PoolSlot& s = g_pool[u.owned - 1];
    u.owned = 0;
    s.owner_walking = false;
    uint32_t spares = 0;
    for (const PoolSlot& other : g_pool)
        spares += !other.busy.load(std::memory_order_relaxed) && other.cache.load(std::memory_order_relaxed);
    if (spares >= kSpareCaches) {
        // Still busy: no other thread takes the slot until its cache is
        // gone; the next to take it maps a fresh one.
        StackCache* c = s.cache.load(std::memory_order_relaxed);
        s.cache.store(nullptr, std::memory_order_relaxed);
        raw_unmap(c, sizeof(StackCache));
    }
    s.busy.store(false, std::memory_order_release);
}

namespace {

// Everything a walk may have left half-updated goes; the key counter
// moves on past every key the cache handed out.
void clear_cache(StackCache* c) {
    uint32_t next = c->local_next;
    std::memset(static_cast<void*>(c), 0, sizeof *c);
    c->checks[0] = stop_check();
    c->local_next = next + kLocalWindow;
}

}  // namespace

void abandon_stack_walk() {
    UnwindThread& u = thread_state().unwind;
    if (u.owned) {
        PoolSlot& s = g_pool[u.owned - 1];
        if (s.owner_walking) {
            if (StackCache* c = s.cache.load(std::memory_order_relaxed)) clear_cache(c);
            std::atomic_signal_fence(std::memory_order_seq_cst);
            s.owner_walking = false;
        }
    }
    if (u.borrowed) {
        PoolSlot& s = g_pool[u.borrowed - 1];
        u.borrowed = 0;
        if (StackCache* c = s.cache.load(std::memory_order_relaxed)) clear_cache(c);
        s.busy.store(false, std::memory_order_release);
    }
}

void reset_stack_caches_after_fork() {
    // The child's log defines none of the local keys the thread's cache
    // holds (the parent's ring had their StackDefs).
    const uint32_t owned = thread_state().unwind.owned;
    if (owned)
        if (StackCache* c = g_pool[owned - 1].cache.load(std::memory_order_relaxed)) forget_local_keys(c, owned - 1);
    // Slots held by threads that do not exist here would stay taken.
    for (uint32_t i = 0; i < kPoolSlots; ++i) {
        if (i + 1 == owned) continue;
        g_pool[i].owner_walking = false;
        g_pool[i].busy.store(false, std::memory_order_relaxed);
    }
}

}  // namespace heapsnap::recorder
