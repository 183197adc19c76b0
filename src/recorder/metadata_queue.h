// Encoded records (module loads/unloads, stack definitions) waiting for the
// writer.
//
// Metadata is not time-ordered with events: it only has to precede the
// first event that uses it. Producers append it here under the metadata
// lock; the writer takes the queue at the start of each merge round, after
// it has read the ring heads and before any event of the round, so every
// stack an emitted event names is already defined. (Stack records are
// appended by the writer itself, just before it takes the queue:
// queue_pending_stacks in stack_table.h.)
//
// The writer takes the queued records under the lock but writes them out
// after releasing it: writing may cut and compress a frame (milliseconds),
// and a program thread interning a new stack meanwhile would wait for it.
// So there are two buffers: producers append to one while the writer
// reads the other.
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

// The records queued so far, in order.
struct MetadataBatch {
    const uint8_t* bytes;
    size_t size;
};

// Writer side, under the metadata lock: takes every queued record; later
// ones go to the other buffer. The batch stays valid until the next take,
// so the writer drains it (metadata_drain) before taking again.
MetadataBatch metadata_take();

// Calls sink(bytes, size) for every record of the batch, in order. Needs
// no lock.
template <class Sink>
void metadata_drain(MetadataBatch batch, Sink&& sink) {
    const uint8_t* p = batch.bytes;
    const uint8_t* end = p + batch.size;
    while (p < end) {
        uint32_t n;
        __builtin_memcpy(&n, p, 4);
        sink(p + 4, n);
        p += 4 + n;
    }
}

// Forgets every queued record (a fork child, which queues all again).
void metadata_clear();

}  // namespace heapsnap::recorder
