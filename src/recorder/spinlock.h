// A test-and-set lock for the recorder's rare paths (registering a thread,
// interning a new stack, queuing metadata). It never allocates and never
// calls into pthread, so it is safe inside malloc and in a fork child.
// Contended waiters yield; these sections are short.
//
// Each lock has a cache line of its own: the writer takes some of them on
// every round, and a line they shared with what the hooks read on every
// event would move between the cores each time.
#pragma once

#include <sched.h>

#include <atomic>

namespace heapsnap::recorder {

class alignas(64) SpinLock {
public:
    void lock() {
        while (flag_.exchange(true, std::memory_order_acquire)) {
            while (flag_.load(std::memory_order_relaxed)) sched_yield();
        }
    }
    void unlock() { flag_.store(false, std::memory_order_release); }
    // After fork only the forking thread exists; a lock held by another
    // thread of the parent would never be released.
    void reset() { flag_.store(false, std::memory_order_relaxed); }

private:
    std::atomic<bool> flag_{false};
};

class LockGuard {
public:
    explicit LockGuard(SpinLock& lock) : lock_(lock) { lock_.lock(); }
    ~LockGuard() { lock_.unlock(); }
    LockGuard(const LockGuard&) = delete;
    LockGuard& operator=(const LockGuard&) = delete;

private:
    SpinLock& lock_;
};

}  // namespace heapsnap::recorder
