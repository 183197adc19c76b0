#include "recorder/record_encoder.h"

#include <fcntl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "recorder/alloc_infos.h"
#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/markers.h"
#include "recorder/metadata_queue.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"
#include "recorder/raw_alloc.h"
#include "recorder/spinlock.h"
#include "recorder/stack_table.h"
#include "recorder/unwind.h"

namespace heapsnap::recorder {
namespace {

// The stream state, changed on every record, on lines of its own: the
// hooks read flags and counters on every event, and a line they shared
// with these would move between the cores each time (false sharing: it
// made every hook wait for the line).
struct alignas(64) Encoder {
    uint64_t stream_ts = 0;
    uint64_t stream_addr = 0;
    uint32_t stream_thread = UINT32_MAX;
    uint64_t events = 0;
    uint32_t marker_count = 0;
};
Encoder g_enc;
// CLOCK_REALTIME when the log began, as its Process record says.
uint64_t g_start_realtime_ns = 0;

void put_raw_record(const uint8_t* data, size_t n) {
    codec::Writer w = frame_reserve(n);
    if (n > w.room()) return;  // larger than a frame buffer: cannot happen for recorder-made records
    w.raw(data, n);
    frame_commit(w);
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

// Stack records encoded per hold of the metadata lock (a record of a deep
// stack takes thousands of instructions). Program threads take that lock
// only for a marker or a module loaded or unloaded since the last scan
// (inserting a stack has its own lock, stack_table.h), so the holds need
// not be short, only bounded.
constexpr uint32_t kStacksPerHold = 32;

}  // namespace

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

namespace {

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
// program's threads kept such a memo when they interned). The writer's
// cycles are not free: on a machine of few cores they are taken from the
// program's.
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

}  // namespace

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

namespace {

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
        fail_log(": out of memory for the allocation-info tables; recording stopped");
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

}  // namespace

void encode(const Slot& s) {
    uint32_t stack = s.stack;
    if (s.kind == SlotKind::Alloc && stack == kDeferredStack)
        stack = intern_deferred(s);
    else if ((s.kind == SlotKind::Alloc || s.kind == SlotKind::Mmap) && is_local_key(stack))
        stack = local_stack_id(stack);
    if (s.kind == SlotKind::Alloc && is_local_key(s.stack) && s.aux) note_stack_verified(stack == s.aux);
    codec::Writer w = frame_reserve(2 * hslog::kMaxEventRecord + 2 + 2 * codec::kMaxVarint);
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
        case SlotKind::ThreadExit: hslog::put_thread_exit(w, advance_time(ticks_to_ns(s.ts)), s.thread); break;
        case SlotKind::StackDef:  // taken apart by the round (take_stack_def)
        case SlotKind::Void:      // skipped by the round
            break;
        case SlotKind::Marker: {
            frame_commit(w);
            auto* payload = reinterpret_cast<uint8_t*>(s.addr);
            codec::Writer m = frame_reserve(2 + 5 * codec::kMaxVarint + s.size);
            hslog::put_marker_header(m, advance_time(ticks_to_ns(s.ts)), s.thread, g_enc.events, s.stack);
            m.varint(++g_enc.marker_count);
            if (s.size <= m.room()) m.raw(payload, s.size);
            frame_commit(m);
            marker_written(s.aux, g_enc.marker_count);
            release_marker_payload(payload, s.size);
            flush_frame();
            return;
        }
    }
    frame_commit(w);
}

// `s` may be a StackDef's frames, read as a slot: only a hint either way.
void prefetch_tables(const Slot& s) {
    if (s.kind != SlotKind::Alloc && s.kind != SlotKind::Free) return;
    uint32_t stack = is_local_key(s.stack) ? local_stack_id(s.stack) : s.stack;
    alloc_infos_prefetch(s.addr, s.kind == SlotKind::Alloc, static_cast<hslog::AllocFn>(s.fn), s.size, stack);
}

void put_process_record() {
    codec::Writer w = frame_reserve(16384);
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
    frame_commit(w);
}

void put_end_record(hslog::EndReason reason) {
    codec::Writer w = frame_reserve(2 + 3 * codec::kMaxVarint);
    hslog::put_end(w, advance_time(now_ns()), reason, g_enc.events, unrecorded_events());
    frame_commit(w);
}

void encoder_start_log() {
    g_enc = Encoder{};
    g_enc.stream_ts = start_time_ns() / hslog::kTimeUnitNs;
    alloc_infos_reset();
}

uint64_t events_encoded() { return g_enc.events; }

uint32_t markers_encoded() { return g_enc.marker_count; }

uint64_t log_start_realtime_ns() { return g_start_realtime_ns; }

}  // namespace heapsnap::recorder
