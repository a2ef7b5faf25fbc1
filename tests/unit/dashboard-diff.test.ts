import { describe, expect, it } from 'vitest';
import { parseDiff } from '../../apps/dashboard/src/diff.ts';

describe('the dashboard\u2019s unified diff parser', () => {
  it('splits files, counts added and removed lines, and reads a hunk\u2019s "--- x" as a removed line, not a header', () => {
    const text = [
      'diff --git a/notes.md b/notes.md',
      'index 1111111..2222222 100644',
      '--- a/notes.md',
      '+++ b/notes.md',
      '@@ -1,3 +1,3 @@',
      ' # Notes',
      '--- a removed line that starts with two dashes',
      '+++ an added line that starts with two pluses',
      ' end',
      'diff --git a/old.txt b/old.txt',
      'deleted file mode 100644',
      'index 3333333..0000000',
      '--- a/old.txt',
      '+++ /dev/null',
      '@@ -1 +0,0 @@',
      '-bye',
      '',
    ].join('\n');
    const files = parseDiff(text);
    expect(files.map((f) => [f.path, f.added, f.removed, f.binary])).toEqual([
      ['notes.md', 1, 1, false],
      ['old.txt', 0, 1, false],
    ]);
    expect(files[0]!.lines).toHaveLength(9);
  });

  it('names files with spaces and quoted (unusual) paths, and marks binary files', () => {
    const files = parseDiff(
      [
        'diff --git a/my notes.md b/my notes.md',
        'new file mode 100644',
        '--- /dev/null',
        '+++ b/my notes.md',
        '@@ -0,0 +1 @@',
        '+hi',
        'diff --git "a/caf\\303\\251.png" "b/caf\\303\\251.png"',
        'new file mode 100644',
        'Binary files /dev/null and "b/caf\\303\\251.png" differ',
      ].join('\n'),
    );
    expect(files.map((f) => [f.path, f.added, f.binary])).toEqual([
      ['my notes.md', 1, false],
      ['caf\\303\\251.png', 0, true],
    ]);
  });
});
