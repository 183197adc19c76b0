// Steering a recording while the process runs: pausing and resuming the
// capture of stacks (heapsnap pause/resume PID, run --paused and
// --stacks-after) and the markers of --snapshot-when rules.
//
// Pause. Unwinding is almost all of what recording an allocation costs;
// the event itself is a ring slot. While paused, the hooks still record
// every allocation, free and mapping, exactly as at any other time, but
// name one reserved stack instead of walking the caller's: the paused site
// (hslog.h, kPausedSiteVaddr), interned once like any other stack, so the
// writer, the log and every reader treat its events as any others and the
// live set stays exact (a block allocated while paused and freed later is
// freed like every block). The state is one process-wide word the hooks
// read with a relaxed load: 0 while stacks are recorded, else the paused
// site's stack id. Only the writer thread changes it once the process
// runs (control requests, the --stacks-after timer); at start the
// configuration may set it.
//
// Ordering. A pause sets the word before its marker is taken, a resume
// clears it before its marker: every allocation between a pause marker
// and the next resume marker is at the paused site, and every allocation
// after a resume marker has its stack, but for a hook that read the word
// just before the switch and is stamped after the marker.
//
// Markers note each switch (cause pause or resume, label "pause" or
// "resume"), so LOG@resume names the moment stacks began. The log of a
// process that is paused when its writer starts (run --paused, a fork
// child of a paused process, a program exec'd under --paused) begins with
// a pause marker of its own.
//
// Rules (HEAPSNAP_SNAPSHOT_WHEN, normalized by the CLI: "rss>1G",
// "live>512M", "growth>100M", comma-separated): the writer thread checks
// them after every merge round, the live heap (its own count of live
// bytes, alloc_infos.h) each time and the RSS (/proc/self/statm) at most
// every 100 ms and after every marker. rss> and live> fire once per log;
// growth>S fires when the live heap first exceeds n × S, labelled "growth>S"
// for n = 1 and "growth>S#n" after, and once for several multiples crossed
// between two checks (the label says which).
#pragma once

#include <atomic>
#include <cstdint>

namespace heapsnap::recorder {

// 0 while stacks are recorded; else the paused site's stack id.
extern std::atomic<uint32_t> g_paused_site;

inline uint32_t paused_site() { return g_paused_site.load(std::memory_order_relaxed); }

// Reads HEAPSNAP_PAUSED ("1"), HEAPSNAP_STACKS_AFTER (seconds) and
// HEAPSNAP_SNAPSHOT_WHEN (rules) from their values (null: unset); bad
// values are reported and ignored.
void steering_read_config(const char* paused, const char* stacks_after, const char* rules);

// Once the recorder's first log is open (initialization): pauses when the
// configuration says so, and arms the --stacks-after timer.
void steering_start();

// A new log was opened: it has no pause marker yet, and its rules start
// again (its live count starts at 0).
void steering_log_opened();

// Recording of the current log has started: a paused process's log gets
// its pause marker now, once. Called on the program's thread that started
// it (the library constructor; in a fork child, the fork hook or its first
// event), so the marker precedes what the program does next.
void steering_mark_start();

// The writer thread's periodic work: the --stacks-after timer, then the
// rules. `live_bytes`: the writer's count of live heap bytes after its
// last round; `marker_seen`: a marker was written since the last call.
void steering_tick(uint64_t now_ns, uint64_t live_bytes, bool marker_seen);

// When steering_tick next has timed work (the --stacks-after deadline),
// in CLOCK_MONOTONIC ns; 0: none.
uint64_t steering_deadline();

// Whether steering_tick has anything to do: rules, or a timer pending.
bool steering_ticking();

// The control channel's pause and resume requests (formats/control.md).
enum class SteerVerb { None, Pause, Resume };
SteerVerb steer_verb(const char* line);

struct SteerOutcome {
    uint32_t token = 0;      // take_marker's token of the pause or resume marker; 0 when none was taken
    bool unchanged = false;  // already paused (pause) or not paused (resume): nothing done
    bool failed = false;     // the marker could not be taken, or no memory for the paused site
};
// On the writer thread.
SteerOutcome steer(SteerVerb verb);

}  // namespace heapsnap::recorder
