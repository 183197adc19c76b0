#include "report/diff.h"
#include "util/files.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <stdexcept>
#include <string_view>
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

namespace {

// A frame's identity text (compare_frame_identities) as pieces, the
// numbers written into the object itself: not to be copied.
class IdentityText {
public:
    explicit IdentityText(const SymbolFrame& f) {
        if (!f.function.empty()) {
            char* end = std::to_chars(number_, number_ + sizeof number_, f.line).ptr;
            pieces_ = {"F\x1f", f.function,
                       "\x1f",  f.file,
                       "\x1f",  std::string_view(number_, end - number_),
                       "\x1f",  f.inlined ? "1" : "0",
                       "\x1e"};
            count_ = 9;
        } else {
            char* end = std::to_chars(number_, number_ + sizeof number_, f.offset, 16).ptr;
            pieces_ = {"A\x1f", f.module, "\x1f", std::string_view(number_, end - number_), "\x1e"};
            count_ = 5;
        }
    }
    IdentityText(const IdentityText&) = delete;
    IdentityText& operator=(const IdentityText&) = delete;

    // As the concatenated texts compare (bytes unsigned, a prefix first).
    int compare(const IdentityText& o) const {
        size_t i = 0, at = 0, j = 0, o_at = 0;
        for (;;) {
            while (i < count_ && at == pieces_[i].size()) ++i, at = 0;
            while (j < o.count_ && o_at == o.pieces_[j].size()) ++j, o_at = 0;
            if (i == count_ || j == o.count_) return (i == count_ ? 0 : 1) - (j == o.count_ ? 0 : 1);
            size_t n = std::min(pieces_[i].size() - at, o.pieces_[j].size() - o_at);
            if (int c = std::memcmp(pieces_[i].data() + at, o.pieces_[j].data() + o_at, n)) return c < 0 ? -1 : 1;
            at += n;
            o_at += n;
        }
    }

    // FNV-1a over the text's bytes.
    uint64_t hash() const {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < count_; ++i)
            for (char c : pieces_[i]) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
        return h;
    }

private:
    std::array<std::string_view, 9> pieces_;
    size_t count_ = 0;
    char number_[24];
};

}  // namespace

int compare_frame_identities(const SymbolFrame& a, const SymbolFrame& b) {
    return IdentityText(a).compare(IdentityText(b));
}

uint64_t frame_identity_hash(const SymbolFrame& frame) { return IdentityText(frame).hash(); }

uint32_t FrameIdentities::intern(const SymbolFrame& frame) {
    uint64_t h = frame_identity_hash(frame);
    bool fresh = false;
    uint32_t* first = first_.slot(h ? h : 1, &fresh);
    if (!fresh)
        for (uint32_t id = *first; id != kNone; id = next_[id])
            if (compare_frame_identities(*frames_[id], frame) == 0) return id;
    auto id = static_cast<uint32_t>(frames_.size());
    frames_.push_back(&frame);
    next_.push_back(fresh ? kNone : *first);
    *first = id;
    return id;
}

std::vector<uint32_t> FrameIdentities::ranks() const {
    std::vector<uint32_t> by_text(frames_.size());
    for (uint32_t id = 0; id < by_text.size(); ++id) by_text[id] = id;
    std::sort(by_text.begin(), by_text.end(),
              [&](uint32_t a, uint32_t b) { return compare_frame_identities(*frames_[a], *frames_[b]) < 0; });
    std::vector<uint32_t> rank(frames_.size());
    for (uint32_t r = 0; r < by_text.size(); ++r) rank[by_text[r]] = r;
    return rank;
}

uint32_t SiteIndex::identity(uint32_t frame_id) {
    if (frame_id >= identity_of_.size())
        identity_of_.resize(std::max<size_t>(frame_id + 1, tree_.frame_count()), kNone);
    uint32_t& id = identity_of_[frame_id];
    if (id == kNone) id = identities_.intern(tree_.frame(frame_id));
    return id;
}

bool SiteIndex::same_identities(CallTree::Node a, CallTree::Node b) const {
    for (; a != CallTree::kRoot && b != CallTree::kRoot; a = tree_.parent(a), b = tree_.parent(b))
        if (identity_of_[tree_.frame_id(a)] != identity_of_[tree_.frame_id(b)]) return false;
    return a == b;
}

size_t SiteIndex::find_or_add(CallTree::Node node, EntryKind kind, bool* fresh) {
    uint64_t h = static_cast<uint64_t>(kind) + 1;
    for (CallTree::Node n = node; n != CallTree::kRoot; n = tree_.parent(n))
        h = (h ^ identity(tree_.frame_id(n))) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    bool added = false;
    uint32_t* first = first_.slot(h ? h : 1, &added);
    if (!added)
        for (uint32_t at = *first; at != kNone; at = sites_[at].next)
            if (sites_[at].kind == kind && (sites_[at].node == node || same_identities(sites_[at].node, node))) {
                *fresh = false;
                return at;
            }
    if (sites_.size() >= kNone) throw std::length_error("too many call sites");
    auto at = static_cast<uint32_t>(sites_.size());
    sites_.push_back(Site{node, kind, added ? kNone : *first});
    *first = at;
    *fresh = true;
    return at;
}

