/**
 * Strict JSON for the wire (docs/http-api.md): integers beyond 2**53 stay exact.
 *
 * Token values and high-water marks are integers up to 2**63-1 (an epoch in the high bits), past
 * what a JavaScript number holds exactly, so `JSON.parse` would round them. This parser returns an
 * integer literal (no fraction, no exponent) as a `number` when it is a safe integer and as a
 * `bigint` otherwise; the readers below turn either into the type a field needs. It refuses what the
 * server never sends: duplicate keys, trailing bytes, nesting deeper than {@link JSON_DEPTH_MAX}.
 */

export type Json = null | boolean | number | bigint | string | Json[] | { [key: string]: Json };

/** Nesting deeper than this is refused (no document of the API nests past 4). */
export const JSON_DEPTH_MAX = 64;

/** Why a body is not the JSON this client reads (the caller turns it into its own error). */
export class JsonError extends Error {
  override name = "JsonError";
}

const WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0d]);
const NUMBER_RE = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

/** Parse `text` (a whole document). Throws {@link JsonError}. */
export function parseJson(text: string): Json {
  let at = 0;
  const fail = (what: string): never => {
    throw new JsonError(`${what} at offset ${at}`);
  };
  const skip = (): void => {
    while (at < text.length && WHITESPACE.has(text.charCodeAt(at))) at++;
  };
  const string = (): string => {
    at++; // the opening quote
    let out = "";
    let start = at;
    for (;;) {
      if (at >= text.length) fail("unterminated string");
      const c = text.charCodeAt(at);
      if (c === 0x22) {
        out += text.slice(start, at);
        at++;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c === 0x5c) {
        out += text.slice(start, at);
        const e = text[at + 1] ?? "";
        if (e === "u") {
          const hex = text.slice(at + 2, at + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("bad \\u escape");
          out += String.fromCharCode(parseInt(hex, 16));
          at += 6;
        } else {
          const replaced = ESCAPES[e];
          if (replaced === undefined) fail("bad escape");
          out += replaced;
          at += 2;
        }
        start = at;
        continue;
      }
      at++;
    }
  };
  const value = (depth: number): Json => {
    if (depth > JSON_DEPTH_MAX) fail(`nesting deeper than ${JSON_DEPTH_MAX}`);
    skip();
    const c = text[at];
    if (c === "{") {
      at++;
      const object: { [key: string]: Json } = Object.create(null) as { [key: string]: Json };
      skip();
      if (text[at] === "}") {
        at++;
        return object;
      }
      for (;;) {
        skip();
        if (text[at] !== '"') fail("expected a key");
        const key = string();
        if (Object.prototype.hasOwnProperty.call(object, key)) fail(`duplicate key ${JSON.stringify(key)}`);
        skip();
        if (text[at] !== ":") fail("expected ':'");
        at++;
        object[key] = value(depth + 1);
        skip();
        if (text[at] === ",") {
          at++;
          continue;
        }
        if (text[at] === "}") {
          at++;
          return object;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      at++;
      const array: Json[] = [];
      skip();
      if (text[at] === "]") {
        at++;
        return array;
      }
      for (;;) {
        array.push(value(depth + 1));
        skip();
        if (text[at] === ",") {
          at++;
          continue;
        }
        if (text[at] === "]") {
          at++;
          return array;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c === '"') return string();
    if (text.startsWith("true", at)) {
      at += 4;
      return true;
    }
    if (text.startsWith("false", at)) {
      at += 5;
      return false;
    }
    if (text.startsWith("null", at)) {
      at += 4;
      return null;
    }
    NUMBER_RE.lastIndex = at;
    const match = NUMBER_RE.exec(text);
    if (match === null) return fail("unexpected character");
    at += match[0].length;
    if (match[1] === undefined && match[2] === undefined) {
      const n = Number(match[0]);
      return Number.isSafeInteger(n) ? n : BigInt(match[0]);
    }
    return Number(match[0]);
  };
  const document = value(0);
  skip();
  if (at !== text.length) fail("trailing characters");
  return document;
}

/** A JSON object (not an array, not null), or undefined. */
export function asObject(value: Json | undefined): { [key: string]: Json } | undefined {
  return typeof value === "object" && value !== null && !Array.isArray(value) ? value : undefined;
}
