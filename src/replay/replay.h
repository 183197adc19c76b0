// Replay of a .hslog: the live heap as it evolves, event by event.
//
// One streaming pass; memory is bounded by the live set, never by the
// history: one 16-byte LiveBlock per block live at the peak (a pool whose
// slots are reused), 24 bytes per allocation info, the stacks, the live
// mappings and the addresses of the live blocks that have one
// (SECURITY.md, "Resource use", has the measured figures). Every table
// charges what it holds to the read budget (util/read_budget.h), so a
// small file cannot make it hold more than that budget.
//
// Small blocks are named in the log by allocation info (formats/hslog.md,
// "Allocation infos"), and a Free frees the newest live block of its info:
// each info keeps its live blocks as a last-in first-out chain through the
// pool (info id -> top slot, each slot -> the one below), so an event costs
// two vector lookups and no hashing. An info's blocks share its size and
// stack, which the info keeps once; a block keeps only its time, its link
// and its info. Every per-stack total is exact; which block of an info
// died is the LIFO assumption, so a stack's oldest and newest live-block
// times are exact only when the program frees that info's blocks in LIFO
// order. Blocks named by address (AllocAt/FreeAt) keep size and stack in a
// side table, are looked up by address and are always exact. Per-stack
// live totals are kept incrementally, so the state at any moment (a
// marker, the peak, a time offset) is available without a second look at
// the blocks.
//
// A sampled log is scaled here, per block (replay/sampling.h): every total
// and entry downstream is already an estimate, and says so through
// process().sample_bytes. A block's weight is its info's whole part, plus
// one when its random rounding went up (a bit of the block).
//
// Frees of blocks the recorder never saw allocated (inherited across fork,
// allocated before the recorder started) are counted and otherwise
// ignored.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/log_reader.h"
#include "format/snapshot_file.h"
#include "replay/sampling.h"
#include "replay/stacks.h"
#include "util/flat_map.h"
#include "util/pod_array.h"
#include "util/read_budget.h"
#include "util/zeroed_table.h"

namespace heapsnap {

// A slot of the pool. Free slots have tag 0 and chain through `below`.
struct LiveBlock {
    uint64_t time_ns = 0;
    uint32_t below = 0;  // the next older live block of its info, or the next free slot; 0: none
    uint32_t tag = 0;    // kAddressedBlock, or an info id; | kRoundedUp

    static constexpr uint32_t kRoundedUp = 1u << 31;       // weight: the info's whole part + 1
    static constexpr uint32_t kAddressedBlock = 1u << 30;  // size, stack, weight in the side table
    static constexpr uint32_t kInfoMask = kAddressedBlock - 1;
    bool live() const { return tag != 0; }
};
static_assert(sizeof(LiveBlock) == 16);

// What a consumer sees of a live block.
struct BlockView {
    uint64_t size = 0;
    uint64_t time_ns = 0;
    uint32_t stack = 0;
    uint32_t weight = 0;  // blocks it stands for: 1, or more in a sampled log (replay/sampling.h)
    uint64_t bytes() const { return size * weight; }
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
    void on_stack_record(uint32_t stack, uint32_t count, std::span<const uint8_t> frames) override;
    void on_thread_start(const ThreadStartRecord& t) override;
    void on_thread_exit(uint32_t thread, uint64_t time_ns) override;
    void on_alloc(const AllocEvent& e) override;
    void on_free(const FreeEvent& e) override;
    void on_mmap(const MmapEvent& e) override;
    void on_munmap(const MunmapEvent& e) override;

    const ProcessInfo& process() const { return process_; }
    const SnapshotTotals& totals() const { return totals_; }
    uint64_t last_time_ns() const { return last_time_ns_; }

    // The live state now, as a snapshot taken at `marker`; without
    // `with_stacks`, the entries' stacks are left to stack_table().
    Snapshot snapshot(const MarkerRecord& marker, bool has_marker_data, bool with_stacks = true) const;
    // The snapshot without entries and stacks: process, moment, totals,
    // modules, threads.
    Snapshot snapshot_header(const MarkerRecord& marker, bool has_marker_data) const;

