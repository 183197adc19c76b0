#include "replay/replay.h"

#include <algorithm>

#include "format/log_decoder.h"

namespace heapsnap {

void Replay::on_process(const ProcessInfo& p) {
    process_ = p;
    last_time_ns_ = p.start_ns;
}

void Replay::on_module_load(const ModuleRecord& m) {
    auto [it, fresh] = modules_.insert_or_assign(m.id, SnapshotModule{m, true});
    if (fresh) charge_.take(160 + m.path.size() + m.build_id.size(), "modules");
}

void Replay::on_module_unload(uint32_t module, uint64_t) {
    if (auto it = modules_.find(module); it != modules_.end()) it->second.loaded = false;
}

void Replay::on_stack(uint32_t stack, std::span<const StackFrame> frames) {
    charge_stack(static_cast<uint32_t>(frames.size()));
    stacks_.set(stack, frames);
}

void Replay::on_stack_record(uint32_t stack, uint32_t count, std::span<const uint8_t> frames) {
    charge_stack(count);
    stacks_.set_encoded(stack, count, frames);
}

void Replay::on_thread_start(const ThreadStartRecord& t) {
    note_time(t.time_ns);
    auto [it, fresh] = threads_.insert_or_assign(t.thread, t);
    if (fresh) charge_.take(96, "threads");
}

void Replay::on_thread_exit(uint32_t thread, uint64_t time_ns) {
    note_time(time_ns);
    threads_.erase(thread);
}

void Replay::grow_stack_totals(uint32_t stack) {
    size_t size = std::max<size_t>(stack + 1, per_stack_.size() * 2);
    charge_.take((size - per_stack_.size()) * sizeof(StackTotals) * 2, "stacks");
    per_stack_.grow(size);
}

void Replay::grow_infos(uint32_t info) {
    // Ids come from the reader, which numbers them 1, 2, 3... (AllocInfos).
    size_t size = std::max<size_t>(info + 1, infos_.size() * 2);
    charge_.take((size - infos_.size()) * sizeof(InfoState) * 2, "allocation infos");
    infos_.grow(size);
}

void Replay::first_sight(InfoState& s, uint64_t size, uint32_t stack) {
    s.size = size;
    s.stack = stack;
    s.whole = static_cast<uint32_t>(sample_weight_floor(size, process_.sample_bytes));
}

// A block named by its address: its size, stack and weight to the side
// table, its address to the address table.
void Replay::add_addressed(uint32_t slot, uint64_t address, uint64_t size, uint32_t stack, uint32_t weight) {
    LiveBlock& b = blocks_[slot];
    b.tag = LiveBlock::kAddressedBlock;
    b.below = 0;
    addressed_.insert(slot, AddressedBlock{size, stack, weight});
    addressed_charge_.reach(addressed_.size());
    bool fresh = false;
    uint32_t* held = block_address_.slot(address, &fresh);
    // Cannot happen with the reader's AllocInfos (the writer frees a
    // block before reusing its address); a checkpoint could say so.
    if (!fresh) [[unlikely]]
        remove_block(*held);
    *held = slot;
}

void Replay::free_addressed(const FreeEvent& e) {
    uint32_t slot = 0;
    if (!e.untracked) block_address_.erase(e.address, &slot);
    if (!slot) {
        if (e.usable) {
            totals_.freed_before_blocks++;
            totals_.freed_before_bytes += e.usable;
        } else {
            totals_.untracked_frees++;
        }
        return;
    }
    remove_block(slot);
}

// Unmaps [start, end) from the tracked mappings, splitting partially
// covered ones; the pieces keep their stack and time.
void Replay::remove_mapping_range(uint64_t start, uint64_t end) {
    std::vector<std::pair<uint64_t, LiveMapping>> hit;
    auto it = mappings_.upper_bound(start);
    if (it != mappings_.begin()) --it;
    for (; it != mappings_.end() && it->first < end; ++it)
        if (it->first + it->second.length > start) hit.emplace_back(*it);
    for (const auto& [m_start, m] : hit) {
        mappings_.erase(m_start);
        StackTotals& t = stack_totals(m.stack);
        t.mmap_bytes -= m.length;
        t.mmap_regions--;
        totals_.mmap_bytes -= m.length;
        totals_.mmap_regions--;
        auto keep = [&](uint64_t s, uint64_t e) {
            if (e <= s) return;
            mappings_.emplace(s, LiveMapping{e - s, m.time_ns, m.stack});
            t.mmap_bytes += e - s;
            t.mmap_regions++;
            totals_.mmap_bytes += e - s;
            totals_.mmap_regions++;
        };
        uint64_t m_end = m_start + m.length;
        keep(m_start, std::min(start, m_end));
        keep(std::max(end, m_start), m_end);
    }
}

void Replay::on_mmap(const MmapEvent& e) {
    note_time(e.time_ns);
    totals_.events++;
    totals_.allocations++;
    if (!e.length) return;
    remove_mapping_range(e.address, e.address + e.length);  // MAP_FIXED over a tracked mapping
    mappings_.emplace(e.address, LiveMapping{e.length, e.time_ns, e.stack});
    mappings_charge_.reach(mappings_.size());
    StackTotals& t = stack_totals(e.stack);
    t.mmap_bytes += e.length;
    t.mmap_regions++;
    totals_.mmap_bytes += e.length;
    totals_.mmap_regions++;
}

void Replay::on_munmap(const MunmapEvent& e) {
    note_time(e.time_ns);
    totals_.events++;
    if (e.length) remove_mapping_range(e.address, e.address + e.length);
}

void Replay::save_state(ByteBuffer& o) const {
    put_process(o, process_);
    const SnapshotTotals& t = totals_;
    for (uint64_t v :
         {t.live_bytes, t.live_blocks, t.mmap_bytes, t.mmap_regions, t.events, t.allocations, t.untracked_frees,
          t.peak_bytes, t.peak_time_ns, t.freed_before_blocks, t.freed_before_bytes, last_time_ns_})
        o.varint(v);
    o.varint(modules_.size());
    for (const auto& [id, m] : modules_) put_module(o, m);
    o.varint(threads_.size());
    for (const auto& [index, th] : threads_) put_thread(o, th);
    o.varint(stacks_.size());
    stacks_.for_each([&](uint32_t id, std::span<const StackFrame> frames) { put_stack(o, id, frames); });
    // Per info, oldest first, so that loading re-adds them in an order
    // that rebuilds every info's LIFO chain; then the addressed blocks.
    uint64_t entries = 0;
    for_each_block([&](uint32_t, const BlockView&) { entries++; });
    o.varint(entries);
    std::vector<uint32_t> chain;
    for (uint32_t info = 1; info < infos_.size(); ++info) {
        chain.clear();
        for (uint32_t slot = infos_[info].top; slot; slot = blocks_[slot].below) chain.push_back(slot);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
            BlockView b = block(*it);
            for (uint64_t v : {uint64_t{info}, uint64_t{0}, b.size, b.time_ns, uint64_t{b.stack}, uint64_t{b.weight}})
                o.varint(v);
        }
    }
    block_address_.for_each([&](uint64_t address, uint32_t slot) {
        BlockView b = block(slot);
        for (uint64_t v : {uint64_t{0}, address, b.size, b.time_ns, uint64_t{b.stack}, uint64_t{b.weight}}) o.varint(v);
    });
    o.varint(mappings_.size());
    for (const auto& [start, m] : mappings_) {
        o.varint(start);
        o.varint(m.length);
        o.varint(m.time_ns);
        o.varint(m.stack);
    }
}

