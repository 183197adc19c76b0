// The symbolized frames of a call site, as report, diff and trend hold them:
// a node of a CallTree (report/call_tree.h), read innermost first by
// walking to the root, and the tree kept alive as long as any list into it.
// A list costs 24 bytes whatever its depth; the frames and the callers it
// shares with other sites are stored once, in the tree.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <vector>

#include "report/call_tree.h"
#include "symbolize/symbolizer.h"

namespace heapsnap {

class FrameList {
public:
    class iterator {
    public:
        using value_type = SymbolFrame;
        using difference_type = std::ptrdiff_t;
        using reference = const SymbolFrame&;
        using pointer = const SymbolFrame*;
        using iterator_category = std::forward_iterator_tag;

        iterator() = default;
        iterator(const CallTree* tree, CallTree::Node node) : tree_(tree), node_(node) {}
        const SymbolFrame& operator*() const { return tree_->frame_at(node_); }
        const SymbolFrame* operator->() const { return &tree_->frame_at(node_); }
        iterator& operator++() {
            node_ = tree_->parent(node_);
            return *this;
        }
        iterator operator++(int) {
            iterator was = *this;
            ++*this;
            return was;
        }
        bool operator==(const iterator& o) const { return node_ == o.node_; }

    private:
        const CallTree* tree_ = nullptr;
        CallTree::Node node_ = CallTree::kRoot;
    };

    FrameList() = default;
    // Frames of their own, in a tree of their own.
    FrameList(std::vector<SymbolFrame> frames) {  // NOLINT: implicit, as a vector converts
        auto tree = std::make_shared<CallTree>();
        std::vector<uint32_t> ids;
        ids.reserve(frames.size());
        for (SymbolFrame& f : frames) ids.push_back(tree->add_frame(std::move(f)));
        node_ = tree->insert(ids);
        tree->seal();
        tree_ = std::move(tree);
    }
    FrameList(std::initializer_list<SymbolFrame> frames) : FrameList(std::vector<SymbolFrame>(frames)) {}
    // The stack ending at `node` of `tree`, which the list keeps alive.
    FrameList(std::shared_ptr<const CallTree> tree, CallTree::Node node) : tree_(std::move(tree)), node_(node) {}

    size_t size() const { return tree_ ? tree_->depth(node_) : 0; }
    bool empty() const { return node_ == CallTree::kRoot; }
    // Frame i, innermost first (a walk of i nodes).
    const SymbolFrame& operator[](size_t i) const {
        CallTree::Node n = node_;
        for (; i; --i) n = tree_->parent(n);
        return tree_->frame_at(n);
    }
    const SymbolFrame& at(size_t i) const {
        if (i >= size()) throw std::out_of_range("FrameList::at");
        return (*this)[i];
    }
    const SymbolFrame& front() const { return tree_->frame_at(node_); }
    const SymbolFrame& back() const {
        CallTree::Node n = node_;
        while (tree_->parent(n) != CallTree::kRoot) n = tree_->parent(n);
        return tree_->frame_at(n);
    }
    iterator begin() const { return iterator(tree_.get(), node_); }
    iterator end() const { return iterator(tree_.get(), CallTree::kRoot); }

    const CallTree* tree() const { return tree_.get(); }
    CallTree::Node node() const { return node_; }

private:
    std::shared_ptr<const CallTree> tree_;
    CallTree::Node node_ = CallTree::kRoot;
};

}  // namespace heapsnap
