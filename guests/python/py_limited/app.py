"""One run at a time per payload ``key``, from Python: sleeps the
payload's ``ms`` and reports when it ran, so tests can check from outside
that runs of one key never overlapped."""

import time

import wit_world

from jobhost_guest import config, limit, output, parse_payload


class WitWorld(wit_world.WitWorld):
    def describe(self):
        return config("py_limited", concurrency=limit(1, key="{key}", duration_secs=10))

    def run(self, ctx, payload):
        data = parse_payload(payload)
        started = time.time_ns() // 1_000_000
        time.sleep(int(data.get("ms", 0)) / 1000)
        ended = time.time_ns() // 1_000_000
        return output({"started_ms": started, "ended_ms": ended})
