// The address-space summary: WinDbg's `!address -summary` for Linux.
//
// Input is the region list of /proc/<pid>/smaps (captured by the recorder at
// a marker, or read live by `heapsnap maps PID`) plus what only the recorder
// knows: where live malloc blocks and thread stacks are. Output is one row
// per category with virtual size, Rss, Pss, Private_Dirty and Swap, the
// type and state tables, the largest region of each category and the
// reconciliation of tracked bytes against the kernel's and malloc's view.
// Rendered as text and JSON by report/address_space.h. JSON shape and
// rules, for users: formats/address-space.md.
//
// Classification, first rule that matches wins (regions are looked at in
// address order; "anonymous" = no path or a "[anon:name]" name, "private" =
// not shared):
//  1. Recorder   hint Recorder: heapsnap's own memory, kept out of every
//                other row so the recorder never looks like the program's
//                heap or mmaps.
//  2. Stack      hint ThreadStack/MainStack, "[stack]" ("[stack:tid]"),
//                glibc's names (glibc.mem.decorate_maps) "[anon: glibc:
//                pthread stack: TID]", "... pthread user stack ...", "...
//                unused stack]" (its cache of exited threads' stacks), or
//                overlapping a recorded thread stack range.
//  3. Heap       "[heap]" (brk); glibc's "[anon: glibc: malloc arena]" and
//                "[anon: glibc: malloc]"; a private anonymous region
//                overlapping a live malloc block (non-main arenas, malloc's
//                mmapped large blocks); or a glibc non-main arena recognised
//                by shape even without block data: a private anonymous
//                accessible region starting on a 64 MiB boundary
//                (HEAP_MAX_SIZE) followed directly by a PROT_NONE region
//                ending on the next one.
//  4. Other      any other bracketed name ("[vdso]", "[vvar]", "[vsyscall]",
//                "[uprobes]"...), except "[anon_shmem...]" (MappedFile) and
//                "[anon:name]" (named anonymous memory: Anonymous if
//                private, MappedFile if shared).
//  5. Image      a private mapping of an image file. A path is an image
//                file if it starts with '/', is not under /dev/, /memfd: or
//                /SYSV, and either (a) some private mapping of the same path
//                is executable (every loaded ELF object has one: catches
//                executables, whatever their name, and deleted libraries,
//                whose path keeps its " (deleted)" suffix on every mapping)
//                or (b) its file name looks like a shared object,
//                "*.so" or "*.so.<digit>..." (data-only libraries without an
//                x mapping). So all mappings of an ELF object, r--p, r-xp,
//                rw-p and ---p alignment holes, count as Image.
//  6. MappedFile every other file-backed mapping, and every shared mapping
//                (/dev/shm, "/memfd:", SYSV "/SYSV...", "/dev/zero").
//  7. Anonymous  every other private anonymous region.
// Then the adjacency rules, which need the neighbours' categories:
//  - a private anonymous PROT_NONE region directly above a Heap region
//    (end == start) is Heap: glibc's arena reservation;
//  - a private anonymous PROT_NONE region directly below a Stack region is
//    Stack: the thread's guard page;
//  - a private anonymous rw region directly above the last (highest)
//    mapping of an image file, when that mapping is writable (.data), is
//    Image: the object's .bss.
// Free is not a region: it is the largest gap between two consecutive
// regions below the top of user space (0x800000000000); regions = 1,
// size = the gap, start = its first address.
//
// Busy = every category except Free (Recorder included): "% of busy" is a
// category's virtual size over that total. Type: Image -> image, MappedFile
// -> mapped, all else -> private. State: committed = accessible (any of
// r, w, x), reserved = PROT_NONE ("---p"), counted per region.
//
// Reconciliation with glibc: malloc in use = uordblks + hblkhd (bytes in chunks handed
// out, including mmapped chunks), malloc free = fordblks, and
//     fragmentation = fordblks / (uordblks + fordblks)
// i.e. the share of malloc's non-mmapped memory that is free but still held
// (0 when malloc holds nothing). Tracked live bytes are the requested sizes
// the recorder saw; in-use minus tracked is chunk overhead plus anything
// allocated before or outside the recorder. With another allocator its own
// numbers are shown as it names them (allocated, active, committed,
// resident, mapped); fragmentation = (active - allocated) / active, the
// share of the pages holding blocks that no block uses. When the recorder
// was attached to the running process, in-use (glibc) or allocated (the
// others) minus tracked live is shown as the heap recording does not
// cover: the blocks allocated before attach that are still live, and the
// allocator's overhead.
//
// Verdict: the dominant category of growth between two summaries is the one
// with the largest growth weight, where
//     weight = delta(committed virtual size) + delta(Rss)
// (committed = accessible regions only, so a 64 MiB PROT_NONE arena
// reservation weighs nothing while an 8 MiB thread stack does, and touched
// memory counts twice). For Image the Rss term is left out: code pages
// faulted in while a program warms up are not growth; new images are.
// Recorder and Free never dominate. A weight below
// kSignificantGrowth (128 KiB) is "no significant address-space growth".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "format/log_reader.h"

