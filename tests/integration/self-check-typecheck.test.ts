import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  type CheckOptions,
  failsWithoutEmit,
  preparePatch,
  removeWorktree,
  typecheck,
} from '../../apps/api/src/platform/self-check.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const git = (dir: string, ...args: string[]) =>
  execFileSync('git', ['-C', dir, '-c', 'user.name=t', '-c', 'user.email=t@t.invalid', ...args], {
    encoding: 'utf8',
  }).trim();

/** A patch that replaces (or adds) one file of the small project. */
const patchOf = (source: string, file: string, text: string) => {
  const scratch = mkdtempSync(join(tmpdir(), 'kiln-tc-scratch-'));
  try {
    execFileSync('git', ['clone', '-q', source, scratch]);
    writeFileSync(join(scratch, file), text);
    git(scratch, 'add', '-A');
    return `${git(scratch, 'diff', '--cached')}\n`;
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
};

describe("a self-check's type-check starts from an earlier check's state", () => {
  let source: string;
  const o: CheckOptions = { stepTimeoutMs: 60_000, readyTimeoutMs: 1000, stopTimeoutMs: 1000, children: new Set() };
  const kept = () => readdirSync(join(source, '.git', 'kiln-check')).sort();
  /** Prepares the patch in a worktree, type-checks it there and removes the worktree. */
  const check = async (id: string, file: string, text: string) => {
    const p = await preparePatch(source, { id, patch: patchOf(source, file, text), message: id });
    try {
      // What the check's install step does when package-lock.json is unchanged.
      symlinkSync(join(ROOT, 'node_modules'), join(p.worktree, 'node_modules'));
      return { ...(await typecheck(o, source, p, 'tsconfig.json', 'api', new AbortController().signal)), p };
    } finally {
      await removeWorktree(source, p.worktree);
    }
  };

  beforeAll(() => {
    // A small project of its own, with the platform's TypeScript (its node_modules linked, as a
    // check links the running checkout's).
    source = mkdtempSync(join(tmpdir(), 'kiln-tc-src-'));
    git(source, 'init', '-q', '-b', 'main');
    mkdirSync(join(source, 'src'));
    writeFileSync(
      join(source, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: { strict: true, noEmit: true, module: 'esnext', moduleResolution: 'bundler', types: [] },
        include: ['src/*.ts'],
      }),
    );
    writeFileSync(join(source, 'src/a.ts'), 'export const twice = (x: number): number => x * 2;\n');
    writeFileSync(join(source, 'src/b.ts'), "import { twice } from './a';\nexport const four: number = twice(2);\n");
    writeFileSync(join(source, '.gitignore'), 'node_modules\n');
    symlinkSync(join(ROOT, 'node_modules'), join(source, 'node_modules'));
    git(source, 'add', '-A');
    git(source, 'commit', '-q', '-m', 'a small project');
  });
  afterAll(() => rmSync(source, { recursive: true, force: true }));

  it('keeps the state of a passing check, by commit, in the git directory', async () => {
    const first = await check('first', 'src/c.ts', 'export const c = 1;\n');
    expect(first.ok, first.log).toBe(true);
    expect(first.log).toContain('(no earlier state: in full)');
    expect(kept()).toEqual([`${first.p.commit}.api.tsbuildinfo`]);
  });

  it('still finds an error in a file the patch did not touch; a failing check keeps its state, which the next try starts from', async () => {
    // b.ts is unchanged, but what it imports now returns a string: tsc must re-check it.
    const breaking = 'export const twice = (x: number): string => `${x}${x}`;\n';
    const broken = await check('broken', 'src/a.ts', breaking);
    expect(broken.ok).toBe(false);
    expect(broken.log).toMatch(/src\/b\.ts\(2,14\): error TS2322/);
    expect(broken.log).toMatch(/\(incremental from the type-check of [0-9a-f]{12}\)/);
    // A type error fails `tsc --noEmit` too: that run is not repeated.
    expect(broken.log).toContain('--emitDeclarationOnly');
    expect(broken.log).not.toContain('--noEmit --incremental');
    expect(kept()).toContain(`${broken.p.commit}.api.tsbuildinfo`);
    // The same patch again, from the state it left, where no file has changed: the error is still found.
    const again = await check('again', 'src/a.ts', breaking);
    expect(again.ok).toBe(false);
    expect(again.log).toContain(`(incremental from the type-check of ${broken.p.commit.slice(0, 12)})`);
    expect(again.log).toMatch(/src\/b\.ts\(2,14\): error TS2322/);
    // Its fix, from the failing state: what the failure's files import and export is checked again.
    const fixed = await check('fixed', 'src/a.ts', 'export const twice = (x: number): number => x + x;\n');
    expect(fixed.ok, fixed.log).toBe(true);
    expect(fixed.log).toContain(`(incremental from the type-check of ${again.p.commit.slice(0, 12)})`);
    // The next cases count on the first case's state being the only one.
    for (const c of [broken, again, fixed]) rmSync(join(source, '.git', 'kiln-check', `${c.p.commit}.api.tsbuildinfo`));
    expect(kept()).toHaveLength(1);
  });

  it('passes a patch whose only errors are ones declaration emit has and `tsc --noEmit` does not', async () => {
    // TS4094: an exported class expression with a private member has no declaration.
    const r = await check(
      'dts',
      'src/f.ts',
      'export const K = class {\n  private secret = 1;\n  get s() {\n    return this.secret;\n  }\n};\n',
    );
    expect(r.ok, r.log).toBe(true);
    expect(r.log).toContain('--noEmit --incremental');
    expect(kept()).toContain(`${r.p.commit}.api.tsbuildinfo`);
    rmSync(join(source, '.git', 'kiln-check', `${r.p.commit}.api.tsbuildinfo`));
  });

  it('starts from the state of the commit the patch applies to, once that commit is the source', async () => {
    const first = kept()[0]!.split('.')[0]!;
    // A newer check that was never applied: its state is the newest, not the source's.
    const other = await check('other', 'src/e.ts', 'export const e = 2;\n');
    expect(other.ok, other.log).toBe(true);
    expect(other.log).toContain(`(incremental from the type-check of ${first.slice(0, 12)})`);
    // Applying an update moves the source to the checked commit.
    git(source, 'merge', '-q', '--ff-only', first);
    const next = await check('next', 'src/d.ts', "import { c } from './c';\nexport const d: number = c + 1;\n");
    expect(next.ok, next.log).toBe(true);
    expect(next.p.base).toBe(first);
    expect(next.log).toContain(`(incremental from the type-check of ${first.slice(0, 12)})`);
    expect(kept()).toEqual([first, other.p.commit, next.p.commit].map((c) => `${c}.api.tsbuildinfo`).sort());
    expect(existsSync(next.p.worktree)).toBe(false);
  });

  it('keeps the state of the commit the source is at when eight newer ones come after it', async () => {
    const base = git(source, 'rev-parse', 'HEAD');
    const dir = join(source, '.git', 'kiln-check');
    const own = join(dir, `${base}.api.tsbuildinfo`);
    expect(existsSync(own)).toBe(true);
    // Eight newer states (as a burst of tries would leave), the source's own the oldest of all.
    const now = Date.now() / 1000;
    utimesSync(own, now - 120, now - 120);
    const burst = Array.from({ length: 8 }, (_, i) => {
      const path = join(dir, `${randomBytes(20).toString('hex')}.api.tsbuildinfo`);
      copyFileSync(own, path);
      utimesSync(path, now - 100 + i, now - 100 + i);
      return path;
    });
    const r = await check('after-burst', 'src/g.ts', 'export const g = 1;\n');
    expect(r.ok, r.log).toBe(true);
    expect(r.log).toContain(`(incremental from the type-check of ${base.slice(0, 12)})`);
    // The eight newest are kept (this check's and seven of the burst), and the source's own.
    expect(existsSync(own)).toBe(true);
    expect(existsSync(burst[0]!)).toBe(false);
    expect(kept()).toContain(`${r.p.commit}.api.tsbuildinfo`);
    expect(kept()).toHaveLength(9);
  });

  it('a state that cannot be read or parsed makes a full check, never a failed one', async () => {
    const base = git(source, 'rev-parse', 'HEAD');
    const dir = join(source, '.git', 'kiln-check');
    rmSync(dir, { recursive: true, force: true });
    // A directory where the base's state should be.
    mkdirSync(join(dir, `${base}.api.tsbuildinfo`), { recursive: true });
    const unreadable = await check('unreadable', 'src/h.ts', 'export const h = 1;\n');
    expect(unreadable.ok, unreadable.log).toBe(true);
    expect(unreadable.log).toContain('(no earlier state: in full)');
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir);
    writeFileSync(join(dir, `${base}.api.tsbuildinfo`), '{"not": "a state"');
    const garbage = await check('garbage', 'src/h.ts', 'export const h = 1;\n');
    expect(garbage.ok, garbage.log).toBe(true);
    expect(garbage.log).toContain(`(incremental from the type-check of ${base.slice(0, 12)})`);
    expect(kept()).toContain(`${garbage.p.commit}.api.tsbuildinfo`);
  });

  it('tells an error `tsc --noEmit` reports too from one of declaration emit alone', () => {
    expect(failsWithoutEmit("src/b.ts(2,14): error TS2322: Type 'string' is not assignable to type 'number'.")).toBe(
      true,
    );
    expect(failsWithoutEmit("src/a.ts(1,7): error TS6133: 'x' is declared but its value is never read.")).toBe(true);
    expect(
      failsWithoutEmit(
        "src/f.ts(1,14): error TS4094: Property 'secret' of exported anonymous class type may not be private or protected.",
      ),
    ).toBe(false);
    expect(
      failsWithoutEmit(
        "src/g.ts(3,14): error TS2742: The inferred type of 'g' cannot be named without a reference to 'x'.",
      ),
    ).toBe(false);
    expect(failsWithoutEmit("error TS5023: Unknown compiler option 'x'.")).toBe(false);
    expect(failsWithoutEmit('')).toBe(false);
  });
});
