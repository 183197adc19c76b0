// A directory of the test's own under /tmp, removed with what it holds.
#pragma once

#include <stdlib.h>

#include <doctest/doctest.h>

#include <filesystem>
#include <string>

namespace heapsnap::test {

struct TempDir {
    std::string path;
    TempDir() {
        char name[] = "/tmp/heapsnap-test-XXXXXX";
        REQUIRE(mkdtemp(name));
        path = name;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

}  // namespace heapsnap::test
