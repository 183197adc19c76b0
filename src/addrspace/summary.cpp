#include "addrspace/summary.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "util/human.h"
#include "util/text.h"

namespace heapsnap::addrspace {

namespace {

using Range = std::pair<uint64_t, uint64_t>;

constexpr uint64_t kArenaSize = 64ULL << 20;  // glibc HEAP_MAX_SIZE on 64-bit
constexpr uint64_t kKiB = 1024;

constexpr Category kBusyCategories[] = {Category::Heap,      Category::Stack, Category::Image,   Category::MappedFile,
                                        Category::Anonymous, Category::Other, Category::Recorder};
// The categories that can be the verdict's dominant growth.
constexpr Category kProgramCategories[] = {Category::Heap,       Category::Stack,     Category::Image,
                                           Category::MappedFile, Category::Anonymous, Category::Other};

size_t idx(Category c) { return static_cast<size_t>(c); }

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool is_shared(const MapRegion& r) { return (r.perms & hslog::kShared) != 0; }
// Anonymous memory: no path, or a name given with PR_SET_VMA_ANON_NAME.
bool is_anonymous(const MapRegion& r) { return r.path.empty() || starts_with(r.path, "[anon:"); }
bool is_private_anon(const MapRegion& r) { return is_anonymous(r) && !is_shared(r); }
bool is_prot_none(const MapRegion& r) { return (r.perms & (hslog::kRead | hslog::kWrite | hslog::kExec)) == 0; }
bool is_read_write(const MapRegion& r) {
    return (r.perms & (hslog::kRead | hslog::kWrite | hslog::kExec)) == (hslog::kRead | hslog::kWrite);
}

std::string_view without_deleted(std::string_view path) {
    constexpr std::string_view kDeleted = " (deleted)";
    if (path.size() > kDeleted.size() && path.substr(path.size() - kDeleted.size()) == kDeleted)
        path.remove_suffix(kDeleted.size());
    return path;
}

// Paths that may name an ELF object at all: real files, not devices, memfds
// or SysV segments.
bool may_be_image_path(std::string_view path) {
    return starts_with(path, "/") && !starts_with(path, "/dev/") && !starts_with(path, "/memfd:") &&
           !starts_with(path, "/SYSV");
}

// "libfoo.so", "libfoo.so.6", "libfoo.so.1.2.3"; not "ld.so.cache".
bool looks_like_shared_object(std::string_view path) {
    path = without_deleted(path);
    std::string_view name = path.substr(path.rfind('/') + 1);
    for (size_t at = name.find(".so"); at != std::string_view::npos; at = name.find(".so", at + 1)) {
        std::string_view rest = name.substr(at + 3);
        if (rest.empty()) return true;
        if (rest.size() >= 2 && rest[0] == '.' && rest[1] >= '0' && rest[1] <= '9') return true;
    }
    return false;
}

// Ranges sorted by start plus the running maximum of their ends, so "does
// [start, end) overlap any range" is one binary search even when the ranges
// overlap each other.
class RangeIndex {
public:
    explicit RangeIndex(std::vector<Range> ranges) : ranges_(std::move(ranges)) {
        std::sort(ranges_.begin(), ranges_.end());
        max_end_.reserve(ranges_.size());
        uint64_t m = 0;
        for (const auto& r : ranges_) {
            m = std::max(m, r.second);
            max_end_.push_back(m);
        }
    }
    bool overlaps(uint64_t start, uint64_t end) const {
        // Ranges starting before `end`; one of them must end after `start`.
        auto first_after = std::lower_bound(ranges_.begin(), ranges_.end(), end,
                                            [](const Range& r, uint64_t v) { return r.first < v; });
        size_t n = static_cast<size_t>(first_after - ranges_.begin());
        return n > 0 && max_end_[n - 1] > start;
    }

private:
    std::vector<Range> ranges_;
    std::vector<uint64_t> max_end_;
};

// Paths of image files (rule 5 of the header).
std::set<std::string_view> image_paths(const std::vector<MapRegion>& regions) {
    std::set<std::string_view> paths;
    for (const auto& r : regions) {
        if (is_shared(r) || !may_be_image_path(r.path)) continue;
        if ((r.perms & hslog::kExec) || looks_like_shared_object(r.path)) paths.insert(r.path);
    }
    return paths;
}

bool is_arena_shape(const MapRegion& r, const MapRegion* next) {
    return is_private_anon(r) && !is_prot_none(r) && r.start % kArenaSize == 0 && next && is_private_anon(*next) &&
           is_prot_none(*next) && next->start == r.end && next->end == r.start + kArenaSize;
}

Category classify_alone(const MapRegion& r, const MapRegion* next, const RangeIndex& blocks, const RangeIndex& stacks,
                        const std::set<std::string_view>& images) {
    using hslog::RegionHint;
    if (r.hint == RegionHint::Recorder) return Category::Recorder;
    if (r.hint == RegionHint::ThreadStack || r.hint == RegionHint::MainStack) return Category::Stack;
    if (r.path == "[stack]" || starts_with(r.path, "[stack:")) return Category::Stack;
    if (starts_with(r.path, "[anon: glibc: pthread ") || starts_with(r.path, "[anon: glibc: unused stack"))
        return Category::Stack;
    if (stacks.overlaps(r.start, r.end)) return Category::Stack;
    if (r.path == "[heap]" || starts_with(r.path, "[anon: glibc: malloc")) return Category::Heap;
    if (r.hint == RegionHint::Heap && is_private_anon(r)) return Category::Heap;
    if (is_private_anon(r) && (blocks.overlaps(r.start, r.end) || is_arena_shape(r, next))) return Category::Heap;
    if (starts_with(r.path, "[")) {
        if (starts_with(r.path, "[anon_shmem")) return Category::MappedFile;
        if (starts_with(r.path, "[anon:")) return is_shared(r) ? Category::MappedFile : Category::Anonymous;
        return Category::Other;
    }
    if (!r.path.empty()) {
        if (!is_shared(r) && images.count(r.path)) return Category::Image;
        return Category::MappedFile;
    }
    return is_shared(r) ? Category::MappedFile : Category::Anonymous;
}

// Regions in address order, as indices into the caller's vector.
std::vector<size_t> address_order(const std::vector<MapRegion>& regions) {
    std::vector<size_t> order(regions.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return regions[a].start < regions[b].start; });
    return order;
}

void add_region(CategoryStats& s, const MapRegion& r) {
    s.regions += 1;
    s.size_bytes += r.end - r.start;
    s.rss_bytes += r.rss_kb * kKiB;
    s.pss_bytes += r.pss_kb * kKiB;
    s.private_dirty_bytes += r.private_dirty_kb * kKiB;
    s.swap_bytes += r.swap_kb * kKiB;
}

RegionType type_of(Category c) {
    if (c == Category::Image) return RegionType::Image;
    if (c == Category::MappedFile) return RegionType::Mapped;
    return RegionType::Private;
}

int64_t delta(uint64_t old_v, uint64_t new_v) { return static_cast<int64_t>(new_v - old_v); }

double percent(uint64_t part, uint64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

// Categories shown for a summary: the seven always, Recorder when recorded.
std::vector<Category> shown_categories(bool tracked) {
    std::vector<Category> cats = {Category::Heap,      Category::Stack, Category::Image, Category::MappedFile,
                                  Category::Anonymous, Category::Other, Category::Free};
    if (tracked) cats.push_back(Category::Recorder);
    return cats;
}

// ---- text tables --------------------------------------------------------------

constexpr const char* kBold = "\x1b[1m";
constexpr const char* kRed = "\x1b[31m";
constexpr const char* kGreen = "\x1b[32m";
constexpr const char* kReset = "\x1b[0m";

struct Cell {
    std::string text;
    const char* style = nullptr;  // ANSI code, applied only with color
};
using Row = std::vector<Cell>;

// Rows listed in `headings` are bold, an empty row is a blank line. Column 0
// and the columns in `left` are left aligned, the others right aligned;
// columns are separated by two spaces and share their width over all rows,
// so tables rendered as one (usage, type, state) line up.
std::string render_table(const std::vector<Row>& rows, bool color, const std::vector<size_t>& left = {},
                         const std::vector<size_t>& headings = {0}) {
    std::vector<size_t> width;
    for (const auto& row : rows) {
        if (width.size() < row.size()) width.resize(row.size(), 0);
        for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].text.size());
    }
    std::string out;
    for (size_t r = 0; r < rows.size(); ++r) {
        std::string line;
        for (size_t i = 0; i < rows[r].size(); ++i) {
            const Cell& cell = rows[r][i];
            bool left_aligned = i == 0 || std::find(left.begin(), left.end(), i) != left.end();
            std::string pad(width[i] - cell.text.size(), ' ');
            if (i > 0) line += "  ";
            bool heading_row = std::find(headings.begin(), headings.end(), r) != headings.end();
            const char* style = heading_row ? kBold : cell.style;
            std::string text = color && style ? std::string(style) + cell.text + kReset : cell.text;
            line += left_aligned ? text + pad : pad + text;
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out += line;
        out += '\n';
    }
    return out;
}

Row stats_row(const std::string& name, const CategoryStats& s, const std::string& busy_percent) {
    return {{name},
            {std::to_string(s.regions)},
            {human_bytes(s.size_bytes)},
            {human_bytes(s.rss_bytes)},
            {human_bytes(s.pss_bytes)},
            {human_bytes(s.private_dirty_bytes)},
            {human_bytes(s.swap_bytes)},
            {busy_percent}};
}

Row stats_heading(const char* title) {
    return {{title}, {"Regions"}, {"Size"}, {"Rss"}, {"Pss"}, {"Private_Dirty"}, {"Swap"}, {"% of busy"}};
}

// "+3", "-1", "0".
std::string signed_count(int64_t d) { return d == 0 ? "0" : fmt::format("{:+d}", d); }

Cell signed_cell(int64_t d) { return {human_bytes_signed(d), d > 0 ? kRed : d < 0 ? kGreen : nullptr}; }

// ---- JSON ---------------------------------------------------------------------

nlohmann::json stats_json(const CategoryStats& s) {
    return {{"regions", s.regions},
            {"size_bytes", s.size_bytes},
            {"rss_bytes", s.rss_bytes},
            {"pss_bytes", s.pss_bytes},
            {"private_dirty_bytes", s.private_dirty_bytes},
            {"swap_bytes", s.swap_bytes}};
}

nlohmann::json stats_delta_json(const CategoryStats& o, const CategoryStats& n) {
    return {{"regions", delta(o.regions, n.regions)},
            {"size_bytes", delta(o.size_bytes, n.size_bytes)},
            {"rss_bytes", delta(o.rss_bytes, n.rss_bytes)},
            {"pss_bytes", delta(o.pss_bytes, n.pss_bytes)},
            {"private_dirty_bytes", delta(o.private_dirty_bytes, n.private_dirty_bytes)},
            {"swap_bytes", delta(o.swap_bytes, n.swap_bytes)}};
}

// {"name", "allocated_bytes", "active_bytes", "committed_bytes",
// "resident_bytes", "mapped_bytes"}: null where the allocator gives none.
nlohmann::json allocator_json(const AddressSpaceSummary& s) {
    const hslog::AllocatorStats& a = s.allocator;
    using F = hslog::AllocatorStats;
    auto field = [&](uint8_t bit, uint64_t v) {
        return s.has_allocator && (a.present & bit) ? nlohmann::json(v) : nlohmann::json(nullptr);
    };
    return {{"name", s.allocator_name.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.allocator_name)},
            {"allocated_bytes", field(F::kAllocated, a.allocated)},
            {"active_bytes", field(F::kActive, a.active)},
            {"committed_bytes", field(F::kCommitted, a.committed)},
            {"resident_bytes", field(F::kResident, a.resident)},
            {"mapped_bytes", field(F::kMapped, a.mapped)}};
}

