// Recording settings that steer a recording while it runs: --paused,
// --stacks-after DURATION and --snapshot-when RULE. `heapsnap run` hands
// them to the recorder as HEAPSNAP_* variables (steering_environment), as
// it does every other setting, so any launcher that can set a process's
// environment for the recorder passes them the same way: register the
// options with add_steering_options, check them with check_steering, and
// set what steering_environment returns.
//
// The recorder reads the variables as they are written here (recorder/
// steering.h): HEAPSNAP_PAUSED=1, HEAPSNAP_STACKS_AFTER=<seconds>,
// HEAPSNAP_SNAPSHOT_WHEN=<rule>,<rule>,... with each rule normalized
// ("rss>1G"): the recorder's parser takes whole numbers with K, M, G or T
// only, and the label of a rule's marker is that text.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace heapsnap::cli {

// A duration as a person writes it: a number, optionally with a decimal
// part, and a unit ms, s, m or h; a bare number is seconds ("0.5s",
// "30s", "15m", "500ms", "2h", "90"). In seconds; nullopt for anything
// else.
std::optional<double> parse_duration(std::string_view text);

enum class RuleKind { Rss, Live, Growth };

struct SnapshotRule {
    RuleKind kind = RuleKind::Rss;
    uint64_t bytes = 0;
    // The rule normalized: its kind in lower case, '>', the size exactly,
    // with the largest binary unit that divides it ("rss>1G" for
    // "RSS > 1024m", "live>1536M" for "live>1.5G", "growth>4096").
    std::string label;
};

// The largest SIZE of a rule: 1 PiB, written 1024T.
inline constexpr uint64_t kMaxRuleBytes = uint64_t{1} << 50;

// "rss>SIZE", "live>SIZE" or "growth>SIZE" (kind in any case, spaces
// around the parts allowed), SIZE a byte count with the CLI's suffixes
// (util/human.h, parse_size) from 1 to kMaxRuleBytes; nullopt otherwise.
std::optional<SnapshotRule> parse_snapshot_rule(std::string_view text);

struct SteeringSettings {
    bool paused = false;
    double stacks_after_s = 0;       // 0: none
    std::vector<std::string> rules;  // normalized (SnapshotRule::label), in the order given
};

// Registers --paused, --stacks-after and --snapshot-when on `sub`; the
// values land in `settings` (rules already normalized).
void add_steering_options(CLI::App& sub, SteeringSettings& settings);

// Usage errors the options cannot see one at a time: a rule given twice,
// more than 16 rules, live> or growth> with sampling (`sample_bytes` > 0:
// the recorder then counts the sampled blocks only). Throws
// CLI::ValidationError, which the CLI reports with the usage status.
void check_steering(const SteeringSettings& settings, uint64_t sample_bytes);

// The variables the recorder reads, as (name, value); an empty value means
// the variable is to be removed from the environment.
std::vector<std::pair<std::string, std::string>> steering_environment(const SteeringSettings& settings);

}  // namespace heapsnap::cli
