import { describe, expect, it } from 'vitest';
import { useAgentApp } from '../support/agent-app.ts';
import { converse } from '../support/agent.ts';
import { sessionIn } from '../support/sandbox.ts';

const day = (offset: number) => new Date(Date.now() - offset * 86_400_000).toISOString().slice(0, 10);

/** The tool messages answering the last assistant message with tool calls in a chat request. */
const toolAnswers = (chat: any): string[] => {
  const i = chat.messages.findLastIndex((m: any) => m.role === 'assistant' && m.tool_calls);
  return chat.messages
    .slice(i + 1)
    .filter((m: any) => m.role === 'tool')
    .map((m: any) => m.content as string);
};

describe('the agent recalls through memory_search', () => {
  const ctx = useAgentApp('recall');

  it('gets the matching lines with file:line and date, can filter by path and dates, and is told when a filter is bad', async () => {
    const { session, ws } = await sessionIn(ctx.t, ctx.team, {
      protocol: 'tools',
      approval: { mode: 'auto', rules: [] },
    });
    const old = day(150);
    const put = (path: string, raw: string) =>
      ctx.t.call('PUT', `/v1/workspaces/${ws}/files?path=${encodeURIComponent(path)}`, { key: ctx.team.key, raw });
    await put(
      `memory/${old}.md`,
      `# ${old}\n\n## Conversation\n\n- 10:00 Maya: Good morning.\n- 10:02 Leo: What did the vet say about Biscuit?\n- 10:03 Maya: Biscuit needs the booster vaccine in March.\n- 10:05 Leo: Good to know.\n`,
    );
    await put('knowledge/vet.md', '# Vet\n\nThe vet clinic is on Rua Augusta.\n');
    ctx.fake.script(
      {
        tool_calls: [
          { name: 'memory_search', arguments: { query: 'Biscuit vet vaccine' } },
          { name: 'memory_search', arguments: { query: 'vet', path: 'knowledge/' } },
          { name: 'memory_search', arguments: { query: 'vet', until: day(200) } },
          { name: 'memory_search', arguments: { query: 'vet', since: 'last week' } },
        ],
      },
      { tool_calls: [{ name: 'finish', arguments: { summary: 'Booster in March.' } }] },
    );
    const before = ctx.fake.chats().length;
    const { run, events } = await converse(ctx.t, ctx.team.key, session, 'When is the booster for Biscuit due?');
    expect(run.status).toBe('completed');
    const [first, second] = ctx.fake.chats().slice(before);
    // The prompt says when to search, and the tool offers the filters.
    expect(first.messages[0].content).toContain('<Memory_Search>');
    const tool = first.tools.find((x: any) => x.function.name === 'memory_search');
    expect(Object.keys(tool.function.parameters.properties)).toEqual(['query', 'path', 'since', 'until']);

    const [hit, byPath, byDate, bad] = toolAnswers(second);
    expect(hit).toContain(`/workspace/memory/${old}.md:`);
    expect(hit).toMatch(new RegExp(`memory/${old}\\.md:\\d+(-\\d+)? \\(${old}, "Conversation"\\)`));
    expect(hit).toContain('Biscuit needs the booster vaccine in March.');
    expect(byPath).toContain('/workspace/knowledge/vet.md:3 ("Vet")');
    expect(byPath).not.toContain('memory/');
    expect(byDate).toContain('nothing found');
    expect(bad).toContain('not run: since must be a date');
    const searched = events
      .filter((e) => e.event === 'memory.searched')
      .map((e) => e.data as { query: string; path?: string; hits: unknown[] });
    expect(searched.map((s) => [s.query, s.path ?? null, s.hits.length > 0])).toEqual([
      ['Biscuit vet vaccine', null, true],
      ['vet', 'knowledge/', true],
      ['vet', null, false],
      ['vet', null, false],
    ]);
  });
});
