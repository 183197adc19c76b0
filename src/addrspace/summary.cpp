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
    std::stable_sort(s.images.begin(), s.images.end(),
                     [](const ImageUsage& a, const ImageUsage& b) { return a.stats.size_bytes > b.stats.size_bytes; });

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
    s.attached = in.tracked && in.attached;
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
    if (s.attached &&
        (in.has_malloc || (in.has_allocator && (in.allocator.present & hslog::AllocatorStats::kAllocated)))) {
        uint64_t in_use = in.has_malloc ? s.malloc_in_use_bytes : in.allocator.allocated;
        s.has_not_covered = true;
        s.not_covered_bytes = static_cast<int64_t>(in_use) - static_cast<int64_t>(in.tracked_live_bytes);
    }
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

}  // namespace heapsnap::addrspace
