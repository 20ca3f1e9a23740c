/**
 * The client of a `stockade serve`: leases with fencing tokens, and the fenced store
 * (docs/typescript.md; the HTTP API is docs/http-api.md).
 *
 * A lease is kept alive by renewing it at about TTL/3. It is *lost* when a renewal is refused, or
 * when its local deadline passes: the send time of the last successful renewal (or of the acquire)
 * plus the TTL, minus a margin for drift (max(5 ms, TTL/10)). The deadline is a timer of its own,
 * so the loss is marked on time even while a renewal hangs on a server that stopped answering
 * (rule K2). Once lost, `lease.signal` is aborted and stays so, and writes through the lease refuse
 * to start. The server's clock is never read: only this host's monotonic clock.
 */

import { randomBytes } from "node:crypto";
import { hostname } from "node:os";

import {
  BackendUnavailable,
  InvalidArgument,
  InvariantViolation,
  LeaseLost,
  LockTimeout,
  NotHolder,
  StockadeError,
} from "./errors.js";
import { HttpClient, type Response } from "./http.js";
import { asObject, type Json, JsonError, parseJson } from "./json.js";
import {
  CONTENDERS_MAX,
  describe,
  RESPONSE_BYTES_MAX_CEILING,
  RESPONSE_BYTES_MAX_DEFAULT,
  TIMEOUT_MS_DEFAULT,
  TIMEOUT_MS_MAX,
  TTL_MS_MAX,
  TTL_MS_MIN,
  TX_BODY_BYTES_MAX,
  TX_WRITES_MAX,
  validateInt,
  validateKey,
  validatePrintable,
  validateScope,
  validateValue,
  WAIT_MS_MAX,
  WAIT_MS_MIN,
} from "./limits.js";
import { mutants } from "./mutants.js";
import { errorFor, type ProblemContext } from "./problems.js";
import { type OperationId, ROUTES, target } from "./routes.js";
import { Token } from "./token.js";

/** Renewal retry pause after backend trouble, until the local deadline decides. */
export const RENEW_RETRY_MS = 50;
/** A renewal must come back in time to matter: its timeout is TTL/3, at least this. */
export const RENEW_TIMEOUT_MS_MIN = 50;
/** A wait until granted whose server stopped answering tries again after this pause, doubled up to the max. */
export const REQUEUE_PAUSE_MS_MIN = 50;
export const REQUEUE_PAUSE_MS_MAX = 1_000;

export interface ConnectOptions {
  /** A bearer token of the server's `--auth-tokens` file. */
  authToken?: string;
  /** Deadline of each request, in ms (default 10,000; an acquire adds its waitMs). */
  timeoutMs?: number;
  /** Bound on an answer's body, in bytes (default 4 MiB). */
  responseBytesMax?: number;
}

export interface AcquireOptions {
  ttlMs: number;
  /**
   * How long to wait in the server's FIFO queue (0..300,000 ms; default 0), or `null`: until granted.
   * A wait until granted keeps its place across the server's per-request cap (each request carries
   * the wait's queue ticket); only `signal` ends it, and the server then drops the place.
   */
  waitMs?: number | null;
  /** Shown in status (printable ASCII without spaces); default `<host>:<pid>`. */
  holder?: string;
  /** Aborting it gives up waiting (the server drops the place in its queue). */
  signal?: AbortSignal;
}

/** A token argument: the lease itself (its token is carried), its Token, or the encoded string. */
export type TokenLike = Lease | Token | string;

export interface WriteResult {
  readonly scope: string;
  readonly key: string;
  readonly tokenValue: bigint;
  readonly highWater: bigint;
  readonly commitSeq: bigint;
  readonly replayed: boolean;
}

export interface Item {
  readonly scope: string;
  readonly key: string;
  readonly value: Buffer;
  readonly tokenValue: bigint;
  readonly commitSeq: bigint;
}

export interface TxResult {
  readonly scope: string;
  readonly tokenValue: bigint;
  readonly highWater: bigint;
  /** One per step, in step order. */
  readonly commitSeqs: readonly bigint[];
}

export type TxStep = { op: "put"; key: string; value: string | Uint8Array } | { op: "delete"; key: string };

