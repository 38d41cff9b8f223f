#!/usr/bin/python3
"""The driver's own logic, without torch: reading the list and exclusion files,
choosing the tests to run, and the verdict of a --check run."""

import argparse
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_suite  # noqa: E402


def check_args(check="list.txt", exclusions="excluded.txt", only=None):
    return argparse.Namespace(check=check, exclusions=exclusions, only=only, backend="ddp")


def outcome(name, result, reason=""):
    return {name: {"outcome": result, "reason": reason, "seconds": 0.1}}


class FilesTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.folder.cleanup()

    def write(self, name, text):
        path = os.path.join(self.folder.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_names_skip_comments_and_blank_lines(self):
        path = self.write("list.txt", "# header\n\ntest_a\ntest_b  # note\n")
        self.assertEqual(run_suite.read_names(path), ["test_a", "test_b"])

    def test_exclusions_keep_their_reasons(self):
        path = self.write("excluded.txt", "# header\ntest_a  # gloo only: reason\n")
        self.assertEqual(run_suite.read_exclusions(path), {"test_a": "gloo only: reason"})

    def test_an_exclusion_without_reason_is_refused(self):
        path = self.write("excluded.txt", "test_a\n")
        with self.assertRaises(SystemExit) as refused:
            run_suite.read_exclusions(path)
        self.assertIn("'test_a' has no reason", str(refused.exception))

    def test_check_runs_the_listed_tests_but_the_excluded(self):
        args = check_args(self.write("list.txt", "test_a\ntest_b\ntest_c\n"),
                          self.write("excluded.txt", "test_b  # why\n"))
        names, expected, exclusions = run_suite.select_tests(args)
        self.assertEqual(names, ["test_a", "test_c"])
        self.assertEqual(expected, ["test_a", "test_b", "test_c"])
        self.assertEqual(exclusions, {"test_b": "why"})

    def test_only_narrows_a_check(self):
        args = check_args(self.write("list.txt", "test_a\ntest_b\n"), None, only=["test_b"])
        self.assertEqual(run_suite.select_tests(args)[0], ["test_b"])

    def test_without_check_only_names_the_tests(self):
        args = argparse.Namespace(check=None, exclusions=None, only=["test_x"])
        self.assertEqual(run_suite.select_tests(args), (["test_x"], None, {}))


class CheckTest(unittest.TestCase):
    def verdict(self, names, expected, exclusions, outcomes):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = run_suite.check(check_args(), names, expected, exclusions, outcomes)
        return code, printed.getvalue()

    def test_every_run_test_passing_passes(self):
        code, printed = self.verdict(["test_a"], ["test_a", "test_b"], {"test_b": "why"},
                                     outcome("test_a", "pass"))
        self.assertEqual(code, 0, printed)
        self.assertIn("(1 run, 1 excluded with reasons in excluded.txt)", printed)

    def test_a_failure_fails_naming_the_test_and_its_error(self):
        outcomes = {**outcome("test_a", "pass"),
                    **outcome("test_b", "error", "Traceback\nRuntimeError: no reduce_scatter\n")}
        code, printed = self.verdict(["test_a", "test_b"], ["test_a", "test_b"], {}, outcomes)
        self.assertEqual(code, 1)
        self.assertIn("NOT PASSING on ddp: test_b: error RuntimeError: no reduce_scatter", printed)

    def test_the_reason_is_the_exception_line_not_the_cpp_frames_after_it(self):
        reason = ("Traceback\nRuntimeError: ProcessGroup ddp does not support allgather_coalesced\n"
                  "Exception raised from allgather_coalesced at ProcessGroup.hpp:1\n"
                  "frame #0: c10::Error::Error() + 0x1\nframe #25: _start + 0x21\n")
        code, printed = self.verdict(["test_a"], ["test_a"], {}, outcome("test_a", "error", reason))
        self.assertEqual(code, 1)
        self.assertIn("test_a: error RuntimeError: ProcessGroup ddp does not support "
                      "allgather_coalesced", printed)

    def test_a_skip_is_not_a_pass(self):
        code, printed = self.verdict(["test_a"], ["test_a"], {},
                                     outcome("test_a", "skip", "Only gloo backend supports timeouts"))
        self.assertEqual(code, 1)
        self.assertIn("test_a: skip Only gloo backend supports timeouts", printed)

    def test_a_listed_test_that_did_not_run_fails(self):
        code, printed = self.verdict(["test_a"], ["test_a"], {}, {})
        self.assertEqual(code, 1)
        self.assertIn("test_a: not run", printed)

    def test_a_stale_exclusion_fails(self):
        code, printed = self.verdict(["test_a"], ["test_a"], {"test_gone": "why"},
                                     outcome("test_a", "pass"))
        self.assertEqual(code, 1)
        self.assertIn("stale exclusion: test_gone", printed)


if __name__ == "__main__":
    unittest.main()
