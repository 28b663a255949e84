"""Helpers for writing a jobhost job handler in Python.

A handler is a module defining ``class WitWorld(wit_world.WitWorld)`` with
``describe()`` and ``run(ctx, payload)``, built into a component with
componentize-py against the repository's ``wit/`` (see docs/handlers.md).
These helpers spare it the generated types' positional noise:

    from jobhost_guest import config, limit, parse_payload, retry, log

    class WitWorld(wit_world.WitWorld):
        def describe(self):
            return config("resize", max_attempts=5, concurrency=limit(2, key="{account}"))

        def run(self, ctx, payload):
            data = parse_payload(payload)
            log.info("resizing " + data["image"])
            return {"done": True}      # any JSON value, or None
"""

import json

from componentize_py_types import Err
from wit_world.imports import events, host, schedules, workflows

try:  # built against the `job-http` world, where wasi:http brings a `types` of its own
    from wit_world.imports import jobhost_job_types as types
except ImportError:  # built against `job`
    from wit_world.imports import types

__all__ = ["config", "allow", "limit", "rate", "unique", "parse_payload", "output", "retry", "fail", "snooze",
           "throttled", "log", "progress", "enqueue",
           "add_step", "open_workflow", "current_step", "send_event",
           "set_schedule", "pause_schedule", "resume_schedule", "remove_schedule"]

_CONFLICT = {"block": types.OnConflict.BLOCK, "discard": types.OnConflict.DISCARD, "raise": types.OnConflict.RAISE}
_STRATEGY = {
    "until-executed": types.UniqueStrategy.UNTIL_EXECUTED,
    "while-executing": types.UniqueStrategy.WHILE_EXECUTING,
}
_DUPLICATE = {"skip": types.OnDuplicate.SKIP, "replace": types.OnDuplicate.REPLACE, "raise": types.OnDuplicate.RAISE}


def config(name, queue=None, priority=None, max_attempts=None, backoff_ms=None, timeout_ms=None,
           memory_limit_bytes=None, concurrency=None, unique=None, outbound=None, rate_limit=None, on_events=None):
    """A job type's configuration; every option left out takes the host's default.

    ``backoff_ms`` is a ``(base, cap)`` pair in milliseconds; ``outbound`` a
    list of ``allow(...)`` rules, the origins runs may send HTTP requests to
    once an operator grants them too (docs/outbound.md); ``rate_limit`` a
    ``rate(...)`` (docs/rate-limits.md); ``on_events`` a list of event keys
    the type is enqueued for, one job per event (docs/events.md).
    """
    backoff = types.Backoff(base_ms=backoff_ms[0], cap_ms=backoff_ms[1]) if backoff_ms else None
    return types.JobConfig(name=name, queue=queue, priority=priority, max_attempts=max_attempts, backoff=backoff,
                           timeout_ms=timeout_ms, memory_limit_bytes=memory_limit_bytes, concurrency=concurrency,
                           unique=unique, schedule=None, outbound=outbound, rate_limit=rate_limit,
                           on_events=list(on_events) if on_events else None)


def allow(origin, methods=(), secrets=()):
    """An outbound rule: requests to ``origin`` (``https://api.example.com``,
    ``https://*.example.com``, ``http://127.0.0.1:*``) with ``methods`` (every
    method when empty), which may carry the named ``secrets``."""
    return types.OutboundRule(origin=origin, methods=list(methods), secrets=list(secrets))


def limit(at_once, key=None, duration_secs=30, on_conflict="block"):
    """At most ``at_once`` runs per rendered ``key`` fleet-wide; ``on_conflict``
    is ``"block"``, ``"discard"`` or ``"raise"``."""
    return types.Concurrency(limit=at_once, key=key, duration_secs=duration_secs, on_conflict=_CONFLICT[on_conflict])


def rate(starts, period_ms, key=None):
    """At most ``starts`` runs per rendered ``key`` start in any window of
    ``period_ms``, fleet-wide; without a key, of the job type as a whole."""
    return types.RateLimit(limit=starts, period_ms=period_ms, key=key)


def unique(key, strategy="until-executed", on_duplicate=None):
    """At most one job per rendered ``key`` at a time."""
    duplicate = _DUPLICATE[on_duplicate] if on_duplicate else None
    return types.Uniqueness(key=key, strategy=_STRATEGY[strategy], on_duplicate=duplicate)


def parse_payload(payload):
    """The payload as a dict; a payload that is not a JSON object fails the job without retry."""
    try:
        data = json.loads(payload)
    except ValueError as error:
        raise Err(types.JobError_Fail("payload is not JSON: %s" % error))
    if not isinstance(data, dict):
        raise Err(types.JobError_Fail("payload must be a JSON object"))
    return data


def output(value):
    """What ``run`` returns for ``value``: its JSON text, or nothing for None."""
    return None if value is None else json.dumps(value)


def retry(reason):
    """Ends the attempt as failed; the host retries with backoff while attempts remain."""
    return Err(types.JobError_Retry(reason))


def fail(reason):
    """Ends the job as failed at once, without retry."""
    return Err(types.JobError_Fail(reason))


def snooze(seconds):
    """Runs the job again after ``seconds`` without spending an attempt."""
    return Err(types.JobError_Snooze(seconds))