nlohmann::json malloc_json(const MallocStats& m) {
    return {{"arena", m.arena},       {"ordblks", m.ordblks},   {"hblks", m.hblks},      {"hblkhd", m.hblkhd},
            {"uordblks", m.uordblks}, {"fordblks", m.fordblks}, {"keepcost", m.keepcost}};
}

nlohmann::json malloc_delta_json(const MallocStats& o, const MallocStats& n) {
    return {{"arena", delta(o.arena, n.arena)},          {"ordblks", delta(o.ordblks, n.ordblks)},
            {"hblks", delta(o.hblks, n.hblks)},          {"hblkhd", delta(o.hblkhd, n.hblkhd)},
            {"uordblks", delta(o.uordblks, n.uordblks)}, {"fordblks", delta(o.fordblks, n.fordblks)},
            {"keepcost", delta(o.keepcost, n.keepcost)}};
}

}  // namespace

const char* category_name(Category c) {
    static const char* const names[kCategoryCount] = {"Heap",      "Stack", "Image", "MappedFile",
                                                      "Anonymous", "Other", "Free",  "Recorder"};
    return names[idx(c)];
}

const char* region_type_name(RegionType t) {
    static const char* const names[kRegionTypeCount] = {"image", "mapped", "private"};
    return names[static_cast<size_t>(t)];
}

