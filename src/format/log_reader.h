// Decoding of .hslog files (spec: formats/hslog.md).
//
// The reader maps the file, checks the header, then walks the independent
// zstd frames one after another, decoding each frame's records and handing
// them to a LogVisitor. It keeps only the current frame in memory.
//
// Besides the stream's clock, address and thread, the decoder keeps the
// allocation infos of the format (AllocInfos below): every AllocEvent
// arrives with its info id, function, size and stack even when the record
// carried only the id, and a Free of an info with no live block (or a
// FreeAt of an address with none) is caught as corruption before any
// visitor sees it.
//
// A file that ends inside a frame (crash, SIGKILL, or a reader racing the
// writer) is read up to the last complete frame and reported through
// `truncated()`: that is the normal state of a log whose process died, not
// an error. A frame that is complete but does not decode is corruption and
// throws heapsnap::Error naming the byte offset.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/hslog.h"
#include "util/flat_map.h"

namespace heapsnap {

struct ProcessInfo {
    std::string recorder_version;
    uint64_t pid = 0;
    uint64_t ppid = 0;
    uint64_t uid = 0;
    uint64_t start_realtime_ns = 0;  // wall clock at recorder start
    uint64_t start_ns = 0;           // CLOCK_MONOTONIC at recorder start; event times count from here
    uint64_t page_size = 0;
    hslog::UnwindMode unwind = hslog::UnwindMode::Dwarf;
    uint32_t max_depth = 0;
    std::string exe;
    std::vector<std::string> argv;
    uint64_t sample_bytes = 0;  // 0: every allocation recorded; else Poisson byte sampling (hslog.md)
    bool attached = false;      // the recorder was attached to the running process (version 9)
};

struct ModuleRecord {
    uint32_t id = 0;
    uint64_t time_ns = 0;
    uint64_t load_bias = 0;  // address = load_bias + ELF virtual address
    uint64_t start = 0;      // lowest and highest mapped address of its PT_LOAD segments
    uint64_t end = 0;
    std::string path;
    std::string build_id;  // raw bytes, empty if the ELF has none
};

struct StackFrame {
    uint32_t module = 0;  // hslog::kNoModule when the address is in no known module
    uint64_t vaddr = 0;   // return address as an ELF virtual address of the module

