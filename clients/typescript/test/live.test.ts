// The client against a real `stockade serve` and a real PostgreSQL (started by tests/test_typescript_client.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import pg from "pg";

import {
  connect,
  InvalidArgument,
  LeaseLost,
  LockTimeout,
  NotHolder,
  ROUTES,
  StaleToken,
  TokenMismatch,
  BackendUnavailable,
} from "../src/index.js";
import { parseJson } from "../src/json.js";
import { mutants } from "../src/mutants.js";
import { fenced } from "../src/pg.js";
import { disagreements } from "./contract.test.js";
import { env, live } from "./env.js";

const skip = live("url");
const unique = (name: string): string => `${name}-${process.pid}-${Math.floor(performance.now())}`;

test("acquire, renew, write with the token, release; the next holder's token fences the first out", { skip }, async () => {
  const client = await connect(env.url!);
  try {
    const scope = unique("cycle");
    const first = await client.acquire(scope, { ttlMs: 2000 });
    assert.equal(first.token.scope, scope);
    assert.equal(first.token.cluster, client.clusterId);
    assert.ok(first.token.signed);
    await first.renew();
    await first.put("k", "one");
    assert.equal((await client.inspect(scope)).tokenValue, first.token.value);
    await first.release();
    await first.release(); // idempotent
    const second = await client.acquire(scope, { ttlMs: 2000 });
    assert.ok(second.token.value > first.token.value);
    await second.put("k", "two");
    const error = await client.put(scope, "k", "zombie", { token: first.token }).catch((e: unknown) => e);
    assert.ok(error instanceof StaleToken);
    assert.equal(error.token?.value, first.token.value);
    assert.equal(error.highWater, second.token.value);
    assert.equal((await client.get(scope, "k"))?.value.toString(), "two");
    assert.equal(await client.highWater(scope), second.token.value);
    const tx = await second.transaction([{ op: "put", key: "a", value: new Uint8Array([0, 255]) }, { op: "delete", key: "k" }]);
    assert.equal(tx.commitSeqs.length, 2);
    assert.equal(await client.get(scope, "k"), null);
    assert.deepEqual([...(await client.get(scope, "a"))!.value], [0, 255]);
    const stale = await client.transaction(scope, [{ op: "put", key: "a", value: "z" }], { token: first.token }).catch((e: unknown) => e);
    assert.ok(stale instanceof StaleToken);
    await second.release();
    assert.equal(await second.renew().catch((e: unknown) => e instanceof LeaseLost), true);
  } finally {
    client.close();
  }
});

test("an unsigned token (what reads show) and another scope's token are refused as TokenMismatch", { skip }, async () => {
  const client = await connect(env.url!);
  try {
    const lease = await client.acquire(unique("mismatch"), { ttlMs: 2000 });
    const unsigned = await client.put(lease.scope, "k", "v", { token: String(lease.token) }).catch((e: unknown) => e);
    assert.ok(unsigned instanceof TokenMismatch, String(unsigned));
    const other = await client.put(unique("other"), "k", "v", { token: lease.token }).catch((e: unknown) => e);
    assert.ok(other instanceof TokenMismatch, String(other));
    await lease.release();
  } finally {
    client.close();
  }
});

test("lock(): waits FIFO, releases at the end, and a held scope at the deadline is LockTimeout", { skip }, async () => {
  const client = await connect(env.url!);
  try {
    const scope = unique("lock");
    const holder = await client.acquire(scope, { ttlMs: 5000 });
    const timeout = await client.lock(scope, async () => "ran", { ttlMs: 1000, waitMs: 150 }).catch((e: unknown) => e);
    assert.ok(timeout instanceof LockTimeout);
    assert.equal(timeout.waitMs, 150);
    const waiting = client.lock(scope, async (lease, signal) => {
      assert.equal(signal.aborted, false);
      await lease.put("k", "inside");
      return lease.token.value;
    }, { ttlMs: 1000, waitMs: 5000 });
    setTimeout(() => void holder.release(), 100);
    assert.ok((await waiting) > holder.token.value);
    assert.equal((await client.inspect(scope)).state, "free");
    const abort = new AbortController();
    const aborted = client.acquire(scope, { ttlMs: 1000, waitMs: 5000, signal: abort.signal });
    abort.abort(new Error("gave up"));
    await assert.rejects(aborted, /gave up/);
  } finally {
    client.close();
  }
});

