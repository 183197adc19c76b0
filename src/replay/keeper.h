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
// be worth a state's writing: at least kMinEvents, and at least twice the
// live blocks, so that saving the state costs the history at most a small
// constant share. A `heapsnap snapshot PID` then resumes from there.
//
// A snapshot that finds the checkpoint already past the marker it asked
// for reads from the start: a keeper whose read took in that marker must
// also have finished and saved between the marker's writing and the
// client's loading of the checkpoint, a window far shorter than a read of
// kMinEvents events. The outcome is the same snapshot, only slower.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "format/log_reader.h"

namespace heapsnap {

class CheckpointKeeper {
public:
    static constexpr uint64_t kMinEvents = 1'000'000;

    explicit CheckpointKeeper(std::string log);
    ~CheckpointKeeper();
    CheckpointKeeper(const CheckpointKeeper&) = delete;
    CheckpointKeeper& operator=(const CheckpointKeeper&) = delete;

    // Reads on and saves a checkpoint when due. False once the log has
    // ended (its End record was read): there is nothing more to keep.
    // Throws heapsnap::Error when the log cannot be read.
    bool refresh();

    // Checkpoints saved so far.
    uint64_t saves() const { return saves_; }

private:
    class Kept;
    std::string path_;
    std::unique_ptr<Kept> replay_;
    std::optional<StreamPosition> position_;
    uint64_t events_at_save_ = 0;
    uint64_t saves_ = 0;
};

}  // namespace heapsnap