/** One party in a scope's line: its holder name (never a lease id or a token), and whether it holds the scope. */
export interface Contender {
  readonly holder: string;
  readonly holding: boolean;
}

export interface ScopeInfo {
  readonly scope: string;
  readonly state: string;
  readonly holder: string | null;
  /** The holder's token without its MAC (a read never hands out a write capability), or null. */
  readonly tokenValue: bigint | null;
  readonly lastToken: bigint;
  readonly remainingMs: number;
  readonly waiters: number;
}

/**
 * Connect to a `stockade serve` at `url` (`http://host:port`, optionally with a base path) and
 * read its cluster id: every token it grants must carry it.
 * @throws InvalidArgument on a bad url or option; BackendUnavailable when the server cannot be reached.
 */
export async function connect(url: string, options: ConnectOptions = {}): Promise<Client> {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InvalidArgument("url", `must be an http:// or https:// url, got ${JSON.stringify(String(url)).slice(0, 80)}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new InvalidArgument("url", `must be http:// or https://, got ${parsed.protocol}`);
  }
  if (parsed.search || parsed.hash || parsed.username || parsed.password) {
    throw new InvalidArgument("url", "must not carry a query, fragment or credentials (pass authToken)");
  }
  const authToken = options.authToken === undefined ? undefined : validatePrintable("authToken", options.authToken, 4096);
  const timeoutMs = validateInt("timeoutMs", options.timeoutMs ?? TIMEOUT_MS_DEFAULT, 1, TIMEOUT_MS_MAX);
  const responseBytesMax = validateInt(
    "responseBytesMax", options.responseBytesMax ?? RESPONSE_BYTES_MAX_DEFAULT, 1024, RESPONSE_BYTES_MAX_CEILING);
  const client = new Client(new HttpClient({ url: parsed, authToken, timeoutMs, responseBytesMax }));
  try {
    await client.open();
  } catch (error) {
    client.close();
    throw error;
  }
  return client;
}

function tokenOf(token: TokenLike): Token {
  if (token instanceof Lease) return token.token;
  if (token instanceof Token) return token;
  return Token.decode(token);
}

export class Client {
  private cluster: string | undefined;
  private readonly leases = new Set<Lease>();

  /** @internal use {@link connect}. */
  constructor(
    /** @internal */ readonly http: HttpClient,
  ) {}

  /** The id every token of this server carries (16 lowercase hex digits). */
  get clusterId(): string {
    if (this.cluster === undefined) throw new InvalidArgument("client", "not open: use connect()");
    return this.cluster;
  }

  /** @internal */
  async open(): Promise<void> {
    const doc = await this.json("cluster", {}, {});
    const cluster = doc["cluster_id"];
    if (typeof cluster !== "string" || !/^[0-9a-f]{16}$/.test(cluster)) {
      throw new BackendUnavailable("server sent a malformed cluster id");
    }
    this.cluster = cluster;
  }

  /** @internal One request to `operation`; a non-2xx answer is thrown as its typed error. */
  async call(
    operation: OperationId,
    params: Record<string, string>,
    options: { body?: Uint8Array; contentType?: string; headers?: Record<string, string>; timeoutMs?: number;
      idempotent?: boolean; signal?: AbortSignal | undefined; context?: ProblemContext; query?: string; ok?: number[] },
  ): Promise<Response> {
    const route = ROUTES[operation];
    const { context, query, ok, timeoutMs, ...rest } = options;
    const response = await this.http.request(route.method, target(operation, params, query ?? ""), {
      ...rest,
      timeoutMs: timeoutMs ?? this.http.endpoint.timeoutMs,
    });
    if (!(ok ?? [200]).includes(response.status)) throw errorFor(response.status, response.body.toString("utf8"), context);
    return response;
  }

  /** @internal */
  async json(operation: OperationId, params: Record<string, string>, options: Parameters<Client["call"]>[2]): Promise<{ [key: string]: Json }> {
    return documentOf(await this.call(operation, params, options));
  }

