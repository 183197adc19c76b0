// `heapsnap ps`: the recorded processes the caller may snapshot.
//
// A recorded process is one whose recorder listens on the abstract socket
// @heapsnap.<pid>: they are found in /proc/net/unix (the sockets of this
// network namespace), and each is asked `info` over the control channel
// (formats/control.md, cli/control_client.h), with the same checks as a
// snapshot: only processes the caller may snapshot are asked, and only the
// process named by the socket is believed. Another user's processes are
// left out silently; a socket held by another process, or a recorder that
// does not answer in time, is left out with a warning. JSON schema:
// formats/ps-json.md.
#include <pwd.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/control_client.h"
#include "util/error.h"
#include "util/text.h"

namespace heapsnap::cli {
namespace {

struct PsOptions {
    std::string format = "text";
    double timeout = 2;
};

struct Recorded {
    InfoAnswer info;
    std::string user;
};

std::string user_name(uid_t uid) {
    passwd pw;
    passwd* found = nullptr;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) return found->pw_name;
    return std::to_string(uid);
}

// ISO 8601, UTC, to the second: "2026-01-31T08:15:02Z".
std::string iso8601_utc(uint64_t ns) {
    time_t seconds = static_cast<time_t>(ns / 1000000000);
    tm utc{};
    gmtime_r(&seconds, &utc);
    char text[32];
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return text;
}

std::vector<Recorded> find_recorded(double timeout_s) {
    std::ifstream net("/proc/net/unix");
    if (!net) throw Error("/proc/net/unix: cannot read it (is /proc mounted?)");
    std::stringstream text;
    text << net.rdbuf();
    std::vector<Recorded> found;
    for (pid_t pid : parse_listening_recorders(text.str())) {
        std::optional<ProcessUids> uids = process_uids(pid);
        if (!uids || !may_control(*uids, geteuid())) continue;
        std::string who = "process " + std::to_string(pid);
        try {
            ControlAnswer answer = control_exchange(pid, *uids, "info\n", timeout_s, "answer");
            if (answer.text.empty()) continue;  // recording ended meanwhile
            if (std::optional<std::string> refusal = refusal_of(answer.text)) {
                // Not the caller's to ask (the uids changed meanwhile), or exiting.
                if (*refusal != "malformed request") continue;
                warn(who + ": its recorder does not know 'info' (is it older than this heapsnap?); left out");
                continue;
            }
            std::optional<InfoAnswer> info = parse_info_answer(answer.text);
            if (!info || info->pid != pid) {
                warn(who + ": malformed reply to 'info'; left out");
                continue;
            }
            found.push_back(Recorded{*info, user_name(info->euid)});
        } catch (const ControlError& e) {
            if (e.kind == ControlError::Kind::NotRecorded) continue;  // ended meanwhile
            warn(std::string(e.what()) + "; left out");
        }
    }
    return found;
}

int ps(const PsOptions& o) {
    std::vector<Recorded> found = find_recorded(o.timeout);
    if (o.format == "json") {
        nlohmann::json rows = nlohmann::json::array();
        for (const Recorded& r : found)
            rows.push_back({{"pid", r.info.pid},
                            {"user", r.user},
                            {"uid", r.info.uid},
                            {"euid", r.info.euid},
                            {"exe", r.info.exe},
                            {"log", r.info.log},
                            {"since", iso8601_utc(r.info.since_ns)},
                            {"since_s", static_cast<double>(r.info.since_ns) / 1e9},
                            {"events", r.info.events}});
        std::cout << json_text(rows) << "\n";
        return kExitOk;
    }
    size_t user_width = 4, exe_width = 3;
    for (const Recorded& r : found) {
        user_width = std::max(user_width, r.user.size());
        exe_width = std::max(exe_width, terminal_safe(r.info.exe).size());
    }
    std::cout << fmt::format("{:>7}  {:<{}}  {:<20}  {:>12}  {:<{}}  {}\n", "PID", "USER", user_width, "SINCE",
                             "EVENTS", "EXE", exe_width, "LOG");
    for (const Recorded& r : found)
        std::cout << fmt::format("{:>7}  {:<{}}  {:<20}  {:>12}  {:<{}}  {}\n", r.info.pid, r.user, user_width,
                                 iso8601_utc(r.info.since_ns), r.info.events, terminal_safe(r.info.exe), exe_width,
                                 terminal_safe(r.info.log));
    return kExitOk;
}

}  // namespace

void setup_ps(CLI::App& app, Action& action) {
    auto o = std::make_shared<PsOptions>();
    CLI::App* sub = app.add_subcommand("ps", "List the recorded processes you may snapshot");
    sub->add_option("--format", o->format, "text or json")->check(one_of({"text", "json"}))->default_val("text");
    sub->add_option("--timeout", o->timeout, "Seconds to wait for each process's answer")
        ->check(number_in(0.1, 3600, "s"))
        ->default_val(o->timeout);
    sub->footer("Examples:\n  heapsnap ps\n  heapsnap ps --format json | jq '.[] | {pid, exe, log}'");
    sub->callback([o, &action] { action = [o] { return ps(*o); }; });
}

}  // namespace heapsnap::cli
