// /proc/<pid>/smaps and /proc/<pid>/status for the CLI (`heapsnap maps PID`).
//
// A thin wrapper: the parsing is smaps_capture's, the same code the recorder
// runs inside the traced process, so a live `maps PID` and a marker captured
// by the recorder can never disagree on how a line is read. This side may
// allocate and throws heapsnap::Error with the path and the system's reason
// ("cannot read /proc/123/smaps: Permission denied"); reading another
// user's process needs ptrace access to it, as for gdb.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/log_reader.h"

namespace heapsnap::addrspace {

// Every region of an smaps file, in file order (ascending addresses), hint
// None. An empty vector is possible (a zombie or a kernel thread).
std::vector<MapRegion> read_smaps_file(const std::string& path);

struct ProcessStatus {
    uint64_t rss_kb = 0;   // VmRSS
    uint32_t threads = 0;  // Threads
};

// VmRSS and Threads of a status file. Throws if the file cannot be read or
// lacks either field.
ProcessStatus read_status_file(const std::string& path);

}  // namespace heapsnap::addrspace
