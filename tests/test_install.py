"""The wheel installs into a new project by following docs/install.md (see installcheck.py)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from . import installcheck


def test_the_install_page_marks_each_step_it_promises() -> None:
    found = [(what, target) for what, target, _ in installcheck.steps()]
    assert ("append", "settings.py") in found and ("write", "shop/jobs.py") in found
    commands = "\n".join(text for what, _, text in installcheck.steps() if what == "run")
    for step in ("pip install", "migrate", "shell -c", "runworker --burst", "createsuperuser"):
        assert step in commands, step


@pytest.mark.slow
def test_the_wheel_installs_into_a_new_project_and_runs_a_job_in_its_console(tmp_path: Path) -> None:
    found = installcheck.run(tmp_path)
    wheel = found["wheel"]
    assert isinstance(wheel, Path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "jobqueue/engine/scripts/claim.lua" in names and "jobqueue/migrations/0001_initial.py" in names
    assert "jobqueue/engine/scripts/_finish.lua" in names
    assert "jobqueue/console/pages.py" in names and "jobqueue/flows/__init__.py" in names
    assert "jobqueue/templates/admin/jobqueue/dashboard.html" in names
    assert found["row"] == "succeeded receipt 991 sent"
    assert str(tmp_path / "venv") in str(found["where"])  # not the source tree
    pages = found["pages"]
    assert isinstance(pages, dict)
    assert "emails" in pages["live"] and found["job_id"] in pages["job"]
    assert "receipt 991 sent" in pages["job"]
