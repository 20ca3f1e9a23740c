// Lock cycles per second from Node (acquire -> token -> release), 1 client and N client processes,
// each process on its own scope, measured as `stockade bench --workloads lock` measures the Python
// client (stockade/bench.py), so the two can be put side by side against one server:
// each client warms up with 20 cycles, then (N processes start together at a barrier) runs until
// `--seconds` pass or `--iters` cycles are done; cycles/s is all measured cycles over the wall time
// from the first client's start to the last one's end; p50/p99 over every cycle's latency.
//   node dist/examples/bench.js --url http://127.0.0.1:7390 --procs 8 [--seconds 3] [--iters 2000] [--json]
import { fork } from "node:child_process";
import { once } from "node:events";
import { parseArgs } from "node:util";

import { connect } from "../src/index.js";

const WARMUP = 20;
const TTL_MS = 10_000;

const { values: args } = parseArgs({
  options: {
    url: { type: "string" }, procs: { type: "string", default: "1" }, seconds: { type: "string", default: "3" },
    iters: { type: "string", default: "2000" }, json: { type: "boolean", default: false },
    child: { type: "string" },
  },
});
if (args.url === undefined) {
  console.error("usage: bench.js --url URL [--procs N] [--seconds S] [--iters N] [--json]");
  process.exit(2);
}
const url = args.url;
const seconds = Number(args.seconds);
const iters = Number(args.iters);

interface Outcome {
  t0: number;
  t1: number;
  latenciesUs: number[];
  violations: number;
}

/** This host's clock in ms, comparable across processes (performance.now() counts from each one's start). */
function wallMs(): number {
  return performance.timeOrigin + performance.now();
}

/** One client: warm-up, then `ready()` (the barrier), then cycles until the time or the count runs out. */
async function cycles(scope: string, ready: () => Promise<void>): Promise<Outcome> {
  const client = await connect(url);
  const tokens: bigint[] = [];
  const step = async (): Promise<void> => {
    const lease = await client.acquire(scope, { ttlMs: TTL_MS });
    tokens.push(lease.token.value);
    await lease.release();
  };
  for (let i = 0; i < WARMUP; i++) await step();
  await ready();
  const latenciesUs: number[] = [];
  const t0 = wallMs();
  while (latenciesUs.length < iters && wallMs() - t0 < seconds * 1000) {
    const started = performance.now();
    await step();
    latenciesUs.push((performance.now() - started) * 1000);
  }
  const t1 = wallMs();
  client.close();
  const violations = tokens.filter((t, i) => i > 0 && !(t > tokens[i - 1]!)).length;
  return { t0, t1, latenciesUs, violations };
}

function pct(sorted: number[], p: number): number {
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.round((p / 100) * (sorted.length - 1)))]!;
}

if (args.child !== undefined) {
  const go = new Promise<void>((resolve) => process.once("message", () => resolve()));
  const outcome = await cycles(`bench-node-${args.child}`, async () => {
    process.send!("ready");
    await go;
  });
  process.send!(outcome);
  process.disconnect();
} else {
  const procs = Number(args.procs);
  let results: Outcome[];
  if (procs === 1) results = [await cycles(`bench-node-${process.pid}`, async () => undefined)];
  else {
    const children = Array.from({ length: procs }, (_, i) =>
      fork(process.argv[1]!, ["--url", url, "--seconds", String(seconds), "--iters", String(iters),
        "--child", `${process.pid}-${i}`]));
    await Promise.all(children.map(async (child) => { await once(child, "message"); })); // every one warmed up
    const outcomes = children.map(async (child) => (await once(child, "message"))[0] as Outcome);
    for (const child of children) child.send("go");
    results = await Promise.all(outcomes);
  }
  const all = results.flatMap((r) => r.latenciesUs).sort((a, b) => a - b);
  const wallS = (Math.max(...results.map((r) => r.t1)) - Math.min(...results.map((r) => r.t0))) / 1000;
  const summary = {
    client: "node", procs, n: all.length, wall_s: wallS, ops_s: all.length / wallS,
    p50_us: pct(all, 50), p99_us: pct(all, 99), token_violations: results.reduce((s, r) => s + r.violations, 0),
  };
  if (args.json) console.log(JSON.stringify(summary));
  else {
    console.log(`node lock cycles: ${procs} proc(s), ${Math.round(summary.ops_s)} cycles/s, ` +
      `p50 ${Math.round(summary.p50_us)} us, p99 ${Math.round(summary.p99_us)} us, token violations ${summary.token_violations}`);
  }
}
