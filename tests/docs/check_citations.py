#!/usr/bin/env python3
"""Comments and docs cite only files in the repository.

Scans the repository's sources and documents (include/, tests/, examples/, bench/, docs/,
scripts/, cmake/, .ci/, README.md, CMakeLists.txt) for paths with a file extension,
e.g. zest/layout/cheapest_plan.hpp, docs/design-notes.md or tests/io/checkpoint_fault.py, and
fails, naming file and line, when one does not exist (a path under zest/ is looked up under
include/, one under an area of the library, like zero/stage.hpp, under include/zest/ and
tests/), or
when the design or style brief the project began from is cited by its file
name: they are not in the repository, so a comment states what it relies on in its own words
or cites docs/design-notes.md. Patterns (train_gpt_*.cpp, tests/<area>/...) and lines that
tell a file's history ("... is gone") are skipped.

    python3 check_citations.py <repository root>
"""
import pathlib
import re
import sys

ROOTS = ["include", "tests", "examples", "bench", "docs", "scripts", "cmake", ".ci"]
TOP = ["README.md", "CMakeLists.txt", "CMakePresets.json"]
SUFFIXES = {".hpp", ".cpp", ".cu", ".md", ".py", ".cmake", ".txt", ".json", ".in", ""}
# A path: an area of the repository (or zest/, or an area of the library, for a header),
# then folders, then a name with one of these extensions.
AREAS = ("core|layout|mesh|tensor|einsum|plan|comm|backend|autodiff|nn|zero|optim|data|io|"
         "train|report|moe|testing")
PATH = re.compile(r"(?<![\w./$<{-])((?:include/)?zest/[\w/.-]+\.hpp|"
                  r"(?:" + AREAS + r")/[\w/.-]+\.hpp|"
                  r"(?:tests|docs|examples|bench|scripts|cmake|\.ci)/[\w/.-]+"
                  r"\.(?:hpp|cpp|cu|md|py|cmake|txt|json|in))(?![\w*<>{}-])")
OUTSIDE = re.compile(r"\b(?:DESIGN|STYLE)\.md\b")
# A line that tells the history of a file ("nn/parameter.hpp is gone") names it, not cites it.
HISTORY = re.compile(r"\b(?:is gone|was removed|were removed|is removed|no longer exists)\b")


def sources(root):
    for name in TOP:
        if (root / name).is_file():
            yield root / name
    for top in ROOTS:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and (path.suffix in SUFFIXES or top in ("scripts", ".ci")):
                yield path


def main():
    root = pathlib.Path(sys.argv[1]).resolve()
    problems = []
    for path in sources(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        where = path.relative_to(root)
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                problems.append(f"{where}:{number}: cites a file outside the repository: "
                                f"{OUTSIDE.search(line).group(0)}")
            for match in ([] if HISTORY.search(line) else PATH.finditer(line)):
                cited = match.group(1).rstrip(".")
                candidates = [root / cited]
                if cited.startswith("zest/"):
                    candidates.append(root / "include" / cited)
                elif not cited.startswith(("include/", "tests/", "docs/", "examples/", "bench/",
                                           "scripts/", "cmake/", ".ci/")):
                    candidates.append(root / "include" / "zest" / cited)  # zero/stage.hpp
                    candidates.append(root / "tests" / cited)  # a test's "support/fixtures.hpp"
                if not any(c.exists() for c in candidates):
                    problems.append(f"{where}:{number}: cites {cited}, which is not in the "
                                    "repository")
    for p in problems:
        print(p)
    print(f"check_citations: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
