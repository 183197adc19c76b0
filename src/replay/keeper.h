// Keeps a running process's log checkpoint current, so that a live
// snapshot costs the events since the last checkpoint and the live set,
// never the process's whole history.
//
// `heapsnap run` runs one keeper per log its program writes, on a thread
// of the launcher (cli/cmd_run.cpp), which waits for the program anyway.
// Each refresh() reads what the log gained since the previous one into a
// replay it keeps in memory (the live set: what heaptrack's interpreter
// holds beside its program), and saves "<log>.checkpoint"
// (replay/checkpoint.h) once enough events came in since the last save to
// be worth a state's writing: at least `min_events`, and at least twice
// the live blocks, so that saving the state costs the history at most a
// small constant share. Refreshed several times a second, the keeper
// follows the log as it is written, and a snapshot resumes a fraction of
// a second before its marker.
//
// A snapshot resumes only from a checkpoint before its marker; one past
// it sends it back to the start of the log. Following the log closely,
// the keeper often reads a snapshot's marker (a Request marker) before
// the client has loaded the checkpoint. So from then on it saves nothing
// ("holds") until the checkpoint file has changed, which means the client
// has loaded it and saved its own at the marker, or until kHoldLimit has
// passed (a client that saves none). A client that saved before the
// keeper read its marker has changed the file already: the keeper
// compares with the file as it last saw it, its own save or the one it
// found at a release, and then does not hold.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "format/log_reader.h"
#include "util/files.h"

namespace heapsnap {

class CheckpointKeeper {
public:
    static constexpr uint64_t kMinEvents = 1'000'000;
    static constexpr std::chrono::seconds kHoldLimit{5};

    explicit CheckpointKeeper(std::string log, uint64_t min_events = kMinEvents);
    ~CheckpointKeeper();
    CheckpointKeeper(const CheckpointKeeper&) = delete;
    CheckpointKeeper& operator=(const CheckpointKeeper&) = delete;

    // Reads on, if the log grew, and saves a checkpoint when due and not
    // holding. False once the log has ended (its End record was read):
    // there is nothing more to keep. Throws heapsnap::Error when the log
    // cannot be read.
    bool refresh();

    // Checkpoints saved so far.
    uint64_t saves() const { return saves_; }
    // Whether it holds for a snapshot's client (no save until it is done).
    bool holding() const { return hold_until_.has_value(); }

private:
    class Kept;
    // Starts from the checkpoint a snapshot left, if there is a valid one.
    void resume_from_checkpoint(const LogFile& log);

    std::string path_;
    uint64_t min_events_;
    std::unique_ptr<Kept> replay_;
    std::optional<StreamPosition> position_;
    uint64_t events_at_save_ = 0;
    uint64_t saves_ = 0;
    uint64_t requests_seen_ = 0;      // Request markers read
    std::optional<FileStamp> known_;  // the checkpoint file as last seen
    std::optional<std::chrono::steady_clock::time_point> hold_until_;
};

// The pid of the process that writes `log` (its Process record); 0 if
// the log cannot be read.
uint64_t log_writer_pid(const std::string& log);

}  // namespace heapsnap
