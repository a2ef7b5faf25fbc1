import { describe, expect, it } from 'vitest';
import { mergeRuntimes, recordedPlatform } from '../../infra/daemon-json.ts';

// What the lead registered by hand on the test machine (infra/docker.sh must leave it alone).
const BY_HAND = `{
  "runtimes": {
    "kiln-gvisor": { "path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace"] },
    "kiln-gvisor-nonet": { "path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", "--network=none"] },
    "kiln-gvisor-egress": { "path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", "--network=none", "--host-uds=open"] }
  },
  "experimental": true
}`;

describe('daemon.json merge (infra/docker.sh)', () => {
  it('changes nothing when every runtime is already registered the same way', () => {
    expect(mergeRuntimes(BY_HAND, '/usr/bin/runsc', 'ptrace')).toEqual({ text: BY_HAND, changed: false });
    expect(recordedPlatform(BY_HAND)).toBe('ptrace');
  });

  it('adds the egress runtime to a file registered before it existed, keeping the others', () => {
    const before = JSON.parse(BY_HAND);
    delete before.runtimes['kiln-gvisor-egress'];
    const { text, changed } = mergeRuntimes(JSON.stringify(before), '/usr/bin/runsc', 'ptrace');
    expect(changed).toBe(true);
    expect(JSON.parse(text)).toEqual(JSON.parse(BY_HAND));
  });

  it('turns on the experimental API (checkpoints) in a file registered before pausing existed, and only that', () => {
    const before = JSON.parse(BY_HAND);
    delete before.experimental;
    const { text, changed } = mergeRuntimes(JSON.stringify(before), '/usr/bin/runsc', 'ptrace');
    expect(changed).toBe(true);
    expect(JSON.parse(text)).toEqual(JSON.parse(BY_HAND));
  });

  it('adds every runtime to a missing or empty file', () => {
    const { text, changed } = mergeRuntimes('', '/usr/bin/runsc', 'systrap');
    expect(changed).toBe(true);
    expect(JSON.parse(text)).toEqual({
      runtimes: {
        'kiln-gvisor': { path: '/usr/bin/runsc', runtimeArgs: ['--platform=systrap'] },
        'kiln-gvisor-nonet': { path: '/usr/bin/runsc', runtimeArgs: ['--platform=systrap', '--network=none'] },
        'kiln-gvisor-egress': {
          path: '/usr/bin/runsc',
          runtimeArgs: ['--platform=systrap', '--network=none', '--host-uds=open'],
        },
      },
      experimental: true,
    });
    // Idempotent: the merged text merges to itself.
    expect(mergeRuntimes(text, '/usr/bin/runsc', 'systrap').changed).toBe(false);
  });

  it('keeps every other key and runtime, and replaces a stale platform', () => {
    const before = JSON.stringify({
      'log-level': 'warn',
      'live-restore': true,
      runtimes: { other: { path: '/opt/other' }, ...JSON.parse(BY_HAND).runtimes },
    });
    const { text, changed } = mergeRuntimes(before, '/usr/bin/runsc', 'kvm');
    expect(changed).toBe(true);
    const after = JSON.parse(text);
    expect(after['log-level']).toBe('warn');
    expect(after['live-restore']).toBe(true);
    expect(after.runtimes.other).toEqual({ path: '/opt/other' });
    expect(after.runtimes['kiln-gvisor-nonet'].runtimeArgs).toEqual(['--platform=kvm', '--network=none']);
    expect(recordedPlatform(text)).toBe('kvm');
  });

  it('refuses a file that is not a JSON object, and records no platform without the runtime', () => {
    expect(() => mergeRuntimes('[1]', '/usr/bin/runsc', 'ptrace')).toThrow(/JSON object/);
    expect(() => mergeRuntimes('{oops', '/usr/bin/runsc', 'ptrace')).toThrow();
    expect(recordedPlatform('{"runtimes":{}}')).toBeUndefined();
    expect(recordedPlatform('')).toBeUndefined();
  });
});
