/**
 * Fencing tokens as the server hands them out (docs/tokens.md):
 *
 *     stk2.<cluster>.<value>.<kid>.<mac>.<scope>     signed: what a grant carries, and what writes send
 *     stk1.<cluster>.<value>.<scope>                 unsigned: what reads and problem documents show
 *
 * The encoded string is opaque: this client passes it back verbatim in `Fencing-Token`, and only
 * the resource verifies the MAC. The fields are decoded for display and ordering (`value` is a
 * bigint: values reach 2**63-1). Decoding checks the shape the Python side checks (the shared
 * vectors hold both to it), and `toString()` never shows the MAC, so logging a token leaks no
 * write capability.
 */

import { InvalidArgument } from "./errors.js";
import { SCOPE_RE } from "./limits.js";

const CLUSTER_RE = /^[0-9a-f]{16}$/;
const VALUE_RE = /^[1-9][0-9]{0,18}$/;
const KID_RE = /^[0-9a-f]{8}$/;
const MAC_RE = /^[A-Za-z0-9_-]{22}$/;
/** Token values are 1..2**63-1. */
export const TOKEN_VALUE_MAX = 2n ** 63n - 1n;
/** The longest encoded token: stk2, 16 + 19 + 8 + 22 + 200 characters of fields, 5 dots. */
export const ENCODED_CHARS_MAX = 4 + 16 + 19 + 8 + 22 + 200 + 5;
const SHAPE = "must look like stk2.<cluster>.<value>.<kid>.<mac>.<scope>";

export class Token {
  private constructor(
    /** The encoded token, exactly as the server sent it (MAC included when signed). */
    readonly encoded: string,
    /** The coordinator cluster's id (16 lowercase hex digits). */
    readonly cluster: string,
    readonly scope: string,
    /** The token's value: strictly increasing per scope. */
    readonly value: bigint,
    /** Whether it carries a key id and a MAC (not whether they are right: only a resource knows). */
    readonly signed: boolean,
  ) {}

  /**
   * Parse an encoded token.
   * @throws InvalidArgument when `text` is not a well-formed token.
   */
  static decode(text: unknown): Token {
    if (typeof text !== "string") throw new InvalidArgument("token", `must be an encoded token string, got ${typeof text}`);
    if (text.length > ENCODED_CHARS_MAX) throw new InvalidArgument("token", `must be at most ${ENCODED_CHARS_MAX} characters`);
    let cluster: string, value: string, scope: string;
    let signed = false;
    if (text.startsWith("stk2.")) {
      const parts = splitLeft(text, 6);
      if (parts === null) throw new InvalidArgument("token", SHAPE);
      const [, c, v, kid, mac, s] = parts as [string, string, string, string, string, string];
      if (!KID_RE.test(kid)) throw new InvalidArgument("token", "key id must be 8 lowercase hex digits");
      if (!MAC_RE.test(mac)) throw new InvalidArgument("token", "mac must be 22 base64url characters");
      [cluster, value, scope, signed] = [c, v, s, true];
    } else {
      const parts = splitLeft(text, 4);
      if (parts === null || parts[0] !== "stk1") throw new InvalidArgument("token", SHAPE);
      [, cluster, value, scope] = parts as [string, string, string, string];
    }
    if (!VALUE_RE.test(value) || BigInt(value) > TOKEN_VALUE_MAX) {
      throw new InvalidArgument("token", "value must be a decimal integer in 1..2**63-1");
    }
    if (!CLUSTER_RE.test(cluster)) throw new InvalidArgument("token", "must be 16 lowercase hex digits");
    if (!SCOPE_RE.test(scope) || scope === "." || scope === "..") {
      throw new InvalidArgument("token", "scope must be 1..200 characters of A-Z a-z 0-9 . _ : -");
    }
    return new Token(text, cluster, scope, BigInt(value), signed);
  }

  /** The token without its MAC (`stk1...`): safe to log, refused by a resource that checks MACs. */
  toString(): string {
    return `stk1.${this.cluster}.${this.value}.${this.scope}`;
  }

  /** JSON shows the unsigned form too: a token in a log line is never a write capability. */
  toJSON(): string {
    return this.toString();
  }

  /** The same cluster, scope and value (the MAC is not part of a token's identity). */
  equals(other: Token): boolean {
    return this.cluster === other.cluster && this.scope === other.scope && this.value === other.value;
  }
}

/** `text` split at its first `count - 1` dots (the last field, the scope, may hold dots), or null. */
function splitLeft(text: string, count: number): string[] | null {
  const parts: string[] = [];
  let start = 0;
  for (let i = 0; i < count - 1; i++) {
    const dot = text.indexOf(".", start);
    if (dot < 0) return null;
    parts.push(text.slice(start, dot));
    start = dot + 1;
  }
  parts.push(text.slice(start));
  return parts;
}
