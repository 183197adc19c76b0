// The writer: the one place that turns events into the .hslog file.
//
// A background thread wakes when a ring is half full (eventfd) or every
// 50 ms, merges the rings in time order (see thread_buffer.h), prefixes the
// round with queued metadata, interns the stacks threads handed on
// (StackDef slots, unwind.h "Local keys") and names their events' stacks
// by the ids, encodes records into a frame buffer (record_encoder.h) and
// writes each 1 MiB of records as one zstd frame. A frame is also cut
// whenever 100 ms passed since the last write and something is pending, and
// right after a marker, so a SIGKILL loses at most the last 100 ms of events
// and a requested marker is on disk promptly.
//
// Before the thread exists (first allocations of the process) or after it
// stopped, a producer whose ring is full runs a round itself
// (writer_drain_inline); the two never run at once (writer lock).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "format/hslog.h"

namespace heapsnap::recorder {

// Creates the log file from the configured pattern (log_file.h: O_EXCL,
// O_NOFOLLOW, mode 0600, O_RDWR | O_APPEND) and writes the header and the
// process record. False (with a diagnostic) if the file cannot be created.
bool writer_open();
bool writer_start_thread();
bool writer_running();
// No interval marker after this returns (the exit marker comes next).
void writer_close_intervals();
void writer_wake();
void writer_drain_inline();
// Writes everything published so far (dlclose: the StackDefs published
// before a module goes must be resolved while it is still loaded).
void writer_take_published();
// Final rounds, End record, close. Safe to call more than once.
void writer_stop(hslog::EndReason reason);
// The last thread of the program that recorded anything is exiting: the
// writer thread must not be the one that keeps the process alive (glibc
// ends the process when its last thread exits, and a main thread that
// called pthread_exit would otherwise wait for the writer forever). Stops
// the writer thread and the control socket after writing everything
// published; the log stays open, events are then written when a ring
// fills and at exit, and a thread that records again starts the writer
// anew (emit).
void writer_pause();
// Exec of a fork child that recorded nothing (no event, no marker): its
// log is removed instead of ended, so a child that forks only to exec
// leaves no log behind. False (the log left open) if it recorded anything.
bool writer_discard_if_empty();
// `heapsnap detach` (control.cpp, on the writer thread): the writer leaves
// its loop, ends the attached recording (attach.h) and the log (End
// reason 2), answers the client on `fd` and exits. False if a detach is
// already under way.
bool writer_request_detach(int fd);
// In a fork child: forget the parent's file and thread (not running here).
void writer_forget_after_fork();

// Absolute path of the log being written.
const char* writer_log_path();
// The log's descriptor (O_RDWR | O_APPEND), or -1: control.cpp passes it
// to snapshot clients, who read the log through it.
int writer_log_fd();
struct LogStatus {
    uint64_t events;             // alloc/free/mmap/munmap events encoded so far
    uint64_t start_realtime_ns;  // CLOCK_REALTIME at the log's start (its Process record)
};
LogStatus writer_log_status();
// The uid-change hooks (hooks.cpp): just before a setuid-family call that
// makes `uid` the user of the process, while it still may, the log is
// given to that uid (fchown; the mode stays 0600), so the user the process
// now runs as can read it by path too. Returns the previous owner, or -1
// when nothing changed (same owner, no log, not permitted). If the call
// fails, writer_take_log_back(previous) undoes it. Async-signal-safe.
int64_t writer_give_log(uid_t uid);
void writer_take_log_back(int64_t owner);
// Highest marker index whose frame has been written to the file.
uint32_t writer_durable_marker();
// The index the writer gave the marker with this token, 0 if not yet.
uint32_t writer_marker_index(uint32_t token);

}  // namespace heapsnap::recorder