std::vector<Category> classify(const SummaryInputs& in) {
    const auto& regions = in.regions;
    std::vector<size_t> order = address_order(regions);
    RangeIndex blocks(in.heap_block_ranges);
    RangeIndex stacks(in.thread_stacks);
    std::set<std::string_view> images = image_paths(regions);

    std::vector<Category> cat(regions.size(), Category::Anonymous);
    for (size_t k = 0; k < order.size(); ++k) {
        const MapRegion* next = k + 1 < order.size() ? &regions[order[k + 1]] : nullptr;
        cat[order[k]] = classify_alone(regions[order[k]], next, blocks, stacks, images);
    }

    // Highest mapping of each image file, for the .bss rule.
    std::map<std::string_view, size_t> last_mapping;
    for (size_t i : order)
        if (cat[i] == Category::Image) last_mapping[regions[i].path] = i;

    for (size_t k = 0; k < order.size(); ++k) {
        size_t i = order[k];
        const MapRegion& r = regions[i];
        if (cat[i] != Category::Anonymous || !is_private_anon(r)) continue;
        if (k > 0) {
            size_t p = order[k - 1];
            const MapRegion& prev = regions[p];
            bool adjacent = prev.end == r.start;
            if (adjacent && is_prot_none(r) && cat[p] == Category::Heap) {
                cat[i] = Category::Heap;
                continue;
            }
            if (adjacent && is_read_write(r) && cat[p] == Category::Image && last_mapping[prev.path] == p &&
                (prev.perms & hslog::kWrite)) {
                cat[i] = Category::Image;
                continue;
            }
        }
        if (k + 1 < order.size()) {
            size_t n = order[k + 1];
            if (is_prot_none(r) && regions[n].start == r.end && cat[n] == Category::Stack) cat[i] = Category::Stack;
        }
    }
    return cat;
}

