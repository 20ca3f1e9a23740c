// A Node worker taking its turn on a scope: acquire, write with the token, release.
// Its twin in Python is examples/python_worker.py; both take the same arguments, so a Node worker and
// a Python worker can take turns on one scope and one store key or one table row
// (docs/typescript.md). Run: node dist/examples/worker.js --url http://127.0.0.1:7390 --scope orders \
//   --target store --value from-node   (add --pg <dsn> --target pg for the PostgreSQL fence)
//
// With --pause it stops between the grant and the write until a line arrives on stdin: the tests
// freeze it there (SIGSTOP) past its TTL to make it a zombie. The write names the token, not the lease,
// so it is sent even if the lease was lost meanwhile (a pause can fall between any check and the
// send): the resource decides. With --pause-inside (pg) it stops inside its fenced transaction
// instead, after its UPDATE, printing "in-transaction". It prints "acquired <value>", then
// "accepted" or "refused <Error>".
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import pg from "pg";

import { connect, FenceRejected } from "../src/index.js";
import { fenced } from "../src/pg.js";

const { values: args } = parseArgs({
  options: {
    url: { type: "string" }, pg: { type: "string" }, scope: { type: "string", default: "orders" },
    target: { type: "string", default: "store" }, value: { type: "string", default: "from-node" },
    "ttl-ms": { type: "string", default: "300" }, "wait-ms": { type: "string", default: "10000" },
    pause: { type: "boolean", default: false }, "pause-inside": { type: "boolean", default: false },
    "no-fence": { type: "boolean", default: false },
  },
});
if (args.url === undefined || (args.target === "pg" && args.pg === undefined)) {
  console.error("usage: worker.js --url URL [--target store|pg --pg DSN] [--scope S] [--value V] [--pause] [--no-fence]");
  process.exit(2);
}

const client = await connect(args.url, process.env["STOCKADE_AUTH_TOKEN"] ? { authToken: process.env["STOCKADE_AUTH_TOKEN"] } : {});
const db = args.target === "pg" ? new pg.Client({ connectionString: args.pg }) : undefined;
await db?.connect();
const lease = await client.acquire(args.scope, { ttlMs: Number(args["ttl-ms"]), waitMs: Number(args["wait-ms"]) });
console.log(`acquired ${lease.token.value}`);
async function pause(): Promise<void> {
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  lines.close();
}
if (args.pause) await pause();
try {
  if (db === undefined) {
    await client.put(args.scope, "shared", args.value, { token: lease.token });
  } else if (args["no-fence"]) { // the control: the same transaction without the fence
    await db.query("BEGIN");
    await db.query("UPDATE shared SET value = $1, token_value = $2 WHERE id = 1", [args.value, String(lease.token.value)]);
    await db.query("COMMIT");
  } else {
    await fenced(db, lease.token, async (tx) => {
      await tx.query("UPDATE shared SET value = $1, token_value = $2 WHERE id = 1", [args.value, String(lease.token.value)]);
      if (args["pause-inside"]) {
        console.log("in-transaction");
        await pause();
      }
    });
  }
  console.log("accepted");
} catch (error) {
  if (!(error instanceof FenceRejected)) throw error;
  console.log(`refused ${error.name}`);
} finally {
  await lease.release().catch(() => undefined);
  await db?.end();
  client.close();
}
