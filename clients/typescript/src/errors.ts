/**
 * The errors this client throws: the tree of stockade's Python client, mapped from the server's
 * problem catalogue (docs/http-api.md, "Problem types").
 *
 *     StockadeError                operating errors: handle them
 *     ├── InvalidArgument          a bad value, caught here or by the server (nothing changed)
 *     ├── LimitExceeded            a named bound was reached (nothing changed)
 *     ├── FenceRejected            the resource refused a write (nothing changed)
 *     │   ├── StaleToken           token < high-water mark (`token`, `highWater`)
 *     │   │   └── Superseded       PostgreSQL ended the session of a paused lower holder
 *     │   └── TokenMismatch        a token of another scope or cluster, or forged (`reason`)
 *     ├── AlreadyApplied           PostgreSQL: the operation id was applied before
 *     ├── LeaseError
 *     │   ├── NotHolder            the lease is gone on the server (expired, released, unknown)
 *     │   ├── LeaseLost            this client gave the lease up as lost (local deadline, K2)
 *     │   └── LockTimeout          still held when the wait ran out
 *     ├── Unauthorized             the server refused the credentials
 *     └── BackendUnavailable       I/O failed or timed out; the outcome may be unknown
 *
 *     InvariantViolation           a bug (the server's 500 invariant-violation): not a StockadeError
 */

import type { Token } from "./token.js";

/** Root of every error stockade throws on purpose. `code` is the problem type's code. */
export class StockadeError extends Error {
  readonly code: string = "stockade-error";
  /** The HTTP status, when the error came from a server's answer. */
  status: number | undefined = undefined;
  /** The server's problem document, when the error came from one. */
  problem: Readonly<Record<string, unknown>> | undefined = undefined;
  override get name(): string {
    return this.constructor.name;
  }
}

/** The caller passed a value outside its documented domain; `field` names it. */
export class InvalidArgument extends StockadeError {
  override readonly code: string = "invalid-argument";
  constructor(
    readonly field: string,
    readonly reason: string,
  ) {
    super(`${field}: ${reason}`);
  }
}

/** A named bound was reached (`limit`, e.g. `ttl_ms`, `http_413`). */
export class LimitExceeded extends StockadeError {
  override readonly code: string = "limit-exceeded";
  constructor(
    readonly limit: string,
    message: string,
  ) {
    super(message);
  }
}

/** The resource refused a write; nothing of it was applied. */
export class FenceRejected extends StockadeError {
  override readonly code: string = "fence-rejected";
}

/**
 * A write whose token is below the scope's high-water mark (rule R1). Never retry it with the same
 * token (K3): acquire again and reconcile.
 */
export class StaleToken extends FenceRejected {
  override readonly code: string = "stale-token";
  constructor(
    /** The refused token (the server shows it without its MAC), or null if unknown. */
    readonly token: Token | null,
    /** The scope's mark that refused it (-1n when the server did not say). */
    readonly highWater: bigint,
    message?: string,
  ) {
    super(message ?? `stale token ${token === null ? "?" : token.value} < high-water mark ${highWater}`);
  }
}

/** PostgreSQL ended this paused transaction's session for a newer token; nothing of it was applied. */
export class Superseded extends StaleToken {
  override readonly code: string = "superseded";
}

/** A token of another scope or cluster, or a forged one (`reason`: wrong-scope, wrong-cluster, forged …). */
export class TokenMismatch extends FenceRejected {
  override readonly code: string = "token-mismatch";
  constructor(
    readonly token: Token | null,
    readonly reason: string,
    message?: string,
  ) {
    super(message ?? `token refused: ${reason}`);
  }
}

/** PostgreSQL: the operation id was applied by a committed transaction (R3); nothing applied now. */
export class AlreadyApplied extends StockadeError {
  override readonly code: string = "already-applied";
  constructor(
    readonly scope: string,
    readonly opId: string,
    readonly tokenValue: bigint,
  ) {
    super(`operation ${opId} of scope ${scope} was applied before (token ${tokenValue})`);
  }
}

export class LeaseError extends StockadeError {
  override readonly code: string = "lease-error";
}

/** The server no longer knows the lease as held: expired, released, or unknown. */
export class NotHolder extends LeaseError {
  override readonly code: string = "not-holder";
}

/** This client gave the lease up: a renewal was refused, or its local deadline passed (K2). */
export class LeaseLost extends LeaseError {
  override readonly code: string = "lease-lost";
  constructor(
    readonly scope: string,
    readonly token: Token,
    /** Why the lease was given up. */
    readonly reason: string,
  ) {
    super(`lease on ${scope} (token ${token.value}) lost: ${reason}`);
  }
}

/**
 * The scope was still held when `waitMs` ran out. `ticket`: the queue ticket a server's answer carries for a
 * wait until granted (its per-request cap ran out; the client sends it again and the wait goes on).
 */
export class LockTimeout extends LeaseError {
  override readonly code: string = "lock-timeout";
  constructor(
    readonly scope: string,
    readonly waitMs: number,
    readonly ticket?: string,
  ) {
    super(`${scope} still held after waiting ${waitMs} ms`);
  }
}

/** The server refused the credentials (401), or they do not cover this scope or route (403). */
export class Unauthorized extends StockadeError {
  override readonly code: string = "unauthorized";
}

/**
 * The server could not be reached, did not answer in time, or answered something that is not the
 * API. `certainNoEffect` is true when the request surely did not arrive (connect failed).
 */
export class BackendUnavailable extends StockadeError {
  override readonly code: string = "backend-unavailable";
  constructor(
    message: string,
    readonly certainNoEffect = false,
  ) {
    super(message);
  }
}

/** A bug (the server's `invariant-violation`): outside the StockadeError tree, so never swallowed. */
export class InvariantViolation extends Error {
  readonly code = "invariant-violation";
  override name = "InvariantViolation";
}
