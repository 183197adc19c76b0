#include "report/flame.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "util/human.h"
#include "util/text.h"

namespace heapsnap {
namespace {

// A frame of a folded line: terminal_safe (no line break, no control
// character), and ';', which separates the frames, as ':'.
std::string folded_name(const std::string& name) {
    std::string out = terminal_safe(name);
    std::replace(out.begin(), out.end(), ';', ':');
    return out;
}

// A frame of the merged tree; children in name order, as flamegraph.pl
// draws them.
struct Node {
    uint64_t value = 0;
    bool allocator = false;
    std::map<std::string, Node> children;
};

size_t depth_of(const Node& n) {
    size_t d = 0;
    for (const auto& [name, child] : n.children) d = std::max(d, depth_of(child) + 1);
    return d;
}

// FNV-1a: the colour of a name is the same in every picture.
uint64_t name_hash(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

std::string frame_color(const std::string& name, bool allocator, FlamePalette palette) {
    uint64_t h = name_hash(name);
    double v1 = static_cast<double>(h & 0xffff) / 65536.0;
    double v2 = static_cast<double>((h >> 16) & 0xffff) / 65536.0;
    double v3 = static_cast<double>((h >> 32) & 0xffff) / 65536.0;
    int r, g, b;
    if (allocator) {
        int grey = 180 + static_cast<int>(40 * v1);
        r = g = b = grey;
    } else if (palette == FlamePalette::Growth) {
        r = 205 + static_cast<int>(50 * v3);
        g = static_cast<int>(230 * v1);
        b = static_cast<int>(55 * v2);
    } else {
        r = 0;
        g = 190 + static_cast<int>(50 * v2);
        b = static_cast<int>(210 * v1);
    }
    return fmt::format("rgb({},{},{})", r, g, b);
}

struct SvgLayout {
    double x0 = 10;    // left and right margin
    double scale = 0;  // px per unit of value
    double frame_height = 16;
    double bottom = 0;  // y of the root frame's bottom edge
    double font_size = 12;
    double char_width = 7.1;  // Verdana-like at 12 px; labels are cut to fit
    FlamePalette palette = FlamePalette::Live;
    uint64_t total = 0;
};

void draw(std::string& out, const std::string& name, const Node& node, size_t depth, double x, const SvgLayout& l) {
    double w = static_cast<double>(node.value) * l.scale;
    if (w < 0.1) return;
    double y = l.bottom - static_cast<double>(depth + 1) * l.frame_height;
    double share = l.total ? 100.0 * static_cast<double>(node.value) / static_cast<double>(l.total) : 0;
    std::string tip = fmt::format("{} ({} bytes, {}, {:.2f}%)", name, node.value, human_bytes(node.value), share);
    out += fmt::format(
        "<g><title>{}</title><rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" "
        "fill=\"{}\" rx=\"2\" ry=\"2\"/>",
        xml_escape(tip), x, y, w, l.frame_height - 1, frame_color(name, node.allocator, l.palette));
    auto fit = static_cast<size_t>(std::max(0.0, (w - 6) / l.char_width));
    if (fit >= 3) {
        std::string label = name.size() <= fit ? name : name.substr(0, fit - 2) + "..";
        out += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\">{}</text>", x + 3, y + l.frame_height - 4.5,
                           xml_escape(label));
    }
    out += "</g>\n";
    double cx = x;
    for (const auto& [child_name, child] : node.children) {
        draw(out, child_name, child, depth + 1, cx, l);
        cx += static_cast<double>(child.value) * l.scale;
    }
}

}  // namespace

std::string xml_escape(const std::string& text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&apos;"; break;
            default:
                // Control characters are not allowed in XML 1.0 at all.
                if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r')
                    out += '?';
                else
                    out += c;
        }
    }
    return out;
}

