// The log file's name and creation, for writer_open (writer.cpp).
//
// Name. HEAPSNAP_OUTPUT is a pattern: %p stands for the pid, %e for the
// executable's name (the last part of exe_path(); "unknown" if it has
// none), %% for a percent sign; anything else for itself. A relative name
// is made absolute against the working directory when the log is created,
// so the path the launcher and snapshot clients are given stays valid
// wherever the program moves afterwards.
//
// Creation. O_CREAT | O_EXCL | O_NOFOLLOW with mode 0600 (set again after
// the open, whatever the umask took away): the recorder
// never reuses, truncates or follows a file it did not just make, and
// only the user can read the log. If the name is taken (a re-exec of the
// same program with the same pid), -1, -2, ... up to -999 go before the
// name's extension. The descriptor is O_RDWR | O_APPEND | O_CLOEXEC, at
// whatever number open gave: the writer moves it out of the program's
// way (own_fds.h).
//
// Announcement. The path is appended as one line to HEAPSNAP_PATHS_FILE,
// where the launcher (`heapsnap run`) learns the logs of every process of
// a run, and printed with HEAPSNAP_VERBOSE.
//
// No allocation: paths are built in the caller's buffers (kMaxPathLen).
#pragma once

#include <cstddef>

namespace heapsnap::recorder {

// `pattern` expanded into `out`; false if it does not fit in `cap` bytes.
bool expand_pattern(const char* pattern, char* out, size_t cap);
// A relative `path` prefixed with the working directory; false if the
// result would not fit in `cap` bytes (or the directory is unknown).
bool make_absolute(char* path, size_t cap);
// Creates the log at `path`, or at the first free suffixed name, which
// `path` then holds. The descriptor, or -1 with errno set.
int create_log(char* path, size_t cap);
// Tells the launcher (the paths file) and, if verbose, stderr the log's path.
void announce_path(const char* path);

}  // namespace heapsnap::recorder
