"""Greets the payload's ``name`` from Python: logs, reports progress,
enqueues the Rust ``hello`` for each of ``children`` names, adds a Rust
``hello`` step for each of ``grow`` names to the workflow it is a step of,
makes the Rust ``hello``'s schedule for ``schedule`` (``{key, cron, zone,
overlap, jitter_ms}``) and reports the error a ``bad_cron`` schedule gets,
and fails its first ``fail_times`` attempts with a retryable error."""

import wit_world

from componentize_py_types import Err
from jobhost_guest import (add_step, config, current_step, enqueue, log, output, parse_payload, progress, retry,
                           set_schedule)


class WitWorld(wit_world.WitWorld):
    def describe(self):
        return config("py_hello", max_attempts=5, backoff_ms=(10, 100))

    def run(self, ctx, payload):
        data = parse_payload(payload)
        if ctx.attempt <= int(data.get("fail_times", 0)):
            raise retry("attempt %d failed on purpose" % ctx.attempt)
        name = str(data.get("name", "world"))
        log.info("greeting " + name)
        children = data.get("children", [])
        for done, child in enumerate(children):
            enqueue("hello", {"name": child})
            progress(done + 1, len(children))
        for grown in data.get("grow", []):
            add_step(grown, "hello", {"name": grown})
        result = {"greeting": "hello from Python, " + name, "attempt": ctx.attempt}
        if "schedule" in data:
            wanted = data["schedule"]
            set_schedule("hello", wanted["key"], wanted["cron"], time_zone=wanted.get("zone"),
                         payload={"name": wanted["key"]}, overlap=wanted.get("overlap"),
                         jitter_ms=wanted.get("jitter_ms"))
        if "bad_cron" in data:
            try:
                set_schedule("hello", "bad", data["bad_cron"])
            except Err as refused:
                result["refused"] = refused.value
        step = current_step()
        if step is not None:
            result["step"] = step[1]
        return output(result)
