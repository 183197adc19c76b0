#!/usr/bin/env python3
"""Checks that the recorder was built from a full profile (meson.build,
recorder_pgo): tools/train-recorder ran all three workloads and renamed a
profile for every one of the recorder's source files. A training that
breaks leaves the recorder built without its profile and says so on
stderr only; this makes it a failure.

Usage: check_profile.py RECORDER_PROFILE_H SOURCES"""

import sys

header, sources = sys.argv[1], int(sys.argv[2])
expected = f"// Workloads trained: alloc_bench, python3, c++ -O2; profiles: {sources}."
with open(header) as f:
    lines = f.read().splitlines()
if expected not in lines:
    print(f"check_profile: {header} says {lines[1:]!r}, expected {expected!r}", file=sys.stderr)
    sys.exit(1)
print(expected)
