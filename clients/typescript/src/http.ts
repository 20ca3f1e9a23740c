/**
 * Requests to one `stockade serve` over HTTP/1.1 keep-alive connections, every one bounded: a
 * deadline per request (an acquire gets its `waitMs` on top, the server long-polls) and a cap on
 * the answer's bytes. A connection failure or a timeout is {@link BackendUnavailable}; the caller
 * maps a problem answer with `errorFor`.
 *
 * The HTTP/1.1 framing is this module's own, over `node:net` (`node:tls` for https), as the Python
 * client frames its own (stockade.transport.http11): a lock cycle is two small requests to one
 * known server, and `node:http`'s general machinery (request and response streams, an agent, event
 * plumbing per request) cost more client CPU per cycle than the whole exchange over a socket
 * (docs/typescript.md has the measurement). A request leaves in one write; the answer is read by
 * Content-Length, chunked transfer coding, or until the server closes; interim (1xx) answers are
 * skipped.
 *
 * Connections are kept open and reused, one per concurrent request, up to
 * {@link IDLE_CONNECTIONS_MAX} kept idle; an idle one that the server closed (or that received
 * bytes nobody asked for) is dropped. A reused connection that fails before any byte of the
 * answer is sent again once on a fresh connection, but only when the request may safely arrive
 * twice (GET, renew, release). An acquire or a store write is never sent twice.
 */

import net from "node:net";
import tls from "node:tls";

import { BackendUnavailable, InvalidArgument } from "./errors.js";

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
  /** By lowercase name; a repeated field's values joined with ", ". */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Buffer;
}

/** Keep-alive connections kept idle per client. */
export const IDLE_CONNECTIONS_MAX = 8;
/** Bound on an answer's head (status line and header fields), in bytes. */
export const RESPONSE_HEAD_BYTES_MAX = 64 * 1024;

const EMPTY: Buffer = Buffer.alloc(0);
const HEAD_END = Buffer.from("\r\n\r\n");
const CRLF = Buffer.from("\r\n");
const FIELD_VALUE_RE = /^[\t\x20-\x7e]*$/;
const FIELD_NAME_RE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const STATUS_LINE_RE = /^HTTP\/1\.([01]) ([1-5][0-9][0-9])(?: |$)/;

/** The server's bytes were not the HTTP/1.1 this client reads (a bug, a wrong port, an answer over the bound). */
class ProtocolError extends Error {
  override name = "ProtocolError";
}

class Attempt extends Error {
  constructor(
    readonly failure: Error,
    readonly fresh: boolean,
  ) {
    super(failure.message);
  }
}

/** The answer to one request, read as its bytes arrive. */
class Answer {
  status = 0;
  headers: Record<string, string> = Object.create(null) as Record<string, string>;
  keepAlive = true;
  /** Bytes after the answer's end (nothing should follow: the connection is then not reused). */
  leftover = false;
  private inHead = true;
  /** Body framing: bytes still to read, -1 chunked, -2 until the server closes. */
  private remaining = 0;
  /** Chunked: the current chunk's bytes still to read (then its CRLF), -1 at a size line, -2 in the trailer. */
  private chunkLeft = -1;
  private pending: Buffer = EMPTY;
  private readonly parts: Buffer[] = [];
  private total = 0;

  constructor(
    private readonly method: string,
    private readonly bytesMax: number,
  ) {}

