#include "report/render.h"

#include <fmt/format.h>

#include <sstream>

#include "util/human.h"
#include "util/files.h"
#include "util/text.h"

namespace heapsnap {
namespace {

struct Palette {
    bool on;
    std::string paint(const std::string& s, const char* code) const {
        return on ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
    }
    std::string grow(const std::string& s) const { return paint(s, "1;31"); }
    std::string shrink(const std::string& s) const { return paint(s, "32"); }
    std::string dim(const std::string& s) const { return paint(s, "2"); }
    std::string bold(const std::string& s) const { return paint(s, "1"); }
};

std::string describe_moment(const Snapshot& s) {
    std::string what = s.marker.index ? fmt::format("marker {} \"{}\"", s.marker.index, terminal_safe(s.marker.label))
                                      : fmt::format("moment \"{}\"", terminal_safe(s.marker.label));
    std::string text = fmt::format("pid {}  {}  {} at {:.3f} s  live {} in {} blocks", s.process.pid,
                                   terminal_safe(basename_of(s.process.exe)), what, s.time_s(),
                                   human_bytes(s.totals.live_bytes), s.totals.live_blocks);
    if (s.process.sample_bytes) text += "  (" + sampling_note(s.process.sample_bytes) + ")";
    return text;
}

std::string signed_count(int64_t v) { return v > 0 ? fmt::format("+{}", v) : fmt::format("{}", v); }

// The frees of blocks allocated before recording between the two moments
// (counted by the replay of an attached recorder's log).
struct FreedBefore {
    int64_t blocks_delta;
    int64_t bytes_delta;
};

FreedBefore freed_before(const Snapshot& a, const Snapshot& b) {
    return {static_cast<int64_t>(b.totals.freed_before_blocks - a.totals.freed_before_blocks),
            static_cast<int64_t>(b.totals.freed_before_bytes - a.totals.freed_before_bytes)};
}

std::string frame_location(const SymbolFrame& f) {
    if (f.file.empty()) return "";
    return terminal_safe(f.line ? fmt::format("{}:{}", f.file, f.line) : f.file);
}

}  // namespace

addrspace::AddressSpaceSummary summarize_snapshot(const Snapshot& s) {
    addrspace::SummaryInputs in;
    in.regions = s.marker.regions;
    for (const MapRegion& r : s.marker.regions)
        if (r.hint == hslog::RegionHint::Heap) in.heap_block_ranges.emplace_back(r.start, r.start + 1);
    for (const ThreadStartRecord& t : s.threads)
        if (t.stack_hi > t.stack_lo) in.thread_stacks.emplace_back(t.stack_lo, t.stack_hi);
    in.tracked = true;
    in.attached = s.process.attached;
    in.tracked_live_bytes = s.totals.live_bytes;
    in.tracked_live_blocks = s.totals.live_blocks;
    in.malloc = s.marker.malloc;
    in.has_malloc = s.has_marker_data && s.marker.has_malloc;
    in.has_allocator = s.has_marker_data && s.marker.has_allocator;
    in.allocator = s.marker.allocator;
    in.allocator_name = addrspace::allocator_from_regions(s.marker.regions);
    in.threads = s.marker.threads;
    in.recorder_bytes = s.marker.recorder_bytes;
    return addrspace::summarize(in);
}

std::string render_diff_text(const Snapshot& old_snap, const Snapshot& new_snap, const DiffResult& diff, bool color) {
    std::ostringstream out;
    write_diff_text(out, old_snap, new_snap, diff, color);
    return std::move(out).str();
}

void write_diff_text(std::ostream& os, const Snapshot& old_snap, const Snapshot& new_snap, const DiffResult& diff,
                     bool color) {
    Palette p{color};
    std::string out;
    out += p.bold("heapsnap diff") + "\n";
    out += "  old: " + describe_moment(old_snap) + "\n";
    out += "  new: " + describe_moment(new_snap) + "\n";
    std::string total = fmt::format("{} bytes ({})  {} blocks", signed_count(diff.bytes_delta),
                                    human_bytes_signed(diff.bytes_delta), signed_count(diff.blocks_delta));
    out += "  total: " + (diff.bytes_delta > 0 ? p.grow(total) : diff.bytes_delta < 0 ? p.shrink(total) : total) + "\n";
    if (old_snap.process.attached || new_snap.process.attached) {
        FreedBefore f = freed_before(old_snap, new_snap);
        out += fmt::format("  freed, allocated before recording: {} blocks, {} bytes (usable sizes)\n",
                           signed_count(f.blocks_delta), signed_count(f.bytes_delta));
    }
    if (old_snap.has_marker_data && new_snap.has_marker_data) {
        auto a = summarize_snapshot(old_snap);
        auto b = summarize_snapshot(new_snap);
        out += "  what grew? " + addrspace::verdict(a, b) + "\n";
    }
    out += "\n";
    if (diff.entries.empty()) out += "No call site changed.\n";
    for (const DiffEntry& e : diff.entries) {
        char sign = e.bytes_delta >= 0 ? '+' : '-';
        uint64_t magnitude = static_cast<uint64_t>(e.bytes_delta < 0 ? -e.bytes_delta : e.bytes_delta);
        bool heap = e.kind == EntryKind::Heap;
        std::string head =
            fmt::format("{} {:>9} ( {:>9} - {:>9} ) {:>7} {}  ({} {}, {})", sign, magnitude, e.new_bytes, e.old_bytes,
                        e.new_blocks, heap ? "allocs" : "mmaps", signed_count(e.blocks_delta),
                        heap ? "blocks" : "regions", human_bytes_signed(e.bytes_delta));
        out += (e.bytes_delta > 0 ? p.grow(head) : e.bytes_delta < 0 ? p.shrink(head) : head) + "\n";
        for (const SymbolFrame& f : e.frames) {
            std::string name = terminal_safe(frame_label(f));
            if (f.inlined) name += " [inlined]";
            // Long (C++) names push the location right instead of breaking
            // the columns of the frames below.
            std::string location = frame_location(f);
            out += fmt::format("        {:<40}  {:<32}  {}\n", name, location.empty() ? "" : p.dim(location),
                               p.dim(terminal_safe(basename_of(f.module))));
        }
        out += "\n";
        // Entry by entry: every site of a large program's diff is hundreds
        // of MiB of text.
        os << out;
        out.clear();
    }
    if (old_snap.has_marker_data && new_snap.has_marker_data) {
        out += p.bold("Address space") + "\n";
        out += addrspace::render_delta_text(summarize_snapshot(old_snap), summarize_snapshot(new_snap), color);
    } else {
        out += "Address space: not available (a moment without a marker has no address-space data)\n";
    }
    os << out;
}

nlohmann::json frame_json(const SymbolFrame& f) {
    return {{"function", f.function.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.function)},
            {"file", f.file.empty() ? nlohmann::json(nullptr) : nlohmann::json(f.file)},
            {"line", f.line ? nlohmann::json(f.line) : nlohmann::json(nullptr)},
            {"module", f.module},
            {"offset", f.offset},
            {"inlined", f.inlined}};
}

