#include "replay/history.h"

#include <fmt/format.h>

#include <functional>

#include "format/log_decoder.h"
#include "util/error.h"

namespace heapsnap {

namespace {

LogHistory history_of(HistoryReplay& replay) {
    LogHistory h;
    h.sizes = replay.live_sizes();
    h.heap_allocations = replay.heap_allocations();
    h.temporary = replay.temporary();
    h.timeline = replay.timeline();
    h.activity = replay.activity();
    h.peak = replay.peak(false);
    h.temporary_stacks.process = h.peak.process;
    h.temporary_stacks.modules = h.peak.modules;
    for (uint32_t id = 0; id < h.activity.size(); ++id) {
        if (!h.activity[id].temporary) continue;
        h.temporary_stacks.entries.push_back(SnapshotEntry{id, EntryKind::Heap, 0, 0, 0, 0});
    }
    h.stacks = std::make_shared<const StackTable>(replay.release_stacks());
    return h;
}

}  // namespace

LogHistory replay_history(const std::string& log, const Snapshot& moment) {
    HistoryReplay replay(moment.totals.events);
    read_log_as(log, replay);
    replay.finish();
    if (replay.totals().events != moment.totals.events)
        throw Error(fmt::format("{}: the log ends after {} events, before the moment (event {})", log,
                                replay.totals().events, moment.totals.events));
    return history_of(replay);
}

std::optional<LogHistory> replay_history_to_marker(const std::string& log, const Moment& moment, Snapshot& snapshot) {
    std::function<bool(const MarkerRecord&)> wanted;
    switch (moment.kind) {
        case Moment::Kind::Exit:
            wanted = [](const MarkerRecord& m) { return m.cause == hslog::MarkerCause::Exit; };
            break;
        case Moment::Kind::Index: wanted = [&](const MarkerRecord& m) { return m.index == moment.index; }; break;
        case Moment::Kind::Label: wanted = [&](const MarkerRecord& m) { return m.label == moment.text; }; break;
        default: return std::nullopt;
    }
    HistoryReplay replay(UINT64_MAX);
    replay.stop_at_marker(std::move(wanted));
    read_log_as(log, replay);
    if (!replay.at_marker()) return std::nullopt;
    replay.finish();
    snapshot = std::move(*replay.at_marker());
    snapshot.source = log;
    return history_of(replay);
}

}  // namespace heapsnap
