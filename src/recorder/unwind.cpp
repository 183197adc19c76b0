#include "recorder/unwind.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "recorder/cfi_walk.h"
#include "recorder/lifecycle.h"
#include "recorder/stack_table.h"
#include "recorder/thread_state.h"
#include "recorder/unwind_cache.h"
#include "recorder/unwind_segments.h"
#include "recorder/unwind_step.h"

namespace heapsnap::recorder {
namespace unwinder {
namespace {

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

}  // namespace

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

namespace {

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
__attribute__((noinline)) int full_cfi_stack(uint64_t* ips, int max, OwnRange own) {
    return cfi_walk_stack(ips, max, own.start, own.end);
}

// How far above a recorder frame's sp its frame pointer may lie: the
// largest frame of the recorder's (the full CFI walk's) is a few KiB.
constexpr uint64_t kOwnFrameReach = 1u << 20;

struct Walked {
    int count;                      // frames in ips
    bool cached;                    // the stack is now the cache's last one
    bool unchanged;                 // ... and it was the last one before, frame for frame
    uint64_t hash;                  // if cached: stack_hash of the whole stack walked
    int fresh = 0;                  // if cached: frames walked afresh (the cache's fresh[]) above ...
    int kept = -1;                  // ... the last stack's frames 0..kept, reused
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
// max frames only. A stack deeper than max (a compiler's, now and then),
// walked only to max, would be stepped or copied whole at every
// allocation there.
//
// With a cache: as soon as a frame equals one of the last stack (same sp,
// ip, bp and lookup address), the last stack's frames from there are
// reused for as long as their links hold (link_holds), which costs one or
// two compared words per frame instead of a rule lookup and a step. A
// broken link is stepped afresh and the walk goes on, matching again
// further out (a leaf called from a different caller rejoins the old stack
// one frame further up). A frame no rule covers sends the whole stack to
// the full CFI walk (cfi_walk.h).
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
    // rule lookup for frames that are never reported. Code linked into
    // the recorder without them (libgcov, in the build that trains its
    // profile: its mmap reaches the hook) leaves in rbp whatever it holds,
    // 0 below the first constructors; a frame pointer that does not lie
    // just above its frame sends the stack to the full CFI walk.
    for (; walked < max && own.holds(f.ip); ++walked) {
        if (f.bp < f.sp || f.bp - f.sp > kOwnFrameReach) return Walked{full_cfi_stack(ips, max, own), false, false, 0};
        f = caller_of(reinterpret_cast<const uint64_t*>(f.bp));
    }
    const uint64_t first_sp = f.sp;
    CachedFrame* last = c ? c->frames : nullptr;
    CachedFrame* fresh = c ? c->fresh : nullptr;
    int last_count = c ? c->count : 0;
    int n = 0;
    int nf = 0;              // fresh frames
    int kept = -1;           // last[0..kept] stays: the new stack's outer part
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
            return Walked{full_cfi_stack(ips, max, own), false, false, 0};
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

}  // namespace
}  // namespace unwinder

using namespace unwinder;

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

__attribute__((noinline)) uint32_t unwind_stack_key(uint64_t* ips, int max, const StackKeyer& keyer, const void* from) {
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
    Walked w =
        walk(first, ips, max, c, local ? nullptr : keyer.prefetch_intern, c && !c->deep ? kMaxFrames : max, first_rule);
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
            // A stack shares most of its frames with the one before: those
            // the walk kept of the last stack need not be compared again.
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
    if (from_hook) keep_segment(c, w.fresh, w.kept, k);
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

namespace {

// HEAPSNAP_VERIFY_STACKS's reference, loaded only then: libunwind is a
// TLS module, which would make every thread the program creates allocate
// 16 bytes more (its DTV's entry).
using Backtrace = int (*)(void**, int);
std::atomic<Backtrace> g_reference{nullptr};

}  // namespace

bool load_reference_unwinder() {
    void* handle = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    auto backtrace = handle ? reinterpret_cast<Backtrace>(dlsym(handle, "unw_backtrace")) : nullptr;
    if (backtrace) {
        // Once now, outside any capture: libunwind sets itself up on its
        // first call (and allocates then), which would otherwise be inside
        // a hook's capture, where an allocation is the program's.
        void* frames[4];
        backtrace(frames, 4);
    }
    g_reference.store(backtrace, std::memory_order_release);
    return backtrace != nullptr;
}

const void* reference_unwinder() { return reinterpret_cast<const void*>(g_reference.load(std::memory_order_acquire)); }

__attribute__((noinline)) int libunwind_program_stack(uint64_t* ips, int max) {
    // Room for the recorder's frames above the program's.
    constexpr int kOwnRoom = 32;
    const Backtrace backtrace = g_reference.load(std::memory_order_acquire);
    if (!backtrace) return -1;
    if (max > kMaxFrames) max = kMaxFrames;
    const OwnRange own = own_range();
    void* all[kMaxFrames + kOwnRoom];
    int n = backtrace(all, max + kOwnRoom);
    int count = 0;
    for (int i = 0; i < n && count < max; ++i)
        if (!own.holds(reinterpret_cast<uint64_t>(all[i]))) ips[count++] = reinterpret_cast<uint64_t>(all[i]);
    return count;
}

void set_thread_stack(uint64_t lo, uint64_t hi) {
    UnwindThread& u = thread_state().unwind;
    u.stack_lo = lo;
    u.stack_hi = hi;
}

uint64_t thread_stack_top() { return thread_stack().hi; }

}  // namespace heapsnap::recorder
