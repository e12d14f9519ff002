"""The console's screenshots in the docs (docs/img/console-*.png), taken in Debian's chromium
by the browser tests that drive those pages, with JOBQUEUE_SHOTS pointing them at docs/img:

    python bench/screenshots.py      # (from the repository's root; needs the test servers)

Each test sets up what its page shows and clips its picture to it, so the PNGs stay small
(tests/console/test_docs_shots.py: a shop's queues with waiting and dead jobs, a chord, a week of
finished history with its rollup, a stored schedule, a restricted user, hidden and sealed
arguments, at a 1400-pixel-wide window). The PNGs are then optimised losslessly with optipng
when it is installed (`apt-get install optipng`); a picture over MAX_BYTES fails the run. Emoji
(the sealed values' 🔒) need a colour emoji font (`apt-get install fonts-noto-color-emoji`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "img"
MAX_BYTES = 300_000
TESTS = [
    "tests/console/test_flow_graph.py::test_an_operator_reads_a_flow_as_a_graph_and_clicks_through_to_a_job",
    "tests/console/test_flow_graph.py::test_a_chords_thousand_members_are_one_box_linking_to_their_list",
    "tests/console/test_console_layout.py",
    "tests/console/test_docs_shots.py",
]


def main() -> int:
    env = {**os.environ, "JOBQUEUE_SHOTS": str(IMAGES)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                          cwd=ROOT, env=env, check=False)
    images = sorted(IMAGES.glob("console-*.png"))
    if shutil.which("optipng"):
        subprocess.run(["optipng", "-quiet", "-o2", "-strip", "all", *map(str, images)], check=True)
    else:
        print("optipng is not installed: the PNGs are as chromium wrote them")
    too_large = [image for image in images if image.stat().st_size > MAX_BYTES]
    for image in images:
        print(f"{image.relative_to(ROOT)}: {image.stat().st_size // 1024} KiB")
    for image in too_large:
        print(f"{image.relative_to(ROOT)} is over {MAX_BYTES // 1000} KB: clip it to what the docs show")
    return done.returncode or int(bool(too_large))


if __name__ == "__main__":
    sys.exit(main())