FlameStack flame_stack(const FrameList& innermost_first, EntryKind kind, uint64_t value) {
    FlameStack s;
    s.value = value;
    for (const SymbolFrame& f : innermost_first)
        s.frames.push_back(FlameFrame{folded_name(frame_label(f)), is_allocation_frame(f)});
    std::reverse(s.frames.begin(), s.frames.end());  // outermost first
    if (s.frames.empty()) s.frames.push_back(FlameFrame{"[unknown]", false});
    if (kind == EntryKind::Mmap) s.frames.push_back(FlameFrame{"[mmap]", true});
    return s;
}

std::vector<FlameStack> flame_stacks_of_growth(const DiffResult& diff) {
    std::vector<FlameStack> out;
    for (const DiffEntry& e : diff.entries)
        if (e.bytes_delta > 0) out.push_back(flame_stack(e.frames, e.kind, static_cast<uint64_t>(e.bytes_delta)));
    return out;
}

std::string render_folded(const std::vector<FlameStack>& stacks) {
    std::map<std::string, uint64_t> lines;
    for (const FlameStack& s : stacks) {
        if (!s.value) continue;
        std::string key;
        for (const FlameFrame& f : s.frames) {
            if (!key.empty()) key += ';';
            key += f.name;
        }
        lines[key] += s.value;
    }
    std::string out;
    for (const auto& [key, value] : lines) out += fmt::format("{} {}\n", key, value);
    return out;
}

std::string render_flame_svg(const std::vector<FlameStack>& stacks, const FlameSvgOptions& options) {
    Node root;
    for (const FlameStack& s : stacks) {
        if (!s.value) continue;
        root.value += s.value;
        Node* n = &root;
        for (const FlameFrame& f : s.frames) {
            auto [it, fresh] = n->children.try_emplace(f.name);
            if (fresh) it->second.allocator = f.allocator;
            n = &it->second;
            n->value += s.value;
        }
    }
    SvgLayout l;
    l.palette = options.palette;
    l.total = root.value;
    double width = std::max(options.width, 200);
    double title_height = options.subtitle.empty() ? 36 : 52;
    size_t depth = root.value ? depth_of(root) + 1 : 0;
    double height = title_height + static_cast<double>(depth) * l.frame_height + 24;
    l.bottom = height - 24;
    l.scale = root.value ? (width - 2 * l.x0) / static_cast<double>(root.value) : 0;

    std::string out;
    out += "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n";
    out += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" "
        "viewBox=\"0 0 {0} {1}\">\n",
        width, height);
    out +=
        "<defs><linearGradient id=\"background\" y1=\"0\" y2=\"1\" x1=\"0\" x2=\"0\">"
        "<stop stop-color=\"#eeeeee\" offset=\"5%\"/><stop stop-color=\"#eeeeb0\" offset=\"95%\"/>"
        "</linearGradient></defs>\n";
    out +=
        "<style type=\"text/css\">text { font-family: Verdana, 'DejaVu Sans', sans-serif; font-size: 12px; "
        "fill: rgb(0,0,0); } .title { font-size: 17px; text-anchor: middle; } .subtitle { text-anchor: middle; "
        "fill: rgb(80,80,80); } rect:hover { stroke: black; stroke-width: 0.5; }</style>\n";
    out += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"url(#background)\"/>\n", width, height);
    out += fmt::format("<text class=\"title\" x=\"{:.1f}\" y=\"24\">{}</text>\n", width / 2, xml_escape(options.title));
    if (!options.subtitle.empty())
        out += fmt::format("<text class=\"subtitle\" x=\"{:.1f}\" y=\"42\">{}</text>\n", width / 2,
                           xml_escape(options.subtitle));
    if (root.value) {
        root.allocator = false;
        draw(out, "all", root, 0, l.x0, l);
    } else {
        out += fmt::format("<text class=\"subtitle\" x=\"{:.1f}\" y=\"{:.1f}\">nothing to draw</text>\n", width / 2,
                           title_height + 12);
    }
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" style=\"font-size: 11px; fill: rgb(100,100,100)\">"
        "width = bytes; hover a frame for its name and size</text>\n",
        l.x0, height - 8);
    out += "</svg>\n";
    return out;
}

}  // namespace heapsnap
