// A worker for ddprun's tests; the first argument picks what it does:
//   env <dir>                 write the environment as JSON to <dir>/env_<RANK>_<RESTART>.json
//   fail_on_attempt0 <code>   print the attempt, exit <code> on attempt 0 and 0 afterwards
//   exit <code>               exit with <code> at once
//   elastic <dir>             write <dir>/ws<WORLD_SIZE>_r<RANK>_<pid> (GROUP_RANK inside)
//                             and <dir>/store_r<RANK>_<pid> ("<DDP_STORE_ADDR>:<DDP_STORE_PORT>
//                             <DDP_STORE_PREFIX>"), then run until <dir>/finish exists
//   error_file <code> <msg>   write TORCHELASTIC_ERROR_FILE like PyTorch's @record, exit <code>
//   sleep <pid dir>           write <pid dir>/<LOCAL_RANK>.pid, then sleep until killed
//   family <pid dir>          like sleep, but first fork a grandchild that sleeps too
//                             (its pid goes to <pid dir>/<LOCAL_RANK>.child)
//   lines <n> <len>           write n lines of len characters to stdout and stderr, in
//                             pieces, so that lines of two workers could interleave
//   crash_rank <rank>         the worker with that RANK exits 7; others sleep
//   orphan <pid dir> <code>   fork a grandchild that sleeps (in the worker's process
//                             group; its pid goes to <pid dir>/<LOCAL_RANK>.child),
//                             then exit <code> at once
//   stubborn <pid dir>        like family, but the grandchild ignores SIGTERM
//   error_fifo <code>         make TORCHELASTIC_ERROR_FILE a FIFO (nobody ever writes
//                             it), exit <code>
//   fds <dir>                 write every open descriptor but the directory listing
//                             them ("<fd> <target>" lines) to <dir>/fds_<RANK>.txt,
//                             then sleep until killed
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

extern char** environ;

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path + ".tmp");
  out << text;
  out.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

