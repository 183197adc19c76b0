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
#include "report/call_tree.h"
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

// A frame's identity, as diff matches frames: the text "F" US function US
// file US line US inlined (0 or 1) RS for a frame with a function, else
// "A" US module US offset (hex) RS (US, RS: the ASCII unit and record
// separators). Compared and hashed as that text without building it: a
// compiler's report has some 100 000 distinct frames.
int compare_frame_identities(const SymbolFrame& a, const SymbolFrame& b);  // <0, 0, >0
uint64_t frame_identity_hash(const SymbolFrame& frame);

// Frame identities, each interned once: ids compare equal exactly when the
// frames' identities do, and ranks() orders ids as their texts.
class FrameIdentities {
public:
    // The id of `frame`'s identity; a new one keeps a pointer to `frame`,
    // which must outlive this.
    uint32_t intern(const SymbolFrame& frame);
    size_t size() const { return frames_.size(); }
    // By id: its rank among the identities' texts.
    std::vector<uint32_t> ranks() const;

private:
    static constexpr uint32_t kNone = UINT32_MAX;
    FlatMap<uint32_t> first_;                 // by hash: the first id of that hash
    std::vector<const SymbolFrame*> frames_;  // by id
    std::vector<uint32_t> next_;              // by id: the next id of the same hash, or kNone
};

// What symbolized frames cost, charged to the read budget
// (util/read_budget.h) as they are made, so that a small snapshot of many
// long stacks cannot make a diff or a report hold or work without bound:
// a SymbolFrame with heap copies of its strings, and the work of looking
// one recorded frame up, in bytes of replay (two microseconds).
inline constexpr uint64_t kSymbolFrameBytes = 384;
inline constexpr uint64_t kSymbolizeVolume = 256;

// The symbolized frames of a snapshot's stacks (inline frames expanded,
// excluded frames dropped), put into a CallTree: each (module, return
// address) is symbolized and filtered once, a stack becomes a node of the
// tree, and callers shared by many stacks are stored once.
class StackSymbols {
public:
    // Stacks the snapshot lacks are read from `more`, if given.
    StackSymbols(const Snapshot& snapshot, Symbolizer& symbolizer, const std::vector<std::regex>& exclude,
                 CallTree& tree, const StackTable* more = nullptr);

    // The node of stack `stack`'s frames in the tree; the root for a stack
    // without frames or unknown.
    CallTree::Node node(uint32_t stack);

    // Reads the stacks of `snapshot` (and `more`) from now on: another
    // moment of the same log shares the frames and nodes made so far,
    // unless its module ids name other modules.
    void use(const Snapshot& snapshot, const StackTable* more = nullptr);

private:
    // The frames one recorded frame stands for, excluded ones dropped.
    std::vector<SymbolFrame> symbolized(const StackFrame& raw) const;

    const Snapshot* snapshot_;
    std::unordered_map<uint32_t, const SnapshotModule*> modules_;  // by id (the last of an id, as a reader's map)
    Symbolizer& symbolizer_;
    const std::vector<std::regex>& exclude_;
    CallTree& tree_;
    const StackTable* more_;
    std::vector<StackFrame> decoded_;  // a stack of more_
    std::vector<uint32_t> ids_;        // a stack's frame ids, innermost first
    // The last stack put into the tree, outermost first: (frame id, node).
    // The next one most often shares its callers, found here without a
    // look-up in the tree.
    std::vector<std::pair<uint32_t, CallTree::Node>> path_;
    // (module, vaddr) -> the ids of its frames in the tree, [first, first +
    // count), as first << 32 | count. Keyed by (module + 1) << 48 | vaddr
    // where that fits (every frame of a real process), in a flat table: a
    // compiler's report looks up some nine million frames.
    FlatMap<uint64_t> ids_of_packed_;
    std::map<std::pair<uint32_t, uint64_t>, uint64_t> ids_of_raw_;  // the others
};

// Call sites: stacks of a CallTree (nodes) merged by their frames'
// identities and kind, numbered 0, 1, 2... in order of first appearance.
// A site is found by a hash of its identities, checked frame by frame.
class SiteIndex {
public:
    explicit SiteIndex(const CallTree& tree) : tree_(tree) {}

    // The number of the site of the stack at `node`; `fresh` says whether
    // it is new (and `node` its frames).
    size_t find_or_add(CallTree::Node node, EntryKind kind, bool* fresh);
    size_t size() const { return sites_.size(); }
    // Site numbers in identity order: frame by frame, innermost first, by
    // the identities' texts (a prefix first), then by kind.
    std::vector<size_t> identity_order() const;

private:
    static constexpr uint32_t kNone = UINT32_MAX;
    struct Site {
        CallTree::Node node;
        EntryKind kind;
        uint32_t next;  // the next site of the same hash, or kNone
    };
    uint32_t identity(uint32_t frame_id);
    bool same_identities(CallTree::Node a, CallTree::Node b) const;

    const CallTree& tree_;
    FrameIdentities identities_;
    std::vector<uint32_t> identity_of_;  // by frame id; kNone: not interned yet
    std::vector<Site> sites_;
    FlatMap<uint32_t> first_;  // by hash: the first site of that hash
};

DiffResult diff(const Snapshot& old_snap, const Snapshot& new_snap, const DiffOptions& options, Symbolizer& symbolizer);

// True for a frame that only forwards an allocation (see above).
bool is_allocation_frame(const SymbolFrame& frame);

// "function" or "module+0xoffset" for a frame.
std::string frame_label(const SymbolFrame& frame);

}  // namespace heapsnap
