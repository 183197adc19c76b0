// Choosing the moment of a log to snapshot: "LOG@MARKER" on the command
// line, `snapshot LOG --at MARKER`, and the marker listing.
//
// A MARKER is, in this order of interpretation:
//   exit       the marker written at normal exit
//   peak       the moment of most live heap bytes (two passes over the log)
//   end        the end of what the log holds (a crashed process)
//   N          all digits: the N-th marker, 1-based
//   12.5s      digits with an "s" suffix: that many seconds after start
//   anything else: the first marker with that label.
// Peak, end and time moments have no marker record of their own; their
// snapshot carries no address-space data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/log_reader.h"
#include "format/snapshot_file.h"

namespace heapsnap {

struct Moment {
    enum class Kind { Exit, Peak, End, Index, Time, Label };
    Kind kind = Kind::Exit;
    uint32_t index = 0;
    uint64_t offset_ns = 0;
    std::string text;  // as given
};

Moment parse_moment(const std::string& text);

// Replays `log` up to the moment. Throws heapsnap::Error when the moment is
// not in the log, naming the markers it has.
Snapshot snapshot_at(const LogFile& log, const Moment& moment);
Snapshot snapshot_at(const std::string& log, const Moment& moment);

struct MarkerRow {
    MarkerRecord marker;  // regions dropped
    double time_s = 0;
    uint64_t live_bytes = 0;
    uint64_t live_blocks = 0;
    uint64_t mmap_bytes = 0;
    uint64_t mmap_regions = 0;
};

struct MarkerListing {
    ProcessInfo process;
    std::vector<MarkerRow> rows;
    bool truncated = false;
    bool complete = false;
    // Events the recorder could not record, as of the End record (or the
    // last marker of a log without one).
    uint64_t unrecorded = 0;
};

MarkerListing list_markers(const std::string& log);

// "OLD@MARKER" splitting: returns true and fills log/moment if `arg` names
// an existing file followed by @MARKER (the last '@' that leaves an
// existing file name before it).
bool split_log_at(const std::string& arg, std::string* log, std::string* moment);

std::string marker_cause_name(hslog::MarkerCause cause);

}  // namespace heapsnap
