"""Back-pressure: a client that pipelines requests and never reads cannot grow the server's memory."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

from conftest import PYTHON, python_env

import stockade


def _rss_mb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def test_unread_pipelined_answers_do_not_pile_up(tmp_path):
    server = subprocess.Popen([PYTHON, "-m", "stockade", "serve", "--data-dir", str(tmp_path), "--port", "0",
                               "--log-level", "error"], stdout=subprocess.PIPE, text=True, env=python_env())
    try:
        url = server.stdout.readline().strip().rsplit(" ", 1)[-1]
        port = int(url.rsplit(":", 1)[1])
        coord, store = stockade.connect(url), stockade.open_store(url)
        with coord.lock("big", ttl_ms=5000) as lease:
            big_token = lease.token.value
            store.put("big", "v", b"x" * (1024 * 1024), token=lease.token)
        before = _rss_mb(server.pid)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(5)
        request = b"GET /v1/kv/big/v HTTP/1.1\r\nHost: x\r\n\r\n"
        sent = 0
        try:
            for _ in range(150):  # 150 answers of 1 MiB each, none read
                sock.sendall(request)
                sent += 1
        except (TimeoutError, OSError):
            pass  # the server stopped reading: that is the back-pressure
        time.sleep(1.5)
        growth = _rss_mb(server.pid) - before
        sock.close()
        print(f"\nserver memory growth {growth} MB after {sent} pipelined 1 MiB GETs never read")
        assert growth < 40, f"server buffered {growth} MB of unread answers"
        assert stockade.connect(url).inspect("big").last_token == big_token  # still serving others
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
