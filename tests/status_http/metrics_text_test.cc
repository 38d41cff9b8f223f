// MetricsText (Prometheus' text format 0.0.4) and the process metrics: exact
// output, escaping, value formatting, every misuse, plausible values read from
// /proc, and a rich exposition that promtool accepts.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "ddp/common/error.h"
#include "ddp/status_http/metrics_text.h"
#include "ddp/status_http/process_metrics.h"
#include "process_util.h"
#include "temp_dir.h"

namespace ddp::status_http {
namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

// The text a single unlabelled gauge sample of `value` writes for its value.
std::string formatted(double value) {
  MetricsText text;
  text.family("x", "gauge", "x");
  text.sample("x", value);
  const std::string& out = text.text();
  const std::string prefix = "# HELP x x\n# TYPE x gauge\nx ";
  EXPECT_EQ(out.rfind(prefix, 0), 0u) << out;
  return out.substr(prefix.size(), out.size() - prefix.size() - 1);
}

// The value of the unlabelled sample `name` in an exposition.
std::optional<double> value_of(const std::string& text, const std::string& name) {
  const std::string needle = "\n" + name + " ";
  const auto at = text.find(needle);
  if (at == std::string::npos) return std::nullopt;
  return std::stod(text.substr(at + needle.size()));
}

TEST(MetricsText, WritesASmallExpositionExactly) {
  MetricsText text;
  text.family("ddp_requests_total", "counter", "Requests served.");
  text.sample("ddp_requests_total", {{"code", "200"}, {"path", "/metrics"}}, 7);
  text.sample("ddp_requests_total", {{"code", "404"}, {"path", "/x"}}, 1);
  text.family("ddp_temperature_celsius", "gauge", "A gauge.");
  text.sample("ddp_temperature_celsius", 21.5);
  text.family("ddp:thing", "untyped", "Untyped, with a colon in its name.");
  text.sample("ddp:thing", {{"_a", "x"}, {"b__c", ""}}, -3);
  text.family("ddp_empty", "gauge", "A family without samples.");
  EXPECT_EQ(text.text(),
            "# HELP ddp_requests_total Requests served.\n"
            "# TYPE ddp_requests_total counter\n"
            "ddp_requests_total{code=\"200\",path=\"/metrics\"} 7\n"
            "ddp_requests_total{code=\"404\",path=\"/x\"} 1\n"
            "# HELP ddp_temperature_celsius A gauge.\n"
            "# TYPE ddp_temperature_celsius gauge\n"
            "ddp_temperature_celsius 21.5\n"
            "# HELP ddp:thing Untyped, with a colon in its name.\n"
            "# TYPE ddp:thing untyped\n"
            "ddp:thing{_a=\"x\",b__c=\"\"} -3\n"
            "# HELP ddp_empty A family without samples.\n"
            "# TYPE ddp_empty gauge\n");
}

TEST(MetricsText, SamplesJoinTheirFamilyWhateverTheOrderOfCalls) {
  MetricsText text;
  text.family("a", "gauge", "First.");
  text.family("b", "gauge", "Second.");
  text.sample("b", 2);
  text.sample("a", 1);
  text.sample("b", {{"k", "v"}}, 3);
  EXPECT_EQ(text.text(),
            "# HELP a First.\n# TYPE a gauge\na 1\n"
            "# HELP b Second.\n# TYPE b gauge\nb 2\nb{k=\"v\"} 3\n");
}

TEST(MetricsText, EscapesLabelValuesAndHelp) {
  MetricsText text;
  text.family("m", "gauge", "Help with a \\ backslash,\na newline and \"quotes\".");
  text.sample("m", {{"v", "a\"b\\c\nd"}}, 1);
  text.sample("m", {{"v", "h\xC3\xA9llo \xE2\x9C\x93 \xE6\x97\xA5\xF0\x9F\x98\x80"}}, 2);
  EXPECT_EQ(text.text(),
            "# HELP m Help with a \\\\ backslash,\\na newline and \"quotes\".\n"
            "# TYPE m gauge\n"
            "m{v=\"a\\\"b\\\\c\\nd\"} 1\n"
            "m{v=\"h\xC3\xA9llo \xE2\x9C\x93 \xE6\x97\xA5\xF0\x9F\x98\x80\"} 2\n");
}

TEST(MetricsText, ReplacesInvalidUtf8) {
  const std::string replacement = "\xEF\xBF\xBD";
  const std::map<std::string, std::string> cases = {
      {"a\xFFz", "a" + replacement + "z"},
      {"\xE2\x9C", replacement + replacement},                                      // cut short
      {"\xC0\xAF", replacement + replacement},                                      // overlong
      {"\xED\xA0\x80", replacement + replacement + replacement},                    // a surrogate
      {"\xF4\x90\x80\x80", replacement + replacement + replacement + replacement},  // > U+10FFFF
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},  // U+10FFFF itself
  };
  for (const auto& [input, expected] : cases) {
    MetricsText text;
    text.family("m", "gauge", "h");
    text.sample("m", {{"v", input}}, 1);
    EXPECT_EQ(text.text(), "# HELP m h\n# TYPE m gauge\nm{v=\"" + expected + "\"} 1\n")
        << testing::PrintToString(input);
  }
  MetricsText help;
  help.family("m", "gauge", "bad \xFF byte");
  EXPECT_EQ(help.text(), "# HELP m bad " + replacement + " byte\n# TYPE m gauge\n");
}

