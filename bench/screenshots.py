"""The console's screenshots in the docs (docs/img/console-*.png), taken in Debian's chromium
by the browser tests that drive those pages, with JOBQUEUE_SHOTS pointing them at docs/img:

    python bench/screenshots.py      # (from the repository's root; needs the test servers)

Each test clips its picture to what the docs show, so the PNGs stay small.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/console/test_flow_graph.py::test_an_operator_reads_a_flow_as_a_graph_and_clicks_through_to_a_job",
    "tests/console/test_flow_graph.py::test_a_chords_thousand_members_are_one_box_linking_to_their_list",
    "tests/console/test_console_layout.py",
]


def main() -> int:
    env = {**os.environ, "JOBQUEUE_SHOTS": str(ROOT / "docs" / "img")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                          cwd=ROOT, env=env, check=False)
    for image in sorted((ROOT / "docs" / "img").glob("console-*.png")):
        print(f"{image.relative_to(ROOT)}: {image.stat().st_size // 1024} KiB")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
