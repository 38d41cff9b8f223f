#include "status_terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace ddp::launcher::status {

namespace {

constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
constexpr const char* kEnterScreen = "\x1b[?1049h\x1b[?25l";  // alternate screen, no cursor
constexpr const char* kLeaveScreen = "\x1b[?25h\x1b[?1049l";

// The self-pipe the signal handler writes the signal's number to, and what
// the WatchScreen changed, to put back.
int wake_pipe[2] = {-1, -1};
struct sigaction saved_actions[sizeof(kCaught) / sizeof(kCaught[0])];
termios saved_termios{};

extern "C" void on_signal(int signal) {
  const int saved_errno = errno;
  const char byte = static_cast<char>(signal);
  [[maybe_unused]] const ssize_t n = ::write(wake_pipe[1], &byte, 1);
  errno = saved_errno;
}

void write_all(const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal went away: nothing more to show
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

TerminalSize terminal_size(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return {};
  return {ws.ws_col, ws.ws_row};
}

WatchScreen::WatchScreen() {
  if (::pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) wake_pipe[0] = wake_pipe[1] = -1;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < sizeof(kCaught) / sizeof(kCaught[0]); ++i) {
    ::sigaction(kCaught[i], &action, &saved_actions[i]);
  }
  in_place_ = ::isatty(STDOUT_FILENO) == 1;
  if (::isatty(STDIN_FILENO) == 1 && ::tcgetattr(STDIN_FILENO, &saved_termios) == 0) {
    termios raw = saved_termios;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // ISIG stays: Ctrl-C is SIGINT
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    raw_input_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    stdin_open_ = true;
  }
  if (in_place_) write_all(kEnterScreen);
}

WatchScreen::~WatchScreen() {
  if (in_place_) write_all(kLeaveScreen);
  if (raw_input_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_termios);
  for (std::size_t i = 0; i < sizeof(kCaught) / sizeof(kCaught[0]); ++i) {
    ::sigaction(kCaught[i], &saved_actions[i], nullptr);
  }
  for (int& fd : wake_pipe) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void WatchScreen::draw(const std::vector<std::string>& lines) {
  std::string frame;
  if (in_place_) {
    // Home, each line over the old one (clearing what is left of it), and
    // the rest of the screen cleared; no line break after the last, which
    // would scroll a full screen.
    frame = "\x1b[H";
    for (std::size_t i = 0; i < lines.size(); ++i) {
      frame += lines[i] + "\x1b[K" + (i + 1 < lines.size() ? "\n" : "");
    }
    frame += "\x1b[J";
  } else {
    for (const auto& line : lines) frame += line + "\n";
    frame += "\n";
  }
  write_all(frame);
}

WatchScreen::Wake WatchScreen::wait(std::chrono::milliseconds period) {
  const auto deadline = std::chrono::steady_clock::now() + period;
  for (;;) {
    if (quit_) return Wake::kQuit;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Wake::kTime;
    pollfd fds[2] = {{wake_pipe[0], POLLIN, 0}, {stdin_open_ ? STDIN_FILENO : -1, POLLIN, 0}};
    const int ready = ::poll(fds, 2, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) return Wake::kTime;
    bool resized = false;
    char bytes[64];
    if (fds[0].revents & POLLIN) {
      const ssize_t n = ::read(wake_pipe[0], bytes, sizeof bytes);
      for (ssize_t i = 0; i < n; ++i) {
        if (bytes[i] == SIGWINCH) {
          resized = true;
        } else {
          quit_ = true;
        }
      }
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::read(STDIN_FILENO, bytes, sizeof bytes);
      if (n <= 0 && !(n < 0 && errno == EINTR)) stdin_open_ = false;  // no more keys
      for (ssize_t i = 0; i < n; ++i) {
        if (bytes[i] == 'q' || bytes[i] == 'Q') quit_ = true;
      }
    }
    if (quit_) return Wake::kQuit;
    if (resized) return Wake::kResize;
  }
}

}  // namespace ddp::launcher::status
