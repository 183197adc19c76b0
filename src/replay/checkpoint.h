// Replay checkpoints: a later snapshot of the same log resumes where an
// earlier one stopped instead of replaying from the start.
//
// Why: `heapsnap snapshot PID` on a long-running server re-reads a log
// that only grows; without a checkpoint the n-th snapshot costs the whole
// history again. Each snapshot taken at a marker (markers always end their
// zstd frame, so the read stopped on a frame boundary) saves the complete
// replay state next to the log as "<log>.checkpoint" (framed_file.h
// container, magic "HSNAPCKP"; mode 0600, written atomically). A later
// request for a moment after it loads the state and reads on from the
// saved byte offset.
//
// The checkpoint is a cache: it is ignored (and replaced) when it does not
// belong to this log (the log's first bytes are fingerprinted), when the
// moment asked for is not after it, or when it cannot be read; a log
// directory that is not writable (or, to the caller, not searchable)
// simply gets none. It is read and written in the directory that holds
// the log, opened once, so a path component renamed or replaced by a
// symlink meanwhile cannot redirect it. A log read through a descriptor
// (LogFile::fd: a running process's log, whose path came from that
// process) gets a checkpoint only if its path names that very file.
//
// Size: the live blocks (about 10 bytes each compressed), the allocation
// infos (a few bytes each: the distinct (fn, size, stack) triples), every
// stack definition and the live mappings — bounded by the live set and the
// number of distinct stacks and infos, not by the number of events.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "format/log_reader.h"
#include "replay/replay.h"
#include "util/files.h"

namespace heapsnap {

struct Checkpoint {
    StreamPosition position;
    std::vector<MarkerRecord> markers;  // seen before the position, without regions
    std::vector<uint8_t> body;          // the checkpoint's, decompressed
    size_t state_offset = 0;            // where in it Replay::save_state's bytes start
    MemoryCharge held;                  // the body's memory (util/read_budget.h)

    std::span<const uint8_t> state() const { return std::span<const uint8_t>(body).subspan(state_offset); }
    // Once the state is loaded into a replay.
    void drop_state() {
        body = {};
        held.give_back();
    }
};

std::string checkpoint_path(const std::string& log);

// False when HEAPSNAP_NO_CHECKPOINT is set to anything but empty or "0":
// checkpoints are then neither read nor written, nor kept by the launcher.
bool checkpoints_enabled();

// The checkpoint of `log`, if there is a valid one.
std::optional<Checkpoint> load_checkpoint(const LogFile& log);

// Best effort: failures to write are ignored. The stamp of the file
// written, if one was.
std::optional<FileStamp> save_checkpoint(const LogFile& log, const StreamPosition& position,
                                         const std::vector<MarkerRecord>& markers, const Replay& replay);

// The stamp of the file at the checkpoint's name now (never followed
// if it is a symlink); nullopt if there is none or the log has no place
// for one.
std::optional<FileStamp> checkpoint_stamp(const LogFile& log);

}  // namespace heapsnap
