#include "replay/marker_select.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>

#include "format/log_decoder.h"
#include "replay/checkpoint.h"
#include "replay/replay.h"
#include "util/diagnostics.h"
#include "util/error.h"

namespace heapsnap {
namespace {

const char* cause_name(hslog::MarkerCause c) {
    switch (c) {
        case hslog::MarkerCause::User: return "user";
        case hslog::MarkerCause::Interval: return "interval";
        case hslog::MarkerCause::Request: return "request";
        case hslog::MarkerCause::Exit: return "exit";
        case hslog::MarkerCause::Pause: return "pause";
        case hslog::MarkerCause::Resume: return "resume";
        case hslog::MarkerCause::Threshold: return "threshold";
    }
    return "?";
}

bool all_digits(const std::string& s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos; }

// Replays up to the chosen moment and keeps the snapshot taken there.
class MomentReplay final : public Replay {
public:
    MomentReplay(const Moment& moment, uint64_t stop_after_events)
        : moment_(moment), stop_after_events_(stop_after_events) {}

    void on_marker(const MarkerRecord& m) override {
        last_marker_ns_ = std::max(last_marker_ns_, m.time_ns);
        seen_.push_back(without_regions(m));
        bool match = false;
        switch (moment_.kind) {
            case Moment::Kind::Exit: match = m.cause == hslog::MarkerCause::Exit; break;
            case Moment::Kind::Index: match = m.index == moment_.index; break;
            case Moment::Kind::Label: match = m.label == moment_.text; break;
            default: break;
        }
        if (match) take(m, true);
    }
    void on_alloc(const AllocEvent& e) override {
        if (before(e.time_ns)) Replay::on_alloc(e), after_event();
    }
    void on_free(const FreeEvent& e) override {
        if (before(e.time_ns)) Replay::on_free(e), after_event();
    }
    void on_mmap(const MmapEvent& e) override {
        if (before(e.time_ns)) Replay::on_mmap(e), after_event();
    }
    void on_munmap(const MunmapEvent& e) override {
        if (before(e.time_ns)) Replay::on_munmap(e), after_event();
    }

    // Continues from a checkpoint: the state and the markers seen before it.
    void restore(const Checkpoint& c) {
        codec::Reader r(c.state().data(), c.state().size());
        load_state(r);
        if (!r.ok()) throw Error("the checkpoint's state does not decode");
        seen_ = c.markers;
    }

    void on_end(const EndRecord& e) override { end_ = e; }

    bool taken() const { return taken_; }
    // The log's End record, if it has one.
    const std::optional<EndRecord>& end() const { return end_; }
    // The last moment the log speaks of: its last event or marker.
    uint64_t end_ns() const { return std::max(last_time_ns(), last_marker_ns_); }
    Snapshot& result() { return result_; }
    const std::vector<MarkerRecord>& seen() const { return seen_; }

    void take_synthetic(uint64_t time_ns, const std::string& label) {
        MarkerRecord m;
        m.time_ns = time_ns;
        m.label = label;
        m.events = totals().events;
        take(m, false);
    }

private:
    // Time moments: the first event not before the offset ends the replay
    // without being applied. Event times are exact to 1 ms
    // (hslog::kEventTimeStep): an event stamped t happened in [t, t + 1 ms),
    // so one stamped at the offset itself is not before it (and "0s" is the
    // moment before every event).
    bool before(uint64_t t) {
        if (moment_.kind != Moment::Kind::Time || taken_) return !taken_;
        uint64_t since_start = t > process().start_ns ? t - process().start_ns : 0;
        if (since_start < moment_.offset_ns) return true;
        take_synthetic(process().start_ns + moment_.offset_ns, moment_.text);
        return false;
    }
    void after_event() {
        if (stop_after_events_ && totals().events == stop_after_events_) take_synthetic(last_time_ns(), "peak");
    }
    void take(const MarkerRecord& m, bool has_data) {
        result_ = snapshot(m, has_data);
        taken_ = true;
        request_stop();
    }

