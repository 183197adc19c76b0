// The per-thread stack cache's upkeep and the pool (unwind_cache.h), and
// unwind.h's functions that manage them: local keys aged and dropped,
// caches released at thread exit, cleared after a siglongjmp, freed in a
// fork child.
#include "recorder/unwind_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "recorder/raw_alloc.h"
#include "recorder/thread_state.h"

namespace heapsnap::recorder {
namespace unwinder {
namespace {

// A check that never holds (a function, not a constant: an address is no
// constant expression, and hooks run before the recorder's initializers).
const uint64_t g_stop_word = 0;
LinkCheck stop_check() { return LinkCheck{reinterpret_cast<uint64_t>(&g_stop_word), 1}; }

bool is_stop_check(const LinkCheck& k) { return k.at == reinterpret_cast<uint64_t>(&g_stop_word); }

bool check_fails(const LinkCheck& k) { return load(k.at) != k.value; }

}  // namespace

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

namespace {

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
// slot just written, often a cache miss). Only the owner and its signal
// handlers touch owner_walking; a handler that finds it set borrows a
// shared slot instead.
//
// The pool is constinit: hooks run before the recorder's own initializers
// (a library initialized earlier, libstdc++ itself, allocates), so a
// dynamic initializer would reset a slot already owned: its thread would
// walk without its cache and intern every stack itself.
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

StackCache* cache_of(PoolSlot& s) {
    StackCache* c = s.cache.load(std::memory_order_relaxed);
    if (!c) {
        c = static_cast<StackCache*>(raw_map_populated(sizeof(StackCache)));
        if (c) c->checks[0] = stop_check();
        s.cache.store(c, std::memory_order_relaxed);
    }
    return c;
}

}  // namespace

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

namespace {

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

}  // namespace

// A thread past its exit hook borrows without owning: it would never give
// the cache back.
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

namespace {

__attribute__((noinline)) void give_back_borrowed(uint32_t slot) {
    thread_state().unwind.borrowed = 0;
    g_pool[slot].busy.store(false, std::memory_order_release);
}

}  // namespace

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

const FrameRule& rule_for(StackCache* c, uint64_t pc) {
    if (!c) return *frame_rule(pc);
    NearRule& near = near_rule(c, pc);
    if (near.pc != pc) near = NearRule{pc, *frame_rule(pc)};
    return near.rule;
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
    if (pending_for(c, first, from) && i < kFirstFrames && ff.pcs[i] == first.ip) return ff.rules[i];
    return first_frame_rule(c, first.ip);
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
}  // namespace unwinder

using namespace unwinder;

void skip_local_keys(uint32_t walks) {
    uint32_t owned = thread_state().unwind.owned;
    if (!owned) return;
    if (StackCache* c = g_pool[owned - 1].cache.load(std::memory_order_relaxed))
        advance_local_keys(c, owned - 1, walks);
}

void release_stack_cache() {
    UnwindThread& u = thread_state().unwind;
    u.released = true;
    if (!u.owned) return;
    PoolSlot& s = g_pool[u.owned - 1];
    u.owned = 0;
    s.owner_walking = false;
    // Threads that exit at once may each count fewer than kSpareCaches
    // and all keep theirs: a few more spares may stay, never fewer.
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
