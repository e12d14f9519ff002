"""System checks: `manage.py check` tells an operator what is wrong with JOBQUEUE."""

from __future__ import annotations

from typing import Any

from django.core import checks


def check_settings(**_: Any) -> list[checks.CheckMessage]:
    from django.conf import settings

    from .. import conf
    from ..exceptions import JobQueueError

    try:
        config = conf.parse(getattr(settings, "JOBQUEUE", {}))
    except JobQueueError as exc:
        if str(exc).startswith("JOBQUEUE['SCHEDULE']"):
            return [checks.Error(f"JOBQUEUE['SCHEDULE'] is invalid: {exc}", hint=SCHEDULE_HINT,
                                 id="jobqueue.E002")]
        if str(exc).startswith("JOBQUEUE['CONSOLE']"):
            return [checks.Error(f"JOBQUEUE['CONSOLE'] is invalid: {exc}", hint=CONSOLE_HINT,
                                 id="jobqueue.E009")]
        return [checks.Error(
            f"JOBQUEUE is invalid: {exc}",
            hint="See the docs' settings reference (docs/reference/settings.md; docs/howto/resize.md "
                 "for shards \"auto\" and AUTO_SHARDS): QUEUES maps queue names to their "
                 "options; URL is a redis:// or valkey:// URL.",
            id="jobqueue.E001",
        )]
    return [checks.Error(f"JOBQUEUE['SCHEDULE'][{name!r}]: no @job handler is registered as "
                         f"{entry.job!r}", hint=SCHEDULE_HINT, id="jobqueue.E003")
            for name, entry in config.schedule.items() if not _is_job(entry.job)]


SCHEDULE_HINT = ("See the docs' periodic jobs guide (docs/howto/periodic-jobs.md): each entry has "
                 "'job' (the dotted path of an @job in an app's jobs.py) and 'cron' (five fields) "
                 "or 'every' (seconds).")

CONSOLE_HINT = ("See the console reference (docs/reference/console.md, \"Access per queue\"): "
                "ACCESS maps queue names (or '*') to {'view': [groups], 'act': [groups]}; "
                "OPEN_BY_DEFAULT is True or False.")


