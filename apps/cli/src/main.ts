import { createInterface } from 'node:readline';
import { createKiln } from '@kiln/sdk';
import { chat } from './chat.ts';
import { describeError } from './errors.ts';

const USAGE = `kiln — the Kiln command line (talks to the HTTP API through @kiln/sdk)

  kiln chat WORKSPACE                 interactive agent session (y/n/a approvals, Ctrl-C cancels, exit quits)
  kiln workspaces                     list workspaces
  kiln sessions WORKSPACE             list a workspace's sessions
  kiln runs [WORKSPACE] [--status S]  the team's runs, newest first (of a workspace; S: in_progress,…)
  kiln run RUN                        show a run
  kiln approvals [--pending]          list approvals
  kiln log WORKSPACE [--kind K]       the workspace's commits
  kiln revert WORKSPACE SHA           revert a commit (a new commit)
  kiln exec SESSION CODE              run Python in a session's sandbox
  kiln evolutions WORKSPACE           the evolution log: reviews and dreams, what they changed
  kiln review WORKSPACE [SESSION]     run the post-session review now
  kiln dream WORKSPACE [--days N]     consolidate memory now
  kiln undo WORKSPACE EVOLUTION       undo what a review or dream committed

  --json prints the API's JSON.  Environment: KILN_URL (default http://127.0.0.1:7700), KILN_API_KEY.`;

