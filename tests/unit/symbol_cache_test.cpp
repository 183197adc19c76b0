// The symbol cache's file body: a round trip gives the frames exactly, and
// every damaged body is refused rather than read into other names.
#include "symbolize/symbol_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "format/framed_file.h"
#include "temp_dir.h"

using namespace heapsnap;

namespace {

const ModuleRef kModule{"/usr/lib/libdemo.so", std::string("\x12\x34\x56\x78", 4)};

SymbolFrame frame(const std::string& function, const std::string& file, uint32_t line, bool inlined) {
    SymbolFrame f;
    f.function = function;
    f.file = file;
    f.line = line;
    f.inlined = inlined;
    return f;
}

ModuleSymbols sample() {
    ModuleSymbols s;
    s.has_dwarf = true;
    s.sources = {FileIdentity{kModule.path, true, 4096, 1700000000123456789, 42},
                 FileIdentity{"/usr/lib/debug/.build-id/12/345678.debug"}};
    s.add(0x1234, {frame("inner()", "/src/a.h", 7, true), frame("outer(int)", "/src/a.cpp", 30, false)});
    s.add(0x1000, {frame("outer(int)", "/src/a.cpp", 12, false)});
    s.add(0x9, {frame("", "", 0, false)});
    return s;
}

// A body written field by field, for the cases encode() never makes: the
// header of kModule with one source, then what each case writes.
struct Body {
    struct RawFrame {
        uint64_t function, file, line;
        uint8_t inlined;
    };
    ByteBuffer o;
    explicit Body(const std::string& first_source = kModule.path) {
        o.str(kModule.build_id);
        o.str(kModule.path);
        o.u8(1);
        o.varint(1);
        o.str(first_source);
        o.u8(1);
        o.varint(4096);
        o.varint(5);
        o.varint(42);
    }
    Body& strings(const std::vector<std::string>& texts) {
        o.varint(texts.size());
        for (const std::string& text : texts) o.str(text);
        return *this;
    }
    Body& entries(uint64_t count) {
        o.varint(count);
        return *this;
    }
    Body& entry(uint64_t vaddr_delta, const std::vector<RawFrame>& frames) {
        o.varint(vaddr_delta);
        o.varint(frames.size());
        for (const RawFrame& f : frames) {
            o.varint(f.function);
            o.varint(f.file);
            o.varint(f.line);
            o.u8(f.inlined);
        }
        return *this;
    }
    bool decodes() { return ModuleSymbols::decode(o.bytes(), kModule).has_value(); }
};

}  // namespace

TEST_CASE("symbol cache: a body decodes to the frames and sources it was made of") {
    std::vector<uint8_t> body = sample().encode(kModule);
    std::optional<ModuleSymbols> back = ModuleSymbols::decode(body, kModule);
    REQUIRE(back);
    CHECK(back->size() == 3);
    CHECK(back->has_dwarf);
    CHECK(back->sources == sample().sources);
    std::vector<SymbolFrame> frames;
    REQUIRE(back->find(0x1234, frames));
    REQUIRE(frames.size() == 2);
    CHECK(frames[0].function == "inner()");
    CHECK(frames[0].file == "/src/a.h");
    CHECK(frames[0].line == 7);
    CHECK(frames[0].inlined);
    CHECK(frames[1].function == "outer(int)");
    CHECK(frames[1].line == 30);
    CHECK_FALSE(frames[1].inlined);
    REQUIRE(back->find(0x9, frames));
    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function.empty());
    CHECK_FALSE(back->find(0x1235, frames));
    // Encoded again after a lookup is added, the same bytes plus it.
    CHECK(back->encode(kModule) == body);
    CHECK(back->add(0x2000, {frame("late()", "/src/b.cpp", 3, false)}));
    CHECK_FALSE(back->add(0x2000, {frame("again()", "", 0, false)}));
    std::optional<ModuleSymbols> grown = ModuleSymbols::decode(back->encode(kModule), kModule);
    REQUIRE(grown);
    REQUIRE(grown->find(0x2000, frames));
    CHECK(frames[0].function == "late()");
    REQUIRE(grown->find(0x1000, frames));
    CHECK(frames[0].function == "outer(int)");
}

TEST_CASE("symbol cache: a body of another module, or cut anywhere, is refused") {
    std::vector<uint8_t> body = sample().encode(kModule);
    CHECK_FALSE(ModuleSymbols::decode(body, ModuleRef{kModule.path, "\x12\x34\x56\x79"}));
    CHECK_FALSE(ModuleSymbols::decode(body, ModuleRef{"/usr/lib/libother.so", kModule.build_id}));
    for (size_t size = 0; size < body.size(); ++size) {
        std::vector<uint8_t> cut(body.begin(), body.begin() + static_cast<long>(size));
        CHECK_FALSE(ModuleSymbols::decode(cut, kModule));
    }
    body.push_back(0);
    CHECK_FALSE(ModuleSymbols::decode(body, kModule));
}