    Moment moment_;
    uint64_t last_marker_ns_ = 0;
    uint64_t stop_after_events_;
    bool taken_ = false;
    Snapshot result_;
    std::vector<MarkerRecord> seen_;
    std::optional<EndRecord> end_;
};

// Finds how many events had been replayed when live heap bytes peaked.
class PeakFinder final : public Replay {
public:
    void on_alloc(const AllocEvent& e) override {
        Replay::on_alloc(e);
        if (totals().live_bytes > best_) {
            best_ = totals().live_bytes;
            events_at_best_ = totals().events;
        }
    }
    uint64_t events_at_peak() const { return events_at_best_; }

private:
    uint64_t best_ = 0;
    uint64_t events_at_best_ = 0;
};

std::string describe(const std::vector<MarkerRecord>& markers) {
    if (markers.empty()) return "the log has no markers";
    std::string s = "markers:";
    for (const auto& m : markers) s += " " + std::to_string(m.index) + " \"" + m.label + "\"";
    return s;
}

}  // namespace

Moment parse_moment(const std::string& text) {
    Moment m;
    m.text = text;
    if (text.empty()) throw Error("empty marker name");
    if (text == "exit") {
        m.kind = Moment::Kind::Exit;
    } else if (text == "peak") {
        m.kind = Moment::Kind::Peak;
    } else if (text == "end") {
        m.kind = Moment::Kind::End;
    } else if (all_digits(text)) {
        m.kind = Moment::Kind::Index;
        unsigned long v = std::strtoul(text.c_str(), nullptr, 10);
        if (v == 0 || v > UINT32_MAX) throw Error("marker index " + text + " out of range (markers count from 1)");
        m.index = static_cast<uint32_t>(v);
    } else if (text.size() > 1 && text.back() == 's' && text.find_first_not_of("0123456789.") == text.size() - 1) {
        char* end = nullptr;
        double seconds = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() - 1 || seconds < 0)
            throw Error("bad time offset '" + text + "' (expected e.g. 12.5s)");
        m.kind = Moment::Kind::Time;
        m.offset_ns = static_cast<uint64_t>(seconds * 1e9);
    } else {
        m.kind = Moment::Kind::Label;
    }
    return m;
}

namespace {

// Whether the moment lies after everything a checkpoint has seen.
bool after_checkpoint(const Moment& moment, const Checkpoint& c) {
    auto any = [&](auto&& pred) { return std::any_of(c.markers.begin(), c.markers.end(), pred); };
    switch (moment.kind) {
        case Moment::Kind::Index: return c.markers.empty() || c.markers.back().index < moment.index;
        case Moment::Kind::Label: return !any([&](const MarkerRecord& m) { return m.label == moment.text; });
        case Moment::Kind::Exit: return !any([](const MarkerRecord& m) { return m.cause == hslog::MarkerCause::Exit; });
        case Moment::Kind::End: return true;
        case Moment::Kind::Peak:
        case Moment::Kind::Time: return false;
    }
    return false;
}

// Why a log has no exit marker, from how it ends (formats/hslog.md, End).
std::string why_no_exit(const std::optional<EndRecord>& end, const ReadSummary& summary) {
    if (!end) {
        if (summary.truncated) return "the process did not exit normally (the log is truncated)";
        return "the log has no end: the process was killed, crashed or is still running";
    }
    switch (end->reason) {
        case hslog::EndReason::Exec:
            return "the process called exec, where this log ends (the new program records into a log of its own)";
        case hslog::EndReason::Shutdown: return "recording stopped while the process ran on";
        case hslog::EndReason::Exit: break;
    }
    return "the log ends at the process's exit without one";
}

}  // namespace

