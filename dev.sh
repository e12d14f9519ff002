#!/usr/bin/env bash
# Developer entry point: `./dev.sh demo` or `./dev.sh test` (see README.md).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3.12}
VENV=.venv

setup() {
  if ! command -v mysql_config >/dev/null 2>&1 && ! pkg-config --exists mysqlclient 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "==> installing the MySQL client headers (for mysqlclient)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        default-libmysqlclient-dev pkg-config >/dev/null
    fi
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
  fi
  if [ ! -f "$VENV/.installed" ] || [ requirements.txt -nt "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
    echo "==> installing requirements"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -r requirements.txt
    "$VENV/bin/pip" install -q --no-deps -e .
    touch "$VENV/.installed"
  fi
}

# Ctrl-C stops everything the demo started: the worker, and the embedded valkey-server (a
# daemon, outside this process group) unless it was already running before the demo.
demo_cleanup() {
  kill -TERM "$players" 2>/dev/null || true
  kill -TERM "$worker" 2>/dev/null || true
  wait "$worker" 2>/dev/null || true
  if [ "$started_valkey" = 1 ] && [ -f "$pidfile" ]; then
    kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
  fi
}

demo() {
  setup
  export DJANGO_SETTINGS_MODULE=project.settings
  unset VALKEY_URL DATABASE_URL
  pidfile=var/valkey/valkey.pid started_valkey=1  # globals: the EXIT trap runs after demo() returns
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then started_valkey=0; fi
  "$VENV/bin/python" manage.py migrate --noinput
  "$VENV/bin/python" manage.py demo_setup
  "$VENV/bin/python" manage.py runworker --concurrency 4 &
  worker=$!
  "$VENV/bin/python" manage.py codemojex_players &
  players=$!
  trap demo_cleanup EXIT
  trap 'exit 130' INT TERM  # so that Ctrl-C runs the EXIT trap
  echo "==> admin: http://127.0.0.1:8000/admin/jobqueue/job/live/  (user admin, password admin)"
  echo "==> codemojex, fair lanes at work: http://127.0.0.1:8000/codemojex/"
  "$VENV/bin/python" manage.py runserver 127.0.0.1:8000
}

test_suite() {
  setup
  if [ ! -x /usr/bin/chromium ]; then
    echo "!! /usr/bin/chromium is missing: browser tests will be skipped (apt-get install chromium)"
  fi
  "$VENV/bin/ruff" check .
  "$VENV/bin/mypy"
  "$VENV/bin/python" manage.py makemigrations --check --dry-run jobqueue >/dev/null
  # The docs site, in strict mode: a broken link or anchor fails the run (site/ is ignored).
  NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir site
  "$VENV/bin/pytest" "$@"
}

case "${1:-}" in
  demo) shift; demo "$@" ;;
  test) shift; test_suite "$@" ;;
  *) echo "usage: ./dev.sh demo | ./dev.sh test [pytest args]" >&2; exit 2 ;;
esac
