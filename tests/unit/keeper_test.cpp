// The checkpoint keeper (replay/keeper.h): it saves as the log grows, and
// never saves past a snapshot's marker before that snapshot's client has
// loaded the checkpoint.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <vector>

#include "format/framed_file.h"
#include "log_test_util.h"
#include "replay/checkpoint.h"
#include "replay/keeper.h"
#include "replay/marker_select.h"

using namespace heapsnap;
using test::LogBuilder;
using test::TempFile;

namespace {

// The log as the recorder grows it: the same file, longer.
void grow(const std::string& path, const LogBuilder& b) {
    int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, b.bytes().data(), b.bytes().size()) == static_cast<ssize_t>(b.bytes().size()));
    close(fd);
}

// Blocks of many sizes from many stacks, nine in ten freed at once; the
// first frame so holds more than the checkpoint's fingerprint of the
// log's first 4 KiB.
void churn(LogBuilder& b, uint64_t& t, uint64_t& address, int blocks) {
    for (int i = 0; i < blocks; ++i) {
        b.alloc(t += 1000, address += 0x40, 16 + (i * 37) % 1000, 1 + i % 50);
        if (i % 10) b.free_(t += 1000, address);
    }
}

// A process, 50 stacks, and 2000 blocks churned from them in one frame.
void churned_log(LogBuilder& b, uint64_t& t, uint64_t& address) {
    b.process();
    for (uint32_t id = 1; id <= 50; ++id) b.stack(id, {{0, 0x1000 + id * 0x10}, {0, 0x9000}});
    churn(b, t, address, 2000);
    b.frame();
}

// Where the checkpoint beside `log` is: the events its replay had taken in.
uint64_t checkpoint_events(const std::string& log) {
    std::optional<Checkpoint> c = load_checkpoint(LogFile{log});
    REQUIRE(c);
    return c->markers.empty() ? 0 : c->markers.back().events;
}

}  // namespace

TEST_CASE("keeper: holds past a requested marker until its client saved") {
    LogBuilder b;
    uint64_t t = 2000000, address = 0x100000;
    churned_log(b, t, address);
    TempFile f{b.write()};
    REQUIRE(b.bytes().size() > 4096);

    CheckpointKeeper keeper(f.path, 100);
    CHECK(keeper.refresh());
    CHECK(keeper.saves() == 1);
    std::optional<FileStamp> first = checkpoint_stamp(LogFile{f.path});
    REQUIRE(first);

    // A snapshot asks for marker 1; the log goes on past it before the
    // snapshot's client loads the checkpoint.
    b.marker(t += 1000, 1, "snapshot", hslog::MarkerCause::Request);
    b.frame();
    churn(b, t, address, 1000);
    b.frame();
    grow(f.path, b);
    CHECK(keeper.refresh());
    CHECK(keeper.holding());
    CHECK(keeper.saves() == 1);
    CHECK(checkpoint_stamp(LogFile{f.path}) == first);

    // The client resumes from the keeper's checkpoint, before its marker,
    // and saves its own there: the keeper goes on saving.
    Snapshot resumed = snapshot_at(f.path, test::at_marker(1));
    CHECK(checkpoint_events(f.path) == resumed.marker.events);
    CHECK(keeper.refresh());
    CHECK_FALSE(keeper.holding());
    CHECK(keeper.saves() == 2);
    CHECK(checkpoint_events(f.path) == resumed.marker.events);  // its markers: marker 1 only
    CHECK(load_checkpoint(LogFile{f.path})->position.offset == b.bytes().size());

    // The same live set as a replay from the start.
    setenv("HEAPSNAP_NO_CHECKPOINT", "1", 1);
    Snapshot whole = snapshot_at(f.path, test::at_marker(1));
    unsetenv("HEAPSNAP_NO_CHECKPOINT");
    CHECK(resumed.totals.live_bytes == whole.totals.live_bytes);
    CHECK(resumed.totals.live_blocks == whole.totals.live_blocks);
    REQUIRE(resumed.entries.size() == whole.entries.size());
    for (size_t i = 0; i < whole.entries.size(); ++i) {
        const SnapshotEntry &a = resumed.entries[i], &e = whole.entries[i];
        CHECK(std::tie(a.stack, a.kind, a.bytes, a.blocks, a.oldest_ns, a.newest_ns) ==
              std::tie(e.stack, e.kind, e.bytes, e.blocks, e.oldest_ns, e.newest_ns));
    }
}

