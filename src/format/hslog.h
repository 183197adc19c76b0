// The .hslog record vocabulary: tags, field order and the encoders the
// recorder uses. The byte-level specification is formats/hslog.md; keep the
// two in step (bump kLogVersion when a reader of the old version could not
// read the new stream).
//
// Shape of the stream, and why (version 6):
// - A 16-byte header (magic, version) and then independent zstd frames.
//   Each frame holds whole records only, so a file cut anywhere (crash,
//   SIGKILL, a reader racing the writer) reads back up to its last complete
//   frame. Streaming compression with a dictionary carried across frames
//   would compress better but would make one bad byte lose the rest.
// - Events are written already merged into one time order (the writer
//   merges the per-thread buffers), so a reader replays sequentially: no
//   sort, no lookahead, memory bounded by the live set.
// - Small heap blocks are named by their *allocation info*, not by an
//   address or a block id: the triple (AllocFn, size, stack). The first
//   Alloc of a triple carries it and implicitly defines the next info id
//   (1, 2, 3...); a later Alloc of the same triple is an AllocInfo with just
//   the id, and a Free names the info id of the freed block. The reader
//   frees the most recently allocated live block of that info (last-in
//   first-out within the info). The same code allocating and freeing the
//   same kind of block writes the same bytes every time, which is what
//   zstd needs: version 2's frees named reused block ids, whose sequence
//   never repeats (formats/hslog.md, "Version 3").
//   Per-call-site totals stay exact; which block of a site died is
//   assumed LIFO (formats/hslog.md, "Allocation infos").
// - Blocks of kAddressedAllocSize or more keep their address (AllocAt,
//   FreeAt), so their frees are exact and the address-space summary can
//   call mmapped chunks heap; Mmap and Munmap keep theirs (partial unmaps
//   need them), as do frees of blocks the writer never saw allocated.
// - Time is coarse: a TIME record advances the stream time only when an
//   event is 1 ms or more past it, so event times are exact to 1 ms and the
//   per-event jitter that broke zstd's long matches is gone (heaptrack
//   writes time every 10 ms). Markers, thread starts/exits and End keep an
//   exact dt of their own.
// - The allocating function is folded into the Alloc tag (0x30 + fn), one
//   byte less per record before zstd.
// - Stacks are interned by the recorder; a STACK record defines an id once
//   and always precedes the first event that uses it.
// - Version 4: an AllocInfo or Free of an info id below 16384 is two bytes,
//   the tag's top bits saying which record and its low 6 bits with the next
//   byte the id (short records, 0x80-0xff). Version 3's tag byte plus a
//   2-byte varint spread an id over three byte positions of very different
//   distributions (the varint's second byte takes a few dozen values),
//   which zstd's byte-wise Huffman stage codes poorly (formats/hslog.md,
//   "Version 4"). Larger ids keep the long form.
// - Version 5: a Marker's mallinfo2() numbers are preceded by a presence
//   byte, and the exit marker leaves them out. mallinfo2 walks every free
//   chunk malloc holds, which at exit can cost a program with many free
//   chunks as much as recording it.
// - Version 6: a Thread record for a thread index below 32 is one byte,
//   the index in the tag (ShortThread, 0x50-0x6f). Two threads that
//   allocate at once switch every few events (alloc_bench: before one
//   event in seven), and version 5's tag plus varint there slowed zstd
//   down and grew the log (formats/hslog.md, "Version 6").
// - Version 7: a Marker's statistics byte may say 2, the statistics of
//   another allocator than glibc's (jemalloc, tcmalloc, mimalloc: its kind,
//   which fields it gives, then those).
// - Version 8: Marker and End say how many events the recorder could not
//   record up to then (formats/hslog.md, "Unrecorded events"): a varint
//   after `events`.
// - Version 9: markers of cause pause, resume and threshold, and the
//   paused site: while stack recording is paused (heapsnap pause, run
//   --paused, --stacks-after) allocations are recorded exactly but not
//   unwound, and name one stack whose only frame is (kNoModule, 0), which
//   readers show as "(allocated while paused)". The encoding is version
//   8's.
// - Version 10: a recorder attached to a running process (heapsnap attach)
//   says so in the Process record (`attached`, a byte at its end), and a
//   FreeUnknown carries the freed block's usable size (`usable`, a varint
//   after the address: malloc_usable_size taken before the free, 0 when
//   not taken), so blocks allocated before recording began are counted
//   with their bytes when freed. Readers take versions 6 to 10.
//
// This header is included by the recorder, so it uses no allocation and no
// standard containers; only the encoders live here. Decoding is in
// log_reader.h.
#pragma once

