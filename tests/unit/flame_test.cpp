// Flame graphs: folded lines exactly as flamegraph.pl / inferno / speedscope
// read them, and the SVG checked as XML by a small strict reader (tags
// balance, attributes quoted, only the five XML entities) whose <title>s
// must name the frames.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "report/diff.h"
#include "report/flame.h"

using namespace heapsnap;

namespace {

SymbolFrame fn(const std::string& name, const std::string& module = "/bin/prog") {
    SymbolFrame f;
    f.function = name;
    f.module = module;
    return f;
}

struct XmlCheck {
    bool ok = true;
    std::string error;
    std::vector<std::string> titles;  // unescaped
    std::map<std::string, int> elements;
};

std::string unescape(const std::string& s, bool* ok) {
    static const std::pair<const char*, char> kEntities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (s[i] != '&') {
            out += s[i++];
            continue;
        }
        bool known = false;
        for (const auto& [entity, c] : kEntities) {
            if (s.compare(i, strlen(entity), entity) == 0) {
                out += c;
                i += strlen(entity);
                known = true;
                break;
            }
        }
        if (!known) {
            *ok = false;
            return out;
        }
    }
    return out;
}

// Enough XML for what render_flame_svg writes: a declaration, elements
// with quoted attributes, text, no comments or CDATA.
XmlCheck check_xml(const std::string& doc) {
    XmlCheck r;
    auto fail = [&](const std::string& why) {
        if (r.ok) r.error = why;
        r.ok = false;
    };
    std::vector<std::string> open;
    size_t i = 0;
    if (doc.compare(0, 5, "<?xml") == 0) i = doc.find("?>") + 2;
    std::string text;
    bool seen_root = false;
    while (i < doc.size() && r.ok) {
        if (doc[i] != '<') {
            size_t end = doc.find('<', i);
            if (end == std::string::npos) end = doc.size();
            text = doc.substr(i, end - i);
            if (text.find('>') != std::string::npos) fail("raw '>' in text");
            bool ok = true;
            std::string plain = unescape(text, &ok);
            if (!ok) fail("bad entity in text: " + text);
            if (open.empty() && plain.find_first_not_of(" \n") != std::string::npos) fail("text outside the root");
            if (!open.empty() && open.back() == "title") r.titles.push_back(plain);
            i = end;
            continue;
        }
        size_t end = doc.find('>', i);
        if (end == std::string::npos) {
            fail("unterminated tag");
            break;
        }
        std::string tag = doc.substr(i + 1, end - i - 1);
        i = end + 1;
        if (tag.empty()) {
            fail("empty tag");
            break;
        }
        if (tag[0] == '/') {
            std::string name = tag.substr(1);
            if (open.empty() || open.back() != name)
                fail("</" + name + "> does not close <" + (open.empty() ? "" : open.back()) + ">");
            else
                open.pop_back();
            continue;
        }
        bool self_closing = tag.back() == '/';
        if (self_closing) tag.pop_back();
        size_t name_end = tag.find_first_of(" \n");
        std::string name = tag.substr(0, name_end);
        if (name.empty() || name.find_first_of("<&\"'=") != std::string::npos) fail("bad element name " + name);
        if (open.empty()) {
            if (seen_root) fail("two root elements");
            seen_root = true;
        }
        // Attributes: name="value" pairs.
        for (size_t a = name_end; a != std::string::npos && a < tag.size() && r.ok;) {
            a = tag.find_first_not_of(" \n", a);
            if (a == std::string::npos) break;
            size_t eq = tag.find('=', a);
            if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"') {
                fail("unquoted attribute in <" + name + ">");
                break;
            }
            size_t close = tag.find('"', eq + 2);
            if (close == std::string::npos) {
                fail("unterminated attribute in <" + name + ">");
                break;
            }
            std::string value = tag.substr(eq + 2, close - eq - 2);
            bool ok = true;
            unescape(value, &ok);
            if (!ok || value.find('<') != std::string::npos) fail("bad attribute value " + value);
            a = close + 1;
        }
        r.elements[name]++;
        if (!self_closing) open.push_back(name);
    }
    if (r.ok && !open.empty()) fail("<" + open.back() + "> is never closed");
    if (r.ok && !seen_root) fail("no root element");
    return r;
}

