import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { HOSTILE_NAMES } from '../support/hostile-names.ts';
import { exec, sessionIn } from '../support/sandbox.ts';

/** The workspace is copied into /workspace; whatever code changes there is committed with provenance. */
describe('the workspace inside the sandbox', () => {
  const ctx = useAgentApp('sync');
  const git = (ws: string, ...args: string[]) =>
    execFileSync('git', ['-C', ctx.t.workspaces.dirOf(ws), ...args], { encoding: 'utf8' });

  it('an agent step that writes a memory and a skill becomes one commit by the agent, with the run', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, { approval: { mode: 'auto' } });
    const code = [
      'from pathlib import Path',
      'mem = Path("/workspace/MEMORY.md")',
      'mem.write_text(mem.read_text(encoding="utf-8") + "- Reports are due on Mondays.\\n", encoding="utf-8")',
      'skill = Path("/workspace/skills/weekly-report/SKILL.md")',
      'skill.parent.mkdir(parents=True, exist_ok=True)',
      'skill.write_text("---\\nname: weekly-report\\ndescription: Build the Monday report from the sales CSV.\\n---\\n# Weekly report\\n1. Load sales.csv\\n", encoding="utf-8")',
      'print("saved")',
    ].join('\n');
    ctx.fake.script(
      { content: `<thinking>Remember and write a skill.</thinking><python>${code}</python>` },
      { content: '<finish>Saved a memory and a skill.</finish>' },
    );
    const { run, events } = await converse(
      ctx.t,
      ctx.team.key,
      session,
      'Remember that reports are due on Mondays and make that a skill.',
    );
    expect(run.status).toBe('completed');
    const completed = events.find((e) => e.event === 'exec.completed')!.data as {
      commit: { sha: string; kind: string; paths: string[] };
    };
    expect(completed.commit.paths).toEqual(['MEMORY.md', 'skills/weekly-report/SKILL.md']);
    const msg = git(ws, 'log', '-1', '--format=%B');
    expect(msg).toContain('Kiln-Author: agent');
    expect(msg).toContain(`Kiln-Run: ${run.id}`);
    expect(msg).toContain(`Kiln-Session: ${session}`);
    expect(msg).toContain('Kiln-Kind: skill');
    expect(msg).toContain('Kiln-Kind: memory');
    expect(readFileSync(join(ctx.t.workspaces.dirOf(ws), 'MEMORY.md'), 'utf8')).toContain(
      '- Reports are due on Mondays.',
    );
    expect(ctx.fake.chats().at(-1).messages.at(-1).content).toMatch(
      /\[Committed\] [0-9a-f]{12}: MEMORY.md, skills\/weekly-report\/SKILL.md/,
    );
    const hits = await ctx.t.call('GET', `/v1/workspaces/${ws}/memory/search?q=Monday%20report`, { key: ctx.team.key });
    expect(hits.body.data.map((h: { path: string }) => h.path)).toEqual(
      expect.arrayContaining(['MEMORY.md', 'skills/weekly-report/SKILL.md']),
    );
    // The next prompt lists the new skill and shows the new memory.
    ctx.fake.script({ content: '<finish>ok</finish>' });
    await converse(ctx.t, ctx.team.key, session, 'next');
    const system = ctx.fake.chats().at(-1).messages[0].content as string;
    expect(system).toContain(
      '- weekly-report: Build the Monday report from the sales CSV. (/workspace/skills/weekly-report/SKILL.md)',
    );
    expect(system).toContain('- Reports are due on Mondays.');
  });

  it('changes to built-in skills, secrets and an over-budget MEMORY.md are refused or redacted, in the repo and in the sandbox', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, { evolution: { memory_max_entries: 2 } });
    const token = `ghp_${'Zz9'.repeat(12)}`;
    const r = await exec(
      ctx.t,
      ctx.team.key,
      session,
      [
        'import os',
        'p = "/workspace/skills/builtin/memory-keeping/SKILL.md"',
        'os.chmod(p, 0o644)',
        'open(p, "w").write("hijacked")',
        `open("/workspace/knowledge/creds.md", "w").write("token: ${token}\\n")`,
        'open("/workspace/MEMORY.md", "w").write("# Core memory\\n\\n- a\\n- b\\n- c\\n")',
        'open("/workspace/notes.md", "w").write("fine\\n")',
      ].join('\n'),
    );
    const w = (
      r as unknown as {
        workspace: {
          commit: { paths: string[]; author: string };
          redactions: { type: string }[];
          refused: { path: string; reason: string }[];
        };
      }
    ).workspace;
    expect(w.commit).toMatchObject({ author: 'user', paths: ['knowledge/creds.md', 'notes.md'] });
    expect(w.redactions.map((x) => x.type)).toEqual(['github_token']);
    expect(w.refused.map((x) => x.path).sort()).toEqual(['MEMORY.md', 'skills/builtin/memory-keeping/SKILL.md']);
    expect(w.refused.find((x) => x.path === 'MEMORY.md')!.reason).toMatch(/3 entries \(limit 2\)/);
    const inside = await exec(
      ctx.t,
      ctx.team.key,
      session,
      [
        'print(open("/workspace/skills/builtin/memory-keeping/SKILL.md").read()[:3])',
        'print(open("/workspace/knowledge/creds.md").read().strip())',
        'print(open("/workspace/MEMORY.md").read().count("\\n- "))',
      ].join('\n'),
    );
    expect(inside.stdout).toBe('---\ntoken: [REDACTED:github_token]\n0\n');
    expect(git(ws, 'show', 'HEAD:knowledge/creds.md')).not.toContain(token);
    expect(git(ws, 'status', '--porcelain')).toBe('');
  });

  it('a change made through the files API reaches a live sandbox; deleting in the sandbox commits a deletion', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team);
    await exec(ctx.t, ctx.team.key, session, 'print(1)');
    await ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=data/input.csv`, { key: ctx.team.key, raw: 'a,b\n1,2\n' });
    const seen = await exec(ctx.t, ctx.team.key, session, 'print(open("/workspace/data/input.csv").read())');
    expect(seen.stdout).toBe('a,b\n1,2\n\n');
    // Reading it was not a change: nothing to commit.
    expect((seen as unknown as { workspace: unknown }).workspace).toBeNull();
    const del = await exec(ctx.t, ctx.team.key, session, 'import os\nos.remove("/workspace/data/input.csv")');
    expect((del as unknown as { workspace: { commit: { paths: string[] } } }).workspace.commit.paths).toEqual([
      'data/input.csv',
    ]);
    expect(git(ws, 'ls-files', 'data')).toBe('');
  });
  it('names git refuses and ignore files written in the sandbox are ignored with a reason; nothing escapes the commit', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team);
    const names = HOSTILE_NAMES.filter((n) => !n.includes('\n') && n.length < 200);
    const code = [
      'import json, os',
      `names = json.loads(${JSON.stringify(JSON.stringify(names))})`,
      'for i, n in enumerate(names):',
      '    os.makedirs(f"/workspace/h/{i}/{n}", exist_ok=True)',
      '    open(f"/workspace/h/{i}/{n}/f.md", "w").write("x\\n")',
      'open("/workspace/.gitignore", "w").write("*.csv\\nsecret/\\n")',
      'open("/workspace/.gitattributes", "w").write("* working-tree-encoding=UTF-16\\n")',
      'os.makedirs("/workspace/secret", exist_ok=True)',
      'open("/workspace/secret/plan.md", "w").write("hidden plan\\n")',
      'open("/workspace/rows.csv", "w").write("a,b\\n")',
    ].join('\n');
    const r = (await exec(ctx.t, ctx.team.key, session, code)) as unknown as {
      workspace: { commit: { paths: string[] }; refused: { path: string; reason: string }[] };
    };
    const ignored = r.workspace.refused.map((x) => x.path);
    expect(ignored).toEqual(
      expect.arrayContaining(['.gitignore', '.gitattributes', 'h/0/.git./f.md', 'h/5/git~1/f.md']),
    );
    expect(r.workspace.refused.find((x) => x.path === '.gitignore')!.reason).toMatch(/reserved/);
    expect(r.workspace.commit.paths).toEqual(expect.arrayContaining(['rows.csv', 'secret/plan.md']));
    // Every path the sandbox reported was either committed or ignored with a reason.
    expect([...r.workspace.commit.paths, ...ignored].sort()).toEqual(
      ['.gitattributes', '.gitignore', 'rows.csv', 'secret/plan.md', ...names.map((n, i) => `h/${i}/${n}/f.md`)].sort(),
    );
    // Nothing in the host's working tree is outside a commit.
    expect(git(ws, 'ls-files', '-z', '--others', '--modified')).toBe('');
    const next = (await exec(
      ctx.t,
      ctx.team.key,
      session,
      'open("/workspace/next.md", "w").write("next\\n")',
    )) as unknown as { workspace: { commit: { paths: string[] } } };
    expect(next.workspace.commit.paths).toEqual(['next.md']);
  });
  it('a .gitignore written in the sandbox hides nothing from the commit, its secret scan or revert', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team);
    const first = (await exec(
      ctx.t,
      ctx.team.key,
      session,
      'open("/workspace/.gitignore", "w").write("secret/\\n")',
    )) as unknown as { workspace: { commit: unknown; refused: { path: string; reason: string }[] } };
    expect(first.workspace.commit).toBeNull();
    expect(first.workspace.refused).toEqual([{ path: '.gitignore', reason: expect.stringMatching(/reserved/) }]);
    const token = `ghp_${'Hh4'.repeat(12)}`;
    const second = (await exec(
      ctx.t,
      ctx.team.key,
      session,
      `import os\nos.makedirs("/workspace/secret", exist_ok=True)\nopen("/workspace/secret/plan.md", "w").write("token: ${token}\\n")`,
    )) as unknown as { workspace: { commit: { sha: string; paths: string[] }; redactions: { path: string }[] } };
    expect(second.workspace.commit.paths).toEqual(['secret/plan.md']);
    expect(second.workspace.redactions.map((r) => r.path)).toEqual(['secret/plan.md']);
    expect(git(ws, 'ls-files', '-z', '--others', '--modified')).toBe('');
    const rev = await ctx.t.call('POST', `/v1/workspaces/${ws}/commits/${second.workspace.commit.sha}/revert`, {
      key: ctx.team.key,
    });
    expect(rev.body.commit.paths).toEqual(['secret/plan.md']);
    expect(git(ws, 'ls-files', 'secret')).toBe('');
  });
});