AddressSpaceSummary summarize(const SummaryInputs& in) {
    AddressSpaceSummary s;
    std::vector<Category> cat = classify(in);
    std::vector<size_t> order = address_order(in.regions);

    std::map<std::string, CategoryStats> images;
    std::string last_image;  // a .bss (anonymous Image region) belongs to the image before it
    for (size_t i : order) {
        const MapRegion& r = in.regions[i];
        Category c = cat[i];
        uint64_t size = r.end - r.start;
        add_region(s.categories[idx(c)], r);
        if (c == Category::Image) {
            if (!r.path.empty()) last_image = r.path;
            add_region(images[r.path.empty() ? last_image : r.path], r);
        }
        add_region(s.types[static_cast<size_t>(type_of(c))], r);
        if (is_prot_none(r)) {
            add_region(s.reserved, r);
        } else {
            add_region(s.committed, r);
            s.committed_size[idx(c)] += size;
        }
        LargestRegion& big = s.largest[idx(c)];
        if (!big.present || size > big.size_bytes) big = {true, r.start, size, r.path};
    }

    for (auto& [path, stats] : images) s.images.push_back(ImageUsage{path, stats});
    std::stable_sort(s.images.begin(), s.images.end(), [](const ImageUsage& a, const ImageUsage& b) {
        return a.stats.size_bytes > b.stats.size_bytes;
    });

    // Free: the largest hole between regions in user space.
    uint64_t covered_to = 0;
    bool first = true;
    LargestRegion& gap = s.largest[idx(Category::Free)];
    for (size_t i : order) {
        const MapRegion& r = in.regions[i];
        if (r.start >= kUserSpaceEnd) break;
        if (!first && r.start > covered_to && r.start - covered_to > gap.size_bytes)
            gap = {true, covered_to, r.start - covered_to, ""};
        covered_to = first ? r.end : std::max(covered_to, r.end);
        first = false;
    }
    if (gap.present) s.categories[idx(Category::Free)] = {1, gap.size_bytes, 0, 0, 0, 0};

    for (Category c : kBusyCategories) s.busy_bytes += s[c].size_bytes;
    s.committed_bytes = s.committed.size_bytes;
    s.reserved_bytes = s.reserved.size_bytes;

    s.tracked = in.tracked;
    s.tracked_live_bytes = in.tracked_live_bytes;
    s.tracked_live_blocks = in.tracked_live_blocks;
    s.has_malloc = in.has_malloc;
    s.malloc = in.malloc;
    if (in.has_malloc) {
        s.malloc_in_use_bytes = in.malloc.uordblks + in.malloc.hblkhd;
        s.malloc_free_bytes = in.malloc.fordblks;
        uint64_t held = in.malloc.uordblks + in.malloc.fordblks;
        s.fragmentation = held == 0 ? 0.0 : static_cast<double>(in.malloc.fordblks) / static_cast<double>(held);
    }
    s.has_allocator = in.has_allocator;
    s.allocator = in.allocator;
    if (in.has_allocator)
        s.allocator_name = hslog::allocator_name(in.allocator.kind);
    else if (in.has_malloc)
        s.allocator_name = "glibc";
    else
        s.allocator_name = in.allocator_name;
    s.threads = in.threads;
    s.recorder_bytes = in.recorder_bytes;
    return s;
}

