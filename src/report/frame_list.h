// The symbolized frames of a call site, as report, diff and trend hold them.
//
// A compiler's snapshot has some 40 000 call sites of about 50 frames over
// a few tens of thousands of distinct frames. Copying every site's frames
// (three strings each) took a report 2.4 GB; a FrameList instead points
// into a table where each distinct frame is stored once (StackSymbols'),
// and keeps that table alive as long as any list into it.
#pragma once

#include <cstddef>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <vector>

#include "symbolize/symbolizer.h"

namespace heapsnap {

// Frames are appended and never move: a deque's elements stay where they are.
using FrameTable = std::deque<SymbolFrame>;

class FrameList {
public:
    class iterator {
    public:
        using value_type = SymbolFrame;
        using difference_type = std::ptrdiff_t;
        using reference = const SymbolFrame&;
        using pointer = const SymbolFrame*;
        using iterator_category = std::bidirectional_iterator_tag;

        iterator() = default;
        explicit iterator(const SymbolFrame* const* at) : at_(at) {}
        const SymbolFrame& operator*() const { return **at_; }
        const SymbolFrame* operator->() const { return *at_; }
        iterator& operator++() {
            ++at_;
            return *this;
        }
        iterator operator++(int) { return iterator(at_++); }
        iterator& operator--() {
            --at_;
            return *this;
        }
        iterator operator--(int) { return iterator(at_--); }
        difference_type operator-(const iterator& o) const { return at_ - o.at_; }
        bool operator==(const iterator&) const = default;

    private:
        const SymbolFrame* const* at_ = nullptr;
    };

    FrameList() = default;
    // Frames of their own, in a table of their own.
    FrameList(std::vector<SymbolFrame> frames) {  // NOLINT: implicit, as a vector converts
        auto table = std::make_shared<FrameTable>(std::make_move_iterator(frames.begin()),
                                                  std::make_move_iterator(frames.end()));
        for (const SymbolFrame& f : *table) frames_.push_back(&f);
        table_ = std::move(table);
    }
    FrameList(std::initializer_list<SymbolFrame> frames) : FrameList(std::vector<SymbolFrame>(frames)) {}
    // Frames of `table`, which the list keeps alive.
    FrameList(std::shared_ptr<const FrameTable> table, std::vector<const SymbolFrame*> frames)
        : table_(std::move(table)), frames_(std::move(frames)) {}

    size_t size() const { return frames_.size(); }
    bool empty() const { return frames_.empty(); }
    const SymbolFrame& operator[](size_t i) const { return *frames_[i]; }
    const SymbolFrame& at(size_t i) const { return *frames_.at(i); }
    const SymbolFrame& front() const { return *frames_.front(); }
    const SymbolFrame& back() const { return *frames_.back(); }
    iterator begin() const { return iterator(frames_.data()); }
    iterator end() const { return iterator(frames_.data() + frames_.size()); }
    std::reverse_iterator<iterator> rbegin() const { return std::reverse_iterator<iterator>(end()); }
    std::reverse_iterator<iterator> rend() const { return std::reverse_iterator<iterator>(begin()); }

private:
    std::shared_ptr<const FrameTable> table_;
    std::vector<const SymbolFrame*> frames_;
};

}  // namespace heapsnap
