#include "ddp/status_http/process_metrics.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::status_http {

namespace {

// What is known of this process; a field stays empty when it cannot be read.
struct ProcessFacts {
  std::optional<double> cpu_seconds;
  std::optional<double> resident_bytes;
  std::optional<double> virtual_bytes;
  std::optional<double> open_fds;
  std::optional<double> max_fds;
  std::optional<double> start_time_seconds;
  std::optional<double> threads;
};

// A /proc file's contents (they are small and have no size to stat).
std::optional<std::string> read_proc_file(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n > 0) {
      text.append(chunk, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  return text.empty() ? std::nullopt : std::optional<std::string>(std::move(text));
}

std::optional<std::uint64_t> parse_unsigned(std::string_view text) {
  std::uint64_t value = 0;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

// The fields of /proc/self/stat after "pid (comm) ", so that field N of
// proc(5) is at index N - 3. The name may hold spaces and parentheses: it
// ends at the last ')'.
std::vector<std::string_view> stat_fields_after_name(std::string_view stat) {
  std::vector<std::string_view> fields;
  const auto name_end = stat.rfind(')');
  if (name_end == std::string_view::npos) return fields;
  std::string_view rest = stat.substr(name_end + 1);
  while (!rest.empty()) {
    const auto begin = rest.find_first_not_of(" \n");
    if (begin == std::string_view::npos) break;
    rest.remove_prefix(begin);
    const auto end = std::min(rest.find(' '), rest.size());
    fields.push_back(rest.substr(0, end));
    rest.remove_prefix(end);
  }
  return fields;
}

// The field of proc(5) numbered `number` (utime is 14), as an integer.
std::optional<std::uint64_t> stat_field(const std::vector<std::string_view>& fields, int number) {
  const auto index = static_cast<std::size_t>(number - 3);
  if (index >= fields.size()) return std::nullopt;
  return parse_unsigned(fields[index]);
}

// The system's boot time, Unix seconds: /proc/stat's "btime" line.
std::optional<std::uint64_t> boot_time_seconds() {
  const auto stat = read_proc_file("/proc/stat");
  if (!stat) return std::nullopt;
  std::string_view text = *stat;
  static constexpr std::string_view kKey = "btime ";
  for (std::size_t at = 0; at < text.size();) {
    const auto end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    if (line.substr(0, kKey.size()) == kKey) return parse_unsigned(line.substr(kKey.size()));
    at = end + 1;
  }
  return std::nullopt;
}

// Entries of /proc/self/fd. Linux 6.2 and later give their number as the
// directory's size, which costs microseconds where listing 4,096 descriptors
// costs over a millisecond (the daemon with thousands of clients); older
// kernels say 0 there, and the directory is listed, not counting the
// descriptor open to list it.
std::optional<double> open_descriptor_count() {
  struct stat info {};
  if (::stat("/proc/self/fd", &info) == 0 && info.st_size > 0) {
    return static_cast<double>(info.st_size);
  }
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  const std::string own = std::to_string(::dirfd(dir));
  double count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != ".." && name != own) ++count;
  }
  ::closedir(dir);
  return count;
}

std::optional<double> open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return std::nullopt;
  }
  return static_cast<double>(limit.rlim_cur);
}

void add_stat_facts(ProcessFacts& facts) {
  const auto stat = read_proc_file("/proc/self/stat");
  if (!stat) return;
  const auto fields = stat_fields_after_name(*stat);
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  const auto user_ticks = stat_field(fields, 14);
  const auto system_ticks = stat_field(fields, 15);
  if (user_ticks && system_ticks && ticks_per_second > 0) {
    facts.cpu_seconds =
        static_cast<double>(*user_ticks + *system_ticks) / static_cast<double>(ticks_per_second);
  }
  if (const auto threads = stat_field(fields, 20)) facts.threads = static_cast<double>(*threads);
  const auto start_ticks = stat_field(fields, 22);
  const auto boot = boot_time_seconds();
  if (start_ticks && boot && ticks_per_second > 0) {
    facts.start_time_seconds =
        static_cast<double>(*boot) +
        static_cast<double>(*start_ticks) / static_cast<double>(ticks_per_second);
  }
  if (const auto bytes = stat_field(fields, 23)) facts.virtual_bytes = static_cast<double>(*bytes);
  const auto resident_pages = stat_field(fields, 24);
  if (resident_pages && page_size > 0) {
    facts.resident_bytes = static_cast<double>(*resident_pages) * static_cast<double>(page_size);
  }
}

ProcessFacts read_process_facts() {
  ProcessFacts facts;
  add_stat_facts(facts);
  facts.open_fds = open_descriptor_count();
  facts.max_fds = open_file_limit();
  return facts;
}

// One family with its one sample, or nothing when the value is unknown.
void write_if_known(MetricsText& out, std::string_view name, std::string_view type,
                    std::string_view help, const std::optional<double>& value) {
  if (!value) return;
  out.family(name, type, help);
  out.sample(name, *value);
}

}  // namespace

void write_process_metrics(MetricsText& out) {
  const ProcessFacts facts = read_process_facts();
  write_if_known(out, "process_cpu_seconds_total", "counter",
                 "Total user and system CPU time spent in seconds.", facts.cpu_seconds);
  write_if_known(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
                 facts.resident_bytes);
  write_if_known(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
                 facts.virtual_bytes);
  write_if_known(out, "process_open_fds", "gauge", "Number of open file descriptors.",
                 facts.open_fds);
  write_if_known(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
                 facts.max_fds);
  write_if_known(out, "process_start_time_seconds", "gauge",
                 "Start time of the process since unix epoch in seconds.",
                 facts.start_time_seconds);
  write_if_known(out, "process_threads", "gauge", "Number of OS threads in the process.",
                 facts.threads);
}

}  // namespace ddp::status_http
