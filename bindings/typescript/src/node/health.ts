/**
 * Health checking with the semantics of gRPC's `grpc.health.v1` (as grpc-go's `health` package
 * and the Rust `topspin-health` crate): one status table per server, served on the native face
 * (`topspin health`) and the gRPC face (grpcurl, Kubernetes gRPC probes) by the same handlers.
 *
 * - `Check` answers the service's current status, or fails `NOT_FOUND` if none was ever set.
 *   `""` stands for the whole server, which starts `SERVING`.
 * - `Watch` sends the current status (`SERVICE_UNKNOWN` for an unknown service; the stream stays
 *   open, the service may appear later), then every change. A slow watcher skips to the latest
 *   status, it never queues.
 * - {@link Health.shutdown} turns every service `NOT_SERVING` and ignores changes until
 *   {@link Health.resume}; the server's `close()` calls it before GOAWAY, then ends the open
 *   watches (after they have sent `NOT_SERVING`), so that they do not hold the drain open.
 * @module
 */
import { Code, TopspinError } from "../status.js";
import { Health as HealthService, HealthCheckResponse_ServingStatus as ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import type { HandlerContext, ServiceImpl } from "./server.js";

export { HealthService, ServingStatus };

/** One open `Watch`: the latest status not sent yet, and a wake-up. */
interface Watcher {
  service: string;
  pending: ServingStatus | null;
  wake: (() => void) | null;
  ended: boolean;
}

/** The status table of one server. */
export class Health {
  private readonly statuses = new Map<string, ServingStatus>([["", ServingStatus.SERVING]]);
  private readonly watchers = new Set<Watcher>();
  private stopped = false;

  /** Sets a service's status (`""`: the server as a whole); ignored after {@link Health.shutdown}. */
  setStatus(service: string, status: ServingStatus.SERVING | ServingStatus.NOT_SERVING | ServingStatus.UNKNOWN): void {
    if (this.stopped) return;
    this.statuses.set(service, status);
    this.tell(service, status);
  }

  /** Forgets a service: `Check` fails `NOT_FOUND`, watchers see `SERVICE_UNKNOWN`. */
  clear(service: string): void {
    if (this.stopped || !this.statuses.delete(service)) return;
    this.tell(service, ServingStatus.SERVICE_UNKNOWN);
  }

  /** The status of a service, undefined if none was set. */
  status(service: string): ServingStatus | undefined {
    return this.statuses.get(service);
  }

  /** Every service `NOT_SERVING`; later changes are ignored until {@link Health.resume}. */
  shutdown(): void {
    for (const s of this.statuses.keys()) {
      this.statuses.set(s, ServingStatus.NOT_SERVING);
      this.tell(s, ServingStatus.NOT_SERVING);
    }
    this.stopped = true;
  }

  /** Undoes {@link Health.shutdown}: every known service `SERVING` again. */
  resume(): void {
    this.stopped = false;
    for (const s of this.statuses.keys()) this.setStatus(s, ServingStatus.SERVING);
  }

  /** Ends every open watch once it has sent its latest status (the server is closing). */
  endWatches(): void {
    for (const w of this.watchers) {
      w.ended = true;
      w.wake?.();
    }
  }

  private tell(service: string, status: ServingStatus): void {
    for (const w of this.watchers) {
      if (w.service !== service) continue;
      w.pending = status;
      w.wake?.();
    }
  }

  /** The current status of `service` and every change, until the call or the server ends. */
  async *watch(service: string, signal: AbortSignal): AsyncGenerator<{ status: ServingStatus }> {
    const w: Watcher = { service, pending: this.statuses.get(service) ?? ServingStatus.SERVICE_UNKNOWN, wake: null, ended: false };
    this.watchers.add(w);
    const onAbort = (): void => w.wake?.();
    signal.addEventListener("abort", onAbort);
    try {
      for (;;) {
        if (w.pending !== null) {
          const status = w.pending;
          w.pending = null;
          yield { status };
          continue;
        }
        if (w.ended || signal.aborted) return;
        await new Promise<void>((r) => (w.wake = r));
        w.wake = null;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.watchers.delete(w);
    }
  }

  /** The `grpc.health.v1.Health` implementation over this table. */
  impl(): ServiceImpl<typeof HealthService> {
    return {
      check: (req: { service: string }) => {
        const status = this.statuses.get(req.service);
        if (status === undefined) throw new TopspinError(Code.NOT_FOUND, `no health status for ${req.service === "" ? 'the server as a whole ("")' : `service ${JSON.stringify(req.service)}`}`);
        return { status };
      },
      watch: (req: { service: string }, ctx: HandlerContext) => this.watch(req.service, ctx.signal),
    };
  }
}