test("waitMs null waits until granted, first in first out; aborting it leaves no waiter", { skip }, async () => {
  const client = await connect(env.url!);
  try {
    const scope = unique("forever");
    const holder = await client.acquire(scope, { ttlMs: 5000 });
    const order: string[] = [];
    const first = client.acquire(scope, { ttlMs: 5000, waitMs: null }).then((lease) => (order.push("first"), lease));
    while ((await client.inspect(scope)).waiters < 1) await new Promise((resolve) => setTimeout(resolve, 10));
    const abort = new AbortController();
    const second = client.acquire(scope, { ttlMs: 5000, waitMs: null, signal: abort.signal });
    while ((await client.inspect(scope)).waiters < 2) await new Promise((resolve) => setTimeout(resolve, 10));
    assert.deepEqual((await client.contenders(scope)).map((c) => c.holding), [true, false, false]);
    abort.abort(new Error("gave up"));
    await assert.rejects(second, /gave up/);
    while ((await client.inspect(scope)).waiters > 1) await new Promise((resolve) => setTimeout(resolve, 10));
    assert.deepEqual((await client.contenders(scope)).length, 2);
    await assert.rejects(client.contenders(scope, 0), InvalidArgument);
    await holder.release();
    const granted = await first;
    assert.deepEqual(order, ["first"]);
    assert.ok(granted.token.value > holder.token.value);
    await granted.release();
    assert.equal((await client.inspect(scope)).waiters, 0);
    await assert.rejects(client.acquire(scope, { ttlMs: 1000, waitMs: "forever" as unknown as number }), InvalidArgument);
  } finally {
    client.close();
  }
});

test("a grant that long-polled past its TTL is renewed at once, not given up as lost", { skip }, async () => {
  // Found here: the deadline counted from the acquire's send time, so such a grant was thrown as LeaseLost.
  const client = await connect(env.url!);
  try {
    const scope = unique("late");
    const holder = await client.acquire(scope, { ttlMs: 5000 });
    setTimeout(() => void holder.release(), 700);
    const late = await client.acquire(scope, { ttlMs: 300, waitMs: 5000 });
    assert.equal(late.lost, false);
    await late.put("k", "late");
    await late.release();
  } finally {
    client.close();
  }
});

test("bad input is refused before anything is sent, as InvalidArgument naming the field", { skip }, async () => {
  const client = await connect(env.url!);
  try {
    const cases: [() => Promise<unknown>, string][] = [
      [() => client.acquire("bad scope", { ttlMs: 1000 }), "scope"],
      [() => client.acquire("..", { ttlMs: 1000 }), "scope"],
      [() => client.acquire("s", { ttlMs: 99 }), "ttlMs"],
      [() => client.acquire("s", { ttlMs: 1.5 }), "ttlMs"],
      [() => client.acquire("s", { ttlMs: 1000, waitMs: 300_001 }), "waitMs"],
      [() => client.acquire("s", { ttlMs: 1000, holder: "two words" }), "holder"],
      [() => client.put("s", "", "v", { token: "stk1.x" }), "key"],
      [() => client.put("s", "k\0", "v", { token: "stk1.x" }), "key"],
      [() => client.put("s", "k", "v".repeat(1024 * 1024 + 1), { token: "stk1.x" }), "value"],
      [() => client.put("s", "k", "v", { token: "stk9.nope" }), "token"],
      [() => client.put("s", "k", "v", { token: "stk1.x", idempotencyKey: "a b" }), "idempotencyKey"],
      [() => client.transaction("s", [{ op: "move", key: "k" } as never], { token: "stk1.x" }), "steps[0].op"],
      [() => connect("ftp://x"), "url"],
      [() => connect(env.url!, { timeoutMs: 0 }), "timeoutMs"],
    ];
    for (const [call, field] of cases) {
      const error = await call().catch((e: unknown) => e);
      assert.ok(error instanceof InvalidArgument, `${field}: ${String(error)}`);
      assert.equal(error.field, field);
    }
    assert.equal((await client.inspect("s")).lastToken, 0n); // nothing reached the server
  } finally {
    client.close();
  }
});

test("a server that cannot be reached, or answers past the deadline, is BackendUnavailable", { skip }, async () => {
  const refused = await connect("http://127.0.0.1:1").catch((e: unknown) => e);
  assert.ok(refused instanceof BackendUnavailable && refused.certainNoEffect);
  const small = await connect(env.url!, { responseBytesMax: 1024 });
  try {
    const lease = await small.acquire(unique("big"), { ttlMs: 2000 });
    await lease.put("k", "x".repeat(4096));
    const error = await small.get(lease.scope, "k").catch((e: unknown) => e);
    assert.ok(error instanceof BackendUnavailable && /bound/.test(error.message), String(error));
    await lease.release();
  } finally {
    small.close();
  }
});

test("the live server's /openapi.json and the client agree on every route", { skip }, async () => {
  const response = await fetch(`${env.url}/openapi.json`);
  const document = parseJson(await response.text()) as { paths: Record<string, Record<string, { operationId: string }>> };
  const routes = Object.entries(document.paths).flatMap(([path, item]) =>
    Object.entries(item).map(([method, op]) => ({ operationId: op.operationId, method: method.toUpperCase(), path })));
  assert.deepEqual(disagreements(ROUTES, routes), []);
});

