#include "recorder/own_fds.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "recorder/spinlock.h"
#include "recorder/thread_state.h"

namespace heapsnap::recorder {
namespace {

// How far the soft limit is raised for a move above it: room for every
// registered descriptor.
constexpr rlim_t kAboveLimit = 64;

struct Entry {
    std::atomic<int> fd{-1};
    std::atomic<int>* holder = nullptr;
    std::atomic<bool> taken{false};
};

// Changed under g_lock; read without it (is_own_fd, own_fd_taken).
Entry g_entries[kMaxOwnFds];
SpinLock g_lock;
// Held across a vacate, the wait for users included.
SpinLock g_vacate_lock;
// Held while the soft limit is raised (place) and around the program's
// own changes of it (the setrlimit and prlimit hooks).
SpinLock g_limit_lock;
// The process the registrations belong to: a vfork child shares this
// memory but has a descriptor table of its own.
pid_t g_owner = 0;

// Uses of the descriptors (OwnFdUse) count on the side g_side names; a
// vacate moves g_side over and waits until the side it left has none.
std::atomic<unsigned> g_side{0};
std::atomic<int> g_users[2];

int nofile_limit(rlimit* lim) { return static_cast<int>(syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, nullptr, lim)); }
int set_nofile_limit(const rlimit* lim) {
    return static_cast<int>(syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, lim, nullptr));
}

// A copy of `fd` at the highest numbers (own_fds.h, "Placement"), -1 if
// there is none above `floor`.
int copy_high(int fd, int floor) {
    rlimit lim;
    if (nofile_limit(&lim) != 0 || lim.rlim_cur > INT32_MAX - kAboveLimit) return -1;
    int high = -1;
    if (lim.rlim_max > lim.rlim_cur) {
        LockGuard guard(g_limit_lock);
        rlimit raised{std::min(lim.rlim_max, lim.rlim_cur + kAboveLimit), lim.rlim_max};
        if (set_nofile_limit(&raised) == 0) {
            high = fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(lim.rlim_cur));
            set_nofile_limit(&lim);
        }
    }
    // Below the limit: fcntl gives the lowest free number at or above the
    // one asked for, so asking from the top down finds the highest free.
    for (long at = static_cast<long>(lim.rlim_cur) - 1; high < 0 && at > floor; --at) {
        high = fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(at));
        if (high < 0 && errno != EMFILE && errno != EINVAL) break;
    }
    return high;
}

void forget(int fd) {
    for (Entry& e : g_entries)
        if (e.fd.load(std::memory_order_relaxed) == fd) {
            e.fd.store(-1, std::memory_order_release);
            e.holder = nullptr;
            e.taken.store(false, std::memory_order_relaxed);
            return;
        }
}

}  // namespace

int own_fd_adopt(int fd, std::atomic<int>* holder) {
    if (fd < 0) return fd;
    int high = copy_high(fd, fd);
    if (high >= 0) {
        syscall(SYS_close, fd);
        fd = high;
    }
    LockGuard guard(g_lock);
    g_owner = getpid();
    for (Entry& e : g_entries)
        if (e.fd.load(std::memory_order_relaxed) < 0) {
            e.holder = holder;
            e.taken.store(false, std::memory_order_relaxed);
            e.fd.store(fd, std::memory_order_release);
            break;
        }
    if (holder) holder->store(fd, std::memory_order_release);
    return fd;
}

void close_own(int fd) {
    if (fd < 0) return;
    bool taken = false;
    {
        LockGuard guard(g_lock);
        for (Entry& e : g_entries)
            if (e.fd.load(std::memory_order_relaxed) == fd) taken = e.taken.load(std::memory_order_relaxed);
        forget(fd);
    }
    if (!taken) syscall(SYS_close, fd);
}

bool is_own_fd(int fd) {
    if (fd < 0) return false;
    for (const Entry& e : g_entries)
        if (e.fd.load(std::memory_order_acquire) == fd && !e.taken.load(std::memory_order_acquire)) return true;
    return false;
}

bool own_fd_taken(int fd) {
    for (const Entry& e : g_entries)
        if (e.fd.load(std::memory_order_acquire) == fd && e.taken.load(std::memory_order_acquire)) return true;
    return false;
}

int own_fds(int out[kMaxOwnFds]) {
    int n = 0;
    for (const Entry& e : g_entries) {
        int fd = e.fd.load(std::memory_order_acquire);
        if (fd >= 0 && !e.taken.load(std::memory_order_acquire)) out[n++] = fd;
    }
    std::sort(out, out + n);
    return n;
}

void own_fd_vacate(int fd) {
    if (getpid() != g_owner) return;  // a vfork child: its own table
    LockGuard vacating(g_vacate_lock);
    {
        LockGuard guard(g_lock);
        Entry* entry = nullptr;
        for (Entry& e : g_entries)
            if (e.fd.load(std::memory_order_relaxed) == fd && !e.taken.load(std::memory_order_relaxed)) entry = &e;
        if (!entry) return;
        int moved = entry->holder ? copy_high(fd, STDERR_FILENO) : -1;
        if (moved >= 0) {
            entry->fd.store(moved, std::memory_order_release);
            entry->holder->store(moved, std::memory_order_seq_cst);
        } else {
            if (entry->holder) entry->holder->store(-1, std::memory_order_seq_cst);
            entry->taken.store(true, std::memory_order_seq_cst);
        }
    }
    // Code that read the old number before the move may still use it: wait
    // until it is done. Not for a use this very thread is inside (a signal
    // handler that interrupted it): that one cannot end meanwhile.
    unsigned left = g_side.fetch_add(1, std::memory_order_seq_cst) & 1;
    if (thread_state().own_fd_uses == 0)
        while (g_users[left].load(std::memory_order_seq_cst) != 0) sched_yield();
    syscall(SYS_close, fd);
}

OwnFdUse::OwnFdUse() {
    thread_state().own_fd_uses++;
    side_ = g_side.load(std::memory_order_seq_cst) & 1;
    g_users[side_].fetch_add(1, std::memory_order_seq_cst);
}

OwnFdUse::~OwnFdUse() {
    g_users[side_].fetch_sub(1, std::memory_order_release);
    thread_state().own_fd_uses--;
}

void fd_limit_lock() { g_limit_lock.lock(); }
void fd_limit_unlock() { g_limit_lock.unlock(); }

void own_fds_forget_after_fork() {
    g_lock.reset();
    g_vacate_lock.reset();
    g_limit_lock.reset();
    g_users[0].store(0);
    g_users[1].store(0);
    thread_state().own_fd_uses = 0;
    for (Entry& e : g_entries)
        if (e.taken.load(std::memory_order_relaxed)) {
            e.fd.store(-1);
            e.holder = nullptr;
            e.taken.store(false);
        }
}

}  // namespace heapsnap::recorder
