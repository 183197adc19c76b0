// The log reader's decoding loop (spec: formats/hslog.md), as a template on
// the visitor's type.
//
// read_log() (format/log_reader.h) decodes for any LogVisitor and calls it
// through its vtable. A replay is one loop over hundreds of millions of
// events, so its visitors are classes declared `final` whose event handlers
// are inline (replay/replay.h): read_log_as<ThatClass>() binds their
// on_alloc and on_free at compile time and inlines them into the loop,
// with the decoding of the records that carry them (Alloc, AllocInfo,
// Free, long and short). Measured with cachegrind on `heapsnap snapshot
// --at exit` of the synthetic benchmark's log (tools/bench, 8 M events):
// 214 instructions per event through the vtable, 151 this way, 26 of them
// zstd's.
//
// Every other record (process, modules, stacks, threads, markers, mmap,
// addressed blocks) is rare and is decoded out of line by RecordStream,
// once for all visitor types, through the vtable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/codec.h"
#include "format/hslog.h"
#include "format/log_reader.h"
#include "util/error.h"
#include "util/read_budget.h"

namespace heapsnap {

// The complete frames of a log file, decompressed one at a time; checks
// the header on construction and keeps `summary`'s file counters.
class LogFrames {
public:
    struct Frame {
        std::span<const uint8_t> records;
        uint64_t offset = 0;  // of the frame in the file
        uint64_t end = 0;     // offset just after it
    };

    // Starts after the header, or at `from`'s offset.
    LogFrames(const LogFile& log, ReadSummary& summary, const StreamPosition* from);
    ~LogFrames();
    LogFrames(const LogFrames&) = delete;
    LogFrames& operator=(const LogFrames&) = delete;

    // The next complete frame; false at the end of the file, or where it
    // ends inside a frame (then summary.truncated is set). `events`: how
    // many were decoded so far, for the progress line.
    bool next(Frame& frame, uint64_t events);

private:
    struct State;
    std::unique_ptr<State> state_;
    ReadSummary& summary_;
};

// The stream state that spans frames (time, address, thread, allocation
// infos), and the decoding of the rare records.
class RecordStream {
public:
    RecordStream(const std::string& path, ReadSummary& summary) : path_(path), summary_(summary) {}

    bool has_process() const { return has_process_; }
    bool frame_done() const { return frame_done_; }
    uint64_t records() const { return records_; }
    uint64_t events() const { return events_; }
    void resume(const StreamPosition& at);
    void reserve_for(uint64_t file_bytes) { infos_.reserve_for(file_bytes); }
    // The position after the last record decoded, the start of the frame at
    // `offset`; ends the read (the allocation infos move into it).
    StreamPosition take_position(uint64_t offset) {
        return StreamPosition{
            offset, now_, addr_, thread_, stacks_, max_stack_, infos_.take_infos(), infos_.addressed()};
    }

protected:
    static constexpr uint8_t kAllocTag = static_cast<uint8_t>(hslog::Tag::Alloc);
    static constexpr uint8_t kAllocAtTag = static_cast<uint8_t>(hslog::Tag::AllocAt);
    static constexpr uint8_t kAllocInfoTag = static_cast<uint8_t>(hslog::Tag::AllocInfo);
    static constexpr uint8_t kFreeTag = static_cast<uint8_t>(hslog::Tag::Free);
    static constexpr uint8_t kThreadTag = static_cast<uint8_t>(hslog::Tag::Thread);
    static constexpr uint8_t kShortThreadTag = static_cast<uint8_t>(hslog::Tag::ShortThread);
    static constexpr uint8_t kTimeTag = static_cast<uint8_t>(hslog::Tag::Time);
    static constexpr uint8_t kShortAllocInfoTag = static_cast<uint8_t>(hslog::Tag::ShortAllocInfo);
    static constexpr uint8_t kShortFreeTag = static_cast<uint8_t>(hslog::Tag::ShortFree);
    static constexpr uint8_t kShortIdHighBits = 0x3f;