  /**
   * Acquire `scope`, waiting up to `waitMs` in the server's FIFO queue, and keep the lease alive
   * until {@link Lease.release}.
   * @throws LockTimeout still held at the deadline; InvalidArgument; LimitExceeded; BackendUnavailable.
   */
  async acquire(scope: string, options: AcquireOptions): Promise<Lease> {
    if (typeof options !== "object" || options === null) throw new InvalidArgument("options", "must be an object with ttlMs");
    validateScope(scope);
    const ttlMs = validateInt("ttlMs", options.ttlMs, TTL_MS_MIN, TTL_MS_MAX);
    const waitMs = options.waitMs === null ? null : validateInt("waitMs", options.waitMs ?? 0, WAIT_MS_MIN, WAIT_MS_MAX);
    const holder = validatePrintable("holder", options.holder ?? `${hostname()}:${process.pid}`);
    options.signal?.throwIfAborted();
    const [doc, sentMs] = await this.acquireRequests(scope, ttlMs, waitMs, holder, options.signal);
    const leaseId = doc["lease_id"];
    if (typeof leaseId !== "string" || !leaseId) throw new BackendUnavailable("server acquire answer lacks a lease id");
    const token = tokenFrom(doc);
    const grantedTtlMs = intField(doc, "ttl_ms");
    const lease = new Lease(this, scope, leaseId, holder, token, grantedTtlMs, sentMs);
    if (token.scope !== scope || token.cluster !== this.cluster) {
      await lease.release().catch(() => undefined);
      throw new BackendUnavailable(`server granted a token for another scope or cluster: ${token}`);
    }
    this.leases.add(lease);
    lease.onEnd = () => this.leases.delete(lease);
    await lease.start();
    return lease;
  }

  /**
   * The acquire's requests: one, or for a wait until granted (`waitMs` null) as many as it takes, each with
   * the wait's ticket: a 409 carrying it means the server's cap ran out and the wait goes on at its place;
   * a lost connection once a request may have been sent (the server restarts) is tried again, pausing up to
   * {@link REQUEUE_PAUSE_MS_MAX}. Returns the grant document and the send time of its request.
   */
  private async acquireRequests(
    scope: string, ttlMs: number, waitMs: number | null, holder: string, signal: AbortSignal | undefined,
  ): Promise<[{ [key: string]: Json }, number]> {
    const ticket = waitMs === null ? randomBytes(24).toString("base64url") : undefined;
    let pauseMs = REQUEUE_PAUSE_MS_MIN;
    let sentOnce = false;
    for (;;) {
      const body = Buffer.from(JSON.stringify({ ttl_ms: ttlMs, wait_ms: waitMs, holder, ...(ticket ? { ticket } : {}) }));
      const sentMs = performance.now();
      try {
        const doc = await this.json("acquire", { scope }, {
          body, contentType: "application/json", timeoutMs: this.http.endpoint.timeoutMs + (waitMs ?? WAIT_MS_MAX),
          signal, context: { scope, waitMs: waitMs ?? 0 },
        });
        return [doc, sentMs];
      } catch (error) {
        if (ticket === undefined) throw error;
        if (error instanceof LockTimeout && error.ticket === ticket) {
          sentOnce = true;
          pauseMs = REQUEUE_PAUSE_MS_MIN;
          continue;
        }
        if (!(error instanceof BackendUnavailable) || (!sentOnce && error.certainNoEffect)) throw error;
        sentOnce = true;
        signal?.throwIfAborted();
        await new Promise((resolve) => setTimeout(resolve, pauseMs));
        signal?.throwIfAborted();
        pauseMs = Math.min(2 * pauseMs, REQUEUE_PAUSE_MS_MAX);
      }
    }
  }

  /**
   * Run `fn` holding `scope`: acquire (waiting up to `waitMs`), keep the lease alive, release at
   * the end. `fn` gets the lease and a signal that is aborted when the lease is lost (its local
   * deadline, a refused renewal) or when `options.signal` aborts; `lock` waits for `fn` to settle.
   * @returns what `fn` returns.
   * @throws LeaseLost when the lease was lost before `fn` settled (`fn`'s own error is its `cause`);
   *   what `fn` throws; and what {@link Client.acquire} throws.
   */
  async lock<T>(scope: string, fn: (lease: Lease, signal: AbortSignal) => Promise<T>, options: AcquireOptions): Promise<T> {
    if (typeof fn !== "function") throw new InvalidArgument("fn", `must be a function, got ${describe(fn)}`);
    const lease = await this.acquire(scope, options);
    const signal = options.signal === undefined ? lease.signal : AbortSignal.any([lease.signal, options.signal]);
    try {
      let outcome: { ok: true; value: T } | { ok: false; error: unknown };
      try {
        lease.raiseIfLost();
        outcome = { ok: true, value: await fn(lease, signal) };
      } catch (error) {
        outcome = { ok: false, error };
      }
      if (lease.lost) {
        const lost = new LeaseLost(lease.scope, lease.token, lease.lostCause);
        if (!outcome.ok) Object.defineProperty(lost, "cause", { value: outcome.error, configurable: true, writable: true });
        throw lost;
      }
      if (!outcome.ok) throw outcome.error;
      return outcome.value;
    } finally {
      await lease.release().catch((error: unknown) => {
        if (!(error instanceof StockadeError)) throw error; // the lease expires by its TTL anyway
      });
    }
  }

