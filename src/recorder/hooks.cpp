// The interposed functions. Each hook calls the real function (found with
// dlsym(RTLD_NEXT), so another interposed allocator keeps working, and
// checked to be a definition: definitions.h) and records around it:
//   - a release (free, munmap, the old block of realloc) is recorded
//     *before* the real call, an acquisition *after* it returns — the
//     ordering rule that makes cross-thread address reuse replay exactly
//     (thread_buffer.h);
//   - nothing is recorded while thread_state().internal is set: the
//     recorder's own allocations (pthread internals, HEAPSNAP_VERIFY_STACKS's libunwind) are
//     not the program's. The exception is stack capture, which never
//     allocates: an allocation then comes from a signal handler, and is
//     recorded with its caller as a one-frame stack, because the unwinder's
//     cache and the stack table cannot be re-entered (thread_buffer.h,
//     kDeferredStack). A handler that interrupts any other part of a hook
//     is recorded normally; the mmap family's hooks run with signals
//     blocked, and a handler that leaves a malloc-family hook by
//     siglongjmp is caught by the longjmp family's hooks (thread_state.h).
//
// dlopen is observed, not interposed: glibc resolves $ORIGIN and RUNPATH
// from dlopen's caller, and a wrapper would make the caller this library.
// Module changes are picked up from dl_iterate_phdr's load/unload counters
// when a new stack is interned (modules.h). dlclose, which does not
// depend on its caller, is interposed for one thing: the stacks handed to
// the writer to intern (unwind.h, "Local keys") are interned, and their
// frames resolved, before the module they may lie in goes.
//
// While dlsym itself allocates during the lookup of the real functions,
// allocations are served from a static bootstrap arena that is never freed.
// Both mmap and mmap64 are defined below; with _FILE_OFFSET_BITS=64 (meson's
// default) <sys/mman.h> would rename mmap to mmap64. On LP64 they are the
// same function.
#undef _FILE_OFFSET_BITS
#include <alloca.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "format/hslog.h"
#include "recorder/allocator.h"
#include "recorder/attach.h"
#include "recorder/definitions.h"
#include "recorder/lifecycle.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"
#include "recorder/raw_alloc.h"
#include "recorder/sampler.h"
#include "recorder/stack_table.h"
#include "recorder/steering.h"
#include "recorder/thread_buffer.h"
#include "recorder/unwind.h"
#include "recorder/writer.h"

#define HEAPSNAP_EXPORT extern "C" __attribute__((visibility("default")))