    [[noreturn]] void corrupt(uint64_t offset, const std::string& what) const;

    uint64_t advance(codec::Reader& r) {
        units_ += r.varint();
        now_ = units_ * hslog::kTimeUnitNs;
        return now_;
    }
    uint64_t address(codec::Reader& r) {
        addr_ += static_cast<uint64_t>(r.svarint());
        return addr_;
    }
    // An event's stack: 0 (none) or an id defined before (kStackIdSlack).
    uint32_t stack_ref(codec::Reader& r) {
        uint64_t id = r.varint();
        if (id > max_stack_) r.invalidate();
        return static_cast<uint32_t>(id);
    }

    // Every record but the allocation events and the Thread and Time
    // records (RecordDecoder::decode): the tag is read, `r` is after it.
    void record(hslog::Tag tag, codec::Reader& r, LogVisitor& visitor);

    const std::string& path_;
    ReadSummary& summary_;
    bool has_process_ = false;
    bool frame_done_ = false;
    uint64_t now_ = 0;
    uint64_t units_ = 0;  // now_ in hslog::kTimeUnitNs
    uint64_t addr_ = 0;
    uint32_t thread_ = 0;
    uint64_t stacks_ = 0;
    uint32_t max_stack_ = 0;
    // Counted here rather than in the summary: a member the loop can keep
    // in a register, where the summary is behind a reference.
    uint64_t records_ = 0;
    uint64_t events_ = 0;
    AllocInfos infos_;
    // What this read holds for its records (allocation infos, markers),
    // given back when it ends.
    MemoryCharge charge_;
    SteppedCharge infos_charge_{charge_, 2 * sizeof(AllocInfo), "allocation infos"};

private:
    void process(codec::Reader& r, LogVisitor& visitor);
    void marker(codec::Reader& r, LogVisitor& visitor);

    std::vector<bool> stack_defined_;  // by id
};

// Decodes the records of one frame after another for a `Visitor`.
template <class Visitor>
class RecordDecoder : public RecordStream {
public:
    RecordDecoder(const std::string& path, Visitor& visitor, ReadSummary& summary)
        : RecordStream(path, summary), visitor_(visitor) {}

    // Returns false when the visitor asked to stop.
    bool decode(std::span<const uint8_t> records, uint64_t frame_offset) {
        codec::Reader r(records.data(), records.size());
        // The first record of a log is its Process record (record() says
        // so if not); the loop below can then take every tag at its word.
        if (!has_process_ && !r.at_end()) {
            record(static_cast<hslog::Tag>(r.u8()), r, visitor_);
            if (!go_on(r, frame_offset)) return false;
        }
        while (!r.at_end()) {
            uint8_t tag = r.u8();
            // Short records first: on a busy log nearly every record is one,
            // and the tag's top two bits say which (hslog.h).
            if (tag >= kShortAllocInfoTag) [[likely]] {
                uint64_t id = static_cast<uint64_t>(tag & kShortIdHighBits) << 8 | r.u8();
                if (tag >= kShortFreeTag)
                    free(r, id);
                else
                    alloc_info(r, id);
            } else if (tag == kAllocInfoTag)
                alloc_info(r, r.varint());
            else if (tag == kFreeTag)
                free(r, r.varint());
            else if (static_cast<uint8_t>(tag - kShortThreadTag) < hslog::kShortThreadCount)
                thread_ = static_cast<uint32_t>(tag - kShortThreadTag);
            else if (static_cast<uint8_t>(tag - kAllocTag) < hslog::kAllocFnCount)
                alloc(r, static_cast<hslog::AllocFn>(tag - kAllocTag), false);
            else if (static_cast<uint8_t>(tag - kAllocAtTag) < hslog::kAllocFnCount)
                alloc(r, static_cast<hslog::AllocFn>(tag - kAllocAtTag), true);
            else if (tag == kThreadTag)
                thread_ = static_cast<uint32_t>(r.varint());
            else if (tag == kTimeTag)
                advance(r);
            else
                record(static_cast<hslog::Tag>(tag), r, visitor_);
            if (!go_on(r, frame_offset)) return false;
        }
        return true;
    }

private:
    // After a record: a malformed one is corruption; false if the visitor
    // asked to stop.
    bool go_on(const codec::Reader& r, uint64_t frame_offset) {
        if (!r.ok()) corrupt(frame_offset, "truncated or malformed record");
        records_++;
        if (!visitor_.stop_requested()) return true;
        frame_done_ = r.at_end();
        return false;
    }

