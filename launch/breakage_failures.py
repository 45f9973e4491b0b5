#!/usr/bin/env python3
"""The tests a breakage made fail (launch/breakage_demo.sh): one name a line, the gtest cases that
failed in the XML files of RESULTS (the unit_tests entries write one each, tests/ctest_entries.py),
then the ctest entries that failed and wrote no XML (MPI and script entries), read from ctest's log.

    breakage_failures.py RESULTS_DIR CTEST_LOG
"""
import glob
import os
import re
import sys
import xml.etree.ElementTree as ElementTree


def main():
    results, log = sys.argv[1], sys.argv[2]
    names, with_xml = [], set()
    for path in sorted(glob.glob(os.path.join(results, "*.xml"))):
        with_xml.add(os.path.splitext(os.path.basename(path))[0])
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError):
            continue  # killed at its timeout: the entry is named below
        for case in root.iter("testcase"):
            if case.find("failure") is not None:
                names.append(f"{case.get('classname')}.{case.get('name')}")
    text = open(log, errors="replace").read()
    for entry in re.findall(r"^\s*\d+ - (\S+) \((?:Failed|Timeout|SEGFAULT|Subprocess aborted|Child aborted|Exception)",
                            text, re.MULTILINE):
        if entry not in with_xml:  # an MPI or script entry, or one killed before it wrote its XML
            names.append(f"{entry} (ctest entry)")
    print("\n".join(dict.fromkeys(names)))


if __name__ == "__main__":
    main()