TEST(MetricsText, FormatsValuesAsPrometheusReadsThem) {
  EXPECT_EQ(formatted(1), "1");
  EXPECT_EQ(formatted(0), "0");
  EXPECT_EQ(formatted(-0.0), "0");
  EXPECT_EQ(formatted(-42), "-42");
  EXPECT_EQ(formatted(0.5), "0.5");
  EXPECT_EQ(formatted(0.1), "0.1");
  EXPECT_EQ(formatted(123456.789), "123456.789");
  EXPECT_EQ(formatted(1e15), "1000000000000000");
  EXPECT_EQ(formatted(9007199254740992.0), "9007199254740992");  // 2^53
  EXPECT_EQ(formatted(-9007199254740992.0), "-9007199254740992");
  EXPECT_EQ(formatted(9007199254740994.0), "9007199254740994");  // past 2^53: shortest form
  EXPECT_EQ(formatted(1e21), "1e+21");
  EXPECT_EQ(formatted(1.5e300), "1.5e+300");
  EXPECT_EQ(formatted(1e-7), "1e-07");
  EXPECT_EQ(formatted(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(formatted(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(formatted(-std::numeric_limits<double>::infinity()), "-Inf");
  // Every finite value reads back exactly.
  for (double value : {0.1, 1.0 / 3, 2.5e-300, 6.02214076e23, -1e-5, 4503599627370497.5}) {
    EXPECT_EQ(std::stod(formatted(value)), value) << formatted(value);
  }
}

TEST(MetricsText, RefusesEveryMisuse) {
  auto refused = [](const std::string& what, const std::function<void(MetricsText&)>& misuse) {
    MetricsText text;
    text.family("declared", "gauge", "A family.");
    text.sample("declared", 1);
    const std::string before = text.text();
    EXPECT_THROW(misuse(text), InternalError) << what;
    EXPECT_EQ(text.text(), before) << what << ": a refused call wrote something";
  };
  for (const char* name : {"", "1abc", "a-b", "a b", "a.b", "h\xC3\xA9", "a{b}"}) {
    refused(std::string("metric name '") + name + "'",
            [&](MetricsText& t) { t.family(name, "gauge", "h"); });
  }
  for (const char* type : {"histogram", "summary", "Counter", "", "gauge "}) {
    refused(std::string("type '") + type + "'", [&](MetricsText& t) { t.family("m", type, "h"); });
  }
  refused("a counter not named _total",
          [](MetricsText& t) { t.family("requests", "counter", "h"); });
  refused("a family declared twice", [](MetricsText& t) { t.family("declared", "gauge", "h"); });
  refused("a family declared twice with another type",
          [](MetricsText& t) { t.family("declared", "untyped", "h"); });
  refused("no help", [](MetricsText& t) { t.family("m", "gauge", ""); });
  refused("a sample of an undeclared family", [](MetricsText& t) { t.sample("other", 1); });
  for (const char* label : {"", "1a", "a-b", "__name__", "__", "a:b", "\xC3\xA9"}) {
    refused(std::string("label name '") + label + "'", [&](MetricsText& t) {
      t.sample("declared", {{"ok", "1"}, {label, "v"}}, 1);
    });
  }
  refused("a label given twice", [](MetricsText& t) {
    t.sample("declared", {{"a", "1"}, {"b", "2"}, {"a", "3"}}, 1);
  });
}

TEST(ProcessMetrics, ArePresentAndPlausible) {
  MetricsText text;
  write_process_metrics(text);
  const std::string& out = text.text();
  for (const char* family :
       {"process_cpu_seconds_total counter", "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge", "process_open_fds gauge", "process_max_fds gauge",
        "process_start_time_seconds gauge", "process_threads gauge"}) {
    EXPECT_NE(out.find(std::string("# TYPE ") + family + "\n"), std::string::npos)
        << family << " missing from\n"
        << out;
  }
  const auto rss = value_of(out, "process_resident_memory_bytes");
  const auto vsize = value_of(out, "process_virtual_memory_bytes");
  const auto cpu = value_of(out, "process_cpu_seconds_total");
  const auto open_fds = value_of(out, "process_open_fds");
  const auto max_fds = value_of(out, "process_max_fds");
  const auto start = value_of(out, "process_start_time_seconds");
  const auto threads = value_of(out, "process_threads");
  ASSERT_TRUE(rss && vsize && cpu && open_fds && max_fds && start && threads) << out;
  EXPECT_GT(*rss, 1 << 20);  // a gtest program holds more than a MiB
  EXPECT_GE(*vsize, *rss);
  EXPECT_GE(*cpu, 0);
  EXPECT_GE(*open_fds, 3);  // stdin, stdout, stderr
  EXPECT_LE(*open_fds, *max_fds);
  EXPECT_GE(*threads, 1);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(*start, now + 5);  // btime is whole seconds
  EXPECT_GT(*start, now - 24 * 3600);

  // One more open descriptor is counted, and only it (the listing's own is not).
  const int extra = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(extra, 0);
  MetricsText again;
  write_process_metrics(again);
  ::close(extra);
  EXPECT_EQ(value_of(again.text(), "process_open_fds"), *open_fds + 1);
}

TEST(ProcessMetrics, CollideWithFamiliesDeclaredBefore) {
  MetricsText text;
  text.family("process_open_fds", "gauge", "Declared by the caller.");
  EXPECT_THROW(write_process_metrics(text), InternalError);
}

// promtool's verdict on `exposition`: its exit code and output.
test::RunResult promtool_check(const std::string& exposition) {
  test::TempDir dir("metrics-text");
  const auto file = dir.path() / "metrics.txt";
  {
    std::ofstream out(file, std::ios::binary);
    out << exposition;
  }
  return test::run(
      {"/bin/sh", "-c", std::string(kPromtool) + " check metrics < '" + file.string() + "'"},
      {{"PATH", "/usr/bin:/bin"}}, dir.path(), std::chrono::seconds(60));
}

TEST(MetricsText, ARichExpositionPassesPromtool) {
  if (::access(kPromtool, X_OK) != 0) {
    GTEST_SKIP() << kPromtool << " is not installed (Debian's prometheus package has it)";
  }
  MetricsText text;
  text.family("ddp_info", "gauge", "Facts about the job, with \\ and\nnewlines in the help.");
  text.sample("ddp_info",
              {{"quoted", "say \"hi\""},
               {"backslash", "C:\\path\\to"},
               {"newline", "line one\nline two"},
               {"unicode", "h\xC3\xA9llo \xE2\x9C\x93 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80"},
               {"invalid", "bad \xFF\xFE bytes"},
               {"empty", ""}},
              1);
  text.family("ddp_restarts_total", "counter", "Restarts, by cause.");
  text.sample("ddp_restarts_total", {{"cause", "worker_failed"}}, 3);
  text.sample("ddp_restarts_total", {{"cause", "node_lost"}}, 0);
  text.family("ddp_step_seconds", "gauge", "Step time, by rank.");
  for (int rank = 0; rank < 4; ++rank) {
    text.sample("ddp_step_seconds", {{"rank", std::to_string(rank)}, {"node", "0"}},
                0.125 * (rank + 1));
  }
  text.family("ddp_odd_values", "untyped", "Values of every kind.");
  text.sample("ddp_odd_values", {{"kind", "nan"}}, std::nan(""));
  text.sample("ddp_odd_values", {{"kind", "inf"}}, std::numeric_limits<double>::infinity());
  text.sample("ddp_odd_values", {{"kind", "-inf"}}, -std::numeric_limits<double>::infinity());
  text.sample("ddp_odd_values", {{"kind", "big"}}, 1e21);
  text.sample("ddp_odd_values", {{"kind", "exact"}}, 9007199254740992.0);
  text.sample("ddp_odd_values", {{"kind", "tiny"}}, -1e-300);
  write_process_metrics(text);

  const auto verdict = promtool_check(text.text());
  EXPECT_EQ(verdict.code, 0) << verdict.output() << "\n--- exposition:\n" << text.text();

  // The check can fail: promtool refuses what MetricsText never writes.
  const auto broken = promtool_check(
      "# HELP a_total A.\n# TYPE a_total counter\n"
      "a_total{v=\"\xFF\"} 1\n");
  EXPECT_NE(broken.code, 0) << broken.output();
}

}  // namespace
}  // namespace ddp::status_http
