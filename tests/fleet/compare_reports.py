#!/usr/bin/env python3
"""compare_reports.py WHOLE.json MERGED.json: the merged report of a plan's shards
must equal the unsharded run's: every row (cases, scoring passages, NOT SUPPORTED
checks) field for field except its seconds, and the verdict, the count of checks,
passed and complete. Exit 0 when equal, 1 naming what differs."""
import json
import sys


def rows(report, key):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in report[key]]


def main():
    whole, merged = (json.load(open(p)) for p in sys.argv[1:3])
    bad = [k for k in ("cases", "scoring", "not_supported") if rows(whole, k) != rows(merged, k)]
    bad += [k for k in ("verdict", "checks_planned", "passed", "complete") if whole[k] != merged[k]]
    if bad:
        print(f"merged report differs from the unsharded one in: {', '.join(bad)}")
        return 1
    print(f"merged {len(merged['shards'])} shards: {len(merged['cases'])} rows, "
          f"{len(merged['scoring'])} passages, verdict {merged['verdict']}: same as unsharded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
