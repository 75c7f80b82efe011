"""The Spark writer's posts (spark/sink.py, docs/spark.md “Writing”), without Spark: a task's rows
reach a live ``weir run`` whatever their size against ``api.max_body_bytes``, and an answer
that may pass (a restart, a store not answering) is tried again rather than failing the task
(a local master runs a task once: a failed post failed the whole query)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pyspark.sql import Row

from devkit.server import free_port
from spark import sink
from spark.sink import SinkError, Target, write_rows
from tests.helpers.api import TOKEN, api_serving


def _rows(n: int, size: int = 60) -> list[Row]:
    return [Row(collection_id="totals", record_id=f"c{i}", data=f'{{"note": "{"x" * size}"}}',
                version=7) for i in range(n)]  # fmt: skip


def test_rows_beyond_max_body_bytes_go_in_halves_and_a_replay_stores_nothing(table: str) -> None:
    """300 rows (~30 kB as one post) into an API that takes 4 kB a body: every row stored once,
    the same rows again all skipped (the version guard); one row alone beyond the limit fails
    naming the record and the setting to raise."""
    port = free_port()
    api = {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN], "max_body_bytes": 4096}
    target = Target(f"http://127.0.0.1:{port}/v1/sources/stripe/records", TOKEN, "stripe")
    with api_serving(table, port=port, api=api):
        first = write_rows(target, iter(_rows(300)))
        assert (first.accepted, first.skipped) == (300, 0)
        again = write_rows(target, iter(_rows(300)))
        assert (again.accepted, again.skipped) == (0, 300)
        with pytest.raises(SinkError) as e:
            write_rows(target, iter([*_rows(2), *_rows(1, size=5000)]))
        assert str(e.value).startswith("source stripe: record 'c0' of totals is ")
        assert str(e.value).endswith("more than the API takes: raise api.max_body_bytes")


@contextmanager
def _answering(statuses: list[int]) -> Iterator[tuple[str, list[int]]]:
    """A loopback HTTP server answering each POST with the next status (200: an ingest answer
    for every record), then 200; yields its URL and the statuses it gave."""
    given: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            status = statuses.pop(0) if statuses else 200
            given.append(status)
            body = b'{"accepted": 3, "skipped": 0}' if status == 200 else b"store down"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/sources/s/records", given
    finally:
        server.shutdown()
        server.server_close()


def test_answers_that_may_pass_are_tried_again_and_others_fail_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sink, "RETRY_WAITS", (0.01, 0.01, 0.01))
    with _answering([503, 502, 429]) as (url, given):
        assert write_rows(Target(url, TOKEN, "s"), iter(_rows(3))).accepted == 3
        assert given == [503, 502, 429, 200]
    with _answering([503] * 10) as (url, given), pytest.raises(SinkError) as e:
        write_rows(Target(url, TOKEN, "s"), iter(_rows(3)))
    assert str(e.value) == "source s: ingest answered 503: store down (tried 4 times in 0 s)"
    assert given == [503] * 4
    with _answering([401]) as (url, given), pytest.raises(SinkError) as e:
        write_rows(Target(url, TOKEN, "s"), iter(_rows(3)))
    assert str(e.value) == "source s: ingest answered 401: store down" and given == [401]
