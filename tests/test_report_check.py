#!/usr/bin/env python3
"""launch/test_report.py counts gtest's own skipped cases and says why (issue 52: a ctest entry with
some cases skipped passes, and "86 of 86" hid them): three entries' XML (two cases passed, two
skipped for one reason and one for another, one failed) and a ctest JUnit file, and the summary's
counts and reasons checked. Exit status 0 when they are right."""
import os
import subprocess
import sys
import tempfile

CASE = '<testcase name="{name}" status="run" result="{result}" time="0.5" classname="{suite}">{inner}</testcase>'


def xml(cases):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="s">'
            + "".join(CASE.format(**case) for case in cases) + "</testsuite></testsuites>\n")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as build:
        results = os.path.join(build, "test-results")
        os.makedirs(results)
        skip = '<skipped message="/src/a_test.cpp:12&#x0A;{why}"><![CDATA[...]]></skipped>'
        with open(os.path.join(results, "a_test.xml"), "w") as file:
            file.write(xml([
                {"name": "Runs", "result": "completed", "suite": "A", "inner": ""},
                {"name": "OnGpu", "result": "skipped", "suite": "AOnCuda", "inner": skip.format(why="no GPU on this host")},
            ]))
        with open(os.path.join(results, "b_test.xml"), "w") as file:
            file.write(xml([
                {"name": "Runs", "result": "completed", "suite": "B", "inner": ""},
                {"name": "Avx512", "result": "skipped", "suite": "BKernels", "inner": skip.format(why="no AVX-512 here")},
                {"name": "OnGpu", "result": "skipped", "suite": "BOnCuda", "inner": skip.format(why="no GPU on this host")},
                {"name": "Broken", "result": "completed", "suite": "B", "inner": '<failure message="x"/>'},
            ]))
        junit = os.path.join(build, "ctest.xml")
        with open(junit, "w") as file:
            file.write('<testsuite><testcase name="a_test" time="1" status="run"/>'
                       '<testcase name="b_test" time="2" status="fail"/></testsuite>\n')
        report = subprocess.run([sys.executable, os.path.join(root, "launch/test_report.py"), "--build", build,
                                 "--ctest-junit", junit, "--tests-wall", "3", "--jobs", "1"],
                                capture_output=True, text=True, check=True).stdout
    expected = ["2 passed, 1 failed, 3 skipped, by reason:", "6 gtest cases",
                "2  no GPU on this host: AOnCuda, BOnCuda", "1  no AVX-512 here: BKernels",
                "2 ctest entries: 1 passed, 1 failed"]
    missing = [line for line in expected if line not in report]
    if missing:
        print("test_report.py's summary lacks:\n  " + "\n  ".join(missing) + "\nin:\n" + report)
        return 1
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
