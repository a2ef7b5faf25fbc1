import { readFileSync } from 'node:fs';
import type { EgressEvent } from '../../apps/api/src/sandbox/backend.ts';
import type { TestApp } from './app.ts';

/**
 * The runtimes the sandbox suites run under (describe.each). A gvisor run fails, not skips,
 * when the server does not offer gvisor: creating its workspace is then a 400.
 */
export const RUNTIMES = ['runc', 'gvisor'] as const;

/** A team, a workspace (with optional settings) and an active session in it. */
export async function sessionIn(
  t: TestApp,
  team: { key: string },
  settings?: unknown,
): Promise<{ ws: string; session: string }> {
  const ws = await t.call('POST', '/v1/workspaces', {
    key: team.key,
    body: { name: `ws-${Math.random().toString(36).slice(2, 10)}`, settings },
  });
  if (ws.status !== 201) throw new Error(`workspace: ${JSON.stringify(ws.body)}`);
  const s = await t.call('POST', `/v1/workspaces/${ws.body.id}/sessions`, { key: team.key, body: {} });
  if (s.status !== 201) throw new Error(`session: ${JSON.stringify(s.body)}`);
  return { ws: ws.body.id, session: s.body.id };
}

/** A 5xx's cause as the server logged it (a rare one is otherwise gone with the test's app). */
function serverErrorOf(t: TestApp, body: unknown): string {
  const id = (body as { error?: { request_id?: string } } | undefined)?.error?.request_id;
  const logged = id ? t.logs.filter((l) => l.request_id === id && (l.level as number) >= 50) : [];
  return logged.length ? `\nserver log: ${JSON.stringify(logged)}` : '';
}

/** POST /v1/sessions/{session}/exec, returning the parsed result. */
export async function exec(t: TestApp, key: string, session: string, code: string, timeout_s?: number) {
  const r = await t.call('POST', `/v1/sessions/${session}/exec`, { key, body: { code, timeout_s } });
  if (r.status !== 200) throw new Error(`exec ${r.status}: ${JSON.stringify(r.body)}${serverErrorOf(t, r.body)}`);
  return r.body as {
    stdout: string;
    stderr: string;
    error?: { type: string; message: string; traceback?: string };
    exit_code: number;
    truncated: boolean;
    stdout_bytes: number;
    stderr_bytes: number;
    restarted: boolean;
    artifacts: { name: string; mime: string; base64: string }[];
    sandbox_id: string;
    execution_id: string;
    duration_ms: number;
    egress: EgressEvent[];
  };
}

/** Whether `dir` is a mount point of this process's mount namespace (the fifth field of mountinfo). */
export function mountedHere(dir: string): boolean {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .some((l) => l.split(' ')[4] === dir);
}