namespace heapsnap::addrspace {

enum class Category : uint8_t { Heap, Stack, Image, MappedFile, Anonymous, Other, Free, Recorder };
inline constexpr size_t kCategoryCount = 8;

// "Heap", "Stack", "Image", "MappedFile", "Anonymous", "Other", "Free", "Recorder".
const char* category_name(Category c);
inline size_t idx(Category c) { return static_cast<size_t>(c); }

// Busy: every category but Free (Recorder included).
inline constexpr Category kBusyCategories[] = {Category::Heap,       Category::Stack,     Category::Image,
                                               Category::MappedFile, Category::Anonymous, Category::Other,
                                               Category::Recorder};
// The categories that can be the verdict's dominant growth.
inline constexpr Category kProgramCategories[] = {Category::Heap,       Category::Stack,     Category::Image,
                                                  Category::MappedFile, Category::Anonymous, Category::Other};

enum class RegionType : uint8_t { Image, Mapped, Private };
inline constexpr size_t kRegionTypeCount = 3;
const char* region_type_name(RegionType t);  // "image", "mapped", "private"

inline constexpr uint64_t kUserSpaceEnd = 0x800000000000ULL;
inline constexpr uint64_t kSignificantGrowth = 128 * 1024;

struct SummaryInputs {
    std::vector<MapRegion> regions;  // any order; sorted by start internally
    // [start, end) of every live malloc block the recorder knows (may be empty).
    std::vector<std::pair<uint64_t, uint64_t>> heap_block_ranges;
    // [lo, hi) stacks of live threads, from thread start records.
    std::vector<std::pair<uint64_t, uint64_t>> thread_stacks;
    bool tracked = false;   // recorder data present (false for `maps PID` of an unrecorded process)
    bool attached = false;  // the recorder was attached to the running process (heapsnap attach)
    uint64_t tracked_live_bytes = 0;
    uint64_t tracked_live_blocks = 0;
    MallocStats malloc;
    bool has_malloc = false;
    // Another allocator's own statistics (hslog.h, AllocatorStats).
    bool has_allocator = false;
    hslog::AllocatorStats allocator;
    // The allocator's name where no statistics say it: `maps PID` of an
    // unrecorded process, from the libraries it has loaded. Empty: unknown
    // (then "glibc" with has_malloc, the kind's name with has_allocator).
    std::string allocator_name;
    uint32_t threads = 0;
    uint64_t recorder_bytes = 0;  // memory the recorder says it holds
};

// The malloc library among the regions' paths (libjemalloc, libtcmalloc,
// libmimalloc), else "glibc" if libc is loaded; "" if neither.
std::string allocator_from_regions(const std::vector<MapRegion>& regions);

struct CategoryStats {
    uint64_t regions = 0;
    uint64_t size_bytes = 0;
    uint64_t rss_bytes = 0;
    uint64_t pss_bytes = 0;
    uint64_t private_dirty_bytes = 0;
    uint64_t swap_bytes = 0;
};

struct LargestRegion {
    bool present = false;
    uint64_t start = 0;
    uint64_t size_bytes = 0;
    std::string path;
};

// One loaded image (ELF object) of the Image category: all its mappings,
// and its .bss.
struct ImageUsage {
    std::string path;
    CategoryStats stats;
};

struct AddressSpaceSummary {
    std::array<CategoryStats, kCategoryCount> categories{};  // indexed by Category
    std::array<uint64_t, kCategoryCount> committed_size{};   // accessible part of size_bytes
    std::array<LargestRegion, kCategoryCount> largest{};     // indexed by Category
    std::array<CategoryStats, kRegionTypeCount> types{};     // indexed by RegionType
    std::vector<ImageUsage> images;                          // the Image row per module, largest virtual size first
    CategoryStats committed;                                 // accessible regions
    CategoryStats reserved;                                  // PROT_NONE regions
    uint64_t busy_bytes = 0;                                 // virtual size of all categories but Free
    uint64_t committed_bytes = 0;
    uint64_t reserved_bytes = 0;

    bool tracked = false;
    bool attached = false;
    uint64_t tracked_live_bytes = 0;
    uint64_t tracked_live_blocks = 0;
    // Attached, with the allocator's in-use figure: that figure minus
    // tracked live (above).
    bool has_not_covered = false;
    int64_t not_covered_bytes = 0;
    bool has_malloc = false;
    MallocStats malloc;
    uint64_t malloc_in_use_bytes = 0;  // uordblks + hblkhd
    uint64_t malloc_free_bytes = 0;    // fordblks
    double fragmentation = 0;          // fordblks / (uordblks + fordblks)
    // "glibc", "jemalloc", "tcmalloc", "mimalloc", or "" (unknown).
    std::string allocator_name;
    bool has_allocator = false;
    hslog::AllocatorStats allocator;
    uint32_t threads = 0;
    uint64_t recorder_bytes = 0;

    const CategoryStats& operator[](Category c) const { return categories[static_cast<size_t>(c)]; }
};

// Category of each region, in the order of inputs.regions.
std::vector<Category> classify(const SummaryInputs& in);

AddressSpaceSummary summarize(const SummaryInputs& in);

}  // namespace heapsnap::addrspace
