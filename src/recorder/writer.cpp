#include "recorder/writer.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
// customMem (an allocator that does not call malloc) is in the advanced API.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "format/hslog.h"
#include "recorder/alloc_infos.h"
#include "recorder/attach.h"
#include "recorder/clock.h"
#include "recorder/control.h"
#include "recorder/lifecycle.h"
#include "recorder/log_file.h"
#include "recorder/markers.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"
#include "recorder/raw_alloc.h"
#include "recorder/record_encoder.h"
#include "recorder/steering.h"
#include "recorder/thread_buffer.h"

namespace heapsnap::recorder {
namespace {

constexpr size_t kFrameBufferBytes = 16u << 20;  // a frame's payload plus one marker at most
constexpr uint64_t kFlushIntervalNs = 100'000'000;
constexpr int kIdleWaitMs = 50;
constexpr int kZstdLevel = 3;
constexpr size_t kWriterStackBytes = 512u << 10;

struct Cursor {
    ThreadRing* ring;
    uint64_t pos;
    uint64_t end;
};

// Writer state; guarded by g_writer_lock.
SpinLock g_writer_lock;
// Written under the lock; atomic because the close and uid-change hooks
// read it from any thread (is_recorder_fd, writer_give_log).
std::atomic<int> g_fd{-1};
// The log file's identity, and the process whose log it is: a uid-change
// hook checks that the descriptor it is about to chown is still the log,
// and that the caller is not a vfork child (which shares the parent's
// memory, and so g_fd, but runs as a user of its own).
dev_t g_log_dev = 0;
ino_t g_log_ino = 0;
pid_t g_log_pid = 0;
char g_path[kMaxPathLen];
uint8_t* g_frame = nullptr;
// The frame being filled, changed on every record: on a line of its own,
// as the encoder's stream state is (record_encoder.cpp, Encoder).
struct alignas(64) Filling {
    size_t frame_used = 0;
    uint64_t last_flush_ns = 0;
    uint32_t frame_max_marker = 0;
    bool marker_seen = false;  // a marker was encoded since the writer thread last checked the rules
};
Filling g_fill;
uint8_t* g_compressed = nullptr;
size_t g_compressed_capacity = 0;
ZSTD_CCtx* g_zstd = nullptr;
// A full frame is compressed a piece at a time between the writer's
// rounds, while the next one fills the other buffer: compressed at once
// it kept the writer from draining the rings for milliseconds, long
// enough for a thread that allocates fast to fill its ring and wait for
// room. The frame on disk is the same zstd frame (its size pledged, so
// its header states it).
constexpr size_t kCompressPiece = 128u << 10;
uint8_t* g_spare_frame = nullptr;
struct Compressing {
    const uint8_t* frame = nullptr;  // null: none
    size_t size = 0;
    size_t fed = 0;           // bytes of frame handed to zstd so far
    size_t out = 0;           // compressed bytes in g_compressed so far
    uint32_t max_marker = 0;  // the last marker the frame holds (0: none)
};
Compressing g_compressing;
// Recording has stopped for good (fail): written under the lock, read by
// the writer thread's loop.
std::atomic<bool> g_failed{false};
bool g_ended = false;
// Recent (token, index) pairs, for the control channel's replies.
constexpr uint32_t kTokenMemory = 64;
std::atomic<uint64_t> g_marker_tokens[kTokenMemory];
Cursor* g_cursors = nullptr;
size_t g_cursor_capacity = 0;

std::atomic<uint32_t> g_durable_marker{0};
std::atomic<bool> g_running{false};
std::atomic<bool> g_stop{false};
// Set while the writer waits in poll(); the first producer that finds it set
// clears it and writes the eventfd, so a busy program pays one syscall per
// writer nap, not one per event.
struct alignas(64) SleepFlag {
    std::atomic<bool> set{false};
};
SleepFlag g_sleeping;
// The exit marker must be the last marker: once it is being taken, no
// interval marker may start, and one already started must finish first.
std::atomic<bool> g_intervals_closed{false};
std::atomic<bool> g_interval_busy{false};
pthread_t g_thread;
void* g_writer_stack = nullptr;
// Held across a start or a stop of the writer thread, the join included:
// the last thread's exit hook stops the writer while a thread it created
// may be recording its first event, which starts it again. Without the
// lock the start could replace g_thread between the stop's flag and its
// join, and the stop joined a writer that was never told to stop: the
// program hung at exit or its log lost the End record (tests/stress,
// main_exit).
SpinLock g_thread_lock;
std::atomic<int> g_wake_fd{-1};

void wake_now() {
    OwnFdUse use;
    int fd = g_wake_fd.load(std::memory_order_acquire);
    if (fd < 0) return;
    uint64_t one = 1;
    ssize_t ignored = write(fd, &one, sizeof one);
    (void)ignored;
}

// Whether g_fd is still the log file: the program may have closed it
// with the system call, past the hooks, and put a file of its own there.
bool log_intact(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_dev == g_log_dev && st.st_ino == g_log_ino;
}

bool write_all(const uint8_t* p, size_t n) {
    OwnFdUse use;
    int fd = g_fd.load(std::memory_order_acquire);
    if (!log_intact(fd)) {
        errno = EBADF;
        return false;
    }
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

}  // namespace

// Recording stops for good: nothing more is written anywhere, the hooks
// record nothing more (stop_recording), the writer thread leaves.
void fail_log(const char* what) {
    if (g_failed) return;
    g_failed = true;
    g_wake_fd.store(-1, std::memory_order_release);
    stop_recording();
    alert("cannot write log ", g_path, what);
}

namespace {

// Hands up to `bytes` more of the frame being compressed to zstd (all of
// it: the frame ends, and is written). No stamp reuse meanwhile: a piece
// takes a few tenths of a millisecond, the whole frame milliseconds.
void compress_more(size_t bytes) {
    Compressing& c = g_compressing;
    if (!c.frame) return;
    if (g_failed) {  // the log is given up: nothing more is written
        c = Compressing{};
        return;
    }
    bool fresh = stamp_tick_make_stale();
    size_t upto = bytes >= c.size - c.fed ? c.size : c.fed + bytes;
    ZSTD_inBuffer in{c.frame, upto, c.fed};
    ZSTD_outBuffer out{g_compressed, g_compressed_capacity, c.out};
    ZSTD_EndDirective mode = upto == c.size ? ZSTD_e_end : ZSTD_e_continue;
    size_t left = 0;
    do {
        left = ZSTD_compressStream2(g_zstd, &out, &in, mode);
    } while (!ZSTD_isError(left) && (mode == ZSTD_e_end ? left != 0 : in.pos < in.size));
    c.fed = in.pos;
    c.out = out.pos;
    bool done = mode == ZSTD_e_end || ZSTD_isError(left);
    if (ZSTD_isError(left)) {
        fail_log(": compression failed; recording stopped");
    } else if (done && !write_all(g_compressed, c.out)) {
        fail_log(errno == EBADF ? ": its descriptor was closed or replaced by the program; recording stopped"
                                : ": write failed; recording stopped");
    }
    if (done) {
        if (c.max_marker && !g_failed) g_durable_marker.store(c.max_marker, std::memory_order_release);
        c = Compressing{};
    }
    if (fresh) stamp_tick_advance();
}

// Ends the frame being filled: its compression starts (compress_more goes
// on with it between rounds), and the next frame fills the other buffer.
// A frame still being compressed is finished first, so frames reach the
// file in order.
void end_frame() {
    if (!g_fill.frame_used || g_failed || g_fd < 0) {
        g_fill.frame_used = 0;
        return;
    }
    compress_more(SIZE_MAX);
    ZSTD_CCtx_reset(g_zstd, ZSTD_reset_session_only);
    ZSTD_CCtx_setPledgedSrcSize(g_zstd, g_fill.frame_used);
    g_compressing = Compressing{g_frame, g_fill.frame_used, 0, 0, g_fill.frame_max_marker};
    std::swap(g_frame, g_spare_frame);
    g_fill.frame_used = 0;
    g_fill.last_flush_ns = now_ns();
    g_fill.frame_max_marker = 0;
}

}  // namespace

// Everything committed so far on disk now.
void flush_frame() {
    end_frame();
    compress_more(SIZE_MAX);
}

// Space for one record; cuts the frame first if the record would not fit
// in the frame's nominal size.
codec::Writer frame_reserve(size_t max_bytes) {
    if (g_fill.frame_used && g_fill.frame_used + max_bytes > hslog::kFramePayload) end_frame();
    return codec::Writer(g_frame + g_fill.frame_used, kFrameBufferBytes - g_fill.frame_used);
}
void frame_commit(const codec::Writer& w) { g_fill.frame_used += w.size(); }

void marker_written(uint32_t token, uint32_t index) {
    g_marker_tokens[token % kTokenMemory].store(uint64_t{token} << 32 | index, std::memory_order_release);
    g_fill.frame_max_marker = index;
    g_fill.marker_seen = true;
}

namespace {

bool ensure_cursor_capacity(size_t n) {
    if (n <= g_cursor_capacity) return true;
    size_t capacity = std::max<size_t>(64, n * 2);
    auto* fresh = static_cast<Cursor*>(raw_map(capacity * sizeof(Cursor)));
    if (!fresh) return false;
    raw_unmap(g_cursors, g_cursor_capacity * sizeof(Cursor));
    g_cursors = fresh;
    g_cursor_capacity = capacity;
    return true;
}

const Slot& at(const Cursor& c) { return c.ring->slots[c.pos % kRingSlots]; }

// How many events ahead of the one being encoded the writer prefetches
// the table lines its lookups will touch (alloc_infos_prefetch): enough to
// cover a miss at ~30 ns an event.
constexpr uint64_t kPrefetchAhead = 8;

// Order of two events with the same stamp: releases first, so that an
// address freed and reused within one clock tick replays as free, alloc.
int kind_rank(SlotKind k) { return (k == SlotKind::Free || k == SlotKind::Munmap) ? 0 : 1; }

bool later(const Cursor& a, const Cursor& b) {
    const Slot& x = at(a);
    const Slot& y = at(b);
    if (x.ts != y.ts) return x.ts > y.ts;
    return kind_rank(x.kind) > kind_rank(y.kind);
}

// One merge round: everything stamped below the watermark is final.
// Returns the number of events emitted.
size_t round_locked() {
    recalibrate_clock();
    uint64_t watermark = UINT64_MAX;
    size_t n = 0;
    {
        LockGuard guard(registry_lock());
        size_t rings = 0;
        for (ThreadRing* r = ring_list(); r; r = r->next) ++rings;
        if (!ensure_cursor_capacity(rings)) return 0;
        // Under the registry lock, so that a ring registered after this
        // scan stamps after this reading (thread_buffer.h, "One ring").
        uint64_t clock = now_ticks();
        order_after_clock_read(rings > 1);
        for (ThreadRing* r = ring_list(); r; r = r->next) {
            bool busy = r->in_flight.load(std::memory_order_seq_cst) != 0;
            uint64_t head = r->head.load(std::memory_order_acquire);
            uint64_t tail = r->tail.load(std::memory_order_relaxed);
            uint64_t bound = clock;
            if (busy) bound = head > tail ? r->slots[(head - 1) % kRingSlots].ts : r->last_ts;
            watermark = std::min(watermark, bound);
            g_cursors[n++] = Cursor{r, tail, head};
        }
    }
    {
        LockGuard guard(metadata_lock());
        rescan_modules(false);
    }
    put_queued_metadata();
    // A min-heap of the rings that have an event below the watermark.
    Cursor* heap = g_cursors;
    size_t live = 0;
    for (size_t i = 0; i < n; ++i)
        if (g_cursors[i].pos < g_cursors[i].end && at(g_cursors[i]).ts < watermark) heap[live++] = g_cursors[i];
    // Cursors not in the heap keep their tail untouched; only heap members move.
    std::make_heap(heap, heap + live, later);
    size_t emitted = 0;
    while (live) {
        std::pop_heap(heap, heap + live, later);
        Cursor& c = heap[live - 1];
        // Emit the run of this ring that precedes every other ring's next
        // event: one heap operation per run, not per event (a single busy
        // thread is one long run).
        const Cursor* next = live > 1 ? &heap[0] : nullptr;
        do {
            if (c.pos + kPrefetchAhead < c.end) prefetch_tables(c.ring->slots[(c.pos + kPrefetchAhead) % kRingSlots]);
            const Slot& s = at(c);
            c.ring->last_ts = s.ts;
            if (s.kind >= SlotKind::StackDef) {  // not an event: a stack definition, or a Void slot
                c.pos += s.kind == SlotKind::StackDef ? take_stack_def(*c.ring, c.pos, c.end) : 1;
            } else {
                encode(s);
                c.pos++;
            }
            emitted++;
            if ((emitted & 1023) == 0) c.ring->tail.store(c.pos, std::memory_order_release);
        } while (c.pos < c.end && at(c).ts < watermark && !(next && later(c, *next)));
        if (c.pos < c.end && at(c).ts < watermark) {
            std::push_heap(heap, heap + live, later);
        } else {
            c.ring->tail.store(c.pos, std::memory_order_release);
            live--;
        }
    }
    recycle_drained_rings();
    if (g_fill.frame_used && now_ns() - g_fill.last_flush_ns >= kFlushIntervalNs) end_frame();
    return emitted;
}

// Returns whether a control descriptor is ready. A descriptor the poll
// finds closed (POLLNVAL: the program closed it with the system call,
// past the hooks) ends recording; polling it again would return at once,
// for ever.
bool wait_for_work(uint64_t timeout_ns) {
    OwnFdUse use;
    pollfd fds[16];
    nfds_t count = 0;
    fds[count++] = pollfd{g_wake_fd.load(std::memory_order_acquire), POLLIN, 0};
    count += static_cast<nfds_t>(control_poll_fds(fds + 1, 15));
    g_sleeping.set.store(true, std::memory_order_seq_cst);
    timespec timeout{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
    int r = ppoll(fds, count, &timeout, nullptr);
    g_sleeping.set.store(false, std::memory_order_relaxed);
    for (nfds_t i = 0; r > 0 && i < count; ++i)
        if (fds[i].revents & POLLNVAL) {
            LockGuard guard(g_writer_lock);
            fail_log(": a descriptor of the recorder's was closed by the program; recording stopped");
            return false;
        }
    if (r > 0 && (fds[0].revents & POLLIN)) {
        uint64_t value;
        ssize_t ignored = read(fds[0].fd, &value, sizeof value);
        (void)ignored;
    }
    bool control_ready = false;
    for (nfds_t i = 1; r > 0 && i < count; ++i) control_ready = control_ready || fds[i].revents;
    return control_ready;
}

// A `detach` request's connection (control.cpp), -1 if none: the writer
// leaves its loop and ends the log (end_detached).
std::atomic<int> g_detach_fd{-1};
// The writer thread left by itself after a detach: the next start joins it
// before reusing its stack.
std::atomic<bool> g_writer_unjoined{false};

void end_detached();

// Markers the writer thread takes of itself (interval, steering): none
// once the exit marker is under way (writer_close_intervals).
template <class Take>
void take_own_marker(Take&& take) {
    g_interval_busy.store(true, std::memory_order_seq_cst);
    if (!g_intervals_closed.load(std::memory_order_seq_cst)) take();
    g_interval_busy.store(false, std::memory_order_release);
}

void* writer_main(void*) {
    thread_state().internal = 1;
    // Created with every signal blocked (LockGuard); glibc's own two
    // (cancellation, setxid) are opened: setuid in another thread waits
    // for every thread to take its signal.
    signals_blocked_for_good();
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, nullptr);
    prctl(PR_SET_NAME, "heapsnap-writer");  // tells it apart in top and perf
    uint64_t next_interval = 0;
    const uint64_t interval_ns = static_cast<uint64_t>(config().interval_s * 1e9);
    if (interval_ns) next_interval = now_ns() + interval_ns;
    // The last round emitted events: the writer naps for one stamp tick
    // only, and the tick is fresh meanwhile (thread_buffer.h, "One thread").
    bool busy = false;
    uint64_t live_bytes = 0;
    bool marker_seen = false;
    while (!g_stop.load(std::memory_order_acquire) && !g_failed.load(std::memory_order_acquire) &&
           g_detach_fd.load(std::memory_order_acquire) < 0) {
        uint64_t timeout_ns = busy ? kStampTickNs : kIdleWaitMs * 1'000'000ull;
        if (interval_ns) {
            uint64_t now = now_ns();
            if (now >= next_interval) {
                take_own_marker([] { take_marker(hslog::MarkerCause::Interval, "interval"); });
                next_interval += interval_ns;
                if (next_interval <= now) next_interval = now + interval_ns;
            }
            timeout_ns = std::min(timeout_ns, next_interval - std::min(next_interval, now_ns()));
        }
        if (steering_ticking()) take_own_marker([&] { steering_tick(now_ns(), live_bytes, marker_seen); });
        if (uint64_t at = steering_deadline()) timeout_ns = std::min(timeout_ns, at - std::min(at, now_ns()));
        bool compressing = false;
        {
            LockGuard guard(g_writer_lock);
            compress_more(kCompressPiece);
            compressing = g_compressing.frame != nullptr;
            if (busy) stamp_tick_advance();
        }
        if (compressing) timeout_ns = 0;  // the rest of the frame after the next round
        // A busy writer wakes every stamp tick: accept4 on every wake was
        // a failed syscall per round.
        if (wait_for_work(timeout_ns) || control_reading()) {
            {
                LockGuard guard(g_writer_lock);
                stamp_tick_make_stale();  // control requests and markers may take long
            }
            control_poll();
        }
        {
            LockGuard guard(g_writer_lock);
            stamp_tick_advance();
            busy = round_locked() > 0;
            live_bytes = alloc_infos_live_bytes();
            marker_seen = std::exchange(g_fill.marker_seen, false);
            stamp_tick_make_stale();
        }
        control_reply_durable(g_durable_marker.load(std::memory_order_acquire));
    }
    if (g_detach_fd.load(std::memory_order_acquire) >= 0) end_detached();
    return nullptr;
}

}  // namespace

bool writer_open() {
    LockGuard guard(g_writer_lock);
    if (!g_frame) {
        g_frame = static_cast<uint8_t*>(raw_map(kFrameBufferBytes));
        g_spare_frame = static_cast<uint8_t*>(raw_map(kFrameBufferBytes));
        g_compressed_capacity = ZSTD_compressBound(kFrameBufferBytes);
        g_compressed = static_cast<uint8_t*>(raw_map(g_compressed_capacity));
        ZSTD_customMem mem{raw_block_alloc, raw_block_free, nullptr};
        g_zstd = ZSTD_createCCtx_advanced(mem);
        if (!g_frame || !g_spare_frame || !g_compressed || !g_zstd) {
            alert("out of memory for the log buffers; recording disabled");
            return false;
        }
        ZSTD_CCtx_setParameter(g_zstd, ZSTD_c_compressionLevel, kZstdLevel);
        ZSTD_CCtx_setParameter(g_zstd, ZSTD_c_checksumFlag, 1);
    }
    if (g_wake_fd.load() < 0) own_fd_adopt(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), &g_wake_fd);
    if (!config().output_pattern[0]) {
        alert("log path too long: HEAPSNAP_OUTPUT is longer than 4095 bytes; recording disabled");
        return false;
    }
    if (!expand_pattern(config().output_pattern, g_path, sizeof g_path) || !make_absolute(g_path, sizeof g_path)) {
        alert("log path too long: ", config().output_pattern, "; recording disabled");
        return false;
    }
    int fd = create_log(g_path, sizeof g_path);
    if (fd < 0) {
        char reason[128] = ": ";
        strncat(reason, strerror(errno), sizeof reason - 3);
        alert("cannot create log ", g_path, reason, "; recording disabled");
        return false;
    }
    // The identity before the descriptor: a uid-change hook that sees the
    // descriptor sees its identity too.
    struct stat st;
    if (fstat(fd, &st) == 0) {
        g_log_dev = st.st_dev;
        g_log_ino = st.st_ino;
    }
    g_log_pid = getpid();
    own_fd_adopt(fd, &g_fd);
    uint8_t header[hslog::kHeaderSize];
    codec::Writer h(header, sizeof header);
    h.raw(hslog::kMagic, sizeof hslog::kMagic);
    h.u32le(hslog::kLogVersion);
    h.u32le(0);
    if (!write_all(header, sizeof header)) {
        alert("cannot write log ", g_path, "; recording disabled");
        close_own(g_fd);
        g_fd = -1;
        return false;
    }
    g_failed = false;
    g_ended = false;
    g_fill = Filling{};
    g_fill.last_flush_ns = now_ns();
    encoder_start_log();
    steering_log_opened();
    g_durable_marker.store(0);
    put_process_record();
    // On disk at once: a process that dies (_exit, SIGKILL) before the
    // first timed flush still leaves a log that says what it was.
    flush_frame();
    announce_path(g_path);
    return true;
}

namespace {

// Runs fn() holding g_thread_lock (with signals blocked: the writer
// thread inherits that mask, so signals go to the program's threads).
template <class Fn>
void with_thread_lock(Fn&& fn) {
    LockGuard lifecycle(g_thread_lock);
    fn();
}

void start_writer_thread_locked() {
    if (g_running.load() || g_fd < 0) return;
    if (g_writer_unjoined.exchange(false)) {  // gone since its detach; its stack is free once joined
        thread_state().internal++;
        pthread_join(g_thread, nullptr);
        thread_state().internal--;
    }
    g_stop.store(false);
    control_open();
    // The writer runs on a stack of our own mapping: it shows as recorder
    // memory, and no malloc arena is ever created for the writer thread
    // (it never calls malloc). Mapped once: a writer started again after
    // a pause (the last thread's exit) runs on the stack of the one joined.
    if (!g_writer_stack) g_writer_stack = raw_map(kWriterStackBytes);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (g_writer_stack) pthread_attr_setstack(&attr, g_writer_stack, kWriterStackBytes);
    thread_state().internal++;
    int err = pthread_create(&g_thread, &attr, writer_main, nullptr);
    thread_state().internal--;
    pthread_attr_destroy(&attr);
    if (!err) g_running.store(true);
}

}  // namespace

bool writer_start_thread() {
    with_thread_lock([] { start_writer_thread_locked(); });
    return g_running.load();
}

void writer_close_intervals() {
    g_intervals_closed.store(true, std::memory_order_seq_cst);
    while (g_interval_busy.load(std::memory_order_seq_cst)) sched_yield();
}

bool writer_running() { return g_running.load(std::memory_order_acquire); }

void writer_wake() {
    if (!g_sleeping.set.load(std::memory_order_relaxed) || !g_sleeping.set.exchange(false)) return;
    wake_now();
}

void writer_drain_inline() {
    LockGuard guard(g_writer_lock);
    if (g_fd < 0) return;
    round_locked();
    compress_more(SIZE_MAX);  // no writer thread to go on with it
}

void writer_take_published() {
    const ThreadState& t = thread_state();
    if (!t.ring) return;
    const ThreadRing& ring = *t.ring;
    uint64_t head = ring.head.load(std::memory_order_relaxed);
    // Other threads go on publishing meanwhile: wait for this one's events
    // only, and not for ever (another thread inside a hook holds the
    // watermark back only briefly).
    for (int idle = 0; idle < 1000 && ring.tail.load(std::memory_order_acquire) < head;) {
        size_t emitted = 0;
        {
            LockGuard guard(g_writer_lock);
            if (g_fd < 0 || g_ended) return;
            emitted = round_locked();
        }
        if (emitted) continue;
        ++idle;
        timespec pause{0, 100000};
        nanosleep(&pause, nullptr);
    }
}

namespace {

// Joins the writer thread (if it runs) and closes the control socket.
void stop_writer_thread() {
    with_thread_lock([] {
        if (g_running.exchange(false)) {
            g_stop.store(true, std::memory_order_release);
            wake_now();
            // pthread_join frees the writer's TLS block: the recorder's
            // memory, not a free of the program's.
            thread_state().internal++;
            pthread_join(g_thread, nullptr);
            thread_state().internal--;
        }
        control_close();
    });
}

// Drains until every published event is written; another thread that is
// still inside a hook holds the watermark back only briefly.
void drain_published_locked() {
    for (int idle = 0; idle < 200;) {
        if (round_locked()) {
            idle = 0;
            continue;
        }
        bool pending = false;
        for_each_ring([&](ThreadRing& r) {
            if (r.tail.load(std::memory_order_relaxed) != r.head.load(std::memory_order_acquire)) pending = true;
        });
        if (!pending) break;
        ++idle;
        timespec pause{0, 1000000};
        nanosleep(&pause, nullptr);
    }
}

// `heapsnap detach` (attach.h), on the writer thread, which leaves
// afterwards: the hooks are unbound, the `detach` marker taken, then
// everything published is written with the End record (reason 2), the
// client answered, the log and the control socket closed.
void end_detached() {
    int client = g_detach_fd.load(std::memory_order_acquire);
    unbind_hooks();
    stop_attached();
    {
        LockGuard guard(g_writer_lock);
        if (g_fd >= 0 && !g_ended) {
            drain_published_locked();
            put_end_record(hslog::EndReason::Shutdown);
            flush_frame();
            g_ended = true;
        }
        control_reply_detached(client);
        if (g_fd >= 0) close_own(g_fd);
        g_fd = -1;
    }
    control_close();
    g_detach_fd.store(-1, std::memory_order_release);
    // Not under g_thread_lock: a thread that stops the writer holds it
    // while it joins this one. A thread that finds g_running still set
    // joins it; otherwise the next start does.
    g_writer_unjoined.store(true, std::memory_order_relaxed);
    if (!g_running.exchange(false)) g_writer_unjoined.store(false, std::memory_order_relaxed);
}

}  // namespace

bool writer_request_detach(int fd) {
    int none = -1;
    return g_detach_fd.compare_exchange_strong(none, fd);
}

void writer_pause() {
    stop_writer_thread();
    LockGuard guard(g_writer_lock);
    if (g_fd < 0 || g_ended) return;
    drain_published_locked();
    flush_frame();
}

void writer_stop(hslog::EndReason reason) {
    stop_writer_thread();
    LockGuard guard(g_writer_lock);
    if (g_fd < 0 || g_ended) return;
    drain_published_locked();
    put_end_record(reason);
    flush_frame();
    g_ended = true;
    close_own(g_fd);
    g_fd = -1;
}

bool writer_discard_if_empty() {
    stop_writer_thread();
    LockGuard guard(g_writer_lock);
    if (g_fd < 0 || g_ended) return false;
    drain_published_locked();
    if (events_encoded() || markers_encoded()) return false;
    // Unlinked by name only if the name is still the file written.
    struct stat ours, named;
    bool same = fstat(g_fd, &ours) == 0 && lstat(g_path, &named) == 0 && ours.st_dev == named.st_dev &&
                ours.st_ino == named.st_ino;
    if (same) unlink(g_path);
    g_ended = true;
    close_own(g_fd);
    g_fd = -1;
    return same;
}

void writer_forget_after_fork() {
    own_fds_forget_after_fork();
    g_writer_lock.reset();
    g_thread_lock.reset();
    raw_forget_after_fork();
    g_running.store(false);
    g_stop.store(false);
    g_intervals_closed.store(false);
    g_interval_busy.store(false);
    if (g_fd >= 0) close_own(g_fd);
    g_fd = -1;
    g_fill.frame_used = 0;
    g_compressing = Compressing{};
    if (g_wake_fd >= 0) close_own(g_wake_fd);
    g_wake_fd = -1;
    control_forget_after_fork();
}

const char* writer_log_path() { return g_path; }

int writer_log_fd() { return g_fd.load(std::memory_order_relaxed); }

LogStatus writer_log_status() {
    LockGuard guard(g_writer_lock);
    return LogStatus{events_encoded(), log_start_realtime_ns()};
}

// getpid, fstat and fchown only: async-signal-safe, no allocation, no
// lock (a signal handler may change uid while its thread holds the writer
// lock). The descriptor is checked to still be the log: one closed at exit
// meanwhile might have been reused by the program.
int64_t writer_give_log(uid_t uid) {
    OwnFdUse use;
    int fd = g_fd.load(std::memory_order_acquire);
    if (fd < 0 || uid == static_cast<uid_t>(-1) || getpid() != g_log_pid) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != g_log_dev || st.st_ino != g_log_ino || st.st_uid == uid) return -1;
    if (fchown(fd, uid, static_cast<gid_t>(-1)) != 0) return -1;
    return st.st_uid;
}

void writer_take_log_back(int64_t owner) {
    OwnFdUse use;
    int fd = g_fd.load(std::memory_order_acquire);
    if (owner < 0 || fd < 0 || getpid() != g_log_pid) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != g_log_dev || st.st_ino != g_log_ino) return;
    int ignored = fchown(fd, static_cast<uid_t>(owner), static_cast<gid_t>(-1));
    (void)ignored;
}

uint32_t writer_durable_marker() { return g_durable_marker.load(std::memory_order_acquire); }

uint32_t writer_marker_index(uint32_t token) {
    uint64_t entry = g_marker_tokens[token % kTokenMemory].load(std::memory_order_acquire);
    return (entry >> 32) == token ? static_cast<uint32_t>(entry) : 0;
}

}  // namespace heapsnap::recorder
