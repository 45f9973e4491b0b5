#!/usr/bin/env python3
"""The last lines of launch/test.sh: where this run of the test command spent its time.

Reads BUILD/setup-times.json (launch/setup.sh: seconds of set-up and of the build), the ctest JUnit
file (one <testcase> per ctest entry) and the gtest XML of each unit_tests entry in BUILD/test-results
(tests/ctest_entries.py), and prints the set-up, build and test times, the entries and the gtest
cases that passed, failed and were skipped (gtest's own count: an entry with some cases skipped still
passes, so its skips are counted and said by reason here), then the ten slowest ctest entries and the
ten slowest single tests, so the change that slows the suite shows at once.

    test_report.py --build BUILD --ctest-junit FILE --tests-wall SECONDS --jobs N
"""
import argparse
import glob
import json
import os
import sys
import xml.etree.ElementTree as ElementTree


def ctest_entries(path):
    """[(name, seconds, status)] of the ctest JUnit file; [] when it is missing or cut short."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return []
    return [(case.get("name"), float(case.get("time") or 0), case.get("status") or "")
            for case in root.iter("testcase")]


def gtest_cases(folder):
    """[(Suite.name, seconds, outcome, why)] of every gtest XML file in `folder`: outcome "failed",
    "skipped" (why: GTEST_SKIP's message, its source line dropped) or "passed"."""
    cases = []
    for path in sorted(glob.glob(os.path.join(folder, "*.xml"))):
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError):
            continue  # an entry killed mid-run (its timeout) leaves no complete file
        for case in root.iter("testcase"):
            skipped = case.find("skipped")
            outcome = ("failed" if case.find("failure") is not None
                       else "skipped" if skipped is not None or case.get("result") == "skipped" else "passed")
            why = (skipped.get("message") or "").split("\n")[-1].strip() if skipped is not None else ""
            cases.append((f"{case.get('classname')}.{case.get('name')}", float(case.get("time") or 0), outcome, why))
    return cases


def skipped_summary(cases):
    """The skipped gtest cases by reason: "N skipped: 41 no GPU on this host (CrossEntropyOnCuda.*, ...)"."""
    reasons = {}
    for name, _, outcome, why in cases:
        if outcome == "skipped":
            reasons.setdefault(why or "no reason given", []).append(name)
    lines = []
    for why, names in sorted(reasons.items(), key=lambda item: -len(item[1])):
        suites = sorted({name.split(".")[0] for name in names})
        shown = ", ".join(suites[:6]) + (f" and {len(suites) - 6} more suites" if len(suites) > 6 else "")
        lines.append(f"  {len(names):4d}  {why}: {shown}")
    return lines


def table(rows, total):
    return "\n".join(f"  {seconds:7.1f} s  {seconds / total * 100 if total else 0:5.1f} %  {name}"
                     for name, seconds in rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", required=True)
    parser.add_argument("--ctest-junit", required=True)
    parser.add_argument("--tests-wall", type=float, required=True)
    parser.add_argument("--jobs", required=True)
    args = parser.parse_args()

    times = {}
    try:
        with open(os.path.join(args.build, "setup-times.json")) as file:
            times = json.load(file)
    except (OSError, ValueError):
        pass
    entries = ctest_entries(args.ctest_junit)
    cases = gtest_cases(os.path.join(args.build, "test-results"))
    test_time = sum(seconds for _, seconds, _ in entries)
    passed_cases = sum(1 for case in cases if case[2] == "passed")
    failed_cases = sum(1 for case in cases if case[2] == "failed")
    skipped_cases = sum(1 for case in cases if case[2] == "skipped")

    setup = times.get("setup_s")
    build = times.get("build_s")
    parts = [f"set-up {setup} s" if setup is not None else "set-up ? s",
             f"build {build} s" if build is not None else "build ? s",
             f"tests {args.tests_wall:.0f} s wall ({test_time:.0f} s of test time at {args.jobs} jobs)"]
    total = (setup or 0) + (build or 0) + args.tests_wall
    print(f"[test.sh] {', '.join(parts)}: {total:.0f} s in all")
    failed = [name for name, _, status in entries if status not in ("run", "notrun", "disabled")]
    skipped = sum(1 for _, _, status in entries if status == "notrun")
    print(f"[test.sh] {len(entries)} ctest entries: "
          f"{len(entries) - len(failed) - skipped} passed, {len(failed)} failed, {skipped} not run (all their cases skipped)"
          + (f": {', '.join(failed)}" if failed else ""))
    # An entry passes when its cases pass or skip: gtest's own count says how many of them ran.
    print(f"[test.sh] {len(cases)} gtest cases (unit_tests, and rank 0 of mpi_tests at each world size): "
          f"{passed_cases} passed, {failed_cases} failed, "
          f"{skipped_cases} skipped" + (", by reason:" if skipped_cases else ""))
    for line in skipped_summary(cases):
        print(line)
    if entries:
        slowest = sorted(((name, seconds) for name, seconds, _ in entries), key=lambda row: -row[1])[:10]
        print("[test.sh] the ten slowest ctest entries (share of the test time):")
        print(table(slowest, test_time))
    if cases:
        slowest = sorted(((name, seconds) for name, seconds, _, _ in cases), key=lambda row: -row[1])[:10]
        print("[test.sh] the ten slowest single tests:")
        print(table(slowest, test_time))
    return 0


if __name__ == "__main__":
    sys.exit(main())
