// Replay throughput alone: events per second of one log's replay from the
// start to its end, as `heapsnap snapshot` runs it, without the process's
// start, the snapshot taken at the moment or its file. tools/bench prints
// it as the "replay hs/s" column; `heapsnap snapshot LOG` on a log of a
// hundred thousand events is mostly those fixed costs.
//
//   replay_perftest LOG [RUNS]
//
// Each read runs in a child process of its own, so that it gets its
// memory fresh from the kernel as `heapsnap snapshot` does (a second read
// in the same process reuses the first one's pages and is faster than
// any real replay). Prints "EVENTS SECONDS", the median of RUNS reads
// (default 5; the log is in the page cache after the first), and the
// rate in words on stderr.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "format/log_decoder.h"
#include "replay/replay.h"
#include "util/error.h"

namespace {

// The replay of a snapshot up to the log's end, with no moment to take.
class WholeLog final : public heapsnap::Replay {};

struct Result {
    double seconds = 0;
    uint64_t events = 0;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || argc > 3) {
        std::fprintf(stderr, "usage: replay_perftest LOG [RUNS]\n");
        return 2;
    }
    int runs = argc > 2 ? std::atoi(argv[2]) : 5;
    if (runs < 1) runs = 1;
    std::vector<double> seconds;
    uint64_t events = 0;
    for (int i = 0; i < runs; ++i) {
        int out[2];
        if (pipe(out) != 0) return 1;
        pid_t child = fork();
        if (child < 0) return 1;
        if (child == 0) {
            close(out[0]);
            Result result;
            try {
                WholeLog replay;
                auto start = std::chrono::steady_clock::now();
                heapsnap::ReadSummary summary = heapsnap::read_log_as(heapsnap::LogFile{argv[1]}, replay);
                result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                result.events = summary.events;
            } catch (const heapsnap::Error& e) {
                std::fprintf(stderr, "replay_perftest: %s\n", e.what());
                _exit(1);
            }
            _exit(write(out[1], &result, sizeof result) == sizeof result ? 0 : 1);
        }
        close(out[1]);
        Result result;
        bool got = read(out[0], &result, sizeof result) == sizeof result;
        close(out[0]);
        int status = 0;
        waitpid(child, &status, 0);
        if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
        seconds.push_back(result.seconds);
        events = result.events;
    }
    std::sort(seconds.begin(), seconds.end());
    double median = seconds[seconds.size() / 2];
    std::printf("%llu %.6f\n", static_cast<unsigned long long>(events), median);
    std::fprintf(stderr, "%llu events in %.4f s (median of %d): %.3g events/s\n",
                 static_cast<unsigned long long>(events), median, runs, static_cast<double>(events) / median);
    return 0;
}