void Replay::load_state(codec::Reader& r) {
    get_process(r, process_);
    SnapshotTotals& t = totals_;
    for (uint64_t* v :
         {&t.live_bytes, &t.live_blocks, &t.mmap_bytes, &t.mmap_regions, &t.events, &t.allocations, &t.untracked_frees,
          &t.peak_bytes, &t.peak_time_ns, &t.freed_before_blocks, &t.freed_before_bytes, &last_time_ns_})
        *v = r.varint();
    for (uint64_t n = r.count(8); n-- && r.ok();) {
        SnapshotModule m;
        get_module(r, m);
        modules_[m.record.id] = m;
    }
    for (uint64_t n = r.count(5); n-- && r.ok();) {
        ThreadStartRecord th;
        get_thread(r, th);
        threads_[th.thread] = th;
    }
    for (uint64_t n = r.count(2); n-- && r.ok();) {
        std::vector<StackFrame> frames;
        uint32_t id = get_stack(r, frames);
        if (r.ok()) on_stack(id, frames);
    }
    // Per-stack totals follow from the live blocks and mappings; the live
    // totals were read above and are recounted by add_block.
    uint64_t live_bytes = t.live_bytes, live_blocks = t.live_blocks;
    t.live_bytes = t.live_blocks = 0;
    for (uint64_t n = r.count(6); n-- && r.ok();) {
        uint64_t info = r.varint(), address = r.varint();
        uint64_t size = r.varint(), time_ns = r.varint();
        auto stack = static_cast<uint32_t>(r.varint());
        uint64_t weight = r.varint();
        // A block has an info or an address, never both; info ids are
        // bounded like stack ids, so a damaged checkpoint cannot make the
        // info table huge.
        if ((info == 0) == (address == 0) || info > t.events || info > LiveBlock::kInfoMask || weight == 0 ||
            weight > UINT32_MAX || !r.ok()) {
            r.invalidate();
            break;
        }
        // An info's blocks share its size and stack, and their weights its
        // whole part (or one more).
        if (info) {
            InfoState& s = info_state(static_cast<uint32_t>(info), size, stack);
            if (s.size != size || s.stack != stack || weight < s.whole || weight > uint64_t{s.whole} + 1) {
                r.invalidate();
                break;
            }
        }
        add_block(static_cast<uint32_t>(info), address, size, time_ns, stack, static_cast<uint32_t>(weight));
    }
    if (t.live_bytes != live_bytes || t.live_blocks != live_blocks) r.invalidate();
    for (uint64_t n = r.count(4); n-- && r.ok();) {
        uint64_t start = r.varint();
        LiveMapping m{r.varint(), r.varint(), static_cast<uint32_t>(r.varint())};
        mappings_.emplace(start, m);
        StackTotals& st = stack_totals(m.stack);
        st.mmap_bytes += m.length;
        st.mmap_regions++;
    }
}

