#include "recorder/thread_state.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace heapsnap::recorder {
namespace {

std::atomic<bool> g_watching{false};
pthread_key_t g_exit_key;

// The kernel's signal set is 64 bits on x86-64.
uint64_t block_all() {
    uint64_t all = ~uint64_t{0}, old = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof all);
    return old;
}

void set_mask(uint64_t mask) { syscall(SYS_rt_sigprocmask, SIG_SETMASK, &mask, nullptr, sizeof mask); }

}  // namespace

// pthread_setspecific of a key below 32 writes the thread's descriptor
// only: no allocation, no lock.
void watch_thread_exit(ThreadState& t) {
    if (g_watching.load(std::memory_order_acquire)) pthread_setspecific(g_exit_key, &t);
}

ThreadState& thread_state_slow() {
    ThreadState& t = tcb_state();
    if (t.status == ThreadStatus::Live) return t;  // a signal handler made it so
    auto self = static_cast<int32_t>(gettid());
    if (t.status == ThreadStatus::Retired && t.tid == self) return t;
    // Fresh, or left by a thread gone. Blocked: a handler that came in
    // between would find the state half cleared.
    uint64_t old = block_all();
    if (t.status != ThreadStatus::Live) {
        std::memset(static_cast<void*>(&t), 0, sizeof t);
        t.tid = self;
        watch_thread_exit(t);
        t.status = ThreadStatus::Live;
    }
    set_mask(old);
    return t;
}

bool watch_thread_exits(void (*on_exit)(void*)) {
    if (pthread_key_create(&g_exit_key, on_exit) != 0) return false;
    g_watching.store(true, std::memory_order_release);
    watch_thread_exit(thread_state());
    return true;
}

void retire_thread_state(ThreadState& t) { t.status = ThreadStatus::Retired; }

SignalsBlocked::SignalsBlocked() {
    ThreadState& t = thread_state();
    if (t.signals_blocked == 0) {
        old_ = block_all();
        outer_ = true;
    }
    t.signals_blocked++;
}

SignalsBlocked::~SignalsBlocked() {
    ThreadState& t = thread_state();
    t.signals_blocked--;
    if (outer_) set_mask(old_);
}

void block_signals_until_unblocked() {
    ThreadState& t = thread_state();
    bool outer = t.signals_blocked == 0;
    uint64_t old = outer ? block_all() : 0;
    t.fork_blocked = outer;
    t.fork_mask = old;
    t.signals_blocked++;
}

void unblock_signals() {
    ThreadState& t = thread_state();
    t.signals_blocked--;
    if (t.fork_blocked) {
        t.fork_blocked = false;
        set_mask(t.fork_mask);
    }
}

void signals_blocked_for_good() { thread_state().signals_blocked = 1; }

}  // namespace heapsnap::recorder