    // The whole state, for a checkpoint (replay/checkpoint.h); it takes
    // fewer bytes than the tables hold (varints), at most this many.
    void save_state(ByteBuffer& out) const;
    uint64_t state_bytes_bound() const { return charge_.held(); }
    void load_state(codec::Reader& in);

protected:
    ProcessInfo process_;
    SnapshotTotals totals_;
    uint64_t last_time_ns_ = 0;
    // What the tables hold, charged to the read budget; given back with them.
    MemoryCharge charge_;

    // For subclasses that watch the live set (HistoryReplay). Blocks are
    // named by their slot in the pool, which a later block may reuse once
    // it is freed.
    BlockView block(uint32_t slot) const {
        const LiveBlock& b = blocks_[slot];
        if (b.tag & LiveBlock::kAddressedBlock) [[unlikely]] {
            const AddressedBlock* a = addressed_.find(slot);
            return BlockView{a->size, b.time_ns, a->stack, a->weight};
        }
        const InfoState& info = infos_[b.tag & LiveBlock::kInfoMask];
        return BlockView{info.size, b.time_ns, info.stack, info.whole + (b.tag >> 31)};
    }
    uint32_t last_added() const { return last_added_; }
    // The slot of the block `e` will free, 0 if none (an untracked free).
    uint32_t slot_freed_by(const FreeEvent& e) const {
        if (e.info) return e.info < infos_.size() ? infos_[e.info].top : 0;
        if (e.untracked) return 0;
        const uint32_t* slot = block_address_.find(e.address);
        return slot ? *slot : 0;
    }
    template <class Fn>
    void for_each_block(Fn&& fn) const {
        for (uint32_t slot = 1; slot < blocks_.size(); ++slot)
            if (blocks_[slot].live()) fn(slot, block(slot));
    }
    const StackTable& stack_table() const { return stacks_; }
    StackTable& stacks_mutable() { return stacks_; }

private:
    // An allocation info as the replay keeps it: what its blocks share.
    struct InfoState {
        uint64_t size = 0;
        uint32_t stack = 0;
        uint32_t top = 0;    // slot of its newest live block, 0 if none
        uint32_t whole = 0;  // the whole part of its blocks' weight; 0: not seen yet
    };
    struct AddressedBlock {
        uint64_t size = 0;
        uint32_t stack = 0;
        uint32_t weight = 0;
    };

    void remove_mapping_range(uint64_t start, uint64_t end);
    // Inline: two calls per event on the replay's hot path.
    StackTotals& stack_totals(uint32_t stack) {
        if (stack >= per_stack_.size()) [[unlikely]]
            grow_stack_totals(stack);
        return per_stack_[stack];
    }
    void grow_stack_totals(uint32_t stack);
    InfoState& info_state(uint32_t info, uint64_t size, uint32_t stack) {
        if (info >= infos_.size()) [[unlikely]]
            grow_infos(info);
        InfoState& s = infos_[info];
        if (!s.whole) [[unlikely]]
            first_sight(s, size, stack);
        return s;
    }
    void grow_infos(uint32_t info);
    // Charges a stack's memory, kStackChargeStep at a time ahead.
    void charge_stack(uint32_t frames) {
        uint64_t bytes = StackTable::kBytesPerStack + frames * sizeof(StackFrame);
        if (bytes > stacks_prepaid_) [[unlikely]] {
            uint64_t step = std::max(bytes, kStackChargeStep);
            charge_.take(step, "stacks");
            stacks_prepaid_ += step;
        }
        stacks_prepaid_ -= bytes;
    }
    static constexpr uint64_t kStackChargeStep = 1 << 20;
    void first_sight(InfoState& s, uint64_t size, uint32_t stack);
    void note_time(uint64_t t) { last_time_ns_ = t; }
    void add_block(uint32_t info, uint64_t address, uint64_t size, uint64_t time_ns, uint32_t stack, uint32_t weight);
    void remove_block(uint32_t slot);
    // The rare blocks named by their address, out of line.
    void add_addressed(uint32_t slot, uint64_t address, uint64_t size, uint32_t stack, uint32_t weight);
    void free_addressed(const FreeEvent& e);