std::string allocator_from_regions(const std::vector<MapRegion>& regions) {
    bool libc = false;
    for (const MapRegion& r : regions) {
        std::string_view path = r.path;
        size_t slash = path.rfind('/');
        std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
        for (const char* lib : {"jemalloc", "tcmalloc", "mimalloc"})
            if (starts_with(name, std::string("lib") + lib)) return lib;
        if (starts_with(name, "libc.so") || starts_with(name, "libc-")) libc = true;
    }
    return libc ? "glibc" : "";
}

std::string render_text(const AddressSpaceSummary& s, bool color) {
    std::string out;

    std::vector<Category> cats = shown_categories(s.tracked);
    std::stable_sort(cats.begin(), cats.end(),
                     [&](Category a, Category b) { return s[a].size_bytes > s[b].size_bytes; });
    std::vector<Row> usage = {stats_heading("Usage")};
    for (Category c : cats) {
        std::string busy = c == Category::Free ? "" : fmt::format("{:.1f}%", percent(s[c].size_bytes, s.busy_bytes));
        usage.push_back(stats_row(category_name(c), s[c], busy));
    }
    CategoryStats busy_total;
    for (Category c : kBusyCategories) {
        const CategoryStats& x = s[c];
        busy_total.regions += x.regions;
        busy_total.size_bytes += x.size_bytes;
        busy_total.rss_bytes += x.rss_bytes;
        busy_total.pss_bytes += x.pss_bytes;
        busy_total.private_dirty_bytes += x.private_dirty_bytes;
        busy_total.swap_bytes += x.swap_bytes;
    }
    usage.push_back(stats_row("Busy", busy_total, "100.0%"));

    usage.push_back({});
    std::vector<size_t> headings = {0, usage.size()};
    usage.push_back(stats_heading("Type"));
    for (size_t t = 0; t < kRegionTypeCount; ++t)
        usage.push_back(stats_row(region_type_name(static_cast<RegionType>(t)), s.types[t],
                                  fmt::format("{:.1f}%", percent(s.types[t].size_bytes, s.busy_bytes))));

    usage.push_back({});
    headings.push_back(usage.size());
    usage.push_back(stats_heading("State"));
    usage.push_back(
        stats_row("committed", s.committed, fmt::format("{:.1f}%", percent(s.committed_bytes, s.busy_bytes))));
    usage.push_back(stats_row("reserved", s.reserved, fmt::format("{:.1f}%", percent(s.reserved_bytes, s.busy_bytes))));
    out += render_table(usage, color, {}, headings);

    std::vector<Row> largest = {{{"Largest region"}, {"Start"}, {"Size"}, {"Path"}}};
    for (Category c : cats) {
        const LargestRegion& big = s.largest[idx(c)];
        if (!big.present) continue;
        largest.push_back(
            {{category_name(c)}, {fmt::format("{:#x}", big.start)}, {human_bytes(big.size_bytes)}, {terminal_safe(big.path)}});
    }
    out += '\n';
    out += render_table(largest, color, {3});

    if (!s.images.empty()) {
        constexpr size_t kImagesShown = 10;
        std::vector<Row> images = {{{"Image"}, {"Regions"}, {"Size"}, {"Rss"}, {"Private_Dirty"}}};
        for (size_t i = 0; i < s.images.size() && i < kImagesShown; ++i) {
            const ImageUsage& m = s.images[i];
            images.push_back({{terminal_safe(m.path)}, {std::to_string(m.stats.regions)}, {human_bytes(m.stats.size_bytes)},
                              {human_bytes(m.stats.rss_bytes)}, {human_bytes(m.stats.private_dirty_bytes)}});
        }
        if (s.images.size() > kImagesShown)
            images.push_back({{fmt::format("({} more in --format json)", s.images.size() - kImagesShown)}});
        out += '\n';
        out += render_table(images, color, {});
    }

    std::vector<Row> rec;
    rec.push_back({{"Reconciliation"}});
    rec.push_back({{"  allocator"}, {s.allocator_name.empty() ? std::string("unknown") : terminal_safe(s.allocator_name)}});
    if (s.tracked)
        rec.push_back({{"  tracked live"},
                       {fmt::format("{} in {} blocks (requested sizes)", human_bytes(s.tracked_live_bytes),
                                    s.tracked_live_blocks)}});
    else
        rec.push_back({{"  tracked live"}, {"not recorded"}});
    rec.push_back({{"  Heap Rss"}, {human_bytes(s[Category::Heap].rss_bytes)}});
    if (s.has_malloc) {
        rec.push_back({{"  malloc in use"},
                       {fmt::format("{} (uordblks {} + hblkhd {})", human_bytes(s.malloc_in_use_bytes),
                                    human_bytes(s.malloc.uordblks), human_bytes(s.malloc.hblkhd))}});
        rec.push_back({{"  malloc free"}, {fmt::format("{} (fordblks)", human_bytes(s.malloc_free_bytes))}});
        rec.push_back({{"  fragmentation"},
                       {fmt::format("{:.1f}% (fordblks / (uordblks + fordblks))", 100.0 * s.fragmentation)}});
        if (s.tracked)
            rec.push_back({{"  malloc overhead"},
                           {fmt::format("{} (in use - tracked live)",
                                        human_bytes_signed(delta(s.tracked_live_bytes, s.malloc_in_use_bytes)))}});
    } else if (s.has_allocator) {
        const hslog::AllocatorStats& a = s.allocator;
        using F = hslog::AllocatorStats;
        const struct {
            uint8_t bit;
            const char* name;
            uint64_t value;
        } fields[] = {{F::kAllocated, "allocated", a.allocated},
                      {F::kActive, "active", a.active},
                      {F::kCommitted, "committed", a.committed},
                      {F::kResident, "resident", a.resident},
                      {F::kMapped, "mapped", a.mapped}};
        for (const auto& f : fields)
            if (a.present & f.bit) rec.push_back({{std::string("  ") + s.allocator_name + " " + f.name}, {human_bytes(f.value)}});
        if ((a.present & F::kAllocated) && (a.present & F::kActive) && a.active >= a.allocated)
            rec.push_back({{"  fragmentation"},
                           {fmt::format("{:.1f}% ((active - allocated) / active)",
                                        a.active ? 100.0 * static_cast<double>(a.active - a.allocated) /
                                                       static_cast<double>(a.active)
                                                 : 0.0)}});
        if (s.tracked && (a.present & F::kAllocated))
            rec.push_back({{"  malloc overhead"},
                           {fmt::format("{} (allocated - tracked live)",
                                        human_bytes_signed(delta(s.tracked_live_bytes, a.allocated)))}});
    } else {
        rec.push_back({{"  malloc"}, {"no allocator statistics"}});
    }
    rec.push_back({{"  threads"}, {std::to_string(s.threads)}});
    if (s.tracked)
        rec.push_back({{"  recorder"},
                       {fmt::format("{} mapped, {} held (its own row above, in no other)",
                                    human_bytes(s[Category::Recorder].size_bytes), human_bytes(s.recorder_bytes))}});
    out += '\n';
    out += render_table(rec, color, {1});
    return out;
}

