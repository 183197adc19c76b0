#include "cli/options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "util/human.h"

namespace heapsnap::cli {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t above = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diagonal = above;
        }
    }
    return row[b.size()];
}

std::string joined(const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
    return out;
}

// "0.1", "3600", "86400": %g without exponent for the ranges heapsnap has.
std::string number_text(double v) { return fmt::format("{:g}", v); }

}  // namespace

CLI::Validator count_in(uint64_t min, uint64_t max) {
    return CLI::Validator(
        [min, max](std::string& text) -> std::string {
            std::string range = max == UINT64_MAX ? std::to_string(min) + " or more"
                                                  : std::to_string(min) + " to " + std::to_string(max);
            if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos)
                return text + " is not a count (" + range + ")";
            uint64_t v = std::stoull(text);
            if (v < min || v > max) return text + " is out of range (" + range + ")";
            return "";
        },
        "COUNT");
}

CLI::Validator bytes_in(uint64_t min, uint64_t max) {
    return CLI::Validator(
        [min, max](std::string& text) -> std::string {
            std::optional<uint64_t> v = parse_size(text);
            if (!v) return text + " is not a byte count (such as 4096, 64K, 5M or 1G)";
            if (*v < min || *v > max)
                return text + " is out of range (" + size_option_or_bytes(min) + " to " + size_option_or_bytes(max) +
                       ")";
            text = std::to_string(*v);
            return "";
        },
        "BYTES");
}

CLI::Validator number_in(double min, double max, const char* unit) {
    return CLI::Validator(
        [min, max, unit](std::string& text) -> std::string {
            std::string range = number_text(min) + " to " + number_text(max) + (*unit ? std::string(" ") + unit : "");
            double v = 0;
            size_t used = 0;
            try {
                v = std::stod(text, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used == 0 || used != text.size() || !std::isfinite(v)) return text + " is not a number (" + range + ")";
            if (v < min || v > max) return text + " is out of range (" + range + ")";
            return "";
        },
        "NUMBER");
}

CLI::Validator one_of(std::vector<std::string> choices) {
    std::string name = joined(choices);
    return CLI::Validator(
        [choices](std::string& text) -> std::string {
            if (std::find(choices.begin(), choices.end(), text) != choices.end()) return "";
            std::string message = text + " is not one of " + joined(choices);
            if (std::string near = nearest(text, choices); !near.empty()) message += " (did you mean " + near + "?)";
            return message;
        },
        name);
}

std::string nearest(const std::string& typed, const std::vector<std::string>& choices) {
    std::string best;
    size_t best_distance = SIZE_MAX;
    for (const std::string& c : choices) {
        size_t d = edit_distance(typed, c);
        if (d < best_distance) {
            best_distance = d;
            best = c;
        }
    }
    size_t allowed = std::min<size_t>(3, std::max<size_t>(1, typed.size() / 3));
    return best_distance <= allowed ? best : "";
}

std::string suggest_for_extras(const CLI::App& app, const std::vector<std::string>& extras) {
    std::vector<std::string> names;
    for (const CLI::Option* o : app.get_options()) {
        for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
        for (const std::string& n : o->get_snames()) names.push_back("-" + n);
    }
    std::string out;
    bool run_option = false;
    for (const std::string& extra : extras) {
        if (extra.size() < 2 || extra[0] != '-') continue;
        std::string typed = extra.substr(0, extra.find('='));
        if (app.get_name() == "run") {
            run_option = true;
            continue;
        }
        if (std::string near = nearest(typed, names); !near.empty())
            out += (out.empty() ? " (did you mean " : ", ") + near;
    }
    if (!out.empty()) out += "?)";
    if (run_option)
        out += "; options after PROGRAM are PROGRAM's only after --: heapsnap run [OPTIONS] -- PROGRAM [ARGS...]";
    return out;
}

}  // namespace heapsnap::cli