    void alloc(codec::Reader& r, hslog::AllocFn fn, bool addressed) {
        AllocEvent e;
        e.fn = fn;
        e.time_ns = now_;
        if (addressed) {
            e.address = address(r);
            if (e.address == 0) r.invalidate();  // malloc's NULL is no block
        }
        e.size = r.varint();
        e.stack = stack_ref(r);
        e.thread = thread_;
        events_++;
        if (!r.ok()) return;
        if (addressed) {
            if (!infos_.alloc_at(e.address)) return r.invalidate();  // already live: the writer frees first
        } else {
            e.info = infos_.define(fn, e.size, e.stack);
            if (!e.info) return r.invalidate();  // more infos than ids
            infos_charge_.reach(e.info);
        }
        visitor_.on_alloc(e);
    }
    // AllocInfo and Free, long or short: `id` is decoded, `r` only checked.
    void alloc_info(codec::Reader& r, uint64_t id) {
        AllocEvent e;
        events_++;
        if (!r.ok()) return;
        const AllocInfo* info = infos_.alloc(id);
        if (!info) return r.invalidate();  // an info no Alloc defined
        e.time_ns = now_;
        e.thread = thread_;
        e.fn = info->fn;
        e.info = static_cast<uint32_t>(id);
        e.size = info->size;
        e.stack = info->stack;
        visitor_.on_alloc(e);
    }
    void free(codec::Reader& r, uint64_t id) {
        FreeEvent e;
        e.time_ns = now_;
        e.thread = thread_;
        events_++;
        if (!r.ok()) return;
        if (id == 0 || !infos_.free(id)) return r.invalidate();  // no live block of that info
        e.info = static_cast<uint32_t>(id);
        visitor_.on_free(e);
    }

    Visitor& visitor_;
};

// Reads the log from the start, or from `from` (a position an earlier read
// reported as resumable, for a visitor that holds the state up to there),
// and feeds `visitor`. Errors as read_log's.
template <class Visitor>
ReadSummary read_log_as(const LogFile& log, Visitor& visitor, const StreamPosition* from = nullptr) {
    const std::string& path = log.path;
    ReadSummary summary;
    LogFrames frames(log, summary, from);
    RecordDecoder<Visitor> decoder(path, visitor, summary);
    if (from)
        decoder.resume(*from);
    else
        decoder.reserve_for(summary.file_bytes);
    LogFrames::Frame frame;
    uint64_t last_end = 0;  // of the last frame decoded whole
    try {
        while (frames.next(frame, decoder.events())) {
            if (!decoder.decode(frame.records, frame.offset)) {
                summary.stopped = true;
                summary.resumable = decoder.frame_done();
                summary.resume = decoder.take_position(frame.end);
                break;
            }
            last_end = frame.end;
        }
    } catch (const BudgetExceeded& e) {
        throw Error(path + ": reading it " + e.what());
    }
    if (!decoder.has_process()) throw Error(path + ": truncated heapsnap log: no complete frame");
    summary.records = decoder.records();
    summary.events = decoder.events();
    if (!summary.stopped && last_end) {
        summary.end_resumable = true;
        summary.end = decoder.take_position(last_end);
    }
    return summary;
}

template <class Visitor>
ReadSummary read_log_as(const std::string& path, Visitor& visitor, const StreamPosition* from = nullptr) {
    return read_log_as(LogFile{path}, visitor, from);
}

}  // namespace heapsnap