nlohmann::json to_json(const AddressSpaceSummary& s) {
    nlohmann::json j;
    nlohmann::json cats = nlohmann::json::object();
    nlohmann::json largest = nlohmann::json::object();
    for (Category c : shown_categories(s.tracked)) {
        cats[category_name(c)] = stats_json(s[c]);
        const LargestRegion& big = s.largest[idx(c)];
        largest[category_name(c)] =
            big.present ? nlohmann::json{{"start", big.start}, {"size_bytes", big.size_bytes}, {"path", big.path}}
                        : nlohmann::json(nullptr);
    }
    j["categories"] = cats;
    j["largest"] = largest;
    nlohmann::json images = nlohmann::json::array();
    for (const ImageUsage& m : s.images) {
        nlohmann::json row = stats_json(m.stats);
        row["path"] = m.path;
        images.push_back(std::move(row));
    }
    j["images"] = std::move(images);
    j["busy_bytes"] = s.busy_bytes;
    nlohmann::json types = nlohmann::json::object();
    for (size_t t = 0; t < kRegionTypeCount; ++t)
        types[region_type_name(static_cast<RegionType>(t))] = stats_json(s.types[t]);
    j["types"] = types;
    j["states"] = {{"committed", stats_json(s.committed)}, {"reserved", stats_json(s.reserved)}};
    j["committed_bytes"] = s.committed_bytes;
    j["reserved_bytes"] = s.reserved_bytes;
    j["tracked"] = s.tracked;
    j["tracked_live_bytes"] = s.tracked ? nlohmann::json(s.tracked_live_bytes) : nlohmann::json(nullptr);
    j["tracked_live_blocks"] = s.tracked ? nlohmann::json(s.tracked_live_blocks) : nlohmann::json(nullptr);
    j["malloc"] = s.has_malloc ? malloc_json(s.malloc) : nlohmann::json(nullptr);
    j["malloc_in_use_bytes"] = s.has_malloc ? nlohmann::json(s.malloc_in_use_bytes) : nlohmann::json(nullptr);
    j["malloc_free_bytes"] = s.has_malloc ? nlohmann::json(s.malloc_free_bytes) : nlohmann::json(nullptr);
    j["fragmentation"] = s.has_malloc ? nlohmann::json(s.fragmentation) : nlohmann::json(nullptr);
    j["allocator"] = allocator_json(s);
    j["threads"] = s.threads;
    j["recorder_bytes"] = s.tracked ? nlohmann::json(s.recorder_bytes) : nlohmann::json(nullptr);
    return j;
}