def throttled(retry_after_ms):
    """The service said "slow down": runs the job again after
    ``retry_after_ms`` without spending an attempt, and starts no other run
    of its key until then, fleet-wide."""
    return Err(types.JobError_Throttled(retry_after_ms))


class _Log:
    """Lines of the job's log, by level."""

    def trace(self, message):
        host.log(host.Level.TRACE, message)

    def debug(self, message):
        host.log(host.Level.DEBUG, message)

    def info(self, message):
        host.log(host.Level.INFO, message)

    def warn(self, message):
        host.log(host.Level.WARN, message)

    def error(self, message):
        host.log(host.Level.ERROR, message)


log = _Log()


def progress(done, total):
    """Reports progress; it shows while the job runs."""
    host.progress(done, total)


def enqueue(job, payload, queue=None, priority=None, delay_ms=None):
    """Enqueues a job of type ``job`` with a dict payload, written with this job's completion.

    Raises ``Err(str)`` when the host refuses it (unknown type, bad payload, a full ``raise`` limit).
    """
    host.enqueue(job, json.dumps(payload), host.EnqueueOptions(queue=queue, priority=priority, delay_ms=delay_ms))


_IF_FAILED = {"cancel": workflows.IfFailed.CANCEL, "run": workflows.IfFailed.RUN, "fail": workflows.IfFailed.FAIL}


def current_step():
    """The workflow step this job is, as ``(workflow_id, name)``, or None."""
    step = workflows.current_step()
    return None if step is None else (step.workflow_id, step.name)


def open_workflow(label=None):
    """Opens a workflow, created with this job's completion with the steps
    added to it; returns its number for ``add_step(..., workflow=N)``."""
    return workflows.open(label)


def add_step(name, job, payload, after=(), workflow=None, queue=None, priority=None, delay_ms=None, if_failed=None,
             sleep_ms=None):
    """Adds a step running ``job`` with a dict ``payload`` once the steps named
    in ``after`` (added before it) have ended, written with this job's
    completion. ``workflow`` is a number ``open_workflow`` returned, or None
    for the workflow this job is a step of: the step is then stored as
    ``THIS-STEP/NAME``, waits for this step too, and every step waiting for
    this one waits for it. ``if_failed`` is ``"cancel"``, ``"run"`` or
    ``"fail"``; an entry of ``after`` may be ``(name, if_failed)``. With
    ``sleep_ms`` the step waits that long, durably, once they have ended.

    Raises ``Err(str)`` when the host refuses it (a bad name, an unknown type
    or dependency, a bad payload).
    """
    deps = []
    for dep in after:
        dep_name, policy = (dep, None) if isinstance(dep, str) else dep
        deps.append(workflows.Dependency(step=dep_name, if_failed=_IF_FAILED[policy] if policy else None))
    target = workflows.WorkflowRef_Current() if workflow is None else workflows.WorkflowRef_Opened(workflow)
    options = host.EnqueueOptions(queue=queue, priority=priority, delay_ms=delay_ms)
    wait = None if sleep_ms is None else workflows.StepWait_SleepMs(sleep_ms)
    step = workflows.NewStep(name=name, job=job, payload=json.dumps(payload), options=options, after=deps,
                             if_failed=_IF_FAILED[if_failed] if if_failed else None, wait=wait)
    workflows.add_step(target, step)


def send_event(key, payload):
    """Sends an event with ``key`` and a dict ``payload`` when this job
    completes (docs/events.md): it ends the workflow waits for it and
    enqueues the types subscribed to it. Raises ``Err(str)`` when the host
    refuses it (a bad key, a payload too large)."""
    events.send(key, json.dumps(payload))


_OVERLAP = {"allow": schedules.Overlap.ALLOW, "skip": schedules.Overlap.SKIP,
            "buffer-one": schedules.Overlap.BUFFER_ONE, "buffer_one": schedules.Overlap.BUFFER_ONE}


def set_schedule(job, key, cron, time_zone=None, payload=None, overlap=None, jitter_ms=None, backfill=None,
                 starts_at_ms=None, ends_at_ms=None):
    """Creates or replaces the schedule of ``job`` for ``key`` (a customer,
    an account) when this job completes (docs/schedules.md, "Schedules made
    at run time"): ``cron`` read in ``time_zone`` (default UTC), each tick
    enqueuing a job with the dict ``payload`` plus ``_tick`` and
    ``_schedule``; ``overlap`` is ``"allow"``, ``"skip"`` or
    ``"buffer-one"``. Raises ``Err(str)`` naming a refused field."""
    spec = schedules.ScheduleSpec(cron=cron, time_zone=time_zone,
                                  payload=None if payload is None else json.dumps(payload),
                                  overlap=_OVERLAP[overlap] if overlap else None, jitter_ms=jitter_ms,
                                  backfill=backfill, starts_at_ms=starts_at_ms, ends_at_ms=ends_at_ms)
    schedules.set(job, key, spec)


def pause_schedule(job, key, note=None):
    """Pauses the schedule of ``job`` for ``key`` when this job completes,
    with a ``note`` for the next operator."""
    schedules.pause(job, key, note)


def resume_schedule(job, key):
    """Resumes the schedule of ``job`` for ``key`` when this job completes."""
    schedules.resume(job, key)


def remove_schedule(job, key):
    """Removes the schedule of ``job`` for ``key`` when this job completes."""
    schedules.remove(job, key)