  /** A scope's state. The holder's token is shown by value only. */
  async inspect(scope: string): Promise<ScopeInfo> {
    validateScope(scope);
    const doc = await this.json("inspectLock", { scope }, {});
    const holder = doc["holder"];
    const token = doc["token_value"];
    return {
      scope: stringField(doc, "scope"),
      state: stringField(doc, "state"),
      holder: typeof holder === "string" ? holder : null,
      tokenValue: token === null || token === undefined ? null : bigField(doc, "token_value"),
      lastToken: bigField(doc, "last_token"),
      remainingMs: intField(doc, "remaining_ms"),
      waiters: intField(doc, "waiters"),
    };
  }

  /**
   * Who holds `scope` and who waits for it, in the order they will be served: the holder first
   * (`holding: true`), then the waiters, first queued first; at most `limit` (1..1025).
   * @throws InvalidArgument on a bad scope or limit; BackendUnavailable.
   */
  async contenders(scope: string, limit = CONTENDERS_MAX): Promise<Contender[]> {
    validateScope(scope);
    validateInt("limit", limit, 1, CONTENDERS_MAX);
    const doc = await this.json("lockContenders", { scope }, { query: `limit=${limit}` });
    const line = doc["contenders"];
    if (!Array.isArray(line)) throw new BackendUnavailable("server answer lacks 'contenders'");
    return line.map((entry) => {
      const item = asObject(entry);
      if (item === undefined) throw new BackendUnavailable("server sent a contender that is not an object");
      const holding = item["holding"];
      if (typeof holding !== "boolean") throw new BackendUnavailable("server response lacks a valid 'holding'");
      return { holder: stringField(item, "holder"), holding };
    });
  }

  // -- the fenced store ---------------------------------------------------------------------------

  /**
   * Write `value` to `key` of `scope` with `token` (a lease carries its own).
   * @throws StaleToken (`token`, `highWater`) when a newer token has written; TokenMismatch; LeaseLost
   *   when `token` is a lost lease (nothing sent); InvalidArgument; LimitExceeded; BackendUnavailable.
   */
  async put(scope: string, key: string, value: string | Uint8Array,
    options: { token: TokenLike; idempotencyKey?: string }): Promise<WriteResult> {
    validateScope(scope);
    validateKey(key);
    const data = validateValue(value);
    return this.write("put", scope, key, data, options);
  }

  /** Delete `key` of `scope` with `token` (fenced like a put). */
  async delete(scope: string, key: string, options: { token: TokenLike; idempotencyKey?: string }): Promise<WriteResult> {
    validateScope(scope);
    validateKey(key);
    return this.write("deleteKey", scope, key, undefined, options);
  }

  private async write(operation: "put" | "deleteKey", scope: string, key: string, body: Uint8Array | undefined,
    options: { token: TokenLike; idempotencyKey?: string }): Promise<WriteResult> {
    const idempotencyKey = options?.idempotencyKey === undefined ? undefined : validatePrintable("idempotencyKey", options.idempotencyKey);
    const token = this.writeToken(options?.token);
    const headers: Record<string, string> = { "Fencing-Token": token.encoded };
    if (idempotencyKey !== undefined) headers["Idempotency-Key"] = idempotencyKey;
    const doc = await this.json(operation, { scope, key }, {
      ...(body === undefined ? {} : { body, contentType: "application/octet-stream" }),
      headers, context: { scope, token },
    });
    return {
      scope: stringField(doc, "scope"), key: stringField(doc, "key"), tokenValue: bigField(doc, "token_value"),
      highWater: bigField(doc, "high_water"), commitSeq: bigField(doc, "commit_seq"), replayed: doc["replayed"] === true,
    };
  }

