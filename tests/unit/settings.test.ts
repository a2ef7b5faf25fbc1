import { describe, expect, it } from 'vitest';
import {
  applySettingsPatch,
  DEFAULT_SETTINGS,
  SettingsPatch,
  WorkspaceSettings,
} from '../../apps/api/src/workspace/settings.ts';

describe('workspace settings', () => {
  it('defaults are themselves valid', () => {
    expect(WorkspaceSettings.parse(DEFAULT_SETTINGS)).toEqual(DEFAULT_SETTINGS);
  });

  it('a patch changes only the fields it names, section by section', () => {
    const next = applySettingsPatch(DEFAULT_SETTINGS, {
      protocol: 'tools',
      sandbox: { memory_mb: 1024 },
      approval: { rules: [{ match: 'rm -rf', behavior: 'deny' }] },
    });
    expect(next.protocol).toBe('tools');
    expect(next.sandbox).toEqual({ ...DEFAULT_SETTINGS.sandbox, memory_mb: 1024 });
    expect(next.approval).toEqual({ ...DEFAULT_SETTINGS.approval, rules: [{ match: 'rm -rf', behavior: 'deny' }] });
    expect(next.context).toEqual(DEFAULT_SETTINGS.context);
    expect(DEFAULT_SETTINGS.sandbox.memory_mb).toBe(512);
  });

  it('a patch parsed as the routes parse it leaves every sandbox field it does not name as stored (defaults only at creation)', () => {
    const stored = applySettingsPatch(DEFAULT_SETTINGS, {
      sandbox: {
        idle_s: 600,
        runtime: 'gvisor',
        template: 'tpl_1',
        network: 'allowlist',
        allow: ['api.example.com'],
        max_files_per_step: 5,
        max_bytes_per_step: 4096,
      },
    });
    const patch = SettingsPatch.parse({ sandbox: { memory_mb: 1024 } });
    expect(patch).toEqual({ sandbox: { memory_mb: 1024 } });
    expect(applySettingsPatch(stored, patch).sandbox).toEqual({ ...stored.sandbox, memory_mb: 1024 });
  });

  it.each([
    [{ sandbox: { memory_mb: 1 } }, 'sandbox.memory_mb'],
    [{ sandbox: { network: 'bridge' } }, 'sandbox.network'],
    [{ approval: { rules: [{ match: '(', behavior: 'deny' }] } }, 'approval.rules.0.match'],
    [{ evolution: { dream_cron: 'every night' } }, 'evolution.dream_cron'],
    [{ evolution: { timezone: 'Mars/Olympus' } }, 'evolution.timezone'],
    [{ protocol: 'json' }, 'protocol'],
    [{ max_step: 3 }, ''],
  ])('rejects %j', (patch, path) => {
    const r = SettingsPatch.safeParse(patch);
    expect(r.success).toBe(false);
    if (path) expect(r.error!.issues.map((i) => i.path.join('.'))).toContain(path);
  });
});

describe('approval rules in settings', () => {
  it.each(['(a)\\1', '(?=x)', '(?<=a)b', '(?!rm)'])(
    'rejects %s, which RE2 cannot compile, naming the rule and why',
    (match) => {
      const r = SettingsPatch.safeParse({
        approval: {
          rules: [
            { match: 'print', behavior: 'allow' },
            { match, behavior: 'deny' },
          ],
        },
      });
      expect(r.success).toBe(false);
      const issue = r.error!.issues.find((i) => i.path.join('.') === 'approval.rules.1.match');
      expect(issue?.message).toContain(JSON.stringify(match));
      expect(issue?.message).toMatch(/RE2/);
    },
  );

  it('accepts what RE2 compiles, named groups and multiline anchors included', () => {
    expect(
      SettingsPatch.safeParse({
        approval: {
          rules: [
            { match: '^(?<call>os\\.system)\\(', behavior: 'ask' },
            { match: '(?i)rm\\s+-rf$', behavior: 'deny' },
          ],
        },
      }).success,
    ).toBe(true);
  });
});

describe('sandbox.runtime', () => {
  it('is runc for a workspace stored before the setting existed', () => {
    const { runtime: _, ...stored } = DEFAULT_SETTINGS.sandbox;
    expect(WorkspaceSettings.parse({ ...DEFAULT_SETTINGS, sandbox: stored }).sandbox.runtime).toBe('runc');
  });

  it('takes runc or gvisor, nothing else', () => {
    expect(SettingsPatch.parse({ sandbox: { runtime: 'gvisor' } }).sandbox?.runtime).toBe('gvisor');
    expect(applySettingsPatch(DEFAULT_SETTINGS, { sandbox: { runtime: 'gvisor' } }).sandbox.runtime).toBe('gvisor');
    for (const bad of ['kata', 'runsc', '', 1, null]) {
      const r = SettingsPatch.safeParse({ sandbox: { runtime: bad } });
      expect(r.success, String(bad)).toBe(false);
      expect(r.error?.issues[0]?.path).toEqual(['sandbox', 'runtime']);
    }
  });
});
