// Why a process's control socket does not answer: the one line `heapsnap
// snapshot PID` gives when it cannot connect.
//
// A process without the socket is either not recorded at all (the recorder
// is not mapped into it) or has the recorder loaded but not recording:
// it could not create its log (a directory the user it switched to cannot
// write), it was started with HEAPSNAP_FOLLOW=0 and is a fork child, or
// recording ended (exec into an unrecorded program, _exit under way). The
// recorder said which on the process's stderr and in the system log
// (recorder/lifecycle.h, alert); the client tells the two cases apart
// from /proc/PID/maps, which it can read for its own processes and, as
// root, for all.
#pragma once

#include <sys/types.h>

#include <string>

namespace heapsnap::cli {

std::string unreachable_reason(pid_t pid);

}  // namespace heapsnap::cli
