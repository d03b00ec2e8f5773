"""``wait_for_http``, the readiness probe of the S3 server and the REST catalog, against a real HTTP
server process (Python's ``http.server``): it returns once the address answers, takes the codes
it is told for an answer, stops at its deadline, and names the process that exited first."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from airflow_provider_pglogical.embedded.postgres import free_port
from airflow_provider_pglogical.embedded.readiness import stop_process, wait_for_http


class Exited(RuntimeError):
    pass


@pytest.fixture
def http_server(tmp_path):
    """``python -m http.server`` on a free loopback port serving an empty folder: ``/`` answers 200,
    any other path 404."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(tmp_path), str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield f"http://127.0.0.1:{port}", process
    stop_process(process, timeout=10)


def test_returns_once_the_server_answers_and_takes_the_codes_it_is_told(http_server):
    url, process = http_server
    wait_for_http(url + "/", process, timeout=30, what="the test server", exited=Exited)
    wait_for_http(url + "/missing", process, timeout=5, what="the test server", exited=Exited, answering_codes={404})
    assert process.poll() is None


def test_an_error_code_it_is_not_told_is_no_answer_and_the_deadline_holds(http_server):
    url, process = http_server
    wait_for_http(url + "/", process, timeout=30, what="the test server", exited=Exited)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 0.5s waiting for the test server to answer on .*/missing"):
        wait_for_http(url + "/missing", process, timeout=0.5, what="the test server", exited=Exited)
    assert time.monotonic() - started < 5


def test_a_process_that_exits_first_raises_its_own_error():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(timeout=30)
    with pytest.raises(Exited, match="exited with 3"):
        wait_for_http(f"http://127.0.0.1:{free_port()}/", process, timeout=30, what="nothing",
                      exited=lambda code: Exited(f"exited with {code}"))


def test_stop_process_ends_the_server(http_server):
    _, process = http_server
    stop_process(process, timeout=10)
    assert process.poll() is not None
