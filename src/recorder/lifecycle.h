// Start-up, configuration and shutdown of the recorder inside the traced
// process: the state every hook checks before recording.
//
// The recorder initialises on the first allocation of the process (which
// may come before any constructor, even from dlsym while the real malloc is
// being looked up); the writer thread starts from the library constructor,
// once threads can be created. The `exit` marker is taken by an exit
// handler that runs after every destructor and exit handler of the
// process (preload.cpp, on_exits_done), so the last frees are counted.
#pragma once

#include <cstdint>

#include "format/hslog.h"

namespace heapsnap::recorder {

inline constexpr uint32_t kDefaultDepth = 64;
inline constexpr uint32_t kMaxDepth = 256;
inline constexpr uint32_t kMaxPathLen = 4096;

struct Config {
    char output_pattern[kMaxPathLen];  // HEAPSNAP_OUTPUT
    char paths_file[kMaxPathLen];      // HEAPSNAP_PATHS_FILE: append our log path here (launcher)
    double interval_s;                 // HEAPSNAP_INTERVAL, 0 = off
    uint32_t depth;                    // HEAPSNAP_DEPTH
    hslog::UnwindMode unwind;          // HEAPSNAP_UNWIND
    bool verbose;                      // HEAPSNAP_VERBOSE
    uint64_t sample_bytes;             // HEAPSNAP_SAMPLE_BYTES, 0 = record every allocation
    bool verify_stacks;                // HEAPSNAP_VERIFY_STACKS (hooks.cpp, verify_stack)
    bool follow;                       // HEAPSNAP_FOLLOW (1): record fork children and exec'd programs
};

const Config& config();

// True while events are being recorded.
bool recorder_active();
// Initialises on first use; false if the recorder is disabled or is being
// initialised by this very call chain.
bool ensure_initialized();
// CLOCK_MONOTONIC at recorder start: event times count from here.
uint64_t start_time_ns();

// HEAPSNAP_VERIFY_STACKS: loads libunwind, the reference every stack is
// checked against, as the recorder starts (its first hook, or heapsnap
// attach's call); stacks captured before are not checked. One line on
// stderr if it cannot.
void load_stack_reference();
// Counts a stack checked against libunwind's (by
// the hook, or by the writer where the stack had a local key).
void note_stack_verified(bool same);
// Prints how many of the stacks this process captured were checked
// against libunwind's, and how many differed.
void report_stack_verification();

// Where the stacks of this process were interned: note_writer_interned
// counts those the writer took from StackDefs (unwind.h, "Local keys") and
// deferred one-frame stacks; the hooks count those interned in a
// program's thread by the unwinder. HEAPSNAP_VERBOSE prints both at exit
// (report_stack_interning; not with --unwind fp, which interns every stack
// in its thread): a thread that owns its stack cache hands
// every stack on after its first event, so a count in the threads much
// above the number of threads says a cache was lost (as in the pool's
// run-time initializer, unwind_cache.cpp, PoolSlot).
void note_writer_interned();
void report_stack_interning();

// Prints one diagnostic line on stderr, prefixed "heapsnap: ": the parts
// one after the other.
void diagnostic(const char* a, const char* b = "", const char* c = "", const char* d = "", const char* e = "");

// A diagnostic that says recording could not start or goes on no more:
// on stderr and in the system log (/dev/log), since a daemon's stderr is
// often /dev/null.
void alert(const char* a, const char* b = "", const char* c = "", const char* d = "");

// Writes v in decimal, 0-terminated, without stdio: out holds 21 bytes.
void format_uint(uint64_t v, char* out);

// "HEAPSNAP_OUTPUT=<the pattern made absolute>" when the variable the
// recorder started with was relative (and recording follows exec), else
// null: the entry an exec'd image gets instead (hooks.cpp).
const char* absolute_output_entry();
// In the null-terminated `env`, the entry that is still the relative
// HEAPSNAP_OUTPUT the recorder started with becomes `entry`.
void replace_output_entry(char** env, const char* entry);

// ---- attached (src/recorder/attach.h) ----
// The recorder was loaded into a running process by `heapsnap attach`
// (dlopen), not preloaded: its constructor left it idle.
bool attached();
enum class AttachStart {
    Started,    // recording into a new log
    Recording,  // it already is
    Preloaded,  // the recorder was preloaded: it records from the start or not at all
    Failed,     // the log could not be created (alert said why), or recording ended for good
};
// Starts recording with `settings` (NAME=value strings, null-terminated:
// the HEAPSNAP_* variables heapsnap run would set) read in place of the
// environment: the first time, or again after stop_attached.
AttachStart start_attached(char** settings);
// Recording that start_attached began ends at once (its hooks could not
// be bound): the log ends as at detach, without the marker.
void abandon_attached();
// The text of the last alert (the reason a log could not be created).
const char* last_alert();
// `heapsnap detach`, on the writer thread, once the hooks are unbound:
// the exit-like marker `detach`, then the hooks record nothing more.
void stop_attached();

// Recording stops for good (the log cannot be written: writer.cpp, fail_log):
// the hooks record nothing more, and no exit marker is taken.
void stop_recording();

// Whether this thread is inside the calloc hook, before the real call
// (hooks.cpp): where the recorder may be starting inside glibc's own
// calloc for its exit-handler list (preload.cpp, register_exit_handler).
bool starting_in_calloc();

// Undoes what the calling thread's malloc-family hook left raised when a
// signal handler left it for a frame at or above `target_sp` (siglongjmp,
// longjmp; UINT64_MAX: the thread exits): see thread_state.h (hooks.cpp).
void abandon_hook(uint64_t target_sp);

// fork/exec hooks.
void before_exec();
void after_failed_exec();
// _exit, _Exit (their hooks) and quick_exit (an at_quick_exit handler):
// the process leaves without running its destructors, so the log ends
// here as it does at exit (the exit marker, the End record) where the
// recorder can run (preload.cpp).
void before_underscore_exit();
// daemon(3) (its hook): the parent of its fork leaves by _exit inside
// glibc, past the _exit hook, so the fork's parent handler ends the log
// as before_underscore_exit does. If daemon fails in the process whose
// log that was (its fork did), recording goes on in a new log, as after a
// failed exec.
void before_daemon();
void after_daemon(int result);
// In a fork child, once fork (or daemon) has returned: the child's log,
// control socket and writer thread, now rather than at its first event,
// so a child that only waits can be snapshotted.
void start_recording_child();

}  // namespace heapsnap::recorder
