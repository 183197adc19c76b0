#include "replay/keeper.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "format/log_decoder.h"
#include "replay/checkpoint.h"
#include "replay/replay.h"
#include "util/error.h"

namespace heapsnap {

// The whole log as far as it goes: every marker kept (without regions, as
// a checkpoint holds them), no moment taken.
class CheckpointKeeper::Kept final : public Replay {
public:
    void on_marker(const MarkerRecord& m) override {
        seen_.push_back(without_regions(m));
        if (m.cause == hslog::MarkerCause::Request) requests_++;
    }
    void on_end(const EndRecord&) override { ended_ = true; }

    // Continues from a checkpoint: its state and the markers before it.
    void restore(const Checkpoint& c) {
        codec::Reader r(c.state().data(), c.state().size());
        load_state(r);
        if (!r.ok()) throw Error("the checkpoint's state does not decode");
        seen_ = c.markers;
        requests_ = std::count_if(seen_.begin(), seen_.end(),
                                  [](const MarkerRecord& m) { return m.cause == hslog::MarkerCause::Request; });
    }

    const std::vector<MarkerRecord>& seen() const { return seen_; }
    bool ended() const { return ended_; }
    uint64_t requests() const { return requests_; }

private:
    std::vector<MarkerRecord> seen_;
    uint64_t requests_ = 0;
    bool ended_ = false;
};

CheckpointKeeper::CheckpointKeeper(std::string log, uint64_t min_events)
    : path_(std::move(log)), min_events_(min_events), replay_(std::make_unique<Kept>()) {}

CheckpointKeeper::~CheckpointKeeper() = default;

void CheckpointKeeper::resume_from_checkpoint(const LogFile& log) {
    std::optional<FileStamp> file = checkpoint_stamp(log);
    std::optional<Checkpoint> c = load_checkpoint(log);
    if (!c) return;
    try {
        replay_->restore(*c);
    } catch (const std::exception&) {
        replay_ = std::make_unique<Kept>();  // read from the start instead
        return;
    }
    position_ = std::move(c->position);
    events_at_save_ = replay_->totals().events;
    requests_seen_ = replay_->requests();
    known_ = file;
}

bool CheckpointKeeper::refresh() {
    LogFile log{path_};
    if (!position_) resume_from_checkpoint(log);
    struct stat st;
    bool grown = !position_ || stat(path_.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) > position_->offset;
    if (grown) {
        ReadSummary summary = read_log_as(log, *replay_, position_ ? &*position_ : nullptr);
        if (summary.end_resumable) position_ = std::move(summary.end);
        if (replay_->ended()) return false;
    }
    auto now = std::chrono::steady_clock::now();
    if (replay_->requests() > requests_seen_) {
        requests_seen_ = replay_->requests();
        std::optional<FileStamp> file = checkpoint_stamp(log);
        if (file == known_)
            hold_until_ = now + kHoldLimit;
        else
            known_ = file;  // its client saved already
    }
    if (hold_until_) {
        std::optional<FileStamp> file = checkpoint_stamp(log);
        if (file == known_ && now < *hold_until_) return true;
        hold_until_.reset();
        known_ = file;
    }
    uint64_t events = replay_->totals().events;
    uint64_t due = std::max(min_events_, 2 * replay_->totals().live_blocks);
    if (position_ && events - events_at_save_ >= due) {
        known_ = save_checkpoint(log, *position_, replay_->seen(), *replay_);
        events_at_save_ = events;
        saves_++;
    }
    return true;
}

uint64_t log_writer_pid(const std::string& log) {
    class ProcessOnly final : public LogVisitor {
    public:
        void on_process(const ProcessInfo& p) override {
            pid = p.pid;
            request_stop();
        }
        uint64_t pid = 0;
    } process;
    try {
        read_log_as(LogFile{log}, process);
    } catch (const Error&) {
        return 0;
    }
    return process.pid;
}

}  // namespace heapsnap
