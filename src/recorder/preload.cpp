// Lifecycle of the recorder in the traced process: configuration from the
// environment, initialisation on first use, the writer thread, thread exit,
// fork and exec, the `exit` marker, and the public heapsnap_marker_v1().
//
// Fork: the child gets its own log (same pattern, the child's pid), created
// lazily on the child's first recorded event, so a child that only execs
// leaves no log behind. The child's log starts empty: blocks inherited from
// the parent are not in it, and their frees are counted by the reader as
// frees of untracked blocks (formats/hslog.md).
// Exec: the log is completed (End record, reason "exec") before the real
// exec; the new image starts its own log if the recorder is still preloaded.
// Exit: the log ends after every destructor and exit handler (on_exits_done).
// HEAPSNAP_FOLLOW=0 (heapsnap run --no-follow): the first image alone is
// recorded. The recorder takes itself out of the environment as it starts
// (leave_environment), so nothing the program execs loads it, and a fork
// child stops recording, without a log.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>

#include "recorder/allocator.h"
#include "recorder/attach.h"
#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/markers.h"
#include "recorder/metadata_queue.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"
#include "recorder/sampler.h"
#include "recorder/spinlock.h"
#include "recorder/stack_table.h"
#include "recorder/steering.h"
#include "recorder/thread_buffer.h"
#include "recorder/unwind.h"
#include "recorder/writer.h"

#define HEAPSNAP_EXPORT extern "C" __attribute__((visibility("default")))

