// The stacks a log defines, by id, for the replay.
//
// A log numbers its stacks 1, 2, 3... in order of first use (the reader
// refuses ids far ahead of the count), so the table is indexed by id: per
// id where its frames start and how many, the frames themselves packed
// into large chunks. A
// compiler's log defines ~90 000 stacks; one std::map node and one vector
// per stack made their allocation, and their destruction at exit, a
// quarter of the replay's time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "format/log_reader.h"

namespace heapsnap {

class StackTable {
public:
    // What a stack costs besides its frames: its entries in start_ and
    // count_, at up to twice their size as they grow (the read budget's
    // charge, util/read_budget.h).
    static constexpr size_t kBytesPerStack = 2 * (sizeof(const StackFrame*) + sizeof(uint32_t));

    // Defines (or, in a checkpoint followed by the log, defines again)
    // stack `id`.
    void set(uint32_t id, std::span<const StackFrame> frames) {
        if (id >= start_.size()) {
            start_.resize(id + 1, nullptr);
            count_.resize(id + 1, 0);
        }
        if (!start_[id]) defined_++;
        StackFrame* at = take(frames.size());
        std::copy(frames.begin(), frames.end(), at);
        start_[id] = at;
        count_[id] = static_cast<uint32_t>(frames.size());
    }

    bool contains(uint32_t id) const { return id < start_.size() && start_[id]; }

    // The frames of stack `id`, innermost first; empty if it is undefined.
    std::span<const StackFrame> find(uint32_t id) const {
        if (!contains(id)) return {};
        return {start_[id], count_[id]};
    }

    // The frames of stack `id` as a vector, for a snapshot's stack list.
    std::vector<StackFrame> copy(uint32_t id) const {
        std::span<const StackFrame> f = find(id);
        return {f.begin(), f.end()};
    }

    size_t size() const { return defined_; }

    // Calls fn(id, frames) for every defined stack, by id.
    template <class Fn>
    void for_each(Fn&& fn) const {
        for (uint32_t id = 0; id < start_.size(); ++id)
            if (start_[id]) fn(id, find(id));
    }

private:
    // Frames live in fixed chunks that never move (a growing vector would
    // copy them all at every doubling and touch twice the memory).
    static constexpr size_t kChunkFrames = size_t{1} << 16;

    StackFrame* take(size_t n) {
        if (n > room_) {
            size_t size = n > kChunkFrames ? n : kChunkFrames;
            chunks_.push_back(std::make_unique<StackFrame[]>(size));
            next_ = chunks_.back().get();
            room_ = size;
        }
        StackFrame* at = next_;
        next_ += n;
        room_ -= n;
        return at;
    }

    std::vector<std::unique_ptr<StackFrame[]>> chunks_;
    StackFrame* next_ = nullptr;
    size_t room_ = 0;
    std::vector<const StackFrame*> start_;  // by id: its first frame, null if undefined
    std::vector<uint32_t> count_;           // by id
    size_t defined_ = 0;
};

}  // namespace heapsnap
