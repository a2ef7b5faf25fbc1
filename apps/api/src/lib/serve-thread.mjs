// The worker side of off-thread.ts (plain JavaScript: Node starts workers outside tsx's loaders).
// `serve(handle)` answers each `{ id, ...request }` with `{ id, ok }` or `{ id, error }`, in order;
// `handle` may return `{ value, transfer }` (made by `transferring`) to move buffers, not copy them.
import { parentPort } from 'node:worker_threads';

const TRANSFER = Symbol('transfer');

export function transferring(value, transfer) {
  return { [TRANSFER]: true, value, transfer };
}

export function serve(handle) {
  parentPort.on('message', (msg) => {
    let out;
    try {
      out = handle(msg);
    } catch (err) {
      parentPort.postMessage({ id: msg.id, error: err?.message ?? String(err) });
      return;
    }
    if (out?.[TRANSFER]) parentPort.postMessage({ id: msg.id, ok: out.value }, out.transfer);
    else parentPort.postMessage({ id: msg.id, ok: out });
  });
}
