// What the test run started (tests/test_typescript_client.py passes it in the environment).
// Without it the live tests skip, except under CI=true, where they fail: CI never skips.
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const env = {
  url: process.env["STOCKADE_TS_URL"],
  serverPid: Number(process.env["STOCKADE_TS_SERVER_PID"] ?? "0"),
  controlUrl: process.env["STOCKADE_TS_CONTROL_URL"],
  pgUrl: process.env["STOCKADE_TS_PG_URL"],
  python: process.env["STOCKADE_TS_PYTHON"],
  rounds: Number(process.env["STOCKADE_TS_ROUNDS"] ?? "3"),
};

/** The skip option of a live test: false when everything is there, else why (an error under CI). */
export function live(...needed: (keyof typeof env)[]): false | string {
  const missing = needed.filter((name) => !env[name]);
  if (missing.length === 0) return false;
  const why = `not started by the test run: ${missing.join(", ")} (run tests/test_typescript_client.py)`;
  if (process.env["CI"] === "true") throw new Error(`CI never skips: ${why}`);
  return why;
}

const EXAMPLES = fileURLToPath(new URL("../examples/", import.meta.url));
const SOURCE_EXAMPLES = fileURLToPath(new URL("../../examples/", import.meta.url));

/** A worker process (examples/worker.ts or examples/python_worker.py) and its output lines. */
export class Worker {
  readonly proc: ChildProcessWithoutNullStreams;
  private readonly lines: string[] = [];
  private waiting: ((line: string | null) => void) | undefined;
  private ended = false;
  stderr = "";

  constructor(language: "node" | "python", args: string[]) {
    const [command, script] = language === "node" ? [process.execPath, `${EXAMPLES}worker.js`] : [env.python ?? "python3", `${SOURCE_EXAMPLES}python_worker.py`];
    this.proc = spawn(command, [script, ...args], { stdio: ["pipe", "pipe", "pipe"] });
    this.proc.stderr.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-4000);
    });
    const reader = createInterface({ input: this.proc.stdout });
    reader.on("line", (line) => {
      if (this.waiting) {
        const wake = this.waiting;
        this.waiting = undefined;
        wake(line);
      } else this.lines.push(line);
    });
    reader.on("close", () => {
      this.ended = true;
      this.waiting?.(null);
    });
  }

  /** The next line of output, within `timeoutMs`. */
  async line(timeoutMs = 30_000): Promise<string> {
    const queued = this.lines.shift();
    if (queued !== undefined) return queued;
    if (this.ended) throw new Error(`worker exited without a line: ${this.stderr}`);
    let timer: NodeJS.Timeout | undefined;
    const line = await new Promise<string | null>((resolve) => {
      this.waiting = resolve;
      timer = setTimeout(() => resolve(null), timeoutMs);
    });
    clearTimeout(timer);
    this.waiting = undefined;
    if (line === null) throw new Error(`no line from the worker within ${timeoutMs} ms: ${this.stderr}`);
    return line;
  }

  async exit(): Promise<number | null> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) await once(this.proc, "exit");
    return this.proc.exitCode;
  }
}
