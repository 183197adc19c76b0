// Call stacks as one prefix tree of symbolized frames, the way
// heaptrack_print keeps its traces: a node is a frame together with the
// node of its caller, the outermost frame (main, a thread's start) hangs
// from the root, and a stack is the node of its innermost frame. Walking
// from that node to the root gives the stack innermost first.
//
// A compiler's report holds some 100 000 call sites (live, at the peak,
// making temporaries) of about 50 frames that share most of their callers:
// as a list of frames each, they took 8 bytes a frame, most of the report's
// memory. In the tree a shared caller costs one node of 8 bytes, and a site
// is one node. Frames are stored once each and named by a dense id.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "symbolize/symbolizer.h"

namespace heapsnap {

class CallTree {
public:
    using Node = uint32_t;
    static constexpr Node kRoot = 0;  // no frame: the caller of every outermost frame

    CallTree();

    // Stores `frame` under a new id (0, 1, 2...).
    uint32_t add_frame(SymbolFrame frame);
    const SymbolFrame& frame(uint32_t id) const { return frames_[id]; }
    size_t frame_count() const { return frames_.size(); }

    // The node of frame `id` called from `parent`, made if there is none.
    Node child(Node parent, uint32_t id);
    // The node of a stack given by its frame ids, innermost first.
    Node insert(const std::vector<uint32_t>& innermost_first);

    Node parent(Node node) const { return entry(node).parent; }
    uint32_t frame_id(Node node) const { return entry(node).frame; }
    const SymbolFrame& frame_at(Node node) const { return frames_[entry(node).frame]; }
    // The number of frames from `node` to the root.
    size_t depth(Node node) const;
    // Nodes, the root included.
    size_t size() const { return size_; }

    // Drops the index child() finds nodes by, once every stack is in:
    // child() and insert() may not be called after.
    void seal() { std::vector<Node>().swap(index_); }

    // What a node costs with its share of the index, at up to twice its
    // size (the read budget's charge, util/read_budget.h).
    static constexpr size_t kBytesPerNode = sizeof(uint32_t) * 2 + 2 * 2 * sizeof(Node);

private:
    struct Entry {
        uint32_t parent;
        uint32_t frame;
    };
    // Nodes in chunks of kChunk that never move: a growing vector would
    // hold up to three times its nodes while it copies them. The first
    // chunk grows as a vector does, so that a small tree stays small.
    static constexpr unsigned kChunkBits = 13;
    static constexpr size_t kChunk = size_t{1} << kChunkBits;
    const Entry& entry(Node node) const { return chunks_[node >> kChunkBits][node & (kChunk - 1)]; }
    static size_t slot_of(Node parent, uint32_t frame);
    void grow_index();

    std::deque<SymbolFrame> frames_;  // by id; elements never move
    std::vector<std::vector<Entry>> chunks_;
    size_t size_ = 0;
    // Open addressing over the nodes themselves: a slot holds a node (0:
    // empty, the root is never a child), found by the hash of its parent
    // and frame. 4 bytes a slot, at most 3/4 full.
    std::vector<Node> index_;
};

}  // namespace heapsnap
