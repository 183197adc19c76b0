// Loading the recorder into a running process with ptrace, without gdb
// (`heapsnap attach`; docs/design/attach.md has the reasons).
//
// 1. Checks, each its own exit status (AttachRefused): the process exists,
//    is the caller's (root: any), is dynamically linked (ld.so mapped),
//    and is not recorded already (its control socket answers `info`).
// 2. A safe thread. One thread at a time is seized (PTRACE_SEIZE) and
//    stopped (PTRACE_INTERRUPT); the others run on. Threads blocked in a
//    system call the kernel restarts unseen (futex, read, poll, nanosleep,
//    wait4...) are tried first, then threads running user code, then the
//    rest (epoll_wait, which returns EINTR when interrupted: a program
//    must take that after any SIGSTOP anyway). A stopped thread's stack
//    is unwound with libunwind-ptrace (DWARF, the target's own .eh_frame;
//    its memory read a page at a time through /proc/PID/mem): it is safe
//    when no frame is in ld.so, in an allocator other than libc's (a
//    module defining malloc), or in the recorder, and each run of libc
//    frames was entered through a function that holds no lock of libc's
//    (kSafeLibcEntries: the blocking calls and thread entry).
//    Internal libc functions (not in .dynsym) are accepted inside such a
//    run only. An unsafe thread is let go at once, and the next tried;
//    rounds repeat for up to 5 s (a thread allocating in a loop is outside
//    malloc part of the time).
// 3. The calls. With the thread's registers, its extended (AVX) state and
//    its signal mask saved, every signal blocked, and a short scheduler
//    slice asked for it (cli/short_slice.h), the thread makes two calls
//    of libc's functions (libc's .dynsym, at libc's base in
//    /proc/PID/maps), each with return address 0, so its return faults
//    with SIGSEGV at address 0, which ends the call; orig_rax = -1 keeps
//    the kernel from restarting the interrupted system call on the call's
//    registers. mmap maps the loader's region, which heapsnap fills in
//    through /proc/PID/mem; a calloc tries the lock of the thread's malloc
//    arena, which pthread_create's allocation takes, and the try ends, the
//    thread let go, if the thread sleeps waiting for that lock
//    (Target::waits_for_arena) or was slow to get it (the next round tries
//    again); pthread_create starts the loader thread on the region
//    (cli/loader_stub.h). Then the saved state goes back (the kernel
//    restarts the system call as it would have) and the thread is let go:
//    the stop lasted from the moment waitpid reported it to PTRACE_DETACH,
//    the time printed. The loader thread calls dlopen(path, RTLD_NOW) and
//    heapsnap_attach_v1(settings, reply, size) (src/recorder/attach.cpp).
//    It starts with no lock held, so it may wait for any; what it waits
//    for (the CPU, a malloc arena's lock, the loader's lock) no longer
//    lengthens the stop. heapsnap reads the outcome from the region, then
//    the loader unmaps it. Where the process may not map executable
//    memory (SELinux without execmem) or start a thread, dlopen and
//    heapsnap_attach_v1 are called in the stopped thread itself instead,
//    the same way.
// The stops and calls run on a thread of heapsnap's own, started for
// them (on_new_thread in inject.cpp says why).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "util/error.h"

namespace heapsnap::cli {

// Exit statuses of attach and detach (man/heapsnap-attach.1).
inline constexpr int kExitNoProcess = 4;
inline constexpr int kExitOtherUser = 5;
inline constexpr int kExitStatic = 6;
inline constexpr int kExitPtraceForbidden = 7;
inline constexpr int kExitAlreadyRecorded = 8;
inline constexpr int kExitNotRecorded = 9;

// A refusal with its own exit status (main.cpp prints it as an error).
class AttachRefused : public Error {
public:
    AttachRefused(int status, const std::string& message) : Error(message), status(status) {}
    int status;
};

struct Injected {
    std::string log;             // the log the recorder writes
    double stopped_ms = 0;       // how long the chosen thread was stopped
    pid_t thread = 0;            // which
    unsigned threads_tried = 0;  // threads stopped and let go as unsafe before it
};

// The checks of step 1 that attach and detach share: the process exists
// and the caller may trace it. Throws AttachRefused.
void check_process(pid_t pid, const char* verb);

// Steps 1-3. `settings`: the HEAPSNAP_* variables (recorder_settings.h).
// Throws AttachRefused or Error.
Injected inject_recorder(pid_t pid, const std::string& library,
                         const std::vector<std::pair<std::string, std::string>>& settings);

}  // namespace heapsnap::cli