namespace heapsnap::recorder {
namespace {

// Detached: `heapsnap detach` ended the log; the hooks forward to the real
// functions until `heapsnap attach` starts a new one (attach.h).
enum State : int { Uninitialized, Initializing, Active, Disabled, ShutDown, ForkPending, Detached };

std::atomic<int> g_state{Uninitialized};
Config g_config;
uint64_t g_start_ns = 0;
// The process the recorder state belongs to. A vfork child shares our
// memory but not our pid: it must not touch the parent's writer.
pid_t g_owner = 0;
// The thread ending the log (finish_log); 0: none.
std::atomic<pid_t> g_finishing{0};
// This log is a fork child's (start_child_log): one that records nothing
// before it execs is removed (writer_discard_if_empty).
bool g_fork_child = false;

// The environment as the process got it, read and edited in `environ`
// itself: getenv, setenv and unsetenv may be the program's own (bash
// defines them over its variable table, which does not exist yet this
// early, and its unsetenv then does nothing).
//
// Attached (attach.h), the recorder takes the same variables from the
// settings `heapsnap attach` passed instead (g_settings), and never
// edits the program's environment.
char** g_settings = nullptr;

char** env_slot(const char* name) {
    char** table = g_settings ? g_settings : environ;
    if (!table) return nullptr;
    size_t n = strlen(name);
    for (char** e = table; *e; ++e)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return e;
    return nullptr;
}

const char* env_value(const char* name) {
    char** slot = env_slot(name);
    return slot ? *slot + strlen(name) + 1 : nullptr;
}

// Removes every NAME=... entry, the later ones moving up in order, as
// unsetenv does (without freeing: the strings are not ours).
void remove_env(const char* name) {
    while (char** slot = env_slot(name))
        for (char** e = slot; *e; ++e) e[0] = e[1];
}

// A value that does not fit is refused (out left empty, false returned),
// never cut: a cut path names a file nobody asked for.
bool copy_env(const char* name, char* out, size_t cap, const char* fallback) {
    const char* v = env_value(name);
    if (!v || !*v) v = fallback;
    size_t n = strnlen(v, cap);
    out[0] = 0;
    if (n == cap) return false;
    memcpy(out, v, n + 1);
    return true;
}

// The relative HEAPSNAP_OUTPUT the process started with, and the entry
// that replaces it in an exec'd image's environment (absolute_output_entry).
char g_relative_output[kMaxPathLen];
char g_absolute_entry[kMaxPathLen + 32];

// A relative output pattern is taken from the directory the process
// started in, where the user asked for it: a daemon that changes directory
// (to / as daemon(3) does) before its fork child opens a log still writes
// there. The directory's '%' are doubled, so the pattern expands them as
// they are. False if the result does not fit.
bool absolute_pattern(char* pattern, size_t cap) {
    if (!pattern[0] || pattern[0] == '/') return true;
    char cwd[kMaxPathLen];
    if (!getcwd(cwd, sizeof cwd)) return true;  // left relative: the log goes where the process then is
    char out[kMaxPathLen];
    size_t n = 0;
    for (const char* c = cwd; *c; ++c) {
        if (n + 3 >= sizeof out) return false;
        if (*c == '%') out[n++] = '%';
        out[n++] = *c;
    }
    if (n > 1)
        out[n++] = '/';
    else
        n = 1;  // "/"
    size_t len = strlen(pattern);
    if (n + len + 1 > cap || n + len + 1 > sizeof out) return false;
    memcpy(out + n, pattern, len + 1);
    memcpy(pattern, out, n + len + 1);
    return true;
}

// Garbage in HEAPSNAP_* variables is reported and replaced by the default;
// it must never crash or stop the program.
void read_config() {
    // An empty output_pattern tells writer_open to refuse recording.
    copy_env("HEAPSNAP_OUTPUT", g_config.output_pattern, sizeof g_config.output_pattern, "heapsnap.%e.%p.hslog");
    g_relative_output[0] = 0;
    if (const char* v = env_value("HEAPSNAP_OUTPUT"); v && *v && *v != '/' && strlen(v) < sizeof g_relative_output)
        memcpy(g_relative_output, v, strlen(v) + 1);
    if (!absolute_pattern(g_config.output_pattern, sizeof g_config.output_pattern)) g_config.output_pattern[0] = 0;
    static const char kName[] = "HEAPSNAP_OUTPUT=";
    g_absolute_entry[0] = 0;
    size_t len = strlen(g_config.output_pattern);
    if (g_relative_output[0] && g_config.output_pattern[0] == '/' && sizeof kName + len <= sizeof g_absolute_entry) {
        memcpy(g_absolute_entry, kName, sizeof kName - 1);
        memcpy(g_absolute_entry + sizeof kName - 1, g_config.output_pattern, len + 1);
    }
    if (!copy_env("HEAPSNAP_PATHS_FILE", g_config.paths_file, sizeof g_config.paths_file, ""))
        diagnostic("ignoring HEAPSNAP_PATHS_FILE (longer than 4095 bytes)");
    g_config.depth = kDefaultDepth;
    if (const char* v = env_value("HEAPSNAP_DEPTH"); v && *v) {
        char* end = nullptr;
        errno = 0;
        unsigned long d = strtoul(v, &end, 10);
        if (errno || *end || d < 1 || d > kMaxDepth)
            diagnostic("ignoring HEAPSNAP_DEPTH=", v, " (expected 1 to 256)");
        else
            g_config.depth = static_cast<uint32_t>(d);
    }
    g_config.interval_s = 0;
    if (const char* v = env_value("HEAPSNAP_INTERVAL"); v && *v) {
        char* end = nullptr;
        errno = 0;
        double s = strtod(v, &end);
        if (errno || *end || !(s >= 0.001 && s <= 86400.0))
            diagnostic("ignoring HEAPSNAP_INTERVAL=", v, " (expected seconds from 0.001 to 86400)");
        else
            g_config.interval_s = s;
    }
    g_config.sample_bytes = 0;
    if (const char* v = env_value("HEAPSNAP_SAMPLE_BYTES"); v && *v) {
        char* end = nullptr;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 10);
        if (errno || *end || *v == '-' || n > hslog::kMaxSampleBytes)
            diagnostic("ignoring HEAPSNAP_SAMPLE_BYTES=", v,
                       " (expected 0 to 1073741824 bytes); recording every allocation");
        else
            g_config.sample_bytes = n;
    }
    // auto is dwarf: frame pointers cannot be trusted without checking
    // every frame, and a wrong stack is worse than a slow one.
    g_config.unwind = hslog::UnwindMode::Dwarf;
    if (const char* v = env_value("HEAPSNAP_UNWIND"); v && *v) {
        if (strcmp(v, "fp") == 0)
            g_config.unwind = hslog::UnwindMode::FramePointer;
        else if (strcmp(v, "dwarf") != 0 && strcmp(v, "auto") != 0)
            diagnostic("ignoring HEAPSNAP_UNWIND=", v, " (expected dwarf, fp or auto)");
    }
    g_config.follow = true;
    if (const char* v = env_value("HEAPSNAP_FOLLOW"); v && *v) {
        if (strcmp(v, "0") == 0)
            g_config.follow = false;
        else if (strcmp(v, "1") != 0)
            diagnostic("ignoring HEAPSNAP_FOLLOW=", v, " (expected 0 or 1)");
    }
    const char* verbose = env_value("HEAPSNAP_VERBOSE");
    g_config.verbose = verbose && *verbose && strcmp(verbose, "0") != 0;
    const char* verify = env_value("HEAPSNAP_VERIFY_STACKS");
    g_config.verify_stacks = verify && *verify && strcmp(verify, "0") != 0;
    steering_read_config(env_value("HEAPSNAP_PAUSED"), env_value("HEAPSNAP_STACKS_AFTER"),
                         env_value("HEAPSNAP_SNAPSHOT_WHEN"));
}

// This library as ld.so found it: its link map name, and that file's
// identity where it can be looked up.
struct OwnLibrary {
    const char* path;
    const char* base;  // its file name
    bool known;        // file holds its device and inode
    struct stat file;
};

// Whether the LD_PRELOAD entry `entry` names this library: the same file,
// or for a name without a slash, which ld.so looks up in its search path,
// the same file name.
bool names_this_library(const char* entry, const OwnLibrary& own) {
    if (!strchr(entry, '/')) return strcmp(entry, own.base) == 0;
    struct stat file;
    if (!own.known || stat(entry, &file) != 0) return strcmp(entry, own.path) == 0;
    return file.st_dev == own.file.st_dev && file.st_ino == own.file.st_ino;
}

// HEAPSNAP_FOLLOW=0: what the program passes on to the programs it execs
// no longer names the recorder: its LD_PRELOAD entry goes (the others
// stay, in their order, ':'-separated) and so do the variables the
// launcher set. In `environ` itself (env_slot), which allocates nothing:
// this runs from the process's first allocation. The program and what it
// runs see the environment they would see without the recorder.
void leave_environment() {
    static const char* const kLauncherVariables[] = {
        "HEAPSNAP_OUTPUT",       "HEAPSNAP_PATHS_FILE",   "HEAPSNAP_DEPTH",  "HEAPSNAP_UNWIND",
        "HEAPSNAP_SAMPLE_BYTES", "HEAPSNAP_INTERVAL",     "HEAPSNAP_FOLLOW", "HEAPSNAP_PAUSED",
        "HEAPSNAP_STACKS_AFTER", "HEAPSNAP_SNAPSHOT_WHEN"};
    for (const char* name : kLauncherVariables) remove_env(name);
    char* preload = const_cast<char*>(env_value("LD_PRELOAD"));
    dl_find_object found;
    if (!preload || _dl_find_object(reinterpret_cast<void*>(&leave_environment), &found) != 0) return;
    OwnLibrary own{found.dlfo_link_map->l_name, nullptr, false, {}};
    const char* slash = strrchr(own.path, '/');
    own.base = slash ? slash + 1 : own.path;
    own.known = stat(own.path, &own.file) == 0;
    char* out = preload;
    const char* in = preload;
    while (*(in += strspn(in, " :"))) {
        size_t n = strcspn(in, " :");
        char entry[kMaxPathLen];
        bool ours = false;
        if (n < sizeof entry) {
            memcpy(entry, in, n);
            entry[n] = 0;
            ours = names_this_library(entry, own);
        }
        if (!ours) {
            if (out != preload) *out++ = ':';
            memmove(out, in, n);
            out += n;
        }
        in += n;
    }
    *out = 0;
    if (out == preload) remove_env("LD_PRELOAD");
}

// Every thread's exit, once it has a state (thread_state.h). A handler
// that called pthread_exit inside a hook left that hook for good.
void on_thread_exit(void*) {
    ThreadState& t = thread_state();
    abandon_hook(UINT64_MAX);
    bool recorded = t.ring != nullptr;
    if (recorded) {
        // Detached, nothing is written: the next log (attach again) never
        // saw this thread start.
        if (g_state.load() != Detached) {
            Slot slot{};
            slot.kind = SlotKind::ThreadExit;
            emit(slot);
        }
        retire_current_thread();
    }
    release_stack_cache();
    retire_thread_state(t);
    if (recorded && live_thread_count() == 0) writer_pause();
}

// From here to the fork's parent or child handler, signals are blocked:
// the locks below are held across the fork.
void before_fork() {
    block_signals_until_unblocked();
    thread_state().internal++;
    // Lock order as in the writer: writer lock (inside writer_*), registry,
    // stack insertion, metadata. Taking them here means the child never
    // inherits a lock held by a thread that does not exist in it.
    registry_lock().lock();
    stack_insert_lock().lock();
    metadata_lock().lock();
    sampler_before_fork();
}

void after_fork_parent() {
    sampler_after_fork_parent();
    metadata_lock().unlock();
    stack_insert_lock().unlock();
    registry_lock().unlock();
    thread_state().internal--;
    unblock_signals();
    if (thread_state().in_daemon) before_underscore_exit();
}

void after_fork_child() {
    sampler_after_fork_child();
    allocator_forget_after_fork();
    metadata_lock().reset();
    stack_insert_lock().reset();
    reset_rings_after_fork();
    reset_stack_caches_after_fork();
    writer_forget_after_fork();
    g_finishing.store(0);
    thread_state().in_daemon = false;
    metadata_clear();
    int state = g_state.load();
    if (state == Active) g_state.store(g_config.follow ? ForkPending : Disabled);
    thread_state().internal--;
    unblock_signals();
}

// The child's first event: describe the modules and stacks again, open the
// child's own log and start its writer.
bool start_child_log() {
    g_fork_child = true;
    g_start_ns = now_ns();
    g_owner = getpid();
    {
        LockGuard guard(metadata_lock());
        requeue_all_modules();
        rescan_modules(true);
        requeue_all_stacks();
    }
    if (!writer_open()) return false;
    // Inside the allocator (a fork child's first event an mmap of
    // jemalloc's), a thread cannot be created: the fork hook, or the
    // first event outside it, starts the writer.
    if (!thread_state().in_allocator) writer_start_thread();
    return true;
}

// quick_exit runs the at_quick_exit handlers, the last registered first,
// then _exit inside glibc, past the _exit hook. This handler, registered
// as the recorder starts (before the program's), runs after them and ends
// the log as the _exit hook does.
void on_quick_exit() { before_underscore_exit(); }

// exit(3) in glibc runs the thread-local destructors, then the exit
// handlers (atexit, on_exit, __cxa_atexit), the last registered first,
// then stdio's cleanup (which frees nothing), then _exit. Among the
// handlers is _dl_fini, registered by __libc_start_main once every shared
// library's constructor has run: it runs the executable's and the
// libraries' destructors (this one's included) in its own order, and
// each library's __cxa_atexit handlers with them (__cxa_finalize). This
// handler is registered as the recorder starts, so before _dl_fini and
// before anything the program registers from then on, and with no DSO
// handle, so that no __cxa_finalize runs it early: it runs after all of
// them, and the exit marker counts every free the process makes on its
// way out. After _dl_fini nothing the log needs is gone: the recorder has
// no static destructors, libzstd none that matter, and the
// writer thread still runs.
bool g_exit_handler = false;

void finish_log();

void on_exits_done(void*) {
    if (g_state.load() == Active) finish_log();
}

extern "C" int __cxa_atexit(void (*fn)(void*), void* arg, void* dso);

// A first allocation from calloc may be glibc's own, made while it holds
// the lock of the exit-handler list to grow it: registering then would
// wait for itself. The library constructor registers instead.
void register_exit_handler() {
    if (g_exit_handler || starting_in_calloc()) return;
    g_exit_handler = __cxa_atexit(on_exits_done, nullptr, nullptr) == 0;
}

// What the recorder sets up once per process image, whether it starts
// with the process or is attached to it later.
bool g_set_up = false;

bool set_up_once() {
    if (g_set_up) return true;
    init_clock();
    set_spin_rounds();
    order_publication_init();
    init_exe_path();
    if (!watch_thread_exits(on_thread_exit)) return false;
    current_thread_index();  // the thread that starts the process (or loads the recorder) is thread 0
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    at_quick_exit(on_quick_exit);
    register_exit_handler();
    g_set_up = true;
    return true;
}

bool initialize() {
    read_config();
    if (!g_config.follow) leave_environment();
    if (getauxval(AT_SECURE)) {
        diagnostic("refusing to record a setuid/setgid program (secure-execution mode); recording disabled");
        return false;
    }
    g_start_ns = now_ns();
    g_owner = getpid();
    if (!set_up_once()) return false;
    if (g_config.verify_stacks) load_stack_reference();
    {
        LockGuard guard(metadata_lock());
        rescan_modules(true);
    }
    if (!writer_open()) return false;
    steering_start();
    return true;
}

// ---- attached (attach.h) ------------------------------------------------------

// Loaded by dlopen into a running process (heapsnap attach), not by the
// dynamic linker at start: the dynamic linker puts its own link map last
// in the chain of the objects it loads at start (preloads, the
// executable's dependencies), and dlopen appends after it. (_r_debug is
// the dynamic linker's; _dl_find_object is libc's.)
bool loaded_after_loader() {
    dl_find_object self, loader;
    if (_dl_find_object(reinterpret_cast<void*>(&loaded_after_loader), &self) != 0 ||
        _dl_find_object(static_cast<void*>(&_r_debug), &loader) != 0)
        return false;
    for (const link_map* m = self.dlfo_link_map ? self.dlfo_link_map->l_prev : nullptr; m; m = m->l_prev)
        if (m == loader.dlfo_link_map) return true;
    return false;
}

bool g_attached = false;

// A new log for an attached process: the settings `heapsnap attach`
// passed, the module and stack definitions again (as a fork child's log
// has them), and the writer.
bool open_attached_log() {
    read_config();
    g_start_ns = now_ns();
    g_owner = getpid();
    g_fork_child = false;
    g_finishing.store(0);
    if (!set_up_once()) return false;
    {
        LockGuard guard(metadata_lock());
        requeue_all_modules();
        rescan_modules(true);
        requeue_all_stacks();
    }
    if (!writer_open()) return false;
    steering_start();
    return true;
}

}  // namespace