  get body(): Buffer {
    return this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts, this.total);
  }

  /** Feed bytes; true once the answer is complete. @throws ProtocolError */
  feed(chunk: Buffer): boolean {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    if (this.inHead && !this.readHead()) return false;
    if (this.remaining >= 0) {
      const take = Math.min(this.remaining, this.pending.length);
      if (take > 0) this.keep(this.pending.subarray(0, take));
      this.remaining -= take;
      this.pending = this.pending.subarray(take);
      return this.done(this.remaining === 0);
    }
    if (this.remaining === -2) {
      this.keep(this.pending);
      this.pending = EMPTY;
      return false;
    }
    return this.done(this.readChunks());
  }

  /** The server closed the connection: true if that ends the answer (framed by the close). */
  closed(): boolean {
    return !this.inHead && this.remaining === -2;
  }

  private done(complete: boolean): boolean {
    if (complete) this.leftover = this.pending.length > 0;
    return complete;
  }

  private keep(bytes: Buffer): void {
    this.total += bytes.length;
    if (this.total > this.bytesMax) throw new ProtocolError(`answer over the bound of ${this.bytesMax} bytes`);
    this.parts.push(bytes);
  }

  /** Parse heads until a final (non-1xx) one; false while more bytes are needed. */
  private readHead(): boolean {
    for (;;) {
      const end = this.pending.indexOf(HEAD_END);
      if (end < 0) {
        if (this.pending.length > RESPONSE_HEAD_BYTES_MAX) throw new ProtocolError(`no answer head within ${RESPONSE_HEAD_BYTES_MAX} bytes`);
        return false;
      }
      const head = this.pending.toString("latin1", 0, end);
      this.pending = this.pending.subarray(end + HEAD_END.length);
      if (this.parseHead(head)) {
        this.inHead = false;
        return true;
      }
    }
  }

  /** True for a final head (its framing set), false for an interim 1xx one. */
  private parseHead(head: string): boolean {
    const lines = head.split("\r\n");
    const statusLine = STATUS_LINE_RE.exec(lines[0] ?? "");
    if (statusLine === null) throw new ProtocolError(`bad status line ${JSON.stringify((lines[0] ?? "").slice(0, 80))}`);
    const status = Number(statusLine[2]);
    const headers: Record<string, string> = Object.create(null) as Record<string, string>;
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i]!;
      const colon = line.indexOf(":");
      const name = line.slice(0, colon).toLowerCase();
      if (colon <= 0 || !FIELD_NAME_RE.test(name)) throw new ProtocolError(`bad header line ${JSON.stringify(line.slice(0, 80))}`);
      const value = line.slice(colon + 1).trim();
      headers[name] = name in headers ? `${headers[name]}, ${value}` : value;
    }
    if (status < 200) return false;
    const connection = (headers["connection"] ?? "").toLowerCase();
    this.keepAlive = statusLine[1] === "1" ? !connection.includes("close") : connection.includes("keep-alive");
    this.status = status;
    this.headers = headers;
    if (status === 204 || status === 304 || this.method === "HEAD") {
      this.remaining = 0;
    } else if ((headers["transfer-encoding"] ?? "").toLowerCase().includes("chunked")) {
      this.remaining = -1;
    } else if (headers["content-length"] !== undefined) {
      if (!/^[0-9]{1,15}$/.test(headers["content-length"])) throw new ProtocolError("bad Content-Length");
      this.remaining = Number(headers["content-length"]);
      if (this.remaining > this.bytesMax) {
        throw new ProtocolError(`answer of ${this.remaining} bytes is over the bound of ${this.bytesMax}`);
      }
    } else {
      this.remaining = -2;
      this.keepAlive = false;
    }
    return true;
  }

  /** Chunked transfer coding (RFC 9112 §7.1): true once the last chunk and the trailer are read. */
  private readChunks(): boolean {
    for (;;) {
      if (this.chunkLeft > 0) {
        const take = Math.min(this.chunkLeft, this.pending.length);
        if (take === 0) return false;
        this.keep(this.pending.subarray(0, take));
        this.pending = this.pending.subarray(take);
        this.chunkLeft -= take;
        if (this.chunkLeft > 0) return false;
        this.chunkLeft = 0; // its CRLF next
      }
      const eol = this.pending.indexOf(CRLF);
      if (eol < 0) {
        if (this.pending.length > 1024 + (this.chunkLeft === -2 ? RESPONSE_HEAD_BYTES_MAX : 0)) {
          throw new ProtocolError("bad chunked body: a line too long");
        }
        return false;
      }
      const line = this.pending.toString("latin1", 0, eol);
      this.pending = this.pending.subarray(eol + CRLF.length);
      if (this.chunkLeft === 0) { // the end of a chunk's data
        if (line !== "") throw new ProtocolError("bad chunked body: no CRLF after a chunk");
        this.chunkLeft = -1;
      } else if (this.chunkLeft === -1) { // a size line
        const size = /^([0-9A-Fa-f]{1,8})[ \t]*(?:;.*)?$/.exec(line);
        if (size === null) throw new ProtocolError("bad chunked body: a bad chunk size");
        this.chunkLeft = parseInt(size[1]!, 16) || -2;
      } else if (line === "") { // the trailer's end
        return true;
      }
    }
  }
}

/** One keep-alive connection; one request at a time. */
class Connection {
  /** Closed by the server, failed, or sent bytes nobody asked for: never used again. */
  gone = false;
  receivedAny = false;
  private sink: { data(chunk: Buffer): void; gone(error: Error, clean: boolean): void } | undefined;

  constructor(
    readonly socket: net.Socket,
    private readonly onGone: (connection: Connection) => void,
  ) {
    socket.setNoDelay(true);
    socket.setKeepAlive(true, 1000);
    socket.on("data", (chunk: Buffer) => {
      this.receivedAny = true;
      if (this.sink !== undefined) this.sink.data(chunk);
      else this.destroy(); // unasked bytes: the connection's state is unknown
    });
    const ended = (error?: Error): void => {
      const sink = this.sink;
      this.destroy();
      sink?.gone(error ?? new Error("the server closed the connection"), error === undefined);
    };
    socket.on("end", () => ended());
    socket.on("close", () => ended());
    socket.on("error", (error) => ended(error));
  }

  destroy(): void {
    if (!this.gone) {
      this.gone = true;
      this.socket.destroy();
      this.onGone(this);
    }
  }

