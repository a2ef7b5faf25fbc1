import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { frontField } from '../lib/text.ts';

export interface SkillInfo {
  name: string;
  description: string;
  path: string;
}

/** Every skills/<name>/SKILL.md (built-in ones included) with its front matter. */
export async function listSkills(dir: string): Promise<SkillInfo[]> {
  const out: SkillInfo[] = [];
  const walk = async (rel: string, depth: number): Promise<void> => {
    const entries = await readdir(join(dir, rel), { withFileTypes: true }).catch(() => []);
    for (const e of entries) {
      const p = `${rel}/${e.name}`;
      if (e.isDirectory() && depth < 3) await walk(p, depth + 1);
      else if (e.name === 'SKILL.md') {
        const text = await readFile(join(dir, p), 'utf8');
        const front = /^---\n([\s\S]*?)\n---/.exec(text)?.[1] ?? '';
        const field = (k: string) => frontField(front, k);
        out.push({
          name: field('name') ?? rel.split('/').pop()!,
          description: field('description') ?? '(no description)',
          path: `/workspace/${p}`,
        });
      }
    }
  };
  await walk('skills', 0);
  return out.sort((a, b) => a.path.localeCompare(b.path));
}
