// The client side of the control channel (cli/control_client.h): what it
// believes of /proc and of the recorder's replies.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/control_client.h"

using namespace heapsnap::cli;

TEST_CASE("control client: the uids of a process come from the Uid: line of its status") {
    std::string status =
        "Name:\tmemcached\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t812\n"
        "Uid:\t65534\t65534\t0\t65534\nGid:\t65534\t65534\t65534\t65534\n";
    auto uids = parse_status_uids(status);
    REQUIRE(uids);
    CHECK(uids->real == 65534);
    CHECK(uids->effective == 65534);
    CHECK(uids->saved == 0);
    CHECK(uids->fs == 65534);
    CHECK_FALSE(parse_status_uids("Name:\tx\nGid:\t0\t0\t0\t0\n"));
    CHECK_FALSE(parse_status_uids("Uid:\t1\t2\t3\n"));
    CHECK_FALSE(parse_status_uids("Uid:\t1\t2\t3\t-4\n"));
    CHECK_FALSE(parse_status_uids("Uid:\t1\t2\t3\t4294967296\n"));
}

TEST_CASE("control client: root and the process's real or effective uid may control it") {
    ProcessUids dropped{65534, 65534, 0, 65534};
    CHECK(may_control(dropped, 0));
    CHECK(may_control(dropped, 65534));
    CHECK_FALSE(may_control(dropped, 1000));
    ProcessUids split{1000, 1001, 1002, 1001};
    CHECK(may_control(split, 1000));
    CHECK(may_control(split, 1001));
    CHECK_FALSE(may_control(split, 1002));  // the saved uid is not the user it runs as
}

TEST_CASE("control client: recorders are the listening stream sockets named @heapsnap.<pid>") {
    std::string net_unix =
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49849 @heapsnap.18369\n"
        "0000000000000000: 00000003 00000000 00000000 0001 03 49850 @heapsnap.18369\n"  // a connection
        "0000000000000000: 00000002 00000000 00010000 0001 01 49851 @heapsnap.77\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49852 @heapsnap.77\n"   // twice: once listed
        "0000000000000000: 00000002 00000000 00000000 0002 01 49853 @heapsnap.91\n"   // datagram
        "0000000000000000: 00000002 00000000 00010000 0001 01 49854 @heapsnap.091\n"  // leading zero
        "0000000000000000: 00000002 00000000 00010000 0001 01 49855 @heapsnap.12x\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49856 @heapsnap.0\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49857 @heapsnap.99999999999\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49858 /run/heapsnap.5\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49859 @xheapsnap.6\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49860\n"
        // Alternate names, where another process took the first one.
        "0000000000000000: 00000002 00000000 00010000 0001 01 49861 @heapsnap.18369.1\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49862 @heapsnap.55.16\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49863 @heapsnap.56.17\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49864 @heapsnap.57.x\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49865 @heapsnap.58.\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49866 @heapsnap.59.0\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 49867 @heapsnap.60.01\n";
    CHECK(parse_listening_recorders(net_unix) == std::vector<pid_t>{55, 77, 18369});
    CHECK(parse_listening_recorders("").empty());
}

TEST_CASE("control client: the names a recorder may listen on, in the order it takes them") {
    std::vector<std::string> names = control_socket_names(4242);
    REQUIRE(names.size() == 17);
    CHECK(names[0] == "heapsnap.4242");
    CHECK(names[1] == "heapsnap.4242.1");
    CHECK(names[16] == "heapsnap.4242.16");
}

TEST_CASE("control client: paths travel with control bytes and backslashes escaped") {
    CHECK(unescape_reply_field("/tmp/a b/x.hslog") == std::string("/tmp/a b/x.hslog"));
    CHECK(unescape_reply_field("/tmp/new\\x0aline\\x5c\\x7f") == std::string("/tmp/new\nline\\\x7f"));
    CHECK(unescape_reply_field("\\x00") == std::string(1, '\0'));
    CHECK_FALSE(unescape_reply_field("/tmp/\\"));
    CHECK_FALSE(unescape_reply_field("/tmp/\\x4"));
    CHECK_FALSE(unescape_reply_field("/tmp/\\x4G"));
    CHECK_FALSE(unescape_reply_field("/tmp/\\n"));
}

TEST_CASE("control client: replies to snapshot") {
    auto ok = parse_snapshot_answer("ok 3\n/srv/heapsnap.memcached.812.hslog\n");
    REQUIRE(ok);
    CHECK(ok->marker == 3);
    CHECK(ok->log == "/srv/heapsnap.memcached.812.hslog");
    CHECK(parse_snapshot_answer("ok 1\n/a\\x0ab\n")->log == "/a\nb");
    CHECK_FALSE(parse_snapshot_answer("ok 0\n/a\n"));
    CHECK_FALSE(parse_snapshot_answer("ok 1\n/a"));
    CHECK_FALSE(parse_snapshot_answer("ok 1\n\n"));
    CHECK_FALSE(parse_snapshot_answer("ok 1\n/a\n/b\n"));
    CHECK_FALSE(parse_snapshot_answer("ok -1\n/a\n"));
    CHECK_FALSE(parse_snapshot_answer("error the process is exiting\n"));
    CHECK(refusal_of("error the process is exiting\n") == std::string("the process is exiting"));
    CHECK_FALSE(refusal_of("ok 1\n/a\n"));
}

TEST_CASE("control client: replies to info") {
    std::string reply =
        "ok info\npid 812\nuid 0 65534\nsince 1767312000123456789\nevents 120345\n"
        "exe /usr/bin/memcached\nlog /srv/x\\x5cy.hslog\n";
    auto info = parse_info_answer(reply);
    REQUIRE(info);
    CHECK(info->pid == 812);
    CHECK(info->uid == 0);
    CHECK(info->euid == 65534);
    CHECK(info->since_ns == 1767312000123456789ull);
    CHECK(info->events == 120345);
    CHECK(info->exe == "/usr/bin/memcached");
    CHECK(info->log == "/srv/x\\y.hslog");
    // A field a later recorder adds is skipped; a missing one is an error.
    CHECK(parse_info_answer("ok info\nthreads 4\n" + reply.substr(8)));
    CHECK_FALSE(parse_info_answer(reply.substr(0, reply.find("events"))));
    CHECK_FALSE(parse_info_answer("ok info\npid 812\nuid 0\nsince 1\nevents 2\nexe /a\nlog /b\n"));
    CHECK_FALSE(parse_info_answer("ok 1\n/a\n"));
    CHECK_FALSE(parse_info_answer(""));
}
