// The subcommands of `heapsnap`. Each cmd_*.cpp registers its CLI11
// subcommand and, when chosen, leaves the action to run in `action`; main()
// runs it after parsing so that every error of every command goes through
// one boundary (main.cpp) and becomes one line and an exit status.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "util/diagnostics.h"

namespace heapsnap::cli {

using Action = std::function<int()>;

// Exit statuses (also in man/heapsnap.1).
inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitThreshold = 3;

void setup_run(CLI::App& app, Action& action);
void setup_snapshot(CLI::App& app, Action& action);
void setup_diff(CLI::App& app, Action& action);
void setup_dump(CLI::App& app, Action& action);
void setup_markers(CLI::App& app, Action& action);
void setup_maps(CLI::App& app, Action& action);
void setup_report(CLI::App& app, Action& action);
void setup_ps(CLI::App& app, Action& action);
void setup_attach(CLI::App& app, Action& action);
// pause and resume
void setup_pause(CLI::App& app, Action& action);

// A JSON document as printed: indented by 2, and with bytes that are not
// UTF-8 (a marker label, a path or an argument of the traced program may
// hold any bytes) replaced by U+FFFD instead of failing the command.
std::string json_text(const nlohmann::json& doc);

// Colour on stdout: a terminal, and NO_COLOR unset.
bool stdout_wants_color();
// The --color option: "always", "never", or "auto" (stdout_wants_color()).
bool color_wanted(const std::string& choice);

}  // namespace heapsnap::cli
