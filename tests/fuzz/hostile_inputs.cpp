// hostile_inputs DIR REAL_ELF — writes the hand-made bad inputs that
// tests/fuzz/test_hostile_input.py feeds to the CLI: logs and snapshots
// that are empty, of another kind or version, cut inside every kind of
// record, announcing huge counts, naming stacks and modules that do not
// exist, or a build-id that does not match the file on disk (REAL_ELF, an
// existing ELF file with a build-id).
//
// Each file is built from the format's own pieces (hslog.h encoders,
// formats/hslog.md for the Process and Marker records, snapshot_file.h), so
// everything but the one defect is well-formed: a reader must get past the
// container and the checksums and meet the defect itself.
#include <sys/stat.h>
#include <zstd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "format/codec.h"
#include "format/hslog.h"
#include "format/snapshot_file.h"

using namespace heapsnap;

namespace {

std::string g_dir;

// A growable encoder with the codec's field encodings.
struct Enc {
    std::vector<uint8_t> b;
    void u8(uint8_t v) { b.push_back(v); }
    void varint(uint64_t v) {
        uint8_t tmp[codec::kMaxVarint];
        codec::Writer w(tmp, sizeof tmp);
        w.varint(v);
        b.insert(b.end(), tmp, tmp + w.size());
    }
    void svarint(int64_t v) { varint(codec::zigzag(v)); }
    void u32le(uint32_t v) {
        for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
    }
    void str(const std::string& s) {
        varint(s.size());
        b.insert(b.end(), s.begin(), s.end());
    }
    void append(const Enc& o) { b.insert(b.end(), o.b.begin(), o.b.end()); }
    // Records through the recorder's own encoders (hslog.h).
    template <class Fn>
    void rec(Fn&& fn) {
        uint8_t tmp[4096];
        codec::Writer w(tmp, sizeof tmp);
        fn(w);
        b.insert(b.end(), tmp, tmp + w.size());
    }
};

const std::string kControlLabel =
    "A\x1b]0;owned\x07\x1b[2J\r\nforged: 0 bytes\x7f\xc2\x9b"
    "31m\xe2\x80\xae"
    "evil";
const std::string kControlExe = "/nonexistent/app\x1b[31m\nforged";
const std::string kControlModule = "/nonexistent/lib\x1b]0;x\x07,\"q\".so";

std::vector<uint8_t> header(uint32_t version = hslog::kLogVersion) {
    Enc h;
    h.b.assign(hslog::kMagic, hslog::kMagic + 8);
    h.u32le(version);
    h.u32le(0);
    return h.b;
}

std::vector<uint8_t> frame(const std::vector<uint8_t>& payload) {
    std::vector<uint8_t> out(ZSTD_compressBound(payload.size()));
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    size_t n = ZSTD_compress2(c, out.data(), out.size(), payload.data(), payload.size());
    ZSTD_freeCCtx(c);
    if (ZSTD_isError(n)) std::abort();
    out.resize(n);
    return out;
}

void write(const std::string& name, const std::vector<uint8_t>& bytes) {
    std::ofstream f(g_dir + "/" + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
        std::perror(name.c_str());
        std::exit(1);
    }
}

// A log: header, then one frame per payload.
void write_log(const std::string& name, const std::vector<std::vector<uint8_t>>& payloads,
               uint32_t version = hslog::kLogVersion) {
    std::vector<uint8_t> file = header(version);
    for (const auto& p : payloads) {
        std::vector<uint8_t> f = frame(p);
        file.insert(file.end(), f.begin(), f.end());
    }
    write(name, file);
}

Enc process_record(const std::string& exe = "/nonexistent/hostile-app") {
    Enc e;
    e.u8(static_cast<uint8_t>(hslog::Tag::Process));
    e.str("0.1.0");
    e.varint(4242);                    // pid
    e.varint(4241);                    // ppid
    e.varint(1000);                    // uid
    e.varint(1700000000000000000ull);  // start_realtime_ns
    e.varint(1000000000ull);           // start_ns
    e.varint(4096);                    // page_size
    e.u8(0);                           // unwind: dwarf
    e.varint(64);                      // max_depth
    e.str(exe);
    e.str(std::string("hostile-app\0--flag\0", 19));
    e.varint(0);  // sample_bytes: exact
    e.u8(0);      // attached: no (version 10)
    return e;
}

Enc marker_record(uint32_t index, hslog::MarkerCause cause, const std::string& label, uint64_t events,
                  uint32_t regions_claimed = 1, bool with_region = true) {
    Enc e;
    e.u8(static_cast<uint8_t>(hslog::Tag::Marker));
    e.varint(5);  // dt
    e.varint(0);  // thread
    e.varint(events);
    e.varint(0);  // unrecorded
    e.varint(index);
    e.u8(static_cast<uint8_t>(cause));
    e.str(label);
    e.varint(2048);   // rss_kb
    e.varint(2);      // threads
    e.varint(65536);  // recorder_bytes
    e.u8(1);          // mallinfo2 follows
    for (int i = 0; i < 7; ++i) e.varint(1000 + i);
    e.u32le(regions_claimed);
    if (with_region) {
        e.svarint(0x555555554000);  // start
        e.varint(0x21000);          // length
        e.u8(3);                    // rw
        e.u8(0);                    // hint
        e.varint(0);                // offset
        e.varint(0);                // inode
        e.str("[heap]");
        for (int i = 0; i < 4; ++i) e.varint(132 - i);
    }
    return e;
}

// The records of a well-formed log, one Enc per record, in order; the
// comments name the kinds the truncation cases cut.
std::vector<std::pair<std::string, Enc>> good_records(const std::string& module_path, const std::string& build_id,
                                                      uint32_t second_frame_module = 1) {
    std::vector<std::pair<std::string, Enc>> r;
    r.emplace_back("process", process_record());
    Enc m;
    m.rec([&](codec::Writer& w) {
        hslog::put_module_load(w, 1, 1, 0x555555554000, 0x555555554000, 0x555555559000, module_path.data(),
                               module_path.size(), reinterpret_cast<const uint8_t*>(build_id.data()), build_id.size());
    });
    r.emplace_back("module", m);
    Enc s1;
    s1.rec([](codec::Writer& w) {
        hslog::put_stack_header(w, 1, 2);
        hslog::put_stack_frame(w, 1, 0x1139);
        hslog::put_stack_frame(w, 1, 0x1189);
    });
    r.emplace_back("stack", s1);
    Enc s2;
    s2.rec([&](codec::Writer& w) {
        hslog::put_stack_header(w, 2, 1);
        hslog::put_stack_frame(w, second_frame_module, 0x2222);
    });
    r.emplace_back("stack2", s2);
    // Thread 40 takes the two-byte Thread record, which can be cut; a
    // ShortThread (indices below 32) is one byte.
    Enc th;
    th.rec([](codec::Writer& w) { hslog::put_thread(w, 40); });
    r.emplace_back("thread", th);
    Enc ts;
    ts.rec([](codec::Writer& w) { hslog::put_thread_start(w, 1, 1, 4243, 0x7f0000000000, 0x7f0000800000); });
    r.emplace_back("thread-start", ts);
    r.emplace_back("marker", marker_record(1, hslog::MarkerCause::User, "A", 0));
    Enc a1;
    a1.rec([](codec::Writer& w) {
        hslog::put_time(w, 3);
        hslog::put_alloc(w, hslog::AllocFn::Malloc, 100, 1);
    });  // info 1
    r.emplace_back("alloc", a1);
    Enc a2;
    a2.rec([](codec::Writer& w) { hslog::put_alloc(w, hslog::AllocFn::Calloc, 200, 2); });  // info 2
    r.emplace_back("alloc2", a2);
    Enc a3;
    a3.rec([](codec::Writer& w) { hslog::put_alloc(w, hslog::AllocFn::Malloc, 300, 1); });  // info 3
    r.emplace_back("alloc3", a3);
    Enc fr;
    fr.rec([](codec::Writer& w) { hslog::put_free(w, 3); });  // frees the 300-byte block
    r.emplace_back("free", fr);
    Enc mm;
    mm.rec([](codec::Writer& w) { hslog::put_mmap(w, 0x100000, 8192, 3, 0x22, 1); });
    r.emplace_back("mmap", mm);
    Enc mu;
    mu.rec([](codec::Writer& w) { hslog::put_munmap(w, 4096, 4096); });  // its second page
    r.emplace_back("munmap", mu);
    Enc te;
    te.rec([](codec::Writer& w) { hslog::put_thread_exit(w, 1, 1); });
    r.emplace_back("thread-exit", te);
    Enc mu2;
    mu2.rec([](codec::Writer& w) { hslog::put_module_unload(w, 1, 1); });
    r.emplace_back("module-unload", mu2);
    r.emplace_back("exit-marker", marker_record(2, hslog::MarkerCause::Exit, "exit", 6));
    Enc end;
    end.rec([](codec::Writer& w) { hslog::put_end(w, 1, hslog::EndReason::Exit, 6, 0); });
    r.emplace_back("end", end);
    return r;
}

std::vector<uint8_t> join(const std::vector<std::pair<std::string, Enc>>& records, size_t from, size_t to) {
    Enc all;
    for (size_t i = from; i < to && i < records.size(); ++i) all.append(records[i].second);
    return all.b;
}

// The well-formed log in two frames, split after the first marker.
void write_good(const std::string& name, const std::vector<std::pair<std::string, Enc>>& records) {
    size_t split = 0;
    while (records[split].first != "marker") ++split;
    write_log(name, {join(records, 0, split + 1), join(records, split + 1, records.size())});
}

// A log whose payload is `records` followed by `extra`.
void write_with(const std::string& name, const std::vector<std::pair<std::string, Enc>>& records, size_t upto,
                const Enc& extra) {
    std::vector<uint8_t> p = join(records, 0, upto);
    p.insert(p.end(), extra.b.begin(), extra.b.end());
    write_log(name, {p});
}

size_t index_of(const std::vector<std::pair<std::string, Enc>>& records, const std::string& kind) {
    for (size_t i = 0; i < records.size(); ++i)
        if (records[i].first == kind) return i;
    std::abort();
}

void logs(const std::string& real_elf, const std::string& real_build_id) {
    const std::string fake_build_id = "\x12\x34\x56\x78";
    auto records = good_records("/nonexistent/hostile-app", fake_build_id);
    write_good("good.hslog", records);

    // Containers: empty, other magic, cut header, other versions, no frame.
    write("empty.hslog", {});
    write("bad-magic.hslog", {'N', 'O', 'T', 'A', 'L', 'O', 'G', '!', 1, 0, 0, 0, 0, 0, 0, 0, 0x28, 0xb5});
    write("short-header.hslog", {'H', 'E', 'A', 'P', 'S', 'N'});
    write_log("newer-version.hslog", {join(records, 0, records.size())}, hslog::kLogVersion + 1);
    write_log("version-max.hslog", {join(records, 0, records.size())}, 0xffffffffu);
    write("header-only.hslog", header());

    // Cut inside each kind of record: the frame is whole (checksum right),
    // the record runs past its end.
    for (size_t i = 0; i < records.size(); ++i) {
        const auto& [kind, enc] = records[i];
        if (kind == "stack2" || kind == "alloc2" || kind == "alloc3") continue;
        std::vector<uint8_t> p = join(records, 0, i);
        p.insert(p.end(), enc.b.begin(), enc.b.end() - 1);
        write_log("cut-" + kind + ".hslog", {p});
    }

    // Impossible records.
    size_t body = index_of(records, "marker");
    Enc unknown;
    unknown.u8(0x75);
    unknown.varint(1);
    write_with("unknown-tag.hslog", records, body, unknown);
    write_log("no-process-first.hslog", {join(records, 1, records.size())});
    write_with("second-process.hslog", records, body, process_record("/nonexistent/other"));

    // Huge counts: each must be refused before it drives an allocation.
    Enc frames;
    frames.u8(static_cast<uint8_t>(hslog::Tag::Stack));
    frames.varint(3);
    frames.varint(uint64_t{1} << 40);  // 2^40 frames
    frames.varint(1);
    frames.varint(0x10);
    write_with("huge-frame-count.hslog", records, body, frames);
    write_with("huge-region-count.hslog", records, body,
               marker_record(2, hslog::MarkerCause::User, "B", 3, 0xffffffffu, true));
    Enc long_exe;
    long_exe.u8(static_cast<uint8_t>(hslog::Tag::Process));
    long_exe.str("0.1.0");
    for (int i = 0; i < 6; ++i) long_exe.varint(1);
    long_exe.u8(0);
    long_exe.varint(64);
    long_exe.varint(uint64_t{1} << 60);  // exe: a 2^60-byte string
    write_log("huge-string.hslog", {long_exe.b});
    Enc big_id;
    big_id.rec([](codec::Writer& w) {
        hslog::put_stack_header(w, 4000000000u, 1);
        hslog::put_stack_frame(w, 1, 0x10);
        hslog::put_alloc(w, hslog::AllocFn::Malloc, 10, 4000000000u);
    });
    write_with("huge-stack-id.hslog", records, body, big_id);
    Enc undefined;
    undefined.rec([](codec::Writer& w) { hslog::put_alloc(w, hslog::AllocFn::Malloc, 10, 7); });
    write_with("undefined-stack.hslog", records, body, undefined);
    Enc null_block;
    null_block.rec([](codec::Writer& w) { hslog::put_alloc_at(w, hslog::AllocFn::Malloc, 0, 70000, 1); });
    write_with("alloc-at-null.hslog", records, index_of(records, "alloc") + 1, null_block);
    // Frees of an info no Alloc defined, or of one with no live block left.
    Enc unknown_block;
    unknown_block.rec([](codec::Writer& w) { hslog::put_free(w, 7); });
    write_with("free-of-unknown-block.hslog", records, index_of(records, "alloc") + 1, unknown_block);
    Enc twice;
    twice.rec([](codec::Writer& w) { hslog::put_free(w, 3); });
    write_with("free-twice.hslog", records, index_of(records, "free") + 1, twice);
    // A thread index near 2^32 is legal (a fork child keeps its parent's
    // numbering): it must work, without a table of 2^32 threads.
    Enc far_thread;
    far_thread.rec([](codec::Writer& w) {
        hslog::put_thread(w, 0xfffffff0u);
        hslog::put_alloc(w, hslog::AllocFn::Malloc, 10, 1);
        hslog::put_free(w, 1);
    });
    {
        std::vector<uint8_t> p = join(records, 0, body + 1);
        p.insert(p.end(), far_thread.b.begin(), far_thread.b.end());
        std::vector<uint8_t> rest = join(records, body + 1, records.size());
        p.insert(p.end(), rest.begin(), rest.end());
        write_log("far-thread-index.hslog", {p});
    }

    // zstd frames a reader must not trust: 2^40 bytes announced, no size.
    {
        std::vector<uint8_t> file = header();
        std::vector<uint8_t> first = frame(join(records, 0, body + 1));
        file.insert(file.end(), first.begin(), first.end());
        // magic, descriptor (8-byte content size, single segment), size, one raw block of 1 byte
        std::vector<uint8_t> big = {0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 0, 1, 0, 0, 0x09, 0, 0, 0x7f};
        std::vector<uint8_t> huge = file;
        huge.insert(huge.end(), big.begin(), big.end());
        write("frame-huge-size.hslog", huge);
        // descriptor 0: no content size, a window descriptor byte, then the block
        std::vector<uint8_t> unsized = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50, 0x09, 0, 0, 0x7f};
        file.insert(file.end(), unsized.begin(), unsized.end());
        write("frame-no-size.hslog", file);
    }