Snapshot Replay::snapshot_header(const MarkerRecord& marker, bool has_marker_data) const {
    Snapshot s;
    s.process = process_;
    s.marker = marker;
    s.has_marker_data = has_marker_data;
    s.totals = totals_;
    for (const auto& [id, m] : modules_) s.modules.push_back(m);
    for (const auto& [index, t] : threads_) s.threads.push_back(t);
    return s;
}

Snapshot Replay::snapshot(const MarkerRecord& marker, bool has_marker_data, bool with_stacks) const {
    // A command keeps its snapshots to the end (a trend keeps one per
    // marker): charged for good, before anything is copied.
    uint64_t held = marker.regions.size() * sizeof(MapRegion);
    for (uint32_t id = 0; id < per_stack_.size(); ++id)
        if (per_stack_[id].blocks || per_stack_[id].mmap_regions)
            held += 2 * sizeof(SnapshotEntry) +
                    (with_stacks ? kSnapshotStackBytes + stacks_.depth(id) * sizeof(StackFrame) : 0);
    budget_take_memory(held, "snapshots");
    Snapshot s = snapshot_header(marker, has_marker_data);

    // Age of the live blocks per stack: one pass over the live set, which a
    // snapshot at every marker makes again and again (util/read_budget.h).
    budget_take_volume((blocks_.size() + per_stack_.size() + mappings_.size()) / 2);
    struct Age {
        uint64_t oldest = UINT64_MAX;
        uint64_t newest = 0;
    };
    std::vector<Age> heap_age(per_stack_.size()), map_age(per_stack_.size());
    auto note = [](Age& a, uint64_t t) {
        a.oldest = std::min(a.oldest, t);
        a.newest = std::max(a.newest, t);
    };
    for_each_block([&](uint32_t, const BlockView& b) {
        if (b.stack < heap_age.size()) note(heap_age[b.stack], b.time_ns);
    });
    for (const auto& [start, m] : mappings_)
        if (m.stack < map_age.size()) note(map_age[m.stack], m.time_ns);

    auto since_start = [&](uint64_t t) { return t >= process_.start_ns ? t - process_.start_ns : 0; };
    for (uint32_t id = 0; id < per_stack_.size(); ++id) {
        const StackTotals& t = per_stack_[id];
        if (t.blocks)
            s.entries.push_back(SnapshotEntry{id, EntryKind::Heap, t.bytes, t.blocks, since_start(heap_age[id].oldest),
                                              since_start(heap_age[id].newest)});
        if (t.mmap_regions)
            s.entries.push_back(SnapshotEntry{id, EntryKind::Mmap, t.mmap_bytes, t.mmap_regions,
                                              since_start(map_age[id].oldest), since_start(map_age[id].newest)});
        if (with_stacks && (t.blocks || t.mmap_regions)) s.stacks[id] = stacks_.copy(id);
    }

    // What the recorder knows that /proc does not: which regions hold live
    // heap blocks (those the log has addresses of: kAddressedAllocSize and
    // more, so mmapped chunks and the arenas holding large blocks), which
    // are thread stacks.
    if (has_marker_data) {
        std::vector<uint64_t> addresses;
        addresses.reserve(block_address_.size());
        block_address_.for_each([&](uint64_t address, uint32_t) { addresses.push_back(address); });
        std::sort(addresses.begin(), addresses.end());
        for (MapRegion& r : s.marker.regions) {
            if (r.hint != hslog::RegionHint::None) continue;
            auto it = std::lower_bound(addresses.begin(), addresses.end(), r.start);
            if (it != addresses.end() && *it < r.end) r.hint = hslog::RegionHint::Heap;
            for (const auto& [index, t] : threads_)
                if (t.stack_lo < r.end && r.start < t.stack_hi) r.hint = hslog::RegionHint::ThreadStack;
        }
    }
    return s;
}