    bool operator==(const StackFrame&) const = default;
};

struct ThreadStartRecord {
    uint64_t time_ns = 0;
    uint32_t thread = 0;  // index, dense, 0 is the main thread
    uint64_t os_tid = 0;
    uint64_t stack_lo = 0;
    uint64_t stack_hi = 0;
};

// Small heap blocks are named by allocation infos (formats/hslog.md,
// "Allocation infos"): the triple (fn, size, stack), numbered 1, 2, 3... in
// order of first appearance. A Free names an info; it frees the newest
// live block of that info. Blocks of hslog::kAddressedAllocSize or more
// have no info and are named by their address.
struct AllocEvent {
    uint64_t time_ns = 0;  // exact to 1 ms (hslog::kEventTimeStep)
    uint32_t thread = 0;
    hslog::AllocFn fn = hslog::AllocFn::Malloc;
    uint32_t info = 0;     // 0 for a block named by its address
    uint64_t address = 0;  // only for blocks of hslog::kAddressedAllocSize or more; else 0
    uint64_t size = 0;
    uint32_t stack = 0;
};

struct FreeEvent {
    uint64_t time_ns = 0;
    uint32_t thread = 0;
    uint32_t info = 0;       // a small block: the newest live block of this info is freed
    uint64_t address = 0;    // else the address of an addressed block, or of an untracked one
    bool untracked = false;  // a block the recorder never saw allocated (FreeUnknown)
    uint64_t usable = 0;     // FreeUnknown: its usable size, 0 if not taken (version 9)
};

struct MmapEvent {
    uint64_t time_ns = 0;
    uint32_t thread = 0;
    uint64_t address = 0;
    uint64_t length = 0;
    uint32_t prot = 0;
    uint32_t flags = 0;
    uint32_t stack = 0;
};

struct MunmapEvent {
    uint64_t time_ns = 0;
    uint32_t thread = 0;
    uint64_t address = 0;
    uint64_t length = 0;
};

// One line of /proc/self/smaps as the recorder captured it at a marker.
struct MapRegion {
    uint64_t start = 0;
    uint64_t end = 0;
    uint8_t perms = 0;  // hslog::RegionPerm bits
    hslog::RegionHint hint = hslog::RegionHint::None;
    uint64_t offset = 0;
    uint64_t inode = 0;
    std::string path;  // empty for anonymous memory; "[heap]", "[stack]", "[vdso]"... as the kernel names them
    uint64_t rss_kb = 0;
    uint64_t pss_kb = 0;
    uint64_t private_dirty_kb = 0;
    uint64_t swap_kb = 0;
};

// mallinfo2() at the marker.
struct MallocStats {
    uint64_t arena = 0;     // non-mmapped bytes obtained from the system
    uint64_t ordblks = 0;   // free chunks
    uint64_t hblks = 0;     // mmapped chunks
    uint64_t hblkhd = 0;    // bytes in mmapped chunks
    uint64_t uordblks = 0;  // bytes in use (non-mmapped)
    uint64_t fordblks = 0;  // free bytes (non-mmapped)
    uint64_t keepcost = 0;  // releasable top bytes
};

// What a marker says besides its address space: what readers keep of
// every marker (without_regions).
struct MarkerFields {
    uint64_t time_ns = 0;
    uint32_t thread = 0;
    uint32_t index = 0;  // 1-based, in order of writing
    hslog::MarkerCause cause = hslog::MarkerCause::User;
    std::string label;
    uint64_t events = 0;      // alloc/free/mmap/munmap events recorded before it
    uint64_t unrecorded = 0;  // events the recorder could not record before it (version 8)
    uint64_t rss_kb = 0;
    uint32_t threads = 0;
    uint64_t recorder_bytes = 0;  // memory the recorder itself holds
    // mallinfo2() at the marker; the exit marker has none (formats/hslog.md).
    bool has_malloc = false;
    MallocStats malloc;
    // Another allocator's own statistics (jemalloc, tcmalloc, mimalloc);
    // never together with has_malloc.
    bool has_allocator = false;
    hslog::AllocatorStats allocator;
};

struct MarkerRecord : MarkerFields {
    std::vector<MapRegion> regions;
};

// The Process fields the log's record and the snapshot's share, in that
// order: recorder version to executable (formats/hslog.md, Process). The
// command line and sample_bytes follow, encoded differently in each.
void read_process_head(codec::Reader& r, ProcessInfo& p);

// A copy of `m` without its regions, for the lists of markers readers
// keep (a marker of a large process holds a million regions).
MarkerRecord without_regions(const MarkerRecord& m);

// A marker's allocator statistics as the log (version 7) and the snapshot
// (version 4) both store them: a byte (hslog::MarkerStats), then for 1 the
// seven mallinfo2 varints, for 2 another allocator's (hslog.h,
// put_allocator_stats); any other byte, or an unknown allocator kind or
// field, invalidates `r`. Sets m.has_malloc/m.malloc or
// m.has_allocator/m.allocator.
void read_malloc_stats(codec::Reader& r, MarkerRecord& m);
// The same encoding, written (snapshot files).
void write_malloc_stats(std::vector<uint8_t>& out, const MarkerRecord& m);

struct EndRecord {
    uint64_t time_ns = 0;
    hslog::EndReason reason = hslog::EndReason::Exit;
    uint64_t events = 0;
    uint64_t unrecorded = 0;  // version 8
};

// Receives decoded records in stream order. Defaults ignore the record.
class LogVisitor {
public:
    virtual ~LogVisitor() = default;
    virtual void on_process(const ProcessInfo&) {}
    virtual void on_module_load(const ModuleRecord&) {}
    virtual void on_module_unload(uint32_t /*module*/, uint64_t /*time_ns*/) {}
    virtual void on_stack(uint32_t /*stack*/, std::span<const StackFrame> /*frames*/) {}
    // A Stack record's `count` frames as the log encodes them, each its
    // module id and its address as varints (formats/hslog.md, Stack),
    // checked well formed. By default decoded for on_stack; the replay
    // keeps them as they are (replay/stacks.h).
    virtual void on_stack_record(uint32_t stack, uint32_t count, std::span<const uint8_t> frames);
    virtual void on_thread_start(const ThreadStartRecord&) {}
    virtual void on_thread_exit(uint32_t /*thread*/, uint64_t /*time_ns*/) {}
    virtual void on_alloc(const AllocEvent&) {}
    virtual void on_free(const FreeEvent&) {}
    virtual void on_mmap(const MmapEvent&) {}
    virtual void on_munmap(const MunmapEvent&) {}
    virtual void on_marker(const MarkerRecord&) {}
    virtual void on_end(const EndRecord&) {}

    // A visitor may end the read after any record (e.g. at the moment a
    // snapshot is wanted); the reader checks this after every record.
    void request_stop() { stop_ = true; }
    bool stop_requested() const { return stop_; }

private:
    bool stop_ = false;
};

// The frames of a Stack record (LogVisitor::on_stack_record) into `out`.
void decode_stack_frames(uint32_t count, std::span<const uint8_t> frames, std::vector<StackFrame>& out);

// What the reader knows of one allocation info, and how many of its blocks
// are live.
struct AllocInfo {
    uint64_t size = 0;
    uint32_t stack = 0;
    uint32_t live = 0;
    hslog::AllocFn fn = hslog::AllocFn::Malloc;
};

// The allocation infos every reader keeps in step with the writer
// (formats/hslog.md, "Allocation infos"), and the addresses of the live
// addressed blocks. It knows which frees are possible, so a Free of an info
// with no live block is caught as corruption. Memory: 24 bytes per info
// (distinct triples, like stacks) and one table entry per live addressed
// block.
class AllocInfos {
public:
    AllocInfos() { infos_.emplace_back(); }  // id 0 is never an info

