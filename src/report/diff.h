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
#include <memory>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/snapshot_file.h"
#include "replay/stacks.h"
#include "report/frame_list.h"
#include "symbolize/symbolizer.h"
#include "util/flat_map.h"

namespace heapsnap {

enum class GroupBy { Stack, Function, Line, Module };

struct DiffOptions {
    GroupBy group_by = GroupBy::Stack;
    size_t top = 0;                   // 0: all
    uint64_t min_bytes = 0;           // keep entries with |bytes_delta| >= min_bytes
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
    FrameList frames;  // innermost first
};

struct DiffResult {
    int64_t bytes_delta = 0;  // over all entries, before --top/--min-bytes
    int64_t blocks_delta = 0;
    std::vector<DiffEntry> entries;  // sorted: largest growth first, most shrinkage last
    std::vector<std::string> warnings;
};

// Frame identities, as diff matches frames, each interned once: ids
// compare equal exactly when the frames' identities do, and identity_ranks
// orders ids as their texts.
class FrameKeys {
public:
    uint32_t intern(const SymbolFrame& frame);
    // By id: its rank among the identities' texts.
    std::vector<uint32_t> identity_ranks() const;

private:
    std::unordered_map<std::string, uint32_t> ids_;
    std::vector<const std::string*> texts_;  // by id, into ids_
};

// What symbolized frames cost, charged to the read budget
// (util/read_budget.h) as they are made, so that a small snapshot of many
// long stacks cannot make a diff or a report hold or work without bound:
// a SymbolFrame with heap copies of its strings, and the work of looking
// one recorded frame up, in bytes of replay (two microseconds).
inline constexpr uint64_t kSymbolFrameBytes = 384;
inline constexpr uint64_t kSymbolizeVolume = 256;

// The symbolized frames of a snapshot's stacks (inline frames expanded,
// excluded frames dropped), as ids into one table: each (module, return
// address) is symbolized and filtered once, and a stack costs no copy of
// its frames.
class StackSymbols {
public:
    // Stacks the snapshot lacks are read from `more`, if given.
    StackSymbols(const Snapshot& snapshot, Symbolizer& symbolizer, const std::vector<std::regex>& exclude,
                 const StackTable* more = nullptr);

    std::vector<uint32_t> frame_ids(uint32_t stack);
    const SymbolFrame& frame(uint32_t id) const { return *frames_[id]; }
    // The frames as a FrameList that shares the table.
    FrameList list(const std::vector<uint32_t>& ids) const;
    // The identity of frame `id` in `keys`.
    uint32_t key(uint32_t id, FrameKeys& keys);

private:
    // The frames one recorded frame stands for, excluded ones dropped.
    std::vector<SymbolFrame> symbolized(const StackFrame& raw) const;

    const Snapshot& snapshot_;
    std::unordered_map<uint32_t, const SnapshotModule*> modules_;  // by id (the last of an id, as a reader's map)
    Symbolizer& symbolizer_;
    const std::vector<std::regex>& exclude_;
    const StackTable* more_;
    std::vector<StackFrame> decoded_;  // a stack of more_
    std::shared_ptr<FrameTable> table_ = std::make_shared<FrameTable>();
    std::vector<const SymbolFrame*> frames_;  // by id, into table_
    std::vector<uint32_t> key_of_;            // by id; UINT32_MAX: not interned yet
    // (module, vaddr) -> the ids of its frames, [first, first + count), as
    // first << 32 | count. Keyed by (module + 1) << 48 | vaddr where that
    // fits (every frame of a real process), in a flat table: a compiler's
    // report looks up some nine million frames.
    FlatMap<uint64_t> ids_of_packed_;
    std::map<std::pair<uint32_t, uint64_t>, uint64_t> ids_of_raw_;  // the others
};

// Call sites keyed by their frames' identities (FrameKeys ids) and kind,
// numbered 0, 1, 2... in order of first appearance.
class SiteIndex {
public:
    // The number of the site; `fresh` says whether it is new.
    size_t find_or_add(const std::vector<uint32_t>& keys, EntryKind kind, bool* fresh);
    size_t size() const { return sites_.size(); }
    // Site numbers in identity order: frame by frame by the identities'
    // texts (a prefix first), then by kind.
    std::vector<size_t> identity_order(const FrameKeys& keys) const;

private:
    struct Hash {
        size_t operator()(const std::vector<uint32_t>& v) const;
    };
    // keys, then the kind: one vector per site
    std::unordered_map<std::vector<uint32_t>, size_t, Hash> index_;
    std::vector<const std::vector<uint32_t>*> sites_;  // by number, into index_
};

DiffResult diff(const Snapshot& old_snap, const Snapshot& new_snap, const DiffOptions& options, Symbolizer& symbolizer);

// True for a frame that only forwards an allocation (see above).
bool is_allocation_frame(const SymbolFrame& frame);

// "function" or "module+0xoffset" for a frame.
std::string frame_label(const SymbolFrame& frame);

}  // namespace heapsnap