TEST_CASE("symbol cache: impossible fields are refused") {
    SUBCASE("sound, for comparison") {
        CHECK(Body().strings({"f()", "/src/f.c"}).entries(1).entry(0x10, {{1, 2, 5, 0}}).decodes());
        CHECK(
            Body().strings({}).entries(2).entry(0x10, {{0, 0, 0, 1}, {0, 0, 0, 0}}).entry(1, {{0, 0, 0, 0}}).decodes());
    }
    SUBCASE("a string index past the table") {
        CHECK_FALSE(Body().strings({"f()"}).entries(1).entry(0x10, {{1, 2, 5, 0}}).decodes());
        CHECK_FALSE(Body().strings({"f()"}).entries(1).entry(0x10, {{2, 1, 5, 0}}).decodes());
    }
    SUBCASE("the real function marked inlined, or an inlined one not") {
        CHECK_FALSE(Body().strings({}).entries(1).entry(0x10, {{0, 0, 0, 0}, {0, 0, 0, 0}}).decodes());
        CHECK_FALSE(Body().strings({}).entries(1).entry(0x10, {{0, 0, 0, 1}, {0, 0, 0, 1}}).decodes());
        CHECK_FALSE(Body().strings({}).entries(1).entry(0x10, {{0, 0, 0, 1}}).decodes());
    }
    SUBCASE("an address not above the one before, or past 64 bits") {
        CHECK_FALSE(Body().strings({}).entries(2).entry(0x10, {{0, 0, 0, 0}}).entry(0, {{0, 0, 0, 0}}).decodes());
        CHECK_FALSE(
            Body().strings({}).entries(2).entry(~uint64_t{0}, {{0, 0, 0, 0}}).entry(1, {{0, 0, 0, 0}}).decodes());
    }
    SUBCASE("a line past 32 bits, an address without frames, a flag of 2") {
        CHECK_FALSE(Body().strings({}).entries(1).entry(0x10, {{0, 0, uint64_t{1} << 32, 0}}).decodes());
        CHECK_FALSE(Body().strings({}).entries(1).entry(0x10, {}).decodes());
        CHECK_FALSE(Body().strings({}).entries(1).entry(0x10, {{0, 0, 3, 2}}).decodes());
    }
    SUBCASE("counts larger than the body could hold") {
        for (uint64_t huge : {uint64_t{1} << 62, uint64_t{1} << 20, kMaxCachedAddresses + 1}) {
            CHECK_FALSE(Body().entries(huge).decodes());  // as the count of strings
            CHECK_FALSE(Body().strings({}).entries(huge).decodes());
        }
    }
    SUBCASE("a source that is not an absolute path, or not the module first") {
        CHECK_FALSE(Body("relative/lib.so").strings({}).entries(0).decodes());
        CHECK_FALSE(Body("/usr/lib/libother.so").strings({}).entries(0).decodes());
        CHECK(Body().strings({}).entries(0).decodes());
    }
}

TEST_CASE("symbol cache: what cannot be stored is not added") {
    ModuleSymbols s;
    CHECK_FALSE(s.add(0x10, {}));
    CHECK_FALSE(s.add(0x10, std::vector<SymbolFrame>(kMaxCachedFrames + 1, frame("f", "", 0, true))));
    CHECK_FALSE(s.add(0x10, {frame(std::string(kMaxCachedString + 1, 'x'), "", 0, false)}));
    CHECK(s.size() == 0);
}

namespace {

// A module file of the test's own, and symbols for it as a run would
// leave them: its identity and one absent debug file as sources.
struct Fixture {
    test::TempDir dir;
    ModuleRef module{dir.path + "/libdemo.so", std::string("\xab\xcd", 2)};
    std::string cache = dir.path + "/cache";
    std::string debug = dir.path + "/libdemo.so.debug";

    Fixture() { std::ofstream(module.path) << "not ELF, never opened here"; }
    ModuleSymbols symbols(bool has_dwarf = true) const {
        ModuleSymbols s;
        s.has_dwarf = has_dwarf;
        s.sources = {identity_of(module.path), identity_of(debug)};
        s.add(0x40, {frame("f()", "/src/f.c", 3, false)});
        return s;
    }
    size_t files() const {
        size_t n = 0;
        if (!std::filesystem::exists(cache)) return n;
        for (const auto& entry : std::filesystem::directory_iterator(cache)) n += entry.path().extension() == ".hssym";
        return n;
    }
};

}  // namespace