bool has_title_starting(const XmlCheck& x, const std::string& prefix) {
    for (const std::string& t : x.titles)
        if (t.compare(0, prefix.size(), prefix) == 0) return true;
    return false;
}

}  // namespace

TEST_CASE("folded: outermost first, equal stacks merged, sorted, zero left out") {
    std::vector<FlameStack> stacks;
    stacks.push_back(flame_stack({fn("malloc", "/lib/libc.so.6"), fn("leaf"), fn("main")}, EntryKind::Heap, 100));
    stacks.push_back(flame_stack({fn("malloc", "/lib/libc.so.6"), fn("leaf"), fn("main")}, EntryKind::Heap, 23));
    stacks.push_back(flame_stack({fn("other"), fn("main")}, EntryKind::Mmap, 4096));
    stacks.push_back(flame_stack({fn("odd;name"), fn("main")}, EntryKind::Heap, 5));
    stacks.push_back(flame_stack({}, EntryKind::Heap, 7));
    stacks.push_back(flame_stack({fn("nothing")}, EntryKind::Heap, 0));
    SymbolFrame raw;
    raw.module = "/usr/lib/libfoo.so.1";
    raw.offset = 0x1234;
    stacks.push_back(flame_stack({raw, fn("main")}, EntryKind::Heap, 9));
    CHECK(render_folded(stacks) ==
          "[unknown] 7\n"
          "main;leaf;malloc 123\n"
          "main;libfoo.so.1+0x1234 9\n"
          "main;odd:name 5\n"
          "main;other;[mmap] 4096\n");
    CHECK(stacks[0].frames.back().allocator);
    CHECK_FALSE(stacks[0].frames.front().allocator);
    CHECK(render_folded({}) == "");
}

TEST_CASE("folded: a diff's growth, only the call sites that grew") {
    DiffResult d;
    DiffEntry grew;
    grew.bytes_delta = 300;
    grew.frames = {fn("grow"), fn("main")};
    DiffEntry shrank;
    shrank.bytes_delta = -50;
    shrank.frames = {fn("shrink"), fn("main")};
    DiffEntry same_bytes;
    same_bytes.bytes_delta = 0;
    same_bytes.blocks_delta = 2;
    same_bytes.frames = {fn("churn"), fn("main")};
    d.entries = {grew, same_bytes, shrank};
    CHECK(render_folded(flame_stacks_of_growth(d)) == "main;grow 300\n");
}

