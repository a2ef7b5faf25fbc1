/**
 * Counts turns of the event loop (setImmediate callbacks) while `work` runs: near zero when the
 * work holds the loop, many when it runs elsewhere (a worker thread, another process).
 */
export async function ticksDuring<T>(work: () => Promise<T> | T): Promise<{ value: T; ticks: number }> {
  let ticks = 0;
  let settled = false;
  const tick = () => {
    ticks++;
    if (!settled) setImmediate(tick);
  };
  setImmediate(tick);
  try {
    return { value: await work(), ticks };
  } finally {
    settled = true;
  }
}