nlohmann::json moment_json(const Snapshot& s) {
    return {{"pid", s.process.pid},
            {"exe", s.process.exe},
            {"label", s.marker.label},
            {"marker_index", s.marker.index},
            {"time_s", s.time_s()},
            {"live_bytes", s.totals.live_bytes},
            {"live_blocks", s.totals.live_blocks},
            {"mmap_bytes", s.totals.mmap_bytes},
            {"mmap_regions", s.totals.mmap_regions},
            {"sample_bytes", s.process.sample_bytes},
            {"attached", s.process.attached},
            {"source", s.source}};
}

nlohmann::json diff_to_json(const Snapshot& old_snap, const Snapshot& new_snap, const DiffResult& diff) {
    nlohmann::json entries = nlohmann::json::array();
    for (const DiffEntry& e : diff.entries) {
        nlohmann::json frames = nlohmann::json::array();
        for (const SymbolFrame& f : e.frames) frames.push_back(frame_json(f));
        entries.push_back({{"bytes_delta", e.bytes_delta},
                           {"blocks_delta", e.blocks_delta},
                           {"old_bytes", e.old_bytes},
                           {"new_bytes", e.new_bytes},
                           {"old_blocks", e.old_blocks},
                           {"new_blocks", e.new_blocks},
                           {"kind", e.kind == EntryKind::Heap ? "heap" : "mmap"},
                           {"frames", std::move(frames)}});
    }
    nlohmann::json address_space = nullptr;
    if (old_snap.has_marker_data && new_snap.has_marker_data) {
        auto a = summarize_snapshot(old_snap);
        auto b = summarize_snapshot(new_snap);
        address_space = {{"old", addrspace::to_json(a)},
                         {"new", addrspace::to_json(b)},
                         {"delta", addrspace::delta_json(a, b)},
                         {"verdict", addrspace::verdict(a, b)}};
    }
    nlohmann::json before = nullptr;
    if (old_snap.process.attached || new_snap.process.attached) {
        FreedBefore f = freed_before(old_snap, new_snap);
        before = {{"blocks_delta", f.blocks_delta},
                  {"bytes_delta", f.bytes_delta},
                  {"old_blocks", old_snap.totals.freed_before_blocks},
                  {"new_blocks", new_snap.totals.freed_before_blocks},
                  {"old_bytes", old_snap.totals.freed_before_bytes},
                  {"new_bytes", new_snap.totals.freed_before_bytes}};
    }
    return {{"format", "heapsnap-diff"},
            {"version", 1},
            {"old", moment_json(old_snap)},
            {"new", moment_json(new_snap)},
            {"total", {{"bytes_delta", diff.bytes_delta}, {"blocks_delta", diff.blocks_delta}}},
            {"freed_before_recording", std::move(before)},
            {"entries", std::move(entries)},
            {"address_space", std::move(address_space)},
            {"warnings", diff.warnings}};
}

std::string render_diff_csv(const DiffResult& diff) {
    std::string out = "bytes_delta,blocks_delta,old_bytes,new_bytes,old_blocks,new_blocks,kind,top_frame,stack\n";
    for (const DiffEntry& e : diff.entries) {
        std::string stack;
        for (const SymbolFrame& f : e.frames) {
            if (!stack.empty()) stack += ";";
            stack += frame_label(f);
        }
        std::string top = e.frames.empty() ? "" : frame_label(e.frames.front());
        out += fmt::format("{},{},{},{},{},{},{},{},{}\n", e.bytes_delta, e.blocks_delta, e.old_bytes, e.new_bytes,
                           e.old_blocks, e.new_blocks, e.kind == EntryKind::Heap ? "heap" : "mmap", csv_field(top),
                           csv_field(stack));
    }
    return out;
}

std::string render_freed_before_csv(const Snapshot& old_snap, const Snapshot& new_snap) {
    if (!old_snap.process.attached && !new_snap.process.attached) return "";
    FreedBefore f = freed_before(old_snap, new_snap);
    return fmt::format("{},{},{},{},{},{},freed_before_recording,{},\n", f.bytes_delta, f.blocks_delta,
                       old_snap.totals.freed_before_bytes, new_snap.totals.freed_before_bytes,
                       old_snap.totals.freed_before_blocks, new_snap.totals.freed_before_blocks,
                       csv_field("freed, allocated before recording"));
}

}  // namespace heapsnap
