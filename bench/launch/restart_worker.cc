// The worker of launch_bench's restart measurement. At start it records
// CLOCK_MONOTONIC (system-wide) in <dir>/start_<attempt>_<local rank>. On
// attempt 0, local rank 0 records <dir>/death and kills itself with SIGKILL;
// the others sleep until the agent stops them. Later attempts exit 0.
//
// Plain libc and linked statically: the figure is the launcher's latency, so
// the worker's own start-up (dynamic loading) is kept out of it as far as
// possible - for ddprun and torchrun alike.
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

namespace {

long long now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

int open_record(const char* dir, const char* name) {
  char path[4096];
  ::snprintf(path, sizeof(path), "%s/%s", dir, name);
  return ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
}

void write_value(int fd, long long value) {
  char text[32];
  int n = ::snprintf(text, sizeof(text), "%lld\n", value);
  if (fd >= 0 && ::write(fd, text, static_cast<size_t>(n)) < 0) ::_exit(70);
}

const char* env(const char* name, const char* fallback) {
  const char* v = ::getenv(name);
  return v ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const long long start = now_ns();
  if (argc < 2) return 64;
  const char* dir = argv[1];
  const char* attempt = env("TORCHELASTIC_RESTART_COUNT", "0");
  const char* local_rank = env("LOCAL_RANK", "0");
  char name[64];
  ::snprintf(name, sizeof(name), "start_%s_%s", attempt, local_rank);
  int fd = open_record(dir, name);
  write_value(fd, start);
  ::close(fd);
  if (::strcmp(attempt, "0") != 0) return 0;
  if (::strcmp(local_rank, "0") == 0) {
    int death = open_record(dir, "death");
    write_value(death, now_ns());  // the file is open: only a write until the kill
    ::kill(::getpid(), SIGKILL);
  }
  for (;;) ::pause();
}
