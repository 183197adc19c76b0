#include "format/snapshot_file.h"

#include "format/codec.h"
#include "format/framed_file.h"
#include "util/error.h"
#include "util/read_budget.h"

namespace heapsnap {
namespace {

const FileKind kSnapshotKind{"HSNAPSHT", kSnapshotVersion, "snapshot", kOldestSnapshotVersion};

}  // namespace

void put_process(ByteBuffer& o, const ProcessInfo& p) {
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
    o.varint(p.sample_bytes);
    o.u8(p.attached ? 1 : 0);
}

void put_marker(ByteBuffer& o, const MarkerRecord& m, bool has_data) {
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
    write_malloc_stats(o.bytes(), m);
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

void get_process(codec::Reader& r, ProcessInfo& p, uint32_t version) {
    read_process_head(r, p);
    // The arguments of a command line of at most kMaxCmdlineBytes.
    uint64_t n = r.count(1, hslog::kMaxCmdlineBytes);
    for (uint64_t i = 0; i < n && r.ok(); ++i) p.argv.emplace_back(r.str(hslog::kMaxCmdlineBytes));
    p.sample_bytes = r.varint();
    if (version >= kSnapshotAttachedVersion) {
        uint8_t attached = r.u8();
        if (attached > 1) r.invalidate();
        p.attached = attached == 1;
    }
}

void get_marker(codec::Reader& r, MarkerRecord& m, bool& has_data) {
    has_data = r.u8() != 0;
    m.time_ns = r.varint();
    m.thread = static_cast<uint32_t>(r.varint());
    m.index = static_cast<uint32_t>(r.varint());
    m.cause = static_cast<hslog::MarkerCause>(r.u8());
    m.label = std::string(r.str(hslog::kMaxLabelBytes));
    m.events = r.varint();
    m.rss_kb = r.varint();
    m.threads = static_cast<uint32_t>(r.varint());
    m.recorder_bytes = r.varint();
    read_malloc_stats(r, m);
    uint64_t n = r.count(11);
    budget_take_memory(n * sizeof(MapRegion), "address-space regions");
    m.regions.resize(n);
    for (MapRegion& g : m.regions) {
        g.start = r.varint();
        g.end = g.start + r.varint();
        g.perms = r.u8();
        g.hint = static_cast<hslog::RegionHint>(r.u8());
        g.offset = r.varint();
        g.inode = r.varint();
        g.path = std::string(r.str(hslog::kMaxPathBytes));
        budget_take_memory(g.path.capacity(), "address-space regions");
        g.rss_kb = r.varint();
        g.pss_kb = r.varint();
        g.private_dirty_kb = r.varint();
        g.swap_kb = r.varint();
    }
}

void put_module(ByteBuffer& o, const SnapshotModule& m) {
    o.varint(m.record.id);
    o.varint(m.record.time_ns);
    o.varint(m.record.load_bias);
    o.varint(m.record.start);
    o.varint(m.record.end);
    o.str(m.record.path);
    o.str(m.record.build_id);
    o.u8(m.loaded ? 1 : 0);
}

void get_module(codec::Reader& r, SnapshotModule& m) {
    m.record.id = static_cast<uint32_t>(r.varint());
    m.record.time_ns = r.varint();
    m.record.load_bias = r.varint();
    m.record.start = r.varint();
    m.record.end = r.varint();
    m.record.path = std::string(r.str(hslog::kMaxPathBytes));
    m.record.build_id = std::string(r.str(hslog::kMaxBuildIdBytes));
    m.loaded = r.u8() != 0;
}

void put_thread(ByteBuffer& o, const ThreadStartRecord& t) {
    o.varint(t.thread);
    o.varint(t.time_ns);
    o.varint(t.os_tid);
    o.varint(t.stack_lo);
    o.varint(t.stack_hi);
}

void get_thread(codec::Reader& r, ThreadStartRecord& t) {
    t.thread = static_cast<uint32_t>(r.varint());
    t.time_ns = r.varint();
    t.os_tid = r.varint();
    t.stack_lo = r.varint();
    t.stack_hi = r.varint();
}

void put_stack(ByteBuffer& o, uint32_t id, std::span<const StackFrame> frames) {
    o.varint(id);
    o.varint(frames.size());
    for (const StackFrame& f : frames) {
        o.varint(f.module);
        o.varint(f.vaddr);
    }
}

uint32_t get_stack(codec::Reader& r, std::vector<StackFrame>& frames) {
    auto id = static_cast<uint32_t>(r.varint());
    frames.resize(r.count(2, hslog::kMaxStackFrames));
    for (StackFrame& f : frames) {
        f.module = static_cast<uint32_t>(r.varint());
        f.vaddr = r.varint();
    }
    return id;
}

namespace {

std::vector<uint8_t> encode_body(const Snapshot& s) {
    ByteBuffer o;
    put_process(o, s.process);
    put_marker(o, s.marker, s.has_marker_data);
    o.str(s.source);
    const SnapshotTotals& t = s.totals;
    for (uint64_t v : {t.live_bytes, t.live_blocks, t.mmap_bytes, t.mmap_regions, t.events, t.allocations,
                       t.untracked_frees, t.peak_bytes, t.peak_time_ns, t.freed_before_blocks, t.freed_before_bytes})
        o.varint(v);
    o.varint(s.modules.size());
    for (const SnapshotModule& m : s.modules) put_module(o, m);
    o.varint(s.threads.size());
    for (const ThreadStartRecord& th : s.threads) put_thread(o, th);
    o.varint(s.stacks.size());
    for (const auto& [id, frames] : s.stacks) put_stack(o, id, frames);
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

// What a module of a Snapshot holds beyond its strings' bytes.
constexpr uint64_t kModuleBytes = sizeof(SnapshotModule) + 64;

Snapshot decode_body(const std::string& path, const uint8_t* data, size_t size, uint32_t version) {
    codec::Reader r(data, size);
    Snapshot s;
    get_process(r, s.process, version);
    get_marker(r, s.marker, s.has_marker_data);
    s.source = std::string(r.str(hslog::kMaxPathBytes));
    SnapshotTotals& t = s.totals;
    for (uint64_t* v : {&t.live_bytes, &t.live_blocks, &t.mmap_bytes, &t.mmap_regions, &t.events, &t.allocations,
                        &t.untracked_frees, &t.peak_bytes, &t.peak_time_ns})
        *v = r.varint();
    if (version >= kSnapshotAttachedVersion) {
        t.freed_before_blocks = r.varint();
        t.freed_before_bytes = r.varint();
    }
    uint64_t n = r.count(8);
    budget_take_memory(n * kModuleBytes, "modules");
    s.modules.resize(n);
    for (SnapshotModule& m : s.modules) get_module(r, m);
    n = r.count(5);
    budget_take_memory(n * sizeof(ThreadStartRecord), "threads");
    s.threads.resize(n);
    for (ThreadStartRecord& th : s.threads) get_thread(r, th);
    n = r.count(2);
    for (uint64_t i = 0; i < n && r.ok(); ++i) {
        std::vector<StackFrame> stack;
        uint32_t id = get_stack(r, stack);
        budget_take_memory(kSnapshotStackBytes + stack.size() * sizeof(StackFrame), "stacks");
        // Each id once: a second definition would replace the first.
        if (!s.stacks.emplace(id, std::move(stack)).second) r.invalidate();
    }
    n = r.count(6);
    budget_take_memory(n * sizeof(SnapshotEntry), "entries");
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
        if (!s.stacks.count(e.stack))
            throw Error(path + ": corrupt snapshot: entry names unknown stack " + std::to_string(e.stack));
    return s;
}

}  // namespace

void write_snapshot(const std::string& path, const Snapshot& snapshot) {
    write_framed_file(path, kSnapshotKind, encode_body(snapshot));
}

bool looks_like_snapshot(const std::string& path) { return has_magic(path, kSnapshotKind.magic); }

Snapshot read_snapshot(const std::string& path) {
    MemoryCharge body_charge;  // given back with the body, once decoded
    uint32_t version = 0;
    std::vector<uint8_t> body = read_framed_file(path, kSnapshotKind, body_charge, &version);
    try {
        return decode_body(path, body.data(), body.size(), version);
    } catch (const BudgetExceeded& e) {
        throw Error(path + ": reading it " + e.what());
    }
}

}  // namespace heapsnap