namespace heapsnap::recorder {
namespace {

using AllocFn = hslog::AllocFn;

// ---- real functions -------------------------------------------------------

struct Real {
    void* (*malloc)(size_t);
    void (*free)(void*);
    void* (*calloc)(size_t, size_t);
    void* (*realloc)(void*, size_t);
    void* (*memalign)(size_t, size_t);
    int (*posix_memalign)(void**, size_t, size_t);
    void* (*aligned_alloc)(size_t, size_t);
    void* (*valloc)(size_t);
    void* (*pvalloc)(size_t);
    void* (*mmap)(void*, size_t, int, int, int, off_t);
    int (*munmap)(void*, size_t);
    void* (*mremap)(void*, size_t, size_t, int, void*);
    int (*pthread_create)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
    int (*close)(int);
    int (*execve)(const char*, char* const[], char* const[]);
    int (*execv)(const char*, char* const[]);
    int (*execvp)(const char*, char* const[]);
    int (*execvpe)(const char*, char* const[], char* const[]);
    int (*fexecve)(int, char* const[], char* const[]);
    int (*execveat)(int, const char*, char* const[], char* const[], int);
    int (*dlclose)(void*);
    int (*daemon)(int, int);
    pid_t (*fork)();
    void (*exit_now)(int);    // _exit
    void (*exit_now_c)(int);  // _Exit, the same function in glibc under C99's name
    void (*longjmp)(__jmp_buf_tag*, int);
    void (*longjmp_)(__jmp_buf_tag*, int);  // _longjmp
    void (*siglongjmp)(__jmp_buf_tag*, int);
    void (*longjmp_chk)(__jmp_buf_tag*, int);  // __longjmp_chk (_FORTIFY_SOURCE's longjmp)
    size_t (*usable_size)(void*);              // malloc_usable_size, of the allocator malloc is
};

Real real;
std::atomic<bool> g_resolved{false};
std::atomic<bool> g_resolving{false};

alignas(64) char g_bootstrap[256 * 1024];
std::atomic<size_t> g_bootstrap_used{0};

void* bootstrap_alloc(size_t size, size_t align = 16) {
    size_t used = g_bootstrap_used.load();
    for (;;) {
        size_t start = (used + align - 1) & ~(align - 1);
        if (start + size > sizeof g_bootstrap) return nullptr;
        if (g_bootstrap_used.compare_exchange_weak(used, start + size)) return g_bootstrap + start;
    }
}

bool is_bootstrap(const void* p) {
    auto* c = static_cast<const char*>(p);
    return c >= g_bootstrap && c < g_bootstrap + sizeof g_bootstrap;
}

// The code of the allocator (the module that defines the real malloc) and
// of libunwind (loaded for HEAPSNAP_VERIFY_STACKS only): an anonymous mmap called from there while the thread is in
// the allocator or in a stack capture is theirs; one called from anywhere
// else then is a signal handler's, and the program's.
struct CodeRange {
    uint64_t start = 0;
    uint64_t end = 0;
    bool holds(uint64_t ip) const { return ip >= start && ip < end; }
};
CodeRange g_allocator_code;
CodeRange g_unwinder_code;

CodeRange code_of(const void* fn) {
    dl_find_object found;
    if (!fn || _dl_find_object(const_cast<void*>(fn), &found) != 0) return {};
    return CodeRange{reinterpret_cast<uint64_t>(found.dlfo_map_start), reinterpret_cast<uint64_t>(found.dlfo_map_end)};
}

// Preloaded, the next definition after this library's, or where none
// follows it (libc preloaded before the recorder) the first one; attached
// (attach.h), the one the process itself binds to, which RTLD_NEXT from a
// dlopen'd object would miss when the executable defines it. Either way a
// definition, never a canonical PLT entry nor this library's own
// (definitions.h). The recorder's own calls of these names reach its
// hooks (-Bsymbolic-functions), which must find a real function either way.
void* definition(const char* name) {
    void* found = attached() ? nullptr : dlsym(RTLD_NEXT, name);
    return definition_of(name, found ? found : dlsym(RTLD_DEFAULT, name));
}

template <class F>
void lookup(F& fn, const char* name) {
    fn = reinterpret_cast<F>(definition(name));
}

void look_up_uid_functions();

void find_code_ranges();

__attribute__((noinline)) void resolve() {
    if (g_resolved.load(std::memory_order_acquire)) return;
    if (g_resolving.exchange(true)) return;  // dlsym is allocating: use the arena
    lookup(real.malloc, "malloc");
    lookup(real.free, "free");
    lookup(real.calloc, "calloc");
    lookup(real.realloc, "realloc");
    lookup(real.memalign, "memalign");
    lookup(real.posix_memalign, "posix_memalign");
    lookup(real.aligned_alloc, "aligned_alloc");
    lookup(real.valloc, "valloc");
    lookup(real.pvalloc, "pvalloc");
    lookup(real.mmap, "mmap");
    lookup(real.munmap, "munmap");
    lookup(real.mremap, "mremap");
    lookup(real.pthread_create, "pthread_create");
    lookup(real.close, "close");
    lookup(real.execve, "execve");
    lookup(real.execv, "execv");
    lookup(real.execvp, "execvp");
    lookup(real.execvpe, "execvpe");
    lookup(real.fexecve, "fexecve");
    lookup(real.execveat, "execveat");
    lookup(real.dlclose, "dlclose");
    lookup(real.daemon, "daemon");
    lookup(real.exit_now, "_exit");
    lookup(real.exit_now_c, "_Exit");
    lookup(real.fork, "fork");
    lookup(real.longjmp, "longjmp");
    lookup(real.longjmp_, "_longjmp");
    lookup(real.siglongjmp, "siglongjmp");
    lookup(real.longjmp_chk, "__longjmp_chk");
    lookup(real.usable_size, "malloc_usable_size");
    look_up_uid_functions();
    find_code_ranges();
    // Still resolving: what dlsym and dladdr allocate comes from the arena.
    detect_allocator(reinterpret_cast<void*>(real.malloc));
    g_resolved.store(true, std::memory_order_release);
}

void find_code_ranges() { g_allocator_code = code_of(reinterpret_cast<void*>(real.malloc)); }

}  // namespace

bool resolve_real_functions() {
    resolve();
    return g_resolved.load(std::memory_order_acquire) && real.malloc && real.free && real.calloc && real.realloc &&
           real.usable_size && real.mmap && real.munmap && real.pthread_create && real.dlclose;
}

namespace {

inline bool ready() {
    if (__builtin_expect(g_resolved.load(std::memory_order_acquire), 1)) return true;
    resolve();
    return g_resolved.load(std::memory_order_relaxed);
}

// ---- recording ------------------------------------------------------------

// Calls the real allocator with in_allocator raised (thread_state.h): an
// mmap it makes is its own heap, and the recorder starts no thread and
// calls nothing that allocates until it returns. `owes`: the hook has yet
// to record what the call did (set before in_allocator is lowered, so a
// handler that leaves the hook finds one or the other).
template <class Fn, class... Args>
__attribute__((always_inline)) inline auto call_allocator(HookFrame& frame, bool owes, Fn fn, Args... args) {
    ThreadState& t = hook_state();
    t.in_allocator++;
    if constexpr (std::is_void_v<decltype(fn(args...))>) {
        fn(args...);
        frame.owe(owes);
        t.in_allocator--;
    } else {
        auto r = fn(args...);
        frame.owe(owes);
        t.in_allocator--;
        return r;
    }
}

// In a hook, once the thread's state was checked (hook_state).
bool should_record() {
    const ThreadState& t = hook_state();
    return (t.internal == 0 || t.capturing) && recorder_active();
}

// should_record for a hook about to call the real allocator: if it will
// record, the unwinder's first lookup starts loading meanwhile (unwind.h,
// prefetch_stack_key). Not when sampling (most allocations then take no
// stack), nor while stacks are paused (none does).
__attribute__((always_inline)) inline bool should_record_prefetching(const void* hook_frame) {
    bool record = should_record();
    if (record && !sampling() && !paused_site()) prefetch_stack_key(hook_frame);
    return record;
}

// Where a hook was called from: the return address into the program,
// and the hook's own frame, where the stack walk starts (the recorder
// keeps frame pointers), so the recorder's frames below the hook are
// never walked.
struct Caller {
    uint64_t ip;
    const void* frame;
};
#define HEAPSNAP_CALLER \
    Caller { reinterpret_cast<uint64_t>(__builtin_return_address(0)), __builtin_frame_address(0) }

// The unwinders leave the recorder's own frames out (unwind.h), but walk
// them against the limit: `depth` plus room for them. A stack keeps its
// innermost `depth` frames.
uint32_t kept_frames(int n) { return std::min(static_cast<uint32_t>(n), config().depth); }

// Stacks interned by the writer and by the unwinder in the program's
// threads (lifecycle.h, report_stack_interning). --unwind fp interns every
// stack in its thread and is not counted: a shared counter bumped by every
// thread's every allocation would bounce its line between cores.
std::atomic<uint64_t> g_writer_interned{0};
std::atomic<uint64_t> g_thread_interned{0};

// A deeper stack's hash is taken again over the frames it keeps.
uint32_t intern_program_frames(uint64_t* ips, int n, uint64_t hash, const void** record) {
    g_thread_interned.fetch_add(1, std::memory_order_relaxed);
    uint32_t kept = kept_frames(n);
    return intern_stack(ips, kept, kept == static_cast<uint32_t>(n) ? hash : stack_hash(ips, kept), record);
}

// Whether ips[0..n), cut the same way, is the stack `record` holds.
bool recall_program_frames(const void* record, const uint64_t* ips, int n) {
    return stack_id_of(record, ips, kept_frames(n)) != 0;
}

// Hands ips[0..n), cut the same way, to the writer to intern (unwind.h,
// "Local keys"): the frames that differ from the outer part of `last`, the
// stack handed on before, which it then becomes. A stack shares most of
// its frames with the one before; the `known` ones are not compared,
// where neither stack was cut.
bool define_program_frames(const uint64_t* ips, int n, uint64_t hash, uint32_t local, uint32_t known,
                           DefinedStack& last) {
    uint32_t kept = kept_frames(n);
    bool whole = kept == static_cast<uint32_t>(n);
    if (!whole) hash = stack_hash(ips, kept);
    const uint64_t* outer = last.ips + kDefinedRoom;
    uint32_t shared = whole && last.whole ? std::min(known, last.n) : 0;
    while (shared < kept && shared < last.n && ips[kept - 1 - shared] == outer[-1 - static_cast<int>(shared)]) ++shared;
    if (!append_stack_def(local, ips, kept, shared, hash)) return false;
    memcpy(last.ips + kDefinedRoom - kept, ips, sizeof(uint64_t) * (kept - shared));
    last.n = kept;
    last.whole = whole;
    return true;
}

// ---- HEAPSNAP_VERIFY_STACKS --------------------------------------------------
//
// A check of the unwinder on real programs: every stack captured from a
// hook is unwound again with libunwind's unw_backtrace, the recorder's
// frames left out and cut the same way, and the two stacks' ids compared
// (interning libunwind's stack, so a difference adds a stack to the log).
// Slow: for tests and for doubt, never on by default.

std::atomic<uint64_t> g_verified_stacks{0};

}  // namespace

void load_stack_reference() {
    // Its loading allocates: the recorder's, not the program's.
    SignalsBlocked blocked;
    ThreadState& t = thread_state();
    t.internal++;
    bool loaded = load_reference_unwinder();
    t.internal--;
    if (!loaded) {
        const char* why = dlerror();
        diagnostic("verify-stacks: cannot load libunwind.so.8 (", why ? why : "no unw_backtrace",
                   "); stacks are not checked");
        return;
    }
    // Its caches' mappings, made during a capture, are the recorder's (owner_of).
    g_unwinder_code = code_of(reference_unwinder());
}

namespace {

std::atomic<uint64_t> g_differing_stacks{0};

// The id of libunwind's stack of the hook's caller, at most `max` frames
// of the program.
__attribute__((noinline)) uint32_t libunwind_stack_id(int max) {
    uint64_t theirs[kMaxDepth + 8];
    int n = libunwind_program_stack(theirs, max);
    if (n < 0) return 0;  // not loaded (yet): not checked
    uint32_t kept = kept_frames(n);
    return intern_stack(theirs, kept, stack_hash(theirs, kept));
}

// `hook_frame`: the frame of the hook that was called from the program
// (null: start from here and leave the recorder's frames out on the way).
// Under HEAPSNAP_VERIFY_STACKS, `expected` (if not null) receives the id
// libunwind's stack has where the stack's own id is a local key, which
// only the writer turns into an id; the writer compares the two then.
__attribute__((always_inline)) inline uint32_t capture_stack(const void* hook_frame, uint32_t* expected) {
    uint64_t ips[kMaxDepth + 8];
    int max = static_cast<int>(config().depth) + 8;
    uint64_t top = config().unwind == hslog::UnwindMode::FramePointer ? thread_stack_top() : 0;
    if (top) {
        uint32_t n = kept_frames(walk_frame_pointers(ips, max, top));
        return intern_stack(ips, n, stack_hash(ips, n));
    }
    // The prefetch is for a stack within the depth limit, the usual case.
    static constexpr StackKeyer keyer{intern_program_frames, prefetch_stack, recall_program_frames,
                                      define_program_frames};
    uint32_t stack = unwind_stack_key(ips, max, keyer, hook_frame);
    if (__builtin_expect(config().verify_stacks, 0) && hook_frame && expected) {
        uint32_t theirs = libunwind_stack_id(max);
        if (!theirs)
            ;  // the reference is not loaded yet
        else if (is_local_key(stack))
            *expected = theirs;
        else
            note_stack_verified(stack == theirs);
    }
    return stack;
}

// Stack id 0 ("no stack") for an mmap from a signal handler that
// interrupted a capture: the slot has no room for its caller.
__attribute__((always_inline)) inline uint32_t stack_now(const void* hook_frame, uint32_t* expected = nullptr) {
    ThreadState& t = hook_state();
    if (t.capturing) return 0;
    // capturing covers internal on both sides: a signal handler never finds
    // internal set without capturing, so it is never passed through.
    t.capturing = true;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t.internal++;
    uint32_t stack = capture_stack(hook_frame, expected);
    t.internal--;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t.capturing = false;
    return stack;
}

void fill_alloc(Slot& s, AllocFn fn, uint64_t addr, size_t size) {
    s = Slot{};
    s.kind = SlotKind::Alloc;
    s.fn = static_cast<uint8_t>(fn);
    s.addr = addr;
    s.size = size;
}

__attribute__((always_inline)) inline void record_alloc_unsampled(AllocFn fn, const void* p, size_t size,
                                                                  Caller caller) {
    auto addr = reinterpret_cast<uint64_t>(p);
    ThreadState& t = hook_state();
    if (t.capturing) {
        emit_with(t, [&](Slot& s) {
            fill_alloc(s, fn, addr, size);
            set_deferred_caller(s, caller.ip);
        });
        return;
    }
    // Paused (steering.h): the paused site's stack, and no walk at all.
    uint32_t expected = 0;
    uint32_t paused = paused_site();
    uint32_t stack = paused ? paused : stack_now(caller.frame, &expected);
    emit_with(t, [&](Slot& s) {
        fill_alloc(s, fn, addr, size);
        s.stack = stack;
        s.aux = expected;
    });
}

// Records an allocation (when sampling: if it is sampled).
void record_alloc(AllocFn fn, const void* p, size_t size, Caller caller) {
    if (sampling() && !sample_allocation(reinterpret_cast<uint64_t>(p), size)) return;
    record_alloc_unsampled(fn, p, size, caller);
}

// Records a free (when sampling: if its block was sampled); true if it did.
// `usable`: the block's usable size, taken before the real free when
// attached (0 otherwise). The writer writes it only for a block it never
// saw allocated (formats/hslog.md, FreeUnknown): one allocated before
// recording began.
__attribute__((always_inline)) inline bool record_free(const void* p, uint64_t usable) {
    if (sampling() && !release_sampled(reinterpret_cast<uint64_t>(p))) return false;
    auto addr = reinterpret_cast<uint64_t>(p);
    emit_with(hook_state(), [&](Slot& s) {
        s = Slot{};
        s.kind = SlotKind::Free;
        s.addr = addr;
        s.size = usable;
    });
    return true;
}

// Attached, the usable size of a block about to be freed (record_free).
__attribute__((always_inline)) inline uint64_t usable_before_free(void* p) {
    return attached() ? real.usable_size(p) : 0;
}

void record_mmap(const void* p, size_t length, int prot, int flags) {
    Slot slot{};
    slot.kind = SlotKind::Mmap;
    slot.addr = reinterpret_cast<uint64_t>(p);
    slot.size = length;
    slot.fn = static_cast<uint8_t>(prot);
    slot.aux = static_cast<uint32_t>(flags);
    uint32_t paused = paused_site();
    slot.stack = paused ? paused : stack_now(nullptr);
    emit(slot);
}

void record_munmap(const void* p, size_t length) {
    Slot slot{};
    slot.kind = SlotKind::Munmap;
    slot.addr = reinterpret_cast<uint64_t>(p);
    slot.size = length;
    emit(slot);
}

// ---- threads --------------------------------------------------------------

struct StartArgs {
    void* (*routine)(void*) = nullptr;
    void* arg = nullptr;
    // The thread's stack (describe_stack): its lowest address where the
    // program gives it; otherwise the size and guard glibc is asked for.
    uint64_t given_stack = 0;
    size_t stack_size = 0;
    size_t guard_size = 0;
    std::atomic<bool> used{false};
};

// The start arguments travel in a pool of the recorder's own memory: a
// malloc'd block freed in the new thread would make glibc set up a tcache
// and pick a malloc arena for a thread that might never allocate,
// changing the program's address space.
constexpr size_t kStartArgsPool = 1024;
// constinit: a thread started from a library's constructor, before the
// recorder's own, keeps its slot (unwind_cache.cpp, PoolSlot).
constinit StartArgs g_start_args[kStartArgsPool];
std::atomic<size_t> g_start_args_next{0};

StartArgs* take_start_args() {
    for (size_t tries = 0; tries < kStartArgsPool; ++tries) {
        StartArgs& a = g_start_args[g_start_args_next.fetch_add(1, std::memory_order_relaxed) % kStartArgsPool];
        bool expected = false;
        if (a.used.compare_exchange_strong(expected, true, std::memory_order_acquire)) return &a;
    }
    return nullptr;  // 1024 threads starting at once: start this one unrecorded
}

// The thread's stack is known by one address inside it, the stack pointer
// at start: enough for the address-space summary to find the region, and
// free of pthread_getattr_np, whose affinity query mallocs in the new
// thread and would make glibc create a malloc arena the program would not
// have had without the recorder.
void record_thread_start() {
    Slot slot{};
    slot.kind = SlotKind::ThreadStart;
    slot.aux = static_cast<uint32_t>(gettid());
    slot.addr = reinterpret_cast<uint64_t>(__builtin_frame_address(0));
    slot.size = 1;
    emit(slot);
}

// The stack the new thread will run on, from `attr` or the defaults: the
// one the program gives, or the size and guard glibc will make it with.
// (pthread_attr_init allocates nothing; the defaults are its stack size 0.)
void describe_stack(StartArgs& a, const pthread_attr_t* attr) {
    a.given_stack = 0;
    a.stack_size = a.guard_size = 0;
    pthread_attr_t defaults;
    if (!attr) {
        if (pthread_attr_init(&defaults) != 0) return;
        attr = &defaults;
    }
    // glibc's pthread_attr_getstack gives the lowest address of a stack the
    // program gave (its top minus its size), and for none, a null top minus
    // the size asked for: an address and size that add up to 0.
    void* given = nullptr;
    size_t given_size = 0, size = 0, guard = 0;
    bool read = pthread_attr_getstack(attr, &given, &given_size) == 0 && pthread_attr_getstacksize(attr, &size) == 0 &&
                pthread_attr_getguardsize(attr, &guard) == 0;
    if (attr == &defaults) pthread_attr_destroy(&defaults);
    if (!read) return;
    if (reinterpret_cast<uintptr_t>(given) + given_size != 0) {
        a.given_stack = reinterpret_cast<uintptr_t>(given);
        return;
    }
    a.stack_size = size;
    a.guard_size = guard;
}

// How far below a new thread's first frame (`top`) the walk may read
// (unwind.h, set_thread_stack): down to where its stack certainly goes;
// `top` itself (nothing) where that is not known. A stack the program gave goes down to the
// address it gave (a guard it keeps there lies below every frame, so below
// any first frame of a walk on this stack). glibc (x86-64) maps the guard, then
// the stack, and puts the thread's descriptor (pthread_self()) at the top
// of that block, below its end by the descriptor's size (2 368 bytes in
// glibc 2.36) rounded down to the static TLS's alignment: the block ends
// less than 64 KiB above the descriptor. So no usable byte lies below
// end - size, nor does the guard (with or without the guard counted in the
// size); one more page for slack.
uint64_t readable_bottom(uint64_t top, uint64_t given, size_t size, size_t guard) {
    if (given) return given < top ? given : top;
    if (!size) return top;
    uint64_t end = reinterpret_cast<uint64_t>(pthread_self()) + (64u << 10);
    uint64_t margin = uint64_t{guard} + 4096;
    if (end < top || end - top + margin >= size) return top;
    return end - size + margin;
}

void* thread_trampoline(void* p) {
    // Frame-pointer walks of this thread end at this frame.
    uint64_t top = reinterpret_cast<uint64_t>(__builtin_frame_address(0)) + 16;
    auto* pooled = static_cast<StartArgs*>(p);
    StartArgs args{pooled->routine, pooled->arg, pooled->given_stack, pooled->stack_size, pooled->guard_size, {}};
    pooled->used.store(false, std::memory_order_release);
    set_thread_stack(readable_bottom(top, args.given_stack, args.stack_size, args.guard_size), top);
    if (recorder_active()) record_thread_start();
    return args.routine(args.arg);
}

}  // namespace

bool starting_in_calloc() { return thread_state().in_calloc; }

void note_stack_verified(bool same) {
    g_verified_stacks.fetch_add(1, std::memory_order_relaxed);
    if (!same) g_differing_stacks.fetch_add(1, std::memory_order_relaxed);
}

// Only under the writer lock (the writer thread, or a drain in its
// place): a plain increment, no locked instruction per StackDef.
void note_writer_interned() {
    g_writer_interned.store(g_writer_interned.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

void report_stack_interning() {
    char writer[24], threads[24];
    format_uint(g_writer_interned.load(std::memory_order_relaxed), writer);
    format_uint(g_thread_interned.load(std::memory_order_relaxed), threads);
    diagnostic("stacks interned: ", writer, " by the writer, ", threads, " in the program's threads");
}

void report_stack_verification() {
    char checked[24], differing[24];
    format_uint(g_verified_stacks.load(std::memory_order_relaxed), checked);
    format_uint(g_differing_stacks.load(std::memory_order_relaxed), differing);
    diagnostic("verify-stacks: ", checked, " stacks checked, ", differing, " differ from libunwind");
}

// ---- leaving a hook by longjmp ------------------------------------------------
// A signal handler that leaves by siglongjmp (or longjmp) abandons the hook
// it interrupted when it jumps to a frame above that hook's: what the hook
// raised is undone before the real jump (thread_state.h). glibc keeps the
// stack pointer in a jmp_buf mangled with the thread's pointer guard
// (PTR_MANGLE: xor with %fs:0x30, then rotate left by 17 bits).

namespace {

uint64_t jump_target_sp(const __jmp_buf_tag* env) {
    uint64_t mangled = static_cast<uint64_t>(env->__jmpbuf[6]);  // JB_RSP
    uint64_t guard;
    asm("mov %%fs:0x30, %0" : "=r"(guard));
    return ((mangled >> 17) | (mangled << 47)) ^ guard;
}

// Whether a jump to `target` leaves the frame at `hook`. Stack addresses
// compare only on one stack: a jump off the alternate signal stack leaves
// every frame on it, a jump onto it none of the others.
bool leaves(uint64_t hook, uint64_t target) {
    stack_t alt;
    if (sigaltstack(nullptr, &alt) == 0 && !(alt.ss_flags & SS_DISABLE)) {
        auto on_alt = [&](uint64_t at) {
            auto lo = reinterpret_cast<uint64_t>(alt.ss_sp);
            return at >= lo && at - lo < alt.ss_size;
        };
        if (on_alt(hook) != on_alt(target)) return on_alt(hook);
    }
    return target > hook;
}

}  // namespace

void abandon_hook(uint64_t target_sp) {
    ThreadState& t = thread_state();
    if (!t.hook_sp || (target_sp != UINT64_MAX && !leaves(t.hook_sp & ~uint64_t{1}, target_sp))) return;
    uint64_t lost = (t.hook_sp & 1) || t.in_allocator ? 1 : 0;
    abandon_stack_walk();
    if (t.ring) lost += abandon_appends(*t.ring);
    t.capturing = false;
    t.internal = 0;
    t.in_allocator = 0;
    t.hook_sp = 0;
    note_unrecorded(lost);
}

}  // namespace heapsnap::recorder

using namespace heapsnap::recorder;

// ---- the malloc family ------------------------------------------------------

HEAPSNAP_EXPORT void* malloc(size_t size) {
    if (!ready()) return bootstrap_alloc(size);
    HookFrame frame(__builtin_frame_address(0));
    bool record = should_record_prefetching(__builtin_frame_address(0));
    void* p = call_allocator(frame, record, real.malloc, size);
    if (p && record) record_alloc(AllocFn::Malloc, p, size, HEAPSNAP_CALLER);
    frame.owe(false);
    return p;
}

HEAPSNAP_EXPORT void free(void* p) {
    if (!p || is_bootstrap(p)) return;
    if (!ready()) return;
    HookFrame frame(__builtin_frame_address(0));
    // Owed from before its record to the end of the real free: a handler
    // that leaves in between leaves a block the log may call freed.
    if (should_record()) {
        frame.owe(true);
        record_free(p, usable_before_free(p));
    }
    call_allocator(frame, false, real.free, p);
}

HEAPSNAP_EXPORT void* calloc(size_t n, size_t size) {
    if (!ready()) {
        size_t total;
        if (__builtin_mul_overflow(n, size, &total)) return nullptr;
        return bootstrap_alloc(total);  // static storage: already zero
    }
    HookFrame frame(__builtin_frame_address(0));
    ThreadState& t = hook_state();
    t.in_calloc = true;
    bool record = should_record_prefetching(__builtin_frame_address(0));
    t.in_calloc = false;
    void* p = call_allocator(frame, record, real.calloc, n, size);
    if (p && record) record_alloc(AllocFn::Calloc, p, n * size, HEAPSNAP_CALLER);
    frame.owe(false);
    return p;
}

namespace {

// realloc and reallocarray share this: the old block is released (recorded
// first), the new one acquired. realloc(p, 0) frees p and returns NULL.
void* reallocate(AllocFn fn, void* old, size_t size, Caller caller) {
    if (is_bootstrap(old)) {
        void* fresh = malloc(size);
        if (fresh) {
            size_t room = static_cast<size_t>(g_bootstrap + sizeof g_bootstrap - static_cast<char*>(old));
            memcpy(fresh, old, size < room ? size : room);
        }
        return fresh;
    }
    HookFrame frame(caller.frame);
    bool record = should_record();
    frame.owe(record);
    bool old_recorded = record && old && record_free(old, usable_before_free(old));
    void* p = call_allocator(frame, record, real.realloc, old, size);
    if (record) {
        if (p) {
            record_alloc(fn, p, size, caller);
        } else if (size && old_recorded) {
            // Failed: the old block is still live; record it again.
            if (sampling()) keep_sampled(reinterpret_cast<uint64_t>(old));
            record_alloc_unsampled(fn, old, malloc_usable_size(old), caller);
        }
    }
    frame.owe(false);
    return p;
}

// The memalign family: `call` makes the real call.
template <class Call>
__attribute__((always_inline)) inline void* aligned(AllocFn fn, size_t size, Caller caller, Call&& call) {
    HookFrame frame(caller.frame);
    bool record = should_record();
    void* p = call_allocator(frame, record, call);
    if (p && record) record_alloc(fn, p, size, caller);
    frame.owe(false);
    return p;
}

}  // namespace

HEAPSNAP_EXPORT void* realloc(void* old, size_t size) {
    if (!ready()) {
        void* fresh = bootstrap_alloc(size);
        if (fresh && old) memmove(fresh, old, size);
        return fresh;
    }
    return reallocate(AllocFn::Realloc, old, size, HEAPSNAP_CALLER);
}

HEAPSNAP_EXPORT void* reallocarray(void* old, size_t n, size_t elem) {
    size_t total;
    if (__builtin_mul_overflow(n, elem, &total)) {
        errno = ENOMEM;
        return nullptr;
    }
    if (!ready()) return realloc(old, total);
    // glibc's reallocarray calls realloc through the PLT, which is our hook:
    // call the real realloc with the checked product so the call is
    // recorded once, as reallocarray.
    return reallocate(AllocFn::Reallocarray, old, total, HEAPSNAP_CALLER);
}

HEAPSNAP_EXPORT void* memalign(size_t align, size_t size) {
    if (!ready()) return bootstrap_alloc(size, align < 16 ? 16 : align);
    return aligned(AllocFn::Memalign, size, HEAPSNAP_CALLER, [&] { return real.memalign(align, size); });
}

HEAPSNAP_EXPORT int posix_memalign(void** out, size_t align, size_t size) {
    if (!ready()) {
        *out = bootstrap_alloc(size, align < 16 ? 16 : align);
        return *out ? 0 : ENOMEM;
    }
    int r = 0;
    aligned(AllocFn::PosixMemalign, size, HEAPSNAP_CALLER, [&] {
        r = real.posix_memalign(out, align, size);
        return r == 0 ? *out : nullptr;
    });
    return r;
}

HEAPSNAP_EXPORT void* aligned_alloc(size_t align, size_t size) {
    if (!ready()) return bootstrap_alloc(size, align < 16 ? 16 : align);
    return aligned(AllocFn::AlignedAlloc, size, HEAPSNAP_CALLER, [&] { return real.aligned_alloc(align, size); });
}

HEAPSNAP_EXPORT void* valloc(size_t size) {
    if (!ready()) return bootstrap_alloc(size, 4096);
    return aligned(AllocFn::Valloc, size, HEAPSNAP_CALLER, [&] { return real.valloc(size); });
}

HEAPSNAP_EXPORT void* pvalloc(size_t size) {
    if (!ready()) return bootstrap_alloc(size, 4096);
    return aligned(AllocFn::Pvalloc, size, HEAPSNAP_CALLER, [&] { return real.pvalloc(size); });
}

// ---- anonymous mappings --------------------------------------------------------

// These hooks run with every signal blocked (thread_state.h): the tables
// they note ranges in are locked, and a mapping is recorded together with
// the call that made it, so a handler that leaves by siglongjmp leaves
// before the call or after its record. Two system calls more to a call
// that is one itself (and often faults pages in).

namespace {

// Who made an anonymous mapping (or unmaps one) while the thread is inside
// the allocator or a stack capture: the allocator or libunwind themselves,
// or a signal handler that interrupted them (`caller`: the hook's return
// address).
enum class MappingOwner { Program, AllocatorHeap, Recorder };

MappingOwner owner_of(const ThreadState& t, uint64_t caller) {
    if (t.in_allocator && g_allocator_code.holds(caller)) return MappingOwner::AllocatorHeap;
    if (t.capturing) return g_unwinder_code.holds(caller) ? MappingOwner::Recorder : MappingOwner::Program;
    // Outside a capture, `internal` is only ever raised with signals
    // blocked, or on the writer thread: nothing of the program's runs then.
    if (t.internal) return MappingOwner::Recorder;
    return MappingOwner::Program;
}

}  // namespace

HEAPSNAP_EXPORT void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
    if (!ready()) return reinterpret_cast<void*>(syscall(SYS_mmap, addr, length, prot, flags, fd, offset));
    if (!(flags & MAP_ANONYMOUS)) return real.mmap(addr, length, prot, flags, fd, offset);
    auto caller = reinterpret_cast<uint64_t>(__builtin_return_address(0));
    SignalsBlocked blocked;
    void* p = real.mmap(addr, length, prot, flags, fd, offset);
    if (p == MAP_FAILED) return p;
    auto start = reinterpret_cast<uint64_t>(p);
    switch (owner_of(thread_state(), caller)) {
        case MappingOwner::AllocatorHeap:
            // jemalloc, tcmalloc, mimalloc mapping their heap (allocator.h):
            // its blocks are recorded one by one, the mapping is Heap.
            note_allocator_mapping(start, start + length);
            break;
        case MappingOwner::Recorder:
            // libunwind's caches and the like: the recorder's memory, not the program's.
            note_recorder_range(start, start + length);
            break;
        case MappingOwner::Program:
            if (should_record()) record_mmap(p, length, prot, flags);
            break;
    }
    return p;
}

HEAPSNAP_EXPORT void* mmap64(void* addr, size_t length, int prot, int flags, int fd, off_t offset)
    __attribute__((alias("mmap")));

HEAPSNAP_EXPORT int munmap(void* addr, size_t length) {
    if (!ready()) return static_cast<int>(syscall(SYS_munmap, addr, length));
    auto caller = reinterpret_cast<uint64_t>(__builtin_return_address(0));
    SignalsBlocked blocked;
    auto start = reinterpret_cast<uint64_t>(addr);
    if (forget_recorder_range(start, start + length)) return real.munmap(addr, length);
    const ThreadState& t = thread_state();
    if (owner_of(t, caller) == MappingOwner::AllocatorHeap) {
        forget_allocator_mapping(start, start + length);
        return real.munmap(addr, length);
    }
    if (should_record()) record_munmap(addr, length);
    return real.munmap(addr, length);
}

HEAPSNAP_EXPORT void* mremap(void* old, size_t old_size, size_t new_size, int flags, ...) {
    if (!ready()) return MAP_FAILED;
    void* target = nullptr;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        target = va_arg(ap, void*);
        va_end(ap);
    }
    auto caller = reinterpret_cast<uint64_t>(__builtin_return_address(0));
    SignalsBlocked blocked;
    if (owner_of(thread_state(), caller) == MappingOwner::AllocatorHeap) {
        auto from = reinterpret_cast<uint64_t>(old);
        forget_allocator_mapping(from, from + old_size);
        void* p = real.mremap(old, old_size, new_size, flags, target);
        auto to = reinterpret_cast<uint64_t>(p == MAP_FAILED ? old : p);
        note_allocator_mapping(to, to + (p == MAP_FAILED ? old_size : new_size));
        return p;
    }
    bool record = should_record();
    if (record) record_munmap(old, old_size);
    void* p = real.mremap(old, old_size, new_size, flags, target);
    if (record) {
        int saved = errno;
        if (p != MAP_FAILED)
            record_mmap(p, new_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
        else
            record_mmap(old, old_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
        errno = saved;
    }
    return p;
}

// ---- descriptors -------------------------------------------------------------
// The recorder's descriptors stay open and in place whatever the program
// closes, and move out of the way of a dup2 onto their number (own_fds.h).
// These hooks make the system calls themselves, as glibc's functions do:
// they work before the real functions are looked up, and stay
// async-signal-safe.

HEAPSNAP_EXPORT int close(int fd) {
    if (is_own_fd(fd)) return 0;
    if (!ready()) return static_cast<int>(syscall(SYS_close, fd));
    return real.close(fd);
}

namespace {

// close_range(first, last, flags) in pieces around the recorder's
// descriptors.
int close_range_around_own(unsigned first, unsigned last, int flags) {
    int ours[kMaxOwnFds];
    int n = own_fds(ours);
    unsigned from = first;
    for (int i = 0; i < n; ++i) {
        auto fd = static_cast<unsigned>(ours[i]);
        if (fd < from || fd > last) continue;
        if (fd > from) {
            int r = static_cast<int>(syscall(SYS_close_range, from, fd - 1, flags));
            if (r != 0) return r;
        }
        from = fd + 1;
    }
    if (from > last || from == 0) return 0;  // from == 0: wrapped past UINT_MAX
    return static_cast<int>(syscall(SYS_close_range, from, last, flags));
}

// dup2 and dup3 onto `target`: a descriptor of the recorder's there moves
// first, unless the call fails anyway (a target at or above the soft
// limit, where the recorder's usually are, as bare).
void make_room(int target) {
    if (!is_own_fd(target)) return;
    rlimit lim;
    if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, nullptr, &lim) == 0 && static_cast<rlim_t>(target) >= lim.rlim_cur)
        return;
    own_fd_vacate(target);
}

bool own_nofile(int resource, pid_t pid) { return resource == RLIMIT_NOFILE && (pid == 0 || pid == getpid()); }

}  // namespace

