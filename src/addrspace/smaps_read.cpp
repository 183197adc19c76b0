#include "addrspace/smaps_read.h"

#include <cerrno>
#include <cstring>
#include <exception>

#include "addrspace/smaps_capture.h"
#include "util/error.h"

namespace heapsnap::addrspace {

namespace {

// Large enough that no path is ever truncated and reads come in big chunks.
constexpr size_t kScratchSize = 64 * 1024;

struct Collector {
    std::vector<MapRegion> regions;
    std::exception_ptr failure;  // an exception must not cross the no-exceptions parser
};

void collect(const RawRegion& raw, void* ctx) {
    auto* c = static_cast<Collector*>(ctx);
    if (c->failure) return;
    try {
        MapRegion r;
        r.start = raw.start;
        r.end = raw.end;
        r.perms = raw.perms;
        r.offset = raw.offset;
        r.inode = raw.inode;
        r.path.assign(raw.path, raw.path_len);
        r.rss_kb = raw.rss_kb;
        r.pss_kb = raw.pss_kb;
        r.private_dirty_kb = raw.private_dirty_kb;
        r.swap_kb = raw.swap_kb;
        c->regions.push_back(std::move(r));
    } catch (...) {
        c->failure = std::current_exception();
    }
}

[[noreturn]] void fail(const std::string& path, int err) {
    throw Error("cannot read " + path + ": " + std::strerror(err));
}

}  // namespace

std::vector<MapRegion> read_smaps_file(const std::string& path) {
    std::vector<char> scratch(kScratchSize);
    Collector c;
    errno = 0;
    long n = capture_smaps(path.c_str(), scratch.data(), scratch.size(), collect, &c);
    if (n < 0) fail(path, errno);
    if (c.failure) std::rethrow_exception(c.failure);
    return std::move(c.regions);
}

ProcessStatus read_status_file(const std::string& path) {
    std::vector<char> scratch(4096);
    ProcessStatus st;
    errno = 0;
    if (!read_status(path.c_str(), scratch.data(), scratch.size(), &st.rss_kb, &st.threads)) {
        if (errno != 0) fail(path, errno);
        throw Error("cannot read " + path + ": no VmRSS or Threads field");
    }
    return st;
}

}  // namespace heapsnap::addrspace
