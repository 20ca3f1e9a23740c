"""`stockade serve` under attack and under kill -9: S23 (schemathesis) and S11 over HTTP.

Each test prints one figure line (run with ``-s``) and has a control that must fail.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import HELPERS

sys.path.insert(0, str(HELPERS))
from server_fixtures import request, start_server  # noqa: E402

LONG = os.environ.get("STOCKADE_LONG") == "1"
S23_EXAMPLES = 400 if LONG else 50  # fuzzing, per operation: with the coverage phase, >= 1,000 cases
KILL_RESTARTS = 100 if LONG else 15
CONTROL_RESTARTS = 6

ST_CONFIG = """
[checks.positive_data_acceptance]
# 410: renewing a well-formed but unknown lease id is the contract's answer (docs/http-api.md).
expected-statuses = ["2xx", "401", "404", "409", "410", "429"]

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "404", "405", "409", "413", "414", "415", "422", "429", "431"]
"""


def _schemathesis(url: str, tmp_path: Path, examples: int, *extra: str) -> tuple[int, str]:
    """One schemathesis run: the number of cases it generated, and its output. With no example database
    (``--generation-database none``): a run of a clean checkout has nothing in it to replay, and keeping it cost
    the run without auth about 4 s of its 20 s of CPU; with the fixed seed, the same cases every run."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(ST_CONFIG)
    env = dict(os.environ)
    cli = Path(sys.executable).parent / "schemathesis"
    result = subprocess.run(
        [str(cli), "--config-file", str(config), "run", f"{url}/openapi.json", "--checks", "all", "--mode", "all",
         "-n", str(examples), "--seed", "23", "--generation-database", "none", "--no-color", *extra],
        capture_output=True, text=True, timeout=600, env=env,
    )
    output = result.stdout + result.stderr
    match = re.search(r"(\d+) generated", output)
    assert match, output[-3000:]
    return int(match.group(1)), output


def _server_errors(url: str, headers: dict[str, str] | None = None) -> int:
    text = request(url, "GET", "/metrics", headers=headers)[2].decode()
    return sum(int(float(m.group(1))) for m in re.finditer(
        r'stockade_request_seconds_count\{route="[^"]*",method="[^"]*",status="5\d\d"\} (\S+)', text))


def test_s23_schemathesis_finds_no_server_errors(tmp_path):
    proc = start_server(tmp_path / "data", "--wait-ms-cap", "50")
    try:
        # Without --auth-tokens the administrators' route answers 403 to everyone by design (it hands out
        # keys that can mint tokens; docs/tokens.md); the run with auth below fuzzes it with a token.
        cases, output = _schemathesis(proc.url, tmp_path, S23_EXAMPLES, "--exclude-operation-id", "verifyKeys")
        server_errors = _server_errors(proc.url)
    finally:
        assert proc.stop() == 0
    failed = "passed" not in output.split("Test cases:")[-1] or "failures" in output.split("Test cases:")[-1]
    stateful = re.search(r"Scenarios:\s+(\d+)\s+API Links:\s+(\d+) covered / \d+ selected / (\d+) total", output)
    links = f"{stateful.group(1)} scenarios, links {stateful.group(2)} of {stateful.group(3)}" if stateful else "-"
    print(f"\nS23 server errors {server_errors} of {cases} cases; schemathesis all checks and phases: "
          f"{'failures' if failed else 'no failures'}; stateful {links}")
    assert cases >= 1000
    assert stateful and int(stateful.group(1)) > 0 and int(stateful.group(2)) > 0, output[-3000:]
    assert server_errors == 0, output[-4000:]
    assert not failed, output[-6000:]


#: The run with auth: its examples and fuzzing phases (every operation, verifyKeys too, with an administrator's
#: token). The coverage and stateful phases send the same values and the same sequences with auth or without
#: (the token passes the same check before every handler): the run without auth above has them, with more
#: examples; here they took 26 s and 11 s of the 55 s at a load of 10 (verifyKeys has no parameter to vary).
S23_AUTH_PHASES = "examples,fuzzing"


def test_s23_schemathesis_with_auth(tmp_path):
    token = "st-token-0123456789abcdef0123"
    (tmp_path / "tokens").write_text(token + "\n")
    proc = start_server(tmp_path / "data", "--wait-ms-cap", "50", "--auth-tokens", str(tmp_path / "tokens"))
    auth = {"Authorization": f"Bearer {token}"}
    try:
        cases, output = _schemathesis(proc.url, tmp_path, 20, "-H", f"Authorization: Bearer {token}",
                                      "--phases", S23_AUTH_PHASES)
        server_errors = _server_errors(proc.url, auth)
    finally:
        proc.stop()
    summary = output.split("Test cases:")[-1]
    print(f"\nS23 (auth on) server errors {server_errors} of {cases} cases")
    assert server_errors == 0 and "failures" not in summary, output[-6000:]