HEAPSNAP_EXPORT int close_range(unsigned first, unsigned last, int flags) {
    return close_range_around_own(first, last, flags);
}

// glibc's closefrom makes the close_range system call itself, past the
// hook above; where the kernel has none, it closes what /proc/self/fd
// lists, and so does this, one by one through the close hook.
HEAPSNAP_EXPORT void closefrom(int lowfd) {
    if (lowfd < 0) lowfd = 0;
    if (close_range_around_own(static_cast<unsigned>(lowfd), ~0u, 0) == 0 || errno != ENOSYS) return;
    rlimit lim;
    if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, nullptr, &lim) != 0) return;
    for (rlim_t fd = static_cast<rlim_t>(lowfd); fd < lim.rlim_cur; ++fd) close(static_cast<int>(fd));
}

HEAPSNAP_EXPORT int dup2(int oldfd, int newfd) {
    if (oldfd != newfd) make_room(newfd);
    return static_cast<int>(syscall(SYS_dup2, oldfd, newfd));
}

HEAPSNAP_EXPORT int dup3(int oldfd, int newfd, int flags) {
    if (oldfd != newfd) make_room(newfd);
    return static_cast<int>(syscall(SYS_dup3, oldfd, newfd, flags));
}

// The soft limit of descriptors changes only while the recorder is not
// moving a descriptor above it (own_fds.h).
HEAPSNAP_EXPORT int prlimit(pid_t pid, __rlimit_resource resource, const rlimit* limit, rlimit* old) {
    auto call = [&] { return static_cast<int>(syscall(SYS_prlimit64, pid, resource, limit, old)); };
    return limit && own_nofile(resource, pid) ? with_fd_limit_lock(call) : call();
}