Snapshot snapshot_at(const LogFile& log, const Moment& moment) {
    const std::string& path = log.path;
    uint64_t stop_after = 0;
    if (moment.kind == Moment::Kind::Peak) {
        PeakFinder finder;
        read_log_as(log, finder);
        stop_after = finder.events_at_peak();
        if (!stop_after) throw Error(path + ": no heap allocation in the log, so no peak");
    }
    auto replay_ptr = std::make_unique<MomentReplay>(moment, stop_after);
    std::optional<Checkpoint> checkpoint = checkpoints_enabled() ? load_checkpoint(log) : std::nullopt;
    if (checkpoint && !after_checkpoint(moment, *checkpoint)) checkpoint.reset();
    if (checkpoint) {
        try {
            replay_ptr->restore(*checkpoint);
            checkpoint->drop_state();
        } catch (const BudgetExceeded&) {
            // The state and the replay it fills do not fit the read budget
            // together: a cache, so read from the start instead.
            checkpoint.reset();
            replay_ptr = std::make_unique<MomentReplay>(moment, stop_after);
        } catch (const Error& e) {
            // A state that passed the file's checks but does not decode
            // (the keeper, which restores the same way, gives up on it):
            // a cache too, read from the start, saying so once.
            warn(path + ": " + e.what() + "; the log is read from its start");
            checkpoint.reset();
            replay_ptr = std::make_unique<MomentReplay>(moment, stop_after);
        }
    }
    MomentReplay& replay = *replay_ptr;
    ReadSummary summary = read_log_as(log, replay, checkpoint ? &checkpoint->position : nullptr);
    if (replay.taken() && summary.resumable && checkpoints_enabled())
        save_checkpoint(log, summary.resume, replay.seen(), replay);
    if (!replay.taken()) {
        switch (moment.kind) {
            case Moment::Kind::End:
            case Moment::Kind::Time: replay.take_synthetic(replay.end_ns(), moment.text); break;
            case Moment::Kind::Exit:
                throw Error(path + ": no marker \"exit\": " + why_no_exit(replay.end(), summary) +
                            " — use @end for everything the log holds; " + describe(replay.seen()));
            default: throw Error(path + ": no marker \"" + moment.text + "\"; " + describe(replay.seen()));
        }
    }
    Snapshot s = std::move(replay.result());
    s.source = path;
    return s;
}

Snapshot snapshot_at(const std::string& log, const Moment& moment) { return snapshot_at(LogFile{log}, moment); }

MarkerListing list_markers(const std::string& log) {
    class Lister final : public Replay {
    public:
        void on_marker(const MarkerRecord& m) override {
            MarkerRow row;
            row.marker = without_regions(m);
            row.time_s = static_cast<double>(m.time_ns - process().start_ns) / 1e9;
            row.live_bytes = totals().live_bytes;
            row.live_blocks = totals().live_blocks;
            row.mmap_bytes = totals().mmap_bytes;
            row.mmap_regions = totals().mmap_regions;
            rows.push_back(std::move(row));
            unrecorded = m.unrecorded;
        }
        void on_end(const EndRecord& e) override {
            Replay::on_end(e);
            unrecorded = e.unrecorded;
        }
        std::vector<MarkerRow> rows;
        uint64_t unrecorded = 0;
    } lister;
    ReadSummary summary = read_log_as(log, lister);
    MarkerListing listing;
    listing.process = lister.process();
    listing.rows = std::move(lister.rows);
    listing.truncated = summary.truncated;
    listing.complete = summary.complete;
    listing.unrecorded = lister.unrecorded;
    return listing;
}

bool split_log_at(const std::string& arg, std::string* log, std::string* moment) {
    for (size_t at = arg.rfind('@'); at != std::string::npos && at > 0; at = arg.rfind('@', at - 1)) {
        std::string file = arg.substr(0, at);
        struct stat st;
        if (stat(file.c_str(), &st) == 0) {
            *log = file;
            *moment = arg.substr(at + 1);
            return true;
        }
        if (at == 0) break;
    }
    return false;
}

std::string marker_cause_name(hslog::MarkerCause c) { return cause_name(c); }

}  // namespace heapsnap