def test_s23_control_schemathesis_catches_a_server_error(tmp_path):
    """A server with a planted bug (500 for long holder names): schemathesis must report it.

    It stops at the first failure (``--max-failures 1``): one is what the control must show."""
    proc = start_server(tmp_path / "data", "--wait-ms-cap", "50", control="crash-on-holder")
    try:
        cases, output = _schemathesis(proc.url, tmp_path, 30, "--max-failures", "1")
        server_errors = _server_errors(proc.url)
    finally:
        proc.stop()
    print(f"\nS23 control (planted 500): server errors {server_errors} of {cases} cases")
    assert server_errors > 0 and "failures" in output.split("Test cases:")[-1], output[-3000:]


# -- kill -9 during an acquire storm (S11 over HTTP) ----------------------------------------------


def _storm(url: str, stop: threading.Event, acked: dict[str, list[int]], in_flight: list[int], seed: int) -> None:
    rng = random.Random(seed)
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    body = json.dumps({"ttl_ms": 300, "wait_ms": 2_000})
    while not stop.is_set():
        scope = f"s{rng.randrange(4)}"
        in_flight[0] += 1
        try:
            conn.request("POST", f"/v1/locks/{scope}/acquire", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            doc = json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError):
            return  # the server died: this acquire's outcome is unknown (counted as possibly issued)
        in_flight[0] -= 1
        if response.status != 200:
            continue
        acked.setdefault(scope, []).append(doc["token_value"])
        try:
            conn.request("DELETE", f"/v1/leases/{doc['lease_id']}")
            conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            return


def _kill_storm(tmp_path: Path, restarts: int, control: str | None,
                stop_at_first_catch: bool = False) -> tuple[int, int, int, int]:
    """``restarts`` kill -9s during a storm (a control: until a start finds a regression, if asked)."""
    data = tmp_path / "data"
    rng = random.Random(11)
    acked: dict[str, list[int]] = {}
    regressions = duplicates = in_flight_total = 0
    for restart in range(restarts):
        proc = start_server(data, control=control)
        # Everything acknowledged before this start must be below what the coordinator has issued.
        for scope, tokens in acked.items():
            status, _, body = request(proc.url, "GET", f"/v1/locks/{scope}")
            if json.loads(body)["last_token"] < max(tokens):
                regressions += 1
        if regressions and stop_at_first_catch:
            proc.kill9()
            break
        stop = threading.Event()
        in_flight = [0]
        threads = [threading.Thread(target=_storm, args=(proc.url, stop, acked, in_flight, restart * 8 + i))
                   for i in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.15 + rng.random() * 0.25)
        proc.kill9()
        stop.set()
        for t in threads:
            t.join(10)
        in_flight_total += in_flight[0]
    proc = start_server(data)
    try:
        for scope, tokens in acked.items():
            status, _, body = request(proc.url, "POST", f"/v1/locks/{scope}/acquire",
                                      json_body={"ttl_ms": 1000, "wait_ms": 5_000})
            assert status == 200, body
            if json.loads(body)["token_value"] <= max(tokens):
                regressions += 1
    finally:
        proc.stop()
    for tokens in acked.values():
        duplicates += len(tokens) - len(set(tokens))
    total = sum(len(t) for t in acked.values())
    return regressions, duplicates, total, in_flight_total


def test_kill9_server_during_acquire_storm_never_regresses_tokens(tmp_path):
    regressions, duplicates, total, in_flight = _kill_storm(tmp_path, KILL_RESTARTS, None)
    print(f"\nserver kill -9: token regressions {regressions} of {KILL_RESTARTS} restarts; duplicates {duplicates} "
          f"of {total} acknowledged grants; {in_flight} acquires in flight at kills")
    assert total > KILL_RESTARTS
    assert regressions == 0 and duplicates == 0


def test_kill9_control_acknowledging_before_commit_is_caught(tmp_path):
    regressions, duplicates, total, _ = _kill_storm(tmp_path, CONTROL_RESTARTS, "ack-before-commit",
                                                    stop_at_first_catch=True)
    print(f"\nserver kill -9 control (ack before commit): token regressions {regressions} of {CONTROL_RESTARTS} "
          f"restarts; duplicates {duplicates} of {total}")
    assert regressions + duplicates > 0


def test_kill9_control_acknowledging_without_the_log_frame_is_caught(tmp_path):
    regressions, duplicates, total, _ = _kill_storm(tmp_path, CONTROL_RESTARTS, "skip-frame", stop_at_first_catch=True)
    print(f"\nserver kill -9 control (no record log frame): token regressions {regressions} of {CONTROL_RESTARTS} "
          f"restarts; duplicates {duplicates} of {total}")
    assert regressions + duplicates > 0
