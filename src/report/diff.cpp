#include "report/diff.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "util/read_budget.h"

namespace heapsnap {
namespace {

std::string basename_of(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool starts_with(const std::string& s, std::string_view prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string frame_key(const SymbolFrame& f) {
    if (!f.function.empty())
        return fmt::format("F\x1f{}\x1f{}\x1f{}\x1f{}", f.function, f.file, f.line, f.inlined ? 1 : 0);
    return fmt::format("A\x1f{}\x1f{:x}", f.module, f.offset);
}

// The frame a function/line/module grouping is about.
const SymbolFrame* site_frame(const std::vector<SymbolFrame>& frames) {
    for (const SymbolFrame& f : frames)
        if (!is_allocation_frame(f)) return &f;
    return frames.empty() ? nullptr : &frames.back();
}

std::string group_key(const std::vector<SymbolFrame>& frames, GroupBy by, std::vector<SymbolFrame>* shown) {
    if (by == GroupBy::Stack) {
        std::string key;
        for (const SymbolFrame& f : frames) key += frame_key(f) + "\x1e";
        *shown = frames;
        return key;
    }
    const SymbolFrame* site = site_frame(frames);
    if (!site) {
        shown->clear();
        return "";
    }
    SymbolFrame f = *site;
    switch (by) {
        case GroupBy::Function:
            f.file.clear();
            f.line = 0;
            f.inlined = false;
            *shown = {f};
            return f.function.empty() ? frame_key(*site) : "F\x1f" + f.function;
        case GroupBy::Line:
            f.inlined = false;
            *shown = {f};
            return f.function.empty() ? frame_key(*site) : fmt::format("L\x1f{}\x1f{}\x1f{}", f.function, f.file, f.line);
        case GroupBy::Module:
            f.function.clear();
            f.file.clear();
            f.line = 0;
            f.offset = 0;
            f.inlined = false;
            *shown = {f};
            return "M\x1f" + f.module;
        case GroupBy::Stack: break;
    }
    return "";
}

struct Side {
    uint64_t bytes = 0;
    uint64_t blocks = 0;
};

struct Group {
    EntryKind kind;
    std::vector<SymbolFrame> frames;
    Side old_side;
    Side new_side;
};

}  // namespace

bool is_allocation_frame(const SymbolFrame& f) {
    // Demangled template instances may start with their return type
    // ("void std::vector<int>::_M_realloc_insert<...>"): look at the name
    // after it. The standard library's own functions (containers, strings,
    // smart pointers, allocators) are plumbing: the site is their caller.
    std::string_view name = f.function;
    if (size_t space = name.find(' '); space != std::string_view::npos && name.find('(') > space &&
                                       name.find('<') > space && name.compare(0, 8, "operator") != 0)
        name.remove_prefix(space + 1);
    for (std::string_view lib : {"std::", "__gnu_cxx::", "__cxxabiv1::"})
        if (name.substr(0, lib.size()) == lib) return true;
    static const std::string_view kPrefixes[] = {
        "operator new",           "std::allocator",          "std::__new_allocator",     "__gnu_cxx::new_allocator",
        "__gnu_cxx::__new_allocator", "std::allocator_traits", "std::__allocated_ptr",     "std::_Vector_base",
        "std::__cxx11::basic_string", "std::basic_string",     "std::_Hashtable_alloc",    "std::__detail::_Hashtable_alloc",
        "std::_Deque_base",       "std::_Rb_tree",           "std::__shared_count",      "std::__allocate_shared",
        "std::make_shared",       "std::make_unique",
    };
    for (std::string_view p : kPrefixes)
        if (name.substr(0, p.size()) == p) return true;
    std::string module = basename_of(f.module);
    return starts_with(module, "libc.so") || starts_with(module, "libstdc++.so") || starts_with(module, "ld-linux") ||
           starts_with(module, "libc++");
}

std::string frame_label(const SymbolFrame& f) {
    if (!f.function.empty()) return f.function;
    return fmt::format("{}+0x{:x}", basename_of(f.module), f.offset);
}

StackSymbols::StackSymbols(const Snapshot& snapshot, Symbolizer& symbolizer, const std::vector<std::regex>& exclude)
    : snapshot_(snapshot), symbolizer_(symbolizer), exclude_(exclude) {
    for (const SnapshotModule& m : snapshot.modules) modules_[m.record.id] = &m;
}

std::vector<SymbolFrame> StackSymbols::symbolized(const StackFrame& raw) const {
    budget_take_volume(kSymbolizeVolume);
    std::vector<SymbolFrame> out;
    auto known = modules_.find(raw.module);
    const SnapshotModule* module = known == modules_.end() ? nullptr : known->second;
    if (!module || module->record.path.empty() || module->record.path[0] != '/') {
        SymbolFrame f;
        f.module = module ? module->record.path : "?";
        f.offset = raw.vaddr;
        out.push_back(std::move(f));
    } else {
        ModuleRef ref{module->record.path, module->record.build_id};
        // Return addresses point after the call; look up the call itself.
        for (SymbolFrame f : symbolizer_.symbolize(ref, raw.vaddr ? raw.vaddr - 1 : 0)) {
            f.offset = raw.vaddr;
            out.push_back(std::move(f));
        }
    }
    if (!exclude_.empty()) {
        std::erase_if(out, [&](const SymbolFrame& f) {
            std::string label = frame_label(f);
            return std::any_of(exclude_.begin(), exclude_.end(),
                               [&](const std::regex& re) { return std::regex_search(label, re); });
        });
    }
    return out;
}

std::vector<SymbolFrame> StackSymbols::frames(uint32_t stack) const {
    std::vector<SymbolFrame> out;
    auto it = snapshot_.stacks.find(stack);
    if (it == snapshot_.stacks.end()) return out;
    for (const StackFrame& raw : it->second)
        for (SymbolFrame& f : symbolized(raw)) out.push_back(std::move(f));
    budget_take_memory(out.size() * kSymbolFrameBytes, "symbolized frames");
    return out;
}

std::vector<uint32_t> StackSymbols::frame_ids(uint32_t stack) {
    std::vector<uint32_t> ids;
    auto it = snapshot_.stacks.find(stack);
    if (it == snapshot_.stacks.end()) return ids;
    for (const StackFrame& raw : it->second) {
        auto [known, fresh] = ids_of_raw_.try_emplace({raw.module, raw.vaddr});
        if (fresh) {
            std::vector<SymbolFrame> frames = symbolized(raw);
            budget_take_memory(64 + frames.size() * kSymbolFrameBytes, "symbolized frames");
            known->second = {static_cast<uint32_t>(frames_.size()), static_cast<uint32_t>(frames.size())};
            for (SymbolFrame& f : frames) frames_.push_back(std::move(f));
        }
        for (uint32_t i = 0; i < known->second.second; ++i) ids.push_back(known->second.first + i);
    }
    return ids;
}

DiffResult diff(const Snapshot& old_snap, const Snapshot& new_snap, const DiffOptions& options, Symbolizer& symbolizer) {
    DiffResult result;
    if (old_snap.process.exe != new_snap.process.exe)
        result.warnings.push_back(fmt::format("the snapshots are of different programs ({} and {})", old_snap.process.exe,
                                              new_snap.process.exe));

    std::map<std::pair<std::string, EntryKind>, Group> groups;
    auto add = [&](const Snapshot& snap, bool is_new) {
        StackSymbols symbols(snap, symbolizer, options.exclude);
        std::map<uint32_t, std::vector<SymbolFrame>> cache;
        for (const SnapshotEntry& e : snap.entries) {
            auto [it, fresh] = cache.try_emplace(e.stack);
            if (fresh) it->second = symbols.frames(e.stack);
            std::vector<SymbolFrame> shown;
            std::string key = group_key(it->second, options.group_by, &shown);
            auto [g, inserted] = groups.try_emplace({key, e.kind}, Group{e.kind, {}, {}, {}});
            if (inserted) budget_take_memory(key.size() + shown.size() * kSymbolFrameBytes, "call sites");
            if (inserted) g->second.frames = std::move(shown);
            Side& side = is_new ? g->second.new_side : g->second.old_side;
            side.bytes += e.bytes;
            side.blocks += e.blocks;
        }
    };
    add(old_snap, false);
    add(new_snap, true);

    for (auto& [key, g] : groups) {
        DiffEntry e;
        e.kind = g.kind;
        e.old_bytes = g.old_side.bytes;
        e.new_bytes = g.new_side.bytes;
        e.old_blocks = g.old_side.blocks;
        e.new_blocks = g.new_side.blocks;
        e.bytes_delta = static_cast<int64_t>(e.new_bytes) - static_cast<int64_t>(e.old_bytes);
        e.blocks_delta = static_cast<int64_t>(e.new_blocks) - static_cast<int64_t>(e.old_blocks);
        if (!e.bytes_delta && !e.blocks_delta) continue;
        result.bytes_delta += e.bytes_delta;
        result.blocks_delta += e.blocks_delta;
        e.frames = std::move(g.frames);
        result.entries.push_back(std::move(e));
    }
    std::stable_sort(result.entries.begin(), result.entries.end(), [](const DiffEntry& a, const DiffEntry& b) {
        return std::tie(b.bytes_delta, b.blocks_delta) < std::tie(a.bytes_delta, a.blocks_delta);
    });
    if (options.min_bytes)
        std::erase_if(result.entries, [&](const DiffEntry& e) {
            return static_cast<uint64_t>(e.bytes_delta < 0 ? -e.bytes_delta : e.bytes_delta) < options.min_bytes;
        });
    if (options.top && result.entries.size() > options.top) result.entries.resize(options.top);
    for (const std::string& w : symbolizer.warnings()) result.warnings.push_back(w);
    return result;
}

}  // namespace heapsnap