// The *64 forms take the same structure on LP64.
HEAPSNAP_EXPORT int prlimit64(pid_t pid, __rlimit_resource resource, const rlimit64* limit, rlimit64* old) {
    return prlimit(pid, resource, reinterpret_cast<const rlimit*>(limit), reinterpret_cast<rlimit*>(old));
}

HEAPSNAP_EXPORT int setrlimit(__rlimit_resource_t resource, const rlimit* limit) {
    return prlimit(0, static_cast<__rlimit_resource>(resource), limit, nullptr);
}

HEAPSNAP_EXPORT int setrlimit64(__rlimit_resource_t resource, const rlimit64* limit) {
    return setrlimit(resource, reinterpret_cast<const rlimit*>(limit));
}

// ---- threads and exec ------------------------------------------------------------

HEAPSNAP_EXPORT int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*routine)(void*), void* arg) {
    if (!ready()) return EAGAIN;
    ThreadState& t = thread_state();
    // The recorder's own thread (created while internal) is not the
    // program's; a signal handler's, during a stack capture, is.
    if ((t.internal && !t.capturing) || !recorder_active()) return real.pthread_create(thread, attr, routine, arg);
    StartArgs* args = take_start_args();
    if (!args) return real.pthread_create(thread, attr, routine, arg);
    args->routine = routine;
    args->arg = arg;
    describe_stack(*args, attr);
    int r = real.pthread_create(thread, attr, thread_trampoline, args);
    if (r != 0) args->used.store(false, std::memory_order_release);
    return r;
}

