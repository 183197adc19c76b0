// Builds .hslog files in memory with the recorder's own encoders, for the
// reader, replay and snapshot tests.
#pragma once

#include <stdlib.h>
#include <unistd.h>
#include <zstd.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "format/hslog.h"
#include "format/log_reader.h"
#include "replay/marker_select.h"

namespace heapsnap::test {

// Records accumulate in the current frame; frame() closes it.
class LogBuilder {
public:
    LogBuilder() { header(hslog::kLogVersion); }

    void header(uint32_t version) {
        version_ = version;
        file_.clear();
        uint8_t h[hslog::kHeaderSize];
        codec::Writer w(h, sizeof h);
        w.raw(hslog::kMagic, sizeof hslog::kMagic);
        w.u32le(version);
        w.u32le(0);
        file_.insert(file_.end(), h, h + sizeof h);
    }

    // Start time 1 ms; pid 42; exe /bin/prog. Event times are nanoseconds
    // and must be whole microseconds (hslog::kTimeUnitNs). Unlike the
    // recorder, the builder writes a Time record before every event whose
    // time differs, so tests keep exact times.
    // `attached`: the Process record's byte of version 9 on.
    void process(uint64_t sample_bytes = 0, bool attached = false) {
        codec::Writer w = room();
        w.u8(static_cast<uint8_t>(hslog::Tag::Process));
        w.str("test");
        w.varint(42);
        w.varint(1);
        w.varint(1000);
        w.varint(5);
        w.varint(1000000);
        w.varint(4096);
        w.u8(0);
        w.varint(64);
        w.str("/bin/prog");
        w.bytes("prog\0-x", 7);
        w.varint(sample_bytes);
        if (version_ >= hslog::kAttachedVersion) w.u8(attached ? 1 : 0);
        done(w);
    }
    void stack(uint32_t id, std::vector<std::pair<uint32_t, uint64_t>> frames) {
        codec::Writer w = room();
        hslog::put_stack_header(w, id, static_cast<uint32_t>(frames.size()));
        for (auto [m, v] : frames) hslog::put_stack_frame(w, m, v);
        done(w);
    }
    void module(uint32_t id, const char* path, uint64_t bias) {
        codec::Writer w = room();
        hslog::put_module_load(w, 0, id, bias, bias, bias + 0x1000, path, strlen(path), nullptr, 0);
        done(w);
    }
    void thread(uint32_t index) {
        codec::Writer w = room();
        hslog::put_thread(w, index);
        done(w);
    }
    // Heap events name addresses, as the hooks see them; the builder keeps
    // the allocation infos the way the recorder's writer does
    // (alloc_infos.h): a small block's info, 0 for an addressed one.
    void alloc(uint64_t t, uint64_t addr, uint64_t size, uint32_t stack, hslog::AllocFn fn = hslog::AllocFn::Malloc) {
        codec::Writer w = room();
        time(w, t);
        if (auto it = live_.find(addr); it != live_.end()) {  // a missed free
            put_known_free(w, it->second, addr);
            events_++;
        }
        if (size >= hslog::kAddressedAllocSize) {
            live_[addr] = 0;
            hslog::put_alloc_at(w, fn, delta(addr), size, stack);
        } else if (auto known = infos_.find({fn, size, stack}); known != infos_.end()) {
            live_[addr] = known->second;
            hslog::put_alloc_info(w, known->second);
        } else {
            auto id = static_cast<uint32_t>(infos_.size() + 1);
            infos_[{fn, size, stack}] = live_[addr] = id;
            hslog::put_alloc(w, fn, size, stack);
        }
        events_++;
        done(w);
    }
    // `usable`: an unknown block's usable size (version 9 on).
    void free_(uint64_t t, uint64_t addr, uint64_t usable = 0) {
        codec::Writer w = room();
        time(w, t);
        if (auto it = live_.find(addr); it != live_.end()) {
            put_known_free(w, it->second, addr);
            live_.erase(it);
        } else if (version_ >= hslog::kAttachedVersion) {
            hslog::put_free_unknown(w, delta(addr), usable);
        } else {
            w.u8(static_cast<uint8_t>(hslog::Tag::FreeUnknown));
            w.svarint(delta(addr));
        }
        events_++;
        done(w);
    }
    void mmap(uint64_t t, uint64_t addr, uint64_t length, uint32_t stack) {
        codec::Writer w = room();
        time(w, t);
        hslog::put_mmap(w, delta(addr), length, 3, 0x22, stack);
        events_++;
        done(w);
    }
    void munmap(uint64_t t, uint64_t addr, uint64_t length) {
        codec::Writer w = room();
        time(w, t);
        hslog::put_munmap(w, delta(addr), length);
        events_++;
        done(w);
    }
    // A marker without regions. Like the recorder's, it has mallinfo2
    // numbers (3 to 9) unless it is the exit marker; `malloc_byte` overrides
    // the presence byte.
    void marker(uint64_t t, uint32_t index, const char* label, hslog::MarkerCause cause = hslog::MarkerCause::User,
                int malloc_byte = -1) {
        codec::Writer w = marker_head(t, index, label, cause);
        uint8_t has_malloc = malloc_byte >= 0 ? static_cast<uint8_t>(malloc_byte) : cause != hslog::MarkerCause::Exit;
        w.u8(has_malloc);
        if (has_malloc == 1)
            for (int i = 3; i < 3 + 7; ++i) w.varint(i);
        w.u32le(0);
        done(w);
    }
    // A marker without regions, with another allocator's statistics.
    void marker_with(uint64_t t, uint32_t index, const char* label, const hslog::AllocatorStats& stats) {
        codec::Writer w = marker_head(t, index, label, hslog::MarkerCause::User);
        hslog::put_allocator_stats(w, stats);
        w.u32le(0);
        done(w);
    }
    // A marker's fields up to its statistics byte (rss 0, threads 1,
    // recorder bytes 2).
    codec::Writer marker_head(uint64_t t, uint32_t index, const char* label, hslog::MarkerCause cause) {
        codec::Writer w = room();
        marker_header(w, t);
        w.varint(index);
        w.u8(static_cast<uint8_t>(cause));
        w.str(label);
        for (int i = 0; i < 3; ++i) w.varint(i);
        return w;
    }
    void end(uint64_t t) {
        codec::Writer w = room();
        uint64_t dt = (t - now_) / hslog::kTimeUnitNs;
        if (version_ >= hslog::kUnrecordedVersion) {
            hslog::put_end(w, dt, hslog::EndReason::Exit, events_, unrecorded);
        } else {
            w.u8(static_cast<uint8_t>(hslog::Tag::End));
            w.varint(dt);
            w.u8(static_cast<uint8_t>(hslog::EndReason::Exit));
            w.varint(events_);
        }
        now_ = t;
        done(w);
    }
    // What the next markers and End say the recorder could not record
    // (version 8 on).
    uint64_t unrecorded = 0;
    void raw_record(const std::vector<uint8_t>& bytes) { frame_.insert(frame_.end(), bytes.begin(), bytes.end()); }

