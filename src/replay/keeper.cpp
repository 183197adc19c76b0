#include "replay/keeper.h"

#include <utility>
#include <vector>

#include "format/log_decoder.h"
#include "replay/checkpoint.h"
#include "replay/replay.h"

namespace heapsnap {

// The whole log as far as it goes: every marker kept (without regions, as
// a checkpoint holds them), no moment taken.
class CheckpointKeeper::Kept final : public Replay {
public:
    void on_marker(const MarkerRecord& m) override { seen_.push_back(without_regions(m)); }
    void on_end(const EndRecord&) override { ended_ = true; }

    const std::vector<MarkerRecord>& seen() const { return seen_; }
    bool ended() const { return ended_; }

private:
    std::vector<MarkerRecord> seen_;
    bool ended_ = false;
};

CheckpointKeeper::CheckpointKeeper(std::string log) : path_(std::move(log)), replay_(std::make_unique<Kept>()) {}

CheckpointKeeper::~CheckpointKeeper() = default;

bool CheckpointKeeper::refresh() {
    LogFile log{path_};
    ReadSummary summary = read_log_as(log, *replay_, position_ ? &*position_ : nullptr);
    if (summary.end_resumable) position_ = std::move(summary.end);
    if (replay_->ended()) return false;
    uint64_t events = replay_->totals().events;
    uint64_t due = std::max(kMinEvents, 2 * replay_->totals().live_blocks);
    if (position_ && events - events_at_save_ >= due) {
        save_checkpoint(log, *position_, replay_->seen(), *replay_);
        events_at_save_ = events;
        saves_++;
    }
    return true;
}

}  // namespace heapsnap
