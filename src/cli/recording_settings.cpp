#include "cli/recording_settings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "util/human.h"

namespace heapsnap::cli {
namespace {

constexpr double kMaxStacksAfterS = 30.0 * 86400;  // the recorder's bound (recorder/steering.cpp)
constexpr size_t kMaxRules = 16;

std::string_view trimmed(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
}

std::string lower(std::string_view s) {
    std::string out;
    for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

}  // namespace

std::optional<double> parse_duration(std::string_view text) {
    size_t digits = 0;
    while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
        ++digits;
    std::string_view number = text.substr(0, digits), unit = text.substr(digits);
    if (number.empty() || number.front() == '.' || number.back() == '.' || number.find('.') != number.rfind('.'))
        return std::nullopt;
    double scale = 0;
    if (unit.empty() || unit == "s")
        scale = 1;
    else if (unit == "ms")
        scale = 0.001;
    else if (unit == "m")
        scale = 60;
    else if (unit == "h")
        scale = 3600;
    else
        return std::nullopt;
    if (number.size() > 20) return std::nullopt;
    double value = std::stod(std::string(number)) * scale;
    if (!std::isfinite(value)) return std::nullopt;
    return value;
}

std::optional<SnapshotRule> parse_snapshot_rule(std::string_view text) {
    size_t gt = text.find('>');
    if (gt == std::string_view::npos) return std::nullopt;
    std::string kind = lower(trimmed(text.substr(0, gt)));
    SnapshotRule rule;
    if (kind == "rss")
        rule.kind = RuleKind::Rss;
    else if (kind == "live")
        rule.kind = RuleKind::Live;
    else if (kind == "growth")
        rule.kind = RuleKind::Growth;
    else
        return std::nullopt;
    std::optional<uint64_t> bytes = parse_size(trimmed(text.substr(gt + 1)));
    if (!bytes || *bytes == 0 || *bytes > kMaxRuleBytes) return std::nullopt;
    rule.bytes = *bytes;
    rule.label = kind + ">" + size_option_or_bytes(*bytes);
    return rule;
}

void add_steering_options(CLI::App& sub, SteeringSettings& settings) {
    sub.add_flag("--paused", settings.paused,
                 "Start with stacks paused: allocations and frees are recorded, without their stacks (one site, "
                 "\"(allocated while paused)\"), until 'heapsnap resume PID'");
    sub.add_option("--stacks-after", settings.stacks_after_s,
                   "Start paused and record stacks after DURATION (500ms, 30s, 15m, 2h; a bare number is seconds)")
        ->type_name("DURATION")
        ->transform(CLI::Validator(
            [](std::string& text) -> std::string {
                std::optional<double> s = parse_duration(text);
                if (!s) return text + " is not a duration (such as 500ms, 30s, 15m or 2h; a bare number is seconds)";
                if (*s < 0.001 || *s > kMaxStacksAfterS) return text + " is out of range (1ms to 720h)";
                text = fmt::format("{}", *s);
                return "";
            },
            "DURATION"));
    sub.add_option("--snapshot-when", settings.rules,
                   "Write a marker labelled RULE when it first holds: rss>SIZE (resident memory), live>SIZE (live "
                   "heap), growth>SIZE (live heap grown by each further SIZE: growth>SIZE, growth>SIZE#2, ...); "
                   "repeatable. Quote it for the shell: --snapshot-when 'rss>1G'")
        ->type_name("RULE")
        ->transform(CLI::Validator(
            [](std::string& text) -> std::string {
                std::optional<SnapshotRule> rule = parse_snapshot_rule(text);
                if (!rule)
                    return text +
                           " is not a rule (rss>SIZE, live>SIZE or growth>SIZE, SIZE from 1 to 1024T, such "
                           "as 512M or 1G)";
                text = rule->label;
                return "";
            },
            "RULE"));
}

void check_steering(const SteeringSettings& settings, uint64_t sample_bytes) {
    std::set<std::string> seen;
    for (const std::string& rule : settings.rules) {
        if (!seen.insert(rule).second) throw CLI::ValidationError("--snapshot-when", rule + " is given twice");
        if (sample_bytes && rule.rfind("rss>", 0) != 0)
            throw CLI::ValidationError("--snapshot-when",
                                       rule +
                                           " cannot be used with --sample-bytes (a sampled recording does not "
                                           "count the live heap exactly; rss> can)");
    }
    if (settings.rules.size() > kMaxRules)
        throw CLI::ValidationError("--snapshot-when",
                                   "at most 16 rules (" + std::to_string(settings.rules.size()) + " given)");
}

std::vector<std::pair<std::string, std::string>> steering_environment(const SteeringSettings& settings) {
    std::string rules;
    for (const std::string& r : settings.rules) rules += (rules.empty() ? "" : ",") + r;
    bool paused = settings.paused || settings.stacks_after_s > 0;
    return {{"HEAPSNAP_PAUSED", paused ? "1" : ""},
            {"HEAPSNAP_STACKS_AFTER", settings.stacks_after_s > 0 ? fmt::format("{}", settings.stacks_after_s) : ""},
            {"HEAPSNAP_SNAPSHOT_WHEN", rules}};
}

}  // namespace heapsnap::cli