const Config& config() { return g_config; }

bool attached() { return g_attached; }

AttachStart start_attached(char** settings) {
    if (!g_attached) return AttachStart::Preloaded;
    int state = g_state.load();
    if (state == Active) return AttachStart::Recording;
    if (state != Uninitialized && state != Detached) return AttachStart::Failed;
    // A writer that ended the last log at detach leaves right after.
    for (int i = 0; i < 100000 && writer_running(); ++i) sched_yield();
    if (writer_running() || !g_state.compare_exchange_strong(state, Initializing)) return AttachStart::Recording;
    SignalsBlocked blocked;
    ThreadState& t = thread_state();
    t.internal++;
    g_settings = settings;
    resolve_real_functions();
    bool ok = open_attached_log();
    g_settings = nullptr;
    t.internal--;
    g_state.store(ok ? Active : Detached, std::memory_order_release);
    if (!ok) return AttachStart::Failed;
    if (config().verify_stacks) load_stack_reference();
    writer_start_thread();
    steering_mark_start();
    return AttachStart::Started;
}

void abandon_attached() {
    writer_stop(hslog::EndReason::Shutdown);
    g_state.store(Detached, std::memory_order_release);
}

void stop_attached() {
    if (g_state.load() != Active) return;
    take_marker(hslog::MarkerCause::Exit, "detach");
    g_state.store(Detached, std::memory_order_release);
}

