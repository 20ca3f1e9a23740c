/**
 * Requests to one `stockade serve` over HTTP/1.1 keep-alive (node:http), every one bounded: a
 * deadline per request (an acquire gets its `waitMs` on top, the server long-polls) and a cap on
 * the answer's bytes. A connection failure or a timeout is {@link BackendUnavailable}; the caller
 * maps a problem answer with `errorFor`.
 *
 * A reused keep-alive connection that the server closed meanwhile fails before any byte of the
 * answer: such a request is sent again once on a fresh connection, but only when it may safely
 * arrive twice (GET, renew, release). An acquire or a store write is never sent twice.
 */

import http from "node:http";
import https from "node:https";

import { BackendUnavailable } from "./errors.js";

export interface Endpoint {
  readonly url: URL;
  readonly authToken: string | undefined;
  readonly timeoutMs: number;
  readonly responseBytesMax: number;
}

export interface RequestOptions {
  body?: Uint8Array;
  contentType?: string;
  headers?: Record<string, string>;
  timeoutMs: number;
  /** May the request arrive twice (default: GET only)? */
  idempotent?: boolean;
  /** Aborting it closes the connection (a waiting acquire leaves the server's queue). */
  signal?: AbortSignal | undefined;
}

export interface Response {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: Buffer;
}

/** Keep-alive connections kept idle per client. */
export const IDLE_CONNECTIONS_MAX = 8;

class Attempt extends Error {
  constructor(
    readonly failure: Error,
    readonly fresh: boolean,
  ) {
    super(failure.message);
  }
}

export class HttpClient {
  private readonly agent: http.Agent;
  private readonly basePath: string;
  private closed = false;

  constructor(readonly endpoint: Endpoint) {
    const Agent = endpoint.url.protocol === "https:" ? https.Agent : http.Agent;
    this.agent = new Agent({ keepAlive: true, maxFreeSockets: IDLE_CONNECTIONS_MAX, scheduling: "lifo" });
    this.basePath = endpoint.url.pathname.replace(/\/+$/, "");
  }

  async request(method: string, path: string, options: RequestOptions): Promise<Response> {
    if (this.closed) throw new BackendUnavailable("the client is closed", true);
    const retrySafe = options.idempotent ?? method === "GET";
    const deadline = performance.now() + options.timeoutMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.once(method, path, options, deadline);
      } catch (error) {
        if (!(error instanceof Attempt)) throw error;
        if (attempt === 1 && error.fresh && retrySafe && performance.now() < deadline) continue;
        throw this.unavailable(method, path, options.timeoutMs, error.failure);
      }
    }
  }

  private unavailable(method: string, path: string, timeoutMs: number, cause: Error): BackendUnavailable {
    const shown = path.replace(/(\/v1\/leases\/)([^/]{0,6})[^/]*/, "$1$2…"); // a lease id is a secret
    const where = this.endpoint.url.host;
    const code = (cause as NodeJS.ErrnoException).code;
    if (cause.name === "TimeoutError") {
      return withCause(new BackendUnavailable(`${method} ${shown}: no answer from ${where} within ${timeoutMs} ms`), cause);
    }
    if (code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EAI_AGAIN") {
      return withCause(new BackendUnavailable(`cannot connect to ${where}: ${cause.message}`, true), cause);
    }
    return withCause(new BackendUnavailable(`${method} ${shown}: connection to ${where} failed: ${cause.message}`), cause);
  }

  private once(method: string, path: string, options: RequestOptions, deadline: number): Promise<Response> {
    const { url, authToken, responseBytesMax } = this.endpoint;
    const headers: Record<string, string> = { Accept: "application/json", ...options.headers };
    if (authToken !== undefined) headers["Authorization"] = `Bearer ${authToken}`;
    const body = options.body;
    if (body !== undefined) {
      headers["Content-Length"] = String(body.length);
      if (options.contentType !== undefined) headers["Content-Type"] = options.contentType;
    } else if (method === "POST" || method === "PUT") {
      headers["Content-Length"] = "0";
    }
    const transport = url.protocol === "https:" ? https : http;
    return new Promise<Response>((resolve, reject) => {
      let settled = false;
      let answered = false;
      const remainingMs = Math.max(0, deadline - performance.now());
      const request = transport.request({
        agent: this.agent,
        host: url.hostname.replace(/^\[|\]$/g, ""),
        port: url.port || (url.protocol === "https:" ? 443 : 80),
        method,
        path: this.basePath + path,
        headers,
      });
      const finish = (outcome: () => void): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        options.signal?.removeEventListener("abort", onAbort);
        outcome();
      };
      const fail = (error: Error): void =>
        finish(() => reject(new Attempt(error, request.reusedSocket && !answered && error.name !== "TimeoutError")));
      const timer = setTimeout(() => {
        const error = new Error(`deadline of ${options.timeoutMs} ms passed`);
        error.name = "TimeoutError";
        fail(error);
        request.destroy();
      }, remainingMs);
      const onAbort = (): void => {
        finish(() => reject(options.signal?.reason ?? new Error("aborted")));
        request.destroy();
      };
      if (options.signal?.aborted) {
        onAbort();
        return;
      }
      options.signal?.addEventListener("abort", onAbort, { once: true });
      request.on("error", fail);
      request.on("response", (response) => {
        answered = true;
        const declared = Number(response.headers["content-length"] ?? "0");
        if (declared > responseBytesMax) {
          fail(new Error(`answer of ${declared} bytes is over the bound of ${responseBytesMax}`));
          request.destroy();
          return;
        }
        const chunks: Buffer[] = [];
        let total = 0;
        response.on("data", (chunk: Buffer) => {
          total += chunk.length;
          if (total > responseBytesMax) {
            fail(new Error(`answer over the bound of ${responseBytesMax} bytes`));
            request.destroy();
            return;
          }
          chunks.push(chunk);
        });
        response.on("error", fail);
        response.on("end", () => {
          finish(() => resolve({ status: response.statusCode ?? 0, headers: response.headers, body: Buffer.concat(chunks) }));
        });
      });
      request.end(body === undefined ? undefined : Buffer.from(body.buffer, body.byteOffset, body.byteLength));
    });
  }

  close(): void {
    this.closed = true;
    this.agent.destroy();
  }
}

function withCause<E extends Error>(error: E, cause: unknown): E {
  Object.defineProperty(error, "cause", { value: cause, enumerable: false, configurable: true, writable: true });
  return error;
}
