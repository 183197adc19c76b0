// The recorder's own descriptors in the traced process (the log, the
// writer's wake-up eventfd, the control socket and its connections): the
// program must neither see them nor be able to touch them.
//
// Placement. A descriptor the recorder creates is moved at once to the
// numbers the program cannot reach: just above the soft RLIMIT_NOFILE,
// where open, dup and dup2 of the program never land (they fail with
// EMFILE or EBADF there, as they would bare), reached by raising the soft
// limit for the one fcntl(F_DUPFD) that moves it. Where the hard limit
// leaves no room (soft = hard, as after `ulimit -n 64` in a shell), they
// go to the top of the allowed range instead, the highest free numbers
// below the limit. Either way the program's first open returns what it
// returns bare. A program that lowers its limit leaves them above it; one
// that raises it past them (servers do) brings them into its range: its
// descriptors then skip their numbers, and dup2 onto one moves it (below).
//
// Protection. close, close_range and closefrom (the hooks) leave them
// open and report success; dup2 or dup3 onto one first moves the
// recorder's descriptor to another high number (own_fd_vacate), then
// does what the program asked. setrlimit and prlimit of RLIMIT_NOFILE
// wait while the recorder has the soft limit raised.
//
// What the hooks cannot see (the close_range or dup2 system call made
// directly) is noticed: the writer checks before each write that the log
// descriptor is still the log file, and a poll that finds the eventfd or
// the control socket gone ends recording with one message on stderr; the
// recorder then writes nowhere, and its thread leaves.
//
// Short-lived descriptors the recorder opens and closes within one call
// (/proc/self/smaps for a marker, /proc/self/cmdline) are not moved: in a
// single-threaded program they are closed before the program runs again.
#pragma once

#include <atomic>

#include "recorder/thread_state.h"

namespace heapsnap::recorder {

inline constexpr int kMaxOwnFds = 24;

// Moves `fd`, a descriptor the recorder has just created (or -1, passed
// through), out of the program's way (placement, above) and registers it.
// `holder`, if not null, is where the recorder keeps its number: a move
// stores the new number there. Returns the number it now has.
int own_fd_adopt(int fd, std::atomic<int>* holder);
// Closes a descriptor of the recorder's with the system call (close() is
// the hook, which keeps the recorder's descriptors open whoever asks),
// and unregisters it. One the program took over (own_fd_taken) is only
// forgotten.
void close_own(int fd);
bool is_own_fd(int fd);
// Fills `out` with the registered descriptors in ascending order; returns
// how many.
int own_fds(int out[kMaxOwnFds]);
// dup2 or dup3 is about to make `fd` the program's: the recorder's
// descriptor moves to another number (its holder is updated), or, if it
// has no holder (a control connection), is given up (own_fd_taken).
// Returns once no recorder code still uses the old number.
void own_fd_vacate(int fd);
// The number was given up to the program: the recorder must not use it.
bool own_fd_taken(int fd);

// A use of the recorder's descriptors: the numbers read from their
// holders inside one stay the recorder's until it ends (own_fd_vacate
// waits for it). Async-signal-safe.
class OwnFdUse {
public:
    OwnFdUse();
    ~OwnFdUse();
    OwnFdUse(const OwnFdUse&) = delete;
    OwnFdUse& operator=(const OwnFdUse&) = delete;

private:
    unsigned side_;
};

// The setrlimit and prlimit hooks call the real function through this:
// never while the recorder has the soft limit raised. Signals are blocked
// meanwhile, as for every lock of the recorder's (spinlock.h).
void fd_limit_lock();
void fd_limit_unlock();
template <class Fn>
int with_fd_limit_lock(Fn&& fn) {
    SignalsBlocked blocked;
    fd_limit_lock();
    int r = fn();
    fd_limit_unlock();
    return r;
}

// In a fork child: the parent's registrations and locks go (the writer
// and control close the descriptors themselves).
void own_fds_forget_after_fork();

}  // namespace heapsnap::recorder
