// libFuzzer target: hostile .hslog files (formats/hslog.md) through every
// reader of logs: the marker listing, snapshots at each kind of moment
// (exit, end, peak, an index, a label, a time), every marker at once, the
// history replay behind `report`, and what is then done with the result:
// written as a .hsnap, read back, summarised and diffed.
//
// Acceptable outcomes for any input: success, or heapsnap::Error (the CLI
// prints it as one line). Anything else (a crash, a sanitizer report, an
// uncaught exception such as std::bad_alloc from an unbounded allocation,
// a hang) is a finding. Checks that hold for every input that reads:
// a snapshot written can be read back with the same totals.
//
// Built by tools/fuzz with -fsanitize=fuzzer,address,undefined, and by
// meson without libFuzzer (fuzz_main.cpp) to replay tests/fuzz/corpus/log.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "format/log_reader.h"
#include "format/snapshot_file.h"
#include "fuzz_input.h"
#include "mutator.h"
#include "replay/marker_select.h"
#include "replay/replay.h"
#include "report/diff.h"
#include "report/render.h"
#include "util/error.h"
#include "util/read_budget.h"

using namespace heapsnap;

namespace {

[[noreturn]] void finding(const char* what) {
    std::fprintf(stderr, "fuzz_log: %s\n", what);
    std::abort();
}

// One symbolizer for many inputs (it caches ELF files), renewed now and
// then so its caches stay small.
Symbolizer& symbolizer() {
    static std::unique_ptr<Symbolizer> s;
    static unsigned uses = 0;
    if (!s || ++uses % 512 == 0) s = std::make_unique<Symbolizer>();
    return *s;
}

void round_trip(const Snapshot& s) {
    std::string path = fuzz::scratch_dir() + "/moment.hsnap";
    write_snapshot(path, s);
    Snapshot back = read_snapshot(path);  // what heapsnap writes, it must read
    if (back.totals.live_bytes != s.totals.live_bytes || back.totals.live_blocks != s.totals.live_blocks ||
        back.entries.size() != s.entries.size() || back.stacks.size() != s.stacks.size())
        finding("a snapshot read back differs from the one written");
    summarize_snapshot(back);
}

void moments(const std::string& log) {
    MarkerListing listing = list_markers(log);
    std::vector<Snapshot> taken;
    for (const char* at : {"exit", "end", "peak", "1", "snapshot", "0.001s"}) {
        try {
            taken.push_back(snapshot_at(log, parse_moment(at)));
        } catch (const Error&) {
            // no such moment in this log
        }
    }
    for (const Snapshot& s : taken) round_trip(s);
    if (taken.size() >= 2) {
        DiffResult d = diff(taken.front(), taken.back(), DiffOptions{}, symbolizer());
        render_diff_text(taken.front(), taken.back(), d, false);
        fuzz::as_printed(diff_to_json(taken.front(), taken.back(), d));
        render_diff_csv(d);
    }
    snapshot_every_marker(log);
    HistoryReplay history(UINT64_MAX);
    read_log(log, history);
    history.finish();
    history.peak();
    history.live_sizes();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    setenv("HEAPSNAP_NO_CHECKPOINT", "1", 1);  // no LOG.checkpoint files next to /proc/self/fd/N
    // Each input reads the log a dozen times; the default budget would let
    // one input take a minute (tests/fuzz/test_hostile_input.py tests it).
    setenv("HEAPSNAP_READ_VOLUME", "32M", 1);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static fuzz::InputFile input;
    budget_reset();  // each input has a budget of its own
    std::vector<uint8_t> wrapped;
    if (fuzz::is_raw(data, size)) {
        wrapped = fuzz::wrap(hslog::kMagic, hslog::kLogVersion, data + 1, size - 1);
        data = wrapped.data();
        size = wrapped.size();
    }
    const std::string& log = input.write(data, size);
    try {
        moments(log);
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
        fuzz::Bytes out = fuzz::mutate_log(in, rng);
        if (!out.empty() && out.size() <= max_size) {
            std::memcpy(data, out.data(), out.size());
            return out.size();
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
#endif
