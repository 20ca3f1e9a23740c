/**
 * The routes this client calls, by OpenAPI operation id (the server's table is
 * `stockade.wire.routes.ROUTES`; `/openapi.json` renders it). The contract test checks each entry
 * against the OpenAPI document, both the one the Python side wrote into the shared vectors and
 * the one a live server serves, so a route that moves fails a test instead of a user.
 */

export interface Route {
  readonly method: "GET" | "POST" | "PUT" | "DELETE";
  /** The path template; `{name}` is one percent-encoded segment. */
  readonly path: string;
}

export const ROUTES = {
  healthz: { method: "GET", path: "/healthz" },
  openapiDocument: { method: "GET", path: "/openapi.json" },
  cluster: { method: "GET", path: "/v1/cluster" },
  inspectLock: { method: "GET", path: "/v1/locks/{scope}" },
  lockContenders: { method: "GET", path: "/v1/locks/{scope}/contenders" },
  acquire: { method: "POST", path: "/v1/locks/{scope}/acquire" },
  renew: { method: "POST", path: "/v1/leases/{lease_id}/renew" },
  release: { method: "DELETE", path: "/v1/leases/{lease_id}" },
  listKeys: { method: "GET", path: "/v1/kv/{scope}" },
  get: { method: "GET", path: "/v1/kv/{scope}/{key}" },
  put: { method: "PUT", path: "/v1/kv/{scope}/{key}" },
  deleteKey: { method: "DELETE", path: "/v1/kv/{scope}/{key}" },
  highWater: { method: "GET", path: "/v1/hwm/{scope}" },
  transaction: { method: "POST", path: "/v1/tx/{scope}" },
} as const satisfies Record<string, Route>;

export type OperationId = keyof typeof ROUTES;

const SEGMENT_SAFE = /^[A-Za-z0-9._~:-]*$/;

/** `value` as one path segment: percent-encoded UTF-8 of everything but `A-Za-z0-9._~-` (as Python's `quote`). */
export function segment(value: string): string {
  if (SEGMENT_SAFE.test(value)) return value;
  return encodeURIComponent(value).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/** The request target of `operation` with `params` filled in, plus `?query`. */
export function target(operation: OperationId, params: Record<string, string> = {}, query = ""): string {
  const route: Route = ROUTES[operation];
  const path = route.path.replace(/\{([a-z_]+)\}/g, (_, name: string) => {
    const value = params[name];
    if (value === undefined) throw new Error(`${operation} needs the path parameter ${name}`);
    return segment(value);
  });
  return query ? `${path}?${query}` : path;
}