const char* absolute_output_entry() {
    return g_absolute_entry[0] && g_config.follow && g_state.load() != Uninitialized ? g_absolute_entry : nullptr;
}

void replace_output_entry(char** env, const char* entry) {
    static const char kName[] = "HEAPSNAP_OUTPUT=";
    for (; *env; ++env)
        if (strncmp(*env, kName, sizeof kName - 1) == 0 && strcmp(*env + sizeof kName - 1, g_relative_output) == 0)
            *env = const_cast<char*>(entry);
}

bool recorder_active() {
    int state = g_state.load(std::memory_order_acquire);
    if (state == Active) return true;
    if (state == Uninitialized || state == ForkPending) return ensure_initialized();
    return false;
}

bool ensure_initialized() {
    int state = g_state.load(std::memory_order_acquire);
    if (state == Active) return true;
    if (state != Uninitialized && state != ForkPending) return false;
    if (state == Uninitialized && g_attached) return false;  // until heapsnap_attach_v1
    if (!g_state.compare_exchange_strong(state, Initializing)) return g_state.load() == Active;
    // Blocked: a handler never finds `internal` raised here.
    SignalsBlocked blocked;
    ThreadState& t = thread_state();
    t.internal++;
    bool ok = state == Uninitialized ? initialize() : start_child_log();
    t.internal--;
    g_state.store(ok ? Active : Disabled, std::memory_order_release);
    // A child's log (its pause marker: steering.h) once it records; the
    // first process's, from the library constructor.
    if (ok && state == ForkPending && !t.in_allocator) steering_mark_start();
    return ok;
}

