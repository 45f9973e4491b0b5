#!/usr/bin/env python3
"""The tests a breakage made fail (launch/breakage_demo.sh): one name a line, the gtest cases that
failed in the XML files of RESULTS (the unit_tests entries write one each, tests/ctest_entries.py),
then the ctest entries that failed without an XML that names a failed case (script entries, entries
killed at their timeout, an MPI entry that failed on a rank other than 0), read from ctest's log.

    breakage_failures.py RESULTS_DIR CTEST_LOG
"""
import glob
import os
import re
import sys
import xml.etree.ElementTree as ElementTree


def main():
    results, log = sys.argv[1], sys.argv[2]
    names, named_by_xml = [], set()  # entries whose XML names a failed case
    for path in sorted(glob.glob(os.path.join(results, "*.xml"))):
        entry = os.path.splitext(os.path.basename(path))[0]
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError):
            continue  # killed at its timeout: the entry is named below
        for case in root.iter("testcase"):
            if case.find("failure") is not None:
                names.append(f"{case.get('classname')}.{case.get('name')}")
                named_by_xml.add(entry)
    text = open(log, errors="replace").read()
    for entry in re.findall(r"^\s*\d+ - (\S+) \((?:Failed|Timeout|SEGFAULT|Subprocess aborted|Child aborted|Exception)",
                            text, re.MULTILINE):
        # A script entry, one killed before it wrote its XML, or an MPI entry that failed on a rank
        # other than 0 (whose XML is rank 0's): the entry itself.
        if entry not in named_by_xml:
            names.append(f"{entry} (ctest entry)")
    print("\n".join(dict.fromkeys(names)))


if __name__ == "__main__":
    main()
