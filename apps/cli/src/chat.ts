import type { Interface } from 'node:readline';
import type { Kiln } from '@kiln/sdk';
import { describeError } from './errors.ts';

const COLOURS = {
  reset: '\x1b[0m',
  green: '\x1b[32m',
  cyan: '\x1b[36m',
  magenta: '\x1b[35m',
  red: '\x1b[31m',
  yellow: '\x1b[33m',
  dim: '\x1b[2m',
};
type Palette = typeof COLOURS;

/**
 * Colours only for a terminal that shows them: Node's own `hasColors()` (a TTY, and NO_COLOR /
 * FORCE_COLOR / TERM as the conventions say); a pipe or a file gets plain text.
 */
function paletteFor(out: NodeJS.WritableStream): Palette {
  const tty = out as NodeJS.WritableStream & { hasColors?: () => boolean };
  const forced = process.env.FORCE_COLOR;
  const on = typeof tty.hasColors === 'function' ? tty.hasColors() : Boolean(forced) && forced !== '0';
  return on ? COLOURS : (Object.fromEntries(Object.keys(COLOURS).map((k) => [k, ''])) as Palette);
}

/**
 * The agent's terminal loop over the SDK: thinking, code, output and the finish in colour, live
 * from the run's event stream (`runs.stream`, which resumes by itself when the connection
 * drops); approvals asked inline as y/n/a (a = approve for the session, `approvals.decide`);
 * Ctrl-C cancels the running run; `exit` quits.
 */
export async function chat(kiln: Kiln, workspace: string, rl: Interface, out: NodeJS.WritableStream): Promise<void> {
  const C = paletteFor(out);
  // Take lines from the start: input piped in before the session exists must not be lost.
  const lines = rl[Symbol.asyncIterator]();
  const ws = await kiln.workspaces.resolve(workspace);
  const session = await kiln.sessions.create(ws.id, { title: 'kiln chat' });
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
    // Ctrl-C is listened for from the moment the message is sent: one pressed before the answer
    // (the run's id) arrives cancels the run as soon as it does, instead of being lost.
    let runId: string | undefined;
    let cancelling = false;
    const cancel = (id: string) => void kiln.runs.cancel(id).catch(() => undefined);
    const abort = new AbortController();
    const onSigint = () => {
      out.write(`\n${C.yellow}cancelling…${C.reset}\n`);
      cancelling = true;
      if (runId) cancel(runId);
    };
    rl.on('SIGINT', onSigint);
    process.on('SIGINT', onSigint);
    try {
      try {
        runId = (await kiln.messages.send(session.id, input)).run.id;
      } catch (err) {
        out.write(`${C.red}${describeError(err)}${C.reset}\n`);
        continue;
      }
      if (cancelling) cancel(runId);
      for await (const ev of kiln.runs.stream(runId, { signal: abort.signal })) {
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
          await kiln.approvals
            .decide(d.approval_id!, decision)
            .catch((err) => out.write(`${C.red}${describeError(err)}${C.reset}\n`));
        } else if (ev.event === 'message.created' && d.role === 'assistant')
          out.write(`\n${C.green}[finished] ${d.content}${C.reset}\n`);
        else if (ev.event === 'run.failed')
          out.write(`${C.red}[failed] ${d.error?.code}: ${d.error?.message}${C.reset}\n`);
        else if (ev.event === 'run.cancelled') out.write(`${C.yellow}[cancelled]${C.reset}\n`);
      }
    } catch (err) {
      out.write(`${C.red}${describeError(err)}${C.reset}\n`);
    } finally {
      abort.abort();
      rl.off('SIGINT', onSigint);
      process.off('SIGINT', onSigint);
    }
  }
  await kiln.sessions.end(session.id).catch(() => undefined);
  out.write(`${C.green}bye${C.reset}\n`);
}