    PodArray<LiveBlock> blocks_;                // the pool, by slot; slot 0 is never used
    uint32_t free_slot_ = 0;                    // first free slot, the others chained through `below`
    uint32_t last_added_ = 0;                   // slot of the latest block added
    ZeroedTable<InfoState> infos_;              // by info id
    FlatMap<uint32_t> block_address_;           // address -> slot, for the blocks the log names by address
    FlatMap<AddressedBlock> addressed_;         // slot -> size, stack, weight of those
    std::map<uint64_t, LiveMapping> mappings_;  // by start address
    ZeroedTable<StackTotals> per_stack_;        // by stack id
    StackTable stacks_;
    uint64_t stacks_prepaid_ = 0;  // charged for stacks not defined yet
    std::map<uint32_t, SnapshotModule> modules_;
    std::map<uint32_t, ThreadStartRecord> threads_;  // live threads
    SteppedCharge blocks_charge_{charge_, sizeof(LiveBlock), "live blocks"};
    // A map entry of 48 bytes, its node and malloc's header.
    SteppedCharge mappings_charge_{charge_, 96, "live mappings"};
    // Both address tables, at up to 7/8 load, while one rehashes.
    SteppedCharge addressed_charge_{charge_, 128, "live blocks of 64 KiB or more"};
};

// ---- The replay's hot path, inline so that a `final` visitor read through
// read_log_as (format/log_decoder.h) runs it without a call per event.

[[gnu::always_inline]] inline void Replay::add_block(uint32_t info, uint64_t address, uint64_t size, uint64_t time_ns,
                                                     uint32_t stack, uint32_t weight) {
    uint32_t slot = free_slot_;
    if (slot) {
        free_slot_ = blocks_[slot].below;
    } else {
        if (blocks_.size() == 0) [[unlikely]]
            blocks_.push();  // slot 0
        slot = static_cast<uint32_t>(blocks_.size());
        blocks_.push();
        blocks_charge_.reach(slot);
    }
    // Field by field: copying a whole LiveBlock built on the stack stalls
    // store forwarding, and this runs once per allocation.
    LiveBlock& b = blocks_[slot];
    b.time_ns = time_ns;
    if (info) [[likely]] {
        InfoState& s = info_state(info, size, stack);
        b.tag = info | (weight > s.whole ? LiveBlock::kRoundedUp : 0);
        b.below = s.top;
        s.top = slot;
    } else {
        add_addressed(slot, address, size, stack, weight);
    }
    last_added_ = slot;
    uint64_t bytes = size * weight;
    StackTotals& t = stack_totals(stack);
    t.bytes += bytes;
    t.blocks += weight;
    totals_.live_bytes += bytes;
    totals_.live_blocks += weight;
}

// Takes the block out of the totals and returns its slot to the pool; the
// caller has unlinked it from its info or its address.
[[gnu::always_inline]] inline void Replay::remove_block(uint32_t slot) {
    LiveBlock& b = blocks_[slot];
    BlockView v = block(slot);
    if (b.tag & LiveBlock::kAddressedBlock) [[unlikely]]
        addressed_.erase(slot, nullptr);
    StackTotals& t = per_stack_[v.stack];  // add_block made room for it
    t.bytes -= v.bytes();
    t.blocks -= v.weight;
    totals_.live_bytes -= v.bytes();
    totals_.live_blocks -= v.weight;
    b.tag = 0;
    b.below = free_slot_;
    free_slot_ = slot;
}

[[gnu::always_inline]] inline void Replay::on_alloc(const AllocEvent& e) {
    note_time(e.time_ns);
    totals_.events++;
    // The event's index salts the rounding of its weight: a log always
    // replays to the same estimates (replay/sampling.h).
    auto weight = static_cast<uint32_t>(sample_weight(e.size, process_.sample_bytes, totals_.events));
    totals_.allocations += weight;
    add_block(e.info, e.address, e.size, e.time_ns, e.stack, weight);
    if (totals_.live_bytes > totals_.peak_bytes) {
        totals_.peak_bytes = totals_.live_bytes;
        totals_.peak_time_ns = e.time_ns;
    }
}

[[gnu::always_inline]] inline void Replay::on_free(const FreeEvent& e) {
    note_time(e.time_ns);
    totals_.events++;
    if (!e.info) [[unlikely]]
        return free_addressed(e);
    // The newest live block of the info (formats/hslog.md: LIFO within an info).
    uint32_t slot = e.info < infos_.size() ? infos_[e.info].top : 0;
    if (!slot) [[unlikely]] {
        totals_.untracked_frees++;
        return;
    }
    infos_[e.info].top = blocks_[slot].below;
    remove_block(slot);
}

// ---- History: what `heapsnap report LOG@MARKER` shows beyond the live set --

// Live heap blocks by size. Class 0 holds empty blocks, class k >= 1 sizes in
// [2^(k-1), 2^k): power-of-two classes because allocators think in them
// (glibc's bins, the mmap threshold of 128 KiB = the lower bound of class
// 18), and 65 rows cover every size a 64-bit process can ask for.
struct SizeHistogram {
    static constexpr size_t kClasses = 65;
    std::array<uint64_t, kClasses> blocks{};
    std::array<uint64_t, kClasses> bytes{};

