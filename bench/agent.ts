/**
 * Agent benchmark (`npm run bench:agent`): the platform's own cost per agent step, with an
 * instant scripted model. Prints figures, never fails on time.
 *
 * A step = build the prompt from the workspace, call the model, parse, check policy, run code in
 * the sandbox, sync and commit the workspace, store messages and events. The same run measures
 * the two parts that are not Kiln's — a bare model call to the same endpoint and a bare sandbox
 * execution — and reports what remains.
 */
import OpenAI from 'openai';
import { createTestApp } from '../tests/support/app.ts';
import { converse, eventsUntil } from '../tests/support/agent.ts';
import { startFakeOpenAI } from '../tests/support/fake-openai.ts';
import { sessionIn } from '../tests/support/sandbox.ts';
import { cpuEach, cpuMs, heading, row, summarize, timeEach } from './lib.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 10);
const STEPS = Number(process.env.BENCH_STEPS ?? 10);

async function main() {
  const fake = await startFakeOpenAI();
  const t = await createTestApp({
    driver: process.env.DATABASE_URL ? 'postgres' : 'pglite',
    model: { baseURL: fake.url, model: 'fake-model' },
  });
  try {
    const team = await t.team('bench');
    const { session, ws } = await sessionIn(t, team, { approval: { mode: 'auto' }, max_steps: STEPS + 1 });
    const script = () =>
      fake.script(
        ...Array.from({ length: STEPS }, (_, i) => ({
          content: `<thinking>step ${i}</thinking><python>n = ${i}</python>`,
        })),
        { content: '<finish>done</finish>' },
      );

    heading(`1. ${RUNS} runs of ${STEPS} Python steps + finish (database ${t.database.driver})`);
    script();
    await converse(t, team.key, session, 'warm up');
    const perStep: number[] = [];
    const cpuPerStep: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      script();
      const t0 = performance.now();
      const c0 = cpuMs();
      const { run } = await converse(t, team.key, session, `run ${i}`);
      perStep.push((performance.now() - t0) / run.steps);
      cpuPerStep.push((cpuMs() - c0) / run.steps);
    }
    const step = summarize(perStep);

    heading('2. the parts that are not Kiln, measured alone in the same run');
    const client = new OpenAI({ baseURL: fake.url, apiKey: 'k', maxRetries: 0 });
    const messages = (fake.chats().at(-1).messages as OpenAI.ChatCompletionMessageParam[]).slice();
    const modelCall = async () => {
      fake.script({ content: '<python>n = 1</python>' });
      const stream = await client.chat.completions.create({
        model: 'fake-model',
        messages,
        stream: true,
        stream_options: { include_usage: true },
      });
      for await (const _ of stream) void _;
    };
    const model = summarize(await timeEach(RUNS * STEPS, modelCall));
    const modelCpu = summarize(await cpuEach(RUNS * STEPS, modelCall));
    const settings = (await t.call('GET', `/v1/workspaces/${ws}`, { key: team.key })).body.settings.sandbox;
    const limits = t.engine.settings.limitsFor(settings);
    // The same session's sandbox, with its workspace copy synced after each execution, as in a step.
    const ctx = {
      teamId: team.id,
      workspaceId: ws,
      sessionId: session,
      workspaceDir: t.workspaces.dirOf(ws),
      runtime: settings.runtime,
    };
    const sandbox = summarize(await timeEach(RUNS * STEPS, () => t.engine.exec(ctx, limits, 'n = 1')));
    const sandboxCpu = summarize(await cpuEach(RUNS * STEPS, () => t.engine.exec(ctx, limits, 'n = 1')));
    process.stdout.write(`${row('model call to the scripted endpoint', model)}\n`);
    process.stdout.write(`${row('sandbox exec + workspace sync (engine)', sandbox)}\n`);
    process.stdout.write(`${row('one agent step, end to end', step)}\n`);
    const overhead = { n: step.n, p50: step.p50 - model.p50 - sandbox.p50, p95: step.p95 - model.p50 - sandbox.p50 };
    process.stdout.write(`${row('Kiln overhead per step (step − model − exec)', overhead)}\n`);
    // CPU time of this process is not inflated by other load on the machine (or a hypervisor's
    // steal time) the way wall-clock time is: the same subtraction, in CPU milliseconds.
    const stepCpu = summarize(cpuPerStep);
    process.stdout.write(`${row('CPU: one agent step (this process)', stepCpu)}\n`);
    process.stdout.write(
      `${row('CPU: model call + sandbox exec alone', { n: modelCpu.n, p50: modelCpu.p50 + sandboxCpu.p50, p95: modelCpu.p95 + sandboxCpu.p95 })}\n`,
    );
    process.stdout.write(
      `${row('CPU: Kiln per step (step − model − exec)', { n: stepCpu.n, p50: stepCpu.p50 - modelCpu.p50 - sandboxCpu.p50, p95: stepCpu.p95 - modelCpu.p50 - sandboxCpu.p50 })}\n`,
    );

    heading('3. cancel: from POST /cancel to run.cancelled, while code spins in the sandbox');
    const cancelTimes: number[] = [];
    const cancel = summarize(
      await timeEach(5, async () => {
        fake.script({ content: '<python>print("go", flush=True)\nwhile True:\n    pass</python>' });
        const r = await t.call('POST', `/v1/sessions/${session}/messages`, {
          key: team.key,
          body: { content: 'spin' },
        });
        await eventsUntil(t, r.body.run.id, ['exec.output']);
        const t0 = performance.now();
        await t.call('POST', `/v1/runs/${r.body.run.id}/cancel`, { key: team.key });
        await eventsUntil(t, r.body.run.id, ['run.cancelled']);
        cancelTimes.push(performance.now() - t0);
      }).then(() => cancelTimes),
    );
    process.stdout.write(`${row('cancel → run.cancelled', cancel)}\n\n`);
  } finally {
    await t.close();
    await fake.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
