#include "format/log_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <memory>

#include "format/log_decoder.h"
#include "util/error.h"
#include "util/files.h"
#include "util/text.h"

namespace heapsnap {
namespace {

// A read-only mapping of the whole file. A log that grows while it is read
// (a live process) is read as far as it was when mapped.
class MappedFile {
public:
    explicit MappedFile(const LogFile& log) {
        const std::string& path = log.path;
        UniqueFd own;
        if (log.fd >= 0)
            check_regular_file(log.fd, path);
        else
            own = open_regular_file(path);
        int fd = log.fd >= 0 ? log.fd : own.get();
        budget_add_input(fd);
        struct stat st;
        if (fstat(fd, &st) != 0) throw Error(path + ": " + std::strerror(errno));
        size_ = static_cast<size_t>(st.st_size);
        if (size_) {
            void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) throw Error(path + ": " + std::strerror(errno));
            data_ = static_cast<const uint8_t*>(p);
            madvise(p, size_, MADV_SEQUENTIAL);
        }
    }
    ~MappedFile() {
        if (data_) munmap(const_cast<uint8_t*>(data_), size_);
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

private:
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

struct DctxFree {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// "heapsnap: reading LOG: 42% (12.3 M events)" on a terminal, for reads
// that take more than a second; nothing when stderr is a pipe or a file.
class Progress {
public:
    Progress(const std::string& path, uint64_t total) : path_(path), total_(total), tty_(isatty(STDERR_FILENO)) {
        clock_gettime(CLOCK_MONOTONIC, &start_);
    }
    ~Progress() {
        if (shown_) std::fprintf(stderr, "\r\x1b[K");
    }
    void update(uint64_t done, uint64_t events) {
        if (!tty_ || ++calls_ % 64) return;
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = static_cast<double>(now.tv_sec - start_.tv_sec) + (now.tv_nsec - start_.tv_nsec) / 1e9;
        if (elapsed < 1.0) return;
        std::fprintf(stderr, "\rheapsnap: reading %s: %3.0f%% (%.1f M events)", terminal_safe(path_).c_str(),
                     100.0 * static_cast<double>(done) / static_cast<double>(total_ ? total_ : 1),
                     static_cast<double>(events) / 1e6);
        shown_ = true;
    }

private:
    const std::string& path_;
    uint64_t total_;
    bool tty_;
    bool shown_ = false;
    uint64_t calls_ = 0;
    timespec start_{};
};

}  // namespace

void decode_stack_frames(uint32_t count, std::span<const uint8_t> frames, std::vector<StackFrame>& out) {
    codec::Reader r(frames.data(), frames.size());
    out.resize(count);
    for (StackFrame& f : out) {
        f.module = static_cast<uint32_t>(r.varint());
        f.vaddr = r.varint();
    }
}

void LogVisitor::on_stack_record(uint32_t stack, uint32_t count, std::span<const uint8_t> frames) {
    std::vector<StackFrame> decoded;
    decode_stack_frames(count, frames, decoded);
    on_stack(stack, decoded);
}

void RecordStream::corrupt(uint64_t offset, const std::string& what) const {
    throw Error(path_ + ": corrupt log: " + what + " in the frame at byte " + std::to_string(offset));
}

void RecordStream::resume(const StreamPosition& at) {
    has_process_ = true;
    now_ = at.time_ns;
    units_ = at.time_ns / hslog::kTimeUnitNs;
    addr_ = at.address;
    thread_ = at.thread;
    stacks_ = at.stacks;
    max_stack_ = at.max_stack;
    if (!infos_.restore(at.infos, at.addressed))
        throw Error(path_ + ": the checkpoint's allocation infos are inconsistent");
}

void RecordStream::record(hslog::Tag tag, codec::Reader& r, LogVisitor& visitor) {
    using hslog::Tag;
    if (!has_process_ && tag != Tag::Process) throw Error(path_ + ": corrupt log: no process record first");
    if (has_process_ && tag == Tag::Process) throw Error(path_ + ": corrupt log: a second process record");
    switch (tag) {
        case Tag::Process: return process(r, visitor);
        case Tag::ModuleLoad: {
            ModuleRecord m;
            m.time_ns = r.varint();
            m.id = static_cast<uint32_t>(r.varint());
            m.load_bias = r.varint();
            m.start = r.varint();
            m.end = r.varint();
            m.path = std::string(r.str(hslog::kMaxPathBytes));
            m.build_id = std::string(r.str(hslog::kMaxBuildIdBytes));
            if (r.ok()) visitor.on_module_load(m);
            return;
        }
        case Tag::ModuleUnload: {
            uint64_t t = r.varint();
            auto id = static_cast<uint32_t>(r.varint());
            if (r.ok()) visitor.on_module_unload(id, t);
            return;
        }
        case Tag::Stack: {
            uint64_t wide = r.varint();
            if (wide == 0 || wide > stacks_ + kStackIdSlack) r.invalidate();
            auto id = static_cast<uint32_t>(wide);
            // Each id is defined once (the recorder numbers its stacks).
            if (r.ok() && id >= stack_defined_.size())
                stack_defined_.resize(std::max<size_t>(id + 1, 2 * stack_defined_.size()));
            if (r.ok() && stack_defined_[id]) r.invalidate();
            auto n = static_cast<uint32_t>(r.count(2, hslog::kMaxStackFrames));
            const uint8_t* frames = r.position();
            r.skip_varints(2 * uint64_t{n});  // module and address of each
            if (!r.ok()) return;
            stack_defined_[id] = true;
            stacks_++;
            max_stack_ = std::max(max_stack_, id);
            visitor.on_stack_record(id, n, std::span<const uint8_t>(frames, r.position()));
            return;
        }
        case Tag::ThreadStart: {
            ThreadStartRecord t;
            t.time_ns = advance(r);
            t.thread = static_cast<uint32_t>(r.varint());
            t.os_tid = r.varint();
            t.stack_lo = r.varint();
            t.stack_hi = r.varint();
            if (r.ok()) visitor.on_thread_start(t);
            return;
        }
        case Tag::ThreadExit: {
            uint64_t t = advance(r);
            auto thread = static_cast<uint32_t>(r.varint());
            if (r.ok()) visitor.on_thread_exit(thread, t);
            return;
        }
        case Tag::Thread:
        case Tag::ShortThread:
        case Tag::Time:
        case Tag::Alloc:
        case Tag::AllocAt:
        case Tag::AllocInfo:
        case Tag::Free:
        case Tag::ShortAllocInfo:
        case Tag::ShortFree: break;  // decode() handles them once the Process record is read
        case Tag::FreeAt:
        case Tag::FreeUnknown: {
            FreeEvent e;
            e.time_ns = now_;
            e.address = address(r);
            e.thread = thread_;
            e.untracked = tag == Tag::FreeUnknown;
            if (e.untracked && summary_.version >= hslog::kAttachedVersion) e.usable = r.varint();
            events_++;
            if (!r.ok()) return;
            if (!e.untracked && !infos_.free_at(e.address)) {  // no live addressed block there
                r.invalidate();
                return;
            }
            visitor.on_free(e);
            return;
        }
        case Tag::Mmap: {
            MmapEvent e;
            e.time_ns = now_;
            e.address = address(r);
            e.length = r.varint();
            e.prot = static_cast<uint32_t>(r.varint());
            e.flags = static_cast<uint32_t>(r.varint());
            e.stack = stack_ref(r);
            e.thread = thread_;
            events_++;
            if (r.ok()) visitor.on_mmap(e);
            return;
        }
        case Tag::Munmap: {
            MunmapEvent e;
            e.time_ns = now_;
            e.address = address(r);
            e.length = r.varint();
            e.thread = thread_;
            events_++;
            if (r.ok()) visitor.on_munmap(e);
            return;
        }
        case Tag::Marker: return marker(r, visitor);
        case Tag::End: {
            EndRecord e;
            e.time_ns = advance(r);
            e.reason = static_cast<hslog::EndReason>(r.u8());
            e.events = r.varint();
            if (summary_.version >= hslog::kUnrecordedVersion) e.unrecorded = r.varint();
            if (r.ok()) {
                summary_.complete = true;
                visitor.on_end(e);
            }
            return;
        }
    }
    throw Error(path_ + ": corrupt log: unknown record tag " + std::to_string(static_cast<int>(tag)));
}

void RecordStream::process(codec::Reader& r, LogVisitor& visitor) {
    ProcessInfo p;
    read_process_head(r, p);
    std::string_view cmdline = r.str(hslog::kMaxCmdlineBytes);
    while (!cmdline.empty()) {
        size_t nul = cmdline.find('\0');
        p.argv.emplace_back(cmdline.substr(0, nul));
        if (nul == std::string_view::npos) break;
        cmdline.remove_prefix(nul + 1);
    }
    p.sample_bytes = r.varint();
    if (p.sample_bytes > hslog::kMaxSampleBytes) throw Error(path_ + ": corrupt log: sample_bytes out of range");
    if (summary_.version >= hslog::kAttachedVersion) {
        uint8_t attached = r.u8();
        if (attached > 1) r.invalidate();
        p.attached = attached == 1;
    }
    if (!r.ok()) return;
    units_ = p.start_ns / hslog::kTimeUnitNs;
    now_ = p.start_ns;
    has_process_ = true;
    visitor.on_process(p);
    return;
}

void read_process_head(codec::Reader& r, ProcessInfo& p) {
    p.recorder_version = std::string(r.str(hslog::kMaxVersionBytes));
    p.pid = r.varint();
    p.ppid = r.varint();
    p.uid = r.varint();
    p.start_realtime_ns = r.varint();
    p.start_ns = r.varint();
    p.page_size = r.varint();
    p.unwind = static_cast<hslog::UnwindMode>(r.u8());
    p.max_depth = static_cast<uint32_t>(r.varint());
    p.exe = std::string(r.str(hslog::kMaxPathBytes));
}

MarkerRecord without_regions(const MarkerRecord& m) {
    MarkerRecord c;
    static_cast<MarkerFields&>(c) = m;
    return c;
}

void read_malloc_stats(codec::Reader& r, MarkerRecord& m) {
    auto kind = static_cast<hslog::MarkerStats>(r.u8());
    m.has_malloc = kind == hslog::MarkerStats::Mallinfo;
    m.has_allocator = kind == hslog::MarkerStats::Allocator;
    if (m.has_malloc) {
        MallocStats& s = m.malloc;
        for (uint64_t* v : {&s.arena, &s.ordblks, &s.hblks, &s.hblkhd, &s.uordblks, &s.fordblks, &s.keepcost})
            *v = r.varint();
    } else if (m.has_allocator) {
        hslog::AllocatorStats& a = m.allocator;
        uint8_t allocator = r.u8();
        a.present = r.u8();
        if (allocator == 0 || allocator >= hslog::kAllocatorKindCount ||
            (a.present & ~hslog::AllocatorStats::kAllFields))
            r.invalidate();
        a.kind = static_cast<hslog::AllocatorKind>(allocator);
        uint64_t* values[] = {&a.allocated, &a.active, &a.committed, &a.resident, &a.mapped};
        for (int i = 0; i < 5; ++i)
            if (a.present & (1u << i)) *values[i] = r.varint();
    } else if (kind != hslog::MarkerStats::None) {
        r.invalidate();
    }
}

void write_malloc_stats(std::vector<uint8_t>& out, const MarkerRecord& m) {
    uint8_t buf[3 + 7 * codec::kMaxVarint];
    codec::Writer w(buf, sizeof buf);
    if (m.has_malloc) {
        w.u8(static_cast<uint8_t>(hslog::MarkerStats::Mallinfo));
        const MallocStats& s = m.malloc;
        for (uint64_t v : {s.arena, s.ordblks, s.hblks, s.hblkhd, s.uordblks, s.fordblks, s.keepcost}) w.varint(v);
    } else if (m.has_allocator) {
        hslog::put_allocator_stats(w, m.allocator);
    } else {
        w.u8(static_cast<uint8_t>(hslog::MarkerStats::None));
    }
    out.insert(out.end(), buf, buf + w.size());
}

// What a marker costs its readers besides its label and regions: a
// MarkerRecord (232 bytes) in a listing row, in a vector that doubles,
// and its row of JSON or text.
constexpr uint64_t kMarkerBytes = 2048;

void RecordStream::marker(codec::Reader& r, LogVisitor& visitor) {
    MarkerRecord m;
    m.time_ns = advance(r);
    m.thread = static_cast<uint32_t>(r.varint());
    m.events = r.varint();
    if (summary_.version >= hslog::kUnrecordedVersion) m.unrecorded = r.varint();
    m.index = static_cast<uint32_t>(r.varint());
    m.cause = static_cast<hslog::MarkerCause>(r.u8());
    m.label = std::string(r.str(hslog::kMaxLabelBytes));
    m.rss_kb = r.varint();
    m.threads = static_cast<uint32_t>(r.varint());
    m.recorder_bytes = r.varint();
    read_malloc_stats(r, m);
    uint32_t regions = r.u32le();
    if (regions > r.remaining() / 11) {  // more than the frame could hold
        r.invalidate();
        regions = 0;
    }
    charge_.take(uint64_t{regions} * sizeof(MapRegion), "address-space regions");
    m.regions.reserve(regions);
    uint64_t prev_end = 0;
    uint64_t path_bytes = 0;
    for (uint32_t i = 0; i < regions && r.ok(); ++i) {
        MapRegion g;
        g.start = prev_end + static_cast<uint64_t>(r.svarint());
        g.end = g.start + r.varint();
        g.perms = r.u8();
        g.hint = static_cast<hslog::RegionHint>(r.u8());
        g.offset = r.varint();
        g.inode = r.varint();
        g.path = std::string(r.str(hslog::kMaxPathBytes));
        g.rss_kb = r.varint();
        g.pss_kb = r.varint();
        g.private_dirty_kb = r.varint();
        g.swap_kb = r.varint();
        prev_end = g.end;
        if (g.path.size() >= sizeof(std::string)) path_bytes += g.path.capacity() + 1;
        m.regions.push_back(std::move(g));
    }
    if (!r.ok()) return;
    // Visitors keep markers (a listing, the markers before a moment, a
    // snapshot at each), in vectors that double, and print them: as many
    // as the log has.
    charge_.take(kMarkerBytes + m.label.size() + path_bytes, "markers");
    visitor.on_marker(m);
    return;
}

struct LogFrames::State {
    State(const LogFile& log) : path(log.path), file(log), progress(log.path, file.size()) {}

    const std::string& path;
    MappedFile file;
    Progress progress;
    std::unique_ptr<ZSTD_DCtx, DctxFree> dctx{ZSTD_createDCtx()};
    // The frame being decoded. Replaced, never grown, when a frame is
    // larger: its old bytes are not wanted, and neither copying them nor
    // zeroing the new buffer is free (every page a fault on a fresh
    // process). Room for a whole frame of the writer's at once; the pages
    // a smaller frame leaves untouched are never faulted in.
    std::unique_ptr<uint8_t[]> payload;
    size_t capacity = 0;
    size_t offset = hslog::kHeaderSize;
};

LogFrames::LogFrames(const LogFile& log, ReadSummary& summary, const StreamPosition* from)
    : state_(std::make_unique<State>(log)), summary_(summary) {
    const std::string& path = log.path;
    const MappedFile& file = state_->file;
    summary.file_bytes = file.size();
    const uint8_t* data = file.data();
    if (file.size() < hslog::kHeaderSize || std::memcmp(data, hslog::kMagic, sizeof hslog::kMagic) != 0) {
        if (file.size() < hslog::kHeaderSize && file.size() > 0 &&
            std::memcmp(data, hslog::kMagic, std::min(file.size(), sizeof hslog::kMagic)) == 0)
            throw Error(path + ": truncated heapsnap log: the header is incomplete");
        throw Error(path + ": not a heapsnap log (bad magic)");
    }
    codec::Reader header(data + sizeof hslog::kMagic, hslog::kHeaderSize - sizeof hslog::kMagic);
    uint32_t version = header.u32le();
    if (version < hslog::kOldestLogVersion || version > hslog::kLogVersion)
        throw Error(path + ": unsupported log format version " + std::to_string(version) +
                    " (this heapsnap reads versions " + std::to_string(hslog::kOldestLogVersion) + " to " +
                    std::to_string(hslog::kLogVersion) + ")");
    summary.version = version;
    if (from) {
        if (from->offset < hslog::kHeaderSize || from->offset > file.size())
            throw Error(path + ": the log is shorter than a checkpoint of it says (was it replaced?)");
        state_->offset = from->offset;
    }
    summary.bytes_read = state_->offset;
}

LogFrames::~LogFrames() = default;

bool LogFrames::next(Frame& out, uint64_t events) {
    State& s = *state_;
    const std::string& path = s.path;
    size_t offset = s.offset;
    if (offset >= s.file.size()) return false;
    const uint8_t* frame = s.file.data() + offset;
    size_t left = s.file.size() - offset;
    size_t frame_size = ZSTD_findFrameCompressedSize(frame, left);
    if (ZSTD_isError(frame_size)) {
        // Either the writer was cut off inside this frame, or garbage: a
        // frame header that is valid (or a valid beginning of one) but
        // lacks bytes is a truncation; anything else is corruption.
        ZSTD_frameHeader fh;
        size_t header = ZSTD_getFrameHeader(&fh, frame, left);
        if (ZSTD_isError(header) || (header == 0 && fh.frameType != ZSTD_frame))
            throw Error(path + ": corrupt log: bad frame at byte " + std::to_string(offset));
        summary_.truncated = true;
        return false;
    }
    unsigned long long content = ZSTD_getFrameContentSize(frame, frame_size);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content > hslog::kMaxFramePayload)
        throw Error(path + ": corrupt log: bad frame header at byte " + std::to_string(offset));
    budget_take_volume(content);
    if (content > s.capacity) {
        s.payload.reset();
        s.capacity = std::max<size_t>(content, hslog::kFramePayload);
        s.payload = std::make_unique_for_overwrite<uint8_t[]>(s.capacity);
    }
    size_t got = ZSTD_decompressDCtx(s.dctx.get(), s.payload.get(), content, frame, frame_size);
    if (ZSTD_isError(got) || got != content)
        throw Error(path + ": corrupt log: frame at byte " + std::to_string(offset) + " does not decompress (" +
                    ZSTD_getErrorName(got) + ")");
    summary_.frames++;
    s.progress.update(offset, events);
    s.offset = offset + frame_size;
    // The frame counts as read once its records are handed out: a
    // corrupt record in it throws, and a stop inside it is not resumable.
    summary_.bytes_read = s.offset;
    out = Frame{std::span<const uint8_t>(s.payload.get(), content), offset, s.offset};
    return true;
}

std::vector<uint64_t> AllocInfos::addressed() const {
    std::vector<uint64_t> out;
    out.reserve(addressed_.size());
    addressed_.for_each([&](uint64_t address, uint8_t) { out.push_back(address); });
    return out;
}

bool AllocInfos::restore(std::vector<AllocInfo> infos, const std::vector<uint64_t>& addressed) {
    if (infos.empty() || infos[0].live != 0) return false;
    infos_ = std::move(infos);
    addressed_ = FlatMap<uint8_t>();
    for (uint64_t address : addressed)
        if (address == 0 || !addressed_.insert(address, 1)) return false;
    return true;
}

bool looks_like_log(const std::string& path) {
    return regular_file_starts_with(path, hslog::kMagic, sizeof hslog::kMagic);
}

ReadSummary read_log(const LogFile& log, LogVisitor& visitor) { return read_log_as(log, visitor); }

ReadSummary read_log(const std::string& path, LogVisitor& visitor) { return read_log_as(LogFile{path}, visitor); }

}  // namespace heapsnap
