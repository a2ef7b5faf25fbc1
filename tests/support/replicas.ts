import { execFileSync } from 'node:child_process';
import { expect } from 'vitest';
import type { TestApp } from './app.ts';

/**
 * Issue 26's case: `count` file writes to one workspace, through the replicas in turn, all at
 * once. Every one must answer 200 with a commit of its own that is on the workspace's history, its
 * file in HEAD, and nothing left in the working tree. Returns the answers' commit SHAs and the
 * history (newest first).
 */
export async function writeAtOnceThrough(
  replicas: TestApp[],
  key: string,
  ws: string,
  count: number,
): Promise<{ shas: string[]; history: string[]; git: (...args: string[]) => string }> {
  const writes = Array.from({ length: count }, (_, i) => ({
    via: replicas[i % replicas.length]!,
    path: `knowledge/w${i}.md`,
  }));
  const answers = await Promise.all(
    writes.map(({ via, path }) =>
      via.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, {
        key,
        raw: `written as ${path}\n`,
      }),
    ),
  );
  expect(answers.map((r) => r.status)).toEqual(writes.map(() => 200));
  const dir = replicas[0]!.workspaces.dirOf(ws);
  const git = (...args: string[]) => execFileSync('git', ['-C', dir, ...args], { encoding: 'utf8' });
  const head = git('ls-tree', '-r', '--name-only', 'HEAD').split('\n');
  for (const { path } of writes) expect(head, path).toContain(path);
  const shas = answers.map((r) => r.body.commit.sha as string);
  expect(new Set(shas).size).toBe(count);
  const history = git('rev-list', 'HEAD').trim().split('\n');
  for (const sha of shas) expect(history).toContain(sha);
  // Nothing stranded: a clean working tree.
  expect(git('status', '--porcelain')).toBe('');
  return { shas, history, git };
}
