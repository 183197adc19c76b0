#include "recorder/markers.h"

#include <malloc.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>

#include "addrspace/smaps_capture.h"
#include "recorder/allocator.h"
#include "recorder/lifecycle.h"
#include "recorder/modules.h"
#include "recorder/raw_alloc.h"
#include "recorder/thread_buffer.h"
#include "recorder/writer.h"

namespace heapsnap::recorder {
namespace {

constexpr size_t kPayloadBytes = 8u << 20;
constexpr size_t kScratchBytes = 64u << 10;
constexpr size_t kMaxLabel = 256;
// Worst case of one encoded region without its path.
constexpr size_t kRegionFixed = 2 + 9 * codec::kMaxVarint;

std::atomic<uint32_t> g_next_token{1};

struct RegionSink {
    codec::Writer* out;
    uint32_t count;
    uint64_t prev_end;
    bool overflow;
    // The marker's own buffers, mapped only while it is taken: left out.
    uint64_t own_start;
    uint64_t own_end;
};

void put_region(const addrspace::RawRegion& r, void* ctx) {
    auto& sink = *static_cast<RegionSink*>(ctx);
    if (r.start >= sink.own_start && r.end <= sink.own_end) return;
    if (sink.overflow || sink.out->room() < kRegionFixed + codec::kMaxVarint + r.path_len) {
        sink.overflow = true;
        return;
    }
    codec::Writer& w = *sink.out;
    w.svarint(static_cast<int64_t>(r.start - sink.prev_end));
    w.varint(r.end - r.start);
    w.u8(r.perms);
    hslog::RegionHint hint = hslog::RegionHint::None;
    if (overlaps_recorder(r.start, r.end))
        hint = hslog::RegionHint::Recorder;
    else if (overlaps_allocator_mapping(r.start, r.end))
        hint = hslog::RegionHint::Heap;
    w.u8(static_cast<uint8_t>(hint));
    w.varint(r.offset);
    w.varint(r.inode);
    w.bytes(r.path, r.path_len);
    w.varint(r.rss_kb);
    w.varint(r.pss_kb);
    w.varint(r.private_dirty_kb);
    w.varint(r.swap_kb);
    sink.prev_end = r.end;
    sink.count++;
}

}  // namespace

uint32_t take_marker(hslog::MarkerCause cause, const char* label) {
    if (!recorder_active()) return 0;
    // Nothing here allocates through the hooks, so `internal` stays down: a
    // signal handler's events meanwhile are recorded (thread_state.h).
    // One mapping for both buffers, kept apart from every other by
    // MADV_DONTFORK (the kernel merges only neighbours with the same
    // flags), so the smaps it reads show it as one region to leave out.
    auto* payload = static_cast<uint8_t*>(raw_map(kPayloadBytes + kScratchBytes));
    char* scratch = payload ? reinterpret_cast<char*>(payload + kPayloadBytes) : nullptr;
    if (payload) madvise(payload, kPayloadBytes + kScratchBytes, MADV_DONTFORK);
    uint32_t index = 0;
    if (payload) {
        index = g_next_token.fetch_add(1, std::memory_order_relaxed);
        if (!index) index = g_next_token.fetch_add(1, std::memory_order_relaxed);
        // The module list is brought up to date at every marker, so a
        // dlclose shows in the log even when no new stack follows it.
        {
            LockGuard guard(metadata_lock());
            rescan_modules(false);
        }
        codec::Writer w(payload, kPayloadBytes);
        w.u8(static_cast<uint8_t>(cause));
        size_t label_len = label ? strnlen(label, kMaxLabel) : 0;
        w.bytes(label ? label : "", label_len);
        uint64_t rss_kb = 0;
        uint32_t threads = 0;
        addrspace::read_status("/proc/self/status", scratch, kScratchBytes, &rss_kb, &threads);
        w.varint(rss_kb);
        // The program's threads: the writer thread is the recorder's.
        if (writer_running() && threads > 0) threads--;
        w.varint(threads);
        uint64_t held = raw_mapped_bytes();
        w.varint(held > kPayloadBytes + kScratchBytes ? held - kPayloadBytes - kScratchBytes : 0);
        // mallinfo2 walks every free chunk malloc holds, which the exit
        // marker would add to every recorded run's time (formats/hslog.md,
        // "Version 5"): only the markers asked for carry it.
        // Another allocator's statistics cost a few lookups: every marker
        // has them. glibc's are never shown for another allocator's heap.
        hslog::AllocatorStats stats;
        bool with_malloc = cause != hslog::MarkerCause::Exit && allocator_kind() == hslog::AllocatorKind::Glibc;
        if (allocator_kind() != hslog::AllocatorKind::Glibc && read_allocator_stats(stats)) {
            hslog::put_allocator_stats(w, stats);
        } else if (!with_malloc) {
            w.u8(static_cast<uint8_t>(hslog::MarkerStats::None));
        } else {
            w.u8(static_cast<uint8_t>(hslog::MarkerStats::Mallinfo));
            struct mallinfo2 mi = mallinfo2();
            w.varint(mi.arena);
            w.varint(mi.ordblks);
            w.varint(mi.hblks);
            w.varint(mi.hblkhd);
            w.varint(mi.uordblks);
            w.varint(mi.fordblks);
            w.varint(mi.keepcost);
        }
        uint8_t* count_at = payload + w.size();
        w.u32le(0);
        auto own = reinterpret_cast<uint64_t>(payload);
        RegionSink sink{&w, 0, 0, false, own, own + kPayloadBytes + kScratchBytes};
        addrspace::capture_smaps("/proc/self/smaps", scratch, kScratchBytes, put_region, &sink);
        codec::Writer patch(count_at, 4);
        patch.u32le(sink.count);
        Slot slot{};
        slot.kind = SlotKind::Marker;
        slot.addr = reinterpret_cast<uint64_t>(payload);
        slot.size = w.size();
        slot.aux = index;
        slot.stack = static_cast<uint32_t>(std::min<uint64_t>(unrecorded_events(), UINT32_MAX));
        if (!emit(slot)) {
            raw_unmap(payload, kPayloadBytes);
            index = 0;
        }
        payload = nullptr;
    }
    raw_unmap(payload, kPayloadBytes + kScratchBytes);
    return index;
}

void release_marker_payload(uint8_t* payload, size_t) { raw_unmap(payload, kPayloadBytes + kScratchBytes); }

}  // namespace heapsnap::recorder
