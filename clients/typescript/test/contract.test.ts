// One contract, checked from both sides: the vectors the Python side wrote (scripts/ts_contract.py)
// against this client's token parsing, problem mapping and route table.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { errorFor, InvalidArgument, PROBLEM_TYPE_PREFIX, ROUTES, StaleToken, Token } from "../src/index.js";
import { parseJson } from "../src/json.js";
import { type Route } from "../src/routes.js";

interface Contract {
  problemTypePrefix: string;
  tokens: { valid: { encoded: string; cluster: string; scope: string; value: string; signed: boolean; shown: string }[]; invalid: string[] };
  problems: { name: string; status: number; body: string; class: string; fields: Record<string, string | number> }[];
  routes: { operationId: string; method: string; path: string }[];
}

export const contract = JSON.parse(readFileSync(new URL("../../test/contract.json", import.meta.url), "utf8")) as Contract;

/** Where `routes` (this client's) and `openapi` (the server's document) disagree: one line each. */
export function disagreements(routes: Record<string, Route>, openapi: readonly { operationId: string; method: string; path: string }[]): string[] {
  const byId = new Map(openapi.map((r) => [r.operationId, r]));
  const out: string[] = [];
  for (const [operationId, route] of Object.entries(routes)) {
    const theirs = byId.get(operationId);
    if (theirs === undefined) out.push(`${operationId}: not in the OpenAPI document`);
    else if (theirs.method !== route.method || theirs.path !== route.path) {
      out.push(`${operationId}: client ${route.method} ${route.path}, OpenAPI ${theirs.method} ${theirs.path}`);
    }
  }
  return out;
}

/** Where `decode` disagrees with the token vectors: one line each. */
export function tokenMismatches(decode: (text: unknown) => Token): string[] {
  const out: string[] = [];
  for (const v of contract.tokens.valid) {
    try {
      const token = decode(v.encoded);
      const got = [token.encoded, token.cluster, token.scope, String(token.value), token.signed, String(token), JSON.stringify(token)];
      const want = [v.encoded, v.cluster, v.scope, v.value, v.signed, v.shown, JSON.stringify(v.shown)];
      if (JSON.stringify(got) !== JSON.stringify(want)) out.push(`${v.encoded}: ${JSON.stringify(got)}`);
    } catch (error) {
      out.push(`${v.encoded}: refused (${String(error)})`);
    }
  }
  for (const text of contract.tokens.invalid) {
    try {
      decode(text);
      out.push(`${JSON.stringify(text)}: accepted`);
    } catch (error) {
      if (!(error instanceof InvalidArgument)) out.push(`${JSON.stringify(text)}: ${String(error)}`);
    }
  }
  return out;
}

/** Where `map` disagrees with the problem vectors (class and fields): one line each. */
export function problemMismatches(map: typeof errorFor): string[] {
  const out: string[] = [];
  for (const p of contract.problems) {
    const error = map(p.status, p.body, { scope: "reports", waitMs: 250 }) as unknown as Record<string, unknown>;
    const name = (error as object).constructor.name;
    if (name !== p.class) out.push(`${p.name}: ${name}, not ${p.class}`);
    for (const [field, expected] of Object.entries(p.fields)) {
      const actual = error[field];
      const same = field === "token" ? String(actual) === expected
        : typeof actual === "bigint" ? actual === BigInt(expected) : actual === expected;
      if (!same) out.push(`${p.name}: ${field} ${String(actual)}, not ${expected}`);
    }
  }
  return out;
}

test("every token vector: the valid ones decode to the reference's fields (shown without MAC), the invalid are refused", () => {
  assert.ok(contract.tokens.valid.length >= 5 && contract.tokens.invalid.length >= 20);
  assert.deepEqual(tokenMismatches((text) => Token.decode(text)), []);
  for (const bad of [undefined, null, 17, {}, "x".repeat(10_000)]) assert.throws(() => Token.decode(bad), InvalidArgument);
});

test("control: a decoder that lets any key id through is caught by the vectors", () => {
  const lax = (text: unknown): Token => Token.decode(typeof text === "string" ? text.replace(/\.1A2B3C4D\./, ".1a2b3c4d.") : text);
  assert.equal(tokenMismatches(lax).length, 1);
});

test("every problem document maps to the class and fields the Python client raises", () => {
  assert.equal(PROBLEM_TYPE_PREFIX, contract.problemTypePrefix);
  assert.ok(contract.problems.length >= 20);
  assert.deepEqual(problemMismatches(errorFor), []);
  assert.ok(errorFor(409, contract.problems[0]!.body) instanceof StaleToken);
});

test("control: a mapping that reads a problem by its status alone is caught by the vectors", () => {
  const byStatus: typeof errorFor = (status, _body, context) => errorFor(status, "", context);
  assert.ok(problemMismatches(byStatus).length >= 8);
});

test("a high-water mark above 2**53 stays exact (the JSON parser keeps big integers as bigint)", () => {
  assert.deepEqual(parseJson('{"a": 9223372036854775807, "b": 12, "c": 1.5}'), Object.assign(Object.create(null), {
    a: 9223372036854775807n, b: 12, c: 1.5,
  }));
  for (const bad of ['{"a":1,"a":2}', "[1,]", "{} x", "NaN", '"\u0001"', "[".repeat(100) + "]".repeat(100)]) {
    assert.throws(() => parseJson(bad), { name: "JsonError" }, bad);
  }
});

test("the client's routes agree with the OpenAPI document the Python side rendered", () => {
  assert.deepEqual(disagreements(ROUTES, contract.routes), []);
});

test("control: a client route that moved is reported", () => {
  const moved = { ...ROUTES, renew: { method: "POST", path: "/v1/leases/{lease_id}/refresh" } } as Record<string, Route>;
  const renamed = { ...ROUTES, fetchValue: { method: "GET", path: "/v1/kv/{scope}/{key}" } } as Record<string, Route>;
  assert.equal(disagreements(moved, contract.routes).length, 1);
  assert.equal(disagreements(renamed, contract.routes).length, 1);
});
