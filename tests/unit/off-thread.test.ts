import { afterEach, describe, expect, it } from 'vitest';
import { DeadlineExceeded, OffThread } from '../../apps/api/src/lib/off-thread.ts';

/**
 * A deadline bounds the work a request costs its thread. Before the clock started when the
 * thread began the request, a request sent to a thread still loading its modules, or queued behind
 * another (another tenant's), was refused for time it never ran: the secret scanner refused a
 * one-line file that way after a replacement thread started on a busy host.
 */
describe('a worker thread under deadlines', () => {
  const thread = new OffThread<{ busyMs?: number; forever?: boolean }, string>(
    new URL('../support/slow-thread.worker.mjs', import.meta.url),
    'test',
  );
  afterEach(() => thread.close());

  it("counts a request's deadline from when the thread begins it: not its start, not the queue before it", async () => {
    // The thread takes 1.5 s to start, then is busy 1.5 s with the first request: the second, with
    // 1 s of its own, is sent 3 s before the thread can begin it.
    const first = thread.run({ busyMs: 1500 });
    const second = thread.run({ busyMs: 0 }, [], 1000);
    await expect(second).resolves.toBe('done');
    await expect(first).resolves.toBe('done');
  });

  it('refuses a request that works past its deadline, fails the others it had, and starts a new thread', async () => {
    const stuck = thread.run({ forever: true }, [], 300);
    const behind = thread.run({ busyMs: 0 });
    await expect(stuck).rejects.toBeInstanceOf(DeadlineExceeded);
    await expect(behind).rejects.toThrow('the test thread was restarted after a request ran past its deadline');
    await expect(thread.run({ busyMs: 0 }, [], 1000)).resolves.toBe('done');
  });
});