    static size_t class_of(uint64_t size) { return static_cast<size_t>(std::bit_width(size)); }
    static uint64_t class_min(size_t k) { return k ? uint64_t{1} << (k - 1) : 0; }
    static uint64_t class_max(size_t k) { return k == 64 ? UINT64_MAX : k ? (uint64_t{1} << k) - 1 : 0; }
    void add(uint64_t size, uint64_t count = 1) {
        blocks[class_of(size)] += count;
        bytes[class_of(size)] += size * count;
    }
};

// Allocation events over time at a resolution that follows the length of
// the recording: slices start 1 µs wide; when an event falls past the last
// of kSlices slices, neighbours are merged and the width doubles. Memory is
// fixed, every slice's count is exact, and a reader regroups the slices
// into the few buckets it shows (the end of the recording is not known
// while it is read).
struct AllocationTimeline {
    static constexpr size_t kSlices = 1024;
    uint64_t slice_ns = 1000;
    std::vector<uint64_t> counts;  // slice i: [i, i+1) * slice_ns after process start

    void add(uint64_t offset_ns, uint64_t count = 1);
};

struct StackActivity {
    uint64_t allocations = 0;  // heap allocations made by the stack
    uint64_t temporary = 0;    // of those, temporary (see HistoryReplay)
};

// The replay behind a report of a log: the live state at a moment plus how
// the process got there, in one pass. Kept out of Replay so snapshots and
// diffs (the hot path) pay nothing for it.
//
// - Temporary allocations, heaptrack's definition: a heap block freed by
//   the thread that allocated it before that thread allocated anything
//   else. A Free names an allocation info, not a block, so "it" is the
//   info's newest live block (the LIFO rule): a thread's allocation freed
//   right after while another thread allocated a block of the same info in
//   between counts as not temporary. A realloc is recorded as Free + Alloc; the Free of a realloc
//   resizes the block rather than throwing it away, so it does not make
//   the block temporary (the thread's next record after such a Free is the
//   realloc's Alloc, which is how it is recognised).
// - The live heap per call site at the peak (most live heap bytes, the
//   first time reached, as SnapshotTotals::peak_bytes), without a second
//   pass: changes since the last peak are kept per stack and folded into
//   the peak state whenever a new peak is reached, so each event is folded
//   at most once.
class HistoryReplay final : public Replay {
public:
    // Applies the first `stop_after_events` alloc/free/mmap/munmap events
    // of the log and stops: the moment of a snapshot whose totals.events is
    // that number.
    explicit HistoryReplay(uint64_t stop_after_events) : stop_after_(stop_after_events) {}