    // A full Alloc: defines the next info id, with one live block; 0 once
    // kMaxInfos are defined (no recorder gets near: each is a distinct
    // triple, 24 bytes here).
    static constexpr size_t kMaxInfos = (size_t{1} << 30) - 1;
    uint32_t define(hslog::AllocFn fn, uint64_t size, uint32_t stack) {
        if (infos_.size() > kMaxInfos) [[unlikely]]
            return 0;
        infos_.push_back(AllocInfo{size, stack, 1, fn});
        return static_cast<uint32_t>(infos_.size() - 1);
    }
    // An AllocInfo: nullptr if `id` names no info (a corrupt log).
    const AllocInfo* alloc(uint64_t id) {
        if (id == 0 || id >= infos_.size() || infos_[id].live == UINT32_MAX) [[unlikely]]
            return nullptr;
        infos_[id].live++;
        return &infos_[id];
    }
    // False if `id` has no live block (a corrupt log).
    bool free(uint64_t id) {
        if (id >= infos_.size() || infos_[id].live == 0) [[unlikely]]
            return false;
        infos_[id].live--;
        return true;
    }
    // Address space for the infos a log of `file_bytes` bytes may define,
    // so that the table does not grow by copying itself: a new info is an
    // Alloc record of a new triple, and none seen has taken fewer than 16
    // bytes of the file. The pages are faulted in only as infos are
    // defined.
    void reserve_for(uint64_t file_bytes) {
        infos_.reserve(static_cast<size_t>(std::min<uint64_t>(file_bytes / 16, kMaxReserved)));
    }
    static constexpr size_t kMaxReserved = size_t{1} << 22;

    // False if a live addressed block already has `address` (the writer
    // frees a block whose free it missed before reusing its address).
    bool alloc_at(uint64_t address) { return addressed_.insert(address, 1); }
    // False if no live addressed block has `address`.
    bool free_at(uint64_t address) { return addressed_.erase(address, nullptr); }

    // The state a checkpoint keeps. Entry 0 of infos() is a placeholder.
    const std::vector<AllocInfo>& infos() const { return infos_; }
    std::vector<AllocInfo> take_infos() { return std::move(infos_); }
    std::vector<uint64_t> addressed() const;
    // False if the state is inconsistent (an address twice, or 0).
    bool restore(std::vector<AllocInfo> infos, const std::vector<uint64_t>& addressed);

private:
    std::vector<AllocInfo> infos_;
    FlatMap<uint8_t> addressed_;
};

// Where a read can pick up again: the start of a frame, with the stream
// state (clock, address, thread, allocation infos) that the records before
// it left.
struct StreamPosition {
    uint64_t offset = 0;
    uint64_t time_ns = 0;
    uint64_t address = 0;
    uint32_t thread = 0;
    uint64_t stacks = 0;                           // Stack records before it
    uint32_t max_stack = 0;                        // the highest stack id they defined
    std::vector<AllocInfo> infos = {AllocInfo{}};  // AllocInfos state
    std::vector<uint64_t> addressed;
};

struct ReadSummary {
    uint32_t version = 0;  // of the log's format (its header)
    uint64_t frames = 0;
    uint64_t records = 0;
    uint64_t events = 0;
    uint64_t file_bytes = 0;
    uint64_t bytes_read = 0;  // offset of the end of the last complete frame
    bool truncated = false;   // the file ended inside a frame
    bool complete = false;    // an End record was read
    bool stopped = false;     // the visitor stopped the read
    // When the visitor stopped on the last record of a frame: the position
    // after it, from which a later read can resume (a checkpoint).
    bool resumable = false;
    StreamPosition resume;
    // When the read went through every complete frame (nothing stopped
    // it) and decoded at least one: the position after the last, from
    // which a read of the same log grown since can go on.
    bool end_resumable = false;
    StreamPosition end;
};

// Stack ids bound what a reader allocates per stack (replay keeps a table
// indexed by id), so a hostile id must not make it allocate gigabytes: a
// Stack record's id may exceed the number of Stack records before it by at
// most this much, and an event may only name an id up to the highest
// defined (the recorder numbers stacks 1, 2, 3... in the order it defines
// them, a fork child's log included; formats/hslog.md, Corruption).
inline constexpr uint32_t kStackIdSlack = 1u << 16;

// A log to read. `path` names it in every message. `fd`, unless -1, is the
// log already open, and the log is read through it, never through the
// path: a running process's recorder hands its log's descriptor to
// `heapsnap snapshot PID` (formats/control.md), whose caller may not be
// able to open the path, and whose path could name another file by now.
// The descriptor stays the caller's.
struct LogFile {
    std::string path;
    int fd = -1;
};

// Reads the log from the start and feeds `visitor`. Throws heapsnap::Error
// for a file that is not a heapsnap log, has an unsupported version, or
// holds a corrupt frame. read_log_as (format/log_decoder.h) does the same
// for a visitor class known at compile time, and continues a read from a
// position an earlier read reported as resumable.
ReadSummary read_log(const LogFile& log, LogVisitor& visitor);
// Whether `path` is a regular file that starts with a log's magic.
bool looks_like_log(const std::string& path);
ReadSummary read_log(const std::string& path, LogVisitor& visitor);

}  // namespace heapsnap
