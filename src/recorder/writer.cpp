#include "recorder/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
// customMem (an allocator that does not call malloc) is in the advanced API.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "format/hslog.h"
#include "recorder/alloc_infos.h"
#include "recorder/attach.h"
#include "recorder/clock.h"
#include "recorder/control.h"
#include "recorder/lifecycle.h"
#include "recorder/markers.h"
#include "recorder/metadata_queue.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"
#include "recorder/raw_alloc.h"
#include "recorder/stack_table.h"
#include "recorder/thread_buffer.h"
#include "recorder/unwind.h"

namespace heapsnap::recorder {
namespace {

constexpr size_t kFrameBufferBytes = 16u << 20;  // a frame's payload plus one marker at most
constexpr uint64_t kFlushIntervalNs = 100'000'000;
constexpr int kIdleWaitMs = 50;
constexpr int kZstdLevel = 3;
constexpr size_t kWriterStackBytes = 512u << 10;

struct Cursor {
    ThreadRing* ring;
    uint64_t pos;
    uint64_t end;
};

// Writer state; guarded by g_writer_lock.
SpinLock g_writer_lock;
// Written under the lock; atomic because the close and uid-change hooks
// read it from any thread (is_recorder_fd, writer_give_log).
std::atomic<int> g_fd{-1};
// The log file's identity, and the process whose log it is: a uid-change
// hook checks that the descriptor it is about to chown is still the log,
// and that the caller is not a vfork child (which shares the parent's
// memory, and so g_fd, but runs as a user of its own).
dev_t g_log_dev = 0;
ino_t g_log_ino = 0;
pid_t g_log_pid = 0;
char g_path[kMaxPathLen];
uint8_t* g_frame = nullptr;
// What encoding changes on every record, on lines of its own: the hooks
// read flags and counters on every event, and a line they shared with
// these would move between the cores each time (false sharing: it made
// every hook wait for the line).
struct alignas(64) Encoder {
    size_t frame_used = 0;
    uint64_t stream_ts = 0;
    uint64_t stream_addr = 0;
    uint32_t stream_thread = UINT32_MAX;
    uint64_t events = 0;
    uint64_t last_flush_ns = 0;
    uint32_t frame_max_marker = 0;
    uint32_t marker_count = 0;
};
Encoder g_enc;
uint8_t* g_compressed = nullptr;
size_t g_compressed_capacity = 0;
ZSTD_CCtx* g_zstd = nullptr;
// A full frame is compressed a piece at a time between the writer's
// rounds, while the next one fills the other buffer: compressed at once
// (1 MiB, ~3 ms) it kept the writer from draining the rings meanwhile,
// and a thread allocating as fast as python3 (17 M events/s, a ring's
// 16 384 slots in 1 ms) filled its ring and waited for room: about a
// tenth of python3's recording overhead. The frame on disk is the same
// zstd frame (its size pledged, so its header states it).
constexpr size_t kCompressPiece = 128u << 10;
uint8_t* g_spare_frame = nullptr;
struct Compressing {
    const uint8_t* frame = nullptr;  // null: none
    size_t size = 0;
    size_t fed = 0;    // bytes of frame handed to zstd so far
    size_t out = 0;    // compressed bytes in g_compressed so far
    uint32_t max_marker = 0;  // the last marker the frame holds (0: none)
};
Compressing g_compressing;
// Recording has stopped for good (fail): written under the lock, read by
// the writer thread's loop.
std::atomic<bool> g_failed{false};
bool g_ended = false;
// Recent (token, index) pairs, for the control channel's replies.
constexpr uint32_t kTokenMemory = 64;
std::atomic<uint64_t> g_marker_tokens[kTokenMemory];
Cursor* g_cursors = nullptr;
size_t g_cursor_capacity = 0;

std::atomic<uint32_t> g_durable_marker{0};
std::atomic<bool> g_running{false};
std::atomic<bool> g_stop{false};
// Set while the writer waits in poll(); the first producer that finds it set
// clears it and writes the eventfd, so a busy program pays one syscall per
// writer nap, not one per event.
struct alignas(64) SleepFlag {
    std::atomic<bool> set{false};
};
SleepFlag g_sleeping;
// The exit marker must be the last marker: once it is being taken, no
// interval marker may start, and one already started must finish first.
std::atomic<bool> g_intervals_closed{false};
std::atomic<bool> g_interval_busy{false};
pthread_t g_thread;
void* g_writer_stack = nullptr;
// Held across a start or a stop of the writer thread, the join included:
// the last thread's exit hook stops the writer while a thread it created
// may be recording its first event, which starts it again. Without the
// lock the start could replace g_thread between the stop's flag and its
// join, and the stop joined a writer that was never told to stop: the
// program hung at exit or its log lost the End record (tests/stress
// main_exit, 8 of 80 runs beside a CPU burner).
SpinLock g_thread_lock;
std::atomic<int> g_wake_fd{-1};

void wake_now() {
    OwnFdUse use;
    int fd = g_wake_fd.load(std::memory_order_acquire);
    if (fd < 0) return;
    uint64_t one = 1;
    ssize_t ignored = write(fd, &one, sizeof one);
    (void)ignored;
}

// Whether g_fd is still the log file: the program may have closed it
// with the system call, past the hooks, and put a file of its own there.
bool log_intact(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_dev == g_log_dev && st.st_ino == g_log_ino;
}

bool write_all(const uint8_t* p, size_t n) {
    OwnFdUse use;
    int fd = g_fd.load(std::memory_order_acquire);
    if (!log_intact(fd)) {
        errno = EBADF;
        return false;
    }
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

// Recording stops for good: nothing more is written anywhere, the hooks
// record nothing more (stop_recording), the writer thread leaves.
void fail(const char* what) {
    if (g_failed) return;
    g_failed = true;
    g_wake_fd.store(-1, std::memory_order_release);
    stop_recording();
    alert("cannot write log ", g_path, what);
}

// Hands up to `bytes` more of the frame being compressed to zstd (all of
// it: the frame ends, and is written). No stamp reuse meanwhile: a piece
// takes a few tenths of a millisecond, the whole frame milliseconds.
void compress_more(size_t bytes) {
    Compressing& c = g_compressing;
    if (!c.frame) return;
    if (g_failed) {  // the log is given up: nothing more is written
        c = Compressing{};
        return;
    }
    bool fresh = stamp_tick_make_stale();
    size_t upto = bytes >= c.size - c.fed ? c.size : c.fed + bytes;
    ZSTD_inBuffer in{c.frame, upto, c.fed};
    ZSTD_outBuffer out{g_compressed, g_compressed_capacity, c.out};
    ZSTD_EndDirective mode = upto == c.size ? ZSTD_e_end : ZSTD_e_continue;
    size_t left = 0;
    do {
        left = ZSTD_compressStream2(g_zstd, &out, &in, mode);
    } while (!ZSTD_isError(left) && (mode == ZSTD_e_end ? left != 0 : in.pos < in.size));
    c.fed = in.pos;
    c.out = out.pos;
    bool done = mode == ZSTD_e_end || ZSTD_isError(left);
    if (ZSTD_isError(left)) {
        fail(": compression failed; recording stopped");
    } else if (done && !write_all(g_compressed, c.out)) {
        fail(errno == EBADF ? ": its descriptor was closed or replaced by the program; recording stopped"
                            : ": write failed; recording stopped");
    }
    if (done) {
        if (c.max_marker && !g_failed) g_durable_marker.store(c.max_marker, std::memory_order_release);
        c = Compressing{};
    }
    if (fresh) stamp_tick_advance();
}

// Ends the frame being filled: its compression starts (compress_more goes
// on with it between rounds), and the next frame fills the other buffer.
// A frame still being compressed is finished first, so frames reach the
// file in order.
void end_frame() {
    if (!g_enc.frame_used || g_failed || g_fd < 0) {
        g_enc.frame_used = 0;
        return;
    }
    compress_more(SIZE_MAX);
    ZSTD_CCtx_reset(g_zstd, ZSTD_reset_session_only);
    ZSTD_CCtx_setPledgedSrcSize(g_zstd, g_enc.frame_used);
    g_compressing = Compressing{g_frame, g_enc.frame_used, 0, 0, g_enc.frame_max_marker};
    std::swap(g_frame, g_spare_frame);
    g_enc.frame_used = 0;
    g_enc.last_flush_ns = now_ns();
    g_enc.frame_max_marker = 0;
}

// Everything committed so far on disk now.
void flush_frame() {
    end_frame();
    compress_more(SIZE_MAX);
}

// Space for one record; cuts the frame first if the record would not fit
// in the frame's nominal size.
codec::Writer reserve(size_t max_bytes) {
    if (g_enc.frame_used && g_enc.frame_used + max_bytes > hslog::kFramePayload) end_frame();
    return codec::Writer(g_frame + g_enc.frame_used, kFrameBufferBytes - g_enc.frame_used);
}
void commit(const codec::Writer& w) { g_enc.frame_used += w.size(); }

void put_raw_record(const uint8_t* data, size_t n) {
    codec::Writer w = reserve(n);
    if (n > w.room()) return;  // larger than a frame buffer: cannot happen for recorder-made records
    w.raw(data, n);
    commit(w);
}

// `ts` in nanoseconds; slot stamps go through ticks_to_ns first.
// The log keeps time in microseconds (hslog::kTimeUnitNs): the order of
// events is their order in the stream, so finer stamps would only add
// incompressible low bits to every record.
uint64_t advance_time(uint64_t ts) {
    uint64_t unit = ts / hslog::kTimeUnitNs;
    uint64_t dt = unit > g_enc.stream_ts ? unit - g_enc.stream_ts : 0;
    if (unit > g_enc.stream_ts) g_enc.stream_ts = unit;
    return dt;
}

// Events carry no time of their own: a Time record moves the stream time
// when an event is hslog::kEventTimeStep (1 ms) or more past it, so event
// times are exact to 1 ms and most events carry no time bytes at all.
void event_time(codec::Writer& w, uint64_t ts) {
    uint64_t unit = ts / hslog::kTimeUnitNs;
    if (unit < g_enc.stream_ts + hslog::kEventTimeStep) return;
    hslog::put_time(w, unit - g_enc.stream_ts);
    g_enc.stream_ts = unit;
}

int64_t advance_addr(uint64_t addr) {
    auto delta = static_cast<int64_t>(addr - g_enc.stream_addr);
    g_enc.stream_addr = addr;
    return delta;
}

// Stack records encoded per hold of the metadata lock (a record of a
// compile's 41-frame stacks is about 2 800 instructions). Program threads
// take that lock only for a marker or a module loaded or unloaded since
// the last scan (inserting a stack has its own lock, stack_table.h), so
// the holds need not be short, only bounded.
constexpr uint32_t kStacksPerHold = 32;

// Moves the queued metadata into the stream, the Stack records of the
// stacks interned since the last round first (stack_table.h). The lock is
// held only to encode a few of those, the last hold taking the queue
// (metadata_queue.h).
void put_queued_metadata() {
    MetadataBatch batch;
    for (bool taken = false; !taken;) {
        LockGuard guard(metadata_lock());
        if (!queue_pending_stacks(kStacksPerHold)) {
            batch = metadata_take();
            taken = true;
        }
    }
    metadata_drain(batch, [](const uint8_t* data, size_t size) { put_raw_record(data, size); });
}

// The one-frame stack of an allocation made by a signal handler during its
// thread's stack capture (kDeferredStack), interned here and defined in the
// log before the event that uses it.
uint32_t intern_deferred(const Slot& s) {
    uint64_t caller = deferred_caller(s);
    note_writer_interned();
    uint32_t stack = intern_stack(&caller, 1, stack_hash(&caller, 1));
    put_queued_metadata();
    return stack;
}

// What the writer keeps per stack cache that handed stacks on (unwind.h,
// "Local keys"), mapped when the first comes (258 KiB): the stack ids of
// its local keys, by local_key_index, and the last stack it defined. A
// key's StackDef comes before any event that names it, in the same ring,
// so an id is set before it is read; it is overwritten only by a key made
// kLocalWindow walks later, after the last event that could name the old
// one. The StackDefs of a cache come in the order the cache made them, so
// `last` is the stack the next one's shared frames are taken from.
struct LocalStacks {
    uint32_t ids[kLocalWindow];
    DefinedStack last;
};
LocalStacks* g_local_stacks[kStackCaches];
uint32_t g_highest_defined = 0;  // the highest stack id a StackDef has had

// The stacks StackDefs named lately, by hash: a stack met again is checked
// against its record (stack_id_of) instead of looked up in the stack
// table, whose slots and records are far larger than the caches (the
// program's threads kept such a memo when they interned). On this 2-vCPU
// VM the writer's cycles are not free: a busy loop on the other vCPU slows
// a compile by a quarter.
struct RecentStack {
    uint64_t hash;
    const void* record;
};
constexpr unsigned kRecentBits = 12;
RecentStack g_recent[1u << kRecentBits];

uint32_t intern_defined(const uint64_t* ips, uint32_t n, uint64_t hash) {
    RecentStack& recent = g_recent[hash >> (64 - kRecentBits)];
    if (recent.record && recent.hash == hash)
        if (uint32_t id = stack_id_of(recent.record, ips, n)) return id;
    const void* record = nullptr;
    uint32_t id = intern_stack(ips, n, hash, &record);
    if (record) recent = RecentStack{hash, record};
    return id;
}

// The stack id of a local key; 0 ("no stack") if the writer had no memory
// for its cache's entries.
uint32_t local_stack_id(uint32_t key) {
    const LocalStacks* local = g_local_stacks[local_key_cache(key)];
    return local ? local->ids[local_key_index(key)] : 0;
}

// Interns the stack of the StackDef at `at` (the whole def is published:
// it is one append) and defines it in the log before any event that names
// it. Returns the slots it spans. `end`: the ring's published end.
uint64_t take_stack_def(const ThreadRing& ring, uint64_t at, uint64_t end) {
    const Slot& head = ring.slots[at % kRingSlots];
    auto n = static_cast<uint32_t>(head.size);
    auto shared = static_cast<uint32_t>(head.size >> 32);
    const uint64_t count = stack_def_slots(n - shared);
    LocalStacks*& local = g_local_stacks[local_key_cache(head.stack)];
    if (!local) local = static_cast<LocalStacks*>(raw_map(sizeof(LocalStacks)));
    if (!local) return count;
    // Its shared frames are known only if the writer kept the stack before
    // (it had no memory for this cache's entries then): else "no stack",
    // and so for the definitions that build on this one.
    if (n > kDefinedRoom || shared > n || shared > local->last.n) {
        local->last.n = 0;
        local->ids[local_key_index(head.stack)] = 0;
        return count;
    }
    uint64_t* ips = local->last.ips + kDefinedRoom - n;
    for (uint64_t i = 1; i < count; ++i) {
        uint32_t from = static_cast<uint32_t>(i - 1) * kIpsPerDefSlot;
        uint32_t take = std::min(n - shared - from, kIpsPerDefSlot);
        memcpy(ips + from, stack_def_ips(ring.slots[(at + i) % kRingSlots]), sizeof(uint64_t) * take);
    }
    local->last.n = n;
    note_writer_interned();
    uint32_t id = intern_defined(ips, n, head.addr);
    if (id > g_highest_defined) {  // new, or interned elsewhere and maybe not yet queued
        g_highest_defined = id;
        put_queued_metadata();
    }
    local->ids[local_key_index(head.stack)] = id;
    // The allocation that made the walk mostly comes next: its info's line,
    // which the round's prefetch could not find before the id was known.
    if (at + count < end) {
        const Slot& next = ring.slots[(at + count) % kRingSlots];
        if (next.kind == SlotKind::Alloc && next.stack == head.stack)
            alloc_infos_prefetch(next.addr, true, static_cast<hslog::AllocFn>(next.fn), next.size, id);
    }
    return count;
}

// The free of a live block, by the name the log gave it: its info id, or
// its address if it was written as AllocAt.
void put_known_free(codec::Writer& w, uint32_t name, uint64_t addr) {
    if (name == kAddressedBlock)
        hslog::put_free_at(w, advance_addr(addr));
    else
        hslog::put_free(w, name);
}

void encode_alloc(codec::Writer& w, const Slot& s, uint32_t stack) {
    auto fn = static_cast<hslog::AllocFn>(s.fn);
    InfoAlloc b = alloc_infos_alloc(s.addr, fn, s.size, stack);
    if (!b.ok) {
        fail(": out of memory for the allocation-info tables; recording stopped");
        return;
    }
    if (b.replaced) {  // its free was never seen: free it explicitly, as the reader must
        put_known_free(w, b.replaced, s.addr);
        g_enc.events++;
    }
    if (b.info == kAddressedBlock)
        hslog::put_alloc_at(w, fn, advance_addr(s.addr), s.size, stack);
    else if (b.fresh)
        hslog::put_alloc(w, fn, s.size, stack);
    else
        hslog::put_alloc_info(w, b.info);
    g_enc.events++;
}

void encode_free(codec::Writer& w, const Slot& s) {
    if (uint32_t name = alloc_infos_free(s.addr))
        put_known_free(w, name, s.addr);
    else
        hslog::put_free_unknown(w, advance_addr(s.addr), s.size);
    g_enc.events++;
}

void encode(const Slot& s) {
    uint32_t stack = s.stack;
    if (s.kind == SlotKind::Alloc && stack == kDeferredStack)
        stack = intern_deferred(s);
    else if ((s.kind == SlotKind::Alloc || s.kind == SlotKind::Mmap) && is_local_key(stack))
        stack = local_stack_id(stack);
    if (s.kind == SlotKind::Alloc && is_local_key(s.stack) && s.aux) note_stack_verified(stack == s.aux);
    codec::Writer w = reserve(2 * hslog::kMaxEventRecord + 2 + 2 * codec::kMaxVarint);
    if (s.thread != g_enc.stream_thread && s.kind != SlotKind::Marker) {
        hslog::put_thread(w, s.thread);
        g_enc.stream_thread = s.thread;
    }
    switch (s.kind) {
        case SlotKind::Alloc:
            event_time(w, ticks_to_ns(s.ts));
            encode_alloc(w, s, stack);
            break;
        case SlotKind::Free:
            event_time(w, ticks_to_ns(s.ts));
            encode_free(w, s);
            break;
        case SlotKind::Mmap:
            event_time(w, ticks_to_ns(s.ts));
            hslog::put_mmap(w, advance_addr(s.addr), s.size, s.fn, s.aux, stack);
            g_enc.events++;
            break;
        case SlotKind::Munmap:
            event_time(w, ticks_to_ns(s.ts));
            hslog::put_munmap(w, advance_addr(s.addr), s.size);
            g_enc.events++;
            break;
        case SlotKind::ThreadStart:
            hslog::put_thread_start(w, advance_time(ticks_to_ns(s.ts)), s.thread, s.aux, s.addr, s.addr + s.size);
            break;
        case SlotKind::ThreadExit:
            hslog::put_thread_exit(w, advance_time(ticks_to_ns(s.ts)), s.thread);
            break;
        case SlotKind::StackDef:  // taken apart by the round (take_stack_def)
        case SlotKind::Void:      // skipped by the round
            break;
        case SlotKind::Marker: {
            commit(w);
            auto* payload = reinterpret_cast<uint8_t*>(s.addr);
            codec::Writer m = reserve(2 + 5 * codec::kMaxVarint + s.size);
            hslog::put_marker_header(m, advance_time(ticks_to_ns(s.ts)), s.thread, g_enc.events, s.stack);
            m.varint(++g_enc.marker_count);
            if (s.size <= m.room()) m.raw(payload, s.size);
            commit(m);
            g_marker_tokens[s.aux % kTokenMemory].store(uint64_t{s.aux} << 32 | g_enc.marker_count,
                                                        std::memory_order_release);
            g_enc.frame_max_marker = g_enc.marker_count;
            release_marker_payload(payload, s.size);
            flush_frame();
            return;
        }
    }
    commit(w);
}

bool ensure_cursor_capacity(size_t n) {
    if (n <= g_cursor_capacity) return true;
    size_t capacity = std::max<size_t>(64, n * 2);
    auto* fresh = static_cast<Cursor*>(raw_map(capacity * sizeof(Cursor)));
    if (!fresh) return false;
    raw_unmap(g_cursors, g_cursor_capacity * sizeof(Cursor));
    g_cursors = fresh;
    g_cursor_capacity = capacity;
    return true;
}

const Slot& at(const Cursor& c) { return c.ring->slots[c.pos % kRingSlots]; }

// How many events ahead of the one being encoded the writer prefetches
// the table lines its lookups will touch (alloc_infos_prefetch): enough to
// cover a miss at ~30 ns an event.
constexpr uint64_t kPrefetchAhead = 8;

// `s` may be a StackDef's frames, read as a slot: only a hint either way.
void prefetch_tables(const Slot& s) {
    if (s.kind != SlotKind::Alloc && s.kind != SlotKind::Free) return;
    uint32_t stack = is_local_key(s.stack) ? local_stack_id(s.stack) : s.stack;
    alloc_infos_prefetch(s.addr, s.kind == SlotKind::Alloc, static_cast<hslog::AllocFn>(s.fn), s.size, stack);
}

// Order of two events with the same stamp: releases first, so that an
// address freed and reused within one clock tick replays as free, alloc.
int kind_rank(SlotKind k) { return (k == SlotKind::Free || k == SlotKind::Munmap) ? 0 : 1; }

bool later(const Cursor& a, const Cursor& b) {
    const Slot& x = at(a);
    const Slot& y = at(b);
    if (x.ts != y.ts) return x.ts > y.ts;
    return kind_rank(x.kind) > kind_rank(y.kind);
}

// One merge round: everything stamped below the watermark is final.
// Returns the number of events emitted.
size_t round_locked() {
    recalibrate_clock();
    uint64_t watermark = UINT64_MAX;
    size_t n = 0;
    {
        LockGuard guard(registry_lock());
        size_t rings = 0;
        for (ThreadRing* r = ring_list(); r; r = r->next) ++rings;
        if (!ensure_cursor_capacity(rings)) return 0;
        // Under the registry lock, so that a ring registered after this
        // scan stamps after this reading (thread_buffer.h, "One ring").
        uint64_t clock = now_ticks();
        order_after_clock_read(rings > 1);
        for (ThreadRing* r = ring_list(); r; r = r->next) {
            bool busy = r->in_flight.load(std::memory_order_seq_cst) != 0;
            uint64_t head = r->head.load(std::memory_order_acquire);
            uint64_t tail = r->tail.load(std::memory_order_relaxed);
            uint64_t bound = clock;
            if (busy) bound = head > tail ? r->slots[(head - 1) % kRingSlots].ts : r->last_ts;
            watermark = std::min(watermark, bound);
            g_cursors[n++] = Cursor{r, tail, head};
        }
    }
    {
        LockGuard guard(metadata_lock());
        rescan_modules(false);
    }
    put_queued_metadata();
    // A min-heap of the rings that have an event below the watermark.
    Cursor* heap = g_cursors;
    size_t live = 0;
    for (size_t i = 0; i < n; ++i)
        if (g_cursors[i].pos < g_cursors[i].end && at(g_cursors[i]).ts < watermark) heap[live++] = g_cursors[i];
    // Cursors not in the heap keep their tail untouched; only heap members move.
    std::make_heap(heap, heap + live, later);
    size_t emitted = 0;
    while (live) {
        std::pop_heap(heap, heap + live, later);
        Cursor& c = heap[live - 1];
        // Emit the run of this ring that precedes every other ring's next
        // event: one heap operation per run, not per event (a single busy
        // thread is one long run).
        const Cursor* next = live > 1 ? &heap[0] : nullptr;
        do {
            if (c.pos + kPrefetchAhead < c.end) prefetch_tables(c.ring->slots[(c.pos + kPrefetchAhead) % kRingSlots]);
            const Slot& s = at(c);
            c.ring->last_ts = s.ts;
            if (s.kind >= SlotKind::StackDef) {  // not an event: a stack definition, or a Void slot
                c.pos += s.kind == SlotKind::StackDef ? take_stack_def(*c.ring, c.pos, c.end) : 1;
            } else {
                encode(s);
                c.pos++;
            }
            emitted++;
            if ((emitted & 1023) == 0) c.ring->tail.store(c.pos, std::memory_order_release);
        } while (c.pos < c.end && at(c).ts < watermark && !(next && later(c, *next)));
        if (c.pos < c.end && at(c).ts < watermark) {
            std::push_heap(heap, heap + live, later);
        } else {
            c.ring->tail.store(c.pos, std::memory_order_release);
            live--;
        }
    }
    recycle_drained_rings();
    if (g_enc.frame_used && now_ns() - g_enc.last_flush_ns >= kFlushIntervalNs) end_frame();
    return emitted;
}

// Returns whether a control descriptor is ready. A descriptor the poll
// finds closed (POLLNVAL: the program closed it with the system call,
// past the hooks) ends recording; polling it again would return at once,
// for ever.
bool wait_for_work(uint64_t timeout_ns) {
    OwnFdUse use;
    pollfd fds[16];
    nfds_t count = 0;
    fds[count++] = pollfd{g_wake_fd.load(std::memory_order_acquire), POLLIN, 0};
    count += static_cast<nfds_t>(control_poll_fds(fds + 1, 15));
    g_sleeping.set.store(true, std::memory_order_seq_cst);
    timespec timeout{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
    int r = ppoll(fds, count, &timeout, nullptr);
    g_sleeping.set.store(false, std::memory_order_relaxed);
    for (nfds_t i = 0; r > 0 && i < count; ++i)
        if (fds[i].revents & POLLNVAL) {
            LockGuard guard(g_writer_lock);
            fail(": a descriptor of the recorder's was closed by the program; recording stopped");
            return false;
        }
    if (r > 0 && (fds[0].revents & POLLIN)) {
        uint64_t value;
        ssize_t ignored = read(fds[0].fd, &value, sizeof value);
        (void)ignored;
    }
    bool control_ready = false;
    for (nfds_t i = 1; r > 0 && i < count; ++i) control_ready = control_ready || fds[i].revents;
    return control_ready;
}

// A `detach` request's connection (control.cpp), -1 if none: the writer
// leaves its loop and ends the log (end_detached).
std::atomic<int> g_detach_fd{-1};
// The writer thread left by itself after a detach: the next start joins it
// before reusing its stack.
std::atomic<bool> g_writer_unjoined{false};

void end_detached();

void* writer_main(void*) {
    thread_state().internal = 1;
    // Created with every signal blocked (LockGuard); glibc's own two
    // (cancellation, setxid) are opened: setuid in another thread waits
    // for every thread to take its signal.
    signals_blocked_for_good();
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    prctl(PR_SET_NAME, "heapsnap-writer");  // tells it apart in top and perf
    uint64_t next_interval = 0;
    const uint64_t interval_ns = static_cast<uint64_t>(config().interval_s * 1e9);
    if (interval_ns) next_interval = now_ns() + interval_ns;
    // The last round emitted events: the writer naps for one stamp tick
    // only, and the tick is fresh meanwhile (thread_buffer.h, "One thread").
    bool busy = false;
    while (!g_stop.load(std::memory_order_acquire) && !g_failed.load(std::memory_order_acquire) &&
           g_detach_fd.load(std::memory_order_acquire) < 0) {
        uint64_t timeout_ns = busy ? kStampTickNs : kIdleWaitMs * 1'000'000ull;
        if (interval_ns) {
            uint64_t now = now_ns();
            if (now >= next_interval) {
                g_interval_busy.store(true, std::memory_order_seq_cst);
                if (!g_intervals_closed.load(std::memory_order_seq_cst))
                    take_marker(hslog::MarkerCause::Interval, "interval");
                g_interval_busy.store(false, std::memory_order_release);
                next_interval += interval_ns;
                if (next_interval <= now) next_interval = now + interval_ns;
            }
            timeout_ns = std::min(timeout_ns, next_interval - std::min(next_interval, now_ns()));
        }
        bool compressing = false;
        {
            LockGuard guard(g_writer_lock);
            compress_more(kCompressPiece);
            compressing = g_compressing.frame != nullptr;
            if (busy) stamp_tick_advance();
        }
        if (compressing) timeout_ns = 0;  // the rest of the frame after the next round
        // A busy writer wakes every stamp tick: accept4 on every wake was
        // a failed syscall per round (3 500 on a 2 s compile).
        if (wait_for_work(timeout_ns) || control_reading()) {
            {
                LockGuard guard(g_writer_lock);
                stamp_tick_make_stale();  // control requests and markers may take long
            }
            control_poll();
        }
        {
            LockGuard guard(g_writer_lock);
            stamp_tick_advance();
            busy = round_locked() > 0;
            stamp_tick_make_stale();
        }
        control_reply_durable(g_durable_marker.load(std::memory_order_acquire));
    }
    if (g_detach_fd.load(std::memory_order_acquire) >= 0) end_detached();
    return nullptr;
}

// CLOCK_REALTIME when the log began, as its Process record says; guarded
// by g_writer_lock.
uint64_t g_start_realtime_ns = 0;

void write_process_record(codec::Writer& w) {
    w.u8(static_cast<uint8_t>(hslog::Tag::Process));
    w.str(HEAPSNAP_RECORDER_VERSION);
    w.varint(static_cast<uint64_t>(getpid()));
    w.varint(static_cast<uint64_t>(getppid()));
    w.varint(getuid());
    timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    g_start_realtime_ns = static_cast<uint64_t>(real.tv_sec) * 1000000000ull + static_cast<uint64_t>(real.tv_nsec);
    w.varint(g_start_realtime_ns);
    w.varint(start_time_ns());
    w.varint(static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
    w.u8(static_cast<uint8_t>(config().unwind));
    w.varint(config().depth);
    w.str(exe_path());
    // The command line, NUL-separated as the kernel keeps it.
    char cmdline[8192];
    size_t len = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t r;
        while (len < sizeof cmdline && (r = read(fd, cmdline + len, sizeof cmdline - len)) > 0)
            len += static_cast<size_t>(r);
        close_own(fd);
    }
    w.bytes(cmdline, len);
    w.varint(config().sample_bytes);
    w.u8(attached() ? 1 : 0);
}

// Expands %p (pid), %e (executable name) and %% in the pattern.
bool expand_pattern(const char* pattern, char* out, size_t cap) {
    const char* exe = exe_path();
    const char* slash = strrchr(exe, '/');
    const char* exe_name = slash ? slash + 1 : exe;
    if (!*exe_name) exe_name = "unknown";
    size_t n = 0;
    auto put = [&](const char* s) {
        for (; *s; ++s) {
            if (n + 1 >= cap) return false;
            out[n++] = *s;
        }
        return true;
    };
    char pid[24];
    format_uint(static_cast<uint64_t>(getpid()), pid);
    for (const char* p = pattern; *p; ++p) {
        char one[2] = {*p, 0};
        bool ok = true;
        if (*p == '%' && p[1] == 'p') {
            ok = put(pid);
            ++p;
        } else if (*p == '%' && p[1] == 'e') {
            ok = put(exe_name);
            ++p;
        } else if (*p == '%' && p[1] == '%') {
            ok = put("%");
            ++p;
        } else {
            ok = put(one);
        }
        if (!ok) return false;
    }
    out[n] = 0;
    return true;
}

bool make_absolute(char* path, size_t cap) {
    if (path[0] == '/') return true;
    char cwd[kMaxPathLen];
    if (!getcwd(cwd, sizeof cwd)) return false;
    size_t a = strlen(cwd), b = strlen(path);
    if (a + 1 + b + 1 > cap) return false;
    memmove(path + a + 1, path, b + 1);
    memcpy(path, cwd, a);
    path[a] = '/';
    return true;
}

// O_EXCL: never reuse or follow someone else's file; if the name is taken
// (a re-exec of the same program with the same pid), add -1, -2, ...
// O_RDWR: the descriptor is also handed to snapshot clients, who read the
// log through it (control.cpp). O_APPEND: every write lands at the end
// whatever the file offset; write_all never depends on the offset.
constexpr int kLogFlags = O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

int create_log(char* path, size_t cap) {
    int fd = open(path, kLogFlags, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
    size_t len = strlen(path);
    const char* dot = strrchr(path, '.');
    const char* slash = strrchr(path, '/');
    size_t stem = (dot && (!slash || dot > slash)) ? static_cast<size_t>(dot - path) : len;
    char ext[64] = "";
    if (len - stem < sizeof ext) memcpy(ext, path + stem, len - stem + 1);
    char base[kMaxPathLen];
    memcpy(base, path, stem);
    base[stem] = 0;
    for (int i = 1; i < 1000; ++i) {
        char num[16];
        int k = 0;
        for (int v = i; v; v /= 10) num[k++] = static_cast<char>('0' + v % 10);
        char candidate[kMaxPathLen];
        size_t m = 0;
        for (size_t j = 0; base[j] && m + 1 < sizeof candidate; ++j) candidate[m++] = base[j];
        if (m + 1 < sizeof candidate) candidate[m++] = '-';
        while (k && m + 1 < sizeof candidate) candidate[m++] = num[--k];
        for (size_t j = 0; ext[j] && m + 1 < sizeof candidate; ++j) candidate[m++] = ext[j];
        candidate[m] = 0;
        fd = open(candidate, kLogFlags, 0600);
        if (fd >= 0) {
            if (m + 1 <= cap) memcpy(path, candidate, m + 1);
            return fd;
        }
        if (errno != EEXIST) return -1;
    }
    return -1;
}

void announce_path() {
    if (config().paths_file[0]) {
        int fd = open(config().paths_file, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
            size_t n = strlen(g_path);
            char line[kMaxPathLen + 1];
            memcpy(line, g_path, n);
            line[n] = '\n';
            ssize_t ignored = write(fd, line, n + 1);
            (void)ignored;
            close_own(fd);
        }
    }
    if (config().verbose) diagnostic("recording to ", g_path);
}

}  // namespace

bool writer_open() {
    LockGuard guard(g_writer_lock);
    if (!g_frame) {
        g_frame = static_cast<uint8_t*>(raw_map(kFrameBufferBytes));
        g_spare_frame = static_cast<uint8_t*>(raw_map(kFrameBufferBytes));
        g_compressed_capacity = ZSTD_compressBound(kFrameBufferBytes);
        g_compressed = static_cast<uint8_t*>(raw_map(g_compressed_capacity));
        ZSTD_customMem mem{raw_block_alloc, raw_block_free, nullptr};
        g_zstd = ZSTD_createCCtx_advanced(mem);
        if (!g_frame || !g_spare_frame || !g_compressed || !g_zstd) {
            alert("out of memory for the log buffers; recording disabled");
            return false;
        }
        ZSTD_CCtx_setParameter(g_zstd, ZSTD_c_compressionLevel, kZstdLevel);
        ZSTD_CCtx_setParameter(g_zstd, ZSTD_c_checksumFlag, 1);
    }
    if (g_wake_fd.load() < 0) own_fd_adopt(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), &g_wake_fd);
    if (!config().output_pattern[0]) {
        alert("log path too long: HEAPSNAP_OUTPUT is longer than 4095 bytes; recording disabled");
        return false;
    }
    if (!expand_pattern(config().output_pattern, g_path, sizeof g_path) || !make_absolute(g_path, sizeof g_path)) {
        alert("log path too long: ", config().output_pattern, "; recording disabled");
        return false;
    }
    int fd = create_log(g_path, sizeof g_path);
    if (fd < 0) {
        char reason[128] = ": ";
        strncat(reason, strerror(errno), sizeof reason - 3);
        alert("cannot create log ", g_path, reason, "; recording disabled");
        return false;
    }
    // The identity before the descriptor: a uid-change hook that sees the
    // descriptor sees its identity too.
    struct stat st;
    if (fstat(fd, &st) == 0) {
        g_log_dev = st.st_dev;
        g_log_ino = st.st_ino;
    }
    g_log_pid = getpid();
    own_fd_adopt(fd, &g_fd);
    uint8_t header[hslog::kHeaderSize];
    codec::Writer h(header, sizeof header);
    h.raw(hslog::kMagic, sizeof hslog::kMagic);
    h.u32le(hslog::kLogVersion);
    h.u32le(0);
    if (!write_all(header, sizeof header)) {
        alert("cannot write log ", g_path, "; recording disabled");
        close_own(g_fd);
        g_fd = -1;
        return false;
    }
    g_failed = false;
    g_ended = false;
    g_enc = Encoder{};
    g_enc.stream_ts = start_time_ns() / hslog::kTimeUnitNs;
    g_enc.last_flush_ns = now_ns();
    alloc_infos_reset();
    g_durable_marker.store(0);
    codec::Writer w = reserve(16384);
    write_process_record(w);
    commit(w);
    // On disk at once: a process that dies (_exit, SIGKILL) before the
    // first timed flush still leaves a log that says what it was.
    flush_frame();
    announce_path();
    return true;
}

namespace {

// Runs fn() holding g_thread_lock (with signals blocked: the writer
// thread inherits that mask, so signals go to the program's threads).
template <class Fn>
void with_thread_lock(Fn&& fn) {
    LockGuard lifecycle(g_thread_lock);
    fn();
}

void start_writer_thread_locked() {
    if (g_running.load() || g_fd < 0) return;
    if (g_writer_unjoined.exchange(false)) {  // gone since its detach; its stack is free once joined
        thread_state().internal++;
        pthread_join(g_thread, nullptr);
        thread_state().internal--;
    }
    g_stop.store(false);
    control_open();
    // The writer runs on a stack of our own mapping: it shows as recorder
    // memory, and no malloc arena is ever created for the writer thread
    // (it never calls malloc). Mapped once: a writer started again after
    // a pause (the last thread's exit) runs on the stack of the one joined.
    if (!g_writer_stack) g_writer_stack = raw_map(kWriterStackBytes);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (g_writer_stack) pthread_attr_setstack(&attr, g_writer_stack, kWriterStackBytes);
    thread_state().internal++;
    int err = pthread_create(&g_thread, &attr, writer_main, nullptr);
    thread_state().internal--;
    pthread_attr_destroy(&attr);
    if (!err) g_running.store(true);
}

}  // namespace

bool writer_start_thread() {
    with_thread_lock([] { start_writer_thread_locked(); });
    return g_running.load();
}

void writer_close_intervals() {
    g_intervals_closed.store(true, std::memory_order_seq_cst);
    while (g_interval_busy.load(std::memory_order_seq_cst)) sched_yield();
}

bool writer_running() { return g_running.load(std::memory_order_acquire); }

void writer_wake() {
    if (!g_sleeping.set.load(std::memory_order_relaxed) || !g_sleeping.set.exchange(false)) return;
    wake_now();
}


void writer_drain_inline() {
    LockGuard guard(g_writer_lock);
    if (g_fd < 0) return;
    round_locked();
    compress_more(SIZE_MAX);  // no writer thread to go on with it
}

void writer_take_published() {
    const ThreadState& t = thread_state();
    if (!t.ring) return;
    const ThreadRing& ring = *t.ring;
    uint64_t head = ring.head.load(std::memory_order_relaxed);
    // Other threads go on publishing meanwhile: wait for this one's events
    // only, and not for ever (another thread inside a hook holds the
    // watermark back only briefly).
    for (int idle = 0; idle < 1000 && ring.tail.load(std::memory_order_acquire) < head;) {
        size_t emitted = 0;
        {
            LockGuard guard(g_writer_lock);
            if (g_fd < 0 || g_ended) return;
            emitted = round_locked();
        }
        if (emitted) continue;
        ++idle;
        timespec pause{0, 100000};
        nanosleep(&pause, nullptr);
    }
}

namespace {

// Joins the writer thread (if it runs) and closes the control socket.
void stop_writer_thread() {
    with_thread_lock([] {
        if (g_running.exchange(false)) {
            g_stop.store(true, std::memory_order_release);
            wake_now();
            // pthread_join frees the writer's TLS block: the recorder's
            // memory, not a free of the program's.
            thread_state().internal++;
            pthread_join(g_thread, nullptr);
            thread_state().internal--;
        }
        control_close();
    });
}

// Drains until every published event is written; another thread that is
// still inside a hook holds the watermark back only briefly.
void drain_published_locked() {
    for (int idle = 0; idle < 200;) {
        if (round_locked()) {
            idle = 0;
            continue;
        }
        bool pending = false;
        for_each_ring([&](ThreadRing& r) {
            if (r.tail.load(std::memory_order_relaxed) != r.head.load(std::memory_order_acquire)) pending = true;
        });
        if (!pending) break;
        ++idle;
        timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
    }
}

// `heapsnap detach` (attach.h), on the writer thread, which leaves
// afterwards: the hooks are unbound, the `detach` marker taken, then
// everything published is written with the End record (reason 2), the
// client answered, the log and the control socket closed.
void end_detached() {
    int client = g_detach_fd.load(std::memory_order_acquire);
    unbind_hooks();
    stop_attached();
    {
        LockGuard guard(g_writer_lock);
        if (g_fd >= 0 && !g_ended) {
            drain_published_locked();
            codec::Writer w = reserve(2 + 3 * codec::kMaxVarint);
            hslog::put_end(w, advance_time(now_ns()), hslog::EndReason::Shutdown, g_enc.events, unrecorded_events());
            commit(w);
            flush_frame();
            g_ended = true;
        }
        control_reply_detached(client);
        if (g_fd >= 0) close_own(g_fd);
        g_fd = -1;
    }
    control_close();
    g_detach_fd.store(-1, std::memory_order_release);
    // Not under g_thread_lock: a thread that stops the writer holds it
    // while it joins this one. A thread that finds g_running still set
    // joins it; otherwise the next start does.
    g_writer_unjoined.store(true, std::memory_order_relaxed);
    if (!g_running.exchange(false)) g_writer_unjoined.store(false, std::memory_order_relaxed);
}

}  // namespace

bool writer_request_detach(int fd) {
    int none = -1;
    return g_detach_fd.compare_exchange_strong(none, fd);
}

void writer_pause() {
    stop_writer_thread();
    LockGuard guard(g_writer_lock);
    if (g_fd < 0 || g_ended) return;
    drain_published_locked();
    flush_frame();
}

void writer_stop(hslog::EndReason reason) {
    stop_writer_thread();
    LockGuard guard(g_writer_lock);
    if (g_fd < 0 || g_ended) return;
    drain_published_locked();
    codec::Writer w = reserve(2 + 3 * codec::kMaxVarint);
    hslog::put_end(w, advance_time(now_ns()), reason, g_enc.events, unrecorded_events());
    commit(w);
    flush_frame();
    g_ended = true;
    close_own(g_fd);
    g_fd = -1;
}

bool writer_discard_if_empty() {
    stop_writer_thread();
    LockGuard guard(g_writer_lock);
    if (g_fd < 0 || g_ended) return false;
    drain_published_locked();
    if (g_enc.events || g_enc.marker_count) return false;
    // Unlinked by name only if the name is still the file written.
    struct stat ours, named;
    bool same = fstat(g_fd, &ours) == 0 && lstat(g_path, &named) == 0 && ours.st_dev == named.st_dev &&
                ours.st_ino == named.st_ino;
    if (same) unlink(g_path);
    g_ended = true;
    close_own(g_fd);
    g_fd = -1;
    return same;
}

void writer_forget_after_fork() {
    own_fds_forget_after_fork();
    g_writer_lock.reset();
    g_thread_lock.reset();
    raw_forget_after_fork();
    g_running.store(false);
    g_stop.store(false);
    g_intervals_closed.store(false);
    g_interval_busy.store(false);
    if (g_fd >= 0) close_own(g_fd);
    g_fd = -1;
    g_enc.frame_used = 0;
    g_compressing = Compressing{};
    if (g_wake_fd >= 0) close_own(g_wake_fd);
    g_wake_fd = -1;
    control_forget_after_fork();
}

const char* writer_log_path() { return g_path; }

int writer_log_fd() { return g_fd.load(std::memory_order_relaxed); }

LogStatus writer_log_status() {
    LockGuard guard(g_writer_lock);
    return LogStatus{g_enc.events, g_start_realtime_ns};
}

// getpid, fstat and fchown only: async-signal-safe, no allocation, no
// lock (a signal handler may change uid while its thread holds the writer
// lock). The descriptor is checked to still be the log: one closed at exit
// meanwhile might have been reused by the program.
int64_t writer_give_log(uid_t uid) {
    OwnFdUse use;
    int fd = g_fd.load(std::memory_order_acquire);
    if (fd < 0 || uid == static_cast<uid_t>(-1) || getpid() != g_log_pid) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != g_log_dev || st.st_ino != g_log_ino || st.st_uid == uid) return -1;
    if (fchown(fd, uid, static_cast<gid_t>(-1)) != 0) return -1;
    return st.st_uid;
}

void writer_take_log_back(int64_t owner) {
    OwnFdUse use;
    int fd = g_fd.load(std::memory_order_acquire);
    if (owner < 0 || fd < 0 || getpid() != g_log_pid) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != g_log_dev || st.st_ino != g_log_ino) return;
    int ignored = fchown(fd, static_cast<uid_t>(owner), static_cast<gid_t>(-1));
    (void)ignored;
}

uint32_t writer_durable_marker() { return g_durable_marker.load(std::memory_order_acquire); }

uint32_t writer_marker_index(uint32_t token) {
    uint64_t entry = g_marker_tokens[token % kTokenMemory].load(std::memory_order_acquire);
    return (entry >> 32) == token ? static_cast<uint32_t>(entry) : 0;
}

}  // namespace heapsnap::recorder