std::vector<size_t> SiteIndex::identity_order() const {
    std::vector<uint32_t> rank = identities_.ranks();
    // The first four frames' ranks (plus one; 0 past the end) as one key,
    // which decides most comparisons without walking the tree.
    std::vector<std::pair<uint64_t, uint64_t>> head(sites_.size());
    for (size_t i = 0; i < sites_.size(); ++i) {
        uint64_t r[4] = {0, 0, 0, 0};
        CallTree::Node n = sites_[i].node;
        for (int k = 0; k < 4 && n != CallTree::kRoot; ++k, n = tree_.parent(n))
            r[k] = uint64_t{rank[identity_of_[tree_.frame_id(n)]]} + 1;
        head[i] = {r[0] << 32 | r[1], r[2] << 32 | r[3]};
    }
    std::vector<size_t> order(sites_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        if (head[x] != head[y]) return head[x] < head[y];
        CallTree::Node a = sites_[x].node, b = sites_[y].node;
        for (; a != CallTree::kRoot && b != CallTree::kRoot; a = tree_.parent(a), b = tree_.parent(b)) {
            uint32_t ia = identity_of_[tree_.frame_id(a)], ib = identity_of_[tree_.frame_id(b)];
            if (ia != ib) return rank[ia] < rank[ib];
        }
        if (a != b) return a == CallTree::kRoot;  // a prefix first
        return sites_[x].kind < sites_[y].kind;
    });
    return order;
}

StackSymbols::StackSymbols(const Snapshot& snapshot, Symbolizer& symbolizer, const std::vector<std::regex>& exclude,
                           CallTree& tree, const StackTable* more)
    : snapshot_(&snapshot), symbolizer_(symbolizer), exclude_(exclude), tree_(tree), more_(more) {
    for (const SnapshotModule& m : snapshot.modules) modules_[m.record.id] = &m;
}

void StackSymbols::use(const Snapshot& snapshot, const StackTable* more) {
    std::unordered_map<uint32_t, const SnapshotModule*> modules;
    for (const SnapshotModule& m : snapshot.modules) modules[m.record.id] = &m;
    bool same = modules.size() == modules_.size();
    for (auto it = modules.begin(); same && it != modules.end(); ++it) {
        auto was = modules_.find(it->first);
        same = was != modules_.end() && was->second->record.path == it->second->record.path &&
               was->second->record.build_id == it->second->record.build_id;
    }
    if (!same) {
        ids_of_packed_ = FlatMap<uint64_t>();
        ids_of_raw_.clear();
    }
    modules_ = std::move(modules);
    snapshot_ = &snapshot;
    more_ = more;
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

CallTree::Node StackSymbols::node(uint32_t stack) {
    const std::vector<StackFrame>* raws = nullptr;
    if (auto it = snapshot_->stacks.find(stack); it != snapshot_->stacks.end()) {
        raws = &it->second;
    } else if (more_ && more_->contains(stack)) {
        more_->decode(stack, decoded_);
        raws = &decoded_;
    } else {
        return CallTree::kRoot;
    }
    ids_.clear();
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
            *known = uint64_t{static_cast<uint32_t>(tree_.frame_count())} << 32 | frames.size();
            for (SymbolFrame& f : frames) tree_.add_frame(std::move(f));
        }
        auto first = static_cast<uint32_t>(*known >> 32);
        auto count = static_cast<uint32_t>(*known);
        for (uint32_t i = 0; i < count; ++i) ids_.push_back(first + i);
    }
    size_t before = tree_.size();
    CallTree::Node node = CallTree::kRoot;
    size_t depth = 0;
    for (auto it = ids_.rbegin(); it != ids_.rend(); ++it, ++depth) {
        if (depth < path_.size() && path_[depth].first == *it) {
            node = path_[depth].second;
            continue;
        }
        node = tree_.child(node, *it);
        path_.resize(depth);
        path_.emplace_back(*it, node);
    }
    budget_take_memory((tree_.size() - before) * CallTree::kBytesPerNode, "call sites");
    return node;
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
    auto tree = std::make_shared<CallTree>();
    SiteIndex stacks(*tree);
    std::map<std::pair<std::string, EntryKind>, size_t> by_text;
    auto add = [&](const Snapshot& snap, bool is_new) {
        StackSymbols symbols(snap, symbolizer, options.exclude, *tree);
        for (const SnapshotEntry& e : snap.entries) {
            CallTree::Node node = symbols.node(e.stack);
            size_t at = 0;
            bool fresh = false;
            if (options.group_by == GroupBy::Stack) {
                at = stacks.find_or_add(node, e.kind, &fresh);
                if (fresh) {
                    budget_take_memory(sizeof(Group), "call sites");
                    groups.push_back(Group{e.kind, FrameList(tree, node), {}, {}});
                }
            } else {
                const SymbolFrame* site = nullptr;
                for (CallTree::Node n = node; n != CallTree::kRoot; n = tree->parent(n)) {
                    site = &tree->frame_at(n);
                    if (!is_allocation_frame(*site)) break;
                }
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
    tree->seal();

    std::vector<size_t> order;
    if (options.group_by == GroupBy::Stack) {
        order = stacks.identity_order();
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