    // Stacks naming a module the log never loaded (stack 2's frame names
    // module 99): frames degrade to addresses, nothing fails.
    write_good("unknown-module.hslog", good_records("/nonexistent/hostile-app", fake_build_id, 99));
    // The module is a real file, but not the one recorded (other build-id):
    // never a wrong name; one warning.
    std::string wrong = real_build_id;
    for (char& c : wrong) c = static_cast<char>(~c);
    write_good("mismatched-build-id.hslog", good_records(real_elf, wrong));
    write_good("matching-build-id.hslog", good_records(real_elf, real_build_id));

    // Text a foreign log may hold to take over a terminal: a label, a
    // program and a module path with ESC sequences (set the title, clear
    // the screen, colour), BEL, CR and LF (a forged line), DEL, a C1 CSI
    // and a bidirectional override.
    auto controls = good_records(kControlModule, fake_build_id);
    controls[0].second = process_record(kControlExe);
    controls[index_of(controls, "marker")].second = marker_record(1, hslog::MarkerCause::User, kControlLabel, 0);
    write_good("control-chars.hslog", controls);
}

// ---- bombs: small files that describe a lot --------------------------------
//
// Each is a valid log (or snapshot) under 1 MB whose frames decompress to
// what a reader would have to hold or chew through: a record repeated
// until the frame is full compresses to almost nothing. A reader must
// refuse them (a declared count beyond a limit is corruption; a read that
// needs more memory or work than such a small file can justify stops with
// one error) within 256 MiB and 10 s.