  private writeToken(token: TokenLike | undefined): Token {
    if (token === undefined) throw new InvalidArgument("token", "a write needs a token (or the lease)");
    if (token instanceof Lease) token.raiseIfLost(); // K2: a lost lease's writes refuse to start
    return tokenOf(token);
  }

  /** The value of `key`, or null. */
  async get(scope: string, key: string): Promise<Item | null> {
    validateScope(scope);
    validateKey(key);
    const response = await this.call("get", { scope, key }, { ok: [200, 404], context: { scope } });
    if (response.status === 404) return null;
    const tokenValue = response.headers["token-value"];
    const commitSeq = response.headers["commit-seq"];
    if (typeof tokenValue !== "string" || !/^[0-9]{1,19}$/.test(tokenValue)
      || typeof commitSeq !== "string" || !/^[0-9]{1,19}$/.test(commitSeq)) {
      throw new BackendUnavailable("server response lacks Token-Value or Commit-Seq");
    }
    return { scope, key, value: response.body, tokenValue: BigInt(tokenValue), commitSeq: BigInt(commitSeq) };
  }

  /** The scope's high-water mark in the store (0n if never written). */
  async highWater(scope: string): Promise<bigint> {
    validateScope(scope);
    return bigField(await this.json("highWater", { scope }, {}), "high_water");
  }

  /**
   * Apply `steps` to `scope` all or none, in one commit checked against the scope's mark (R6).
   * One request, never resent (if its answer is lost, read the keys back).
   * @throws StaleToken, TokenMismatch (nothing applied); InvalidArgument, LimitExceeded (nothing sent).
   */
  async transaction(scope: string, steps: readonly TxStep[], options: { token: TokenLike }): Promise<TxResult> {
    validateScope(scope);
    if (!Array.isArray(steps)) throw new InvalidArgument("steps", `must be an array, got ${describe(steps)}`);
    if (steps.length > TX_WRITES_MAX) throw new InvalidArgument("steps", `at most ${TX_WRITES_MAX} steps, got ${steps.length}`);
    const docs = steps.map((step, i) => {
      const s = asObject(step as unknown as Json);
      if (s === undefined) throw new InvalidArgument(`steps[${i}]`, "must be {op, key[, value]}");
      const key = (() => {
        try {
          return validateKey(step.key);
        } catch (error) {
          throw error instanceof InvalidArgument ? new InvalidArgument(`steps[${i}].key`, error.reason) : error;
        }
      })();
      if (step.op === "put") {
        return { op: "put", key, value_b64: Buffer.from(validateValue(step.value)).toString("base64") };
      }
      if (step.op === "delete") return { op: "delete", key };
      throw new InvalidArgument(`steps[${i}].op`, `must be "put" or "delete", got ${describe((step as { op: unknown }).op)}`);
    });
    const body = Buffer.from(JSON.stringify({ steps: docs }));
    if (body.length > TX_BODY_BYTES_MAX) {
      throw new InvalidArgument("steps", `the transaction's body would be ${body.length} bytes, over ${TX_BODY_BYTES_MAX}`);
    }
    const token = this.writeToken(options?.token);
    const doc = await this.json("transaction", { scope }, {
      body, contentType: "application/json", headers: { "Fencing-Token": token.encoded }, context: { scope, token },
    });
    const seqs = doc["commit_seqs"];
    if (!Array.isArray(seqs) || seqs.length !== steps.length
      || !seqs.every((s) => typeof s === "bigint" || (typeof s === "number" && Number.isSafeInteger(s)))) {
      throw new BackendUnavailable(`server transaction answer lacks the commit_seq of its ${steps.length} steps`);
    }
    if (stringField(doc, "scope") !== scope) throw new BackendUnavailable("server transaction answer is for another scope");
    return {
      scope, tokenValue: bigField(doc, "token_value"), highWater: bigField(doc, "high_water"),
      commitSeqs: seqs.map((s) => BigInt(s as number | bigint)),
    };
  }