def autodiscover_jobs() -> None:
    """Import every installed app's `jobs` module, as the worker does: its handlers register."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")


def _is_job(path: str) -> bool:
    """Whether `path` names an @job handler, as the worker will look it up."""
    from ..api.registry import lookup
    from ..exceptions import UnknownHandler

    autodiscover_jobs()
    try:
        lookup(path)
    except UnknownHandler:
        return False
    return True


MIN_VALKEY = (7, 2)
"""Valkey 7.2 (or Redis 7.2) at least: the scripts use LMOVE and ZRANGE … BYSCORE (6.2)."""


def check_tasks(**_: Any) -> list[checks.CheckMessage]:
    """A TASKS backend that cannot be imported (jobqueue's, misspelt or not installed)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    errors: list[checks.CheckMessage] = []
    for alias, spec in (getattr(settings, "TASKS", None) or {}).items():
        path = spec.get("BACKEND", "") if isinstance(spec, dict) else ""
        try:
            import_string(path)
        except ImportError as exc:
            errors.append(checks.Error(
                f"TASKS[{alias!r}]['BACKEND'] = {path!r} cannot be imported: {exc}",
                hint="See the docs' django.tasks guide (docs/howto/django-tasks.md): jobqueue's backend is "
                     "'jobqueue.tasks.ValkeyBackend'.",
                id="jobqueue.E004"))
    return errors


def check_valkey(**_: Any) -> list[checks.CheckMessage]:
    """Deploy check (`manage.py check --deploy`): Valkey answers, and is recent enough."""
    from redis.exceptions import RedisError

    from .. import conf
    from ..exceptions import JobQueueError

    try:
        info = conf.get_client().info("server")
    except (RedisError, JobQueueError, OSError) as exc:
        return [checks.Error(
            f"Valkey does not answer ({exc.__class__.__name__}: {exc})",
            hint="Check JOBQUEUE['URL'] (host, port, password, ssl_ca_certs): see "
                 "docs/howto/connect.md and docs/operating.md. Workers wait for Valkey; enqueues "
                 "fail until it answers.",
            id="jobqueue.E005")]
    version = str(info.get("valkey_version") or info.get("redis_version") or "0")
    found = tuple(int(p) for p in version.split(".")[:2] if p.isdecimal())
    if found < MIN_VALKEY:
        return [checks.Error(
            f"Valkey {version} is older than {'.'.join(map(str, MIN_VALKEY))}, which jobqueue's "
            "scripts need",
            hint="Upgrade Valkey (or Redis) to 7.2 or later: see docs/operating.md, 'Upgrades'.",
            id="jobqueue.E006")]
    return []


def check_encryption(**_: Any) -> list[checks.CheckMessage]:
    """A malformed `ENCRYPTION_KEYS`, or a queue that seals with no key to seal with."""
    from django.conf import settings

    from .. import conf, sealing
    from ..exceptions import JobQueueError

    hint = ("See the encryption how-to (docs/howto/encryption.md): each key is the URL-safe "
            "base64 of 32 random bytes; the first seals, every one opens.")
    try:
        config = conf.parse(getattr(settings, "JOBQUEUE", {}))
    except JobQueueError:
        return []  # jobqueue.E001 says what is wrong
    try:
        sealing.Keyring(sealing.parse_keys(list(config.encryption_keys)))  # (its package too)
    except JobQueueError as exc:
        return [checks.Error(str(exc), hint=hint, id="jobqueue.E007")]
    sealed = sorted(name for name, options in {"DEFAULTS": config.defaults, **config.queues}.items()
                    if options.encrypt)
    if sealed and not config.encryption_keys:
        return [checks.Error(f"queue(s) {', '.join(sealed)} seal their jobs (encrypt) but "
                             f"JOBQUEUE['ENCRYPTION_KEYS'] lists no key", hint=hint,
                             id="jobqueue.E008")]
    return []


def register() -> None:
    checks.register(check_settings, "jobqueue")
    checks.register(check_encryption, "jobqueue")
    checks.register(check_tasks, "jobqueue")
    checks.register(check_valkey, "jobqueue", deploy=True)


EVICTION_HINT = ("Set `maxmemory-policy noeviction` in valkey.conf (or your provider's parameter "
                 "group): Valkey then refuses writes when full, and enqueue raises, instead of "
                 "dropping keys. See docs/operating.md.")
AOF_HINT = ("Set `appendonly yes` (with `appendfsync everysec` or `always`) in valkey.conf, or "
            "make the queues that must survive a restart durable (`\"durable\": True`: the "
            "database row first). See docs/operating.md.")


@checks.register("jobqueue", deploy=True)
def check_valkey_keeps_jobs(**_: Any) -> list[checks.CheckMessage]:
    """Deploy check: Valkey must keep what it holds. A `maxmemory-policy` other than
    `noeviction` may evict a job's row (a lost job, or a queue's index pointing at nothing), and
    with AOF off a restart loses every job of a non-durable queue since the last snapshot."""
    from redis.exceptions import RedisError

    from .. import conf
    from ..exceptions import JobQueueError

    try:
        config = conf.get_config()
        client = conf.get_client()
        memory, persistence = _each_server(client.info("memory")), _each_server(client.info("persistence"))
    except (RedisError, JobQueueError, OSError):
        return []  # jobqueue.E005 already says that Valkey does not answer
    found: list[checks.CheckMessage] = []
    policies = sorted({str(info.get("maxmemory_policy", "noeviction")) for info in memory} - {"noeviction"})
    if policies:
        found.append(checks.Warning(
            f"Valkey's maxmemory-policy is {', '.join(policies)}: when it reaches maxmemory it "
            "evicts keys, and an evicted job row is a lost job",
            hint=EVICTION_HINT, id="jobqueue.W010"))
    plain = sorted(name for name, options in (config.queues or {"default": config.defaults}).items()
                   if not options.durable)
    if plain and not all(str(info.get("aof_enabled", "0")) == "1" for info in persistence):
        found.append(checks.Warning(
            f"Valkey's append-only file (AOF) is off, and queue(s) {', '.join(plain)} are not "
            "durable: a Valkey restart loses their jobs written since the last snapshot",
            hint=AOF_HINT, id="jobqueue.W011"))
    return found


def _each_server(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """INFO of each server: a cluster client answers with one dict per node."""
    if reply and all(isinstance(value, dict) for value in reply.values()):
        return list(reply.values())
    return [reply]