TEST_CASE("symbol cache: a file is believed only while every source is as it was") {
    Fixture f;
    SymbolCache(f.cache).save(f.module, f.symbols());
    REQUIRE(f.files() == 1);
    std::vector<SymbolFrame> frames;
    std::optional<ModuleSymbols> loaded = SymbolCache(f.cache).load(f.module);
    REQUIRE(loaded);
    CHECK(loaded->find(0x40, frames));
    CHECK_FALSE(SymbolCache(f.cache).load(ModuleRef{f.module.path, "\xab\xce"}));

    SUBCASE("the absent debug file appears") {
        std::ofstream(f.debug) << "debug";
        CHECK_FALSE(SymbolCache(f.cache).load(f.module));
    }
    SUBCASE("the module is modified") {
        struct timespec later[2] = {{0, UTIME_OMIT}, {2000000000, 0}};
        REQUIRE(utimensat(AT_FDCWD, f.module.path.c_str(), later, 0) == 0);
        CHECK_FALSE(SymbolCache(f.cache).load(f.module));
    }
    SUBCASE("the module is replaced by a copy") {
        std::filesystem::copy_file(f.module.path, f.module.path + ".new");
        std::filesystem::rename(f.module.path + ".new", f.module.path);
        CHECK_FALSE(SymbolCache(f.cache).load(f.module));
    }
}

TEST_CASE("symbol cache: without DWARF, nothing is kept or believed while a debuginfod server is set") {
    Fixture f;
    setenv("DEBUGINFOD_URLS", "https://debuginfod.example", 1);
    SymbolCache(f.cache).save(f.module, f.symbols(false));
    CHECK(f.files() == 0);
    SymbolCache(f.cache).save(f.module, f.symbols(true));
    CHECK(SymbolCache(f.cache).load(f.module));
    unsetenv("DEBUGINFOD_URLS");
    SymbolCache(f.cache).save(f.module, f.symbols(false));
    CHECK(SymbolCache(f.cache).load(f.module));
    setenv("DEBUGINFOD_URLS", "https://debuginfod.example", 1);
    CHECK_FALSE(SymbolCache(f.cache).load(f.module));
    unsetenv("DEBUGINFOD_URLS");
}

TEST_CASE("symbol cache: past its size, the files used least recently go") {
    Fixture f;
    SymbolCache(f.cache).save(f.module, f.symbols());
    // Files of 100 MiB (sparse), each last used at `used`.
    auto old_file = [&](const std::string& name, time_t used) {
        std::string path = f.cache + "/" + name + ".hssym";
        int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        REQUIRE(fd >= 0);
        REQUIRE(ftruncate(fd, 100 << 20) == 0);
        struct timespec times[2] = {{used, 0}, {used, 0}};
        REQUIRE(futimens(fd, times) == 0);
        close(fd);
        return path;
    };
    std::string oldest = old_file("01-oldest", 1000000000);
    std::string older = old_file("02-older", 1100000000);
    SymbolCache(f.cache).save(f.module, f.symbols());
    CHECK(f.files() == 3);  // 200 MiB: under the limit
    old_file("03-newer", 1200000000);
    // 300 MiB: the oldest two go, which leaves 100 MiB, under 192.
    SymbolCache(f.cache).save(f.module, f.symbols());
    CHECK_FALSE(std::filesystem::exists(oldest));
    CHECK_FALSE(std::filesystem::exists(older));
    CHECK(f.files() == 2);
    CHECK(SymbolCache(f.cache).load(f.module));
}

TEST_CASE("symbol cache: temporary files a killed command left go after an hour") {
    Fixture f;
    SymbolCache(f.cache).save(f.module, f.symbols());
    auto temporary = [&](const std::string& name, time_t age) {
        std::string path = f.cache + "/" + name;
        int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
        REQUIRE(fd >= 0);
        struct timespec times[2] = {{time(nullptr) - age, 0}, {time(nullptr) - age, 0}};
        REQUIRE(futimens(fd, times) == 0);
        close(fd);
        return path;
    };
    std::string stale = temporary("0a-1b.hssym.tmp1234567", 7200);
    std::string fresh = temporary("0a-1c.hssym.tmp7654321", 60);
    std::string other = temporary("0a-1d.hssym.tmpx", 7200);  // not one of heapsnap's names
    SymbolCache(f.cache).save(f.module, f.symbols());
    CHECK_FALSE(std::filesystem::exists(stale));
    CHECK(std::filesystem::exists(fresh));
    CHECK(std::filesystem::exists(other));
    CHECK(SymbolCache(f.cache).load(f.module));
}
