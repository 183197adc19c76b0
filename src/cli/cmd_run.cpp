// `heapsnap run`: start a program with the recorder preloaded.
//
// The launcher only sets up the environment (LD_PRELOAD and HEAPSNAP_*, the
// same variables a user can set by hand) and waits: recording happens in
// the program. Every recorded process, including exec'd and forked
// children, appends its log path to a private file the launcher made, so
// the launcher can name all logs when the program ends. The launcher exits
// with the program's status, or 128+signal if the program was killed.
// --no-follow (HEAPSNAP_FOLLOW=0) records the program's own process image
// alone, as heaptrack does and valgrind without --trace-children: the
// recorder takes itself out of the environment the program passes on, and
// a fork child stops recording (src/recorder/preload.cpp).
//
// While it waits, a thread of the launcher keeps the logs' checkpoints
// current (replay/keeper.h), so that `heapsnap snapshot PID` of a program
// that has run for days reads a fraction of a second of events, not days.
// It starts after kKeepProgramAfter for the program's own process and
// kKeepAfter for the processes it starts, so a short one is not slowed by
// it, then follows the logs every kKeepEvery at the program's own
// priority (at nice 10 it fell seconds behind a program that kept both
// CPUs busy), and stays away from logs it could not have written itself
// (another user's, after a privilege drop) and from HEAPSNAP_NO_CHECKPOINT.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/recorder_settings.h"
#include "cli/recording_settings.h"
#include "format/hslog.h"
#include "replay/checkpoint.h"
#include "replay/keeper.h"
#include "util/error.h"
#include "util/read_budget.h"

namespace heapsnap::cli {
namespace {

struct RunOptions {
    RecorderSettings recorder;
    double interval = 0;
    bool no_follow = false;
    SteeringSettings steering;
    std::vector<std::string> command;
};

// The file execvp would run for `name`, or "" if none.
std::string resolve_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    const char* path = std::getenv("PATH");
    std::string dirs = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
    for (size_t start = 0; start <= dirs.size();) {
        size_t end = dirs.find(':', start);
        if (end == std::string::npos) end = dirs.size();
        std::string dir = dirs.substr(start, end - start);
        std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
        if (access(candidate.c_str(), X_OK) == 0) return candidate;
        start = end + 1;
    }
    return "";
}

// The dynamic linker ignores LD_PRELOAD paths for a setuid/setgid program
// (secure-execution mode), so the recorder never loads and cannot say why.
bool is_set_id(const std::string& program) {
    struct stat st;
    std::string file = resolve_program(program);
    return !file.empty() && stat(file.c_str(), &st) == 0 && (st.st_mode & (S_ISUID | S_ISGID));
}

pid_t g_child = -1;

// The program's own process (its pid, through any exec) is kept after a
// second: it is the one a user snapshots first, often early, and a busy
// one's first snapshot would otherwise replay everything so far. The
// processes it starts, after five: a build's compilers, which run a few
// seconds each, are not slowed by a keeper.
constexpr auto kKeepProgramAfter = std::chrono::seconds(1);
constexpr auto kKeepAfter = std::chrono::seconds(5);
constexpr auto kKeepEvery = std::chrono::milliseconds(100);

// Whether the process that writes a log (its Process record's pid,
// log_writer_pid; 0 if the log cannot be read) still runs.
bool writer_running(uint64_t wide) {
    auto pid = static_cast<pid_t>(wide);
    return pid > 0 && static_cast<uint64_t>(pid) == wide && (kill(pid, 0) == 0 || errno == EPERM);
}

// The checkpoint keeper's thread: until stop(), every kKeepEvery,
// refreshes a keeper per log listed in `paths_file`. A log is kept once
// it has been listed for kKeepProgramAfter (the program's own process,
// `program`) or kKeepAfter (the others), or as soon as a snapshot has left a
// checkpoint of it (a program someone snapshots is likely snapshotted
// again), and only while its process runs: the many short processes of a
// build are never read, nor their logs once they have ended.
class Keepers {
public:
    Keepers(std::string paths_file, pid_t program) : paths_file_(std::move(paths_file)), program_(program) {
        if (!checkpoints_enabled()) return;
        thread_ = std::thread([this] { loop(); });
    }
    ~Keepers() { stop(); }

    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

private:
    void loop() {
        budget_lift();
        auto next = std::chrono::steady_clock::now() + kKeepEvery;
        std::unique_lock<std::mutex> lock(mutex_);
        while (!wake_.wait_until(lock, next, [this] { return stopping_; })) {
            lock.unlock();
            round();
            lock.lock();
            // Every kKeepEvery, or at once after a round that took longer.
            next = std::max(next + kKeepEvery, std::chrono::steady_clock::now());
        }
    }

