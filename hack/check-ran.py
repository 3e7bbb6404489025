"""Fail unless both suites ran: unit tests (`tests/`) and real-cluster tests (`e2e/`).

Reads the JUnit XML that hack/test.sh asks pytest to write. A suite counts as run
when at least one of its tests passed (not skipped). Only checked when pytest ran
the whole suite (no extra arguments), so a focused `make test -- -k foo` is not refused.
Usage: python hack/check-ran.py JUNIT_XML
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(path: str) -> int:
    passed = {"tests": 0, "e2e": 0}
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is not None or case.find("failure") is not None:
            continue
        if case.find("error") is not None:
            continue
        suite = case.get("classname", "").split(".", 1)[0]
        if suite in passed:
            passed[suite] += 1
    print(f"passed: {passed['tests']} unit (tests/), {passed['e2e']} real-cluster (e2e/)")
    missing = [name for name, count in passed.items() if count == 0]
    if missing:
        print(f"error: no test passed in {', '.join(missing)}/", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
