// Markers: a named moment plus what was true then (RSS, threads, mallinfo2,
// the recorder's own memory, and every region of /proc/self/smaps).
//
// The payload is built by the thread that asks for the marker, right then,
// into its own page-mapped buffer; only a pointer travels through the ring.
// The writer copies the payload into the stream at the marker's place in
// time order and unmaps it. The live heap "at the marker" is exactly the
// events stamped before it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/hslog.h"

namespace heapsnap::recorder {

// Records a marker now. Returns a token (never 0) that names this marker
// until the writer has given it its index, or 0 when not recording.
//
// Indices are given by the writer in the order markers enter the log, so
// "marker 3" is always the third moment in time, whichever threads asked.
uint32_t take_marker(hslog::MarkerCause cause, const char* label);

// Writer side.
void release_marker_payload(uint8_t* payload, size_t size);

}  // namespace heapsnap::recorder
