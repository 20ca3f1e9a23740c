/**
 * Problem documents (RFC 9457) back into typed errors: the client half of
 * `stockade.wire.problems.error_for`, mapped by the code that ends the problem's `type`, and by the
 * status when an answer has none (a proxy, an older server). The shared vectors hold the two
 * halves to the same table.
 *
 *     code                     status  thrown as
 *     invalid-argument         400/422 InvalidArgument(field)
 *     limit-exceeded           429/413 LimitExceeded(limit)
 *     stale-token              409     StaleToken(token, highWater)
 *     token-mismatch           409     TokenMismatch(token, reason)
 *     lock-timeout             409     LockTimeout(scope, waitMs)
 *     not-holder               410     NotHolder
 *     unauthorized             401/403 Unauthorized
 *     backend-unavailable      503     BackendUnavailable
 *     invariant-violation      500     InvariantViolation (a bug: not a StockadeError)
 *     not-found, method-not-allowed, unsupported-media-type: InvalidArgument (a wrong base path, an older server)
 */

import {
  BackendUnavailable,
  InvalidArgument,
  InvariantViolation,
  LimitExceeded,
  LockTimeout,
  NotHolder,
  StaleToken,
  type StockadeError,
  TokenMismatch,
  Unauthorized,
} from "./errors.js";
import { asObject, type Json, parseJson } from "./json.js";
import { Token } from "./token.js";

export const PROBLEM_TYPE_PREFIX = "https://stockade.invalid/problems/";

/** What the caller asked about, for the fields a document does not carry. */
export interface ProblemContext {
  scope?: string;
  waitMs?: number;
  token?: Token;
}

function documentOf(body: string): { [key: string]: Json } {
  try {
    return asObject(body ? parseJson(body) : {}) ?? {};
  } catch {
    return {};
  }
}

/** The typed error for a problem answer of status `status` and body `body`. */
export function errorFor(status: number, body: string, context: ProblemContext = {}): StockadeError | InvariantViolation {
  const doc = documentOf(body);
  const type = doc["type"];
  const code = typeof type === "string" && type.startsWith(PROBLEM_TYPE_PREFIX) ? type.slice(PROBLEM_TYPE_PREFIX.length) : "";
  const detailField = doc["detail"] ?? doc["title"];
  const detail = typeof detailField === "string" && detailField ? detailField : `HTTP ${status}`;
  let error: StockadeError | InvariantViolation;
  if (code === "stale-token") {
    const mark = doc["high_water"];
    let token: Token | null = context.token ?? null;
    try {
      token = Token.decode(doc["token"]);
    } catch {
      // the document's token is missing or malformed: keep the one that was sent
    }
    error = new StaleToken(token, typeof mark === "number" || typeof mark === "bigint" ? BigInt(mark) : -1n, detail);
  } else if (code === "token-mismatch") {
    const reason = doc["reason"];
    error = new TokenMismatch(context.token ?? null, typeof reason === "string" && reason ? reason : "mismatch", detail);
  } else if (code === "lock-timeout") {
    const scope = doc["scope"];
    const ticket = doc["ticket"];
    error = new LockTimeout(context.scope ?? (typeof scope === "string" ? scope : ""), context.waitMs ?? 0,
      typeof ticket === "string" ? ticket : undefined);
  } else if (code === "not-holder") {
    error = new NotHolder(detail);
  } else if (code === "invalid-argument") {
    const field = doc["field"];
    error = new InvalidArgument(typeof field === "string" && field ? field : "request", detail);
  } else if (code === "limit-exceeded") {
    const limit = doc["limit"];
    error = new LimitExceeded(typeof limit === "string" && limit ? limit : `http_${status}`, detail);
  } else if (code === "unauthorized" || status === 401 || status === 403) {
    error = new Unauthorized(
      status === 403
        ? `the server refused the credentials (HTTP 403): the auth token does not cover this scope or route (${detail})`
        : `the server refused the credentials (HTTP ${status}): pass connect(url, {authToken}) a token of its --auth-tokens file`,
    );
  } else if (code === "invariant-violation") {
    error = new InvariantViolation(`server: ${detail}`);
  } else if (code === "backend-unavailable" || status >= 500) {
    error = new BackendUnavailable(`server: ${detail} (HTTP ${status})`);
  } else if (status === 410) {
    error = new NotHolder(detail);
  } else if (status === 413) {
    error = new LimitExceeded(`http_${status}`, detail);
  } else if ([400, 404, 405, 415, 422].includes(status)) {
    error = new InvalidArgument("request", `server answered HTTP ${status}: ${detail}`);
  } else {
    error = new BackendUnavailable(`unexpected HTTP ${status}: ${detail}`);
  }
  if (!(error instanceof InvariantViolation)) {
    error.status = status;
    error.problem = doc;
  }
  return error;
}