nlohmann::json delta_json(const AddressSpaceSummary& o, const AddressSpaceSummary& n) {
    nlohmann::json j;
    nlohmann::json cats = nlohmann::json::object();
    for (Category c : shown_categories(o.tracked || n.tracked)) cats[category_name(c)] = stats_delta_json(o[c], n[c]);
    j["categories"] = cats;
    j["busy_bytes"] = delta(o.busy_bytes, n.busy_bytes);
    nlohmann::json types = nlohmann::json::object();
    for (size_t t = 0; t < kRegionTypeCount; ++t)
        types[region_type_name(static_cast<RegionType>(t))] = stats_delta_json(o.types[t], n.types[t]);
    j["types"] = types;
    j["states"] = {{"committed", stats_delta_json(o.committed, n.committed)},
                   {"reserved", stats_delta_json(o.reserved, n.reserved)}};
    j["committed_bytes"] = delta(o.committed_bytes, n.committed_bytes);
    j["reserved_bytes"] = delta(o.reserved_bytes, n.reserved_bytes);
    bool tracked = o.tracked && n.tracked;
    bool has_malloc = o.has_malloc && n.has_malloc;
    auto null = nlohmann::json(nullptr);
    j["tracked_live_bytes"] = tracked ? nlohmann::json(delta(o.tracked_live_bytes, n.tracked_live_bytes)) : null;
    j["tracked_live_blocks"] = tracked ? nlohmann::json(delta(o.tracked_live_blocks, n.tracked_live_blocks)) : null;
    j["malloc"] = has_malloc ? malloc_delta_json(o.malloc, n.malloc) : null;
    j["malloc_in_use_bytes"] = has_malloc ? nlohmann::json(delta(o.malloc_in_use_bytes, n.malloc_in_use_bytes)) : null;
    j["malloc_free_bytes"] = has_malloc ? nlohmann::json(delta(o.malloc_free_bytes, n.malloc_free_bytes)) : null;
    j["fragmentation"] = has_malloc ? nlohmann::json(n.fragmentation - o.fragmentation) : null;
    j["threads"] = static_cast<int64_t>(n.threads) - static_cast<int64_t>(o.threads);
    j["recorder_bytes"] = tracked ? nlohmann::json(delta(o.recorder_bytes, n.recorder_bytes)) : null;
    return j;
}