    // Compresses the records so far into one zstd frame.
    void frame() {
        std::vector<uint8_t> out(ZSTD_compressBound(frame_.size()));
        size_t n = ZSTD_compress(out.data(), out.size(), frame_.data(), frame_.size(), 1);
        file_.insert(file_.end(), out.begin(), out.begin() + n);
        frame_.clear();
    }

    const std::vector<uint8_t>& bytes() const { return file_; }

    std::string write(const std::vector<uint8_t>& bytes) const {
        char path[] = "/tmp/heapsnap-test-XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0) {
            ssize_t ignored = ::write(fd, bytes.data(), bytes.size());
            (void)ignored;
            close(fd);
        }
        return path;
    }
    std::string write() const { return write(file_); }

private:
    // Up to the payload, in this log's version.
    void marker_header(codec::Writer& w, uint64_t t) {
        uint64_t dt = (t - now_) / hslog::kTimeUnitNs;
        now_ = t;
        if (version_ >= hslog::kUnrecordedVersion) {
            hslog::put_marker_header(w, dt, 0, events_, unrecorded);
            return;
        }
        w.u8(static_cast<uint8_t>(hslog::Tag::Marker));
        w.varint(dt);
        w.varint(0);
        w.varint(events_);
    }

    uint32_t version_ = hslog::kLogVersion;
    codec::Writer room() {
        scratch_.assign(4096, 0);
        return codec::Writer(scratch_.data(), scratch_.size());
    }
    void done(const codec::Writer& w) { frame_.insert(frame_.end(), scratch_.data(), scratch_.data() + w.size()); }
    void time(codec::Writer& w, uint64_t t) {
        if (t > now_) hslog::put_time(w, (t - now_) / hslog::kTimeUnitNs);
        if (t > now_) now_ = t;
    }
    void put_known_free(codec::Writer& w, uint32_t info, uint64_t addr) {
        if (info)
            hslog::put_free(w, info);
        else
            hslog::put_free_at(w, delta(addr));
    }
    int64_t delta(uint64_t addr) {
        auto d = static_cast<int64_t>(addr - addr_);
        addr_ = addr;
        return d;
    }

    std::vector<uint8_t> file_;
    std::vector<uint8_t> frame_;
    std::vector<uint8_t> scratch_;
    uint64_t now_ = 1000000;
    uint64_t addr_ = 0;
    uint64_t events_ = 0;
    std::map<uint64_t, uint32_t> live_;  // address -> info id, 0 for an addressed block
    std::map<std::tuple<hslog::AllocFn, uint64_t, uint32_t>, uint32_t> infos_;  // (fn, size, stack) -> info id
};

// The moment of marker `index` (LOG@index).
inline Moment at_marker(uint32_t index) {
    Moment m;
    m.kind = Moment::Kind::Index;
    m.index = index;
    m.text = std::to_string(index);
    return m;
}

// Deletes the file (and the replay checkpoint a snapshot of it leaves) at
// scope exit.
struct TempFile {
    std::string path;
    ~TempFile() {
        unlink(path.c_str());
        unlink((path + ".checkpoint").c_str());
    }
};

}  // namespace heapsnap::test
