// The stacks a log defines, by id, for the replay.
//
// A log numbers its stacks 1, 2, 3... in order of first use (the reader
// refuses ids far ahead of the count), so the table is indexed by id: per
// id where its encoding starts, the encodings packed into large chunks.
//
// Every stack the log ever defined is kept (a snapshot may need any of
// them), so the table grows with the history's distinct stacks: a
// compiler's log defines some 180 000 stacks of 46 frames on average,
// more frames than it has events. A stack is kept as its Stack record
// encodes it (formats/hslog.md): the frame count, then per frame the
// module id and the address as varints, about 5 bytes a frame instead of
// the 16 of a StackFrame. The replay copies the record's bytes as they are
// (set_encoded): decoding every frame and encoding it again took a
// quarter of a compiler log's replay, and a snapshot decodes only the
// stacks of its live entries.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
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
        // Worst case: the count, then per frame a module and an address.
        size_t most = codec::kMaxVarint * (1 + 2 * frames.size());
        codec::Writer w(room_for(id, most), most);
        w.varint(frames.size());
        for (const StackFrame& f : frames) {
            w.varint(f.module);
            w.varint(f.vaddr);
        }
        next_ += w.size();
        room_ -= w.size();
    }
    // The same from a Stack record's frames (LogVisitor::on_stack_record),
    // which the reader has checked.
    void set_encoded(uint32_t id, uint32_t count, std::span<const uint8_t> frames) {
        size_t most = codec::kMaxVarint + frames.size();
        codec::Writer w(room_for(id, most), most);
        w.varint(count);
        w.raw(frames.data(), frames.size());
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
        for (StackFrame& f : out) {
            f.module = static_cast<uint32_t>(varint(at));
            f.vaddr = varint(at);
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
    // A chunk is a huge page where the kernel has one to give
    // (MADV_HUGEPAGE): faulting in a compiler's 25 MiB of stacks 4 KiB at
    // a time cost more than copying them.
    static constexpr size_t kChunkBytes = size_t{2} << 20;

    // Room for `most` bytes of stack `id`'s encoding at next_, which
    // becomes its start.
    uint8_t* room_for(uint32_t id, size_t most) {
        if (id >= start_.size()) start_.resize(std::max<size_t>(id + 1, start_.size() * 2), nullptr);
        if (!start_[id]) defined_++;
        if (most > room_) {
            size_t size = std::max(most, kChunkBytes);
            size = (size + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
            void* chunk = std::aligned_alloc(kChunkBytes, size);
            if (!chunk) throw std::bad_alloc();
            madvise(chunk, size, MADV_HUGEPAGE);
            chunks_.emplace_back(static_cast<uint8_t*>(chunk));
            next_ = chunks_.back().get();
            room_ = size;
        }
        start_[id] = next_;
        return next_;
    }

    // set() wrote it, or the reader checked it: well formed, so no bounds
    // to check. Read as codec::Reader::varint reads it (a tenth byte's
    // bits past the 64th are dropped).
    static uint64_t varint(const uint8_t*& at) {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            uint8_t b = *at++;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        return v;
    }

    struct Free {
        void operator()(uint8_t* p) const { std::free(p); }
    };
    std::vector<std::unique_ptr<uint8_t[], Free>> chunks_;
    uint8_t* next_ = nullptr;
    size_t room_ = 0;
    std::vector<const uint8_t*> start_;  // by id: its encoding, null if undefined
    size_t defined_ = 0;
};

}  // namespace heapsnap