#include <cstdint>

#include "format/codec.h"

namespace heapsnap::hslog {

inline constexpr char kMagic[8] = {'H', 'E', 'A', 'P', 'S', 'N', 'A', 'P'};
inline constexpr uint32_t kLogVersion = 10;
// The oldest version readers still take (version 7 only adds a value,
// versions 8 and 10 fields readers leave at 0 in older logs).
inline constexpr uint32_t kOldestLogVersion = 6;
// The first version whose Marker and End records carry `unrecorded`.
inline constexpr uint32_t kUnrecordedVersion = 8;
// The first version whose Process record carries `attached` and whose
// FreeUnknown carries `usable`.
inline constexpr uint32_t kAttachedVersion = 10;
inline constexpr uint32_t kHeaderSize = 16;

// Times in the stream are multiples of this many nanoseconds since the
// epoch of CLOCK_MONOTONIC: dt fields count these units. The Process
// record's start_ns is exact.
inline constexpr uint64_t kTimeUnitNs = 1000;
// The writer emits a Time record before an event only when the event is at
// least this many units past the stream time: event times are exact to 1 ms.
inline constexpr uint64_t kEventTimeStep = 1000;

// Allocs of at least this many bytes carry their address (AllocAt); smaller
// ones only a size. 64 KiB: below glibc's smallest mmap threshold (128 KiB)
// and rare enough in churn-heavy programs to cost nothing measurable.
inline constexpr uint64_t kAddressedAllocSize = 64 * 1024;

// Largest uncompressed payload of one zstd frame the writer produces; a
// reader refuses frames announcing more than kMaxFramePayload (corrupt):
// the writer's frame buffer holds a frame's payload plus one marker of at
// most 8 MiB (writer.cpp, markers.cpp). 1 MiB: frames are independent, so
// each one pays again for the first occurrence of every repeating pattern,
// which larger frames pay less often (formats/hslog.md, "Version 3").
inline constexpr uint32_t kFramePayload = 1024 * 1024;
inline constexpr uint32_t kMaxFramePayload = 16 * 1024 * 1024;

// The most a recorder writes in a field; a reader takes more as
// corruption before it allocates anything (formats/hslog.md, "Reading
// rules"). Frames of a stack: HEAPSNAP_DEPTH is at most 256, and the
// unwinder may walk a few more before it cuts. Paths: PATH_MAX, and an
// smaps path may carry " (deleted)". The command line: the writer's
// buffer.
inline constexpr uint32_t kMaxStackFrames = 512;
inline constexpr size_t kMaxLabelBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096 + 16;
inline constexpr size_t kMaxBuildIdBytes = 64;
inline constexpr size_t kMaxCmdlineBytes = 8192;
inline constexpr size_t kMaxVersionBytes = 64;
// Largest sampling distance a recorder accepts (HEAPSNAP_SAMPLE_BYTES): 1
// GiB, so a sampled block never stands for more than 2^32 blocks.
inline constexpr uint64_t kMaxSampleBytes = uint64_t{1} << 30;

enum class Tag : uint8_t {
    Process = 0x01,
    ModuleLoad = 0x02,
    ModuleUnload = 0x03,
    Stack = 0x04,
    Thread = 0x05,  // following events belong to this thread index
    ThreadStart = 0x06,
    ThreadExit = 0x07,
    Time = 0x08,       // advances the stream time
    AllocInfo = 0x10,  // an allocation of a known info: its id
    Free = 0x11,       // a small block: the info id
    Mmap = 0x12,
    Munmap = 0x13,
    FreeUnknown = 0x14,  // an address the writer never saw allocated
    FreeAt = 0x15,       // a block allocated by AllocAt: its address
    Marker = 0x20,
    Alloc = 0x30,        // 0x30 + AllocFn: size and stack of a new info, no address
    AllocAt = 0x40,      // 0x40 + AllocFn: address, size and stack
    ShortThread = 0x50,  // 0x50-0x6f: a Thread record of index 0-31, in the tag
    End = 0x7f,
    // Short records: the tag's low 6 bits are the high bits of an info id
    // whose low 8 bits are the next byte (kShortInfoLimit).
    ShortAllocInfo = 0x80,  // 0x80-0xbf: an AllocInfo
    ShortFree = 0xc0,       // 0xc0-0xff: a Free
};

// Which interposed function produced an Alloc record.
enum class AllocFn : uint8_t {
    Malloc = 0,
    Calloc = 1,
    Realloc = 2,  // preceded by a Free of the old block when it moved or was non-null
    Memalign = 3,
    PosixMemalign = 4,
    AlignedAlloc = 5,
    Valloc = 6,
    Pvalloc = 7,
    Reallocarray = 8,
};
inline constexpr uint8_t kAllocFnCount = 9;

// Alloc and AllocAt occupy kAllocFnCount tags each, one per function.
inline constexpr uint8_t alloc_tag(Tag base, AllocFn fn) {
    return static_cast<uint8_t>(static_cast<uint8_t>(base) + static_cast<uint8_t>(fn));
}

// Thread indices below this are switched to by a ShortThread record.
inline constexpr uint32_t kShortThreadCount = 32;

// Ids 1 to kShortInfoLimit - 1 fit a short record; larger ones are written
// as AllocInfo or Free with a varint.
inline constexpr uint32_t kShortInfoLimit = 1u << 14;

// The short records own every tag with the high bit set, so a reader tells
// them from the rest by that bit alone: every other tag must be below 0x80.
inline constexpr bool long_tags_below_short() {
    const uint8_t tags[] = {static_cast<uint8_t>(Tag::Process),
                            static_cast<uint8_t>(Tag::ModuleLoad),
                            static_cast<uint8_t>(Tag::ModuleUnload),
                            static_cast<uint8_t>(Tag::Stack),
                            static_cast<uint8_t>(Tag::Thread),
                            static_cast<uint8_t>(Tag::ThreadStart),
                            static_cast<uint8_t>(Tag::ThreadExit),
                            static_cast<uint8_t>(Tag::Time),
                            static_cast<uint8_t>(Tag::AllocInfo),
                            static_cast<uint8_t>(Tag::Free),
                            static_cast<uint8_t>(Tag::Mmap),
                            static_cast<uint8_t>(Tag::Munmap),
                            static_cast<uint8_t>(Tag::FreeUnknown),
                            static_cast<uint8_t>(Tag::FreeAt),
                            static_cast<uint8_t>(Tag::Marker),
                            alloc_tag(Tag::Alloc, static_cast<AllocFn>(kAllocFnCount - 1)),
                            alloc_tag(Tag::AllocAt, static_cast<AllocFn>(kAllocFnCount - 1)),
                            static_cast<uint8_t>(static_cast<uint8_t>(Tag::ShortThread) + kShortThreadCount - 1),
                            static_cast<uint8_t>(Tag::End)};
    for (uint8_t tag : tags)
        if (tag >= static_cast<uint8_t>(Tag::ShortAllocInfo)) return false;
    return true;
}
static_assert(long_tags_below_short(), "a tag collides with the short records (0x80-0xff)");
static_assert(alloc_tag(Tag::AllocAt, static_cast<AllocFn>(kAllocFnCount - 1)) <
                      static_cast<uint8_t>(Tag::ShortThread) &&
                  static_cast<uint8_t>(Tag::ShortThread) + kShortThreadCount <= static_cast<uint8_t>(Tag::End),
              "the ShortThread tags lie between AllocAt's and End");
static_assert((static_cast<uint8_t>(Tag::ShortAllocInfo) | 0x3f) + 1 == static_cast<uint8_t>(Tag::ShortFree) &&
                  kShortInfoLimit == 0x40 << 8,
              "a short record's tag holds the id's top 6 bits");

inline const char* alloc_fn_name(AllocFn fn) {
    static const char* const names[kAllocFnCount] = {"malloc",   "calloc",         "realloc",
                                                     "memalign", "posix_memalign", "aligned_alloc",
                                                     "valloc",   "pvalloc",        "reallocarray"};
    auto i = static_cast<uint8_t>(fn);
    return i < kAllocFnCount ? names[i] : "?";
}

// The malloc implementation of the process (recorder/allocator.h).
enum class AllocatorKind : uint8_t { Unknown = 0, Glibc = 1, Jemalloc = 2, Tcmalloc = 3, Mimalloc = 4 };
inline constexpr uint8_t kAllocatorKindCount = 5;

inline const char* allocator_name(AllocatorKind k) {
    static const char* const names[kAllocatorKindCount] = {"unknown", "glibc", "jemalloc", "tcmalloc", "mimalloc"};
    auto i = static_cast<uint8_t>(k);
    return i < kAllocatorKindCount ? names[i] : "?";
}

// A marker's statistics byte: none, glibc's mallinfo2, or another
// allocator's own (AllocatorStats).
enum class MarkerStats : uint8_t { None = 0, Mallinfo = 1, Allocator = 2 };

// Another allocator's statistics, in bytes; a field it does not give has
// its bit clear in `present` and is not encoded.
struct AllocatorStats {
    enum Field : uint8_t { kAllocated = 1, kActive = 2, kCommitted = 4, kResident = 8, kMapped = 16 };
    static constexpr uint8_t kAllFields = 31;
    AllocatorKind kind = AllocatorKind::Unknown;
    uint8_t present = 0;
    uint64_t allocated = 0;  // in blocks handed out
    uint64_t active = 0;     // in pages that hold blocks in use
    uint64_t committed = 0;  // committed by the allocator
    uint64_t resident = 0;   // physically resident
    uint64_t mapped = 0;     // address space mapped by the allocator
};

inline void put_allocator_stats(codec::Writer& w, const AllocatorStats& s) {
    w.u8(static_cast<uint8_t>(MarkerStats::Allocator));
    w.u8(static_cast<uint8_t>(s.kind));
    w.u8(s.present);
    const uint64_t values[] = {s.allocated, s.active, s.committed, s.resident, s.mapped};
    for (int i = 0; i < 5; ++i)
        if (s.present & (1u << i)) w.varint(values[i]);
}

// Why a marker was written.
enum class MarkerCause : uint8_t {
    User = 0,       // heapsnap_marker() from the program
    Interval = 1,   // --interval
    Request = 2,    // heapsnap snapshot PID
    Exit = 3,       // normal process exit
    Pause = 4,      // stack recording paused (heapsnap pause PID, run --paused)
    Resume = 5,     // stack recording resumed (heapsnap resume PID, run --stacks-after)
    Threshold = 6,  // a --snapshot-when rule was crossed; the label is the rule
};

enum class UnwindMode : uint8_t { Dwarf = 0, FramePointer = 1 };

// Region permission bits of a MapRegion (from /proc/self/smaps).
enum RegionPerm : uint8_t { kRead = 1, kWrite = 2, kExec = 4, kShared = 8 };

// What the recorder knows about a region that /proc does not say.
enum class RegionHint : uint8_t {
    None = 0,
    ThreadStack = 1,  // a thread stack, guard page included
    MainStack = 2,
    Recorder = 3,  // heapsnap's own buffers and tables
    Heap = 4,      // holds live malloc blocks (set when a snapshot is built)
};

// End-of-log reasons.
enum class EndReason : uint8_t { Exit = 0, Exec = 1, Shutdown = 2 };

// Worst-case encoded sizes, so the writer can reserve before encoding.
inline constexpr size_t kMaxEventRecord = 1 + 6 * codec::kMaxVarint;

// ---- encoders (recorder side) -------------------------------------------

inline void put_thread(codec::Writer& w, uint32_t thread_index) {
    if (thread_index < kShortThreadCount) {
        w.u8(static_cast<uint8_t>(static_cast<uint8_t>(Tag::ShortThread) + thread_index));
        return;
    }
    w.u8(static_cast<uint8_t>(Tag::Thread));
    w.varint(thread_index);
}

inline void put_time(codec::Writer& w, uint64_t dt) {
    w.u8(static_cast<uint8_t>(Tag::Time));
    w.varint(dt);
}

// An Alloc of a triple (fn, size, stack) not seen before in this log: it
// defines the next info id (1-based, in order of first appearance).
inline void put_alloc(codec::Writer& w, AllocFn fn, uint64_t size, uint32_t stack) {
    w.u8(alloc_tag(Tag::Alloc, fn));
    w.varint(size);
    w.varint(stack);
}

// An Alloc that also names the block's address (kAddressedAllocSize).
inline void put_alloc_at(codec::Writer& w, AllocFn fn, int64_t addr_delta, uint64_t size, uint32_t stack) {
    w.u8(alloc_tag(Tag::AllocAt, fn));
    w.svarint(addr_delta);
    w.varint(size);
    w.varint(stack);
}

// AllocInfo and Free name an info (never 0) in a short record when it fits,
// else with the long tag and a varint.
inline void put_info_record(codec::Writer& w, Tag short_tag, Tag long_tag, uint32_t info) {
    if (info < kShortInfoLimit) {
        w.u8(static_cast<uint8_t>(static_cast<uint8_t>(short_tag) | (info >> 8)));
        w.u8(static_cast<uint8_t>(info));
    } else {
        w.u8(static_cast<uint8_t>(long_tag));
        w.varint(info);
    }
}

// An Alloc of a triple an earlier Alloc defined.
inline void put_alloc_info(codec::Writer& w, uint32_t info) {
    put_info_record(w, Tag::ShortAllocInfo, Tag::AllocInfo, info);
}

// The free of a small block: the reader frees the newest live block of `info`.
inline void put_free(codec::Writer& w, uint32_t info) { put_info_record(w, Tag::ShortFree, Tag::Free, info); }

// The free of a block written as AllocAt, by its address.
inline void put_free_at(codec::Writer& w, int64_t addr_delta) {
    w.u8(static_cast<uint8_t>(Tag::FreeAt));
    w.svarint(addr_delta);
}

// `usable`: the block's usable size as the allocator said before the free,
// 0 when the recorder did not ask (it asks only when attached).
inline void put_free_unknown(codec::Writer& w, int64_t addr_delta, uint64_t usable) {
    w.u8(static_cast<uint8_t>(Tag::FreeUnknown));
    w.svarint(addr_delta);
    w.varint(usable);
}

inline void put_mmap(codec::Writer& w, int64_t addr_delta, uint64_t length, uint32_t prot, uint32_t flags,
                     uint32_t stack) {
    w.u8(static_cast<uint8_t>(Tag::Mmap));
    w.svarint(addr_delta);
    w.varint(length);
    w.varint(prot);
    w.varint(flags);
    w.varint(stack);
}

inline void put_munmap(codec::Writer& w, int64_t addr_delta, uint64_t length) {
    w.u8(static_cast<uint8_t>(Tag::Munmap));
    w.svarint(addr_delta);
    w.varint(length);
}

inline void put_thread_start(codec::Writer& w, uint64_t dt, uint32_t thread_index, uint64_t os_tid, uint64_t stack_lo,
                             uint64_t stack_hi) {
    w.u8(static_cast<uint8_t>(Tag::ThreadStart));
    w.varint(dt);
    w.varint(thread_index);
    w.varint(os_tid);
    w.varint(stack_lo);
    w.varint(stack_hi);
}

inline void put_thread_exit(codec::Writer& w, uint64_t dt, uint32_t thread_index) {
    w.u8(static_cast<uint8_t>(Tag::ThreadExit));
    w.varint(dt);
    w.varint(thread_index);
}

inline void put_module_unload(codec::Writer& w, uint64_t dt, uint32_t module_id) {
    w.u8(static_cast<uint8_t>(Tag::ModuleUnload));
    w.varint(dt);
    w.varint(module_id);
}

// Module 0 stands for "no module": the frame's vaddr is then the absolute
// address (JIT code, or a mapping that dl_iterate_phdr does not list).
inline constexpr uint32_t kNoModule = 0;

// The paused site (version 9): the stack of every allocation and mapping
// recorded while stack recording was paused is the one whose only frame
// is (kNoModule, kPausedSiteVaddr). No real frame is there: a return
// address is never 0, and the unwinder stops at a null one.
inline constexpr uint64_t kPausedSiteVaddr = 0;
inline constexpr char kPausedSiteName[] = "(allocated while paused)";
inline constexpr bool is_paused_site_frame(uint32_t module, uint64_t vaddr) {
    return module == kNoModule && vaddr == kPausedSiteVaddr;
}

inline void put_stack_header(codec::Writer& w, uint32_t stack, uint32_t nframes) {
    w.u8(static_cast<uint8_t>(Tag::Stack));
    w.varint(stack);
    w.varint(nframes);
}
// One frame of a Stack record: module id and ELF virtual address within it
// (runtime address minus the module's load bias), resolved by the recorder
// when it interns the stack, so a reader never has to guess which module
// was mapped at an address at which time.
inline void put_stack_frame(codec::Writer& w, uint32_t module, uint64_t vaddr) {
    w.varint(module);
    w.varint(vaddr);
}

inline void put_module_load(codec::Writer& w, uint64_t dt, uint32_t module, uint64_t load_bias, uint64_t start,
                            uint64_t end, const char* path, size_t path_len, const uint8_t* build_id,
                            size_t build_id_len) {
    w.u8(static_cast<uint8_t>(Tag::ModuleLoad));
    w.varint(dt);
    w.varint(module);
    w.varint(load_bias);
    w.varint(start);
    w.varint(end);
    w.bytes(path, path_len);
    w.bytes(build_id, build_id_len);
}

inline void put_end(codec::Writer& w, uint64_t dt, EndReason reason, uint64_t events, uint64_t unrecorded) {
    w.u8(static_cast<uint8_t>(Tag::End));
    w.varint(dt);
    w.u8(static_cast<uint8_t>(reason));
    w.varint(events);
    w.varint(unrecorded);
}

// A Marker record up to its payload (formats/hslog.md, Marker).
inline void put_marker_header(codec::Writer& w, uint64_t dt, uint32_t thread, uint64_t events, uint64_t unrecorded) {
    w.u8(static_cast<uint8_t>(Tag::Marker));
    w.varint(dt);
    w.varint(thread);
    w.varint(events);
    w.varint(unrecorded);
}

}  // namespace heapsnap::hslog
