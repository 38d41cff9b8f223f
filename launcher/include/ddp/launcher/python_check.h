// What ddprun says when a Python program's workers fail and their Python has
// no torch: by default workers run on the first python3 on PATH, which is often
// a virtual environment or a pyenv shim without it, and each rank would only
// print "ModuleNotFoundError: No module named 'torch'".
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace ddp::launcher {

// Whether `python` (a path) can import torch, asked with importlib's find_spec,
// which does not import it (that takes seconds), in this process's environment
// and directory (the workers'). Blocks until that Python exits, at most
// `timeout` (it is killed then). nullopt when the answer is unknown: it cannot
// be started, fails, answers something else, or runs past `timeout`. Never
// throws. Call it only after a failure: it costs a Python start-up (~0.1 s).
std::optional<bool> python_finds_torch(const std::string& python,
                                       std::chrono::milliseconds timeout);

// Where the Python that ran a Python program's workers came from.
enum class PythonSource { kPath, kPythonExec };

// The note printed after a failure report when the Python that ran `program`
// (a script, or a module's name) has no torch: two lines, each starting with
// "ddprun: note: ", saying that `python` (the first python3 on PATH, or
// $PYTHON_EXEC) has no module named 'torch' and that PYTHON_EXEC should name
// a Python that has it, with an example.
std::string missing_torch_note(const std::string& program, const std::string& python,
                               PythonSource source);

// The note printed after a failure report when `program` ran on `python`
// only because it is a file that is neither executable nor named *.py (a
// guess, as torchrun makes it): two lines, each starting with
// "ddprun: note: ", saying so and how to run it directly instead.
std::string python_guess_note(const std::string& program, const std::string& python);

}  // namespace ddp::launcher
