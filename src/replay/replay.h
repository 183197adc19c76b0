// Replay of a .hslog: the live heap as it evolves, event by event.
//
// One streaming pass; memory is bounded by the live set (one 32-byte entry
// per live block in an open-addressing table, one per live mapping) plus
// the stacks and modules, never by the history. Per-stack live totals are
// kept incrementally, so the state at any moment (a marker, the peak, a
// time offset) is available without a second look at the blocks.
//
// Frees of addresses that were never seen allocated (blocks inherited
// across fork, allocations made before the recorder started) are counted
// and otherwise ignored. An allocation at an address that is still live
// (its free was not recorded) replaces the old block, which is counted as
// freed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "format/log_reader.h"
#include "format/snapshot_file.h"
#include "util/flat_map.h"

namespace heapsnap {

struct LiveBlock {
    uint64_t size = 0;
    uint64_t time_ns = 0;
    uint32_t stack = 0;
};

struct LiveMapping {
    uint64_t length = 0;
    uint64_t time_ns = 0;
    uint32_t stack = 0;
};

struct StackTotals {
    uint64_t bytes = 0;
    uint64_t blocks = 0;
    uint64_t mmap_bytes = 0;
    uint64_t mmap_regions = 0;
};

class Replay : public LogVisitor {
public:
    void on_process(const ProcessInfo& p) override;
    void on_module_load(const ModuleRecord& m) override;
    void on_module_unload(uint32_t module, uint64_t time_ns) override;
    void on_stack(uint32_t stack, std::span<const StackFrame> frames) override;
    void on_thread_start(const ThreadStartRecord& t) override;
    void on_thread_exit(uint32_t thread, uint64_t time_ns) override;
    void on_alloc(const AllocEvent& e) override;
    void on_free(const FreeEvent& e) override;
    void on_mmap(const MmapEvent& e) override;
    void on_munmap(const MunmapEvent& e) override;

    const ProcessInfo& process() const { return process_; }
    const SnapshotTotals& totals() const { return totals_; }
    uint64_t last_time_ns() const { return last_time_ns_; }

    // The live state now, as a snapshot taken at `marker`.
    Snapshot snapshot(const MarkerRecord& marker, bool has_marker_data) const;

    // The whole state, for a checkpoint (replay/checkpoint.h).
    void save_state(ByteBuffer& out) const;
    void load_state(codec::Reader& in);

protected:
    ProcessInfo process_;
    SnapshotTotals totals_;
    uint64_t last_time_ns_ = 0;

private:
    void remove_mapping_range(uint64_t start, uint64_t end);
    StackTotals& stack_totals(uint32_t stack);
    void note_time(uint64_t t) { last_time_ns_ = t; }

    FlatMap<LiveBlock> blocks_;
    std::map<uint64_t, LiveMapping> mappings_;  // by start address
    std::vector<StackTotals> per_stack_;        // by stack id
    std::map<uint32_t, std::vector<StackFrame>> stacks_;
    std::map<uint32_t, SnapshotModule> modules_;
    std::map<uint32_t, ThreadStartRecord> threads_;  // live threads
};

}  // namespace heapsnap
