import { describe, expect, it } from 'vitest';
import { checkRelativePath } from '../../apps/api/src/workspace/paths.ts';

const refused = (p: string) => {
  try {
    checkRelativePath(p);
    return false;
  } catch {
    return true;
  }
};

describe('workspace paths git would refuse or obey', () => {
  it('refuses names the filesystem would store as something else than what was checked', () => {
    for (const p of ['a\ud800b', 'x/\udc00', 'tail\ud83d']) expect(refused(p), JSON.stringify(p)).toBe(true);
    expect(checkRelativePath('notes/\ud83d\ude00.md')).toBe('notes/\ud83d\ude00.md');
  });

  it('refuses the 8.3 short names of reserved files, and only those', () => {
    for (const p of ['GITMOD~4', 'gi7eba~9', 'gi7eb~12', '~1234567', 'gi250a~1 .', 'gi7d29~3:$DATA'])
      expect(refused(p), p).toBe(true);
    for (const p of ['gitmod~5', 'gi7eba~0', 'gi7ebx~1', 'gi7eb~1', '~0123456', 'gitignore~1'])
      expect(refused(p), p).toBe(false);
  });
});
