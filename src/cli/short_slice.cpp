#include "cli/short_slice.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace heapsnap::cli {
namespace {

bool get_attributes(pid_t tid, SchedAttributes& out) {
    return syscall(SYS_sched_getattr, tid, &out, sizeof out, 0) == 0;
}

bool set_attributes(pid_t tid, const SchedAttributes& in) { return syscall(SYS_sched_setattr, tid, &in, 0) == 0; }

// A fair task's sched_runtime reads as its slice, custom or not: the
// default is what heapsnap's own thread reads before it asks for less.
uint64_t default_slice() {
    static const uint64_t slice = [] {
        SchedAttributes own{};
        return get_attributes(0, own) ? own.runtime : 0;
    }();
    return slice;
}

bool fair(const SchedAttributes& a) { return a.policy == SCHED_OTHER || a.policy == SCHED_BATCH; }

}  // namespace

ShortSlice::ShortSlice(pid_t tid) : tid_(tid) {
    const uint64_t usual = default_slice();
    if (!get_attributes(tid, saved_) || !fair(saved_)) return;
    if (saved_.runtime == usual) saved_.runtime = 0;  // back to the default, not a copy of it
    saved_.size = sizeof saved_;
    SchedAttributes brief = saved_;
    brief.runtime = kShortSliceNs;
    changed_ = set_attributes(tid, brief);
}

void ShortSlice::restore() {
    if (!changed_) return;
    changed_ = false;
    set_attributes(tid_, saved_);
}

std::optional<SchedAttributes> ShortSlice::saved() const {
    if (!changed_) return std::nullopt;
    return saved_;
}

}  // namespace heapsnap::cli
