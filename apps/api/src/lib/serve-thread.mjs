// The worker side of off-thread.ts (plain JavaScript: Node starts workers outside tsx's loaders).
// `serve(handle)` answers each `{ id, ...request }` with `{ id, ok }` or `{ id, error }` (a handler
// may be async), after `{ id, started: true }` as it begins (the caller's deadline counts from it);
// `handle` may return `{ value, transfer }` (made by `transferring`) to move buffers, not copy them.
import { parentPort } from 'node:worker_threads';

const TRANSFER = Symbol('transfer');

export function transferring(value, transfer) {
  return { [TRANSFER]: true, value, transfer };
}

export function serve(handle) {
  const answer = (id, out) => {
    if (out?.[TRANSFER]) parentPort.postMessage({ id, ok: out.value }, out.transfer);
    else parentPort.postMessage({ id, ok: out });
  };
  const refuse = (id, err) => parentPort.postMessage({ id, error: err?.message ?? String(err) });
  parentPort.on('message', (msg) => {
    parentPort.postMessage({ id: msg.id, started: true });
    let out;
    try {
      out = handle(msg);
    } catch (err) {
      refuse(msg.id, err);
      return;
    }
    // An async handler (a promise) is answered when it settles; answers carry their id.
    if (typeof out?.then === 'function')
      out.then(
        (v) => answer(msg.id, v),
        (err) => refuse(msg.id, err),
      );
    else answer(msg.id, out);
  });
}