    void round() {
        auto now = std::chrono::steady_clock::now();
        std::ifstream paths(paths_file_);
        for (std::string line; std::getline(paths, line);) {
            if (line.empty() || keepers_.count(line)) continue;
            auto listed = listed_.try_emplace(line, Listed{now, 0}).first;
            if (!listed->second.writer) listed->second.writer = log_writer_pid(line);  // 0 until readable
            auto wait = listed->second.writer == static_cast<uint64_t>(program_) ? kKeepProgramAfter : kKeepAfter;
            struct stat st;
            if (now - listed->second.since < wait && stat(checkpoint_path(line).c_str(), &st) != 0) continue;
            uint64_t writer = listed->second.writer;
            listed_.erase(listed);
            bool ours = stat(line.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
            keepers_.emplace(line, ours && writer_running(writer) ? std::make_unique<CheckpointKeeper>(line) : nullptr);
        }
        for (auto& [path, keeper] : keepers_) {
            if (!keeper) continue;
            // A log handed to another user (a privilege drop) is theirs
            // to checkpoint: a checkpoint of ours they would not trust.
            struct stat st;
            if (stat(path.c_str(), &st) != 0 || st.st_uid != geteuid()) {
                keeper.reset();
                continue;
            }
            try {
                if (!keeper->refresh()) keeper.reset();
            } catch (const Error&) {
                keeper.reset();  // unreadable or gone: snapshots read it on their own
            }
        }
    }

    struct Listed {
        std::chrono::steady_clock::time_point since;
        uint64_t writer;  // its Process record's pid; 0 until read
    };
    std::string paths_file_;
    pid_t program_;
    std::map<std::string, std::unique_ptr<CheckpointKeeper>> keepers_;  // null: not kept
    std::map<std::string, Listed> listed_;                              // not kept yet
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::thread thread_;
};

void forward_signal(int sig) {
    if (g_child > 0) kill(g_child, sig);
}

int run(const RunOptions& o) {
    std::string lib = find_preload_library();
    char dir_template[] = "/tmp/heapsnap-run.XXXXXX";
    if (!mkdtemp(dir_template))
        throw Error(std::string("cannot create a temporary directory: ") + std::strerror(errno));
    std::string dir = dir_template;
    chmod(dir.c_str(), 0700);  // mkdtemp's mode passes through the umask
    std::string paths_file = dir + "/logs";
    int fd = open(paths_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw Error(paths_file + ": " + std::strerror(errno));
    fchmod(fd, 0600);  // the recorders append to it, whatever the umask
    close(fd);

    std::string preload = lib;
    if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
    setenv("LD_PRELOAD", preload.c_str(), 1);
    for (const auto& [name, value] : recorder_variables(o.recorder)) {
        if (value.empty())
            unsetenv(name.c_str());
        else
            setenv(name.c_str(), value.c_str(), 1);
    }
    setenv("HEAPSNAP_PATHS_FILE", paths_file.c_str(), 1);
    if (o.interval > 0)
        setenv("HEAPSNAP_INTERVAL", std::to_string(o.interval).c_str(), 1);
    else
        unsetenv("HEAPSNAP_INTERVAL");
    if (o.no_follow)
        setenv("HEAPSNAP_FOLLOW", "0", 1);
    else
        unsetenv("HEAPSNAP_FOLLOW");
    for (const auto& [name, value] : steering_environment(o.steering)) {
        if (value.empty())
            unsetenv(name.c_str());
        else
            setenv(name.c_str(), value.c_str(), 1);
    }

    std::vector<char*> argv;
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    std::cout.flush();
    std::cerr.flush();
    g_child = fork();
    if (g_child < 0) throw Error(std::string("fork: ") + std::strerror(errno));
    if (g_child == 0) {
        execvp(argv[0], argv.data());
        int err = errno;
        std::string msg = "heapsnap: error: cannot run " + o.command[0] + ": " + std::strerror(err) + "\n";
        ssize_t ignored = write(STDERR_FILENO, msg.data(), msg.size());
        (void)ignored;
        _exit(err == ENOENT ? 127 : 126);
    }
    // Like a shell waiting for a foreground job: the terminal's SIGINT and
    // SIGQUIT reach the program directly; the launcher only reports.
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGTERM, forward_signal);
    signal(SIGHUP, forward_signal);
    int status = 0;
    {
        Keepers keepers(paths_file, g_child);
        while (waitpid(g_child, &status, 0) < 0 && errno == EINTR) {
        }
    }
    std::ifstream paths(paths_file);
    int logs = 0;
    // A fork child that recorded nothing before exec removed its log.
    for (std::string line; std::getline(paths, line);)
        if (!line.empty() && access(line.c_str(), F_OK) == 0) std::cerr << "heapsnap: log: " << line << "\n", ++logs;
    if (!logs && is_set_id(o.command[0]))
        warn(o.command[0] +
             " is setuid/setgid: such programs are not recorded (secure-execution mode); no log was written");
    else if (!logs)
        warn("no log was written (see the recorder's message above, if any)");
    unlink(paths_file.c_str());
    rmdir(dir.c_str());
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return kExitError;
}

}  // namespace

void setup_run(CLI::App& app, Action& action) {
    auto o = std::make_shared<RunOptions>();
    CLI::App* sub = app.add_subcommand("run", "Run PROGRAM with every allocation recorded into a log");
    add_recorder_options(sub, o->recorder);
    sub->add_option("--interval", o->interval, "Write a marker every SECONDS")->check(number_in(0.001, 86400, "s"));
    sub->add_flag("--no-follow", o->no_follow,
                  "Record PROGRAM's own process only: not the children it forks, nor the programs it or they "
                  "exec (as heaptrack)");
    add_steering_options(*sub, o->steering);
    sub->add_option("command", o->command, "PROGRAM [ARGS...], after --")->required();
    sub->footer(
        "Example:\n  heapsnap run -- ./server --port 8080\n  heapsnap run -o /tmp/app.%p.hslog --interval 5 -- ./app\n"
        "  heapsnap run --stacks-after 30s --snapshot-when 'rss>1G' -- ./server");
    sub->callback([o, &action] {
        check_steering(o->steering, o->recorder.sample_bytes);
        action = [o] { return run(*o); };
    });
}

namespace {

std::string self_dir() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return ".";
    buf[n] = 0;
    std::string path(buf);
    return path.substr(0, path.rfind('/'));
}

}  // namespace

