#include <cstdio>

#include "ddp/agent/agent_events.h"

namespace ddp::agent {

void StderrPrinter::notice(const std::string& line) {
  std::fprintf(stderr, "ddprun: %s\n", line.c_str());
}

void StderrPrinter::report(const std::string& text) {
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

void StderrPrinter::hang(const HangReport& hang) { report(hang.text); }

void StderrPrinter::recovered(const std::string& line) { notice(line); }

}  // namespace ddp::agent
