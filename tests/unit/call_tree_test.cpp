// The prefix tree of frames call sites are kept in, the frame lists read
// from it, and the identities sites are matched and ordered by.
#include <doctest/doctest.h>

#include "report/call_tree.h"
#include "report/diff.h"
#include "report/frame_list.h"

using namespace heapsnap;

namespace {

SymbolFrame named(const char* function, const char* file = "", uint32_t line = 0, uint64_t offset = 0) {
    SymbolFrame f;
    f.function = function;
    f.file = file;
    f.line = line;
    f.module = "/bin/prog";
    f.offset = offset;
    return f;
}

SymbolFrame bare(const char* module, uint64_t offset) {
    SymbolFrame f;
    f.module = module;
    f.offset = offset;
    return f;
}

std::vector<std::string> functions(const FrameList& frames) {
    std::vector<std::string> out;
    for (const SymbolFrame& f : frames) out.push_back(f.function);
    return out;
}

}  // namespace

TEST_CASE("call tree: stacks share their callers, a stack is the node of its innermost frame") {
    CallTree tree;
    uint32_t main_id = tree.add_frame(named("main"));
    uint32_t run = tree.add_frame(named("run"));
    uint32_t leak = tree.add_frame(named("leak"));
    uint32_t keep = tree.add_frame(named("keep"));
    CHECK(tree.frame_count() == 4);
    CHECK(tree.size() == 1);  // the root

    CallTree::Node a = tree.insert({leak, run, main_id});
    CHECK(tree.size() == 4);
    CallTree::Node b = tree.insert({keep, run, main_id});
    CHECK(tree.size() == 5);  // main and run once
    CHECK(tree.insert({leak, run, main_id}) == a);
    CHECK(tree.size() == 5);
    CHECK(tree.parent(a) == tree.parent(b));
    CHECK(tree.frame_id(a) == leak);
    CHECK(tree.frame_at(b).function == "keep");
    CHECK(tree.depth(a) == 3);
    CHECK(tree.depth(CallTree::kRoot) == 0);
    CHECK(tree.insert({}) == CallTree::kRoot);
    // The same frame under another caller is another node.
    CallTree::Node c = tree.insert({leak, main_id});
    CHECK(c != a);
    CHECK(tree.size() == 6);
}

TEST_CASE("call tree: many nodes through index growth, then sealed") {
    auto tree = std::make_shared<CallTree>();
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 100; ++i) ids.push_back(tree->add_frame(bare("/lib/a.so", i)));
    std::vector<CallTree::Node> leaves;
    for (uint32_t i = 0; i < 100; ++i)
        for (uint32_t j = 0; j < 100; ++j) leaves.push_back(tree->insert({ids[j], ids[i]}));
    CHECK(tree->size() == 1 + 100 + 100 * 100);
    for (uint32_t i = 0; i < 100; ++i)
        for (uint32_t j = 0; j < 100; ++j) CHECK(tree->insert({ids[j], ids[i]}) == leaves[i * 100 + j]);
    tree->seal();
    FrameList list(tree, leaves[42 * 100 + 7]);
    REQUIRE(list.size() == 2);
    CHECK(list[0].offset == 7);
    CHECK(list[1].offset == 42);
    CHECK(list.front().offset == 7);
    CHECK(list.back().offset == 42);
}

TEST_CASE("frame list: innermost first, its own tree or a node of a shared one") {
    FrameList none;
    CHECK(none.empty());
    CHECK(none.size() == 0);
    CHECK(none.begin() == none.end());

    FrameList own{named("leak"), named("run"), named("main")};
    CHECK_FALSE(own.empty());
    CHECK(own.size() == 3);
    CHECK(functions(own) == std::vector<std::string>{"leak", "run", "main"});
    CHECK(own.at(2).function == "main");
    CHECK_THROWS_AS(own.at(3), std::out_of_range);

    FrameList copy = own;  // shares the tree
    CHECK(copy.tree() == own.tree());
    CHECK(copy.node() == own.node());
}

TEST_CASE("frame identities: compared and hashed as their texts") {
    // "F" US function US file US line US inlined RS, "A" US module US hex offset RS.
    CHECK(compare_frame_identities(named("f", "a.c", 10, 1), named("f", "a.c", 10, 2)) == 0);  // offset ignored
    CHECK(frame_identity_hash(named("f", "a.c", 10, 1)) == frame_identity_hash(named("f", "a.c", 10, 2)));
    CHECK(compare_frame_identities(named("f", "a.c", 10), named("f", "a.c", 9)) < 0);        // "10" < "9" as text
    CHECK(compare_frame_identities(named("f"), named("fa")) < 0);                            // US before 'a'
    CHECK(compare_frame_identities(bare("/lib/z.so", 0x10), named("a")) < 0);                // "A" before "F"
    CHECK(compare_frame_identities(bare("/lib/a.so", 0xff), bare("/lib/a.so", 0x100)) > 0);  // "ff" > "100"
    SymbolFrame inl = named("f", "a.c", 10);
    inl.inlined = true;
    CHECK(compare_frame_identities(named("f", "a.c", 10), inl) < 0);
    SymbolFrame high = named("f\xc3\xa9");  // bytes compare unsigned
    CHECK(compare_frame_identities(named("fz"), high) < 0);

    std::deque<SymbolFrame> frames{named("b"), named("a"), named("b", "", 0, 7), bare("/lib/a.so", 1)};
    FrameIdentities ids;
    CHECK(ids.intern(frames[0]) == 0);
    CHECK(ids.intern(frames[1]) == 1);
    CHECK(ids.intern(frames[2]) == 0);
    CHECK(ids.intern(frames[3]) == 2);
    CHECK(ids.size() == 3);
    CHECK(ids.ranks() == std::vector<uint32_t>{2, 1, 0});
}

TEST_CASE("site index: stacks merged by identities and kind, ordered by identity texts") {
    CallTree tree;
    uint32_t main1 = tree.add_frame(named("main", "", 0, 0x10));
    uint32_t main2 = tree.add_frame(named("main", "", 0, 0x20));  // same identity, another address
    uint32_t b = tree.add_frame(named("b"));
    uint32_t a = tree.add_frame(named("a"));
    SiteIndex index(tree);
    bool fresh = false;
    CHECK(index.find_or_add(tree.insert({b, main1}), EntryKind::Heap, &fresh) == 0);
    CHECK(fresh);
    CHECK(index.find_or_add(tree.insert({b, main2}), EntryKind::Heap, &fresh) == 0);
    CHECK_FALSE(fresh);
    CHECK(index.find_or_add(tree.insert({b, main2}), EntryKind::Mmap, &fresh) == 1);
    CHECK(fresh);
    CHECK(index.find_or_add(tree.insert({a, main1}), EntryKind::Heap, &fresh) == 2);
    CHECK(index.find_or_add(tree.insert({b}), EntryKind::Heap, &fresh) == 3);
    CHECK(index.find_or_add(CallTree::kRoot, EntryKind::Heap, &fresh) == 4);
    CHECK(index.size() == 5);
    // The empty stack, then a before b; b alone (a prefix) before b main;
    // heap before mmap.
    CHECK(index.identity_order() == std::vector<size_t>{4, 2, 3, 0, 1});
}
