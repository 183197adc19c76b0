// The .hsnap file: the live heap of one process at one moment, complete
// enough that `diff` and `report` never need the log (spec:
// formats/hsnap.md).
//
// Size grows with the number of live call sites, not with history: one
// entry per (stack, kind) with its live bytes and blocks, the stacks those
// entries use, every module ever loaded (a dlclose'd plugin's leaks still
// symbolize), the live threads, and the marker's data (RSS, mallinfo2,
// smaps regions). Stacks stay unsymbolized (module id + vaddr): symbols are
// resolved by whoever reads, against the binaries and debug files present
// then.
//
// Layout: framed_file.h's container (magic "HSNAPSHT") around the body:
// written to a temporary file in the target directory and renamed over the
// target, so a reader never sees half a snapshot and an existing symlink is
// replaced, not followed.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "format/framed_file.h"
#include "format/log_reader.h"

namespace heapsnap {

// 2: Process has sample_bytes; 3: malloc stats optional; 4: another
// allocator's statistics (hslog::MarkerStats::Allocator); 5: marker causes
// pause, resume and threshold, and the paused site's stack (log version 9);
// 6: Process has `attached`, the totals the frees of blocks allocated
// before recording. Readers take 3 to 6.
inline constexpr uint32_t kSnapshotVersion = 6;
// The first version with `attached` and the freed-before-recording totals.
inline constexpr uint32_t kSnapshotAttachedVersion = 6;
inline constexpr uint32_t kOldestSnapshotVersion = 3;

enum class EntryKind : uint8_t { Heap = 0, Mmap = 1 };

struct SnapshotEntry {
    uint32_t stack = 0;
    EntryKind kind = EntryKind::Heap;
    uint64_t bytes = 0;      // requested bytes (heap) or mapped length (mmap)
    uint64_t blocks = 0;     // live blocks or regions
    uint64_t oldest_ns = 0;  // allocation time of the oldest / newest live block, since process start
    uint64_t newest_ns = 0;
};

struct SnapshotModule {
    ModuleRecord record;
    bool loaded = true;  // false: dlclose'd before the snapshot moment
};

struct SnapshotTotals {
    uint64_t live_bytes = 0;
    uint64_t live_blocks = 0;
    uint64_t mmap_bytes = 0;
    uint64_t mmap_regions = 0;
    uint64_t events = 0;
    uint64_t allocations = 0;      // allocation events up to the moment
    uint64_t untracked_frees = 0;  // frees of blocks the log never saw allocated, of no known size
    uint64_t peak_bytes = 0;       // highest live heap bytes up to the moment
    uint64_t peak_time_ns = 0;
    // Frees of blocks allocated before recording began (an attached
    // recorder's FreeUnknown with a usable size), and those sizes summed.
    uint64_t freed_before_blocks = 0;
    uint64_t freed_before_bytes = 0;
};

struct Snapshot {
    ProcessInfo process;
    MarkerRecord marker;           // the moment; for peak/time moments, synthesised (no regions)
    bool has_marker_data = false;  // marker carries RSS, mallinfo and regions
    std::string source;            // the log it came from, as given
    SnapshotTotals totals;
    std::vector<SnapshotModule> modules;
    std::vector<ThreadStartRecord> threads;  // live at the moment
    std::map<uint32_t, std::vector<StackFrame>> stacks;
    std::vector<SnapshotEntry> entries;  // sorted by (stack, kind)

    double time_s() const { return static_cast<double>(marker.time_ns - process.start_ns) / 1e9; }
};

// What one stack of a Snapshot holds besides its frames (its map node and
// vector), as the read budget charges it (util/read_budget.h).
inline constexpr uint64_t kSnapshotStackBytes = 96;

// Throws heapsnap::Error on any I/O problem.
void write_snapshot(const std::string& path, const Snapshot& snapshot);
// Throws heapsnap::Error for files that are not snapshots, other versions,
// and truncated or corrupt content.
Snapshot read_snapshot(const std::string& path);

// True if the file starts with the snapshot magic.
bool looks_like_snapshot(const std::string& path);

// Field groups shared with the replay checkpoint (same encodings).
void put_process(ByteBuffer& o, const ProcessInfo& p);
// `version`: of the file read (the snapshot's; a checkpoint reads the
// current one).
void get_process(codec::Reader& r, ProcessInfo& p, uint32_t version = kSnapshotVersion);
void put_marker(ByteBuffer& o, const MarkerRecord& m, bool has_data);
void get_marker(codec::Reader& r, MarkerRecord& m, bool& has_data);
void put_module(ByteBuffer& o, const SnapshotModule& m);
void get_module(codec::Reader& r, SnapshotModule& m);
void put_thread(ByteBuffer& o, const ThreadStartRecord& t);
void get_thread(codec::Reader& r, ThreadStartRecord& t);
// One stack: id, frame count, then (module, vaddr) per frame.
void put_stack(ByteBuffer& o, uint32_t id, std::span<const StackFrame> frames);
uint32_t get_stack(codec::Reader& r, std::vector<StackFrame>& frames);

}  // namespace heapsnap
