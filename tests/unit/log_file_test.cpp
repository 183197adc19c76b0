// Logs read through a descriptor (format/log_reader.h, LogFile): the way
// `heapsnap snapshot PID` reads the log the recorder passed it.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "log_test_util.h"
#include "replay/marker_select.h"
#include "util/error.h"

using namespace heapsnap;
using test::LogBuilder;
using test::TempFile;

namespace {

std::string small_log() {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.alloc(2000000, 0x5000, 100, 1);
    b.marker(3000000, 1, "A", hslog::MarkerCause::Request);
    b.frame();
    b.alloc(4000000, 0x6000, 50, 1);
    b.marker(5000000, 2, "B", hslog::MarkerCause::Request);
    b.frame();
    return b.write();
}

bool exists(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("log file: a log read through its descriptor is never opened by path") {
    TempFile f{small_log()};
    int fd = open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    unlink(f.path.c_str());  // the path names nothing now
    Snapshot s = snapshot_at(LogFile{f.path, fd}, test::at_marker(2));
    CHECK(s.totals.live_bytes == 150);
    CHECK(s.source == f.path);
    // Messages still name the path.
    try {
        snapshot_at(LogFile{f.path, fd}, test::at_marker(3));
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()) == f.path + ": no marker \"3\"; markers: 1 \"A\" 2 \"B\"");
    }
    CHECK_FALSE(exists(f.path + ".checkpoint"));  // no file of that name to sit beside
    close(fd);
}

TEST_CASE("log file: a checkpoint only beside the very file the descriptor is") {
    unsetenv("HEAPSNAP_NO_CHECKPOINT");
    TempFile real{small_log()};
    TempFile other{small_log()};
    int fd = open(real.path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    // The path names another file (as a reply from a process could): the
    // log is read through the descriptor, and no checkpoint goes anywhere.
    CHECK(snapshot_at(LogFile{other.path, fd}, test::at_marker(1)).totals.live_bytes == 100);
    CHECK_FALSE(exists(other.path + ".checkpoint"));
    CHECK_FALSE(exists(real.path + ".checkpoint"));
    // The path names the file: its checkpoint is written, and a later
    // snapshot resumes from it to the same result.
    CHECK(snapshot_at(LogFile{real.path, fd}, test::at_marker(1)).totals.live_bytes == 100);
    CHECK(exists(real.path + ".checkpoint"));
    CHECK(snapshot_at(LogFile{real.path, fd}, test::at_marker(2)).totals.live_bytes == 150);
    close(fd);
}
