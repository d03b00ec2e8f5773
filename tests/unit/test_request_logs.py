"""Reading the loopback servers' request logs: each line's request, by route or by kind of object."""

from __future__ import annotations

from airflow_provider_pglogical.embedded.request_logs import RequestLog, Served, counted, rest_route, s3_kind

MOTO = (
    '127.0.0.1 - - [29/Nov/2026 01:29:44] "GET /lake?list-type=2&prefix=staging/p/&delimiter=/ HTTP/1.1" 200 -\n'
    '127.0.0.1 - - [29/Nov/2026 01:29:44] "\x1b[33mHEAD /lake/staging/p/_pipeline.json HTTP/1.1\x1b[0m" 404 -\n'
    '127.0.0.1 - - [29/Nov/2026 01:29:45] "\x1b[35m\x1b[1mGET /lake/wh/ns/t/metadata/snap-1-1-u.avro HTTP/1.1\x1b[0m" 206 -\n'
    '127.0.0.1 - - [29/Nov/2026 01:29:45] "PUT /lake/wh/ns/t/data/x-deletes.parquet?partNumber=1&uploadId=u HTTP/1.1" 200 -\n'
    '127.0.0.1 - - [29/Nov/2026 01:29:45] "POST /lake?delete HTTP/1.1" 200 -\n'
    '127.0.0.1 - - [29/Nov/2026 01:29:46] "GET /lake/wh/ns/t/metadata/00001-u.metadata.json HTTP/1.1'  # cut mid-line
)
JETTY = (
    "[qtp-17] INFO org.eclipse.jetty.server.RequestLog - served GET /v1/namespaces/ns/tables/t?snapshots=all 200 7\n"
    "[qtp-22] INFO org.eclipse.jetty.server.RequestLog - served POST /v1/namespaces/ns/tables/t/metrics?null 200 1\n"
    "[qtp-22] INFO org.eclipse.jetty.server.RequestLog - served POST /v1/oauth/tokens?null 200 1\n"
)


def test_moto_lines_are_read_whole_and_uncoloured_and_counted_by_kind(tmp_path):
    log = RequestLog(tmp_path / "s3.log", fixture=False)
    log.path.write_text("")
    log.mark()
    log.path.write_text(MOTO)
    served = log.since_mark()
    assert [s.status for s in served] == [200, 404, 206, 200, 200]  # the cut line waits for its end
    assert counted(served, s3_kind) == {"GET bucket list": 1, "HEAD staging object": 1, "GET warehouse manifest list": 1,
                                        "PUT warehouse parquet (partNumber+uploadId)": 1, "POST bucket delete": 1}


def test_rest_lines_are_counted_by_route(tmp_path):
    log = RequestLog(tmp_path / "rest.log", fixture=True)
    log.path.write_text(JETTY)
    served = log.since_mark()
    assert served[1] == Served("POST", "/v1/namespaces/ns/tables/t/metrics", "", 200)  # Jetty's "?null": no query
    assert [rest_route(s) for s in served] == ["GET /v1/namespaces/{ns}/tables/{table}",
                                               "POST /v1/namespaces/{ns}/tables/{table}/metrics", "POST /v1/oauth/tokens"]


def test_a_mark_counts_only_what_follows(tmp_path):
    log = RequestLog(tmp_path / "rest.log", fixture=True)
    log.path.write_text(JETTY)
    log.mark()
    assert log.since_mark() == []
    with open(log.path, "a") as out:
        out.write(JETTY.splitlines()[0] + "\n")
    assert log.since_mark() == [Served("GET", "/v1/namespaces/ns/tables/t", "snapshots=all", 200)]
