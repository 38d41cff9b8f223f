// Unit tests of ddprun's SLURM support (launcher/include/ddp/launcher/slurm.h):
// host-list expansion, compared with `scontrol show hostnames` on hand-written
// and generated lists when scontrol is installed, and the readers of the job's
// environment, fed from a map.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/launcher/slurm.h"
#include "process_util.h"
#include "temp_dir.h"

namespace ddp::launcher {
namespace {

using ddp::test::RunResult;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The message of the InvalidArgument that `f` throws ("" when none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// ------------------------------------------------------------ expand_hostlist

TEST(Hostlist, PlainNamesAndCommas) {
  EXPECT_THAT(expand_hostlist("node7"), ElementsAre("node7"));
  EXPECT_THAT(expand_hostlist("a,b,c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(expand_hostlist("gpu-a.example.com,10.0.0.1"),
              ElementsAre("gpu-a.example.com", "10.0.0.1"));
  // Empty entries are skipped; whitespace separates like a comma; order and
  // duplicates stay.
  EXPECT_THAT(expand_hostlist("b,,a,"), ElementsAre("b", "a"));
  EXPECT_THAT(expand_hostlist(" x , y\tz"), ElementsAre("x", "y", "z"));
  EXPECT_THAT(expand_hostlist("n1,n1"), ElementsAre("n1", "n1"));
}

TEST(Hostlist, RangesAndZeroPadding) {
  EXPECT_THAT(expand_hostlist("node[01-04,07],gpu-a[1-2]"),
              ElementsAre("node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"));
  EXPECT_THAT(expand_hostlist("node[1-4]"), ElementsAre("node1", "node2", "node3", "node4"));
  EXPECT_THAT(expand_hostlist("node[098-101]"),
              ElementsAre("node098", "node099", "node100", "node101"));
  // The width is that of the first number as written.
  EXPECT_THAT(expand_hostlist("n[1-02]"), ElementsAre("n1", "n2"));
  EXPECT_THAT(expand_hostlist("n[00-2]"), ElementsAre("n00", "n01", "n02"));
  EXPECT_THAT(expand_hostlist("n[9-11]"), ElementsAre("n9", "n10", "n11"));
  EXPECT_THAT(expand_hostlist("n[5]"), ElementsAre("n5"));
  EXPECT_THAT(expand_hostlist("n[2,1,1]"), ElementsAre("n2", "n1", "n1"));
  EXPECT_THAT(expand_hostlist("[1-3]"), ElementsAre("1", "2", "3"));
  EXPECT_THAT(expand_hostlist("10.0.0.[1-2]"), ElementsAre("10.0.0.1", "10.0.0.2"));
  EXPECT_EQ(expand_hostlist("n[01-100]").size(), 100u);
  EXPECT_EQ(expand_hostlist("n[01-100]").back(), "n100");
  EXPECT_EQ(expand_hostlist("n[1-65536]").size(), 65536u);
}

TEST(Hostlist, SeveralBracketGroupsNestLikeSlurm) {
  EXPECT_THAT(expand_hostlist("rack[1-2]-node[01-02]"),
              ElementsAre("rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"));
  EXPECT_THAT(expand_hostlist("n[1-2][3-4]"), ElementsAre("n13", "n14", "n23", "n24"));
  // Three groups: the second is the outermost loop, then the first, then the last.
  EXPECT_THAT(
      expand_hostlist("a[1-2]b[1-2]c[1-2]"),
      ElementsAre("a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"));
}

TEST(Hostlist, FirstHostChecksTheWholeList) {
  EXPECT_EQ(first_host("node[01-04,07],gpu-a[1-2]"), "node01");
  EXPECT_EQ(first_host("rack[3-4]-node[09-10]"), "rack3-node09");
  EXPECT_EQ(first_host(",b[2,1]"), "b2");
  EXPECT_THAT(error_of([] { first_host("node[01-04],bad[2-1]"); }),
              HasSubstr("reversed range '2-1'"));
}

TEST(Hostlist, MalformedListsAreClearErrors) {
  struct Case {
    const char* list;
    const char* message;
  };
  const Case cases[] = {
      {"", "names no host"},
      {",", "names no host"},
      {"node[01-04", "unbalanced '['"},
      {"node01-04]", "']' without '['"},
      {"n[1-3]]", "']' without '['"},
      {"n[[1-3]]", "nested '['"},
      {"n[3-1]", "reversed range '3-1'"},
      {"n[]", "empty brackets"},
      {"n[1,,2]", "empty range"},
      {"n[1,]", "empty range"},
      {"n[a-b]", "bad range 'a-b'"},
      {"n[1-2-3]", "bad range '1-2-3'"},
      {"n[-2]", "bad range '-2'"},
      {"n[1-]", "bad range '1-'"},
      {"n[+1-2]", "bad range '+1-2'"},
      {"n[ 1-2]", "whitespace inside brackets"},
      {"n[1-3]x", "text 'x' after the last ']'"},
      {"a[1-2]b[1-2]c", "text 'c' after the last ']'"},
      {"n[1-65537]", "more than 65536 hosts"},
      {"n[1234567890123456789]", "number too large"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.list);
    const std::string message = error_of([&] { expand_hostlist(c.list); });
    EXPECT_THAT(message, HasSubstr(c.message));
    EXPECT_THAT(message, HasSubstr("host list: "));
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
  EXPECT_THAT(error_of([] { expand_hostlist("a[1-1000],b[1-1000]", 1500); }),
              HasSubstr("names more than 1500 hosts"));
  EXPECT_THAT(error_of([] { expand_hostlist("a[1-65536][1-65536][1-65536][1-65536]"); }),
              HasSubstr("names more than"));
}

// ------------------------------------------------- against scontrol hostnames

std::string find_scontrol() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/opt/slurm/bin"}) {
    const std::string path = std::string(dir) + "/scontrol";
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// Hand-written lists: what SLURM writes itself and what people type.
const std::vector<std::string>& written_lists() {
  static const std::vector<std::string> lists = {
      "node[01-04,07],gpu-a[1-2]",
      "node[1-4]",
      "node[098-101]",
      "node01",
      "a,b,c",
      "rack[1-2]-node[01-02]",
      "n[1-2][3-4]",
      "n[01-04]a[1-2]",
      "a[1-2]b[1-2]c[1-2]",
      "x[1-2],y[3-4]z[5-6]",
      "n[1-2]x[3]",
      "n[1]-[2]",
      "n[1-2]-[3-4]",
      "node-[1-2]",
      "10.0.0.[1-3]",
      "a.b[1-2]",
      "[1-3]",
      "n[1-3],m[5]",
      "n[1-3],m",
      "n[0-0]",
      "n[1-1,1-1]",
      "n[2,1]",
      "n1,n1",
      "n[1-2],n1",
      "n[01-100]",
      "n[0-3]",
      "n[00-3]",
      "n[010-011]",
      "n[01-0100]",
      "n[9-10]",
      "n[09-11]",
      "n[08-011]",
      "n[1-02]",
      "n[01-2]",
      "n[001-10]",
      "n[5]",
      "n[0001-0003]",
      "n[1-2,3-4]b[1-2]",
      "n[1-3],n[2-4]",
      "foo",
      "a-b-c",
      "a_b.c-d",
      "N[1-2]",
      "n_[1-2]",
      "n[01,2,003]",
      "n[1-2,4,6-7]",
      "n[1-2],,m",
      ",a",
      "a,",
      " a , b ",
      "a b",
      "tux[0-3],tux[10-12],login1",
      "compute-[0-1]-[00-03]",
      "c[1-2]-g[1-2]-n[1-2]",
      "n[1-65536]",
      "n[65535-65536]",
      "n[999999-1000001]",
      "gpu[1-4,8],cpu[100-102,7]",
      "a[1-3]b[7]",
      "x",
      "xy-12.z_3",
      "n[0000-0002]",
      "n[1-9,10-11,012]",
  };
  return lists;
}

// Lists SLURM itself refuses ("Invalid hostlist"): ddprun refuses them too.
const std::vector<std::string>& refused_lists() {
  static const std::vector<std::string> lists = {
      "n[3-1]",    "n[]",         "n[1,,2]",         "n[a-b]",   "n[1-3]x",    "a.b[1-2].c",
      "n[[1-3]]",  "n[1-3]]",     "n[1-2-3]",        "n[-2]",    "n[1-65537]", "a[1-2]b[1-2]c",
      "n[1-3]x,m", "n[1-3]x[1]y", "n[1-2]y,m[1-2]z", "n[1-3]]x", ",",          "n[2-1],ok",
  };
  return lists;
}

// Generated lists: names of letters, digits, '-', '.' and '_', entries of 0 to
// 3 bracket groups with text between them, ranges of random widths.
std::vector<std::string> generated_lists(int count, unsigned seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-._";
  auto text = [&](int lo, int hi) {
    std::string t;
    for (int n = pick(lo, hi); n > 0; --n) t += alphabet[static_cast<std::size_t>(pick(0, 38))];
    return t;
  };
  auto number = [&](int value, int width) {
    std::string digits = std::to_string(value);
    if (static_cast<int>(digits.size()) < width) digits.insert(0, width - digits.size(), '0');
    return digits;
  };
  std::vector<std::string> lists;
  for (int i = 0; i < count; ++i) {
    std::string list;
    for (int entries = pick(1, 4); entries > 0; --entries) {
      if (!list.empty()) list += ",";
      std::string entry = "n" + text(0, 6);
      const int groups = pick(0, 3);
      for (int g = 0; g < groups; ++g) {
        if (g > 0) entry += text(0, 3);
        entry += "[";
        for (int r = pick(1, 3); r > 0; --r) {
          const int lo = pick(0, 120);
          const int width = pick(0, 4);
          entry += number(lo, width);
          if (pick(0, 3) != 0) entry += "-" + number(lo + pick(0, groups > 1 ? 3 : 12), pick(0, 4));
          if (r > 1) entry += ",";
        }
        entry += "]";
      }
      list += entry;
    }
    lists.push_back(list);
  }
  return lists;
}

class ScontrolComparison : public ::testing::Test {
 protected:
  void SetUp() override {
    scontrol_ = find_scontrol();
    if (scontrol_.empty()) GTEST_SKIP() << "scontrol is not installed: no comparison with SLURM";
    // scontrol needs a configuration to start, not a controller.
    conf_ = dir_.str() + "/slurm.conf";
    std::ofstream(conf_) << "ClusterName=ddptest\nSlurmctldHost=localhost\n"
                            "NodeName=localhost\nPartitionName=test Nodes=localhost\n";
    RunResult probe = run_scontrol("a[1-2]");
    if (probe.out != "a1\na2\n") {
      GTEST_SKIP() << "scontrol show hostnames does not run here (printed '" << probe.out << "')";
    }
  }

  RunResult run_scontrol(const std::string& list) {
    return ddp::test::run({scontrol_, "show", "hostnames", list},
                          {{"SLURM_CONF", conf_}, {"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}},
                          dir_.path());
  }

  // Compares one list; returns whether scontrol accepted it.
  void compare(const std::string& list) {
    SCOPED_TRACE("list '" + list + "'");
    RunResult slurm = run_scontrol(list);
    ASSERT_TRUE(slurm.code >= 0 && slurm.code < 128)
        << "scontrol died or hung (" << slurm.code << ")";
    std::vector<std::string> expected;
    std::istringstream in(slurm.out);
    for (std::string line; std::getline(in, line);) expected.push_back(line);
    if (expected.empty()) {
      // SLURM refused it (or it names no host): so does ddprun.
      EXPECT_NE(error_of([&] { expand_hostlist(list); }), "") << "scontrol printed nothing";
      ++refused_;
      return;
    }
    std::vector<std::string> ours;
    ASSERT_EQ(error_of([&] { ours = expand_hostlist(list); }), "");
    EXPECT_EQ(ours, expected);
    EXPECT_EQ(first_host(list), expected.front());
    ++accepted_;
  }

  ddp::test::TempDir dir_{"ddp-slurm-hostlist"};
  std::string scontrol_;
  std::string conf_;
  int accepted_ = 0;
  int refused_ = 0;
};

TEST_F(ScontrolComparison, WrittenLists) {
  for (const auto& list : written_lists()) compare(list);
  EXPECT_EQ(accepted_, static_cast<int>(written_lists().size()));
  std::printf("compared %d written lists with scontrol show hostnames\n", accepted_);
}

TEST_F(ScontrolComparison, ListsSlurmRefuses) {
  for (const auto& list : refused_lists()) compare(list);
  EXPECT_EQ(refused_, static_cast<int>(refused_lists().size()));
  std::printf("%d lists refused by both scontrol and ddprun\n", refused_);
}

TEST_F(ScontrolComparison, GeneratedLists) {
  const auto lists = generated_lists(300, 20261122);
  for (const auto& list : lists) compare(list);
  // The generator writes only valid lists.
  EXPECT_EQ(accepted_, static_cast<int>(lists.size()));
  std::printf("compared %d generated lists with scontrol show hostnames\n", accepted_);
}

// Lists that scontrol reads by accident (and SLURM never writes): ddprun
// refuses them rather than guess. What scontrol makes of them is noted.
TEST(Hostlist, ListsScontrolMisreadsAreRefused) {
  for (const char* list : {"n[1-3",       // scontrol: "n]"
                           "n]",          // scontrol: "n]"
                           "n[1-]",       // scontrol: "n1"
                           "n[ 1-2]",     // scontrol: "n01 n02"
                           "n[+1-2]"}) {  // scontrol: "n01 n02"
    SCOPED_TRACE(list);
    EXPECT_NE(error_of([&] { expand_hostlist(list); }), "");
  }
}

// ------------------------------------------------------------- count_for_node

TEST(CountForNode, PlainAndCompressedForms) {
  EXPECT_EQ(count_for_node("8", 0), 8);
  EXPECT_EQ(count_for_node("8", 5), 8);  // a single plain count is every node's
  EXPECT_EQ(count_for_node("2(x3),1", 0), 2);
  EXPECT_EQ(count_for_node("2(x3),1", 2), 2);
  EXPECT_EQ(count_for_node("2(x3),1", 3), 1);
  EXPECT_EQ(count_for_node("3,1", 1), 1);
  EXPECT_EQ(count_for_node("4(x2)", 1), 4);
  EXPECT_THAT(error_of([] { count_for_node("2(x3),1", 4); }), HasSubstr("no entry for node 4"));
  EXPECT_THAT(error_of([] { count_for_node("4(x2)", 2); }), HasSubstr("no entry for node 2"));
  for (const char* bad : {"", "x", "2(x", "2(x0)", "2(3)", "0", "-1", "2,,1", "1.5"}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(error_of([&] { count_for_node(bad, 0); }), "");
  }
}

// ---------------------------------------------------------- SlurmEnvironment

SlurmEnvironment environment(std::map<std::string, std::string> vars) {
  return SlurmEnvironment([vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

TEST(SlurmEnvironment, NotAJobWithoutJobId) {
  EXPECT_FALSE(environment({}).in_job());
  EXPECT_FALSE(environment({{"SLURM_JOB_ID", ""}, {"SLURM_NNODES", "2"}}).in_job());
  EXPECT_TRUE(environment({{"SLURM_JOB_ID", "7"}}).in_job());
}

TEST(SlurmEnvironment, WhatSrunGivesATask) {
  // As srun set it on the second node of a 2-node step (SLURM 22.05).
  auto env = environment({{"SLURM_JOB_ID", "123457"},
                          {"SLURM_NNODES", "2"},
                          {"SLURM_JOB_NUM_NODES", "4"},
                          {"SLURM_NODEID", "1"},
                          {"SLURM_STEP_ID", "0"},
                          {"SLURM_JOB_NODELIST", "node[01-04]"},
                          {"SLURM_NODELIST", "node[01-04]"},
                          {"SLURM_STEP_NODELIST", "node[03-04]"},
                          {"SLURM_NTASKS_PER_NODE", "1"}});
  EXPECT_TRUE(env.in_step());
  EXPECT_EQ(env.job_id(), "123457");
  EXPECT_EQ(env.store_port(), 23457);
  EXPECT_EQ(env.num_nodes().value, 2);
  EXPECT_EQ(env.num_nodes().variable, "SLURM_NNODES");
  EXPECT_EQ(env.node_id().value, 1);
  EXPECT_EQ(env.node_list().variable, "SLURM_STEP_NODELIST");
  EXPECT_EQ(env.master_host(), "node03");
  ASSERT_TRUE(env.workers_per_node());
  EXPECT_EQ(env.workers_per_node()->value, 1);
  EXPECT_EQ(env.workers_per_node()->variable, "SLURM_NTASKS_PER_NODE");
}

TEST(SlurmEnvironment, TheBatchScript) {
  // No step: the job's list (SLURM_STEP_NODELIST would be a stale leftover).
  auto env = environment({{"SLURM_JOB_ID", "9"},
                          {"SLURM_JOB_NUM_NODES", "3"},
                          {"SLURM_NODEID", "0"},
                          {"SLURM_STEP_NODELIST", "stale1"},
                          {"SLURM_NODELIST", "other[1-3]"},
                          {"SLURM_JOB_NODELIST", "tux[7-9]"}});
  EXPECT_FALSE(env.in_step());
  EXPECT_EQ(env.num_nodes().value, 3);
  EXPECT_EQ(env.num_nodes().variable, "SLURM_JOB_NUM_NODES");
  EXPECT_EQ(env.node_list().variable, "SLURM_JOB_NODELIST");
  EXPECT_EQ(env.master_host(), "tux7");
  EXPECT_EQ(env.store_port(), 20009);
  EXPECT_FALSE(env.workers_per_node());
  // SLURM_NODELIST when it is the only list.
  EXPECT_EQ(environment({{"SLURM_JOB_ID", "9"}, {"SLURM_NODELIST", "a[2-3]"}}).master_host(), "a2");
}

TEST(SlurmEnvironment, WorkersPerNode) {
  // GPUs first, when positive.
  auto gpus = environment(
      {{"SLURM_JOB_ID", "1"}, {"SLURM_GPUS_ON_NODE", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(gpus.workers_per_node()->value, 4);
  EXPECT_EQ(gpus.workers_per_node()->variable, "SLURM_GPUS_ON_NODE");
  auto no_gpus = environment(
      {{"SLURM_JOB_ID", "1"}, {"SLURM_GPUS_ON_NODE", "0"}, {"SLURM_NTASKS_PER_NODE", "2"}});
  EXPECT_EQ(no_gpus.workers_per_node()->value, 2);
  // The compressed per-node form: this node's entry.
  auto per_node = environment({{"SLURM_JOB_ID", "1"},
                               {"SLURM_NNODES", "4"},
                               {"SLURM_NODEID", "3"},
                               {"SLURM_NTASKS_PER_NODE", "2(x3),1"}});
  EXPECT_EQ(per_node.workers_per_node()->value, 1);
}

TEST(SlurmEnvironment, SingleNodeWithoutNodeId) {
  auto env = environment({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "1"}});
  EXPECT_EQ(env.node_id().value, 0);
  auto two = environment({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}});
  EXPECT_THAT(error_of([&] { two.node_id(); }),
              HasSubstr("SLURM_NODEID: is not set in a job of 2 nodes"));
}

TEST(SlurmEnvironment, ErrorsNameTheVariableAndItsValue) {
  struct Case {
    std::map<std::string, std::string> vars;
    std::function<void(const SlurmEnvironment&)> read;
    std::string variable;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "two"}},
       [](const SlurmEnvironment& e) { e.num_nodes(); },
       "SLURM_NNODES",
       "SLURM_NNODES: 'two' is not a positive integer"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "0"}},
       [](const SlurmEnvironment& e) { e.num_nodes(); },
       "SLURM_NNODES",
       "SLURM_NNODES: '0' is not a positive integer"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2x"}},
       [](const SlurmEnvironment& e) { e.num_nodes(); },
       "SLURM_NNODES",
       "SLURM_NNODES: '2x' is not a positive integer"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_NODEID", "-1"}},
       [](const SlurmEnvironment& e) { e.node_id(); },
       "SLURM_NODEID",
       "SLURM_NODEID: '-1' is not a non-negative integer"},
      {{{"SLURM_JOB_ID", "12a"}},
       [](const SlurmEnvironment& e) { e.job_id(); },
       "SLURM_JOB_ID",
       "SLURM_JOB_ID: '12a' is not a positive integer"},
      {{{"SLURM_JOB_ID", "0"}},
       [](const SlurmEnvironment& e) { e.store_port(); },
       "SLURM_JOB_ID",
       "SLURM_JOB_ID: '0' is not a positive integer"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", "node[01-04"}},
       [](const SlurmEnvironment& e) { e.master_host(); },
       "SLURM_JOB_NODELIST",
       "SLURM_JOB_NODELIST: 'node[01-04' is not a valid host list: unbalanced '['"},
      {{{"SLURM_JOB_ID", "1"},
        {"SLURM_STEP_ID", "0"},
        {"SLURM_STEP_NODELIST", "n[5-4]"},
        {"SLURM_JOB_NODELIST", "ok"}},
       [](const SlurmEnvironment& e) { e.master_host(); },
       "SLURM_STEP_NODELIST",
       "SLURM_STEP_NODELIST: 'n[5-4]' is not a valid host list: reversed range '5-4'"},
      {{{"SLURM_JOB_ID", "1"}},
       [](const SlurmEnvironment& e) { e.master_host(); },
       "SLURM_JOB_NODELIST",
       "SLURM_JOB_NODELIST: is not set"},
      {{{"SLURM_JOB_ID", "1"}},
       [](const SlurmEnvironment& e) { e.num_nodes(); },
       "SLURM_NNODES",
       "SLURM_NNODES: is not set"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_GPUS_ON_NODE", "many"}},
       [](const SlurmEnvironment& e) { e.workers_per_node(); },
       "SLURM_GPUS_ON_NODE",
       "SLURM_GPUS_ON_NODE: 'many' is not a non-negative integer"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_NTASKS_PER_NODE", "2(x"}},
       [](const SlurmEnvironment& e) { e.workers_per_node(); },
       "SLURM_NTASKS_PER_NODE",
       "SLURM_NTASKS_PER_NODE: '2(x' is not a task count per node"},
      {{{"SLURM_JOB_ID", "1"}, {"SLURM_NODEID", "2"}, {"SLURM_NTASKS_PER_NODE", "2(x2)"}},
       [](const SlurmEnvironment& e) { e.workers_per_node(); },
       "SLURM_NTASKS_PER_NODE",
       "SLURM_NTASKS_PER_NODE: '2(x2)' is not a task count per node: no entry for node 2"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    auto env = environment(c.vars);
    try {
      c.read(env);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.origin(), c.variable);
      EXPECT_THAT(std::string(e.what()), HasSubstr(c.message));
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  // A long value is shown cut short.
  std::string huge = "n[1-2]" + std::string(5000, 'x');
  auto env = environment({{"SLURM_JOB_ID", "1"}, {"SLURM_JOB_NODELIST", huge}});
  const std::string message = error_of([&] { env.master_host(); });
  EXPECT_LT(message.size(), 600u);
  EXPECT_THAT(message, HasSubstr("5006 characters"));
}

}  // namespace
}  // namespace ddp::launcher
