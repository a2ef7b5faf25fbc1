import { describe, expect, it } from 'vitest';
import { decideTool } from '../../apps/api/src/agent/policy.ts';
import { parseToolCall, parseXml } from '../../apps/api/src/agent/protocol.ts';
import { fromToolApprovalText, toolApprovalText } from '../../apps/api/src/agent/tool-calls.ts';
import { cleanSchema, cleanText } from '../../apps/api/src/mcp/client-bounds.ts';
import { nativeName, resolveHeaders } from '../../apps/api/src/mcp/client.ts';
import { DEFAULT_SETTINGS, SettingsPatch, WorkspaceSettings } from '../../apps/api/src/workspace/settings.ts';

const policy = (rules: unknown[], mode: 'ask' | 'auto' | 'deny' = 'auto') =>
  WorkspaceSettings.parse({ ...DEFAULT_SETTINGS, approval: { mode, rules, timeout_s: 600 } }).approval;

describe('MCP tools: names, bounds, parsing, policy', () => {
  it('native names stay in the API charset and length, and differ for different tools', () => {
    expect(nativeName('gh', 'create_issue')).toBe('gh__create_issue');
    expect(nativeName('gh', 'repos/list.all')).toBe('gh__repos_list_all');
    const long = nativeName('server-name', 'x'.repeat(128));
    expect(long).toMatch(/^[A-Za-z0-9_-]{1,64}$/);
    expect(long).not.toBe(nativeName('server-name', `${'x'.repeat(127)}y`));
  });

  it('header values get secrets filled in; an unknown one is an error naming it', () => {
    const secrets = [{ name: 'TOKEN', value: 'sekrit-value' }];
    expect(resolveHeaders({ Authorization: 'Bearer ${secrets.TOKEN}', 'X-A': 'plain' }, secrets)).toEqual({
      Authorization: 'Bearer sekrit-value',
      'X-A': 'plain',
    });
    expect(() => resolveHeaders({ 'X-K': '${secrets.OTHER}' }, secrets)).toThrow(/references the secret OTHER/);
  });

  it('a hostile schema is rebuilt from known keywords, bounded, always an object schema', () => {
    expect(cleanSchema({ type: 'string' })).toEqual({ type: 'object', properties: {} });
    expect(cleanSchema('nonsense')).toEqual({ type: 'object', properties: {} });
    const s = cleanSchema({
      type: 'object',
      properties: {
        a: { type: 'weird', description: 'x\u0000y' },
        'bad key!': { type: 'string' },
        b: { type: 'array', items: { type: 'string', enum: ['x', { no: 1 }] } },
      },
      required: ['a', 'missing', 3],
      $ref: '#/definitions/evil',
    });
    expect(s).toEqual({
      type: 'object',
      properties: { a: { description: 'x y' }, b: { type: 'array', items: { type: 'string', enum: ['x'] } } },
      required: ['a'],
    });
    const huge = cleanSchema({
      type: 'object',
      properties: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`p${i}`, { description: 'd'.repeat(200) }])),
    });
    expect(JSON.stringify(huge).length).toBeLessThan(4100);
    expect(cleanText('a\nb\u202Ec'.repeat(100), 50)).toHaveLength(50);
  });

  it('XML <tool>: name and JSON arguments, or the problem to tell the model', () => {
    expect(parseXml('<thinking>t</thinking><tool name="gh.create_issue">{"title": "x"}</tool>').action).toEqual({
      type: 'tool',
      server: 'gh',
      tool: 'create_issue',
      arguments: { title: 'x' },
    });
    expect(parseXml('<tool name="gh.list"></tool>').action).toMatchObject({ tool: 'list', arguments: {} });
    expect(parseXml('<tool name="gh.x">{"a": </tool>').action).toMatchObject({
      problem: expect.stringMatching(/not valid JSON/),
    });
    expect(parseXml('<tool name="gh.x">[1]</tool>').action).toMatchObject({
      problem: expect.stringMatching(/one JSON object/),
    });
    expect(parseXml('<tool>{}</tool>').action).toMatchObject({ problem: expect.stringMatching(/server\.tool/) });
    // <python> comes first, <tools> is not <tool>.
    expect(parseXml('<python>print(1)</python><tool name="a.b">{}</tool>').action).toMatchObject({ type: 'python' });
    expect(parseXml('<tools name="a.b">{}</tools>').action).toBeNull();
  });

  it('native calls map back through the offered tools only', () => {
    const offered = [{ server: 'gh', name: 'create.issue', native: 'gh__create_issue', description: '', schema: {} }];
    const call = (name: string, args: string) => parseToolCall({ id: 'c1', name, arguments: args }, offered);
    expect(call('gh__create_issue', '{"title":"x"}')).toEqual({
      toolCallId: 'c1',
      action: { type: 'tool', server: 'gh', tool: 'create.issue', arguments: { title: 'x' } },
    });
    expect(call('gh__other', '{}')).toMatchObject({ violation: expect.stringMatching(/unknown tool gh__other/) });
    expect(call('gh__create_issue', '{')).toMatchObject({
      action: { problem: expect.stringMatching(/not valid JSON/) },
    });
  });

  it('rules: code rules never apply to tools and tool rules never to code; deny, ask, allow, then the mode', () => {
    const c = { server: 'gh', tool: 'create_issue', arguments: { title: 'prod down' } };
    expect(decideTool(policy([{ match: '.', behavior: 'deny' }]), c)).toEqual({ decision: 'allow' });
    expect(decideTool(policy([{ tool: 'gh.create_issue', behavior: 'ask' }]), c)).toEqual({
      decision: 'ask',
      rule: 'tool gh.create_issue',
    });
    expect(
      decideTool(
        policy(
          [
            { tool: 'gh.*', behavior: 'deny' },
            { tool: '*', behavior: 'allow' },
          ],
          'ask',
        ),
        c,
      ),
    ).toMatchObject({
      decision: 'deny',
    });
    expect(decideTool(policy([{ tool: 'other.*', behavior: 'deny' }], 'ask'), c)).toEqual({ decision: 'ask' });
    expect(decideTool(policy([{ tool: 'gh.*', match: 'prod', behavior: 'deny' }]), c).decision).toBe('deny');
    expect(decideTool(policy([{ tool: 'gh.*', match: 'staging', behavior: 'deny' }]), c).decision).toBe('allow');
  });

  it('settings: rules need match or tool; tool patterns are plain; mcp_servers are bounded', () => {
    expect(SettingsPatch.safeParse({ approval: { rules: [{ behavior: 'ask' }] } }).success).toBe(false);
    expect(SettingsPatch.safeParse({ approval: { rules: [{ tool: 'gh.(a+)+', behavior: 'ask' }] } }).success).toBe(
      false,
    );
    expect(SettingsPatch.safeParse({ approval: { rules: [{ tool: '*', behavior: 'ask' }] } }).success).toBe(true);
    const server = { name: 'gh', url: 'https://mcp.example.com/' };
    expect(SettingsPatch.parse({ mcp_servers: [server] }).mcp_servers).toEqual([{ ...server, headers: {} }]);
    // A workspace stored before mcp_servers existed reads as none.
    const { mcp_servers: _, ...old } = DEFAULT_SETTINGS;
    expect(WorkspaceSettings.parse(old).mcp_servers).toEqual([]);
  });

  it('an approval of a tool call reads back as the same call', () => {
    const c = { server: 'gh', tool: 'create_issue', arguments: { title: 'x\n\ny', n: [1, 2] } };
    expect(fromToolApprovalText(toolApprovalText(c))).toEqual(c);
    expect(fromToolApprovalText('print(1)')).toBeNull();
  });
});
