#include "format/snapshot_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cstring>
#include <memory>

#include "format/codec.h"
#include "util/error.h"
#include "util/files.h"

namespace heapsnap {
namespace {

constexpr char kMagic[8] = {'H', 'S', 'N', 'A', 'P', 'S', 'H', 'T'};
constexpr size_t kHeaderSize = 16;
constexpr uint64_t kMaxBody = 1ull << 32;  // refuse to inflate more than 4 GiB

// A growable encoder over codec::Writer for the CLI side.
class Out {
public:
    void u8(uint8_t v) { bytes_.push_back(v); }
    void varint(uint64_t v) {
        uint8_t tmp[codec::kMaxVarint];
        codec::Writer w(tmp, sizeof tmp);
        w.varint(v);
        bytes_.insert(bytes_.end(), tmp, tmp + w.size());
    }
    void str(std::string_view s) {
        varint(s.size());
        bytes_.insert(bytes_.end(), s.begin(), s.end());
    }
    std::vector<uint8_t>& bytes() { return bytes_; }

private:
    std::vector<uint8_t> bytes_;
};

void put_process(Out& o, const ProcessInfo& p) {
    o.str(p.recorder_version);
    o.varint(p.pid);
    o.varint(p.ppid);
    o.varint(p.uid);
    o.varint(p.start_realtime_ns);
    o.varint(p.start_ns);
    o.varint(p.page_size);
    o.u8(static_cast<uint8_t>(p.unwind));
    o.varint(p.max_depth);
    o.str(p.exe);
    o.varint(p.argv.size());
    for (const auto& a : p.argv) o.str(a);
}

void put_marker(Out& o, const MarkerRecord& m, bool has_data) {
    o.u8(has_data ? 1 : 0);
    o.varint(m.time_ns);
    o.varint(m.thread);
    o.varint(m.index);
    o.u8(static_cast<uint8_t>(m.cause));
    o.str(m.label);
    o.varint(m.events);
    o.varint(m.rss_kb);
    o.varint(m.threads);
    o.varint(m.recorder_bytes);
    const MallocStats& s = m.malloc;
    for (uint64_t v : {s.arena, s.ordblks, s.hblks, s.hblkhd, s.uordblks, s.fordblks, s.keepcost}) o.varint(v);
    o.varint(m.regions.size());
    for (const MapRegion& r : m.regions) {
        o.varint(r.start);
        o.varint(r.end - r.start);
        o.u8(r.perms);
        o.u8(static_cast<uint8_t>(r.hint));
        o.varint(r.offset);
        o.varint(r.inode);
        o.str(r.path);
        o.varint(r.rss_kb);
        o.varint(r.pss_kb);
        o.varint(r.private_dirty_kb);
        o.varint(r.swap_kb);
    }
}

void get_process(codec::Reader& r, ProcessInfo& p) {
    p.recorder_version = std::string(r.str());
    p.pid = r.varint();
    p.ppid = r.varint();
    p.uid = r.varint();
    p.start_realtime_ns = r.varint();
    p.start_ns = r.varint();
    p.page_size = r.varint();
    p.unwind = static_cast<hslog::UnwindMode>(r.u8());
    p.max_depth = static_cast<uint32_t>(r.varint());
    p.exe = std::string(r.str());
    uint64_t n = r.count(1);
    for (uint64_t i = 0; i < n && r.ok(); ++i) p.argv.emplace_back(r.str());
}

void get_marker(codec::Reader& r, MarkerRecord& m, bool& has_data) {
    has_data = r.u8() != 0;
    m.time_ns = r.varint();
    m.thread = static_cast<uint32_t>(r.varint());
    m.index = static_cast<uint32_t>(r.varint());
    m.cause = static_cast<hslog::MarkerCause>(r.u8());
    m.label = std::string(r.str());
    m.events = r.varint();
    m.rss_kb = r.varint();
    m.threads = static_cast<uint32_t>(r.varint());
    m.recorder_bytes = r.varint();
    MallocStats& s = m.malloc;
    for (uint64_t* v : {&s.arena, &s.ordblks, &s.hblks, &s.hblkhd, &s.uordblks, &s.fordblks, &s.keepcost})
        *v = r.varint();
    uint64_t n = r.count(11);
    m.regions.resize(n);
    for (MapRegion& g : m.regions) {
        g.start = r.varint();
        g.end = g.start + r.varint();
        g.perms = r.u8();
        g.hint = static_cast<hslog::RegionHint>(r.u8());
        g.offset = r.varint();
        g.inode = r.varint();
        g.path = std::string(r.str());
        g.rss_kb = r.varint();
        g.pss_kb = r.varint();
        g.private_dirty_kb = r.varint();
        g.swap_kb = r.varint();
    }
}

std::vector<uint8_t> encode_body(const Snapshot& s) {
    Out o;
    put_process(o, s.process);
    put_marker(o, s.marker, s.has_marker_data);
    o.str(s.source);
    const SnapshotTotals& t = s.totals;
    for (uint64_t v : {t.live_bytes, t.live_blocks, t.mmap_bytes, t.mmap_regions, t.events, t.allocations,
                       t.untracked_frees, t.peak_bytes, t.peak_time_ns})
        o.varint(v);
    o.varint(s.modules.size());
    for (const SnapshotModule& m : s.modules) {
        o.varint(m.record.id);
        o.varint(m.record.time_ns);
        o.varint(m.record.load_bias);
        o.varint(m.record.start);
        o.varint(m.record.end);
        o.str(m.record.path);
        o.str(m.record.build_id);
        o.u8(m.loaded ? 1 : 0);
    }
    o.varint(s.threads.size());
    for (const ThreadStartRecord& th : s.threads) {
        o.varint(th.thread);
        o.varint(th.time_ns);
        o.varint(th.os_tid);
        o.varint(th.stack_lo);
        o.varint(th.stack_hi);
    }
    o.varint(s.stacks.size());
    for (const auto& [id, frames] : s.stacks) {
        o.varint(id);
        o.varint(frames.size());
        for (const StackFrame& f : frames) {
            o.varint(f.module);
            o.varint(f.vaddr);
        }
    }
    o.varint(s.entries.size());
    for (const SnapshotEntry& e : s.entries) {
        o.varint(e.stack);
        o.u8(static_cast<uint8_t>(e.kind));
        o.varint(e.bytes);
        o.varint(e.blocks);
        o.varint(e.oldest_ns);
        o.varint(e.newest_ns);
    }
    return std::move(o.bytes());
}

Snapshot decode_body(const std::string& path, const uint8_t* data, size_t size) {
    codec::Reader r(data, size);
    Snapshot s;
    get_process(r, s.process);
    get_marker(r, s.marker, s.has_marker_data);
    s.source = std::string(r.str());
    SnapshotTotals& t = s.totals;
    for (uint64_t* v : {&t.live_bytes, &t.live_blocks, &t.mmap_bytes, &t.mmap_regions, &t.events, &t.allocations,
                        &t.untracked_frees, &t.peak_bytes, &t.peak_time_ns})
        *v = r.varint();
    uint64_t n = r.count(8);
    s.modules.resize(n);
    for (SnapshotModule& m : s.modules) {
        m.record.id = static_cast<uint32_t>(r.varint());
        m.record.time_ns = r.varint();
        m.record.load_bias = r.varint();
        m.record.start = r.varint();
        m.record.end = r.varint();
        m.record.path = std::string(r.str());
        m.record.build_id = std::string(r.str());
        m.loaded = r.u8() != 0;
    }
    n = r.count(5);
    s.threads.resize(n);
    for (ThreadStartRecord& th : s.threads) {
        th.thread = static_cast<uint32_t>(r.varint());
        th.time_ns = r.varint();
        th.os_tid = r.varint();
        th.stack_lo = r.varint();
        th.stack_hi = r.varint();
    }
    n = r.count(2);
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
        auto id = static_cast<uint32_t>(r.varint());
        uint64_t frames = r.count(2);
        std::vector<StackFrame> stack(frames);
        for (StackFrame& f : stack) {
            f.module = static_cast<uint32_t>(r.varint());
            f.vaddr = r.varint();
        }
        s.stacks.emplace(id, std::move(stack));
    }
    n = r.count(6);
    s.entries.resize(n);
    for (SnapshotEntry& e : s.entries) {
        e.stack = static_cast<uint32_t>(r.varint());
        e.kind = static_cast<EntryKind>(r.u8());
        e.bytes = r.varint();
        e.blocks = r.varint();
        e.oldest_ns = r.varint();
        e.newest_ns = r.varint();
        if (e.kind != EntryKind::Heap && e.kind != EntryKind::Mmap) r.invalidate();
    }
    if (!r.ok() || !r.at_end()) throw Error(path + ": corrupt snapshot: malformed body");
    for (const SnapshotEntry& e : s.entries)
        if (!s.stacks.count(e.stack)) throw Error(path + ": corrupt snapshot: entry names unknown stack " + std::to_string(e.stack));
    return s;
}

}  // namespace

