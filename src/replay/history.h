// What only a log can tell about a moment, beyond its snapshot: the size
// histogram of the live blocks, the allocation timeline, each stack's
// activity, the peak, the stacks of temporary allocations. `heapsnap
// report LOG` shows them; a report of a snapshot alone has none.
//
// Replays the log (a HistoryReplay), so it lives with the replay: the
// reports above it never decode a log themselves.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "replay/marker_select.h"
#include "replay/replay.h"

namespace heapsnap {

// What only a log can tell, up to the moment.
struct LogHistory {
    SizeHistogram sizes;  // live heap blocks at the moment
    uint64_t heap_allocations = 0;
    uint64_t temporary = 0;
    AllocationTimeline timeline;
    std::vector<StackActivity> activity;  // by stack id of the log
    Snapshot peak;                        // HistoryReplay::peak(), its stacks in `stacks`
    // The modules, and an empty heap entry per stack that made temporary
    // allocations (most have nothing live at the moment), to name them;
    // their stacks in `stacks`.
    Snapshot temporary_stacks;
    // Every stack the log defined up to the moment, kept as the replay
    // keeps them rather than copied per snapshot.
    std::shared_ptr<const StackTable> stacks;
};

// Replays `log` up to the moment `moment` was taken at (a snapshot of that
// log: its totals.events events). Throws heapsnap::Error if the log ends
// before.
LogHistory replay_history(const std::string& log, const Snapshot& moment);

// The same for a moment at a marker (exit, N, a label), from one pass that
// also takes the moment's snapshot (snapshot_at's) into `snapshot`, whose
// stacks are left to the history's `stacks` (not copied per entry). Nothing
// for other moments, or when the log has no such marker (snapshot_at says
// why).
std::optional<LogHistory> replay_history_to_marker(const std::string& log, const Moment& moment, Snapshot& snapshot);

}  // namespace heapsnap
