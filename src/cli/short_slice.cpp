#include "cli/short_slice.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace heapsnap::cli {
namespace {

constexpr uint64_t kShortSliceNs = 100'000;  // the shortest the kernel grants
constexpr uint64_t kResetOnFork = 0x01;      // SCHED_FLAG_RESET_ON_FORK

}  // namespace

ShortSlice::ShortSlice(pid_t tid) : tid_(tid) {
    // A fair task's sched_runtime reads as its slice, custom or not: the
    // default is what heapsnap's own thread reads before it asks for less.
    static const uint64_t default_slice = [] {
        Attributes own{};
        return syscall(SYS_sched_getattr, 0, &own, sizeof own, 0) == 0 ? own.runtime : 0;
    }();
    if (syscall(SYS_sched_getattr, tid, &saved_, sizeof saved_, 0) != 0) return;
    if (saved_.policy != SCHED_OTHER && saved_.policy != SCHED_BATCH) return;
    if (saved_.runtime == default_slice) saved_.runtime = 0;  // back to the default, not a copy of it
    saved_.size = sizeof saved_;
    Attributes brief = saved_;
    brief.flags |= kResetOnFork;
    brief.runtime = kShortSliceNs;
    changed_ = syscall(SYS_sched_setattr, tid, &brief, 0) == 0;
}

void ShortSlice::restore() {
    if (!changed_) return;
    changed_ = false;
    syscall(SYS_sched_setattr, tid_, &saved_, 0);
}

}  // namespace heapsnap::cli
