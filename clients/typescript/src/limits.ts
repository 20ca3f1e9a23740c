/**
 * Every bound this client checks before sending, named with its unit last (the server's
 * `stockade.core.limits`; docs/http-api.md). A bad argument throws {@link InvalidArgument} here,
 * before any request, as the Python client does; the server would refuse it anyway.
 */

import { InvalidArgument } from "./errors.js";

export const TTL_MS_MIN = 100;
export const TTL_MS_MAX = 3_600_000;
export const WAIT_MS_MIN = 0;
export const WAIT_MS_MAX = 300_000;
export const SCOPE_BYTES_MAX = 200;
export const KEY_BYTES_MAX = 1024;
/** The store's default value bound (a server may be configured lower or higher). */
export const VALUE_BYTES_MAX = 1024 * 1024;
export const HOLDER_BYTES_MAX = 200;
export const IDEMPOTENCY_KEY_BYTES_MAX = 200;
export const OP_ID_BYTES_MAX = 200;
/** Steps in one transaction (`stockade.core.limits.TX_WRITES_MAX`). */
export const TX_WRITES_MAX = 10_000;
/** The most contenders one `contenders` call lists: a holder and a full queue (1,024 waiters). */
export const CONTENDERS_MAX = 1025;
/** A transaction's JSON body (`stockade.wire.codecs.TX_BODY_BYTES_MAX`). */
export const TX_BODY_BYTES_MAX = 4 * 1024 * 1024;
/** Default deadline of one request (an acquire gets its `waitMs` on top: the server long-polls). */
export const TIMEOUT_MS_DEFAULT = 10_000;
export const TIMEOUT_MS_MAX = 600_000;
/** Default bound on an answer's body: a value of the store's bound with room to spare. */
export const RESPONSE_BYTES_MAX_DEFAULT = 4 * 1024 * 1024;
export const RESPONSE_BYTES_MAX_CEILING = 64 * 1024 * 1024;

export const SCOPE_RE = /^[A-Za-z0-9._:-]{1,200}$/;
const PRINTABLE_RE = /^[\x21-\x7e]+$/;
const LONE_SURROGATE_RE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** `value` if it is a safe integer in `low..high`. */
export function validateInt(field: string, value: unknown, low: number, high: number): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    throw new InvalidArgument(field, `must be an integer, got ${describe(value)}`);
  }
  if (value < low || value > high) throw new InvalidArgument(field, `must be in ${low}..${high}, got ${value}`);
  return value;
}

/** A scope: 1..200 characters of `[A-Za-z0-9._:-]`, and not `.` or `..` (a path step, not a name). */
export function validateScope(scope: unknown, field = "scope"): string {
  if (typeof scope !== "string") throw new InvalidArgument(field, `must be a string, got ${describe(scope)}`);
  if (scope === "." || scope === "..") throw new InvalidArgument(field, `must not be '${scope}' (a path step, not a name)`);
  if (!SCOPE_RE.test(scope)) {
    if (scope.length < 1 || scope.length > SCOPE_BYTES_MAX) {
      throw new InvalidArgument(field, `must be 1..${SCOPE_BYTES_MAX} bytes, got ${scope.length}`);
    }
    throw new InvalidArgument(field, "may contain only A-Z a-z 0-9 . _ : -");
  }
  return scope;
}

function text(field: string, value: unknown, bytesMax: number): string {
  if (typeof value !== "string") throw new InvalidArgument(field, `must be a string, got ${describe(value)}`);
  const size = Buffer.byteLength(value, "utf8");
  if (size < 1 || size > bytesMax) throw new InvalidArgument(field, `must be 1..${bytesMax} bytes, got ${size}`);
  return value;
}

/** A store key: 1..1024 bytes of UTF-8, no NUL, no lone surrogate. */
export function validateKey(key: unknown): string {
  const value = text("key", key, KEY_BYTES_MAX);
  if (value.includes("\0")) throw new InvalidArgument("key", "must not contain NUL");
  if (LONE_SURROGATE_RE.test(value)) throw new InvalidArgument("key", "must be valid UTF-8 (no lone surrogates)");
  return value;
}

/** A holder name, an idempotency key or an operation id: 1..200 printable ASCII characters, no spaces. */
export function validatePrintable(field: string, value: unknown, bytesMax = HOLDER_BYTES_MAX): string {
  const checked = text(field, value, bytesMax);
  if (!PRINTABLE_RE.test(checked)) throw new InvalidArgument(field, "must be printable ASCII without spaces");
  return checked;
}

/** A value: a string (stored as UTF-8) or bytes, at most `bytesMax`. */
export function validateValue(value: unknown, bytesMax = VALUE_BYTES_MAX): Uint8Array {
  let bytes: Uint8Array;
  if (typeof value === "string") {
    if (LONE_SURROGATE_RE.test(value)) throw new InvalidArgument("value", "must be valid UTF-8 (no lone surrogates)");
    bytes = Buffer.from(value, "utf8");
  } else if (value instanceof Uint8Array) {
    bytes = value;
  } else {
    throw new InvalidArgument("value", `must be a string or a Uint8Array, got ${describe(value)}`);
  }
  if (bytes.length > bytesMax) throw new InvalidArgument("value", `must be at most ${bytesMax} bytes, got ${bytes.length}`);
  return bytes;
}

export function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "number") return Number.isInteger(value) ? `${value} (unsafe)` : String(value);
  if (typeof value === "object") return value.constructor?.name ?? "object";
  return typeof value;
}
