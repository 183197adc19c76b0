// Turning results into what people and scripts read: the UMDH-like text of
// a diff, its JSON (formats/diff-json.md) and CSV, and the address-space
// summary of a snapshot. Colour only when asked (the CLI asks on a TTY
// without NO_COLOR).
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "addrspace/summary.h"
#include "report/address_space.h"
#include "format/snapshot_file.h"
#include "report/diff.h"

namespace heapsnap {

// The address-space summary of a snapshot, with what the recorder knew.
addrspace::AddressSpaceSummary summarize_snapshot(const Snapshot& snapshot);

std::string render_diff_text(const Snapshot& old_snap, const Snapshot& new_snap, const DiffResult& diff, bool color);
// The same, written to `os` as it is rendered.
void write_diff_text(std::ostream& os, const Snapshot& old_snap, const Snapshot& new_snap, const DiffResult& diff,
                     bool color);
nlohmann::json diff_to_json(const Snapshot& old_snap, const Snapshot& new_snap, const DiffResult& diff);
std::string render_diff_csv(const DiffResult& diff);
// The CSV line of the frees of blocks allocated before recording between
// the moments (kind `freed_before_recording`), or "" when neither moment
// is of an attached recording.
std::string render_freed_before_csv(const Snapshot& old_snap, const Snapshot& new_snap);

// {"pid","exe","label","time_s","live_bytes","live_blocks",...} of one side.
nlohmann::json moment_json(const Snapshot& snapshot);
nlohmann::json frame_json(const SymbolFrame& frame);

}  // namespace heapsnap
