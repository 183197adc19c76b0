// The one parser of /proc/<pid>/smaps and /proc/<pid>/status.
//
// It runs in two places: inside the traced process, where the recorder
// calls it from a marker (possibly inside a malloc hook), and in the CLI,
// where smaps_read.h wraps it for `heapsnap maps PID`. The recorder side
// decides its shape:
// - No allocation of any kind: no malloc/new, no stdio, no std::string, no
//   exceptions (compiled with -fno-exceptions -fno-rtti). The file is read
//   with open/read/close into a caller-provided scratch buffer; that buffer
//   is the only memory used besides a few dozen bytes of stack.
// - smaps is large (a few hundred bytes per region, tens of thousands of
//   regions in big processes) and the scratch is small, so the parser is a
//   character-at-a-time state machine fed by whatever read() returns. A
//   line split across two reads, or across any number of reads, parses the
//   same as a whole one; no line ever has to fit in the buffer.
// - A region's fields are complete only after its last key line ("Rss:",
//   "Swap:"...), so a region is delivered to the callback when the next
//   header line begins, or at end of file.
//
// Scratch layout: the first part holds the path of the region being parsed
// (it must survive until that region is delivered), the rest is the read
// buffer. smaps_path_capacity() says how many path bytes are kept; a longer
// path is truncated to that length, nothing else is affected. 64 bytes of
// scratch work (48 path bytes, reads of 16 bytes); 16 KiB or more keeps
// every path up to PATH_MAX and reads in large chunks.
//
// The path is kept exactly as the kernel prints it, " (deleted)" suffix
// included: all mappings of one deleted file still share one path, which is
// what the summary's image rule groups by.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/hslog.h"

namespace heapsnap::addrspace {

struct RawRegion {
    uint64_t start = 0;
    uint64_t end = 0;
    uint64_t offset = 0;
    uint64_t inode = 0;
    uint8_t perms = 0;           // hslog::RegionPerm bits: r w x, and kShared for 's'
    const char* path = nullptr;  // not NUL-terminated; valid only during the callback
    uint32_t path_len = 0;       // 0 for anonymous memory
    uint64_t rss_kb = 0;
    uint64_t pss_kb = 0;
    uint64_t private_dirty_kb = 0;
    uint64_t swap_kb = 0;
};

using RegionCallback = void (*)(const RawRegion&, void* ctx);

// Path bytes capture_smaps keeps per region with a scratch of this size.
size_t smaps_path_capacity(size_t scratch_size);

// Reads /proc/self/smaps (or `path`, for tests and for other processes) with
// `scratch` as its only memory and calls `cb` once per region, in file order.
// Returns the number of regions delivered, or -1 (errno set) if the file
// cannot be opened, a read fails, or scratch_size < 2. After a failed read
// the regions before the failure have already been delivered.
long capture_smaps(const char* path, char* scratch, size_t scratch_size, RegionCallback cb, void* ctx);

// VmRSS (kB) and Threads from /proc/self/status (or `path`), same rules.
// Returns false if the file cannot be read or lacks either field; the
// outputs are then 0 for a missing field.
bool read_status(const char* path, char* scratch, size_t scratch_size, uint64_t* rss_kb, uint32_t* threads);

}  // namespace heapsnap::addrspace
