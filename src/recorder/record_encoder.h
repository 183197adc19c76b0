// The record encoder: turns the merged events and the queued metadata into
// .hslog records (formats/hslog.md) in the frame the writer is filling.
//
// The writer (writer.cpp) merges the rings, runs the thread and owns the
// file, the frame buffer and its compression; this file owns what the
// stream of records means, the state a record is encoded against:
//
// - Time: the stream's time in microseconds (hslog::kTimeUnitNs). Events
//   carry none of their own; a Time record moves it when an event is 1 ms
//   (hslog::kEventTimeStep) or more past it. Thread starts and exits,
//   markers and the End record carry their delta.
// - Addresses: delta-coded against the previous one written.
// - Threads: a Thread record when the next event is another thread's.
// - Blocks: the allocation-info tables (alloc_infos.h) name a live block
//   by an info id or by its address; a free names it the same way.
// - Stacks: an event's stack id comes from its slot, or is interned here:
//   the StackDefs of stacks threads handed on (unwind.h, "Local keys"),
//   kept per stack cache so later events name them by local key, and the
//   one-frame stacks of signal handlers (kDeferredStack). A stack's
//   Stack record, like every queued metadata record (metadata_queue.h),
//   goes into the stream before the first event that names it.
//
// Everything here runs with the writer lock held (writer.cpp), on the
// writer thread or in a producer draining inline. encode() runs once per
// event: it and what it calls on the frame (frame_reserve, frame_commit)
// are inlined into the merge round by LTO (meson.build), so the split
// between the two files costs no call per event.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/codec.h"
#include "format/hslog.h"
#include "recorder/thread_buffer.h"

namespace heapsnap::recorder {

// A new log: the stream's time at the recorder's start, address and
// thread unset, counts at zero, the allocation-info tables emptied.
void encoder_start_log();
// The Process record (the log's first). Its CLOCK_REALTIME is the log's
// start (log_start_realtime_ns).
void put_process_record();
// The queued metadata (metadata_queue.h), the Stack records of the stacks
// interned since the last call first, ahead of the events that follow.
void put_queued_metadata();
// Interns the stack of the StackDef at `at` of `ring` and defines it in
// the log. Returns the slots it spans; `end` is the ring's published end.
uint64_t take_stack_def(const ThreadRing& ring, uint64_t at, uint64_t end);
// One event or marker (not a StackDef or Void slot). A marker's frame is
// flushed at once.
void encode(const Slot& s);
// Prefetches the table lines encode(s) will touch (alloc_infos_prefetch).
void prefetch_tables(const Slot& s);
// The End record: the stream's last.
void put_end_record(hslog::EndReason reason);

// Since encoder_start_log: events (alloc, free, mmap, munmap) and markers
// encoded.
uint64_t events_encoded();
uint32_t markers_encoded();
uint64_t log_start_realtime_ns();

// What the encoder writes through, defined by the writer (writer.cpp).
//
// Space for one record of at most `max_bytes` in the frame being filled,
// which is cut first if the record would not fit in a frame's nominal
// size (hslog::kFramePayload).
codec::Writer frame_reserve(size_t max_bytes);
// The record written into `w` is part of the frame.
void frame_commit(const codec::Writer& w);
// Ends the frame and writes everything committed so far.
void flush_frame();
// The marker with this index, requested with `token`, is in the frame
// (for writer_marker_index, writer_durable_marker and the steering rules).
void marker_written(uint32_t token, uint32_t index);
// Recording stops for good: `what` says why, after the log's path.
void fail_log(const char* what);

}  // namespace heapsnap::recorder