namespace {

// The log ends before the real call; if the call fails, or a signal
// handler leaves it by siglongjmp (jump), recording goes on in a new log.
template <class Call>
int around_exec(Call&& call) {
    ThreadState& t = thread_state();
    t.exec_sp = reinterpret_cast<uint64_t>(__builtin_frame_address(0));
    before_exec();
    int r = call();
    int saved = errno;
    t.exec_sp = 0;
    after_failed_exec();
    errno = saved;
    return r;
}

}  // namespace

HEAPSNAP_EXPORT int dlclose(void* handle) {
    auto real_dlclose =
        ready() && real.dlclose ? real.dlclose : reinterpret_cast<int (*)(void*)>(dlsym(RTLD_NEXT, "dlclose"));
    thread_state();
    if (should_record()) writer_take_published();
    int r = real_dlclose(handle);
    if (attached()) {
        int saved = errno;
        forget_unloaded_modules();
        errno = saved;
    }
    return r;
}

// ---- leaving a hook by longjmp ------------------------------------------------

namespace {

[[noreturn]] void jump(void (*real_jump)(__jmp_buf_tag*, int), __jmp_buf_tag* env, int value) {
    if (ready()) {
        uint64_t target = jump_target_sp(env);
        abandon_hook(target);
        ThreadState& t = thread_state();
        if (t.exec_sp && leaves(t.exec_sp, target)) {
            t.exec_sp = 0;
            after_failed_exec();
        }
    }
    real_jump(env, value);
    __builtin_unreachable();
}

}  // namespace

