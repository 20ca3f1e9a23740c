/**
 * Fence your own PostgreSQL from Node (docs/typescript.md; the SQL side is docs/fence-postgres.md).
 *
 * `fenced(client, token, async (tx) => …)` runs `BEGIN`, then `SELECT stockade.fence($1, $2)` as
 * the first statement of the transaction, then your block, then `COMMIT`: the scope's high-water
 * mark moves in the same commit as your rows, and the scope's lock is held until it (R1, R6). The
 * database must have the fence installed (`stockade.resources.postgres.install` from Python, with
 * the coordinator's keys). `client` is a node-postgres `Client` or a pool's client
 * (`await pool.connect()`), not the pool: a transaction needs one connection. This module imports
 * nothing from `pg`: it takes any object with its `query` method.
 *
 * The function's errors, as typed errors (nothing of the block is applied in any of them):
 *
 *     SQLSTATE  meaning                                             thrown as
 *     SKF01     reason=stale high_water=<n> …                       StaleToken(token, highWater)
 *     SKF01     reason=wrong-scope | wrong-cluster | forged         TokenMismatch(token, reason)
 *     SKF04     the operation id was applied before (opId)          AlreadyApplied
 *     22023     a malformed token                                   InvalidArgument("token")
 *     57P01     the session was ended inside the transaction: a     Superseded (a StaleToken)
 *               newer token superseded this paused holder
 *     (a connection failure)                                        BackendUnavailable (outcome unknown)
 *
 * After `Superseded` or `BackendUnavailable` the client's connection is gone: connect a new client.
 * `fenced` leaves its 'error' listener on the dead one, so the events node-postgres still emits for
 * it cannot crash the process as unhandled 'error' events.
 */

import {
  AlreadyApplied,
  BackendUnavailable,
  InvalidArgument,
  StaleToken,
  Superseded,
  TokenMismatch,
} from "./errors.js";
import { validatePrintable, validateScope } from "./limits.js";
import { Token } from "./token.js";

/** What `fenced` needs of a node-postgres client. */
export interface PgClient {
  query(text: string, values?: unknown[]): Promise<unknown>;
  on?(event: "error", listener: (error: Error) => void): unknown;
  off?(event: "error", listener: (error: Error) => void): unknown;
}

/** A rejection of `stockade.fence` (docs/fence-postgres.md). */
export const REJECT_SQLSTATE = "SKF01";
export const ALREADY_APPLIED_SQLSTATE = "SKF04";
export const SUPERSEDED_SQLSTATE = "57P01";
const DETAIL_RE = /^reason=(stale|wrong-scope|wrong-cluster|forged) high_water=(\d+) cluster=([0-9a-f]{16}) detail=([a-z-]*)$/;

export interface FencedOptions {
  /** The scope written (default: the token's own; another one is refused, rule R2). */
  scope?: string;
  /** Make the block an operation that applies once (R3): `stockade.fence_op`. */
  opId?: string;
}

interface PgError extends Error {
  code?: string;
  detail?: string;
}

/**
 * Run `fn` in a transaction of `client` admitted by `token`; commit when it returns.
 * @returns what `fn` returns, once committed.
 * @throws StaleToken (Superseded), TokenMismatch, AlreadyApplied, InvalidArgument, BackendUnavailable;
 *   and what `fn` throws (the transaction rolled back, the mark not raised).
 */
export async function fenced<T>(
  client: PgClient,
  token: Token | string | { readonly token: Token },
  fn: (tx: PgClient) => Promise<T>,
  options: FencedOptions = {},
): Promise<T> {
  if (typeof client !== "object" || client === null || typeof client.query !== "function") {
    throw new InvalidArgument("client", "must be a node-postgres Client (or a pool's client)");
  }
  if ("totalCount" in client && "idleCount" in client) {
    throw new InvalidArgument("client", "pass a client of the pool (await pool.connect()), not the pool: a transaction needs one connection");
  }
  if (typeof fn !== "function") throw new InvalidArgument("fn", "must be an async function");
  const fencing = token instanceof Token ? token : typeof token === "string" ? Token.decode(token)
    : typeof token === "object" && token !== null && token.token instanceof Token ? token.token
    : Token.decode(token);
  const scope = options.scope === undefined ? fencing.scope : validateScope(options.scope);
  if (scope !== fencing.scope) {
    throw new InvalidArgument("scope", `the token is for scope ${fencing.scope}, not ${scope} (R2)`);
  }
  const opId = options.opId === undefined ? undefined : validatePrintable("opId", options.opId);
  // A session ended while idle in the transaction reaches node-postgres as an 'error' event of the
  // client (which would crash the process unhandled), and the next query fails as "terminated".
  let ended: PgError | undefined;
  const onError = (error: Error): void => {
    ended ??= error;
  };
  client.on?.("error", onError);
  let began = false;
  let dead = false;
  try {
    await client.query("BEGIN");
    began = true;
    if (opId === undefined) await client.query("SELECT stockade.fence($1, $2)", [fencing.encoded, scope]);
    else await client.query("SELECT stockade.fence_op($1, $2, $3)", [fencing.encoded, scope, opId]);
    const result = await fn(client);
    await client.query("COMMIT");
    began = false;
    return result;
  } catch (error) {
    if (began) await client.query("ROLLBACK").catch(() => undefined);
    const translated = translate(error, ended, fencing, scope, opId);
    // A connection that ended (Superseded, BackendUnavailable) still emits 'error' events after this
    // returns ("Connection terminated unexpectedly" once the socket closes): the listener stays on the
    // dead client, so they cannot crash the process. The client is unusable: connect a new one.
    dead = translated instanceof Superseded || translated instanceof BackendUnavailable;
    throw translated;
  } finally {
    if (!dead) client.off?.("error", onError);
  }
}

function translate(error: unknown, ended: PgError | undefined, token: Token, scope: string, opId: string | undefined): unknown {
  const pgError = error as PgError;
  const code = pgError?.code ?? ended?.code;
  if (code === REJECT_SQLSTATE) {
    const match = DETAIL_RE.exec(pgError.detail ?? "");
    if (match !== null) {
      const [, reason, highWater] = match as unknown as [string, string, string];
      if (reason === "stale") return new StaleToken(token, BigInt(highWater));
      return new TokenMismatch(token, reason);
    }
  }
  if (code === ALREADY_APPLIED_SQLSTATE && opId !== undefined) {
    return new AlreadyApplied(scope, opId, BigInt((pgError.detail ?? "").replace(/^token_value=/, "") || "0"));
  }
  if (code === "22023") return new InvalidArgument("token", pgError.message);
  if (code === SUPERSEDED_SQLSTATE) {
    // The session was ended before the commit completed: nothing of it was applied. The fence ends one
    // only for a newer token; a server shutdown reads the same, and nothing was applied either.
    return new Superseded(token, -1n, `superseded: ${(ended ?? pgError).message}`);
  }
  if (ended !== undefined || isConnectionFailure(pgError)) {
    return Object.assign(new BackendUnavailable(`postgres: ${pgError?.message ?? String(error)}`), { cause: error });
  }
  return error; // the block's own error
}

function isConnectionFailure(error: PgError | undefined): boolean {
  if (error === undefined || error === null) return false;
  const code = error.code ?? "";
  if (code.startsWith("08") || code === "57P02" || code === "57P03" || code === "25P03" || code === "25P04") return true;
  return /ECONNRESET|ECONNREFUSED|EPIPE|Connection terminated|not queryable/i.test(`${code} ${error.message}`);
}
