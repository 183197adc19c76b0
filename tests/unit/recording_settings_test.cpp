// The settings that steer a recording (cli/recording_settings.h): the
// duration and rule parsers, the checks across options, the variables
// handed to the recorder; and the pause and resume replies
// (cli/pause_client.h).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/pause_client.h"
#include "cli/recording_settings.h"

using namespace heapsnap::cli;

TEST_CASE("recording settings: durations take ms, s, m, h, and a bare number is seconds") {
    CHECK(parse_duration("0.5s") == 0.5);
    CHECK(parse_duration("30s") == 30.0);
    CHECK(parse_duration("15m") == 900.0);
    CHECK(parse_duration("500ms") == doctest::Approx(0.5));
    CHECK(parse_duration("2h") == 7200.0);
    CHECK(parse_duration("1.5h") == 5400.0);
    CHECK(parse_duration("90") == 90.0);
    CHECK(parse_duration("0") == 0.0);
    for (const char* bad :
         {"", "s", ".5s", "5.s", "1.2.3s", "-1s", "+1s", "10x", "10 s", "10S", "1M", "1e3", "5sec", "ms", "inf", "nan"})
        CHECK_MESSAGE(!parse_duration(bad), bad);
}

TEST_CASE("recording settings: rules are normalized to kind>size in the largest exact unit") {
    auto rule = parse_snapshot_rule("rss>1G");
    REQUIRE(rule);
    CHECK(rule->kind == RuleKind::Rss);
    CHECK(rule->bytes == uint64_t{1} << 30);
    CHECK(rule->label == "rss>1G");

    auto spaced = parse_snapshot_rule(" RSS > 1024m ");
    REQUIRE(spaced);
    CHECK(spaced->label == "rss>1G");

    auto live = parse_snapshot_rule("live>1.5G");
    REQUIRE(live);
    CHECK(live->kind == RuleKind::Live);
    CHECK(live->bytes == 1610612736);
    CHECK(live->label == "live>1536M");

    auto growth = parse_snapshot_rule("Growth>100MiB");
    REQUIRE(growth);
    CHECK(growth->kind == RuleKind::Growth);
    CHECK(growth->bytes == 100u << 20);
    CHECK(growth->label == "growth>100M");

    auto bytes = parse_snapshot_rule("growth>4097");
    REQUIRE(bytes);
    CHECK(bytes->label == "growth>4097");
    CHECK(parse_snapshot_rule("live>4096")->label == "live>4K");
    CHECK(parse_snapshot_rule("rss>1024T")->bytes == kMaxRuleBytes);

    for (const char* bad : {"", "rss", "rss>", ">1G", "rss<1G", "rss=1G", "rss>=1G", "heap>1G", "rss>0", "rss>-1G",
                            "rss>1X", "rss>1G,live>2G", "rss>>1G", "rss>1025T", "rss>1 G"})
        CHECK_MESSAGE(!parse_snapshot_rule(bad), bad);
}

TEST_CASE("recording settings: rules checked together, and the recorder's variables") {
    SteeringSettings s;
    s.rules = {"rss>1G", "live>512M", "growth>100M"};
    CHECK_NOTHROW(check_steering(s, 0));
    CHECK_THROWS_WITH(check_steering(s, 65536), doctest::Contains("live>512M cannot be used with --sample-bytes"));
    SteeringSettings rss_only;
    rss_only.rules = {"rss>1G"};
    CHECK_NOTHROW(check_steering(rss_only, 65536));
    SteeringSettings twice;
    twice.rules = {"rss>1G", "rss>1G"};
    CHECK_THROWS_WITH(check_steering(twice, 0), doctest::Contains("rss>1G is given twice"));
    SteeringSettings many;
    for (int i = 1; i <= 17; ++i) many.rules.push_back("live>" + std::to_string(i) + "M");
    CHECK_THROWS_WITH(check_steering(many, 0), doctest::Contains("at most 16 rules (17 given)"));

    using Env = std::vector<std::pair<std::string, std::string>>;
    CHECK(steering_environment(SteeringSettings{}) ==
          Env{{"HEAPSNAP_PAUSED", ""}, {"HEAPSNAP_STACKS_AFTER", ""}, {"HEAPSNAP_SNAPSHOT_WHEN", ""}});
    SteeringSettings after;
    after.stacks_after_s = 0.5;
    after.rules = {"rss>1G", "growth>100M"};
    CHECK(steering_environment(after) == Env{{"HEAPSNAP_PAUSED", "1"},
                                             {"HEAPSNAP_STACKS_AFTER", "0.5"},
                                             {"HEAPSNAP_SNAPSHOT_WHEN", "rss>1G,growth>100M"}});
    SteeringSettings paused;
    paused.paused = true;
    CHECK(steering_environment(paused)[0] == std::pair<std::string, std::string>{"HEAPSNAP_PAUSED", "1"});
}

TEST_CASE("pause client: the replies to pause and resume") {
    auto paused = parse_steer_answer(SteerRequest::Pause, "ok paused 3\n/tmp/a\\x0ab.hslog\n");
    REQUIRE(paused);
    CHECK(paused->changed);
    CHECK(paused->marker == 3);
    CHECK(paused->log == "/tmp/a\nb.hslog");
    auto already = parse_steer_answer(SteerRequest::Pause, "ok already paused\n/tmp/a.hslog\n");
    REQUIRE(already);
    CHECK_FALSE(already->changed);
    CHECK(already->log == "/tmp/a.hslog");
    auto resumed = parse_steer_answer(SteerRequest::Resume, "ok resumed 12\n/tmp/a.hslog\n");
    REQUIRE(resumed);
    CHECK(resumed->marker == 12);
    CHECK_FALSE(parse_steer_answer(SteerRequest::Resume, "ok not paused\n/tmp/a.hslog\n")->changed);
    for (const char* bad : {"", "ok paused 3\n", "ok paused 3\n/tmp/a", "ok paused 0\n/a\n", "ok paused 03\n/a\n",
                            "ok paused x\n/a\n", "ok paused 3\n\n", "ok 3\n/a\n", "ok paused 3\n/a\n/b\n",
                            "ok paused 3\n/a\\q\n", "ok paused 4294967296\n/a\n"})
        CHECK_MESSAGE(!parse_steer_answer(SteerRequest::Pause, bad), bad);
    // Each request takes its own verbs only.
    CHECK_FALSE(parse_steer_answer(SteerRequest::Resume, "ok paused 3\n/a\n"));
    CHECK_FALSE(parse_steer_answer(SteerRequest::Pause, "ok not paused\n/a\n"));
}