HEAPSNAP_EXPORT void longjmp(__jmp_buf_tag env[1], int value) { jump(real.longjmp, env, value); }

HEAPSNAP_EXPORT void _longjmp(__jmp_buf_tag env[1], int value) { jump(real.longjmp_, env, value); }

HEAPSNAP_EXPORT void siglongjmp(__jmp_buf_tag env[1], int value) { jump(real.siglongjmp, env, value); }

extern "C" void __longjmp_chk(__jmp_buf_tag env[1], int value) __attribute__((noreturn));
HEAPSNAP_EXPORT void __longjmp_chk(__jmp_buf_tag env[1], int value) { jump(real.longjmp_chk, env, value); }

// _exit and _Exit run no destructor, so the library's, which ends the log
// at exit, never runs: the log is ended here instead. dash leaves so on
// every exit, lld when it is done, Python's os._exit in a fork child.
namespace {

[[noreturn]] void leave_now(void (*real_exit)(int), int status) {
    before_underscore_exit();
    if (real_exit) real_exit(status);
    for (;;) syscall(SYS_exit_group, status);
}

}  // namespace

// daemon(3) forks, and its parent leaves by _exit inside glibc, past the
// hook above: that log is ended by the fork's parent handler instead
// (preload.cpp, before_daemon).
HEAPSNAP_EXPORT int daemon(int nochdir, int noclose) {
    auto real_daemon =
        ready() && real.daemon ? real.daemon : reinterpret_cast<int (*)(int, int)>(dlsym(RTLD_NEXT, "daemon"));
    before_daemon();
    int r = real_daemon(nochdir, noclose);
    int saved = errno;
    after_daemon(r);
    errno = saved;
    return r;
}

