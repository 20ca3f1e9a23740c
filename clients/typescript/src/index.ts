/**
 * stockade's TypeScript client (Node ≥ 20): leases with fencing tokens over a `stockade serve`,
 * and the fenced store. The PostgreSQL fence helper is `stockade-client/pg`. docs/typescript.md.
 */

export { connect, Client, Lease, lostMarginMs, RENEW_RETRY_MS } from "./client.js";
export type { AcquireOptions, ConnectOptions, Contender, Item, ScopeInfo, TokenLike, TxResult, TxStep, WriteResult } from "./client.js";
export {
  AlreadyApplied,
  BackendUnavailable,
  FenceRejected,
  InvalidArgument,
  InvariantViolation,
  LeaseError,
  LeaseLost,
  LimitExceeded,
  LockTimeout,
  NotHolder,
  StaleToken,
  StockadeError,
  Superseded,
  TokenMismatch,
  Unauthorized,
} from "./errors.js";
export { Token, TOKEN_VALUE_MAX } from "./token.js";
export { errorFor, PROBLEM_TYPE_PREFIX } from "./problems.js";
export { ROUTES, target } from "./routes.js";
export * as limits from "./limits.js";
