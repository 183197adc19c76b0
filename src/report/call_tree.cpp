#include "report/call_tree.h"

#include <limits>
#include <stdexcept>

namespace heapsnap {

CallTree::CallTree() : chunks_(1), index_(16, kRoot) {
    chunks_[0].push_back(Entry{kRoot, 0});
    size_ = 1;
}

uint32_t CallTree::add_frame(SymbolFrame frame) {
    if (frames_.size() >= std::numeric_limits<uint32_t>::max()) throw std::length_error("too many frames");
    frames_.push_back(std::move(frame));
    return static_cast<uint32_t>(frames_.size() - 1);
}

size_t CallTree::slot_of(Node parent, uint32_t frame) {
    uint64_t key = uint64_t{parent} << 32 | frame;
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return static_cast<size_t>(key);
}

void CallTree::grow_index() {
    std::vector<Node> index(index_.size() * 2, kRoot);
    size_t mask = index.size() - 1;
    for (Node node : index_) {
        if (node == kRoot) continue;
        size_t i = slot_of(entry(node).parent, entry(node).frame) & mask;
        while (index[i] != kRoot) i = (i + 1) & mask;
        index[i] = node;
    }
    index_.swap(index);
}

CallTree::Node CallTree::child(Node parent, uint32_t id) {
    if ((size_ + 1) * 4 > index_.size() * 3) grow_index();
    size_t mask = index_.size() - 1;
    size_t i = slot_of(parent, id) & mask;
    for (; index_[i] != kRoot; i = (i + 1) & mask) {
        const Entry& e = entry(index_[i]);
        if (e.parent == parent && e.frame == id) return index_[i];
    }
    if (size_ >= std::numeric_limits<uint32_t>::max()) throw std::length_error("too many call tree nodes");
    auto node = static_cast<Node>(size_);
    if (chunks_.back().size() == kChunk) chunks_.emplace_back().reserve(kChunk);
    chunks_.back().push_back(Entry{parent, id});
    ++size_;
    index_[i] = node;
    return node;
}

CallTree::Node CallTree::insert(const std::vector<uint32_t>& innermost_first) {
    Node node = kRoot;
    for (auto it = innermost_first.rbegin(); it != innermost_first.rend(); ++it) node = child(node, *it);
    return node;
}

size_t CallTree::depth(Node node) const {
    size_t n = 0;
    for (; node != kRoot; node = entry(node).parent) ++n;
    return n;
}

}  // namespace heapsnap
