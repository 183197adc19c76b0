// A test-and-set lock for the recorder's rare paths (registering a thread,
// interning a new stack, queuing metadata). It never allocates and never
// calls into pthread, so it is safe inside malloc and in a fork child.
// Contended waiters spin a while, then yield; these sections are short.
// It is held with every signal blocked (LockGuard): a signal handler that
// re-enters the recorder on the holder's thread would wait for the holder
// for ever, and one that leaves by siglongjmp would leave it held.
//
// Why spin: the locks are held for short stretches, and a waiter that
// yields at once makes a syscall each time it meets one held, which costs
// a thread that meets them often (a compiler interning many stacks) more
// than the wait.
// With one CPU to run on, the holder cannot let go while a waiter spins:
// then there is no spinning (set_spin_rounds).
//
// Each lock has a cache line of its own: the writer takes some of them on
// every round, and a line they shared with what the hooks read on every
// event would move between the cores each time.
#pragma once

#include <sched.h>

#include <atomic>

#include "recorder/thread_state.h"

namespace heapsnap::recorder {

// Pause rounds a waiter spins before it yields (about 26 ns each here).
inline std::atomic<unsigned> g_spin_rounds{0};

// Once at start: spin only if the process may run on more than one CPU.
inline void set_spin_rounds() {
    cpu_set_t cpus;
    bool several = sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) > 1;
    g_spin_rounds.store(several ? 16384 : 0, std::memory_order_relaxed);
}

class alignas(64) SpinLock {
public:
    void lock() {
        unsigned spins = 0;
        while (flag_.exchange(true, std::memory_order_acquire)) {
            unsigned limit = g_spin_rounds.load(std::memory_order_relaxed);
            while (flag_.load(std::memory_order_relaxed)) {
                if (spins < limit) {
                    ++spins;
                    __builtin_ia32_pause();
                } else {
                    sched_yield();
                }
            }
        }
    }
    void unlock() { flag_.store(false, std::memory_order_release); }
    // After fork only the forking thread exists; a lock held by another
    // thread of the parent would never be released.
    void reset() { flag_.store(false, std::memory_order_relaxed); }

private:
    std::atomic<bool> flag_{false};
};

// Blocks signals, then takes the lock; releases it, then unblocks. The
// writer thread runs with signals blocked for good and makes no system
// call here.
class LockGuard {
public:
    explicit LockGuard(SpinLock& lock) : lock_(lock) { lock_.lock(); }
    ~LockGuard() { lock_.unlock(); }
    LockGuard(const LockGuard&) = delete;
    LockGuard& operator=(const LockGuard&) = delete;

private:
    SignalsBlocked blocked_;
    SpinLock& lock_;
};

}  // namespace heapsnap::recorder