  /** Stop every lease's keepalive (each is then lost, and expires on the server by its TTL) and close connections. */
  close(): void {
    for (const lease of [...this.leases]) lease.orphan();
    this.http.close();
  }
}

/**
 * A granted lease. `token` is what every write carries; `signal` aborts when the lease is lost.
 */
export class Lease {
  private readonly controller = new AbortController();
  private deadlineMs: number;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private released = false;
  private cause = "";
  /** @internal */
  onEnd: () => void = () => undefined;

  /** @internal made by {@link Client.acquire}. */
  constructor(
    private readonly client: Client,
    readonly scope: string,
    private readonly leaseId: string,
    readonly holder: string,
    readonly token: Token,
    readonly ttlMs: number,
    sentMs: number,
  ) {
    this.deadlineMs = sentMs + ttlMs - lostMarginMs(ttlMs);
  }

  /** Aborted (with a {@link LeaseLost}) once the lease is lost. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** True once the lease is known or presumed lost; never turns back to false. */
  get lost(): boolean {
    if (!this.controller.signal.aborted && !this.released && !mutants.noLocalDeadline && performance.now() >= this.deadlineMs) {
      this.markLost("local deadline passed without a successful renewal");
    }
    return this.controller.signal.aborted;
  }

  get lostCause(): string {
    return this.cause;
  }

  /** Milliseconds until the local deadline (0 when lost or released). */
  get remainingMs(): number {
    if (this.lost || this.released) return 0;
    return Math.max(0, Math.floor(this.deadlineMs - performance.now()));
  }

  /** @throws LeaseLost if the lease is lost or released. */
  raiseIfLost(): void {
    if (this.lost) throw new LeaseLost(this.scope, this.token, this.cause);
    if (this.released) throw new LeaseLost(this.scope, this.token, "released");
  }

  /** Write through this lease: its token is carried (and a lost lease sends nothing). */
  put(key: string, value: string | Uint8Array, options: { idempotencyKey?: string } = {}): Promise<WriteResult> {
    return this.client.put(this.scope, key, value, { ...options, token: this });
  }

  delete(key: string, options: { idempotencyKey?: string } = {}): Promise<WriteResult> {
    return this.client.delete(this.scope, key, { ...options, token: this });
  }

  transaction(steps: readonly TxStep[]): Promise<TxResult> {
    return this.client.transaction(this.scope, steps, { token: this });
  }

  private markLost(cause: string): void {
    if (this.controller.signal.aborted) return;
    this.cause = cause;
    this.stopTimers();
    this.controller.abort(new LeaseLost(this.scope, this.token, cause));
  }

