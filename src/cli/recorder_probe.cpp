#include "cli/recorder_probe.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

namespace heapsnap::cli {

std::string unreachable_reason(pid_t pid) {
    std::string id = std::to_string(pid);
    std::ifstream maps("/proc/" + id + "/maps");
    if (!maps)
        return "process " + id +
               " has no heapsnap control socket, and its memory map cannot be read to tell whether the recorder is "
               "loaded (run as root to find out)";
    for (std::string line; std::getline(maps, line);)
        if (line.find("/libheapsnap_preload.so") != std::string::npos)
            return "process " + id +
                   " has the heapsnap recorder loaded but is not recording (it could not create its log, or its "
                   "recording ended): its stderr and the system log say why (journalctl -t heapsnap)";
    return "process " + id + " is not recorded by heapsnap (no control socket; start it with 'heapsnap run')";
}

}  // namespace heapsnap::cli
