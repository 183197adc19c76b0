// Decoding of .hslog files (spec: formats/hslog.md).
//
// The reader maps the file, checks the header, then walks the independent
// zstd frames one after another, decoding each frame's records and handing
// them to a LogVisitor. It keeps only the current frame in memory.
//
// Besides the stream's clock, address and thread, the decoder runs the
// block-id allocator of the format (BlockIds below), so every AllocEvent
// arrives with the id of its block and a Free of an id that is not live is
// caught as corruption before any visitor sees it.
//
// A file that ends inside a frame (crash, SIGKILL, or a reader racing the
// writer) is read up to the last complete frame and reported through
// `truncated()`: that is the normal state of a log whose process died, not
// an error. A frame that is complete but does not decode is corruption and
// throws heapsnap::Error naming the byte offset.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/hslog.h"

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

// Heap blocks are named by block ids (formats/hslog.md, "Block ids"):
// small integers from 1 up, a freed id reused last-in first-out. The reader
// computes every Alloc's id; a Free names one.
struct AllocEvent {
    uint64_t time_ns = 0;  // exact to 1 ms (hslog::kEventTimeStep)
    uint32_t thread = 0;
    hslog::AllocFn fn = hslog::AllocFn::Malloc;
    uint32_t block = 0;
    uint64_t address = 0;  // only for blocks of hslog::kAddressedAllocSize or more; else 0
    uint64_t size = 0;
    uint32_t stack = 0;
};

struct FreeEvent {
    uint64_t time_ns = 0;
    uint32_t thread = 0;
    uint32_t block = 0;    // 0: a block the recorder never saw allocated (an untracked free)
    uint64_t address = 0;  // that block's address; 0 when `block` is set
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

struct MarkerRecord {
    uint64_t time_ns = 0;
    uint32_t thread = 0;
    uint32_t index = 0;  // 1-based, in order of writing
    hslog::MarkerCause cause = hslog::MarkerCause::User;
    std::string label;
    uint64_t events = 0;  // alloc/free/mmap/munmap events recorded before it
    uint64_t rss_kb = 0;
    uint32_t threads = 0;
    uint64_t recorder_bytes = 0;  // memory the recorder itself holds
    MallocStats malloc;
    std::vector<MapRegion> regions;
};

struct EndRecord {
    uint64_t time_ns = 0;
    hslog::EndReason reason = hslog::EndReason::Exit;
    uint64_t events = 0;
};

// Receives decoded records in stream order. Defaults ignore the record.
class LogVisitor {
public:
    virtual ~LogVisitor() = default;
    virtual void on_process(const ProcessInfo&) {}
    virtual void on_module_load(const ModuleRecord&) {}
    virtual void on_module_unload(uint32_t /*module*/, uint64_t /*time_ns*/) {}
    virtual void on_stack(uint32_t /*stack*/, std::span<const StackFrame> /*frames*/) {}
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

// The block-id allocator every reader runs in step with the writer
// (formats/hslog.md, "Block ids"). It also knows which ids are live, so a
// Free of an id that is not is caught as corruption. Memory: 5 bytes per
// id ever handed out, i.e. bounded by the peak live set.
class BlockIds {
public:
    uint32_t alloc() {
        if (!free_.empty()) {
            uint32_t id = free_.back();
            free_.pop_back();
            live_[id] = 1;
            return id;
        }
        live_.push_back(1);
        return next_++;
    }
    // False if `id` is not live (a corrupt log).
    bool free(uint64_t id) {
        if (id >= next_ || !live_[id]) return false;
        live_[id] = 0;
        free_.push_back(static_cast<uint32_t>(id));
        return true;
    }

    // The state a checkpoint keeps: the next fresh id and the free list.
    uint32_t next() const { return next_; }
    const std::vector<uint32_t>& free_list() const { return free_; }
    // False if the state is inconsistent (an id twice, or out of range).
    bool restore(uint32_t next, const std::vector<uint32_t>& free_list);

private:
    uint32_t next_ = 1;
    std::vector<uint32_t> free_;  // the next id to reuse last
    std::vector<uint8_t> live_ = {0};  // by id; id 0 is never live
};

// Where a read can pick up again: the start of a frame, with the stream
// state (clock, address, thread, block ids) that the records before it left.
struct StreamPosition {
    uint64_t offset = 0;
    uint64_t time_ns = 0;
    uint64_t address = 0;
    uint32_t thread = 0;
    uint64_t stacks = 0;     // Stack records before it
    uint32_t max_stack = 0;  // the highest stack id they defined
    uint32_t next_block = 1;  // BlockIds state
    std::vector<uint32_t> free_blocks;
};

struct ReadSummary {
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
};

// Stack ids bound what a reader allocates per stack (replay keeps a table
// indexed by id), so a hostile id must not make it allocate gigabytes: a
// Stack record's id may exceed the number of Stack records before it by at
// most this much, and an event may only name an id up to the highest
// defined (the recorder numbers stacks 1, 2, 3... in the order it defines
// them, a fork child's log included; formats/hslog.md, Corruption).
inline constexpr uint32_t kStackIdSlack = 1u << 16;

// Reads `path` from the start and feeds `visitor`. Throws heapsnap::Error for
// a file that is not a heapsnap log, has an unsupported version, or holds a
// corrupt frame.
ReadSummary read_log(const std::string& path, LogVisitor& visitor);

// Continues a read at `from` (a position an earlier read reported as
// resumable), for a visitor that already holds the state up to there,
// including the process record.
ReadSummary read_log_from(const std::string& path, LogVisitor& visitor, const StreamPosition& from);

}  // namespace heapsnap