  private stopTimers(): void {
    clearTimeout(this.deadlineTimer);
    clearTimeout(this.renewTimer);
    this.deadlineTimer = this.renewTimer = undefined;
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer);
    if (mutants.noLocalDeadline) return;
    this.deadlineTimer = setTimeout(() => {
      if (this.released) return;
      if (performance.now() >= this.deadlineMs) this.markLost("local deadline passed without a successful renewal");
      else this.armDeadline();
    }, Math.max(0, this.deadlineMs - performance.now()) + 1);
  }

  /**
   * @internal Start the keepalive and the deadline timer. A long-polled grant (older than TTL/3) is
   * renewed at once, so that its deadline counts from now rather than from the acquire's send time.
   */
  async start(): Promise<void> {
    const ageMs = performance.now() - (this.deadlineMs - this.ttlMs + lostMarginMs(this.ttlMs));
    if (ageMs > this.ttlMs / 3) {
      try {
        await this.renewNow();
      } catch (error) {
        if (error instanceof BackendUnavailable) { // granted and not lost yet: retry, the deadline decides
          this.armDeadline();
          this.scheduleRenew(RENEW_RETRY_MS);
          return;
        }
        await this.release().catch(() => undefined);
        throw error;
      }
    }
    this.armDeadline();
    this.scheduleRenew(this.ttlMs / 3);
  }

  private scheduleRenew(delayMs: number): void {
    clearTimeout(this.renewTimer);
    this.renewTimer = setTimeout(() => void this.keepalive(), delayMs);
  }

  private async keepalive(): Promise<void> {
    if (this.released || this.lost) return;
    try {
      await this.renew();
      if (!this.released && !this.lost) this.scheduleRenew(this.ttlMs / 3);
    } catch (error) {
      if (error instanceof LeaseLost || this.released) return;
      if (error instanceof InvariantViolation || !(error instanceof StockadeError)) {
        this.markLost(`bug while renewing: ${String(error)}`);
        return;
      }
      // backend trouble: retry until the local deadline decides
      const untilDeadline = mutants.noLocalDeadline ? RENEW_RETRY_MS : this.deadlineMs - performance.now();
      this.scheduleRenew(Math.max(0, Math.min(RENEW_RETRY_MS, untilDeadline)));
    }
  }

  /**
   * Renew now: the local deadline moves to send time + TTL - margin.
   * @throws LeaseLost (including: the server refused the renewal); BackendUnavailable (not lost yet).
   */
  async renew(): Promise<void> {
    this.raiseIfLost();
    await this.renewNow();
  }

  private async renewNow(): Promise<void> {
    const sentMs = performance.now();
    let doc: { [key: string]: Json };
    try {
      doc = await this.client.json("renew", { lease_id: this.leaseId }, {
        body: Buffer.from("{}"), contentType: "application/json", idempotent: true,
        timeoutMs: Math.min(this.clientTimeout(), Math.max(RENEW_TIMEOUT_MS_MIN, Math.floor(this.ttlMs / 3))),
      });
    } catch (error) {
      if (error instanceof NotHolder) {
        this.markLost("the server refused the renewal: lease expired or released");
        throw new LeaseLost(this.scope, this.token, this.cause);
      }
      throw error;
    }
    const renewed = tokenFrom(doc);
    if (!renewed.equals(this.token)) throw new InvariantViolation(`renewal answered another token: ${renewed}`);
    this.deadlineMs = Math.max(this.deadlineMs, sentMs + this.ttlMs - lostMarginMs(this.ttlMs));
    if (this.controller.signal.aborted) throw new LeaseLost(this.scope, this.token, this.cause);
    if (!this.released) this.armDeadline();
  }

  private clientTimeout(): number {
    return this.client.http.endpoint.timeoutMs;
  }

  /** Release (idempotent): stops the keepalive and gives the scope back at once. */
  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    this.stopTimers();
    this.onEnd();
    await this.client.call("release", { lease_id: this.leaseId }, { idempotent: true, ok: [200, 204] });
  }

  /** @internal The client closed: stop renewing; the lease counts as lost. */
  orphan(): void {
    this.stopTimers();
    if (!this.released) this.markLost("the client was closed");
  }
}

/** Subtracted from a lease's local deadline for clock drift and scheduling (K2), as the Python client does. */
export function lostMarginMs(ttlMs: number): number {
  return Math.max(5, Math.floor(ttlMs / 10));
}

function documentOf(response: Response): { [key: string]: Json } {
  let doc: Json;
  try {
    doc = parseJson(response.body.toString("utf8"));
  } catch (error) {
    if (error instanceof JsonError) throw new BackendUnavailable(`server sent a malformed JSON body (HTTP ${response.status})`);
    throw error;
  }
  const object = asObject(doc);
  if (object === undefined) throw new BackendUnavailable(`server sent a JSON body that is not an object (HTTP ${response.status})`);
  return object;
}

function tokenFrom(doc: { [key: string]: Json }): Token {
  try {
    return Token.decode(doc["token"]);
  } catch {
    throw new BackendUnavailable("server sent a malformed 'token'");
  }
}

function stringField(doc: { [key: string]: Json }, name: string): string {
  const value = doc[name];
  if (typeof value !== "string") throw new BackendUnavailable(`server response lacks a valid '${name}'`);
  return value;
}

function intField(doc: { [key: string]: Json }, name: string): number {
  const value = doc[name];
  if (typeof value !== "number" || !Number.isSafeInteger(value)) throw new BackendUnavailable(`server response lacks a valid '${name}'`);
  return value;
}

function bigField(doc: { [key: string]: Json }, name: string): bigint {
  const value = doc[name];
  if (typeof value === "bigint") return value;
  if (typeof value === "number" && Number.isSafeInteger(value)) return BigInt(value);
  throw new BackendUnavailable(`server response lacks a valid '${name}'`);
}