// ---- History -----------------------------------------------------------------

void AllocationTimeline::add(uint64_t offset_ns, uint64_t count) {
    uint64_t slice = offset_ns / slice_ns;
    while (slice >= kSlices) {
        std::vector<uint64_t> merged((counts.size() + 1) / 2, 0);
        for (size_t i = 0; i < counts.size(); ++i) merged[i / 2] += counts[i];
        counts = std::move(merged);
        slice_ns *= 2;
        slice = offset_ns / slice_ns;
    }
    if (slice >= counts.size()) counts.resize(slice + 1, 0);
    counts[slice] += count;
}

bool HistoryReplay::admit() {
    if (applied_ < stop_after_) return true;
    request_stop();
    return false;
}

void HistoryReplay::applied() {
    if (++applied_ == stop_after_) request_stop();
}

HistoryReplay::ThreadState& HistoryReplay::thread_state(uint32_t thread) {
    if (!cached_state_ || cached_thread_ != thread) {
        auto [it, fresh] = threads_state_.try_emplace(thread);
        if (fresh) charge_.take(64, "threads");
        cached_state_ = &it->second;  // references into an unordered_map stay valid
        cached_thread_ = thread;
    }
    return *cached_state_;
}

void HistoryReplay::grow_activity(uint32_t stack) {
    size_t size = std::max<size_t>(stack + 1, activity_.size() * 2);
    charge_.take((size - activity_.size()) * sizeof(StackActivity) * 2, "stacks");
    activity_.resize(size);
}

void HistoryReplay::settle(ThreadState& t, bool temporary) {
    if (!t.pending) return;
    t.pending = false;
    if (!temporary) return;
    temporary_ += t.pending_weight;
    if (t.pending_stack >= activity_.size()) grow_activity(t.pending_stack);
    activity_[t.pending_stack].temporary += t.pending_weight;
}

void HistoryReplay::change(uint32_t stack, int64_t bytes, int64_t blocks) {
    if (stack >= since_peak_.size()) {
        size_t n = std::max<size_t>(stack + 1, since_peak_.size() * 2);
        charge_.take((n - since_peak_.size()) * (2 * sizeof(Change) + 1 + sizeof(uint32_t)) * 2, "stacks");
        since_peak_.resize(n);
        at_peak_.resize(n);
        is_touched_.resize(n, 0);
    }
    since_peak_[stack].bytes += bytes;
    since_peak_[stack].blocks += blocks;
    if (!is_touched_[stack]) {
        is_touched_[stack] = 1;
        touched_.push_back(stack);
    }
}

void HistoryReplay::fold_into_peak() {
    for (uint32_t stack : touched_) {
        at_peak_[stack].bytes += since_peak_[stack].bytes;
        at_peak_[stack].blocks += since_peak_[stack].blocks;
        since_peak_[stack] = Change{};
        is_touched_[stack] = 0;
    }
    touched_.clear();
    peak_bytes_ = totals().live_bytes;
    peak_blocks_ = totals().live_blocks;
    peak_time_ns_ = totals().peak_time_ns;
}