constexpr size_t kBombFrame = 16u << 20;  // the largest frame payload a reader accepts

// `frames` frames of up to `kBombFrame` bytes each holding `unit`
// repeated (the first starts with `head`, and holds `first_units` units if
// that is not 0).
void write_bomb(const std::string& name, const Enc& head, const Enc& unit, int frames, size_t first_units = 0) {
    auto fill = [&](std::vector<uint8_t> p, size_t units) {
        for (size_t i = 0; units ? i < units : p.size() + unit.b.size() <= kBombFrame; ++i)
            p.insert(p.end(), unit.b.begin(), unit.b.end());
        return p;
    };
    std::vector<uint8_t> file = header();
    std::vector<uint8_t> first = frame(fill(head.b, first_units));
    file.insert(file.end(), first.begin(), first.end());
    if (frames > 1) {
        std::vector<uint8_t> other = frame(fill({}, 0));  // the same bytes each time
        for (int f = 1; f < frames; ++f) file.insert(file.end(), other.begin(), other.end());
    }
    write(name, file);
}

void bombs() {
    auto records = good_records("/nonexistent/hostile-app", "\x12\x34\x56\x78");
    Enc head;  // process, module, two stacks, a marker
    head.b = join(records, 0, index_of(records, "marker") + 1);

    // One stack of millions of frames (the recorder writes at most 256).
    {
        Enc frame;
        frame.rec([](codec::Writer& w) { hslog::put_stack_frame(w, 1, 0x1139); });
        auto count = static_cast<uint32_t>((kBombFrame - head.b.size() - 64) / frame.b.size());
        Enc h = head;
        h.rec([&](codec::Writer& w) { hslog::put_stack_header(w, 3, count); });
        write_bomb("bomb-stack-frames.hslog", h, frame, 1, count);
    }
    // Stacks of 256 frames, the same id over and over.
    {
        Enc stack;
        stack.rec([](codec::Writer& w) {
            hslog::put_stack_header(w, 3, 256);
            for (int i = 0; i < 256; ++i) hslog::put_stack_frame(w, 1, 0x1139);
        });
        write_bomb("bomb-stack-again.hslog", head, stack, 8);
    }
    // A marker of a million and a half regions, as many as a frame holds.
    {
        Enc region;
        region.svarint(0);
        region.varint(4096);
        region.u8(3);
        region.u8(0);
        region.varint(0);
        region.varint(0);
        region.str("");
        for (int i = 0; i < 4; ++i) region.varint(1);
        auto count = static_cast<uint32_t>((kBombFrame - head.b.size() - 256) / region.b.size());
        Enc h = head;
        h.append(marker_record(2, hslog::MarkerCause::User, "B", 3, count, false));
        write_bomb("bomb-regions.hslog", h, region, 1, count);
    }
    // Millions of small markers.
    write_bomb("bomb-markers.hslog", head, marker_record(2, hslog::MarkerCause::User, "B", 3, 0, false), 8);
    // Markers with long labels (the recorder keeps 256 bytes).
    write_bomb("bomb-labels.hslog", head,
               marker_record(2, hslog::MarkerCause::User, std::string(1u << 20, 'L'), 3, 0, false), 8);
    // Live blocks: one allocation info allocated again and again.
    {
        Enc h = head;
        h.rec([](codec::Writer& w) { hslog::put_alloc(w, hslog::AllocFn::Malloc, 16, 1); });
        Enc again;
        again.rec([](codec::Writer& w) { hslog::put_alloc_info(w, 1); });
        write_bomb("bomb-blocks.hslog", h, again, 16);
        // 16 million: more than the default budget, within 512 MiB.
        write_bomb("blocks-16m.hslog", h, again, 2);
    }
    // Allocation infos: the same triple defined again and again.
    {
        Enc alloc;
        alloc.rec([](codec::Writer& w) { hslog::put_alloc(w, hslog::AllocFn::Malloc, 16, 1); });
        write_bomb("bomb-infos.hslog", head, alloc, 8);
    }
    // Live mappings, one page each, side by side.
    {
        Enc mmap;
        mmap.rec([](codec::Writer& w) { hslog::put_mmap(w, 8192, 4096, 3, 0x22, 1); });
        write_bomb("bomb-mappings.hslog", head, mmap, 8);
    }
    // Work: a block allocated and freed, billions of times.
    {
        Enc h = head;
        h.rec([](codec::Writer& w) {
            hslog::put_alloc(w, hslog::AllocFn::Malloc, 16, 1);
            hslog::put_free(w, 1);
        });
        Enc pair;
        pair.rec([](codec::Writer& w) {
            hslog::put_alloc_info(w, 1);
            hslog::put_free(w, 1);
        });
        write_bomb("bomb-events.hslog", h, pair, 400);
    }
}

