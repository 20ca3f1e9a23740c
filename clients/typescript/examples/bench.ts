// Lock cycles per second from Node (acquire -> token -> release), 1 client and N client processes,
// each process on its own scope: the workload of `stockade bench`'s lock cycles, to put beside it.
//   node dist/examples/bench.js --url http://127.0.0.1:7390 --procs 8 --seconds 5
import { fork } from "node:child_process";
import { once } from "node:events";
import { parseArgs } from "node:util";

import { connect } from "../src/index.js";

const { values: args } = parseArgs({
  options: {
    url: { type: "string" }, procs: { type: "string", default: "1" }, seconds: { type: "string", default: "5" },
    child: { type: "string" },
  },
});
if (args.url === undefined) {
  console.error("usage: bench.js --url URL [--procs N] [--seconds S]");
  process.exit(2);
}

async function cycles(scope: string, seconds: number): Promise<{ count: number; latenciesUs: number[] }> {
  const client = await connect(args.url!);
  const end = performance.now() + seconds * 1000;
  const latenciesUs: number[] = [];
  while (performance.now() < end) {
    const start = performance.now();
    const lease = await client.acquire(scope, { ttlMs: 10_000 });
    await lease.release();
    latenciesUs.push((performance.now() - start) * 1000);
  }
  client.close();
  return { count: latenciesUs.length, latenciesUs };
}

const seconds = Number(args.seconds);
if (args.child !== undefined) {
  const { count, latenciesUs } = await cycles(`bench-node-${args.child}`, seconds);
  process.send!({ count, latenciesUs });
} else {
  const procs = Number(args.procs);
  const results: { count: number; latenciesUs: number[] }[] = [];
  if (procs === 1) results.push(await cycles(`bench-node-${process.pid}`, seconds));
  else {
    const children = Array.from({ length: procs }, (_, i) =>
      fork(process.argv[1]!, ["--url", args.url!, "--seconds", String(seconds), "--child", `${process.pid}-${i}`]));
    await Promise.all(children.map(async (child) => {
      const [message] = await once(child, "message");
      results.push(message as { count: number; latenciesUs: number[] });
    }));
  }
  const all = results.flatMap((r) => r.latenciesUs).sort((a, b) => a - b);
  const total = results.reduce((sum, r) => sum + r.count, 0);
  const at = (q: number): number => Math.round(all[Math.min(all.length - 1, Math.floor(q * all.length))] ?? 0);
  console.log(`node lock cycles: ${procs} proc(s), ${Math.round(total / seconds)} cycles/s, p50 ${at(0.5)} us, p99 ${at(0.99)} us`);
}
