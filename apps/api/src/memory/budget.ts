/** The core-memory budget: at most `maxEntries` "- " bullets and `maxBytes` bytes in MEMORY.md. */
export interface MemoryBudget {
  maxEntries: number;
  maxBytes: number;
}

export function memoryEntries(text: string): string[] {
  return text
    .split('\n')
    .filter((l) => /^\s*[-*] \S/.test(l))
    .map((l) => l.trim().replace(/^[-*] /, ''));
}

export interface BudgetCheck {
  ok: boolean;
  entries: number;
  bytes: number;
  /** For the agent: what is over, and the current entries so it can consolidate. */
  message?: string;
}

/**
 * Checks new MEMORY.md content; when over budget, explains and lists the entries of `current()`
 * (read only then: the common case needs no second read).
 */
export async function checkMemoryBudget(
  next: string,
  current: () => Promise<string>,
  budget: MemoryBudget,
): Promise<BudgetCheck> {
  const entries = memoryEntries(next).length;
  const bytes = Buffer.byteLength(next);
  if (entries <= budget.maxEntries && bytes <= budget.maxBytes) return { ok: true, entries, bytes };
  const over = [
    entries > budget.maxEntries ? `${entries} entries (limit ${budget.maxEntries})` : '',
    bytes > budget.maxBytes ? `${bytes} bytes (limit ${budget.maxBytes})` : '',
  ].filter(Boolean);
  const list = memoryEntries(await current())
    .map((e, i) => `${i + 1}. ${e}`)
    .join('\n');
  return {
    ok: false,
    entries,
    bytes,
    message:
      `MEMORY.md was not changed: the new version has ${over.join(' and ')}. ` +
      'Merge near-duplicates, drop stale entries or move details to the daily log, then write it again. ' +
      `Current entries:\n${list || '(none)'}`,
  };
}