TEST_CASE("svg: well-formed, self-contained, titles name every frame with its bytes") {
    std::vector<FlameStack> stacks;
    stacks.push_back(
        flame_stack({fn("operator new(unsigned long)", "/lib/libstdc++.so.6"),
                     fn("std::vector<int, std::allocator<int> >::push_back(int const&)"), fn("fill"), fn("main")},
                    EntryKind::Heap, 6000));
    stacks.push_back(flame_stack({fn("cache_put"), fn("main")}, EntryKind::Heap, 3000));
    stacks.push_back(flame_stack({fn("tiny"), fn("main")}, EntryKind::Heap, 1));  // 0.13 px: drawn, no label
    FlameSvgOptions o;
    o.title = "Growth of <prog> & co";
    o.subtitle = "from \"A\" to 'B'";
    o.palette = FlamePalette::Growth;
    std::string svg = render_flame_svg(stacks, o);
    XmlCheck x = check_xml(svg);
    INFO(x.error);
    REQUIRE(x.ok);
    CHECK(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\"") != std::string::npos);
    CHECK(svg.find("<script") == std::string::npos);
    CHECK(svg.find("href") == std::string::npos);  // nothing external
    CHECK(svg.find("@import") == std::string::npos);
    CHECK(svg.find("Growth of &lt;prog&gt; &amp; co") != std::string::npos);
    CHECK(x.elements["g"] == 7);  // all, main, fill, push_back, operator new, cache_put, tiny
    CHECK(x.elements["title"] == 7);
    CHECK(x.elements["rect"] == 8);  // and the background
    CHECK(has_title_starting(x, "all (9001 bytes, 8.8 KiB, 100.00%)"));
    CHECK(has_title_starting(x, "main (9001 bytes"));
    CHECK(has_title_starting(x, "fill (6000 bytes, 5.9 KiB, 66.66%)"));
    CHECK(has_title_starting(x, "std::vector<int, std::allocator<int> >::push_back(int const&) (6000 bytes"));
    CHECK(has_title_starting(x, "operator new(unsigned long) (6000 bytes"));
    CHECK(has_title_starting(x, "cache_put (3000 bytes, 2.9 KiB, 33.33%)"));
    CHECK(has_title_starting(x, "tiny (1 bytes, 1 B, 0.01%)"));
    // 6000/9001 of 1180 px hold the whole push_back name; 0.13 px hold no label.
    CHECK(svg.find(">std::vector&lt;int, std::allocator&lt;int&gt; &gt;::push_back(int const&amp;)</text>") !=
          std::string::npos);
    CHECK(svg.find(">tiny</text>") == std::string::npos);
    // The allocator frame is grey, the others warm.
    size_t new_at = svg.find("<title>operator new");
    REQUIRE(new_at != std::string::npos);
    size_t fill_at = svg.find("fill=\"rgb(", new_at);
    std::string color = svg.substr(fill_at + 10, svg.find(')', fill_at) - fill_at - 10);
    int r = 0, g = 0, b = 0;
    REQUIRE(sscanf(color.c_str(), "%d,%d,%d", &r, &g, &b) == 3);
    CHECK(r == g);
    CHECK(g == b);
}

TEST_CASE("svg: frames too narrow to see are left out; long names are cut with ..") {
    std::vector<FlameStack> stacks;
    stacks.push_back(flame_stack({fn("big"), fn("main")}, EntryKind::Heap, 100000000));
    stacks.push_back(flame_stack({fn("invisible"), fn("main")}, EntryKind::Heap, 1));
    stacks.push_back(flame_stack({fn(std::string(300, 'x')), fn("main")}, EntryKind::Heap, 1000000));
    std::string svg = render_flame_svg(stacks, FlameSvgOptions{});
    XmlCheck x = check_xml(svg);
    REQUIRE(x.ok);
    CHECK_FALSE(has_title_starting(x, "invisible"));
    CHECK(has_title_starting(x, std::string(300, 'x') + " (1000000 bytes"));
    // 1000000 / 101000001 of 1180 px = 11.7 px: room for one character, so no label.
    CHECK(svg.find("\">x") == std::string::npos);
    CHECK(svg.find("\">big</text>") != std::string::npos);
    CHECK(x.elements["g"] == 4);

    // Half the width (590 px) holds 82 characters: 80 and "..".
    stacks.push_back(flame_stack({fn(std::string(300, 'y')), fn("main")}, EntryKind::Heap, 101000001));
    svg = render_flame_svg(stacks, FlameSvgOptions{});
    REQUIRE(check_xml(svg).ok);
    CHECK(svg.find("\">" + std::string(80, 'y') + "..</text>") != std::string::npos);
}

TEST_CASE("svg: nothing to draw is still a valid picture") {
    std::string svg = render_flame_svg({}, FlameSvgOptions{"No growth", "", FlamePalette::Growth, 1200});
    XmlCheck x = check_xml(svg);
    REQUIRE(x.ok);
    CHECK(svg.find("nothing to draw") != std::string::npos);
    CHECK(x.titles.empty());
}

TEST_CASE("xml_escape: the five specials and control characters") {
    CHECK(xml_escape("a<b>&\"'c") == "a&lt;b&gt;&amp;&quot;&apos;c");
    CHECK(xml_escape(std::string("x\x01y\tz", 5)) == "x?y\tz");
}
