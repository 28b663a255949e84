"""The fetcher handler in Python (as ``guests/fetcher`` in Rust): sends the
payload's request (``url``, ``method``, ``headers``, ``body``; ``${NAME}`` in
a header value is the environment variable NAME, where a secret's
placeholder is) and returns ``{"status", "body"}``, or ``{"error"}`` with the
wasi:http error's name. Declares the same origins."""

import os
import re

import wit_world

from jobhost_guest import allow, config, http, log, output, parse_payload


def expand(text):
    return re.sub(r"\$\{([A-Z0-9_]+)\}", lambda m: os.environ.get(m.group(1), ""), text)


class WitWorld(wit_world.WitWorld):
    def describe(self):
        return config("py_fetcher", max_attempts=1, outbound=[
            allow("http://127.0.0.1:*", methods=["GET", "POST"], secrets=["API_KEY"]),
            allow("http://localhost:*"),
            allow("https://api.example.com", methods=["GET"]),
        ])

    def run(self, ctx, payload):
        data = parse_payload(payload)
        headers = {name: expand(value) for name, value in data.get("headers", {}).items()}
        for name, value in headers.items():
            log.info("sending %s: %s" % (name, value))
        try:
            answer = http.request(data.get("method", "GET"), data["url"], headers=headers, body=data.get("body"))
        except http.HttpError as error:
            return output({"error": "ErrorCode::" + error.code})
        return output({"status": answer.status, "body": answer.text()})
