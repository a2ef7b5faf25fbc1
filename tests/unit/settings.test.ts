import { describe, expect, it } from 'vitest';
import { applySettingsPatch, DEFAULT_SETTINGS, SettingsPatch, WorkspaceSettings } from '../../apps/api/src/workspace/settings.ts';

describe('workspace settings', () => {
  it('defaults are themselves valid', () => {
    expect(WorkspaceSettings.parse(DEFAULT_SETTINGS)).toEqual(DEFAULT_SETTINGS);
  });

  it('a patch changes only the fields it names, section by section', () => {
    const next = applySettingsPatch(DEFAULT_SETTINGS, { protocol: 'tools', sandbox: { memory_mb: 1024 }, approval: { rules: [{ match: 'rm -rf', behavior: 'deny' }] } });
    expect(next.protocol).toBe('tools');
    expect(next.sandbox).toEqual({ ...DEFAULT_SETTINGS.sandbox, memory_mb: 1024 });
    expect(next.approval).toEqual({ ...DEFAULT_SETTINGS.approval, rules: [{ match: 'rm -rf', behavior: 'deny' }] });
    expect(next.context).toEqual(DEFAULT_SETTINGS.context);
    expect(DEFAULT_SETTINGS.sandbox.memory_mb).toBe(512);
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
