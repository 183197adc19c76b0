// See debug_sources.h: the places libdwfl looks, in the order of elfutils'
// find-debuginfo.c with its default path ":.debug:/usr/lib/debug".
#include "symbolize/debug_sources.h"

#include <elfutils/libdwelf.h>
#include <gelf.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "util/files.h"
#include "util/text.h"

namespace heapsnap {
namespace {

const char kDebugRoot[] = "/usr/lib/debug";

// /usr/lib/debug/.build-id/xx/yyyy.debug: the first byte names the directory.
std::string build_id_path(const void* bits, size_t length) {
    std::string id = hex_of(std::string_view(static_cast<const char*>(bits), length));
    return std::string(kDebugRoot) + "/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
}

std::string dirname_of(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos || slash == 0 ? "" : path.substr(0, slash);
}

// `name` in `dir`, in its .debug directory, and under /usr/lib/debug
// below `dir` and each of its tails ("/usr/bin": /usr/lib/debug/usr/bin,
// /usr/lib/debug/bin, /usr/lib/debug).
void add_debuglink_places(const std::string& dir, const std::string& name, std::vector<std::string>& places) {
    places.push_back(dir + "/" + name);
    places.push_back(dir + "/.debug/" + name);
    for (size_t start = 0; start != std::string::npos; start = dir.find('/', start + 1))
        places.push_back(kDebugRoot + dir.substr(start) + "/" + name);
    places.push_back(std::string(kDebugRoot) + "/" + name);
}

}  // namespace

std::vector<FileIdentity> debug_sources(Dwfl_Module* module, const FileIdentity& file) {
    std::vector<std::string> places;
    const unsigned char* bits = nullptr;
    GElf_Addr note_vaddr = 0;
    int length = dwfl_module_build_id(module, &bits, &note_vaddr);
    if (length > 0) places.push_back(build_id_path(bits, static_cast<size_t>(length)));

    GElf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(module, &bias);
    GElf_Word crc = 0;
    const char* link = elf ? dwelf_elf_gnu_debuglink(elf, &crc) : nullptr;
    std::string name = link && *link ? link : basename_of(file.path) + ".debug";
    add_debuglink_places(dirname_of(file.path), name, places);
    // libdwfl searches again from the module's real path if that differs.
    if (char* real = realpath(file.path.c_str(), nullptr)) {
        if (file.path != real) add_debuglink_places(dirname_of(real), name, places);
        std::free(real);
    }

    const char* main_file = nullptr;
    const char* debug_file = nullptr;
    dwfl_module_info(module, nullptr, nullptr, nullptr, nullptr, nullptr, &main_file, &debug_file);
    if (debug_file) places.push_back(debug_file);
    Dwarf_Addr dwarf_bias = 0;
    if (Dwarf* dwarf = dwfl_module_getdwarf(module, &dwarf_bias)) {
        const char* alt = nullptr;
        const void* alt_id = nullptr;
        ssize_t alt_length = dwelf_dwarf_gnu_debugaltlink(dwarf, &alt, &alt_id);
        if (alt_length > 0) places.push_back(build_id_path(alt_id, static_cast<size_t>(alt_length)));
        if (alt_length > 0 && alt && alt[0] == '/') places.push_back(alt);
        if (alt_length > 0 && alt && alt[0] != '/' && debug_file) places.push_back(dirname_of(debug_file) + "/" + alt);
    }

    std::vector<FileIdentity> sources{file};
    for (const std::string& place : places) {
        if (place.empty() || place[0] != '/') continue;
        bool listed =
            std::any_of(sources.begin(), sources.end(), [&](const FileIdentity& known) { return known.path == place; });
        if (!listed) sources.push_back(identity_of(place));
    }
    return sources;
}

}  // namespace heapsnap
