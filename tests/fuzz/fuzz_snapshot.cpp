// libFuzzer target: hostile .hsnap files (formats/hsnap.md) through
// read_snapshot and everything `diff`, `maps` and `report` then do with a
// snapshot: symbolize its stacks, diff it against itself and against a
// well-formed snapshot of another program, render text, JSON and CSV,
// summarise its address space.
//
// Acceptable outcomes: success, or heapsnap::Error. Anything else is a
// finding (see fuzz_log.cpp).
//
// Built by tools/fuzz with -fsanitize=fuzzer,address,undefined, and by
// meson without libFuzzer (fuzz_main.cpp) to replay tests/fuzz/corpus/snapshot.
#include <cstdint>
#include <memory>

#include "addrspace/summary.h"
#include "report/address_space.h"
#include "format/snapshot_file.h"
#include "fuzz_input.h"
#include "mutator.h"
#include "report/diff.h"
#include "report/render.h"
#include "report/report.h"
#include "util/error.h"
#include "util/read_budget.h"

using namespace heapsnap;

namespace {

Symbolizer& symbolizer() {
    static std::unique_ptr<Symbolizer> s;
    static unsigned uses = 0;
    if (!s || ++uses % 512 == 0) s = std::make_unique<Symbolizer>();
    return *s;
}

// A small, valid snapshot of some other program.
const Snapshot& other() {
    static const Snapshot s = [] {
        Snapshot o;
        o.process.pid = 1;
        o.process.exe = "/nonexistent/other";
        o.marker.label = "other";
        o.marker.index = 1;
        o.stacks[1] = {StackFrame{0, 0x1234}};
        o.entries.push_back(SnapshotEntry{1, EntryKind::Heap, 100, 1, 0, 0});
        o.totals.live_bytes = 100;
        o.totals.live_blocks = 1;
        return o;
    }();
    return s;
}

void use(const Snapshot& s) {
    for (const Snapshot* old_snap : {&s, &other()}) {
        for (GroupBy by : {GroupBy::Stack, GroupBy::Function, GroupBy::Module}) {
            DiffOptions options;
            options.group_by = by;
            DiffResult d = diff(*old_snap, s, options, symbolizer());
            render_diff_text(*old_snap, s, d, false);
            fuzz::as_printed(diff_to_json(*old_snap, s, d));
            render_diff_csv(d);
        }
    }
    addrspace::AddressSpaceSummary summary = summarize_snapshot(s);
    addrspace::render_text(summary, false);
    fuzz::as_printed(addrspace::to_json(summary));
    Report r = build_report(s, nullptr, ReportOptions{}, symbolizer());
    ReportRender how;
    render_report_text(s, r, how);
    fuzz::as_printed(report_to_json(s, r, 10));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static fuzz::InputFile input;
    budget_reset();  // each input has a budget of its own
    std::vector<uint8_t> wrapped;
    if (fuzz::is_raw(data, size)) {
        wrapped = fuzz::wrap("HSNAPSHT", kSnapshotVersion, data + 1, size - 1);
        data = wrapped.data();
        size = wrapped.size();
    }
    const std::string& path = input.write(data, size);
    try {
        use(read_snapshot(path));
    } catch (const Error&) {
        // a clear error: what hostile input should get
    }
    return 0;
}

#ifdef HEAPSNAP_LIBFUZZER
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Half of the mutations structure-aware (mutator.h), the other half
// libFuzzer's own, which also works on the 'R' raw inputs.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
    fuzz::Rng rng(seed);
    if (!fuzz::is_raw(data, size) && rng() % 2) {
        fuzz::Bytes in(data, data + size);
        fuzz::Bytes out = fuzz::mutate_snapshot(in, rng);
        if (!out.empty() && out.size() <= max_size) {
            std::memcpy(data, out.data(), out.size());
            return out.size();
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
#endif
