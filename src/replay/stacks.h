// The stacks a log defines, by id, for the replay.
//
// A log numbers its stacks 1, 2, 3... in order of first use (the reader
// refuses ids far ahead of the count), so the table is indexed by id: per
// id where its encoding starts, the encodings packed into large chunks.
//
// Every stack the log ever defined is kept (a snapshot may need any of
// them), so the table grows with the history's distinct stacks: a
// compiler's log defines some 225 000 stacks of 46 frames on average.
// Frames are therefore kept varint-encoded, each against the frame before
// it: a frame in the same module as its predecessor is one varint, the
// zigzagged distance between the two addresses shifted left once with the
// low bit set; any other frame is a varint with the low bit clear (the
// module id, shifted) followed by its address. Frames of one program lie a
// few MiB apart, so a frame takes 3 to 4 bytes instead of 16.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "format/codec.h"
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
        if (id >= start_.size()) start_.resize(std::max<size_t>(id + 1, start_.size() * 2), nullptr);
        if (!start_[id]) defined_++;
        // Worst case: the count, then per frame a flagged module and an address.
        size_t most = codec::kMaxVarint * (1 + 2 * frames.size());
        if (most > room_) {
            size_t size = std::max(most, kChunkBytes);
            chunks_.push_back(std::make_unique<uint8_t[]>(size));
            next_ = chunks_.back().get();
            room_ = size;
        }
        codec::Writer w(next_, room_);
        w.varint(frames.size());
        StackFrame prev{UINT32_MAX, 0};
        for (const StackFrame& f : frames) {
            uint64_t step = codec::zigzag(static_cast<int64_t>(f.vaddr - prev.vaddr));
            if (f.module == prev.module && step < (uint64_t{1} << 63)) {
                w.varint(step << 1 | 1);
            } else {
                w.varint(uint64_t{f.module} << 1);
                w.varint(f.vaddr);
            }
            prev = f;
        }
        start_[id] = next_;
        next_ += w.size();
        room_ -= w.size();
    }

    bool contains(uint32_t id) const { return id < start_.size() && start_[id]; }

    // The frames of stack `id`, innermost first, into `out`; empty if it is
    // undefined.
    void decode(uint32_t id, std::vector<StackFrame>& out) const {
        out.clear();
        if (!contains(id)) return;
        const uint8_t* at = start_[id];
        out.resize(varint(at));
        StackFrame prev{UINT32_MAX, 0};
        for (StackFrame& f : out) {
            uint64_t token = varint(at);
            if (token & 1) {
                f.module = prev.module;
                f.vaddr = prev.vaddr + static_cast<uint64_t>(codec::unzigzag(token >> 1));
            } else {
                f.module = static_cast<uint32_t>(token >> 1);
                f.vaddr = varint(at);
            }
            prev = f;
        }
    }

    // The frames of stack `id` as a vector, for a snapshot's stack list.
    std::vector<StackFrame> copy(uint32_t id) const {
        std::vector<StackFrame> out;
        decode(id, out);
        return out;
    }

    // The number of frames of stack `id`; 0 if it is undefined.
    size_t depth(uint32_t id) const {
        if (!contains(id)) return 0;
        const uint8_t* at = start_[id];
        return static_cast<size_t>(varint(at));
    }

    size_t size() const { return defined_; }

    // Calls fn(id, frames) for every defined stack, by id.
    template <class Fn>
    void for_each(Fn&& fn) const {
        std::vector<StackFrame> frames;
        for (uint32_t id = 0; id < start_.size(); ++id) {
            if (!start_[id]) continue;
            decode(id, frames);
            fn(id, std::span<const StackFrame>(frames));
        }
    }

private:
    // Encodings live in fixed chunks that never move (a growing vector
    // would copy them all at every doubling and touch twice the memory).
    static constexpr size_t kChunkBytes = size_t{1} << 20;

    // set() wrote it: well formed, so no bounds to check.
    static uint64_t varint(const uint8_t*& at) {
        uint64_t v = 0;
        for (int shift = 0;; shift += 7) {
            uint8_t b = *at++;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
    }

    std::vector<std::unique_ptr<uint8_t[]>> chunks_;
    uint8_t* next_ = nullptr;
    size_t room_ = 0;
    std::vector<const uint8_t*> start_;  // by id: its encoding, null if undefined
    size_t defined_ = 0;
};

}  // namespace heapsnap