test("fenced(): commits with the current token, rolls back on the block's error, refuses a stale token and another scope", { skip: live("url", "pgUrl") }, async () => {
  const client = await connect(env.url!);
  const db = new pg.Client({ connectionString: env.pgUrl });
  await db.connect();
  try {
    const scope = unique("pg");
    const first = await client.acquire(scope, { ttlMs: 2000 });
    await first.release();
    const second = await client.acquire(scope, { ttlMs: 2000 });
    const value = await fenced(db, second, async (tx) => {
      await tx.query("UPDATE shared SET value = 'second' WHERE id = 1");
      return "done";
    });
    assert.equal(value, "done");
    await assert.rejects(fenced(db, second.token, async (tx) => {
      await tx.query("UPDATE shared SET value = 'rolled-back' WHERE id = 1");
      throw new Error("the block failed");
    }), /the block failed/);
    const stale = await fenced(db, first.token.encoded, async (tx) => tx.query("UPDATE shared SET value = 'zombie' WHERE id = 1")).catch((e: unknown) => e);
    assert.ok(stale instanceof StaleToken, String(stale));
    assert.equal(stale.highWater, second.token.value);
    const wrong = await fenced(db, second.token, async () => undefined, { scope: "another" }).catch((e: unknown) => e);
    assert.ok(wrong instanceof InvalidArgument && wrong.field === "scope");
    const forged = await fenced(db, String(second.token), async () => undefined).catch((e: unknown) => e);
    assert.ok(forged instanceof TokenMismatch && /forged/.test(forged.reason), String(forged));
    assert.equal((await db.query("SELECT value FROM shared WHERE id = 1")).rows[0].value, "second");
    await second.release();
  } finally {
    await db.end();
    client.close();
  }
});

/**
 * One round of lock() on a server frozen (SIGSTOP) for 2 TTLs while the body runs; the body waits for
 * its signal. Whether the body still ran when the server resumed, and when the next holder was granted.
 */
async function frozenServerRound(round: number): Promise<{ atResume: boolean; atGrant: boolean; abortedMs: number }> {
  const [a, b] = [await connect(env.url!), await connect(env.url!)];
  const scope = unique(`frozen-${round}`);
  let running = false;
  let abortedMs = Infinity;
  let frozenAt = 0;
  const body = a.lock(scope, async (_lease, signal) => {
    running = true;
    await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    abortedMs = performance.now() - frozenAt;
    running = false;
  }, { ttlMs: 300 }).catch((e: unknown) => e);
  let atResume: boolean;
  try {
    while (!running) await new Promise((r) => setTimeout(r, 5));
    process.kill(env.serverPid, "SIGSTOP");
    frozenAt = performance.now();
    await new Promise((r) => setTimeout(r, 600));
    atResume = running;
  } finally {
    process.kill(env.serverPid, "SIGCONT");
  }
  const next = await b.acquire(scope, { ttlMs: 1000, waitMs: 10_000 });
  const atGrant = running;
  await next.release();
  while (running) await new Promise((r) => setTimeout(r, 5)); // the control: until the refused renewal
  const outcome = await body;
  assert.ok(outcome instanceof LeaseLost, String(outcome));
  a.close();
  b.close();
  return { atResume, atGrant, abortedMs };
}

async function frozenServer(name: string): Promise<{ atResume: number; atGrant: number }> {
  const count = { atResume: 0, atGrant: 0 };
  let slowest = 0;
  for (let round = 0; round < env.rounds; round++) {
    const { atResume, atGrant, abortedMs } = await frozenServerRound(round);
    count.atResume += Number(atResume);
    count.atGrant += Number(atGrant);
    slowest = Math.max(slowest, abortedMs);
  }
  console.log(`FIGURE ${name}: bodies still running when the server resumed ${count.atResume} of ${env.rounds}, ` +
    `when the next holder was granted ${count.atGrant} of ${env.rounds} (slowest abort ${Math.round(slowest)} ms after the freeze; TTL 300 ms, frozen 600 ms)`);
  return count;
}

test("lock() aborts the body's signal at the local deadline while the server is frozen", { skip: live("url", "serverPid") }, async () => {
  assert.deepEqual(await frozenServer("lock() with the server frozen"), { atResume: 0, atGrant: 0 });
});

test("control: without the local deadline the body still runs while the server is frozen", { skip: live("url", "serverPid") }, async () => {
  mutants.noLocalDeadline = true;
  try {
    assert.equal((await frozenServer("control: no local deadline")).atResume, env.rounds);
  } finally {
    mutants.noLocalDeadline = false;
  }
});

test("a lease lost on the server (renewal refused) aborts the signal, and its writes refuse to start", { skip }, async () => {
  const client = await connect(env.url!);
  try {
    const scope = unique("refused");
    const outcome = await client.lock(scope, async (lease, signal) => {
      await fetch(`${env.url}/v1/leases/${(lease as unknown as { leaseId: string }).leaseId}`, { method: "DELETE" });
      await lease.renew().catch(() => undefined);
      assert.equal(signal.aborted, true);
      await assert.rejects(lease.put("k", "v"), LeaseLost);
      return "finished";
    }, { ttlMs: 3000 }).catch((e: unknown) => e);
    assert.ok(outcome instanceof LeaseLost && /refused/.test(outcome.reason), String(outcome));
    assert.equal((await client.get(scope, "k")), null);
    assert.ok(new NotHolder("x") instanceof Error);
  } finally {
    client.close();
  }
});
