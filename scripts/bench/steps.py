#!/usr/bin/env python3
"""Inclusive instruction counts of named functions in a callgrind output file.

Usage: steps.py CALLGRIND-FILE LABEL=FUNCTION [LABEL=FUNCTION ...]
The file must be written with --compress-strings=no --compress-pos=no. A function's inclusive
count is the sum of the costs of all calls to it from other functions (what its callers paid
for it); a function never called counts 0. Prints one "LABEL COUNT CALLS" line per pair, in order.
"""
import sys
from collections import defaultdict


def main():
    path, pairs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    wanted = {fn for _, fn in pairs}
    inclusive, calls = defaultdict(int), defaultdict(int)
    current = callee = None
    after_calls = False
    with open(path, errors="replace") as f:
        for line in f:
            if after_calls:
                after_calls = False
                fields = line.split()
                if callee in wanted and callee != current and len(fields) > 1:
                    inclusive[callee] += int(fields[1])
                continue
            if line.startswith("fn="):
                current = line[3:].strip()
            elif line.startswith("cfn="):
                callee = line[4:].strip()
            elif line.startswith("calls="):
                after_calls = True
                if callee in wanted and callee != current:
                    calls[callee] += int(line[6:].split()[0])
    for label, fn in pairs:
        print(f"{label} {inclusive.get(fn, 0)} {calls.get(fn, 0)}")


if __name__ == "__main__":
    main()