void write_snapshot(const std::string& path, const Snapshot& snapshot) {
    std::vector<uint8_t> body = encode_body(snapshot);
    std::vector<uint8_t> file(kHeaderSize + ZSTD_compressBound(body.size()));
    codec::Writer h(file.data(), kHeaderSize);
    h.raw(kMagic, sizeof kMagic);
    h.u32le(kSnapshotVersion);
    h.u32le(0);
    // With a checksum, a flipped bit is reported as corruption instead of
    // decoding into plausible wrong numbers.
    std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
    size_t n = ZSTD_compress2(cctx.get(), file.data() + kHeaderSize, file.size() - kHeaderSize, body.data(), body.size());
    if (ZSTD_isError(n)) throw Error(path + ": compression failed: " + ZSTD_getErrorName(n));
    file.resize(kHeaderSize + n);
    write_file_atomically(path, file);
}

bool looks_like_snapshot(const std::string& path) {
    char head[sizeof kMagic];
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    return n == static_cast<ssize_t>(sizeof head) && std::memcmp(head, kMagic, sizeof kMagic) == 0;
}

Snapshot read_snapshot(const std::string& path) {
    std::vector<uint8_t> file = read_file(path);
    if (file.size() < sizeof kMagic || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
        throw Error(path + ": not a heapsnap snapshot (bad magic)");
    if (file.size() < kHeaderSize) throw Error(path + ": truncated snapshot: the header is incomplete");
    codec::Reader h(file.data() + sizeof kMagic, kHeaderSize - sizeof kMagic);
    uint32_t version = h.u32le();
    if (version != kSnapshotVersion)
        throw Error(path + ": unsupported snapshot format version " + std::to_string(version) +
                    " (this heapsnap reads version " + std::to_string(kSnapshotVersion) + ")");
    const uint8_t* frame = file.data() + kHeaderSize;
    size_t frame_size = file.size() - kHeaderSize;
    size_t compressed = ZSTD_findFrameCompressedSize(frame, frame_size);
    unsigned long long content = ZSTD_getFrameContentSize(frame, frame_size);
    if (ZSTD_isError(compressed) || content == ZSTD_CONTENTSIZE_ERROR) {
        if (content != ZSTD_CONTENTSIZE_ERROR) throw Error(path + ": truncated snapshot");
        throw Error(path + ": corrupt snapshot: bad compressed body");
    }
    if (compressed != frame_size) throw Error(path + ": corrupt snapshot: trailing bytes after the body");
    if (content == ZSTD_CONTENTSIZE_UNKNOWN || content > kMaxBody) throw Error(path + ": corrupt snapshot: bad body size");
    std::vector<uint8_t> body(content);
    size_t got = ZSTD_decompress(body.data(), body.size(), frame, compressed);
    if (ZSTD_isError(got) || got != content) throw Error(path + ": corrupt snapshot: body does not decompress");
    return decode_body(path, body.data(), body.size());
}

}  // namespace heapsnap
