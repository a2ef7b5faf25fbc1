import { describe, expect, it } from 'vitest';
import { resolveLink } from '../../apps/dashboard/src/markdown.ts';

describe('links in a rendered workspace file', () => {
  it('resolve against the file\u2019s folder, with / as the workspace root', () => {
    expect(resolveLink('knowledge/a.md', 'b.md')).toBe('knowledge/b.md');
    expect(resolveLink('knowledge/a.md', './sub/c.md#part')).toBe('knowledge/sub/c.md');
    expect(resolveLink('knowledge/a.md', '../MEMORY.md')).toBe('MEMORY.md');
    expect(resolveLink('knowledge/deep/a.md', '/skills/x/SKILL.md?x=1')).toBe('skills/x/SKILL.md');
    expect(resolveLink('a.md', 'my%20notes.md')).toBe('my notes.md');
  });

  it('never lead out of the workspace, and an empty target leads nowhere', () => {
    expect(resolveLink('a.md', '../etc/passwd')).toBeNull();
    expect(resolveLink('knowledge/a.md', '../../x.md')).toBeNull();
    expect(resolveLink('knowledge/a.md', '#heading')).toBeNull();
    expect(resolveLink('knowledge/a.md', '..')).toBeNull();
  });
});