std::string find_preload_library() {
    if (const char* env = std::getenv("HEAPSNAP_PRELOAD_LIB"); env && *env) {
        if (access(env, R_OK) == 0) return env;
        throw Error(std::string("HEAPSNAP_PRELOAD_LIB=") + env + ": " + std::strerror(errno));
    }
    std::string dir = self_dir();
    for (const char* rel :
         {"/libheapsnap_preload.so", "/../lib/heapsnap/libheapsnap_preload.so",
          "/../lib/x86_64-linux-gnu/heapsnap/libheapsnap_preload.so", "/../lib64/heapsnap/libheapsnap_preload.so"}) {
        std::string candidate = dir + rel;
        if (access(candidate.c_str(), R_OK) == 0) {
            char resolved[4096];
            return realpath(candidate.c_str(), resolved) ? std::string(resolved) : candidate;
        }
    }
    throw Error("cannot find libheapsnap_preload.so next to " + dir +
                " or in ../lib/heapsnap (set HEAPSNAP_PRELOAD_LIB)");
}

namespace {

std::string absolute(const std::string& path) {
    if (!path.empty() && path[0] == '/') return path;
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) throw Error(std::string("cannot get the current directory: ") + std::strerror(errno));
    return std::string(cwd) + "/" + path;
}

}  // namespace

void add_recorder_options(CLI::App* sub, RecorderSettings& s) {
    sub->add_option("-o,--output", s.output, "Log path pattern: %p = pid, %e = executable name, %% = %")
        ->default_val(s.output);
    sub->add_option("--unwind", s.unwind,
                    "Stack unwinding: dwarf (the binaries' .eh_frame unwind tables, always right), fp (frame "
                    "pointers: only for code built with -fno-omit-frame-pointer) or auto (= dwarf)")
        ->check(one_of({"auto", "dwarf", "fp"}))
        ->default_val(s.unwind);
    sub->add_option("--depth", s.depth, "Frames kept per stack")->check(count_in(1, 256))->default_val(s.depth);
    sub->add_option("--sample-bytes", s.sample_bytes,
                    "Record a random sample of allocations, one per N bytes on average (Poisson; blocks of N bytes "
                    "or more always); every output then shows scaled estimates, marked as sampled. Suffixes K, M, "
                    "G, T: 1024 each. Default: every allocation")
        ->transform(bytes_in(1, hslog::kMaxSampleBytes));
}

std::vector<std::pair<std::string, std::string>> recorder_variables(const RecorderSettings& s) {
    return {{"HEAPSNAP_OUTPUT", absolute(s.output)},
            {"HEAPSNAP_DEPTH", std::to_string(s.depth)},
            {"HEAPSNAP_UNWIND", s.unwind},
            {"HEAPSNAP_SAMPLE_BYTES", s.sample_bytes ? std::to_string(s.sample_bytes) : ""}};
}

}  // namespace heapsnap::cli