// The child of a fork starts its log, control socket and writer here,
// once fork has returned (every atfork handler has run, the allocator's
// included, so its locks are free again) and before the program goes on:
// an idle daemon can be snapshotted at once. A child created otherwise
// (clone, _Fork) starts them at its first event (preload.cpp).
HEAPSNAP_EXPORT pid_t fork() {
    auto real_fork = ready() && real.fork ? real.fork : reinterpret_cast<pid_t (*)()>(dlsym(RTLD_NEXT, "fork"));
    pid_t r = real_fork();
    if (r == 0) {
        int saved = errno;
        start_recording_child();
        errno = saved;
    }
    return r;
}

HEAPSNAP_EXPORT void _exit(int status) { leave_now(ready() ? real.exit_now : nullptr, status); }

HEAPSNAP_EXPORT void _Exit(int status) { leave_now(ready() ? real.exit_now_c : nullptr, status); }

// The environment the new image gets: `envp` itself, or where it holds the
// relative HEAPSNAP_OUTPUT the recorder started with, a copy on the
// caller's stack (alloca: nothing allocated before exec) with that entry
// made absolute (lifecycle.h, absolute_output_entry), so a program that
// changed directory passes on where the user asked for logs.
#define HEAPSNAP_EXEC_ENV(envp)                                                             \
    ({                                                                                      \
        char* const* in_ = (envp);                                                          \
        const char* entry_ = absolute_output_entry();                                       \
        size_t n_ = 0;                                                                      \
        if (entry_ && in_)                                                                  \
            while (in_[n_]) ++n_;                                                           \
        char** out_ = n_ ? static_cast<char**>(alloca((n_ + 1) * sizeof(char*))) : nullptr; \
        if (out_) {                                                                         \
            for (size_t i_ = 0; i_ <= n_; ++i_) out_[i_] = in_[i_];                         \
            replace_output_entry(out_, entry_);                                             \
        }                                                                                   \
        out_ ? static_cast<char* const*>(out_) : in_;                                       \
    })