TEST_CASE("keeper: no hold for a marker whose client saved before the keeper read it") {
    LogBuilder b;
    uint64_t t = 2000000, address = 0x100000;
    churned_log(b, t, address);
    TempFile f{b.write()};

    CheckpointKeeper keeper(f.path, 100);
    CHECK(keeper.refresh());
    CHECK(keeper.saves() == 1);

    b.marker(t += 1000, 1, "snapshot", hslog::MarkerCause::Request);
    b.frame();
    grow(f.path, b);
    snapshot_at(f.path, test::at_marker(1));  // the client, done before the keeper looks
    churn(b, t, address, 1000);
    b.frame();
    grow(f.path, b);
    CHECK(keeper.refresh());
    CHECK_FALSE(keeper.holding());
    CHECK(keeper.saves() == 2);
    CHECK(load_checkpoint(LogFile{f.path})->position.offset == b.bytes().size());
}

TEST_CASE("checkpoint: a state that does not decode is dropped, and the log read from its start") {
    LogBuilder b;
    uint64_t t = 2000000, address = 0x100000;
    churned_log(b, t, address);
    b.marker(t += 1000, 1, "first", hslog::MarkerCause::Request);
    b.frame();
    churn(b, t, address, 1000);
    b.marker(t += 1000, 2, "second", hslog::MarkerCause::Request);
    b.frame();
    TempFile f{b.write()};
    snapshot_at(f.path, test::at_marker(1));  // leaves a checkpoint at marker 1
    std::optional<Checkpoint> good = load_checkpoint(LogFile{f.path});
    REQUIRE(good);
    REQUIRE(good->state().size() > 16);

    // The same file with its state cut short: the file's own checks
    // (frame, fingerprint, position) pass, the state's decoding does not.
    const FileKind kind{"HSNAPCKP", 6, "checkpoint"};
    std::vector<uint8_t> body(good->body.begin(), good->body.begin() + good->state_offset + 8);
    std::vector<uint8_t> file = encode_framed(f.path, kind, body);
    const std::string checkpoint = checkpoint_path(f.path);
    int fd = open(checkpoint.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, file.data(), file.size()) == static_cast<ssize_t>(file.size()));
    close(fd);
    REQUIRE(load_checkpoint(LogFile{f.path}));

    // stderr into a file for the warning.
    TempFile said{b.write(std::vector<uint8_t>{})};
    fflush(stderr);
    int saved = dup(2);
    int into = open(said.path.c_str(), O_RDWR | O_TRUNC | O_CLOEXEC);
    REQUIRE(into >= 0);
    dup2(into, 2);
    Snapshot resumed = snapshot_at(f.path, test::at_marker(2));
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string warning(4096, '\0');
    ssize_t got = pread(into, warning.data(), warning.size(), 0);
    close(into);
    warning.resize(got > 0 ? static_cast<size_t>(got) : 0);
    CAPTURE(warning);
    CHECK(warning == "heapsnap: warning: " + f.path +
                         ": the checkpoint's state does not decode; the log is read from its start\n");

    setenv("HEAPSNAP_NO_CHECKPOINT", "1", 1);
    Snapshot whole = snapshot_at(f.path, test::at_marker(2));
    unsetenv("HEAPSNAP_NO_CHECKPOINT");
    CHECK(resumed.marker.events == whole.marker.events);
    CHECK(resumed.totals.live_bytes == whole.totals.live_bytes);
    CHECK(resumed.totals.live_blocks == whole.totals.live_blocks);
    CHECK(resumed.entries.size() == whole.entries.size());
    // The replay from the start saved a good checkpoint in its place.
    std::optional<Checkpoint> after = load_checkpoint(LogFile{f.path});
    REQUIRE(after);
    CHECK(after->state().size() > 16);
}
