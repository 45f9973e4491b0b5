#!/usr/bin/env python3
"""Writes the ctest entries of the unit_tests binary: one entry per test source file, not per test.

Each entry is one process that runs every test of its file (a gtest filter of the file's suites), so
LibTorch is loaded once per file instead of once per test (about 0.4 s of start-up each, for 600
tests), and what a file's tests share (a run trained once, a function-local static fixture) is made
once. A file listed in --shards runs as that many entries, each a gtest shard of it
(GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX: test i goes to shard i mod N), so its cases spread over
ctest's jobs. Every entry writes its gtest XML to --results, which launch/test_report.py reads for
the slowest single tests.

    ctest_entries.py UNIT_TESTS OUT.cmake --results DIR [--shards FILE:N,...] [--costs FILE:SECONDS,...]
                     [--processes FILE,...]

Run after each link of unit_tests (tests/CMakeLists.txt); ctest includes OUT.cmake.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def parse_pairs(text, kind):
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition(":")
        if not value:
            sys.exit(f"ctest_entries.py: {kind} entry '{item}' is not FILE:NUMBER")
        pairs[name] = kind(value) if callable(kind) else value
    return pairs


def list_tests(binary):
    """{file stem: [(suite, test), ...]} in the binary's own order."""
    with tempfile.TemporaryDirectory() as scratch:
        listing = os.path.join(scratch, "tests.json")
        subprocess.run([binary, "--gtest_list_tests", f"--gtest_output=json:{listing}"], check=True,
                       stdout=subprocess.DEVNULL, timeout=120)
        with open(listing) as file:
            suites = json.load(file)["testsuites"]
    by_file = collections.OrderedDict()
    for suite in suites:
        for test in suite["testsuite"]:
            stem = os.path.splitext(os.path.basename(test["file"]))[0]
            by_file.setdefault(stem, []).append((suite["name"], test["name"]))
    return by_file


def gtest_filter(tests, suite_files):
    """Whole suites where a suite lives in this file alone, else the tests by name."""
    patterns = []
    for suite, name in tests:
        pattern = f"{suite}.*" if suite_files[suite] == 1 else f"{suite}.{name}"
        if pattern not in patterns:
            patterns.append(pattern)
    return ":".join(patterns)


def cmake_quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("output")
    parser.add_argument("--results", required=True)
    parser.add_argument("--shards", default="")
    parser.add_argument("--costs", default="")
    parser.add_argument("--processes", default="",
                        help="FILE,...: files whose tests scan, signal or time out processes (label processes)")
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()
    shards = parse_pairs(args.shards, int)
    costs = parse_pairs(args.costs, float)

    by_file = list_tests(args.binary)
    processes = set(filter(None, (part.strip() for part in args.processes.split(","))))
    for name in list(shards) + list(costs) + list(processes):
        if name not in by_file:
            sys.exit(f"ctest_entries.py: {name} (in --shards, --costs or --processes) has no tests in {args.binary}")
    suite_files = collections.Counter()
    for tests in by_file.values():
        for suite in {suite for suite, _ in tests}:
            suite_files[suite] += 1

    lines = [f"# Written by tests/ctest_entries.py from {args.binary}: do not edit."]
    for stem, tests in by_file.items():
        count = shards.get(stem, 1)
        for index in range(count):
            name = stem if count == 1 else f"{stem}.{index + 1}of{count}"
            xml = os.path.join(args.results, f"{name}.xml")
            command = [args.binary, f"--gtest_filter={gtest_filter(tests, suite_files)}", f"--gtest_output=xml:{xml}"]
            environment = [] if count == 1 else [f"GTEST_TOTAL_SHARDS={count}", f"GTEST_SHARD_INDEX={index}"]
            lines.append(f"add_test({cmake_quote(name)} {' '.join(cmake_quote(part) for part in command)})")
            labels = "unit;processes" if stem in processes else "unit"
            properties = [f"TIMEOUT {args.timeout}", "SKIP_RETURN_CODE 77", f"LABELS {cmake_quote(labels)}",
                          "FIXTURES_REQUIRED recorded_runs",
                          f"WORKING_DIRECTORY {cmake_quote(os.path.dirname(args.binary))}"]
            if environment:
                properties.append(f"ENVIRONMENT {cmake_quote(';'.join(environment))}")
            if stem in costs:
                properties.append(f"COST {costs[stem] / count:g}")
            lines.append(f"set_tests_properties({cmake_quote(name)} PROPERTIES {' '.join(properties)})")
    os.makedirs(args.results, exist_ok=True)
    text = "\n".join(lines) + "\n"
    # Rewritten only when it changes, so ctest's cached test list is not invalidated for nothing.
    if not os.path.exists(args.output) or open(args.output).read() != text:
        with open(args.output, "w") as file:
            file.write(text)


if __name__ == "__main__":
    main()
