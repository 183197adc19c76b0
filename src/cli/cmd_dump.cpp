// `heapsnap dump LOG`: every record decoded, one per line, for debugging
// and for tests. The line format is in man/heapsnap-dump.1.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "format/log_reader.h"
#include "replay/marker_select.h"
#include "util/read_budget.h"
#include "util/text.h"

namespace heapsnap::cli {
namespace {

bool is_control(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }

// What quoted() writes between its quotes; `comma` escaped too (\x2c)
// where commas separate the items of a list (argv). Bytes above 0x7f as
// terminal_safe() leaves them: printable UTF-8 as it is, the rest escaped.
std::string escaped(const std::string& s, bool comma = false) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        char c = s[i];
        if (static_cast<unsigned char>(c) >= 0x80) {
            size_t end = i;
            while (end < s.size() && static_cast<unsigned char>(s[end]) >= 0x80) ++end;
            out += terminal_safe(std::string_view(s).substr(i, end - i));
            i = end;
            continue;
        }
        if (c == '"' || c == '\\')
            out += std::string("\\") + c;
        else if (is_control(c) || (comma && c == ','))
            out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        else
            out += c;
        ++i;
    }
    return out;
}

std::string quoted(const std::string& s) { return "\"" + escaped(s) + "\""; }

// What a parser splitting on spaces can read back whole as it is: not
// empty, no space, double quote, backslash or control character.
bool plain(const std::string& s) {
    return !s.empty() && std::none_of(s.begin(), s.end(), [](char c) {
        return is_control(c) || c == ' ' || c == '"' || c == '\\';
    }) && terminal_safe(s) == s;
}

// A path as it is where it is plain(); quoted() where it is not.
std::string field_text(const std::string& s) { return plain(s) ? s : quoted(s); }

// The items of a list joined with commas, each as `text` writes it.
template <class Text>
std::string comma_joined(const std::vector<std::string>& items, Text text) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + text(items[i]);
    return out;
}

// A command line, its arguments joined with commas: as they are where
// that is plain() and no argument has a comma of its own; otherwise
// quoted, each argument escaped as quoted() does and its own commas as
// \x2c, so that splitting the unquoted text on commas gives the arguments
// back.
std::string argv_text(const std::vector<std::string>& argv) {
    std::string raw = comma_joined(argv, [](const std::string& a) { return a; });
    bool own_commas =
        std::any_of(argv.begin(), argv.end(), [](const std::string& a) { return a.find(',') != std::string::npos; });
    if (plain(raw) && !own_commas) return raw;
    return "\"" + comma_joined(argv, [](const std::string& a) { return escaped(a, true); }) + "\"";
}

