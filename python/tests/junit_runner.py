"""Runs one unittest file and writes a JUnit XML report, for Bazel and tests/run.sh.

    junit_runner.py TEST_FILE.py [unittest args, e.g. a test name]

Every test case is one <testcase> of $XML_OUTPUT_FILE (Bazel sets it; no file
when unset): a failure or error has a <failure> / <error> child, a skipped
case a <skipped> child (tests/run.sh counts them). A setUpClass or
setUpModule that fails is a <testcase> with an <error> too. Each element is
on a line of its own (tests/run.sh reads the report line by line). Exit
status 0 when every case passed or was skipped, else 1.
"""

import importlib.util
import os
import sys
import time
import unittest
from xml.sax.saxutils import escape, quoteattr


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # (class name, name, seconds, kind or None, message, text)
        self._started = {}

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _record(self, test, kind, message="", text=""):
        test_id = test.id()
        seconds = max(0.0, time.monotonic() - self._started.get(test_id, time.monotonic()))
        cls, _, name = test_id.rpartition(".")
        if isinstance(test, unittest.case._SubTest):
            cls, _, name = test.test_case.id().rpartition(".")
            name = "%s %s" % (name, test._subDescription())
        elif isinstance(test, unittest.suite._ErrorHolder):  # "setUpClass (module.Class)"
            cls, name = "setup", test.description
        self.cases.append((cls, name, seconds, kind, message, text))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, None)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", str(err[1]), self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", str(err[1]), self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, None)

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failure", "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "failure" if issubclass(err[0], test.failureException) else "error"
            self._record(subtest, kind, str(err[1]), self._exc_info_to_string(err, test))


def write_xml(path, suite_name, cases, seconds):
    failures = sum(1 for c in cases if c[3] == "failure")
    errors = sum(1 for c in cases if c[3] == "error")
    skipped = sum(1 for c in cases if c[3] == "skipped")
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             "<testsuites>",
             '<testsuite name=%s tests="%d" failures="%d" errors="%d" skipped="%d" time="%.3f">'
             % (quoteattr(suite_name), len(cases), failures, errors, skipped, seconds)]
    for cls, name, secs, kind, message, text in cases:
        attrs = "classname=%s name=%s time=\"%.3f\"" % (quoteattr(cls), quoteattr(name), secs)
        if kind is None:
            lines.append("<testcase %s/>" % attrs)
            continue
        lines.append("<testcase %s>" % attrs)
        if kind == "skipped":
            lines.append("<skipped message=%s/>" % quoteattr(message))
        else:
            lines.append("<%s message=%s>%s</%s>" % (kind, quoteattr(message[:500]),
                                                     escape(text), kind))
        lines.append("</testcase>")
    lines += ["</testsuite>", "</testsuites>", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main(argv):
    if len(argv) < 2:
        print("usage: junit_runner.py TEST_FILE.py [TEST_NAME...]", file=sys.stderr)
        return 2
    path = argv[1]
    name = os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    loader = unittest.TestLoader()
    if len(argv) > 2:
        suite = loader.loadTestsFromNames(argv[2:], module)
    else:
        suite = loader.loadTestsFromModule(module)
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=2, stream=sys.stdout)
    start = time.monotonic()
    result = runner.run(suite)
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        write_xml(xml, name, result.cases, time.monotonic() - start)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
