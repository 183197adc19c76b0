// Per-thread event rings and the order of events across threads.
//
// The hot path takes no global lock: every thread appends fixed-size slots
// to its own single-producer/single-consumer ring, and the writer thread
// drains all rings and merges them into one time order before encoding.
//
// Why timestamps make the merge exact. A free is stamped *before* the real
// free runs and an allocation *after* the real allocator returned, so when
// thread A frees p and thread B immediately gets p back, A's stamp is
// earlier than B's; the same holds for an allocation handed to another
// thread that frees it. Sorting by one system-wide monotonic clock therefore
// replays every address in its true order.
//
// Why `in_flight`. The writer may only emit an event once no thread can
// still produce an earlier one. A thread raises in_flight before reading
// the clock and lowers it after publishing, so the writer, having read the
// clock itself first, knows: an idle thread's next event is later than the
// writer's clock reading; a busy thread's next event is later than its last
// published one. The minimum of those bounds is the watermark below which
// the merge is final.
//
// The raise must be ordered before the clock read as the writer sees it.
// A locked instruction on every event does that, at a large share of an
// event's cost. So the fence is asymmetric where the kernel
// offers it (membarrier, Linux 4.14): producers raise in_flight with a
// plain store, and the writer, after reading its clock, runs
// membarrier(PRIVATE_EXPEDITED), which executes a full barrier on every
// CPU running one of our threads. A raise before that barrier is visible
// to the writer's loads after it; a raise after it comes later in program
// order than an interrupt that arrived after the writer's clock read, so
// the stamp that follows it is later too. Without membarrier every raise is
// a locked exchange (order_publication_init says which).
//
// One ring. The watermark only keeps rings from overtaking each other: a
// ring's own events leave in the order they were written. So while the
// registry holds one ring, the writer skips the membarrier, an IPI to the
// program's CPU at every round. An event of that ring still in flight then may be stamped
// below the writer's clock and come out in a later round, after the
// events emitted now, which precede it in the ring. A ring registered
// after the writer's scan stamps its events after the writer's clock read:
// the writer reads the clock under the registry lock, waits for the read
// to complete, and the new thread takes that lock to register before its
// first stamp. From the round that sees two rings on, the membarrier is
// back, so an event in flight in the first ring holds the watermark below
// its stamp before any event of the second can pass it.
//
// Rejected: a global lock or a global sequence counter (one contended cache
// line for every allocation of every thread); sorting in the reader (the
// reader would need unbounded lookahead).
//
// One thread. The stamp's lfence (clock.h) orders it after the allocator's
// memory accesses, which only matters against another thread's events. So
// until a second ring is ever created a process stamps with a bare rdtsc,
// and an allocation or a free even reuses the thread's last reading while
// the writer's stamp tick has not moved (rdtsc alone is a large share of
// a free).
// The writer moves the tick at least every 0.5 ms while it is awake for
// busy rings, and marks it stale before a longer sleep, before compressing
// and writing a frame, and when it stops (stamp_tick_*); with a stale tick
// every event reads the clock. A reused stamp is earlier than the event by
// at most the tick period plus the writer's wake-up latency (longer only
// while the writer thread is kept off every CPU). It is never later and
// never decreases, so the order argument below holds for it as well.
// The thread that creates the second ring switches every thread to
// ordered stamps before its own first stamp, and any event of the first
// thread that depends on one of the new thread's (it reuses a block the
// new thread freed, or frees one it allocated) reads the switch after
// observing that event, so it is stamped in order too. Events of the
// first thread that depend on none are concurrent, and any order of them
// is a true one.
//
// A signal handler that allocates while the thread is inside a hook writes
// its slot next to the interrupted one; only the outermost event publishes,
// so both become visible together and in stamp order. One that interrupts
// the stack capture records its allocation with the caller only
// (kDeferredStack).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/spinlock.h"
#include "recorder/thread_state.h"
#include "recorder/writer.h"