void HistoryReplay::on_alloc(const AllocEvent& e) {
    if (!admit()) return;
    ThreadState& t = thread_state(e.thread);
    settle(t, e.fn != hslog::AllocFn::Realloc && e.fn != hslog::AllocFn::Reallocarray);
    Replay::on_alloc(e);
    BlockView b = block(last_added());
    change(e.stack, static_cast<int64_t>(b.bytes()), b.weight);
    if (totals().peak_bytes > peak_bytes_) fold_into_peak();
    t.last_alloc = last_added();
    heap_allocations_ += b.weight;
    if (e.stack >= activity_.size()) grow_activity(e.stack);
    activity_[e.stack].allocations += b.weight;
    timeline_.add(e.time_ns >= process_.start_ns ? e.time_ns - process_.start_ns : 0, b.weight);
    applied();
}

void HistoryReplay::on_free(const FreeEvent& e) {
    if (!admit()) return;
    ThreadState& t = thread_state(e.thread);
    settle(t, true);
    if (uint32_t slot = slot_freed_by(e)) {
        BlockView b = block(slot);
        if (t.last_alloc == slot) {
            t.pending = true;
            t.pending_stack = b.stack;
            t.pending_weight = b.weight;
            t.last_alloc = 0;
        }
        change(b.stack, -static_cast<int64_t>(b.bytes()), -static_cast<int64_t>(b.weight));
    }
    Replay::on_free(e);
    applied();
}

void HistoryReplay::on_mmap(const MmapEvent& e) {
    if (!admit()) return;
    Replay::on_mmap(e);
    timeline_.add(e.time_ns >= process_.start_ns ? e.time_ns - process_.start_ns : 0);
    applied();
}

void HistoryReplay::on_munmap(const MunmapEvent& e) {
    if (!admit()) return;
    Replay::on_munmap(e);
    applied();
}

void HistoryReplay::on_marker(const MarkerRecord& m) {
    if (!wanted_ || at_marker_ || !wanted_(m)) return;
    at_marker_ = snapshot(m, true, false);  // its stacks: stack_table(), which the history keeps
    request_stop();
}

void HistoryReplay::finish() {
    for (auto& [thread, t] : threads_state_) settle(t, true);
}

SizeHistogram HistoryReplay::live_sizes() const {
    SizeHistogram h;
    for_each_block([&](uint32_t, const BlockView& b) { h.add(b.size, b.weight); });
    return h;
}

Snapshot HistoryReplay::peak(bool with_stacks) const {
    MarkerRecord m;
    m.time_ns = peak_time_ns_;
    m.label = "peak";
    uint64_t held = 0;  // charged as snapshot() charges its copies
    for (uint32_t id = 0; id < at_peak_.size(); ++id)
        if (at_peak_[id].blocks)
            held += sizeof(SnapshotEntry) +
                    (with_stacks ? kSnapshotStackBytes + stack_table().depth(id) * sizeof(StackFrame) : 0);
    budget_take_memory(held, "snapshots");
    Snapshot s = snapshot_header(m, false);
    s.totals.live_bytes = peak_bytes_;
    s.totals.live_blocks = peak_blocks_;
    s.totals.mmap_bytes = 0;
    s.totals.mmap_regions = 0;
    for (uint32_t id = 0; id < at_peak_.size(); ++id) {
        if (!at_peak_[id].blocks) continue;
        s.entries.push_back(SnapshotEntry{id, EntryKind::Heap, static_cast<uint64_t>(at_peak_[id].bytes),
                                          static_cast<uint64_t>(at_peak_[id].blocks), 0, 0});
        if (with_stacks) s.stacks[id] = stack_table().copy(id);
    }
    return s;
}

std::vector<Snapshot> snapshot_every_marker(const std::string& log) {
    class EveryMarker final : public Replay {
    public:
        void on_marker(const MarkerRecord& m) override { snapshots.push_back(snapshot(m, true)); }
        std::vector<Snapshot> snapshots;
    } replay;
    read_log_as(log, replay);
    for (Snapshot& s : replay.snapshots) s.source = log;
    return std::move(replay.snapshots);
}

}  // namespace heapsnap
