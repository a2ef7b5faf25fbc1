/**
 * Memory benchmark (`npm run bench:memory`): prints figures, never fails on time.
 *
 *  1. index 10,000 chunks of generated Markdown into one workspace
 *  2. search p50/p95 (full-text + substring ranking) vs a baseline measured in the same run:
 *     scanning every chunk's text in process memory
 *  3. commit latency p50/p95 of a one-file change through the workspace service (lock, secret
 *     scan, git commit, mirror row, re-index) vs `git add && git commit` run directly
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pino from 'pino';
import { createTeam } from '../apps/api/src/auth/teams.ts';
import { openDatabase } from '../apps/api/src/db/client.ts';
import { reindexAll } from '../apps/api/src/memory/indexer.ts';
import { WorkspaceRepos } from '../apps/api/src/workspace/git-repos.ts';
import { WorkspaceService } from '../apps/api/src/workspace/service.ts';
import { heading, row, summarize, timeEach } from './lib.ts';

const CHUNKS = Number(process.env.BENCH_CHUNKS ?? 10_000);
const QUERIES = Number(process.env.BENCH_QUERIES ?? 200);
const COMMITS = Number(process.env.BENCH_COMMITS ?? 100);
const template = fileURLToPath(new URL('../workspace-template', import.meta.url));

let seed = 42;
const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)]!;
/** Zipf-like: low ranks are common, high ranks rare, as in real text. */
const zipf = <T>(xs: T[]) => xs[Math.min(xs.length - 1, Math.floor(xs.length ** rand()) - 1)]!;

// A vocabulary of 4,000 made-up words and 300 two-character Chinese words.
const SYLLABLES = 'ka lo mi ren tas vor pel dun shi gra ber nox tul fen qua zim hal der sor wyn'.split(' ');
const WORDS = Array.from({ length: 4000 }, () =>
  Array.from({ length: 2 + Math.floor(rand() * 2) }, () => pick(SYLLABLES)).join(''),
);
const HAN = '部署流程测试数据报告客户预算监控网络服务配置日志版本发布回滚缓存队列节点集群'.split('');
const CJK = Array.from({ length: 300 }, () => pick(HAN) + pick(HAN));
const sentence = () =>
  Array.from({ length: 8 + Math.floor(rand() * 10) }, () => (rand() < 0.08 ? zipf(CJK) : zipf(WORDS))).join(' ');

async function main() {
  const dataDir = mkdtempSync(join(tmpdir(), 'kiln-bench-mem-'));
  const database = await openDatabase(process.env.DATABASE_URL ? { url: process.env.DATABASE_URL } : { dataDir });
  const service = new WorkspaceService(
    database.db,
    new WorkspaceRepos(join(dataDir, 'ws'), template),
    { maxFileBytes: 1 << 20 },
    pino({ level: 'silent' }),
  );
  try {
    const team = await createTeam(database.db, `bench-${process.pid}`);
    const ws = await service.create(team.id, { name: 'bench' });
    const dir = service.dirOf(ws.id);

    heading(`1. index ${CHUNKS} chunks (database ${database.driver})`);
    const perFile = 40;
    const files = Math.ceil(CHUNKS / perFile);
    const texts: string[] = [];
    mkdirSync(join(dir, 'knowledge/gen'), { recursive: true });
    for (let f = 0; f < files; f++) {
      const sections = Array.from({ length: perFile }, (_, s) => {
        const body = `${sentence()}.\n${sentence()}.\n${sentence()}.`;
        texts.push(body);
        return `## Section ${f}-${s}\n\n${body}\n`;
      });
      writeFileSync(join(dir, `knowledge/gen/page-${f}.md`), `# Page ${f}\n\n${sections.join('\n')}`);
    }
    const t0 = performance.now();
    const indexed = await reindexAll(database.db, { id: ws.id, teamId: team.id, dir });
    process.stdout.write(`  indexed ${indexed} chunks in ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
    await service.commitPending(ws, { author: 'system' }, { summary: 'Generated pages' });

    heading(`2. search, ${QUERIES} queries of 1–3 words (Zipf-distributed words, some Chinese)`);
    const queries = Array.from({ length: QUERIES }, () =>
      Array.from({ length: 1 + Math.floor(rand() * 3) }, () => (rand() < 0.2 ? zipf(CJK) : zipf(WORDS))).join(' '),
    );
    const lowered = texts.map((t) => t.toLowerCase());
    const scan = summarize(
      await timeEach(QUERIES, async (i) => {
        const terms = queries[i]!.split(' ');
        lowered
          .map((t, j) => ({ j, hits: terms.filter((w) => t.includes(w)).length }))
          .filter((x) => x.hits)
          .sort((a, b) => b.hits - a.hits)
          .slice(0, 8);
      }),
    );
    const search = summarize(await timeEach(QUERIES, (i) => service.search(ws, queries[i]!, { k: 8 }), 5));
    process.stdout.write(`${row('baseline: scan all chunk texts in memory', scan)}\n`);
    process.stdout.write(`${row('Kiln: searchMemory (BM25, k=8)', search, scan)}\n`);

    heading(`3. commit latency, ${COMMITS} one-file changes`);
    const raw = mkdtempSync(join(tmpdir(), 'kiln-bench-git-'));
    const git = (...args: string[]) => execFileSync('git', ['-C', raw, ...args], { stdio: 'ignore' });
    git('init', '-q');
    const direct = summarize(
      await timeEach(COMMITS, async (i) => {
        writeFileSync(join(raw, 'MEMORY.md'), `# Core memory\n\n- fact ${i}\n`);
        git('add', '-A');
        git('-c', 'user.name=b', '-c', 'user.email=b@b', 'commit', '-qm', `fact ${i}`);
      }),
    );
    rmSync(raw, { recursive: true, force: true });
    const viaService = summarize(
      await timeEach(COMMITS, (i) =>
        service.writeFile(ws, 'MEMORY.md', Buffer.from(`# Core memory\n\n- fact number ${i}\n`), { author: 'user' }),
      ),
    );
    process.stdout.write(`${row('baseline: git add && git commit (CLI)', direct)}\n`);
    process.stdout.write(`${row('Kiln: write + commit + mirror + re-index', viaService, direct)}\n\n`);
  } finally {
    await database.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
