// The client's own HTTP/1.1 framing (src/http.ts) against a scripted server on loopback: what a proxy
// or a restarting server may send, and when a request is sent again (never a write, an acquire).
import assert from "node:assert/strict";
import net from "node:net";
import { test } from "node:test";

import { BackendUnavailable, InvalidArgument } from "../src/errors.js";
import { HttpClient } from "../src/http.js";

interface Script {
  /** The answer to the n-th request (0-based, counted over all connections): raw bytes, or an action. */
  answer(n: number, socket: net.Socket): void;
}

/** A server that reads one request head at a time and answers as `script` says; counts connections and requests. */
async function scripted(script: Script): Promise<{ url: string; connections: () => number; requests: string[]; close: () => void }> {
  const requests: string[] = [];
  let connections = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    connections++;
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
    let buffer = "";
    socket.on("data", (chunk) => {
      buffer += chunk.toString("latin1");
      for (;;) {
        const end = buffer.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = buffer.slice(0, end);
        const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? "0");
        if (buffer.length < end + 4 + length) return;
        requests.push(head.split("\r\n")[0]!);
        buffer = buffer.slice(end + 4 + length);
        script.answer(requests.length - 1, socket);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`, connections: () => connections, requests,
    close: () => {
      for (const socket of sockets) socket.destroy();
      server.close();
    },
  };
}

function client(url: string, timeoutMs = 2000, responseBytesMax = 1024 * 1024): HttpClient {
  return new HttpClient({ url: new URL(url), authToken: undefined, timeoutMs, responseBytesMax });
}

const OK = (body: string, extra = ""): string =>
  `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}\r\n${body}`;

test("keep-alive: three requests on one connection; a Connection: close answer is not reused", async () => {
  const server = await scripted({ answer: (n, s) => s.write(OK(`{"n":${n}}`, n === 1 ? "Connection: close\r\n" : "")) });
  const http = client(server.url);
  try {
    for (let n = 0; n < 3; n++) {
      const response = await http.request("GET", "/x", { timeoutMs: 2000 });
      assert.equal(response.body.toString(), `{"n":${n}}`);
      assert.equal(response.headers["content-type"], "application/json");
    }
    assert.equal(server.connections(), 2); // the second answer closed the first connection
  } finally {
    http.close();
    server.close();
  }
});

test("chunked answers (split anywhere, with extensions and a trailer), 1xx skipped, a body read until close", async () => {
  const chunked = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + "5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nTrailer: x\r\n\r\n";
  const server = await scripted({
    answer: (n, s) => {
      if (n === 0) { // one byte per write
        let i = 0;
        const drip = (): void => {
          if (i < chunked.length) s.write(chunked[i++]!, () => setImmediate(drip));
        };
        drip();
      } else {
        s.end("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end");
      }
    },
  });
  const http = client(server.url);
  try {
    assert.equal((await http.request("GET", "/chunked", { timeoutMs: 5000 })).body.toString(), "hello 0123456789");
    assert.equal((await http.request("GET", "/close", { timeoutMs: 2000 })).body.toString(), "until the end");
    assert.equal(server.connections(), 1);
  } finally {
    http.close();
    server.close();
  }
});

test("a reused connection closed unanswered: an idempotent request is sent again once, a POST never", async () => {
  // Request 1 (on the reused connection) is dropped unanswered; so is request 3 (a POST on a reused one).
  const server = await scripted({ answer: (n, s) => (n === 1 || n === 3 ? s.destroy() : s.write(OK("{}"))) });
  const http = client(server.url);
  try {
    await http.request("GET", "/a", { timeoutMs: 2000 });
    assert.equal((await http.request("POST", "/renew", { timeoutMs: 2000, idempotent: true })).status, 200);
    assert.deepEqual(server.requests, ["GET /a HTTP/1.1", "POST /renew HTTP/1.1", "POST /renew HTTP/1.1"]);
    const refused = await http.request("POST", "/acquire", { timeoutMs: 2000 }).catch((e: unknown) => e);
    assert.ok(refused instanceof BackendUnavailable && !refused.certainNoEffect, String(refused));
    assert.equal(server.requests.length, 4); // the acquire was sent once
  } finally {
    http.close();
    server.close();
  }
});

test("no answer by the deadline, a malformed answer, an answer over the bound: BackendUnavailable", async () => {
  const server = await scripted({
    answer: (n, s) => {
      if (n === 1) s.write("SMTP ready\r\n\r\n");
      if (n === 2) s.write("HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n");
      if (n === 3) s.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + "x".repeat(1024) + "\r\n400\r\n" + "x".repeat(1024) + "\r\n");
    },
  });
  const http = client(server.url, 2000, 1500);
  try {
    const started = performance.now();
    const timedOut = await http.request("GET", "/silent", { timeoutMs: 200 }).catch((e: unknown) => e);
    assert.ok(timedOut instanceof BackendUnavailable && /no answer .* within 200 ms/.test(timedOut.message), String(timedOut));
    assert.ok(performance.now() - started < 2000);
    const malformed = await http.request("GET", "/smtp", { timeoutMs: 2000 }).catch((e: unknown) => e);
    assert.ok(malformed instanceof BackendUnavailable && /bad status line/.test(malformed.message), String(malformed));
    for (const path of ["/declared", "/chunked"]) {
      const big = await http.request("GET", path, { timeoutMs: 2000 }).catch((e: unknown) => e);
      assert.ok(big instanceof BackendUnavailable && /bound/.test(big.message), `${path}: ${String(big)}`);
    }
    assert.equal(server.requests.length, 4); // none of them was sent twice
  } finally {
    http.close();
    server.close();
  }
});

test("a header that would break the request's framing is refused before anything is sent", async () => {
  const server = await scripted({ answer: (_n, s) => s.write(OK("{}")) });
  const http = client(server.url);
  try {
    const refused = await http.request("PUT", "/k", { timeoutMs: 2000, headers: { "Fencing-Token": "a\r\nX-Evil: 1" } })
      .catch((e: unknown) => e);
    assert.ok(refused instanceof InvalidArgument, String(refused));
    assert.equal(server.connections(), 0);
  } finally {
    http.close();
    server.close();
  }
});

test("aborting a request closes its connection (the server sees the close) and rejects with the signal's reason", async () => {
  let closed = 0;
  const server = await scripted({ answer: (_n, s) => s.on("close", () => closed++) });
  const http = client(server.url);
  try {
    const controller = new AbortController();
    const pending = http.request("POST", "/acquire", { timeoutMs: 5000, signal: controller.signal }).catch((e: unknown) => e);
    while (server.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
    controller.abort(new Error("given up"));
    assert.equal(((await pending) as Error).message, "given up");
    while (closed === 0) await new Promise((r) => setTimeout(r, 5));
  } finally {
    http.close();
    server.close();
  }
});
