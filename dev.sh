#!/usr/bin/env bash
# Developer entry point: `./dev.sh demo` or `./dev.sh test` (see README.md). DEMO_PORT=8001
# ./dev.sh demo serves the demo on another port than 8000.
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

# Ctrl-C stops everything the demo started, within seconds: the server, the worker, the players
# and the embedded valkey-server (a daemon in a session of its own) unless it was already
# running before the demo. Each of the three runs as a job in its own process group (set -m), so
# that stopping one stops its children too (runserver's autoreloader serves from a child process).
demo_stop() {  # demo_stop SIGNAL: signal each job's process group; true when all are gone
  local alive=0 pid
  for pid in "${jobs_started[@]}"; do
    if kill -0 -- "-$pid" 2>/dev/null; then alive=1; [ "$1" = 0 ] || kill "-$1" -- "-$pid" 2>/dev/null || true; fi
  done
  [ "$alive" = 0 ]
}

demo_wait_gone() {  # demo_wait_gone SECONDS CHECK...: poll CHECK until it succeeds or time runs out
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do [ "$SECONDS" -ge "$deadline" ] && return 1; sleep 0.1; done
}

valkey_gone() { ! kill -0 "$valkey_pid" 2>/dev/null; }

demo_cleanup() {
  trap '' INT TERM  # a second Ctrl-C does not cut the cleanup short (it takes seconds at most)
  # The worker drains on the first TERM and stops on the second; KILL is for anything left.
  demo_stop TERM || demo_wait_gone 4 demo_stop 0 \
    || { demo_stop TERM || demo_wait_gone 2 demo_stop 0; } || demo_stop KILL || true
  wait 2>/dev/null || true
  valkey_pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ "$started_valkey" = 1 ] && [ -n "$valkey_pid" ] && grep -qs valkey-server "/proc/$valkey_pid/cmdline"; then
    kill -TERM "$valkey_pid" 2>/dev/null || true
    demo_wait_gone 5 valkey_gone || kill -KILL "$valkey_pid" 2>/dev/null || true
  fi
}

demo() {
  setup
  export DJANGO_SETTINGS_MODULE=project.settings DJANGO_DEBUG=true  # (the demo only: runserver serves the admin's files)
  unset VALKEY_URL DATABASE_URL
  local port=${DEMO_PORT:-8000}
  pidfile=var/valkey/valkey.pid started_valkey=1 jobs_started=()  # globals: for the EXIT trap
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then started_valkey=0; fi
  trap demo_cleanup EXIT  # from here: migrate may be the one that starts the embedded Valkey
  trap 'exit 130' INT TERM  # so that Ctrl-C runs the EXIT trap
  "$VENV/bin/python" manage.py migrate --noinput
  "$VENV/bin/python" manage.py demo_setup
  set -m
  "$VENV/bin/python" manage.py runworker --concurrency 4 </dev/null &
  jobs_started+=($!)
  "$VENV/bin/python" manage.py codemojex_players </dev/null &
  jobs_started+=($!)
  "$VENV/bin/python" manage.py runserver "127.0.0.1:$port" </dev/null &
  jobs_started+=($!)
  set +m
  echo "==> admin: http://127.0.0.1:$port/admin/jobqueue/job/live/  (user admin, password admin)"
  echo "==> codemojex, fair lanes at work: http://127.0.0.1:$port/codemojex/"
  echo "==> Ctrl-C stops the demo"
  wait "${jobs_started[2]}"  # (returns at once on Ctrl-C: the trap then runs)
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
  # Two processes (pytest-xdist): the suite mostly waits on real servers and workers, and each
  # process starts its own Valkey, cluster and test database (TEST_PROCESSES=1: one process).
  "$VENV/bin/pytest" -n "${TEST_PROCESSES:-2}" "$@"
}

case "${1:-}" in
  demo) shift; demo "$@" ;;
  test) shift; test_suite "$@" ;;
  *) echo "usage: ./dev.sh demo | ./dev.sh test [pytest args]" >&2; exit 2 ;;
esac