class Dumper : public LogVisitor {
public:
    void on_process(const ProcessInfo& p) override {
        start_ = p.start_ns;
        line(fmt::format("process pid={} ppid={} uid={} exe={} version={} depth={} unwind={} argv={}", p.pid, p.ppid,
                         p.uid, field_text(p.exe), field_text(p.recorder_version), p.max_depth,
                         p.unwind == hslog::UnwindMode::Dwarf ? "dwarf" : "fp", argv_text(p.argv)) +
             (p.attached ? " attached=1" : ""));
    }
    void on_module_load(const ModuleRecord& m) override {
        line(fmt::format("module id={} t={} bias={:#x} start={:#x} end={:#x} build_id={} path={}", m.id,
                         secs(start_ + m.time_ns), m.load_bias, m.start, m.end,
                         m.build_id.empty() ? "-" : hex_of(m.build_id), field_text(m.path)));
    }
    void on_module_unload(uint32_t module, uint64_t t) override {
        line(fmt::format("module-unload id={} t={}", module, secs(start_ + t)));
    }
    void on_stack(uint32_t stack, std::span<const StackFrame> frames) override {
        std::string list;
        for (const StackFrame& f : frames)
            list += fmt::format("{}{}:{:#x}", list.empty() ? "" : ",", f.module, f.vaddr);
        bool paused = frames.size() == 1 && hslog::is_paused_site_frame(frames[0].module, frames[0].vaddr);
        line(fmt::format("stack id={} frames={}{}", stack, list,
                         paused ? std::string(" site=") + quoted(hslog::kPausedSiteName) : ""));
    }
    void on_thread_start(const ThreadStartRecord& t) override {
        line(fmt::format("thread-start t={} thread={} tid={} stack={:#x}-{:#x}", secs(t.time_ns), t.thread, t.os_tid,
                         t.stack_lo, t.stack_hi));
    }
    void on_thread_exit(uint32_t thread, uint64_t t) override {
        line(fmt::format("thread-exit t={} thread={}", secs(t), thread));
    }
    // A small block shows its allocation info (the reader resolves an
    // AllocInfo record to the fn, size and stack of its first Alloc); a
    // block of 64 KiB or more has no info and shows its address.
    void on_alloc(const AllocEvent& e) override {
        std::string name = e.info ? fmt::format("info={}", e.info) : fmt::format("addr={:#x}", e.address);
        line(fmt::format("alloc t={} thread={} fn={} {} size={} stack={}", secs(e.time_ns), e.thread,
                         hslog::alloc_fn_name(e.fn), name, e.size, e.stack));
    }
    // A free names an allocation info (its newest live block is the one
    // freed), or the address of a block of 64 KiB or more, or of a block
    // the recorder never saw allocated (an untracked free), with its usable
    // size when the recorder took it (attached).
    void on_free(const FreeEvent& e) override {
        if (e.info)
            line(fmt::format("free t={} thread={} info={}", secs(e.time_ns), e.thread, e.info));
        else
            line(fmt::format("free t={} thread={} addr={:#x}{}{}", secs(e.time_ns), e.thread, e.address,
                             e.untracked ? " untracked=1" : "", e.usable ? fmt::format(" usable={}", e.usable) : ""));
    }
    void on_mmap(const MmapEvent& e) override {
        line(fmt::format("mmap t={} thread={} addr={:#x} length={} prot={} flags={:#x} stack={}", secs(e.time_ns),
                         e.thread, e.address, e.length, e.prot, e.flags, e.stack));
    }
    void on_munmap(const MunmapEvent& e) override {
        line(fmt::format("munmap t={} thread={} addr={:#x} length={}", secs(e.time_ns), e.thread, e.address, e.length));
    }
    void on_marker(const MarkerRecord& m) override {
        line(
            fmt::format("marker t={} thread={} index={} cause={} label={} events={} unrecorded={} rss_kb={} threads={} "
                        "regions={}",
                        secs(m.time_ns), m.thread, m.index, marker_cause_name(m.cause), quoted(m.label), m.events,
                        m.unrecorded, m.rss_kb, m.threads, m.regions.size()));
    }
    void on_end(const EndRecord& e) override {
        static const char* const reasons[] = {"exit", "exec", "shutdown"};
        auto r = static_cast<unsigned>(e.reason);
        line(fmt::format("end t={} reason={} events={} unrecorded={}", secs(e.time_ns), r < 3 ? reasons[r] : "?",
                         e.events, e.unrecorded));
    }

private:
    std::string secs(uint64_t t) const {
        uint64_t rel = t >= start_ ? t - start_ : 0;
        return fmt::format("{}.{:09}", rel / 1000000000, rel % 1000000000);
    }
    // A line costs more than the bytes it came from: each counts as
    // kLineVolume bytes of the read budget's volume (util/read_budget.h),
    // so that a small crafted log cannot print for minutes.
    static constexpr uint64_t kLineVolume = 48;
    static constexpr uint64_t kLinesPerCharge = 4096;
    void line(const std::string& s) {
        if (++lines_ % kLinesPerCharge == 0) budget_take_volume(kLinesPerCharge * kLineVolume);
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fputc('\n', stdout);
    }
    uint64_t start_ = 0;
    uint64_t lines_ = 0;
};

int dump(const std::string& log) {
    Dumper dumper;
    ReadSummary summary = read_log(LogFile{log}, dumper);
    std::fflush(stdout);
    if (summary.truncated)
        warn(log + ": the log ends inside a frame (the process was killed or is still running); read " +
             std::to_string(summary.frames) + " complete frames");
    return kExitOk;
}

}  // namespace

void setup_dump(CLI::App& app, Action& action) {
    auto log = std::make_shared<std::string>();
    CLI::App* sub = app.add_subcommand("dump", "Print every record of a log, one per line");
    sub->add_option("log", *log, "The .hslog file")->required();
    sub->footer("Example:\n  heapsnap dump app.hslog | grep '^alloc' | head");
    sub->callback([log, &action] { action = [log] { return dump(*log); }; });
}

}  // namespace heapsnap::cli