namespace heapsnap::recorder {

// Void: a slot of an append a signal handler abandoned (thread_state.h);
// the writer skips it. StackDef and Void come last: the writer's round
// tells them from events with one comparison.
enum class SlotKind : uint8_t { Alloc, Free, Mmap, Munmap, ThreadStart, ThreadExit, Marker, StackDef, Void };

struct Slot {
    uint64_t ts;
    uint64_t addr;    // block / mapping address; stack low end for ThreadStart
    uint64_t size;    // size / length; usable size for Free (attached); stack size for ThreadStart;
                      // marker index for Marker
    uint32_t stack;   // interned stack id (Alloc, Mmap); for Marker, the unrecorded events then
    uint32_t thread;  // thread index
    uint32_t aux;     // mmap flags; os tid for ThreadStart; low half of the caller (kDeferredStack);
                      // for an Alloc with a local key, libunwind's stack id (HEAPSNAP_VERIFY_STACKS)
    SlotKind kind;
    uint8_t fn;          // hslog::AllocFn for Alloc; prot for Mmap
    uint16_t caller_hi;  // bits 32..47 of the caller (kDeferredStack)
};
static_assert(sizeof(Slot) == 40);

// An Alloc made by a signal handler that interrupted its thread's own stack
// capture: the unwinder and the stack table cannot be re-entered, so the
// slot carries the allocating function's return address instead of a stack
// id, and the writer interns that one-frame stack. (User-space addresses
// on x86-64 fit in 48 bits.)
inline constexpr uint32_t kDeferredStack = UINT32_MAX;

inline void set_deferred_caller(Slot& s, uint64_t caller) {
    s.stack = kDeferredStack;
    s.aux = static_cast<uint32_t>(caller);
    s.caller_hi = static_cast<uint16_t>(caller >> 32);
}

inline uint64_t deferred_caller(const Slot& s) { return uint64_t{s.caller_hi} << 32 | s.aux; }

// A stack the thread's own stack cache walked, for the writer to intern
// (unwind.h, "Local keys"): a StackDef slot (addr: the stack's hash; size:
// its frame count n in the low half, and in the high half how many of its
// outermost frames are those of the cache's previous StackDef; stack: the
// local key events of this ring name it by), followed by the frames that
// differ, innermost first, kIpsPerDefSlot to a slot after its stamp. Every
// slot of it carries the stamp, so the last published slot's is a stamp
// whatever it is (the writer's bound for a busy ring).
inline constexpr uint32_t kIpsPerDefSlot = 4;
inline constexpr uint64_t stack_def_slots(uint32_t frames) {
    return 1 + (frames + kIpsPerDefSlot - 1) / kIpsPerDefSlot;
}
inline uint64_t* stack_def_ips(Slot& s) { return &s.addr; }
inline const uint64_t* stack_def_ips(const Slot& s) { return &s.addr; }

// 640 KiB a ring. The writer cannot drain while it compresses a frame
// (1 MiB of records); a ring must hold what a busy thread produces
// meanwhile, or the thread waits for room.
inline constexpr uint64_t kRingSlots = 16384;
// Room kept free for slots written by signal handlers nested in a hook.
inline constexpr uint64_t kNestedReserve = 16;

// Each line below has one writer: a line written by both sides would move
// between the cores on every event.
struct ThreadRing {
    alignas(64) std::atomic<uint64_t> head{0};  // slots published (producer)
    alignas(64) std::atomic<uint64_t> tail{0};  // slots consumed (writer)
    alignas(64) std::atomic<uint32_t> in_flight{0};
    std::atomic<uint32_t> retired{0};  // its thread will publish nothing more
    // Producer-private.
    alignas(64) uint64_t local_head = 0;  // next slot to fill
    uint32_t depth = 0;                   // hook nesting
    uint32_t nested_events = 0;           // appends of signal handlers inside the open one
    uint32_t thread_index = 0;
    uint64_t stamp = 0;       // the last clock reading (one thread recording)
    uint64_t stamp_tick = 0;  // the stamp tick it was read under
    // Writer-private.
    alignas(64) uint64_t last_ts = 0;  // stamp of the last consumed slot
    ThreadRing* next = nullptr;
    alignas(64) Slot slots[kRingSlots];
};

// Inside the recorder, or inside an append to the thread's ring: a signal
// handler here finds the recorder's state half-made. What it appends is
// published with the interrupted append only, which a handler that leaves
// the process (_exit) never lets finish.
inline bool mid_recording(const ThreadState& t) { return t.internal || (t.ring && t.ring->depth); }

// The append path's shared state, defined in thread_buffer.cpp. The path
// itself is inline: as two calls per event its prologues and epilogues
// cost a third of it.
namespace append_state {
// Rings created so far; from the second one on, stamps are ordered across
// threads ("One thread" above).
extern std::atomic<uint32_t> g_rings_created;
// Even: fresh, the writer moves it on within kStampTickNs; odd: stale.
extern std::atomic<uint64_t> g_stamp_tick;
// Registered for membarrier: producers raise in_flight with a plain store.
// Set once before the first event.
extern bool g_asymmetric_fence;
// Waits (never drops) until `needed` slots are free.
void wait_for_room(ThreadRing& ring, uint64_t needed);

// Whether the CPU has PREFETCHW (CPUID 0x80000001, ECX bit 8). Set once
// before the first event.
extern bool g_prefetchw;
}  // namespace append_state

// How far ahead of the slot being filled the ring's line is fetched, for
// writing: the writer read that line when the ring last came round, and a
// plain prefetch would bring it in shared, so the slot store would still
// wait for the writer's core to drop it. PREFETCHW takes it exclusive; a
// CPU without it keeps the plain prefetch (g_prefetchw, chosen once).
// Figures: docs/bench-history.md.
inline constexpr uint64_t kPrefetchSlots = 32;

inline void prefetch_slot(ThreadRing& ring, uint64_t index) {
    Slot& slot = ring.slots[(index + kPrefetchSlots) % kRingSlots];
    if (append_state::g_prefetchw)
        asm volatile("prefetchw %0" : : "m"(slot));
    else
        __builtin_prefetch(&slot, 1);
}

inline bool several_threads() { return append_state::g_rings_created.load(std::memory_order_acquire) > 1; }

// The event's stamp: see "One thread" above.
inline uint64_t stamp(ThreadRing& ring, SlotKind kind) {
    if (several_threads()) return now_ticks();
    uint64_t tick = append_state::g_stamp_tick.load(std::memory_order_relaxed);
    bool reuse = (kind == SlotKind::Alloc || kind == SlotKind::Free) && !(tick & 1) && tick == ring.stamp_tick;
    if (!reuse) {
        ring.stamp = now_ticks_unordered();
        ring.stamp_tick = tick;
    }
    return ring.stamp;
}

inline bool ring_full(const ThreadRing& ring, uint64_t needed) {
    return ring.local_head + needed - ring.tail.load(std::memory_order_acquire) > kRingSlots;
}

// Takes the next `count` slot indices in one instruction: a signal handler that
// appends on this thread lands before or after it, never between a read
// and a write of local_head (which would give both events one slot). No
// lock prefix: only this thread writes local_head.
inline uint64_t claim_slot(ThreadRing& ring, uint64_t count = 1) {
    uint64_t index = count;
    asm volatile("xaddq %0, %1" : "+r"(index), "+m"(ring.local_head) : : "memory");
    return index;
}

// The two halves of appending to the calling thread's own ring, between
// which the caller fills the slot in place: every field but ts and thread.
// begin_append waits (never drops) while the ring is full; end_append
// stamps and publishes. `count` slots in a row are claimed (a StackDef);
// the first is returned.
__attribute__((always_inline)) inline Slot& begin_append(ThreadRing& ring, uint64_t count = 1) {
    bool outer = ring.depth++ == 0;
    if (outer) {
        ring.nested_events = 0;
        if (ring_full(ring, count - 1 + kNestedReserve)) append_state::wait_for_room(ring, count - 1 + kNestedReserve);
        if (append_state::g_asymmetric_fence) {
            ring.in_flight.store(1, std::memory_order_relaxed);
            std::atomic_signal_fence(std::memory_order_seq_cst);  // the store stays before the clock read
        } else {
            ring.in_flight.exchange(1, std::memory_order_seq_cst);
        }
    } else {
        // A signal handler inside a hook: the writer can still drain every
        // published slot, which is all but the interrupted ones.
        ring.nested_events++;
        if (ring_full(ring, count)) append_state::wait_for_room(ring, count);
    }
    uint64_t index = claim_slot(ring, count);
    prefetch_slot(ring, index);
    return ring.slots[index % kRingSlots];
}

// The second half for slots already stamped.
__attribute__((always_inline)) inline void publish_append(ThreadRing& ring) {
    if (ring.depth == 1) {
        ring.head.store(ring.local_head, std::memory_order_release);
        ring.in_flight.store(0, std::memory_order_release);
        if (ring.local_head - ring.tail.load(std::memory_order_relaxed) > kRingSlots / 2) writer_wake();
    }
    ring.depth--;
}

__attribute__((always_inline)) inline void end_append(ThreadRing& ring, Slot& slot) {
    slot.ts = stamp(ring, slot.kind);
    publish_append(ring);
}

// Appends a StackDef of an n-frame stack (at most kMaxDepth + 8) whose
// outermost `shared` frames are those of the previous one and whose others
// are fresh[0..n - shared), and whose events will name it `key`; false
// when the calling thread has no ring of its own to append to (its first
// event, a retired ring) or the recorder is not running: the caller
// interns the stack itself then.
bool append_stack_def(uint32_t key, const uint64_t* fresh, uint32_t n, uint32_t shared, uint64_t hash);

// Every other case of emit_with: the thread's first event, a thread whose
// ring is retired, a recorder not running (false).
bool emit_slow(const Slot& slot);

// Appends one event for the calling thread, stamping it now; fill(Slot&)
// writes its fields (all but ts and thread). Returns false only when the
// recorder is not running. The slot is written where it will stay: a slot
// built on the stack and copied costs two store-forwarding stalls, as
// 16-byte loads read fields just written with narrower stores.
// `t`: the calling thread's state (hook_state in a hook, else thread_state).
template <class Fill>
__attribute__((always_inline)) inline bool emit_with(ThreadState& t, Fill&& fill) {
    ThreadRing* ring = t.ring;
    if (__builtin_expect(ring == nullptr || !recorder_active(), 0)) {
        Slot slot{};
        fill(slot);
        return emit_slow(slot);
    }
    Slot& dst = begin_append(*ring);
    fill(dst);
    dst.thread = t.thread_index;
    end_append(*ring, dst);
    return true;
}

template <class Fill>
__attribute__((always_inline)) inline bool emit_with(Fill&& fill) {
    return emit_with(thread_state(), fill);
}

inline bool emit(const Slot& slot) {
    return emit_with([&](Slot& s) { s = slot; });
}

// Events that happened but could not be recorded (no memory for a ring, a
// hook a signal handler left by siglongjmp: thread_state.h); the writer
// puts the total in the log before each marker and the End record.
void note_unrecorded(uint64_t events);
uint64_t unrecorded_events();

// The calling thread's appends a signal handler left by siglongjmp: their
// slots become Void and are published with the rest. Returns how many
// appends of nested handlers (complete ones; a stack definition among them
// counts too) went with them.
uint32_t abandon_appends(ThreadRing& ring);

// The thread index of the calling thread, assigned on first use.
uint32_t current_thread_index();

// Called from the pthread key destructor: the thread's last event was
// published; the writer may reuse or unmap the ring once drained.
void retire_current_thread();

// Chooses how producers raise in_flight: registers for membarrier. Once at
// start, before any event.
void order_publication_init();

// Writer side ---------------------------------------------------------------

// Between the writer's clock read and its in_flight loads, under the
// registry lock: with several rings, every thread's raise made before this
// call is visible after it; with one ring ("One ring" above), the clock
// read is complete.
void order_after_clock_read(bool several_rings);

// The stamp tick ("One thread" above), moved by the writer only, under its
// lock: advance when it promises to advance again within kStampTickNs,
// make stale when it cannot promise that. Returns whether it was fresh.
inline constexpr uint64_t kStampTickNs = 500'000;
void stamp_tick_advance();
bool stamp_tick_make_stale();

// Calls fn(ring) for every registered ring under the registry lock.
template <class Fn>
void for_each_ring(Fn&& fn);

SpinLock& registry_lock();
ThreadRing* ring_list();
// Removes drained retired rings from the list, keeps a few for threads to
// come and unmaps the others. Only where no Cursor of the writer's outlives
// it (the end of a round).
void recycle_drained_rings();
// After fork: only the calling thread survives; every ring is free.
void reset_rings_after_fork();
// Threads currently registered (for markers).
uint32_t live_thread_count();

template <class Fn>
void for_each_ring(Fn&& fn) {
    LockGuard guard(registry_lock());
    for (ThreadRing* r = ring_list(); r; r = r->next) fn(*r);
}

}  // namespace heapsnap::recorder