uint64_t start_time_ns() { return g_start_ns; }

void format_uint(uint64_t v, char* out) {
    char tmp[24];
    int i = 0;
    do tmp[i++] = static_cast<char>('0' + v % 10);
    while (v /= 10);
    int j = 0;
    while (i) out[j++] = tmp[--i];
    out[j] = 0;
}

void diagnostic(const char* a, const char* b, const char* c, const char* d, const char* e) {
    char line[3 * kMaxPathLen];
    size_t n = 0;
    for (const char* s : {"heapsnap: ", a, b, c, d, e})
        for (; *s && n + 2 < sizeof line; ++s) line[n++] = *s;
    line[n++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, n);
    (void)ignored;
}

namespace {
char g_last_alert[3 * kMaxPathLen];
}  // namespace

const char* last_alert() { return g_last_alert; }

void alert(const char* a, const char* b, const char* c, const char* d) {
    diagnostic(a, b, c, d);
    size_t kept = 0;
    for (const char* s : {a, b, c, d})
        for (; *s && kept + 1 < sizeof g_last_alert; ++s) g_last_alert[kept++] = *s;
    g_last_alert[kept] = 0;
    // Also to the system log (syslog's datagram socket, LOG_USER |
    // LOG_WARNING), where a daemon's message still reaches someone after
    // its stderr went to /dev/null. Nothing if there is none.
    char line[3 * kMaxPathLen];
    char pid[24];
    format_uint(static_cast<uint64_t>(getpid()), pid);
    size_t n = 0;
    for (const char* s : {"<12>heapsnap[", static_cast<const char*>(pid), "]: ", a, b, c, d})
        for (; *s && n + 1 < sizeof line; ++s) line[n++] = *s;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, "/dev/log", sizeof "/dev/log");
    ssize_t ignored = sendto(fd, line, n, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    (void)ignored;
    close_own(fd);
}

