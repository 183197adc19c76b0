#include "recorder/steering.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/hslog.h"
#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/markers.h"
#include "recorder/own_fds.h"
#include "recorder/stack_table.h"

namespace heapsnap::recorder {

// A line of its own: the hooks read it on every event, the writer writes
// it a few times a run.
alignas(64) std::atomic<uint32_t> g_paused_site{0};

namespace {

constexpr uint64_t kRssCheckNs = 100'000'000;
constexpr double kMaxStacksAfterS = 30.0 * 86400;
constexpr int kMaxRules = 16;
constexpr size_t kMaxLabel = 64;  // "growth>" + 20 digits + unit + "#" + 20 digits fits

enum class RuleKind { Rss, Live, Growth };

struct Rule {
    RuleKind kind;
    uint64_t bytes;
    char label[kMaxLabel];  // the rule as written in the environment: "rss>1G"
    uint64_t fired;         // rss, live: 1 once fired; growth: the highest multiple marked
};

Rule g_rules[kMaxRules];
int g_rule_count = 0;
bool g_start_paused = false;
double g_stacks_after_s = 0;
// CLOCK_MONOTONIC ns when --stacks-after resumes; 0: no timer pending.
// Writer thread (and initialization, before it runs).
uint64_t g_resume_at_ns = 0;
// The current log has had its pause marker (steering_mark_start): the
// writer thread and the thread that started it both ask.
std::atomic<bool> g_log_marked{false};
uint64_t g_last_rss_check_ns = 0;

bool rss_pending() {
    for (int i = 0; i < g_rule_count; ++i)
        if (g_rules[i].kind == RuleKind::Rss && !g_rules[i].fired) return true;
    return false;
}

// One rule of HEAPSNAP_SNAPSHOT_WHEN, [text, end): KIND>DIGITS[KMGT].
bool parse_rule(const char* text, const char* end, Rule& rule) {
    static const struct {
        const char* prefix;
        RuleKind kind;
    } kinds[] = {{"rss>", RuleKind::Rss}, {"live>", RuleKind::Live}, {"growth>", RuleKind::Growth}};
    const char* p = nullptr;
    for (const auto& k : kinds) {
        size_t n = strlen(k.prefix);
        if (static_cast<size_t>(end - text) > n && strncmp(text, k.prefix, n) == 0) {
            rule.kind = k.kind;
            p = text + n;
            break;
        }
    }
    if (!p) return false;
    uint64_t value = 0;
    const char* digits = p;
    while (p < end && *p >= '0' && *p <= '9') {
        if (value > (UINT64_MAX - 9) / 10) return false;
        value = value * 10 + static_cast<uint64_t>(*p++ - '0');
    }
    if (p == digits) return false;
    unsigned shift = 0;
    if (p < end) {
        const char* units = "KMGT";
        const char* unit = strchr(units, *p);
        if (!unit || !*p) return false;
        shift = 10 * static_cast<unsigned>(unit - units + 1);
        ++p;
    }
    if (p != end || value == 0 || (shift && value > (UINT64_MAX >> shift))) return false;
    rule.bytes = value << shift;
    size_t len = static_cast<size_t>(end - text);
    if (len >= kMaxLabel) return false;
    memcpy(rule.label, text, len);
    rule.label[len] = 0;
    rule.fired = 0;
    return true;
}

void parse_rules(const char* text) {
    for (const char* p = text; *p;) {
        const char* end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        Rule rule{};
        char item[kMaxLabel];
        size_t len = static_cast<size_t>(end - p) < sizeof item - 1 ? static_cast<size_t>(end - p) : sizeof item - 1;
        memcpy(item, p, len);
        item[len] = 0;
        if (g_rule_count == kMaxRules) {
            diagnostic("ignoring HEAPSNAP_SNAPSHOT_WHEN rule ", item, " (at most 16 rules)");
        } else if (!parse_rule(p, end, rule)) {
            diagnostic("ignoring HEAPSNAP_SNAPSHOT_WHEN rule ", item,
                       " (expected rss>SIZE, live>SIZE or growth>SIZE; SIZE a whole number with K, M, G or T)");
        } else if (rule.kind != RuleKind::Rss && config().sample_bytes) {
            diagnostic("ignoring HEAPSNAP_SNAPSHOT_WHEN rule ", item,
                       " (a sampled recording does not count the live heap exactly)");
        } else {
            g_rules[g_rule_count++] = rule;
        }
        p = *end ? end + 1 : end;
    }
}

// The resident set from /proc/self/statm (its second field, in pages);
// 0 when it cannot be read.
uint64_t read_rss_bytes() {
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[128];
    ssize_t n;
    do n = read(fd, buf, sizeof buf - 1);
    while (n < 0 && errno == EINTR);
    close_own(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char* p = strchr(buf, ' ');
    if (!p) return 0;
    return strtoull(p + 1, nullptr, 10) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// The id of the paused site's stack, interned on first use.
uint32_t paused_site_id() {
    static uint32_t id = 0;
    if (!id) {
        const uint64_t frame = hslog::kPausedSiteVaddr;
        id = intern_stack(&frame, 1, stack_hash(&frame, 1));
    }
    return id;
}

void fire(Rule& rule, uint64_t multiple) {
    char label[2 * kMaxLabel];
    size_t n = strlen(rule.label);
    memcpy(label, rule.label, n + 1);
    if (multiple > 1) {
        label[n] = '#';
        format_uint(multiple, label + n + 1);
    }
    take_marker(hslog::MarkerCause::Threshold, label);
}

SteerOutcome pause_stacks() {
    SteerOutcome out;
    if (paused_site()) {
        out.unchanged = true;
        return out;
    }
    uint32_t site = paused_site_id();
    if (!site) {
        out.failed = true;
        return out;
    }
    g_paused_site.store(site, std::memory_order_relaxed);
    out.token = take_marker(hslog::MarkerCause::Pause, "pause");
    out.failed = out.token == 0;
    return out;
}

SteerOutcome resume_stacks() {
    SteerOutcome out;
    g_resume_at_ns = 0;
    if (!paused_site()) {
        out.unchanged = true;
        return out;
    }
    g_paused_site.store(0, std::memory_order_relaxed);
    out.token = take_marker(hslog::MarkerCause::Resume, "resume");
    out.failed = out.token == 0;
    return out;
}

}  // namespace

void steering_read_config(const char* paused, const char* stacks_after, const char* rules) {
    g_start_paused = false;
    g_stacks_after_s = 0;
    g_rule_count = 0;
    if (paused && *paused) {
        if (strcmp(paused, "1") == 0)
            g_start_paused = true;
        else if (strcmp(paused, "0") != 0)
            diagnostic("ignoring HEAPSNAP_PAUSED=", paused, " (expected 0 or 1)");
    }
    if (stacks_after && *stacks_after) {
        char* end = nullptr;
        errno = 0;
        double s = strtod(stacks_after, &end);
        if (errno || *end || !(s >= 0.001 && s <= kMaxStacksAfterS))
            diagnostic("ignoring HEAPSNAP_STACKS_AFTER=", stacks_after, " (expected seconds from 0.001 to 2592000)");
        else
            g_stacks_after_s = s;
    }
    if (rules && *rules) parse_rules(rules);
}

void steering_start() {
    if (!g_start_paused && !g_stacks_after_s) return;
    uint32_t site = paused_site_id();
    if (!site) return;
    g_paused_site.store(site, std::memory_order_relaxed);
    if (g_stacks_after_s) g_resume_at_ns = now_ns() + static_cast<uint64_t>(g_stacks_after_s * 1e9);
}

void steering_log_opened() {
    g_log_marked.store(false);
    g_last_rss_check_ns = 0;
    for (int i = 0; i < g_rule_count; ++i) g_rules[i].fired = 0;
}

void steering_mark_start() {
    if (!paused_site() || g_log_marked.exchange(true)) return;
    if (!take_marker(hslog::MarkerCause::Pause, "pause")) g_log_marked.store(false);
}

void steering_tick(uint64_t now, uint64_t live_bytes, bool marker_seen) {
    if (g_resume_at_ns && now >= g_resume_at_ns) resume_stacks();
    uint64_t rss = 0;
    if (rss_pending() && (marker_seen || now - g_last_rss_check_ns >= kRssCheckNs)) {
        g_last_rss_check_ns = now;
        rss = read_rss_bytes();
    }
    for (int i = 0; i < g_rule_count; ++i) {
        Rule& r = g_rules[i];
        switch (r.kind) {
            case RuleKind::Rss:
                if (!r.fired && rss > r.bytes) {
                    r.fired = 1;
                    fire(r, 1);
                }
                break;
            case RuleKind::Live:
                if (!r.fired && live_bytes > r.bytes) {
                    r.fired = 1;
                    fire(r, 1);
                }
                break;
            case RuleKind::Growth: {
                // The multiples of r.bytes the live heap exceeds (it starts
                // the log at 0).
                uint64_t multiple = live_bytes ? (live_bytes - 1) / r.bytes : 0;
                if (multiple > r.fired) {
                    r.fired = multiple;
                    fire(r, multiple);
                }
                break;
            }
        }
    }
}

uint64_t steering_deadline() { return g_resume_at_ns; }

bool steering_ticking() { return g_rule_count || g_resume_at_ns; }

SteerVerb steer_verb(const char* line) {
    if (strcmp(line, "pause") == 0) return SteerVerb::Pause;
    if (strcmp(line, "resume") == 0) return SteerVerb::Resume;
    return SteerVerb::None;
}

SteerOutcome steer(SteerVerb verb) {
    if (!recorder_active()) {
        SteerOutcome out;
        out.failed = true;
        return out;
    }
    return verb == SteerVerb::Pause ? pause_stacks() : resume_stacks();
}

}  // namespace heapsnap::recorder
