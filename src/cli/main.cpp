// heapsnap: the command-line boundary. Parses with CLI11, runs the chosen
// subcommand, and turns every failure into one line on stderr and a
// documented exit status: 1 runtime error, 2 usage error, 3 threshold
// exceeded (diff --fail-above).
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "cli/commands.h"
#include "cli/inject.h"
#include "cli/options.h"
#include "util/read_budget.h"
#include "util/text.h"
#include "util/error.h"

namespace heapsnap::cli {

bool stdout_wants_color() {
    const char* no_color = std::getenv("NO_COLOR");
    return isatty(STDOUT_FILENO) && !(no_color && *no_color);
}

bool color_wanted(const std::string& choice) {
    return choice == "always" || (choice == "auto" && stdout_wants_color());
}

std::string json_text(const nlohmann::json& doc) {
    return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace heapsnap::cli

int main(int argc, char** argv) {
    using namespace heapsnap::cli;
    // A fixed mmap threshold: every block of 1 MiB or more (a frame's
    // decompressed payload, the replay's tables) is its own mapping, given
    // back to the system when freed and grown by mremap. glibc's default
    // raises the threshold to the size of each such block freed, so the
    // next ones come from the heap and stay resident after their free: a
    // diff of two moments held both reads' 16 MiB payloads at once.
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    CLI::App app{"heapsnap: record heap allocations with their call stacks, snapshot the live heap, diff two moments.",
                 "heapsnap"};
    app.set_version_flag("--version", std::string("heapsnap ") + HEAPSNAP_VERSION);
    app.require_subcommand(1);
    app.footer("Run 'heapsnap <command> --help' for a command's options; man heapsnap for the whole story.");
    Action action;
    setup_run(app, action);
    setup_attach(app, action);
    setup_snapshot(app, action);
    setup_diff(app, action);
    setup_report(app, action);
    setup_markers(app, action);
    setup_maps(app, action);
    setup_dump(app, action);
    setup_ps(app, action);
    setup_pause(app, action);
    // CLI11 would say "A subcommand is required" for a mistyped command.
    auto known = [&](const char* name) {
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
            if (sub->get_name() == name) return true;
        return false;
    };
    if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
        std::vector<std::string> names;
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
            names.push_back(sub->get_name());
        std::string near = nearest(argv[1], names);
        std::cerr << "heapsnap: error: unknown command '" << heapsnap::terminal_safe(argv[1]) << "'"
                  << (near.empty() ? "" : " (did you mean " + near + "?)") << "\nRun 'heapsnap --help' for usage.\n";
        return kExitUsage;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::string message = e.what();
        if (dynamic_cast<const CLI::ExtrasError*>(&e))
            for (const CLI::App* sub : app.get_subcommands()) message += suggest_for_extras(*sub, sub->remaining());
        std::cerr << "heapsnap: error: " << heapsnap::terminal_safe(message) << "\nRun 'heapsnap --help' for usage.\n";
        return kExitUsage;
    }
    try {
        return action ? action() : kExitUsage;
    } catch (const AttachRefused& e) {
        std::cerr << "heapsnap: error: " << heapsnap::terminal_safe(e.what()) << "\n";
        return e.status;
    } catch (const heapsnap::BudgetExceeded& e) {
        std::cout.flush();
        std::cerr << "heapsnap: error: reading the input " << heapsnap::terminal_safe(e.what()) << "\n";
        return kExitError;
    } catch (const heapsnap::Error& e) {
        // Messages name files and quote what they hold: one line, whatever
        // those bytes are.
        std::cout.flush();
        std::cerr << "heapsnap: error: " << heapsnap::terminal_safe(e.what()) << "\n";
        return kExitError;
    } catch (const std::bad_alloc&) {
        std::cerr << "heapsnap: error: out of memory\n";
        return kExitError;
    } catch (const std::exception& e) {
        std::cerr << "heapsnap: error: " << heapsnap::terminal_safe(e.what()) << "\n";
        return kExitError;
    }
}
