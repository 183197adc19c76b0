// Comparing two snapshots call site by call site.
//
// Stacks of the two sides are matched by what they mean, not by raw
// addresses: each frame is keyed by its symbol (function, file, line,
// inline flag) when it has one, else by module path and offset. Two runs of
// the same program (different PIDs, ASLR) therefore line up, and so do two
// builds whose code at the call sites did not move.
//
// Grouping by function, line or module uses the first frame that is not an
// allocation function (operator new, std::allocator and its friends, or a
// frame inside libc / libstdc++ / the dynamic loader), so a leak through
// strdup or std::vector lands on the caller that asked for it. The stack
// view keeps every frame.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <regex>
#include <string>
#include <vector>

#include "format/snapshot_file.h"
#include "symbolize/symbolizer.h"

namespace heapsnap {

enum class GroupBy { Stack, Function, Line, Module };

struct DiffOptions {
    GroupBy group_by = GroupBy::Stack;
    size_t top = 0;          // 0: all
    uint64_t min_bytes = 0;  // keep entries with |bytes_delta| >= min_bytes
    std::vector<std::regex> exclude;  // frames whose function matches are dropped
};

struct DiffEntry {
    int64_t bytes_delta = 0;
    int64_t blocks_delta = 0;
    uint64_t old_bytes = 0;
    uint64_t new_bytes = 0;
    uint64_t old_blocks = 0;
    uint64_t new_blocks = 0;
    EntryKind kind = EntryKind::Heap;
    std::vector<SymbolFrame> frames;  // innermost first
};

struct DiffResult {
    int64_t bytes_delta = 0;  // over all entries, before --top/--min-bytes
    int64_t blocks_delta = 0;
    std::vector<DiffEntry> entries;  // sorted: largest growth first, most shrinkage last
    std::vector<std::string> warnings;
};

// The symbolized frames of a snapshot stack (inline frames expanded,
// excluded frames dropped).
// What symbolized frames cost, charged to the read budget
// (util/read_budget.h) as they are made, so that a small snapshot of many
// long stacks cannot make a diff or a report hold or work without bound:
// a SymbolFrame with heap copies of its strings, and the work of looking
// one recorded frame up, in bytes of replay (two microseconds).
inline constexpr uint64_t kSymbolFrameBytes = 384;
inline constexpr uint64_t kSymbolizeVolume = 256;

class StackSymbols {
public:
    StackSymbols(const Snapshot& snapshot, Symbolizer& symbolizer, const std::vector<std::regex>& exclude);
    std::vector<SymbolFrame> frames(uint32_t stack) const;

    // The same frames as ids into frame(): each (module, return address)
    // is symbolized and filtered once, and a stack costs no copy of its
    // frames. A compiler's log has some 87 000 stacks of about 45 frames
    // over a few tens of thousands of return addresses.
    std::vector<uint32_t> frame_ids(uint32_t stack);
    const SymbolFrame& frame(uint32_t id) const { return frames_[id]; }

private:
    // The frames one recorded frame stands for, excluded ones dropped.
    std::vector<SymbolFrame> symbolized(const StackFrame& raw) const;

    const Snapshot& snapshot_;
    std::unordered_map<uint32_t, const SnapshotModule*> modules_;  // by id (the last of an id, as a reader's map)
    Symbolizer& symbolizer_;
    const std::vector<std::regex>& exclude_;
    std::vector<SymbolFrame> frames_;  // by id
    // (module, vaddr) -> the ids of its frames: [first, first + count)
    std::map<std::pair<uint32_t, uint64_t>, std::pair<uint32_t, uint32_t>> ids_of_raw_;
};

DiffResult diff(const Snapshot& old_snap, const Snapshot& new_snap, const DiffOptions& options, Symbolizer& symbolizer);

// True for a frame that only forwards an allocation (see above).
bool is_allocation_frame(const SymbolFrame& frame);

// "function" or "module+0xoffset" for a frame.
std::string frame_label(const SymbolFrame& frame);

}  // namespace heapsnap
