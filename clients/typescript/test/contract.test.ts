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

test("every valid token vector decodes to the reference's fields, and shows without its MAC", () => {
  assert.ok(contract.tokens.valid.length >= 5);
  for (const v of contract.tokens.valid) {
    const token = Token.decode(v.encoded);
    assert.equal(token.encoded, v.encoded);
    assert.equal(token.cluster, v.cluster);
    assert.equal(token.scope, v.scope);
    assert.equal(token.value, BigInt(v.value));
    assert.equal(token.signed, v.signed);
    assert.equal(String(token), v.shown);
    assert.equal(JSON.stringify({ token }), JSON.stringify({ token: v.shown }));
  }
});

test("every invalid token vector is refused with InvalidArgument", () => {
  assert.ok(contract.tokens.invalid.length >= 20);
  for (const text of contract.tokens.invalid) {
    assert.throws(() => Token.decode(text), InvalidArgument, JSON.stringify(text));
  }
  for (const bad of [undefined, null, 17, {}, "x".repeat(10_000)]) assert.throws(() => Token.decode(bad), InvalidArgument);
});

test("every problem document maps to the class and fields the Python client raises", () => {
  assert.equal(PROBLEM_TYPE_PREFIX, contract.problemTypePrefix);
  assert.ok(contract.problems.length >= 20);
  for (const p of contract.problems) {
    const error = errorFor(p.status, p.body, { scope: "reports", waitMs: 250 }) as unknown as Record<string, unknown>;
    assert.equal((error as object).constructor.name, p.class, p.name);
    for (const [field, expected] of Object.entries(p.fields)) {
      const actual = error[field];
      if (field === "token") assert.equal(String(actual), expected, p.name);
      else if (typeof actual === "bigint") assert.equal(actual, BigInt(expected), p.name);
      else assert.equal(actual, expected, `${p.name}: ${field}`);
    }
    if (p.class === "StaleToken") assert.ok(error instanceof StaleToken);
  }
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
