// The terminal of `ddprun status --watch`: the screen it redraws in place, as
// `top` does, and the wait between two redraws.
//
//   WatchScreen  while it lives: the alternate screen with the cursor hidden
//                (when stdout is a terminal), stdin read key by key without
//                echo (when stdin is one), and SIGINT, SIGTERM, SIGHUP and
//                SIGWINCH caught. Its destructor puts all of it back, so the
//                shell finds the terminal as it was, whatever ended the watch.
//                One at a time per process; main's thread only.
//
// Errors: none thrown but std::bad_alloc; a terminal that refuses a setting is
// used as it is.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace ddp::launcher::status {

struct TerminalSize {
  int width = 0;   // 0: unknown (not a terminal)
  int height = 0;  // 0: unknown
};

// The size of the terminal on `fd`, or zeros.
TerminalSize terminal_size(int fd);

class WatchScreen {
 public:
  WatchScreen();
  ~WatchScreen();
  WatchScreen(const WatchScreen&) = delete;
  WatchScreen& operator=(const WatchScreen&) = delete;

  // Whether stdout is a terminal (the view is redrawn in place) or not (each
  // view is printed after the last, with a blank line between).
  bool in_place() const { return in_place_; }
  // Replaces what the screen shows with `lines` (each no wider than the screen).
  void draw(const std::vector<std::string>& lines);

  enum class Wake { kTime, kResize, kQuit };
  // Waits up to `period`: kQuit on q, Q or a caught SIGINT, SIGTERM or SIGHUP
  // (also one that came before the call), kResize on SIGWINCH, else kTime.
  Wake wait(std::chrono::milliseconds period);
  // Whether a quitting signal or key came.
  bool quit() const { return quit_; }

 private:
  bool in_place_ = false;
  bool raw_input_ = false;
  bool quit_ = false;
  bool stdin_open_ = false;
};

}  // namespace ddp::launcher::status