// ---- snapshots ------------------------------------------------------------------

Snapshot small_snapshot(const std::string& exe) {
    Snapshot s;
    s.process.recorder_version = "0.1.0";
    s.process.pid = 4242;
    s.process.exe = exe;
    s.process.start_ns = 1000000000ull;
    s.process.argv = {exe};
    s.marker.index = 1;
    s.marker.label = "A";
    s.marker.time_ns = 1000500000ull;
    s.source = "/nonexistent/hostile.hslog";
    SnapshotModule m;
    m.record.id = 1;
    m.record.path = exe;
    m.record.build_id = "\x12\x34";
    s.modules.push_back(m);
    s.stacks[1] = {StackFrame{1, 0x1139}, StackFrame{1, 0x1189}};
    s.stacks[2] = {StackFrame{99, 0x2222}};  // a module the snapshot does not have
    s.entries.push_back(SnapshotEntry{1, EntryKind::Heap, 100, 1, 10, 10});
    s.entries.push_back(SnapshotEntry{2, EntryKind::Heap, 200, 2, 10, 20});
    s.totals.live_bytes = 300;
    s.totals.live_blocks = 3;
    return s;
}

std::vector<uint8_t> read_back(const std::string& name) {
    std::ifstream f(g_dir + "/" + name, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void snapshots() {
    write_snapshot(g_dir + "/good.hsnap", small_snapshot("/nonexistent/hostile-app"));
    write_snapshot(g_dir + "/other-program.hsnap", small_snapshot("/nonexistent/another-app"));
    Snapshot controls = small_snapshot(kControlExe);
    controls.marker.label = kControlLabel;
    controls.modules[0].record.path = kControlModule;
    controls.has_marker_data = true;
    MapRegion region;
    region.start = 0x555555554000;
    region.end = 0x555555559000;
    region.perms = 5;
    region.path = kControlModule;
    region.rss_kb = 20;
    controls.marker.regions.push_back(region);
    write_snapshot(g_dir + "/control-chars.hsnap", controls);
    std::vector<uint8_t> good = read_back("good.hsnap");

    write("empty.hsnap", {});
    std::vector<uint8_t> magic = good;
    std::memcpy(magic.data(), "NOTASNAP", 8);
    write("bad-magic.hsnap", magic);
    write("short-header.hsnap", std::vector<uint8_t>(good.begin(), good.begin() + 12));
    std::vector<uint8_t> newer = good;
    newer[8]++;
    write("newer-version.hsnap", newer);
    write("cut-frame.hsnap", std::vector<uint8_t>(good.begin(), good.end() - 5));
    // A complete frame announcing a body of 4 GiB - 1 that holds one byte.
    std::vector<uint8_t> huge(good.begin(), good.begin() + 16);
    std::vector<uint8_t> claim = {0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0x09, 0, 0, 0x7f};
    huge.insert(huge.end(), claim.begin(), claim.end());
    write("huge-body-size.hsnap", huge);
    std::vector<uint8_t> trailing = good;
    trailing.insert(trailing.end(), {'x', 'y', 'z'});
    write("trailing-bytes.hsnap", trailing);
    std::vector<uint8_t> flipped = good;
    flipped[flipped.size() - 1] ^= 0xff;  // the checksum
    write("bad-checksum.hsnap", flipped);

    // Well-formed containers around bodies a reader must refuse.
    std::vector<uint8_t> body(ZSTD_getFrameContentSize(good.data() + 16, good.size() - 16));
    ZSTD_decompress(body.data(), body.size(), good.data() + 16, good.size() - 16);
    auto with_body = [&](const std::string& name, const std::vector<uint8_t>& b) {
        std::vector<uint8_t> file(good.begin(), good.begin() + 16);
        std::vector<uint8_t> f = frame(b);
        file.insert(file.end(), f.begin(), f.end());
        write(name, file);
    };
    with_body("cut-body.hsnap", std::vector<uint8_t>(body.begin(), body.end() - 3));
    std::vector<uint8_t> longer = body;
    longer.push_back(0);
    with_body("body-trailing.hsnap", longer);
    // Counts: the module count follows process, marker, source and totals;
    // rebuild the body up to there with a count of 2^40.
    {
        Snapshot s = small_snapshot("/nonexistent/hostile-app");
        ByteBuffer o;
        put_process(o, s.process);
        put_marker(o, s.marker, s.has_marker_data);
        o.str(s.source);
        for (int i = 0; i < 9; ++i) o.varint(0);
        std::vector<uint8_t> prefix = o.bytes();
        ByteBuffer count;
        count.varint(uint64_t{1} << 40);
        prefix.insert(prefix.end(), count.bytes().begin(), count.bytes().end());
        with_body("huge-module-count.hsnap", prefix);
        ByteBuffer regions;
        put_process(regions, s.process);
        std::vector<uint8_t> r = regions.bytes();
        Enc m;  // a marker whose region count is 2^40
        m.u8(1);
        for (int i = 0; i < 3; ++i) m.varint(1);
        m.u8(0);
        m.str("A");
        for (int i = 0; i < 11; ++i) m.varint(1);
        m.varint(uint64_t{1} << 40);
        r.insert(r.end(), m.b.begin(), m.b.end());
        with_body("huge-region-count.hsnap", r);
    }
    // Its module is a FIFO (created below): opening it to symbolize would
    // block for ever.
    write_snapshot(g_dir + "/fifo-module.hsnap", small_snapshot(g_dir + "/fifo"));
    if (mkfifo((g_dir + "/fifo").c_str(), 0600) != 0) {
        std::perror("mkfifo");
        std::exit(1);
    }
    Snapshot unknown = small_snapshot("/nonexistent/hostile-app");
    unknown.entries.push_back(SnapshotEntry{77, EntryKind::Heap, 5, 1, 0, 0});
    write_snapshot(g_dir + "/entry-unknown-stack.hsnap", unknown);
    Snapshot kind = small_snapshot("/nonexistent/hostile-app");
    kind.entries[0].kind = static_cast<EntryKind>(7);
    write_snapshot(g_dir + "/entry-bad-kind.hsnap", kind);
}

std::string build_id_of(const std::string& elf) {
    // The GNU build-id note: namesz 4, descsz, type 3, "GNU\0", desc.
    std::vector<uint8_t> bytes;
    {
        std::ifstream f(elf, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    static const uint8_t pattern[] = {4, 0, 0, 0};
    for (size_t i = 0; i + 16 < bytes.size(); ++i) {
        if (std::memcmp(&bytes[i], pattern, 4) != 0 || bytes[i + 8] != 3 || bytes[i + 9] != 0 ||
            std::memcmp(&bytes[i + 12], "GNU\0", 4) != 0)
            continue;
        uint32_t n = bytes[i + 4] | bytes[i + 5] << 8;
        if (n == 0 || n > 64 || i + 16 + n > bytes.size()) continue;
        return std::string(reinterpret_cast<const char*>(&bytes[i + 16]), n);
    }
    return "";
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: hostile_inputs DIR REAL_ELF\n");
        return 2;
    }
    g_dir = argv[1];
    std::string id = build_id_of(argv[2]);
    if (id.empty()) {
        std::fprintf(stderr, "hostile_inputs: %s has no build-id note\n", argv[2]);
        return 1;
    }
    logs(argv[2], id);
    bombs();
    snapshots();
    return 0;
}
