#include "recorder/thread_buffer.h"

#include <cpuid.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <time.h>

#include <cstring>
#include <new>

#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/raw_alloc.h"
#include "recorder/writer.h"

namespace heapsnap::recorder {

using append_state::g_asymmetric_fence;
using append_state::g_prefetchw;
using append_state::g_rings_created;
using append_state::g_stamp_tick;

namespace {

SpinLock g_registry_lock;
ThreadRing* g_rings = nullptr;       // registered, in registration order
ThreadRing* g_free_rings = nullptr;  // drained, ready for reuse
uint32_t g_free_count = 0;
// Drained rings kept for threads to come; the writer unmaps the others.
constexpr uint32_t kSpareRings = 8;
// Retired rings the writer has not taken off the list yet. Past half the
// spares, a thread's exit wakes the writer, so that threads which come and
// go faster than it wakes by itself find a ring to reuse.
std::atomic<uint32_t> g_retired_waiting{0};
std::atomic<uint32_t> g_next_thread{0};
std::atomic<uint64_t> g_unrecorded{0};
std::atomic<uint32_t> g_live_threads{0};

// Events of threads whose own ring was already retired (frees run by TLS
// destructors after our key destructor) share one ring under a lock, held
// with signals blocked (LockGuard): no handler appends there meanwhile.
SpinLock g_shared_lock;
ThreadRing* g_shared_ring = nullptr;

ThreadRing* new_ring(uint32_t thread_index) {
    ThreadRing* ring = nullptr;
    {
        LockGuard guard(g_registry_lock);
        if (g_free_rings) {
            ring = g_free_rings;
            g_free_rings = ring->next;
            g_free_count--;
        }
    }
    if (ring) {
        ring->~ThreadRing();
    } else {
        void* mem = raw_map(sizeof(ThreadRing));
        if (!mem) return nullptr;
        ring = static_cast<ThreadRing*>(mem);
    }
    // Before this ring's first stamp.
    g_rings_created.fetch_add(1, std::memory_order_seq_cst);
    new (ring) ThreadRing;  // default-initialized: the slots are written before they are read
    ring->thread_index = thread_index;
    LockGuard guard(g_registry_lock);
    ThreadRing** tail = &g_rings;
    while (*tail) tail = &(*tail)->next;
    *tail = ring;
    return ring;
}

void append(ThreadRing& ring, const Slot& slot) {
    Slot& dst = begin_append(ring);
    dst = slot;
    end_append(ring, dst);
}

bool emit_shared(const Slot& slot) {
    LockGuard guard(g_shared_lock);
    if (!g_shared_ring) g_shared_ring = new_ring(0);
    if (!g_shared_ring) return false;
    append(*g_shared_ring, slot);
    return true;
}

}  // namespace

namespace append_state {

std::atomic<uint32_t> g_rings_created{0};
std::atomic<uint64_t> g_stamp_tick{1};
bool g_asymmetric_fence = false;
bool g_prefetchw = false;

__attribute__((noinline)) void wait_for_room(ThreadRing& ring, uint64_t needed) {
    for (unsigned spins = 0; ring_full(ring, needed); ++spins) {
        if (!writer_running()) {
            writer_drain_inline();
            continue;
        }
        writer_wake();
        if (spins < 64) {
            sched_yield();
        } else {
            timespec pause{0, 50000};
            nanosleep(&pause, nullptr);
        }
    }
}

}  // namespace append_state

bool append_stack_def(uint32_t key, const uint64_t* fresh, uint32_t n, uint32_t shared, uint64_t hash) {
    const ThreadState& t = thread_state();
    ThreadRing* ring = t.ring;
    if (!ring || !recorder_active()) return false;
    const uint32_t differ = n - shared;
    uint64_t count = stack_def_slots(differ);
    Slot& head = begin_append(*ring, count);
    uint64_t first = static_cast<uint64_t>(&head - ring->slots);
    // begin_append fetches one slot's line ahead an append; this append
    // moves `count` slots on, so the lines as far ahead of its end are
    // fetched too, or the next appends write to lines still the writer's.
    for (uint64_t i = 1; i < count; ++i) prefetch_slot(*ring, first + i);
    uint64_t ts = stamp(*ring, SlotKind::StackDef);
    head = Slot{};
    head.ts = ts;
    head.kind = SlotKind::StackDef;
    head.addr = hash;
    head.size = uint64_t{shared} << 32 | n;
    head.stack = key;
    head.thread = t.thread_index;
    for (uint64_t i = 1; i < count; ++i) {
        Slot& data = ring->slots[(first + i) % kRingSlots];
        data.ts = ts;
        uint32_t from = static_cast<uint32_t>(i - 1) * kIpsPerDefSlot;
        uint32_t take = differ - from < kIpsPerDefSlot ? differ - from : kIpsPerDefSlot;
        memcpy(stack_def_ips(data), fresh + from, sizeof(uint64_t) * take);
    }
    publish_append(*ring);
    return true;
}

uint32_t current_thread_index() {
    ThreadState& t = thread_state();
    if (!t.has_index) {
        t.thread_index = g_next_thread.fetch_add(1, std::memory_order_relaxed);
        t.has_index = true;
    }
    return t.thread_index;
}

bool emit_slow(const Slot& event) {
    if (!recorder_active()) return false;
    Slot slot = event;
    slot.thread = current_thread_index();
    ThreadState& t = thread_state();
    if (t.status == ThreadStatus::Retired) {
        if (emit_shared(slot)) return true;
        note_unrecorded(1);
        return false;
    }
    if (!t.ring) {
        // Blocked: a handler never finds `internal` raised here.
        SignalsBlocked blocked;
        t.internal++;
        t.ring = new_ring(slot.thread);
        if (t.ring) {
            g_live_threads.fetch_add(1, std::memory_order_relaxed);
            watch_thread_exit(t);
            // Paused by the last thread's exit; never from inside the
            // allocator, which may hold the lock pthread_create's calloc
            // needs (ThreadState::in_allocator).
            if (!writer_running() && !t.in_allocator) writer_start_thread();
        }
        t.internal--;
        if (!t.ring) {
            note_unrecorded(1);
            return false;
        }
    }
    append(*t.ring, slot);
    return true;
}

void note_unrecorded(uint64_t events) {
    if (events) g_unrecorded.fetch_add(events, std::memory_order_relaxed);
}

uint64_t unrecorded_events() { return g_unrecorded.load(std::memory_order_relaxed); }

uint32_t abandon_appends(ThreadRing& ring) {
    if (!ring.depth) return 0;
    uint64_t ts = now_ticks();
    for (uint64_t i = ring.head.load(std::memory_order_relaxed); i < ring.local_head; ++i) {
        Slot& s = ring.slots[i % kRingSlots];
        s.kind = SlotKind::Void;
        s.ts = ts;
    }
    // Less the open append itself, and the handlers' appends still open.
    uint32_t lost = ring.nested_events + 1 > ring.depth ? ring.nested_events + 1 - ring.depth : 0;
    ring.depth = 1;
    publish_append(ring);
    return lost;
}

void retire_current_thread() {
    ThreadState& t = thread_state();
    ThreadRing* ring = t.ring;
    if (!ring) return;
    // A signal handler from here on appends to the shared ring: once
    // retired, the writer may unmap this one.
    t.ring = nullptr;
    retire_thread_state(t);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    ring->retired.store(1, std::memory_order_release);
    g_live_threads.fetch_sub(1, std::memory_order_relaxed);
    if (g_retired_waiting.fetch_add(1, std::memory_order_relaxed) + 1 >= kSpareRings / 2) writer_wake();
}

void order_publication_init() {
    g_asymmetric_fence = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    unsigned eax, ebx, ecx, edx;
    g_prefetchw = __get_cpuid(0x80000001, &eax, &ebx, &ecx, &edx) && (ecx & bit_PRFCHW);
}

void order_after_clock_read(bool several_rings) {
    if (several_rings) {
        // Registration is per process and inherited by a fork child, so
        // this does not fail once it succeeded; if it ever did, the
        // writer's own fence is all that is left.
        if (g_asymmetric_fence) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
    } else {
        // The clock is read before the registry lock is released.
        _mm_lfence();
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

void stamp_tick_advance() {
    uint64_t tick = g_stamp_tick.load(std::memory_order_relaxed);
    g_stamp_tick.store((tick | 1) + 1, std::memory_order_relaxed);
}

bool stamp_tick_make_stale() {
    uint64_t tick = g_stamp_tick.load(std::memory_order_relaxed);
    g_stamp_tick.store(tick | 1, std::memory_order_relaxed);
    return !(tick & 1);
}

SpinLock& registry_lock() { return g_registry_lock; }
ThreadRing* ring_list() { return g_rings; }

void recycle_drained_rings() {
    ThreadRing* surplus = nullptr;
    uint32_t drained_count = 0;
    {
        LockGuard guard(g_registry_lock);
        ThreadRing** link = &g_rings;
        while (ThreadRing* r = *link) {
            bool drained = r->retired.load(std::memory_order_acquire) &&
                           r->tail.load(std::memory_order_relaxed) == r->head.load(std::memory_order_acquire);
            if (!drained) {
                link = &r->next;
                continue;
            }
            *link = r->next;
            drained_count++;
            r->next = g_free_rings;
            g_free_rings = r;
            g_free_count++;
        }
        for (; g_free_count > kSpareRings; g_free_count--) {
            ThreadRing* r = g_free_rings;
            g_free_rings = r->next;
            r->next = surplus;
            surplus = r;
        }
    }
    if (drained_count) g_retired_waiting.fetch_sub(drained_count, std::memory_order_relaxed);
    while (ThreadRing* r = surplus) {
        surplus = r->next;
        raw_unmap(r, sizeof(ThreadRing));
    }
}

void reset_rings_after_fork() {
    // The parent's threads do not exist here but this one; their rings
    // (and any slots they still held) belong to the parent's log. Their
    // memory waits for the child's threads, and the writer unmaps what is
    // past the spares. Not a ring inside an append (a signal handler forked
    // there): the append writes to it when the handler returns.
    g_registry_lock.reset();
    g_shared_lock.reset();
    for (ThreadRing* r = g_rings; r;) {
        ThreadRing* next = r->next;
        if (!r->depth) {
            r->next = g_free_rings;
            g_free_rings = r;
            g_free_count++;
        }
        r = next;
    }
    g_rings = nullptr;
    g_retired_waiting.store(0, std::memory_order_relaxed);
    g_rings_created.store(0, std::memory_order_relaxed);  // this thread alone
    stamp_tick_make_stale();                              // no writer thread here yet
    g_shared_ring = nullptr;
    ThreadState& t = thread_state();
    t.ring = nullptr;
    g_live_threads.store(0, std::memory_order_relaxed);
}

uint32_t live_thread_count() { return g_live_threads.load(std::memory_order_relaxed); }

}  // namespace heapsnap::recorder
