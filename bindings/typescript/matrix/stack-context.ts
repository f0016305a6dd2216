// A context manager for the browser (no async context there): the context given to `with` is
// the active one while `fn` runs synchronously, as sdk-trace-web's StackContextManager. Enough
// for the `trace` check: the OpenTelemetry client interceptor reads the active context when the
// call is made, before the typed client awaits anything; what runs after an `await` sees the
// root context again.
import { ROOT_CONTEXT, type Context, type ContextManager } from "@opentelemetry/api";

export class StackContextManager implements ContextManager {
  private current: Context = ROOT_CONTEXT;
  private enabled = false;

  active(): Context {
    return this.current;
  }

  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    const before = this.current;
    this.current = this.enabled ? ctx : ROOT_CONTEXT;
    try {
      return fn.call(thisArg, ...args);
    } finally {
      this.current = before;
    }
  }

  bind<T>(ctx: Context, target: T): T {
    if (typeof target !== "function") return target;
    const f = target as unknown as (...a: unknown[]) => unknown;
    return ((...a: unknown[]) => this.with(ctx, () => f(...a))) as unknown as T;
  }

  enable(): this {
    this.enabled = true;
    return this;
  }

  disable(): this {
    this.enabled = false;
    this.current = ROOT_CONTEXT;
    return this;
  }
}
