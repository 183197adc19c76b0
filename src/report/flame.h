// Flame graphs of heap call stacks: the "folded" text that flamegraph.pl,
// inferno and speedscope read, and a self-contained SVG picture.
//
// Folded: one line per distinct stack, "outermost;...;innermost VALUE",
// VALUE a positive integer (bytes). The tools do the drawing, so the only
// contract is the line format: frame names are frame_label() (function,
// or module+0xoffset), inlined frames are frames of their own (as perf
// prints them), and a ';' inside a name (none in C or C++ names, but a
// module path may hold one) becomes ':' so it cannot split a frame. Equal
// stacks are merged and lines sorted bytewise, so the output is stable
// and diffable.
//
// SVG: the picture flamegraph.pl draws, without its script: the root
// ("all") at the bottom, callers below callees, each frame as wide as its
// share of the total, siblings in name order. Everything is in the file —
// no script, no web font (generic font families only), no external
// reference — so it opens in any browser, an image viewer or rsvg-convert,
// and each frame's <title> shows its full name, bytes and share on hover.
// Frames narrower than 0.1 px are left out (they cannot be seen or
// pointed at); their bytes still count in their parents' widths. Two
// palettes: warm (growth, as in a diff) and green-blue (live bytes, as in
// flamegraph.pl --colors=mem); allocator frames (operator new, libc) are
// grey so the eye goes to the code that asked for the memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/snapshot_file.h"
#include "report/diff.h"

namespace heapsnap {

struct FlameFrame {
    std::string name;
    bool allocator = false;  // is_allocation_frame(): drawn grey
};

struct FlameStack {
    std::vector<FlameFrame> frames;  // outermost first
    uint64_t value = 0;
};

// A stack from symbolized frames, innermost first as diff and report hold
// them. An mmap entry gets an innermost frame "[mmap]"; a stack with no
// frames is "[unknown]".
FlameStack flame_stack(const FrameList& innermost_first, EntryKind kind, uint64_t value);

// The growth of a diff: one stack per entry that grew (bytes_delta > 0).
std::vector<FlameStack> flame_stacks_of_growth(const DiffResult& diff);

// Folded lines, merged and sorted; stacks with value 0 are left out.
std::string render_folded(const std::vector<FlameStack>& stacks);

enum class FlamePalette { Growth, Live };

struct FlameSvgOptions {
    std::string title;
    std::string subtitle;
    FlamePalette palette = FlamePalette::Live;
    int width = 1200;
};

std::string render_flame_svg(const std::vector<FlameStack>& stacks, const FlameSvgOptions& options);

// The text escaped for XML character data and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace heapsnap