  /** Send `request` and read its answer; rejects with an {@link Attempt}, or with `signal`'s reason. */
  roundtrip(request: Buffer, method: string, bytesMax: number, remainingMs: number, timeoutMs: number,
    signal: AbortSignal | undefined, reused: boolean): Promise<Answer> {
    return new Promise<Answer>((resolve, reject) => {
      const answer = new Answer(method, bytesMax);
      let settled = false;
      this.receivedAny = false;
      const finish = (outcome: () => void): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        this.sink = undefined;
        outcome();
      };
      const fail = (error: Error, fresh: boolean): void => {
        finish(() => reject(new Attempt(error, fresh)));
        this.destroy();
      };
      const timer = setTimeout(() => {
        const error = new Error(`deadline of ${timeoutMs} ms passed`);
        error.name = "TimeoutError";
        fail(error, false);
      }, remainingMs);
      const onAbort = (): void => {
        finish(() => reject(signal?.reason ?? new Error("aborted")));
        this.destroy(); // the server sees the close (a waiting acquire leaves its queue)
      };
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      this.sink = {
        data: (chunk) => {
          let complete: boolean;
          try {
            complete = answer.feed(chunk);
          } catch (error) {
            fail(error as Error, false);
            return;
          }
          if (complete) finish(() => resolve(answer));
        },
        gone: (error, clean) => {
          if (clean && answer.closed()) finish(() => resolve(answer));
          else fail(error, reused && !this.receivedAny);
        },
      };
      this.socket.ref();
      this.socket.write(request);
    });
  }
}

export class HttpClient {
  private readonly basePath: string;
  private readonly host: string;
  private readonly port: number;
  private readonly head: string;
  private readonly idle: Connection[] = [];
  private readonly open = new Set<Connection>();
  private closed = false;

  constructor(readonly endpoint: Endpoint) {
    const { url, authToken } = endpoint;
    this.basePath = url.pathname.replace(/\/+$/, "");
    this.host = url.hostname.replace(/^\[|\]$/g, "");
    this.port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    this.head = `\r\nHost: ${url.host}\r\nAccept: application/json\r\n${authToken === undefined ? "" : `Authorization: Bearer ${authToken}\r\n`}`;
  }

  async request(method: string, path: string, options: RequestOptions): Promise<Response> {
    if (this.closed) throw new BackendUnavailable("the client is closed", true);
    const request = this.encode(method, path, options);
    const retrySafe = options.idempotent ?? method === "GET";
    const deadline = performance.now() + options.timeoutMs;
    for (let attempt = 1; ; attempt++) {
      let connection = this.checkout();
      const reused = connection !== undefined;
      connection ??= this.connect();
      try {
        const answer = await connection.roundtrip(request, method, this.endpoint.responseBytesMax,
          Math.max(0, deadline - performance.now()), options.timeoutMs, options.signal, reused);
        this.checkin(connection, answer);
        return { status: answer.status, headers: answer.headers, body: answer.body };
      } catch (error) {
        if (!(error instanceof Attempt)) throw error;
        if (attempt === 1 && error.fresh && retrySafe && !this.closed && performance.now() < deadline) continue;
        throw this.unavailable(method, path, options.timeoutMs, error.failure);
      }
    }
  }

  /** The request's head and body as one buffer, so that it leaves in one write. */
  private encode(method: string, path: string, options: RequestOptions): Buffer {
    let head = `${method} ${this.basePath}${path} HTTP/1.1${this.head}`;
    const body = options.body;
    if (body !== undefined) {
      head += `Content-Length: ${body.length}\r\n`;
      if (options.contentType !== undefined) head += `Content-Type: ${options.contentType}\r\n`;
    } else if (method === "POST" || method === "PUT") {
      head += "Content-Length: 0\r\n";
    }
    for (const name in options.headers) {
      const value = options.headers[name]!;
      if (!FIELD_NAME_RE.test(name) || !FIELD_VALUE_RE.test(value)) {
        throw new InvalidArgument(name, "a header must be printable ASCII");
      }
      head += `${name}: ${value}\r\n`;
    }
    const bytes = Buffer.from(`${head}\r\n`, "latin1");
    return body === undefined || body.length === 0 ? bytes : Buffer.concat([bytes, body]);
  }

  private connect(): Connection {
    const socket = this.endpoint.url.protocol === "https:"
      ? tls.connect({ host: this.host, port: this.port, ...(net.isIP(this.host) ? {} : { servername: this.host }) })
      : net.connect({ host: this.host, port: this.port });
    const connection = new Connection(socket, (gone) => {
      this.open.delete(gone);
      const at = this.idle.indexOf(gone);
      if (at >= 0) this.idle.splice(at, 1);
    });
    this.open.add(connection);
    return connection;
  }

  private checkout(): Connection | undefined {
    for (;;) {
      const connection = this.idle.pop();
      if (connection === undefined || !connection.gone) return connection;
    }
  }

  private checkin(connection: Connection, answer: Answer): void {
    if (answer.keepAlive && !answer.leftover && !connection.gone && !this.closed && this.idle.length < IDLE_CONNECTIONS_MAX) {
      connection.socket.unref(); // an idle connection never keeps the process alive
      this.idle.push(connection);
    } else {
      connection.destroy();
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

  /** Close every connection, idle or in use (a request in flight fails as BackendUnavailable). */
  close(): void {
    this.closed = true;
    for (const connection of [...this.open]) connection.destroy();
  }
}

function withCause<E extends Error>(error: E, cause: unknown): E {
  Object.defineProperty(error, "cause", { value: cause, enumerable: false, configurable: true, writable: true });
  return error;
}
