#include "report/address_space.h"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "util/human.h"
#include "util/text.h"

namespace heapsnap::addrspace {
namespace {

int64_t delta(uint64_t old_v, uint64_t new_v) { return static_cast<int64_t>(new_v - old_v); }

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
        largest.push_back({{category_name(c)},
                           {fmt::format("{:#x}", big.start)},
                           {human_bytes(big.size_bytes)},
                           {terminal_safe(big.path)}});
    }
    out += '\n';
    out += render_table(largest, color, {3});

    if (!s.images.empty()) {
        constexpr size_t kImagesShown = 10;
        std::vector<Row> images = {{{"Image"}, {"Regions"}, {"Size"}, {"Rss"}, {"Private_Dirty"}}};
        for (size_t i = 0; i < s.images.size() && i < kImagesShown; ++i) {
            const ImageUsage& m = s.images[i];
            images.push_back({{terminal_safe(m.path)},
                              {std::to_string(m.stats.regions)},
                              {human_bytes(m.stats.size_bytes)},
                              {human_bytes(m.stats.rss_bytes)},
                              {human_bytes(m.stats.private_dirty_bytes)}});
        }
        if (s.images.size() > kImagesShown)
            images.push_back({{fmt::format("({} more in --format json)", s.images.size() - kImagesShown)}});
        out += '\n';
        out += render_table(images, color, {});
    }

    std::vector<Row> rec;
    rec.push_back({{"Reconciliation"}});
    rec.push_back(
        {{"  allocator"}, {s.allocator_name.empty() ? std::string("unknown") : terminal_safe(s.allocator_name)}});
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
        if (s.has_not_covered)
            rec.push_back({{"  not covered by recording"},
                           {fmt::format("{} (in use - tracked live: blocks from before attach, overhead)",
                                        human_bytes_signed(s.not_covered_bytes))}});
        else if (s.tracked)
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
            if (a.present & f.bit)
                rec.push_back({{std::string("  ") + s.allocator_name + " " + f.name}, {human_bytes(f.value)}});
        if ((a.present & F::kAllocated) && (a.present & F::kActive) && a.active >= a.allocated)
            rec.push_back({{"  fragmentation"},
                           {fmt::format("{:.1f}% ((active - allocated) / active)",
                                        a.active ? 100.0 * static_cast<double>(a.active - a.allocated) /
                                                       static_cast<double>(a.active)
                                                 : 0.0)}});
        if (s.has_not_covered)
            rec.push_back({{"  not covered by recording"},
                           {fmt::format("{} (allocated - tracked live: blocks from before attach, overhead)",
                                        human_bytes_signed(s.not_covered_bytes))}});
        else if (s.tracked && (a.present & F::kAllocated))
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
    j["attached"] = s.attached;
    j["not_covered_bytes"] = s.has_not_covered ? nlohmann::json(s.not_covered_bytes) : nlohmann::json(nullptr);
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
    j["not_covered_bytes"] =
        o.has_not_covered && n.has_not_covered ? nlohmann::json(n.not_covered_bytes - o.not_covered_bytes) : null;
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
        case Category::Image: return fmt::format("growth is loaded images: {} virtual, {} rss", size, rss);
        case Category::MappedFile:
            return fmt::format("growth is mapped files and shared memory: {} virtual, {} rss", size, rss);
        case Category::Anonymous: return fmt::format("growth is anonymous mmap: {} virtual, {} rss", size, rss);
        default: return fmt::format("growth is other mappings: {} virtual, {} rss", size, rss);
    }
}

}  // namespace heapsnap::addrspace
