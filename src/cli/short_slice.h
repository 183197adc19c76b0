// Short scheduler slices for the threads an injection waits on
// (cli/inject.h): heapsnap's own, and the thread it borrows, while it is
// borrowed.
//
// With every CPU busy, each ptrace round trip waits twice for a CPU: the
// stopped thread once continued, heapsnap once the thread stops again.
// Linux's EEVDF scheduler (6.12 and later) lets a fair task ask for a
// shorter slice (sched_setattr's sched_runtime, 0.1 to 100 ms, no
// privilege needed); a task woken with a shorter slice than the running
// one's preempts it instead of waiting for the next tick.
//
// The thread's settings go back as they were read. SCHED_FLAG_RESET_ON_FORK
// is never asked for: only a privileged caller may clear it again, so an
// unprivileged heapsnap could not put the thread back as it was. A
// thread the borrowed one creates therefore inherits the short slice: the
// loader thread puts back the borrowed thread's settings on itself first
// (cli/loader_stub.h). Kernels without custom slices ignore sched_runtime
// for fair tasks; real-time threads are left as they are.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace heapsnap::cli {

// struct sched_attr (linux/sched/types.h) as first defined, 48 bytes.
struct SchedAttributes {
    uint32_t size;
    uint32_t policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime;
    uint64_t deadline;
    uint64_t period;
};
static_assert(sizeof(SchedAttributes) == 48);

inline constexpr uint64_t kShortSliceNs = 100'000;  // the shortest the kernel grants

class ShortSlice {
public:
    // `tid` 0: the calling thread.
    explicit ShortSlice(pid_t tid);
    ~ShortSlice() { restore(); }
    ShortSlice(const ShortSlice&) = delete;
    ShortSlice& operator=(const ShortSlice&) = delete;

    // The thread's own settings back (once).
    void restore();

    // What restore() puts back, if the slice was changed.
    std::optional<SchedAttributes> saved() const;

private:
    pid_t tid_;
    bool changed_ = false;
    SchedAttributes saved_{};
};

}  // namespace heapsnap::cli