    void on_alloc(const AllocEvent& e) override;
    void on_free(const FreeEvent& e) override;
    void on_mmap(const MmapEvent& e) override;
    void on_munmap(const MunmapEvent& e) override;
    void on_marker(const MarkerRecord& m) override;

    // Also stops at the first marker `wanted` accepts, and takes the
    // snapshot there: the moment and its history from one pass.
    void stop_at_marker(std::function<bool(const MarkerRecord&)> wanted) { wanted_ = std::move(wanted); }
    std::optional<Snapshot>& at_marker() { return at_marker_; }

    // Settles the temporaries still undecided; call once after the read.
    void finish();

    uint64_t heap_allocations() const { return heap_allocations_; }
    uint64_t temporary() const { return temporary_; }
    const std::vector<StackActivity>& activity() const { return activity_; }  // by stack id
    const AllocationTimeline& timeline() const { return timeline_; }          // alloc and mmap events
    SizeHistogram live_sizes() const;
    // The live heap at the peak: entries (heap only, no ages), the stacks
    // they use, modules and totals (live bytes and blocks at the peak).
    // `with_stacks` false: the entries' stacks are left to stacks().
    Snapshot peak(bool with_stacks = true) const;
    // Every stack defined so far (also those with nothing live).
    const StackTable& stacks() const { return stack_table(); }
    // The same, taken out of the replay, which is done with.
    StackTable release_stacks() { return std::move(stacks_mutable()); }

private:
    struct ThreadState {
        uint32_t last_alloc = 0;  // slot of its latest allocation, until freed
        bool pending = false;     // freed its latest allocation; temporary unless a realloc's Alloc follows
        uint32_t pending_stack = 0;
        uint32_t pending_weight = 0;  // blocks the pending one stands for
    };
    struct Change {
        int64_t bytes = 0;
        int64_t blocks = 0;
    };

    bool admit();
    void applied();
    void grow_activity(uint32_t stack);
    ThreadState& thread_state(uint32_t thread);
    void settle(ThreadState& t, bool temporary);
    void change(uint32_t stack, int64_t bytes, int64_t blocks);
    void fold_into_peak();

    uint64_t stop_after_;
    uint64_t applied_ = 0;
    std::function<bool(const MarkerRecord&)> wanted_;
    std::optional<Snapshot> at_marker_;
    uint64_t heap_allocations_ = 0;
    uint64_t temporary_ = 0;
    std::vector<StackActivity> activity_;
    // By thread index: a map, since a log's indices need not be small (a
    // fork child continues its parent's numbering, a hostile log says
    // anything); events come in runs per thread, so the last one is cached.
    std::unordered_map<uint32_t, ThreadState> threads_state_;
    uint32_t cached_thread_ = 0;
    ThreadState* cached_state_ = nullptr;
    AllocationTimeline timeline_;
    uint64_t peak_bytes_ = 0;
    uint64_t peak_blocks_ = 0;
    uint64_t peak_time_ns_ = 0;
    std::vector<Change> at_peak_;     // by stack: live heap at the peak
    std::vector<Change> since_peak_;  // by stack: changes after it
    std::vector<uint32_t> touched_;   // stacks with a change since the peak
    std::vector<uint8_t> is_touched_;
};

// One snapshot per marker of `log`, in order, from one pass (`LOG@*`).
std::vector<Snapshot> snapshot_every_marker(const std::string& log);

}  // namespace heapsnap
