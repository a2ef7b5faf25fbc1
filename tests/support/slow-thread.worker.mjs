// A thread for tests/unit/off-thread.test.ts: slow to start (as a thread loading large modules on a
// busy host is), then does what each request asks: `{ busyMs }` keeps the thread busy that long,
// `{ forever: true }` never ends.
import { serve } from '../../apps/api/src/lib/serve-thread.mjs';

const busy = (ms) => {
  const until = Date.now() + ms;
  while (Date.now() < until);
};

busy(1500);

serve(({ busyMs, forever }) => {
  if (forever) for (;;);
  busy(busyMs ?? 0);
  return 'done';
});
