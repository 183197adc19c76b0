// What each thread keeps for the recorder, where it keeps it, and how the
// recorder stays safe when a signal handler re-enters it on that thread.
//
// Where. The recorder defines no thread-local variable: a TLS module of its
// own would make glibc size every new thread's DTV and static TLS block
// for it, and a program's threads would allocate more recorded than bare
// (_dl_allocate_tls's calloc). Instead, the state lives in the thread's TCB:
// glibc's x86-64 tcbhead_t, at the thread pointer, keeps 512 bytes it has
// not used since 2.26 (__glibc_unused2, at offset 0x80, kept so that the
// structure's size does not change). An access is one %fs-relative load,
// as an initial-exec TLS variable's, without the offset's load from the GOT.
//
// Lifetime. A TCB glibc maps with a thread's stack, the main thread's, and
// one in a stack the program gives are zero: the state is Fresh, and the
// first access makes it Live. glibc keeps the stacks of exited threads and
// starts new threads on them without clearing the TCB, so a thread's exit
// (the recorder's pthread key destructor, registered at the first access)
// marks the state Retired with the thread's id. A Retired state whose id
// is not the caller's belongs to a thread that is gone: the caller takes it
// over, cleared. Its own thread, still exiting, goes on using it (frees
// run by later destructors), at the price of a gettid per access.
//
// Signals. A signal handler may call any hooked function on a thread that
// is inside a hook, and may leave by siglongjmp. So:
//   - no lock is ever held where a signal can arrive: every SpinLock is
//     taken with all signals blocked (LockGuard), and so are the few longer
//     sections that raise `internal` (the thread's first event, start-up,
//     fork) and the mmap family's hooks, whose critical sections are short
//     next to the system call they wrap. A handler never finds `internal`
//     raised but by a stack capture (`capturing`), or on the writer thread;
//   - what a hook raises on the hot path (in_allocator, the capture, a ring
//     append, a borrowed stack cache) is undone when a handler leaves the
//     hook by siglongjmp or longjmp (hooks.cpp interposes them): the
//     outermost recording hook keeps its frame (hook_sp), and a jump to a
//     frame above it abandons the hook (abandon_hook, hooks.cpp). An
//     allocation the abandoned hook had made, or was making, goes unrecorded
//     and is counted (note_unrecorded); so are a handler's events the hook
//     held unpublished in its ring.
#pragma once

#include <pthread.h>

#include <cstdint>

