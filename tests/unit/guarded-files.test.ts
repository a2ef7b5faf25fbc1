import { describe, expect, it } from 'vitest';
import { checkEvolutionPath, GuardedFiles, GuardError } from '../../apps/api/src/evolution/guarded-files.ts';
import type { WorkingTree, WorkspaceReader } from '../../apps/api/src/workspace/service.ts';

/** A workspace's files in memory: the reader the guard reads through and the tree it writes to. */
function memoryWorkspace(files: Record<string, string>) {
  const store = new Map<string, Buffer>(Object.entries(files).map(([p, t]) => [p, Buffer.from(t)]));
  const missing = (path: string) => Object.assign(new Error(`ENOENT: ${path}`), { code: 'ENOENT' });
  const reader: WorkspaceReader = {
    readFile: async (path) => store.get(path) ?? Promise.reject(missing(path)),
    listDir: async (dir) => {
      const prefix = dir ? `${dir}/` : '';
      const names = new Map<string, 'file' | 'dir'>();
      for (const p of store.keys())
        if (p.startsWith(prefix))
          names.set(p.slice(prefix.length).split('/')[0]!, p.slice(prefix.length).includes('/') ? 'dir' : 'file');
      return [...names].map(([name, type]) => ({ name, path: `${prefix}${name}`, type, size: 0 }));
    },
  };
  const tree: WorkingTree = {
    readFile: reader.readFile,
    writeFile: async (path, data) => void store.set(path, data),
    deleteFile: async (path) => {
      if (!store.delete(path)) throw missing(path);
    },
  };
  return { reader, tree, text: (p: string) => store.get(p)?.toString('utf8') };
}

const limits = { maxFileBytes: 1000, budget: { maxEntries: 2, maxBytes: 500 } };

describe('the write guard of self-evolution', () => {
  it('allows memory, skills, knowledge and prompt files; refuses built-in skills, the rest and escapes', () => {
    for (const ok of ['MEMORY.md', 'memory/2025-01-01.md', 'skills/x/SKILL.md', 'knowledge/a.md', 'AGENT.md'])
      expect(checkEvolutionPath(ok)).toBe(ok);
    for (const bad of [
      'skills/builtin/memory-keeping/SKILL.md',
      'tools/run.py',
      'README.md',
      '../etc/passwd',
      '.git/config',
      'memory/',
    ])
      expect(() => checkEvolutionPath(bad), bad).toThrow(GuardError);
  });

  it('stages edits: reads and lists see them, the tree only when applied', async () => {
    const w = memoryWorkspace({ 'MEMORY.md': '# Core memory\n- a\n', 'knowledge/old.md': 'old\n' });
    const files = new GuardedFiles(w.reader, limits);
    await files.write('knowledge/new.md', 'new page');
    await files.delete('knowledge/old.md');
    expect(await files.read('knowledge/new.md')).toBe('new page\n');
    expect(await files.read('knowledge/old.md')).toBeNull();
    expect(await files.list('knowledge')).toEqual(['knowledge/new.md']);
    expect(files.changed()).toEqual(['knowledge/new.md', 'knowledge/old.md']);
    expect(w.text('knowledge/old.md')).toBe('old\n');
    await files.apply(w.tree);
    expect(w.text('knowledge/new.md')).toBe('new page\n');
    expect(w.text('knowledge/old.md')).toBeUndefined();
  });

  it('refuses what would break the workspace: empty or oversized files, skills without front matter, memory over budget', async () => {
    const w = memoryWorkspace({ 'MEMORY.md': '# Core memory\n- a\n' });
    const files = new GuardedFiles(w.reader, limits);
    await expect(files.write('knowledge/e.md', '  \n')).rejects.toThrow(/empty file/);
    await expect(files.write('knowledge/big.md', 'x'.repeat(2000))).rejects.toThrow(/1000-byte file limit/);
    await expect(files.write('skills/s/SKILL.md', '# no front matter')).rejects.toThrow(/front matter/);
    await expect(files.write('MEMORY.md', '# Core memory\n- a\n- b\n- c\n')).rejects.toThrow(/3 entries \(limit 2\)/);
    await expect(files.delete('knowledge/none.md')).rejects.toThrow(/no such file/);
    expect(files.changed()).toEqual([]);
    await files.write('skills/s/SKILL.md', '---\nname: s\ndescription: does s\n---\n# S');
    expect(files.changed()).toEqual(['skills/s/SKILL.md']);
  });
});
