#!/usr/bin/env python3
"""The library's dependency arrows point one way.

Each area of include/zest/ (a folder, or a top-level header) has a level below; a header may
include headers of its own area and of areas of a lower level only. So core never includes
layout, the tensor never includes autodiff, autodiff never includes nn, zero or moe, and so on:
the order in which the architecture is read (core -> layout -> tensor -> einsum -> autodiff ->
nn/zero/moe) is the order of the includes. A new area gets a level here; an include that
points up (or into an area with no level) fails, naming the file, the line and both levels.
docs/design-notes.md states the levels in one line, which this check writes and looks for.

    python3 check_layering.py <repository root>
"""
import pathlib
import re
import sys

LEVELS = {
    "config.hpp": 0,
    "core": 1,
    "report": 2,    # JSON logs, SVG plots, progress line: core only
    "backend": 2,
    "comm": 3,
    "mesh": 4,
    "layout": 4,
    "tensor": 5,
    "einsum": 6,
    "optim": 6,
    "io": 6,
    "plan": 7,
    "data": 7,
    "autodiff": 7,
    "testing": 8,
    "zero": 8,
    "train": 9,
    "moe": 9,
    "nn": 10,
    # Umbrella headers: above everything.
    "zest.hpp": 11,
    "io.hpp": 12,
    "report.hpp": 12,
    "cuda.hpp": 12,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"zest/([^"]+)"')


def area(rel):
    return rel.split("/", 1)[0]


def main(root):
    base = pathlib.Path(root) / "include" / "zest"
    problems = []
    for header in sorted(base.rglob("*.hpp")):
        rel = header.relative_to(base).as_posix()
        src = area(rel)
        if src not in LEVELS:
            problems.append(f"include/zest/{rel}: the area '{src}' has no level in {__file__}")
            continue
        for number, line in enumerate(header.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            dst = area(m.group(1))
            if dst == src:
                continue
            if dst not in LEVELS:
                problems.append(f"include/zest/{rel}:{number}: includes zest/{m.group(1)}, "
                                f"an area with no level")
            elif LEVELS[dst] >= LEVELS[src]:
                problems.append(f"include/zest/{rel}:{number}: {src} (level {LEVELS[src]}) "
                                f"includes zest/{m.group(1)} ({dst}, level {LEVELS[dst]}): "
                                f"an arrow pointing up or sideways")
    # docs/design-notes.md states the same order, in one line written from LEVELS.
    stated = order_line()
    notes = pathlib.Path(root) / "docs" / "design-notes.md"
    if stated not in notes.read_text():
        problems.append(f"docs/design-notes.md does not state the levels of {__file__} "
                        f"as the line:\n{stated}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) with the layering")
        return 1
    print(f"layering holds: {len(LEVELS)} areas")
    return 0


def order_line():
    """The levels, lowest first; areas of one level in alphabetical order, by a comma."""
    by_level = {}
    for name, level in LEVELS.items():
        by_level.setdefault(level, []).append(name)
    return "Levels, lowest first: " + " -> ".join(
        ", ".join(sorted(by_level[k])) for k in sorted(by_level)) + "."


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