HEAPSNAP_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
    if (!ready()) return -1;
    char* const* env = HEAPSNAP_EXEC_ENV(envp);
    return around_exec([&] { return real.execve(path, argv, env); });
}

HEAPSNAP_EXPORT int execv(const char* path, char* const argv[]) {
    if (!ready()) return -1;
    char* const* env = HEAPSNAP_EXEC_ENV(environ);
    return around_exec([&] { return real.execve(path, argv, env); });
}

HEAPSNAP_EXPORT int execvp(const char* file, char* const argv[]) {
    if (!ready()) return -1;
    char* const* env = HEAPSNAP_EXEC_ENV(environ);
    return around_exec([&] { return real.execvpe(file, argv, env); });
}

HEAPSNAP_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
    if (!ready()) return -1;
    char* const* env = HEAPSNAP_EXEC_ENV(envp);
    return around_exec([&] { return real.execvpe(file, argv, env); });
}

HEAPSNAP_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
    if (!ready()) return -1;
    char* const* env = HEAPSNAP_EXEC_ENV(envp);
    return around_exec([&] { return real.fexecve(fd, argv, env); });
}

HEAPSNAP_EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
    if (!ready()) return -1;
    char* const* env = HEAPSNAP_EXEC_ENV(envp);
    return around_exec([&] { return real.execveat(dirfd, path, argv, env, flags); });
}

// The list forms take their arguments as varargs; glibc's own versions call
// execve directly, past the hooks above, so they are rebuilt here into the
// vector forms (on the stack, as glibc does: nothing allocated before exec).
namespace {

// Collects arg and the rest of ap up to the NULL into an argv on this
// frame and calls exec(argv, envp); envp follows the NULL for execle and
// is environ for the others.
template <class Exec>
int exec_list(const char* arg, va_list ap, bool env_follows, Exec&& exec) {
    va_list count;
    va_copy(count, ap);
    size_t n = 1;
    if (arg)
        while (va_arg(count, const char*)) ++n;
    va_end(count);
    auto** argv = static_cast<char**>(alloca((n + 1) * sizeof(char*)));
    argv[0] = const_cast<char*>(arg);
    for (size_t i = 1; i < n; ++i) argv[i] = va_arg(ap, char*);
    argv[n] = nullptr;
    if (arg) va_arg(ap, char*);  // the terminating NULL
    char* const* envp = env_follows ? va_arg(ap, char* const*) : environ;
    return exec(argv, envp);
}

}  // namespace

HEAPSNAP_EXPORT int execl(const char* path, const char* arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int r = exec_list(arg, ap, false, [&](char** argv, char* const* envp) { return execve(path, argv, envp); });
    va_end(ap);
    return r;
}

HEAPSNAP_EXPORT int execlp(const char* file, const char* arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int r = exec_list(arg, ap, false, [&](char** argv, char* const*) { return execvp(file, argv); });
    va_end(ap);
    return r;
}

HEAPSNAP_EXPORT int execle(const char* path, const char* arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int r = exec_list(arg, ap, true, [&](char** argv, char* const* envp) { return execve(path, argv, envp); });
    va_end(ap);
    return r;
}

// ---- uid changes -------------------------------------------------------------
// A server started as root that switches to its own user (memcached -u,
// nginx's workers) stays reachable by that user through the control socket
// (control.cpp), and that user must be able to read the log by its path
// too: just before the real call, while the process may still chown, the
// log is given to the uid the process is about to run as (its new
// effective uid, else its new real uid); if the call fails it is given
// back. glibc's setuid family changes the credentials of every thread of
// the process. Group ids are left alone: the log's mode is 0600.
// The hooks neither allocate nor lock (writer_give_log): these calls are
// async-signal-safe, and a program may make them from a signal handler.
// The real functions are looked up by the library's constructor (dlsym
// may allocate) and again with the others (resolve: attached, the
// constructor ran before the recorder knew it); only a call made before
// the constructor, from an earlier one, looks its function up itself.

namespace {

template <class Fn>
Fn next_definition(std::atomic<Fn>& cache, const char* name) {
    Fn fn = cache.load(std::memory_order_acquire);
    if (!fn) {
        fn = reinterpret_cast<Fn>(definition(name));
        cache.store(fn, std::memory_order_release);
    }
    return fn;
}

template <class Call>
int changing_uid(uid_t new_real, uid_t new_effective, Call&& call) {
    uid_t user = new_effective != static_cast<uid_t>(-1) ? new_effective : new_real;
    int64_t previous_owner = writer_give_log(user);
    int r = call();
    if (r != 0) {
        int saved = errno;
        writer_take_log_back(previous_owner);
        errno = saved;
    }
    return r;
}

std::atomic<int (*)(uid_t)> g_real_setuid{nullptr};
std::atomic<int (*)(uid_t)> g_real_seteuid{nullptr};
std::atomic<int (*)(uid_t, uid_t)> g_real_setreuid{nullptr};
std::atomic<int (*)(uid_t, uid_t, uid_t)> g_real_setresuid{nullptr};

__attribute__((constructor)) void look_up_uid_functions_early() {
    next_definition(g_real_setuid, "setuid");
    next_definition(g_real_seteuid, "seteuid");
    next_definition(g_real_setreuid, "setreuid");
    next_definition(g_real_setresuid, "setresuid");
}

}  // namespace

namespace heapsnap::recorder {
namespace {

void look_up_uid_functions() {
    g_real_setuid.store(reinterpret_cast<int (*)(uid_t)>(definition("setuid")), std::memory_order_release);
    g_real_seteuid.store(reinterpret_cast<int (*)(uid_t)>(definition("seteuid")), std::memory_order_release);
    g_real_setreuid.store(reinterpret_cast<int (*)(uid_t, uid_t)>(definition("setreuid")), std::memory_order_release);
    g_real_setresuid.store(reinterpret_cast<int (*)(uid_t, uid_t, uid_t)>(definition("setresuid")),
                           std::memory_order_release);
}

}  // namespace
}  // namespace heapsnap::recorder

HEAPSNAP_EXPORT int setuid(uid_t uid) {
    auto real_setuid = next_definition(g_real_setuid, "setuid");
    return changing_uid(uid, uid, [&] { return real_setuid(uid); });
}

HEAPSNAP_EXPORT int seteuid(uid_t euid) {
    auto real_seteuid = next_definition(g_real_seteuid, "seteuid");
    return changing_uid(static_cast<uid_t>(-1), euid, [&] { return real_seteuid(euid); });
}

HEAPSNAP_EXPORT int setreuid(uid_t ruid, uid_t euid) {
    auto real_setreuid = next_definition(g_real_setreuid, "setreuid");
    return changing_uid(ruid, euid, [&] { return real_setreuid(ruid, euid); });
}

HEAPSNAP_EXPORT int setresuid(uid_t ruid, uid_t euid, uid_t suid) {
    auto real_setresuid = next_definition(g_real_setresuid, "setresuid");
    return changing_uid(ruid, euid, [&] { return real_setresuid(ruid, euid, suid); });
}
