// Encoded records (module loads/unloads, stack definitions) waiting for the
// writer.
//
// Metadata is not time-ordered with events: it only has to precede the
// first event that uses it. Producers append it here under the metadata
// lock; the writer moves the queue into the stream at the start of each
// merge round, after it has read the ring heads and before any event of the
// round, so every stack an emitted event names is already defined.
//
// Each record is stored behind a 4-byte length so the writer can cut the
// queue into zstd frames at record boundaries.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/codec.h"

namespace heapsnap::recorder {

// Reserves room for one record of at most `max_bytes` and returns a writer
// over it; metadata_commit() finishes the record. Caller holds the metadata
// lock. Returns false if memory could not be had.
bool metadata_reserve(size_t max_bytes, codec::Writer* out);
void metadata_commit(const codec::Writer& record);

// Writer side, under the metadata lock: calls sink(bytes, size) for every
// queued record in order, then empties the queue.
template <class Sink>
void metadata_drain(Sink&& sink);

// Implementation details of metadata_drain.
const uint8_t* metadata_bytes();
size_t metadata_used();
void metadata_clear();

template <class Sink>
void metadata_drain(Sink&& sink) {
    const uint8_t* p = metadata_bytes();
    const uint8_t* end = p + metadata_used();
    while (p < end) {
        uint32_t n;
        __builtin_memcpy(&n, p, 4);
        sink(p + 4, n);
        p += 4 + n;
    }
    metadata_clear();
}

}  // namespace heapsnap::recorder
