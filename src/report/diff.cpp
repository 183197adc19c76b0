#include "report/diff.h"
#include "util/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "util/read_budget.h"

namespace heapsnap {
namespace {

bool starts_with(const std::string& s, std::string_view prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string frame_key(const SymbolFrame& f) {
    if (!f.function.empty())
        return fmt::format("F\x1f{}\x1f{}\x1f{}\x1f{}", f.function, f.file, f.line, f.inlined ? 1 : 0);
    return fmt::format("A\x1f{}\x1f{:x}", f.module, f.offset);
}

// The grouping key of a site frame (function, line or module grouping):
// what the frame shows in that grouping, and the text it is keyed by.
std::string group_key(const SymbolFrame* site, GroupBy by, std::vector<SymbolFrame>* shown) {
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
            return f.function.empty() ? frame_key(*site)
                                      : fmt::format("L\x1f{}\x1f{}\x1f{}", f.function, f.file, f.line);
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
    FrameList frames;
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
        "operator new",
        "std::allocator",
        "std::__new_allocator",
        "__gnu_cxx::new_allocator",
        "__gnu_cxx::__new_allocator",
        "std::allocator_traits",
        "std::__allocated_ptr",
        "std::_Vector_base",
        "std::__cxx11::basic_string",
        "std::basic_string",
        "std::_Hashtable_alloc",
        "std::__detail::_Hashtable_alloc",
        "std::_Deque_base",
        "std::_Rb_tree",
        "std::__shared_count",
        "std::__allocate_shared",
        "std::make_shared",
        "std::make_unique",
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

uint32_t FrameKeys::intern(const SymbolFrame& frame) {
    // With the separator the keys of a stack were once joined by: ranks
    // order key sequences as those joined texts compared.
    auto [it, fresh] = ids_.try_emplace(frame_key(frame) + "\x1e", static_cast<uint32_t>(texts_.size()));
    if (fresh) texts_.push_back(&it->first);
    return it->second;
}

std::vector<uint32_t> FrameKeys::identity_ranks() const {
    std::vector<uint32_t> by_text(texts_.size());
    for (uint32_t id = 0; id < by_text.size(); ++id) by_text[id] = id;
    std::sort(by_text.begin(), by_text.end(), [&](uint32_t a, uint32_t b) { return *texts_[a] < *texts_[b]; });
    std::vector<uint32_t> rank(texts_.size());
    for (uint32_t r = 0; r < by_text.size(); ++r) rank[by_text[r]] = r;
    return rank;
}

size_t SiteIndex::Hash::operator()(const std::vector<uint32_t>& v) const {
    uint64_t h = v.size();
    for (uint32_t x : v) h = (h ^ x) * 0x9e3779b97f4a7c15ull;
    return static_cast<size_t>(h ^ h >> 29);
}

size_t SiteIndex::find_or_add(const std::vector<uint32_t>& keys, EntryKind kind, bool* fresh) {
    std::vector<uint32_t> full;
    full.reserve(keys.size() + 1);
    full.assign(keys.begin(), keys.end());
    full.push_back(static_cast<uint32_t>(kind));
    auto [it, added] = index_.try_emplace(std::move(full), sites_.size());
    if (added) sites_.push_back(&it->first);
    *fresh = added;
    return it->second;
}

std::vector<size_t> SiteIndex::identity_order(const FrameKeys& keys) const {
    std::vector<uint32_t> rank = keys.identity_ranks();
    std::vector<size_t> order(sites_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        const std::vector<uint32_t>& a = *sites_[x];
        const std::vector<uint32_t>& b = *sites_[y];
        size_t na = a.size() - 1, nb = b.size() - 1;  // the kind is last
        for (size_t i = 0; i < na && i < nb; ++i)
            if (a[i] != b[i]) return rank[a[i]] < rank[b[i]];
        if (na != nb) return na < nb;
        return a[na] < b[nb];
    });
    return order;
}

StackSymbols::StackSymbols(const Snapshot& snapshot, Symbolizer& symbolizer, const std::vector<std::regex>& exclude,
                           const StackTable* more)
    : snapshot_(snapshot), symbolizer_(symbolizer), exclude_(exclude), more_(more) {
    for (const SnapshotModule& m : snapshot.modules) modules_[m.record.id] = &m;
}

std::vector<SymbolFrame> StackSymbols::symbolized(const StackFrame& raw) const {
    budget_take_volume(kSymbolizeVolume);
    std::vector<SymbolFrame> out;
    auto known = modules_.find(raw.module);
    const SnapshotModule* module = known == modules_.end() ? nullptr : known->second;
    if (hslog::is_paused_site_frame(raw.module, raw.vaddr)) {
        // The one frame of every allocation recorded while stacks were
        // paused (formats/hslog.md, "Paused site"): a site of its own.
        SymbolFrame f;
        f.function = hslog::kPausedSiteName;
        out.push_back(std::move(f));
    } else if (!module || module->record.path.empty() || module->record.path[0] != '/') {
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

std::vector<uint32_t> StackSymbols::frame_ids(uint32_t stack) {
    std::vector<uint32_t> ids;
    const std::vector<StackFrame>* raws = nullptr;
    if (auto it = snapshot_.stacks.find(stack); it != snapshot_.stacks.end()) {
        raws = &it->second;
    } else if (more_ && more_->contains(stack)) {
        more_->decode(stack, decoded_);
        raws = &decoded_;
    } else {
        return ids;
    }
    ids.reserve(raws->size());
    for (const StackFrame& raw : *raws) {
        bool fresh = false;
        uint64_t* known = nullptr;
        if (raw.module < 0xffff && raw.vaddr < (uint64_t{1} << 48)) {
            known = ids_of_packed_.slot(uint64_t{raw.module + 1} << 48 | raw.vaddr, &fresh);
        } else {
            auto [at, added] = ids_of_raw_.try_emplace({raw.module, raw.vaddr});
            known = &at->second;
            fresh = added;
        }
        if (fresh) {
            std::vector<SymbolFrame> frames = symbolized(raw);
            budget_take_memory(64 + frames.size() * kSymbolFrameBytes, "symbolized frames");
            *known = uint64_t{static_cast<uint32_t>(frames_.size())} << 32 | frames.size();
            for (SymbolFrame& f : frames) frames_.push_back(&table_->emplace_back(std::move(f)));
        }
        auto first = static_cast<uint32_t>(*known >> 32);
        auto count = static_cast<uint32_t>(*known);
        for (uint32_t i = 0; i < count; ++i) ids.push_back(first + i);
    }
    return ids;
}

FrameList StackSymbols::list(const std::vector<uint32_t>& ids) const {
    std::vector<const SymbolFrame*> frames;
    frames.reserve(ids.size());
    for (uint32_t id : ids) frames.push_back(frames_[id]);
    return FrameList(table_, std::move(frames));
}

uint32_t StackSymbols::key(uint32_t id, FrameKeys& keys) {
    if (id >= key_of_.size()) key_of_.resize(std::max<size_t>(id + 1, frames_.size()), UINT32_MAX);
    if (key_of_[id] == UINT32_MAX) key_of_[id] = keys.intern(*frames_[id]);
    return key_of_[id];
}

DiffResult diff(const Snapshot& old_snap, const Snapshot& new_snap, const DiffOptions& options,
                Symbolizer& symbolizer) {
    DiffResult result;
    if (old_snap.process.exe != new_snap.process.exe)
        result.warnings.push_back(fmt::format("the snapshots are of different programs ({} and {})",
                                              old_snap.process.exe, new_snap.process.exe));

    // Whole stacks by their frames' identities; the other groupings by the
    // text of their one frame's.
    std::vector<Group> groups;
    FrameKeys keys;
    SiteIndex stacks;
    std::map<std::pair<std::string, EntryKind>, size_t> by_text;
    auto add = [&](const Snapshot& snap, bool is_new) {
        StackSymbols symbols(snap, symbolizer, options.exclude);
        std::vector<uint32_t> key_ids;
        for (const SnapshotEntry& e : snap.entries) {
            std::vector<uint32_t> ids = symbols.frame_ids(e.stack);
            size_t at = 0;
            bool fresh = false;
            if (options.group_by == GroupBy::Stack) {
                key_ids.clear();
                for (uint32_t id : ids) key_ids.push_back(symbols.key(id, keys));
                at = stacks.find_or_add(key_ids, e.kind, &fresh);
                if (fresh) {
                    budget_take_memory(64 + key_ids.size() * sizeof(uint32_t), "call sites");
                    groups.push_back(Group{e.kind, symbols.list(ids), {}, {}});
                }
            } else {
                const SymbolFrame* site = nullptr;
                for (uint32_t id : ids)
                    if (!is_allocation_frame(symbols.frame(id))) {
                        site = &symbols.frame(id);
                        break;
                    }
                if (!site && !ids.empty()) site = &symbols.frame(ids.back());
                std::vector<SymbolFrame> shown;
                std::string key = group_key(site, options.group_by, &shown);
                auto [it, inserted] = by_text.try_emplace({key, e.kind}, groups.size());
                if (inserted) {
                    budget_take_memory(key.size() + shown.size() * kSymbolFrameBytes, "call sites");
                    groups.push_back(Group{e.kind, FrameList(std::move(shown)), {}, {}});
                }
                at = it->second;
            }
            Side& side = is_new ? groups[at].new_side : groups[at].old_side;
            side.bytes += e.bytes;
            side.blocks += e.blocks;
        }
    };
    add(old_snap, false);
    add(new_snap, true);

    std::vector<size_t> order;
    if (options.group_by == GroupBy::Stack) {
        order = stacks.identity_order(keys);
    } else {
        for (const auto& [key, at] : by_text) order.push_back(at);
    }
    for (size_t at : order) {
        Group& g = groups[at];
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