namespace heapsnap::recorder {

struct ThreadRing;

enum class ThreadStatus : uint8_t { Fresh = 0, Live = 1, Retired = 2 };

// The unwinder's per-thread part (unwind.cpp).
struct UnwindThread {
    uint64_t stack_lo, stack_hi;  // ThreadStack: the thread's stack, if known
    uint32_t slot;                // 1 + the pool slot this thread tries first; 0: none yet
    uint32_t owned;               // 1 + the pool slot this thread owns; 0: none
    uint32_t borrowed;            // 1 + the pool slot it borrowed for the walk in progress; 0: none
    bool released;                // past release_stack_cache: owns nothing any more
};

// The sampler's per-thread part (sampler.cpp).
struct SampleThread {
    int64_t countdown;
    uint64_t rng;
    bool seeded;
};

struct ThreadState {
    // Read by every hook: first.
    ThreadStatus status;
    // Inside stack capture. Only a signal handler can allocate then (the
    // capture itself never calls malloc): such events are recorded, with
    // a deferred stack.
    bool capturing;
    bool has_index;
    uint32_t internal;  // >0: inside the recorder; hooks pass through unrecorded
    // >0: inside the real allocator, called from a malloc-family hook. The
    // allocator may hold its own locks (jemalloc's init lock, an arena's
    // mutex): nothing the recorder does then may start a thread, or call
    // anything that allocates, or it waits on that lock for ever. An
    // anonymous mmap the allocator makes then is its own memory (Heap).
    uint32_t in_allocator;
    uint32_t thread_index;
    ThreadRing* ring;
    // The frame of the outermost malloc-family hook running on this thread
    // (0: none), and in bit 0 whether it owes an event: it has made an
    // allocation (or a release it recorded is under way) and has not
    // recorded it yet (HookFrame).
    uint64_t hook_sp;
    uint64_t exec_sp;          // the frame of an exec hook that ended the log, 0 if none
    bool in_daemon;            // inside daemon(3) (preload.cpp)
    bool in_calloc;            // in the calloc hook, until the real call (lifecycle.h, starting_in_calloc)
    int32_t own_fd_uses;       // OwnFdUse nesting (own_fds.cpp)
    bool fork_blocked;         // fork's handlers blocked the signals (fork_mask: the mask before)
    uint32_t signals_blocked;  // SignalsBlocked nesting; 1 for good on the writer thread
    uint64_t fork_mask;
    int32_t tid;  // the thread whose state this is (Live, Retired)
    UnwindThread unwind;
    SampleThread sample;
};

// The offset of glibc's unused area in the TCB, and its size.
inline constexpr uintptr_t kTcbStateOffset = 0x80;
static_assert(sizeof(ThreadState) <= 512, "the TCB's unused area holds 512 bytes");

inline ThreadState& tcb_state() {
    return *reinterpret_cast<ThreadState*>(static_cast<char*>(__builtin_thread_pointer()) + kTcbStateOffset);
}

// Makes the caller's state Live (a Fresh state, or a Retired one of a
// thread gone), or finds it its own Retired one.
ThreadState& thread_state_slow();

inline ThreadState& thread_state() {
    ThreadState& t = tcb_state();
    if (__builtin_expect(t.status != ThreadStatus::Live, 0)) return thread_state_slow();
    return t;
}

// Once at start: every thread that gets a state from now on calls
// on_exit(its state) when it exits; the calling thread too.
bool watch_thread_exits(void (*on_exit)(void*));

// Arranges for on_exit once more (a state that became Live before
// watch_thread_exits: its thread's first ring).
void watch_thread_exit(ThreadState& t);

// The calling thread is exiting (its exit destructor): later accesses find
// the state Retired and still the caller's.
void retire_thread_state(ThreadState& t);

// The state without the status check, for the hot path of a hook: only
// after thread_state() made the state the caller's earlier in the hook
// (its HookFrame does).
inline ThreadState& hook_state() { return tcb_state(); }

// A malloc-family hook (or heapsnap_marker) running on this thread: the
// outermost one keeps its frame in hook_sp, so that a signal handler that
// leaves it by siglongjmp is known to (abandon_hook); bit 0 says it owes
// an event it has not recorded yet (frame addresses are even).
class HookFrame {
public:
    explicit HookFrame(const void* frame)
        : t_(thread_state()), frame_(reinterpret_cast<uint64_t>(frame)), outer_(t_.hook_sp == 0) {
        if (outer_) t_.hook_sp = frame_;
    }
    ~HookFrame() {
        if (outer_) t_.hook_sp = 0;
    }
    HookFrame(const HookFrame&) = delete;
    HookFrame& operator=(const HookFrame&) = delete;
    void owe(bool owes) {
        if (outer_) t_.hook_sp = frame_ | owes;
    }

private:
    ThreadState& t_;
    uint64_t frame_;
    bool outer_;
};

// Blocks every signal while it lives, with rt_sigprocmask itself (glibc's
// pthread_sigmask leaves its own two open, and SIGCANCEL's handler unwinds
// the thread). Nested sections make no system call. The mask is changed
// before the count, and back after it, so a handler never sees the count
// raised with signals open.
class SignalsBlocked {
public:
    SignalsBlocked();
    ~SignalsBlocked();
    SignalsBlocked(const SignalsBlocked&) = delete;
    SignalsBlocked& operator=(const SignalsBlocked&) = delete;

private:
    uint64_t old_ = 0;
    bool outer_ = false;
};

// The same for a section that ends in another function (fork's handlers):
// the mask is kept in the thread's state.
void block_signals_until_unblocked();
void unblock_signals();

// The writer thread runs with every signal blocked from its creation.
void signals_blocked_for_good();

}  // namespace heapsnap::recorder