void before_exec() {
    if (g_state.load() != Active || getpid() != g_owner) return;
    if (!g_fork_child || !writer_discard_if_empty()) writer_stop(hslog::EndReason::Exec);
    g_state.store(ShutDown);
}

namespace {

// This process's log was ended for a process that goes on after all (an
// exec or a daemon(3) that failed): recording continues in a new log.
void continue_in_new_log() {
    if (g_state.load() == ShutDown && getpid() == g_owner) g_state.store(ForkPending);
}

}  // namespace

void after_failed_exec() { continue_in_new_log(); }

void before_daemon() { thread_state().in_daemon = true; }

void after_daemon(int result) {
    thread_state().in_daemon = false;
    if (result != 0)
        continue_in_new_log();
    else
        start_recording_child();
}

void start_recording_child() {
    if (!recorder_active() || thread_state().in_allocator || thread_state().internal) return;
    if (!writer_running()) writer_start_thread();
    steering_mark_start();
}

namespace {

// The end of the log of a process that leaves: the exit marker (every
// block still live), the End record, and what HEAPSNAP_VERBOSE and
// HEAPSNAP_VERIFY_STACKS report. Once: a thread that leaves while another
// is ending the log (exit in one, _exit in the other) waits for it to be
// ended, so the process does not end it halfway; the thread ending it,
// re-entered by a signal handler that leaves (_exit), does not wait for
// itself: the log is then left as it stands.
void finish_log() {
    pid_t self = gettid();
    pid_t ending = 0;
    if (!g_finishing.compare_exchange_strong(ending, self)) {
        if (ending != self)
            while (g_state.load() == Active) sched_yield();
        return;
    }
    writer_close_intervals();
    take_marker(hslog::MarkerCause::Exit, "exit");
    writer_stop(hslog::EndReason::Exit);
    g_state.store(ShutDown);
    if (config().verify_stacks) report_stack_verification();
    if (config().verbose && config().unwind != hslog::UnwindMode::FramePointer) report_stack_interning();
}

}  // namespace