[[noreturn]] void sleep_forever() {
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_worker <mode> [args]\n");
    return 64;
  }
  const std::string mode = argv[1];
  const std::string local_rank = env_or("LOCAL_RANK", "x");
  const std::string rank = env_or("RANK", "x");
  if (mode == "env" && argc >= 3) {
    nlohmann::json env = nlohmann::json::object();
    for (char** var = environ; *var != nullptr; ++var) {
      std::string text = *var;
      auto eq = text.find('=');
      env[text.substr(0, eq)] = text.substr(eq + 1);
    }
    nlohmann::json out;
    out["env"] = env;
    nlohmann::json args = nlohmann::json::array();
    for (int i = 0; i < argc; ++i) args.push_back(argv[i]);
    out["argv"] = args;
    write_file(std::string(argv[2]) + "/env_" + rank + "_" +
                   env_or("TORCHELASTIC_RESTART_COUNT", "x") + ".json",
               out.dump(2));
    std::printf("env written by rank %s\n", rank.c_str());
    return 0;
  }
  if (mode == "fail_on_attempt0" && argc >= 3) {
    std::printf("attempt %s rank %s\n", env_or("TORCHELASTIC_RESTART_COUNT", "x").c_str(),
                rank.c_str());
    std::fflush(stdout);
    if (env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0") return std::atoi(argv[2]);
    return 0;
  }
  if (mode == "exit" && argc >= 3) return std::atoi(argv[2]);
  if (mode == "elastic" && argc >= 3) {
    // Announces itself as "ws<WORLD_SIZE>_r<RANK>_<pid>" (its GROUP_RANK inside)
    // and runs until "<dir>/finish" exists: a worker of a group that may re-form.
    const std::string dir = argv[2];
    // The store file first: a test that sees the ws file can read it.
    write_file(dir + "/store_r" + rank + "_" + std::to_string(::getpid()),
               env_or("DDP_STORE_ADDR", "x") + ":" + env_or("DDP_STORE_PORT", "x") + " " +
                   env_or("DDP_STORE_PREFIX", "x"));
    write_file(
        dir + "/ws" + env_or("WORLD_SIZE", "x") + "_r" + rank + "_" + std::to_string(::getpid()),
        env_or("GROUP_RANK", "x"));
    while (::access((dir + "/finish").c_str(), F_OK) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }
  if (mode == "error_file" && argc >= 4) {
    nlohmann::json data;
    data["message"]["message"] = std::string("RuntimeError: ") + argv[3];
    data["message"]["extraInfo"]["py_callstack"] =
        std::string(
            "Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: ") +
        argv[3];
    data["message"]["extraInfo"]["timestamp"] = std::to_string(std::time(nullptr));
    write_file(env_or("TORCHELASTIC_ERROR_FILE", "/nonexistent/error.json"), data.dump());
    return std::atoi(argv[2]);
  }
  if ((mode == "sleep" || mode == "family" || mode == "stubborn" || mode == "orphan") &&
      argc >= 3) {
    const std::string dir = argv[2];
    if (mode != "sleep") {
      // Ignored before fork: the grandchild cannot miss a SIGTERM sent at once.
      if (mode == "stubborn") ::signal(SIGTERM, SIG_IGN);
      pid_t child = ::fork();
      if (child == 0) sleep_forever();
      if (mode == "stubborn") ::signal(SIGTERM, SIG_DFL);
      write_file(dir + "/" + local_rank + ".child", std::to_string(child));
    }
    write_file(dir + "/" + local_rank + ".pid", std::to_string(::getpid()));
    if (mode == "orphan") return argc >= 4 ? std::atoi(argv[3]) : 0;
    sleep_forever();
  }
  if (mode == "error_fifo" && argc >= 3) {
    const std::string path = env_or("TORCHELASTIC_ERROR_FILE", "");
    if (path.empty() || ::mkfifo(path.c_str(), 0600) != 0) {
      std::fprintf(stderr, "test_worker: cannot make a FIFO at '%s'\n", path.c_str());
      return 65;
    }
    return std::atoi(argv[2]);
  }
  if (mode == "fds" && argc >= 3) {
    DIR* fds = ::opendir("/proc/self/fd");
    if (fds == nullptr) return 66;
    std::string listing;
    while (dirent* entry = ::readdir(fds)) {
      if (entry->d_name[0] == '.') continue;
      const int fd = std::atoi(entry->d_name);
      if (fd == ::dirfd(fds)) continue;
      char target[512] = {};
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      listing += std::to_string(fd) + " " +
                 (n > 0 ? std::string(target, static_cast<std::size_t>(n)) : "?");
      const char* control = std::getenv("DDP_CONTROL_FD");
      if (control != nullptr && std::to_string(fd) == control) listing += " (DDP_CONTROL_FD)";
      listing += "\n";
    }
    ::closedir(fds);
    write_file(std::string(argv[2]) + "/fds_" + rank + ".txt", listing);
    sleep_forever();
  }
  if (mode == "lines" && argc >= 4) {
    const int n = std::atoi(argv[2]);
    const int len = std::atoi(argv[3]);
    for (int i = 0; i < n; ++i) {
      std::string line = "r" + rank + " line " + std::to_string(i) + " ";
      line.append(static_cast<std::size_t>(std::max(0, len - static_cast<int>(line.size()))),
                  static_cast<char>('a' + std::atoi(rank.c_str()) % 26));
      // Two writes per line: a launcher that forwards raw chunks would cut lines.
      std::size_t half = line.size() / 2;
      std::fwrite(line.data(), 1, half, stdout);
      std::fflush(stdout);
      std::fwrite(line.data() + half, 1, line.size() - half, stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
      std::fprintf(stderr, "err %s %d\n", rank.c_str(), i);
    }
    return 0;
  }
  if (mode == "crash_rank" && argc >= 3) {
    if (rank == argv[2]) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return 7;
    }
    sleep_forever();
  }
  std::fprintf(stderr, "test_worker: bad mode '%s'\n", mode.c_str());
  return 64;
}