async function main(argv: string[]): Promise<number> {
  const json = argv.includes('--json');
  const args = argv.filter((a) => a !== '--json');
  const [cmd, ...rest] = args;
  if (!cmd || cmd === 'help' || cmd === '--help') {
    process.stdout.write(`${USAGE}\n`);
    return cmd ? 0 : 2;
  }
  const key = process.env.KILN_API_KEY;
  if (!key) {
    process.stderr.write('kiln: set KILN_API_KEY to a team key\n');
    return 2;
  }
  const kiln = createKiln({ baseUrl: process.env.KILN_URL ?? 'http://127.0.0.1:7700', apiKey: key });
  const print = (value: unknown, table: () => string) =>
    process.stdout.write(`${json ? JSON.stringify(value, null, 2) : table()}\n`);
  const need = (n: number, what: string) => {
    if (rest.length < n) throw new Error(`usage: kiln ${cmd} ${what}`);
  };
  switch (cmd) {
    case 'chat': {
      need(1, 'WORKSPACE');
      const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: process.stdin.isTTY });
      await chat(kiln, rest[0]!, rl, process.stdout);
      rl.close();
      return 0;
    }
    case 'workspaces': {
      const r = await kiln.workspaces.list({ limit: 100 });
      print(r, () =>
        r.data
          .map(
            (w) =>
              `${w.id}  ${w.name}  head ${w.head?.slice(0, 10) ?? '-'}  ${w.settings.protocol}/${w.settings.approval.mode}`,
          )
          .join('\n'),
      );
      return 0;
    }
    case 'sessions': {
      need(1, 'WORKSPACE');
      const ws = await kiln.workspaces.resolve(rest[0]!);
      const r = await kiln.sessions.list(ws.id, { limit: 100 });
      print(r, () =>
        r.data.map((s) => `${s.id}  ${s.status}  ${s.title ?? ''}  last ${s.last_activity_at}`).join('\n'),
      );
      return 0;
    }
    case 'runs': {
      // Every run of the team, or of one workspace; a run id shows that run (as `kiln run`).
      if (rest[0]?.startsWith('run_')) return main(['run', ...rest, ...(json ? ['--json'] : [])]);
      const at = rest.indexOf('--status');
      const status = at >= 0 ? rest[at + 1] : undefined;
      const named = rest.filter((_, i) => i !== at && i !== at + 1)[0];
      const workspace = named ? (await kiln.workspaces.resolve(named)).id : undefined;
      const r = await kiln.runs.list({ limit: 50, ...(workspace ? { workspace } : {}), ...(status ? { status } : {}) });
      print(r, () =>
        r.data.length
          ? r.data
              .map(
                (x) =>
                  `${x.id}  ${x.status.padEnd(15)} steps ${String(x.steps).padStart(3)}  session ${x.session_id}  ${x.created_at}`,
              )
              .join('\n')
          : 'no runs',
      );
      return 0;
    }
    case 'run': {
      need(1, 'RUN');
      const r = await kiln.runs.get(rest[0]!);
      print(
        r,
        () =>
          `${r.id}  ${r.status}  steps ${r.steps}  tokens ${r.usage.prompt_tokens}+${r.usage.completion_tokens}${r.error ? `  ${r.error.code}: ${r.error.message}` : ''}`,
      );
      return 0;
    }
    case 'approvals': {
      const r = await kiln.approvals.list(rest.includes('--pending') ? { status: 'pending' } : {});
      print(r, () =>
        r.data
          .map(
            (a) =>
              `${a.id}  ${a.status}  run ${a.run_id}  expires ${a.expires_at}\n    ${a.code.split('\n').join('\n    ')}`,
          )
          .join('\n'),
      );
      return 0;
    }
    case 'log': {
      need(1, 'WORKSPACE');
      const ws = await kiln.workspaces.resolve(rest[0]!);
      // The server checks the kind (a wrong one is its invalid_request, naming the ones it takes).
      const kind = rest.indexOf('--kind') >= 0 ? rest[rest.indexOf('--kind') + 1] : undefined;
      const r = await kiln.commits.list(ws.id, { limit: 50, ...(kind ? { kind: kind as 'user' } : {}) });
      print(r, () =>
        r.data.map((c) => `${c.sha.slice(0, 10)}  ${c.kind.padEnd(9)} ${c.author.padEnd(6)} ${c.summary}`).join('\n'),
      );
      return 0;
    }
    case 'revert': {
      need(2, 'WORKSPACE SHA');
      const ws = await kiln.workspaces.resolve(rest[0]!);
      const r = await kiln.commits.revert(ws.id, rest[1]!);
      print(r, () => `reverted: new commit ${r.commit?.sha.slice(0, 10)} ${r.commit?.summary}`);
      return 0;
    }
    case 'exec': {
      need(2, 'SESSION CODE');
      const r = await kiln.sessions.exec(rest[0]!, rest.slice(1).join(' '));
      print(r, () => `${r.stdout}${r.stderr}${r.error ? `[${r.error.type}] ${r.error.message}` : ''}`.trimEnd());
      return r.error ? 1 : 0;
    }
    case 'evolutions': {
      need(1, 'WORKSPACE');
      const ws = await kiln.workspaces.resolve(rest[0]!);
      const r = await kiln.evolutions.list(ws.id, { limit: 50 });
      print(r, () =>
        r.data
          .map(
            (e) =>
              `${e.id}  ${e.kind.padEnd(6)} ${e.status.padEnd(9)} ${e.commit_sha?.slice(0, 10) ?? '-'.padEnd(10)}  ${e.summary ?? e.error ?? ''}${e.changed_paths.length ? `\n    ${e.changed_paths.join(', ')}` : ''}`,
          )
          .join('\n'),
      );
      return 0;
    }
    case 'review':
    case 'dream': {
      need(1, cmd === 'review' ? 'WORKSPACE [SESSION]' : 'WORKSPACE [--days N]');
      const ws = await kiln.workspaces.resolve(rest[0]!);
      const days = rest.indexOf('--days') >= 0 ? Number(rest[rest.indexOf('--days') + 1]) : undefined;
      const r =
        cmd === 'review'
          ? await kiln.evolutions.review(ws.id, rest[1] ? { session_id: rest[1] } : {})
          : await kiln.evolutions.dream(ws.id, days ? { days } : {});
      print(r, () => `${r.id}  ${r.kind} ${r.status}: follow it with kiln evolutions ${rest[0]}`);
      return 0;
    }
    case 'undo': {
      need(2, 'WORKSPACE EVOLUTION');
      const ws = await kiln.workspaces.resolve(rest[0]!);
      const r = await kiln.evolutions.undo(ws.id, rest[1]!);
      print(
        r,
        () =>
          `undone: ${r.evolution.id} reverted by commit ${r.commit_sha.slice(0, 10)} (${r.evolution.changed_paths.join(', ')})`,
      );
      return 0;
    }
    default:
      process.stderr.write(`kiln: unknown command ${cmd}\n${USAGE}\n`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`kiln: ${describeError(err)}\n`);
    process.exit(1);
  },
);
