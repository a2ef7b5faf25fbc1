import type { Interface } from 'node:readline';
import type { KilnClient } from './client.ts';
import type { Run, Session } from './views.ts';

const C = {
  reset: '\x1b[0m',
  green: '\x1b[32m',
  cyan: '\x1b[36m',
  magenta: '\x1b[35m',
  red: '\x1b[31m',
  yellow: '\x1b[33m',
  dim: '\x1b[2m',
};

/**
 * The agent's terminal loop over the HTTP API: thinking, code, output and the finish in colour,
 * live from the run's SSE stream; approvals asked inline as y/n/a (a = approve for the
 * session); Ctrl-C cancels the running run; `exit` quits.
 */
export async function chat(
  client: KilnClient,
  workspace: string,
  rl: Interface,
  out: NodeJS.WritableStream,
): Promise<void> {
  // Take lines from the start: input piped in before the session exists must not be lost.
  const lines = rl[Symbol.asyncIterator]();
  const ws = await client.workspace(workspace);
  const session = await client.call<Session>('POST', `/v1/workspaces/${ws.id}/sessions`, { title: 'kiln chat' });
  const ask = async (prompt: string): Promise<string | null> => {
    out.write(prompt);
    const next = await lines.next();
    return next.done ? null : String(next.value).trim();
  };
  out.write(`${C.green}=== Kiln chat — workspace ${ws.name} (session ${session.id}) ===${C.reset}\n`);
  for (;;) {
    const input = await ask(`\n${C.green}╭─[you]\n╰─> ${C.reset}`);
    if (input === null || ['exit', 'quit'].includes(input.toLowerCase())) break;
    if (!input) continue;
    let runId: string;
    try {
      runId = (await client.call<{ run: Run }>('POST', `/v1/sessions/${session.id}/messages`, { content: input })).run
        .id;
    } catch (err) {
      out.write(`${C.red}${(err as Error).message}${C.reset}\n`);
      continue;
    }
    const abort = new AbortController();
    const onSigint = () => {
      out.write(`\n${C.yellow}cancelling…${C.reset}\n`);
      void client.call('POST', `/v1/runs/${runId}/cancel`).catch(() => undefined);
    };
    rl.on('SIGINT', onSigint);
    process.on('SIGINT', onSigint);
    try {
      for await (const ev of client.events(runId, abort.signal)) {
        const d = ev.data;
        if (ev.event === 'thinking' && !d.protocol_violation) out.write(`${C.cyan}[thinking] ${d.text}${C.reset}\n`);
        else if (ev.event === 'thinking')
          out.write(`${C.red}[protocol violation ${d.attempt}/3] correcting…${C.reset}\n`);
        else if (ev.event === 'code.proposed')
          out.write(`${C.magenta}${'─'.repeat(40)}\n${d.code}\n${'─'.repeat(40)}${C.reset}\n`);
        else if (ev.event === 'exec.output')
          out.write(d.stream === 'stderr' ? `${C.red}${d.data}${C.reset}` : (d.data ?? ''));
        else if (ev.event === 'exec.completed') {
          if (d.error) out.write(`${C.red}[${d.error.type}] ${d.error.message}${C.reset}\n`);
          if (d.commit)
            out.write(`${C.dim}[committed ${d.commit.sha.slice(0, 10)}: ${d.commit.paths.join(', ')}]${C.reset}\n`);
        } else if (ev.event === 'memory.searched')
          out.write(`${C.dim}[memory search "${d.query}": ${d.hits?.length ?? 0} hit(s)]${C.reset}\n`);
        else if (ev.event === 'context.condensed')
          out.write(`${C.dim}[context condensed ${d.before_tokens} → ${d.after_tokens} tokens]${C.reset}\n`);
        else if (ev.event === 'approval.requested') {
          let answer: string | null = '';
          while (answer !== null && !['y', 'n', 'a'].includes(answer))
            answer = await ask(`${C.yellow}⚠ run this code? (y/n/a — a approves for this session) ${C.reset}`);
          const decision = answer === 'y' ? 'approve' : answer === 'a' ? 'approve_session' : 'deny';
          await client
            .call('POST', `/v1/approvals/${d.approval_id}`, { decision })
            .catch((err) => out.write(`${C.red}${(err as Error).message}${C.reset}\n`));
        } else if (ev.event === 'message.created' && d.role === 'assistant')
          out.write(`\n${C.green}[finished] ${d.content}${C.reset}\n`);
        else if (ev.event === 'run.failed')
          out.write(`${C.red}[failed] ${d.error?.code}: ${d.error?.message}${C.reset}\n`);
        else if (ev.event === 'run.cancelled') out.write(`${C.yellow}[cancelled]${C.reset}\n`);
        if (['run.completed', 'run.failed', 'run.cancelled'].includes(ev.event)) break;
      }
    } finally {
      abort.abort();
      rl.off('SIGINT', onSigint);
      process.off('SIGINT', onSigint);
    }
  }
  await client.call('DELETE', `/v1/sessions/${session.id}`).catch(() => undefined);
  out.write(`${C.green}bye${C.reset}\n`);
}