void stop_recording() {
    int active = Active;
    g_state.compare_exchange_strong(active, Disabled);
}

void before_underscore_exit() {
    // Not in a vfork child, which shares this memory (and the parent's
    // log) until it execs or leaves; not from a signal handler that
    // interrupted the recorder on this thread (mid_recording): that log
    // keeps what was written and has no end, as a killed process's.
    if (g_state.load() != Active || getpid() != g_owner || mid_recording(thread_state())) return;
    finish_log();
}

}  // namespace heapsnap::recorder

using namespace heapsnap::recorder;

HEAPSNAP_EXPORT int heapsnap_marker_v1(const char* label) {
    if (!recorder_active()) return 0;
    HookFrame frame(__builtin_frame_address(0));
    return take_marker(heapsnap::hslog::MarkerCause::User, label ? label : "") != 0 ? 1 : 0;
}

// Loaded by `heapsnap attach`, the recorder waits for heapsnap_attach_v1
// (attach.cpp): nothing calls its hooks until it binds them.
__attribute__((constructor)) static void heapsnap_start() {
    if (g_state.load() == Uninitialized && loaded_after_loader()) {
        g_attached = true;
        return;
    }
    if (ensure_initialized()) {
        register_exit_handler();
        writer_start_thread();
        steering_mark_start();
    }
}

// Only if the exit handler could not be registered (on_exits_done): the
// log then ends from _dl_fini, before the destructors of the libraries it
// runs after this one's.
__attribute__((destructor)) static void heapsnap_finish() {
    if (!g_exit_handler && g_state.load() == Active) finish_log();
}