std::string render_delta_text(const AddressSpaceSummary& o, const AddressSpaceSummary& n, bool color) {
    std::vector<Row> rows = {
        {{"Address space"}, {"Old size"}, {"Old Rss"}, {"New size"}, {"New Rss"}, {"Delta Rss"}, {"Delta size"}}};
    auto add = [&](const std::string& name, const CategoryStats& a, const CategoryStats& b) {
        rows.push_back({{name},
                        {human_bytes(a.size_bytes)},
                        {human_bytes(a.rss_bytes)},
                        {human_bytes(b.size_bytes)},
                        {human_bytes(b.rss_bytes)},
                        signed_cell(delta(a.rss_bytes, b.rss_bytes)),
                        signed_cell(delta(a.size_bytes, b.size_bytes))});
    };
    CategoryStats old_busy, new_busy;
    for (Category c : kBusyCategories) {
        if (c == Category::Recorder && !o.tracked && !n.tracked) continue;
        add(category_name(c), o[c], n[c]);
    }
    for (Category c : kBusyCategories) {
        old_busy.size_bytes += o[c].size_bytes;
        old_busy.rss_bytes += o[c].rss_bytes;
        new_busy.size_bytes += n[c].size_bytes;
        new_busy.rss_bytes += n[c].rss_bytes;
    }
    add("Busy", old_busy, new_busy);
    std::string out = render_table(rows, color);

    std::string line = fmt::format("threads {} -> {} ({})", o.threads, n.threads,
                                   signed_count(static_cast<int64_t>(n.threads) - static_cast<int64_t>(o.threads)));
    if (o.tracked && n.tracked)
        line += fmt::format(", tracked live {} -> {} ({})", human_bytes(o.tracked_live_bytes),
                            human_bytes(n.tracked_live_bytes),
                            human_bytes_signed(delta(o.tracked_live_bytes, n.tracked_live_bytes)));
    if (o.has_malloc && n.has_malloc)
        line += fmt::format(", malloc in use {} -> {} ({})", human_bytes(o.malloc_in_use_bytes),
                            human_bytes(n.malloc_in_use_bytes),
                            human_bytes_signed(delta(o.malloc_in_use_bytes, n.malloc_in_use_bytes)));
    out += line;
    out += '\n';
    return out;
}

std::string verdict(const AddressSpaceSummary& o, const AddressSpaceSummary& n) {
    Category best = Category::Heap;
    int64_t best_weight = 0;
    bool found = false;
    for (Category c : kProgramCategories) {
        // Code pages faulted in as a program warms up raise an image's Rss
        // without anything having grown: images count by what was mapped.
        int64_t rss_growth = c == Category::Image ? 0 : delta(o[c].rss_bytes, n[c].rss_bytes);
        int64_t w = delta(o.committed_size[idx(c)], n.committed_size[idx(c)]) + rss_growth;
        if (!found || w > best_weight) {
            best = c;
            best_weight = w;
            found = true;
        }
    }
    if (best_weight < static_cast<int64_t>(kSignificantGrowth)) return "no significant address-space growth";

    std::string rss = human_bytes_signed(delta(o[best].rss_bytes, n[best].rss_bytes));
    std::string size = human_bytes_signed(delta(o[best].size_bytes, n[best].size_bytes));
    switch (best) {
        case Category::Heap: {
            std::string line = fmt::format("growth is heap: {} rss", rss);
            if (o.tracked && n.tracked)
                line += fmt::format(", tracked live bytes {}",
                                    human_bytes_signed(delta(o.tracked_live_bytes, n.tracked_live_bytes)));
            else if (o.has_malloc && n.has_malloc)
                line += fmt::format(", malloc in use {}",
                                    human_bytes_signed(delta(o.malloc_in_use_bytes, n.malloc_in_use_bytes)));
            return line;
        }
        case Category::Stack: {
            int64_t threads = static_cast<int64_t>(n.threads) - static_cast<int64_t>(o.threads);
            std::string what = threads > 0 ? "thread stacks" : "stacks";
            std::string count =
                threads == 0 ? "" : fmt::format("{:+d} thread{}, ", threads, threads == 1 || threads == -1 ? "" : "s");
            return fmt::format("growth is {}: {}{} reserved, {} rss", what, count, size, rss);
        }
        case Category::Image:
            return fmt::format("growth is loaded images: {} virtual, {} rss", size, rss);
        case Category::MappedFile:
            return fmt::format("growth is mapped files and shared memory: {} virtual, {} rss", size, rss);
        case Category::Anonymous:
            return fmt::format("growth is anonymous mmap: {} virtual, {} rss", size, rss);
        default:
            return fmt::format("growth is other mappings: {} virtual, {} rss", size, rss);
    }
}

}  // namespace heapsnap::addrspace
