import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../apps/api/src/config.ts';
import { ConfigError } from '../../apps/api/src/lib/errors.ts';

function problems(env: Record<string, string>): string[] {
  try {
    loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
  throw new Error('expected a ConfigError');
}

describe('config', () => {
  it('templates: an http(s) pip index, a Debian mirror used only when http(s), bounded builds', () => {
    expect(loadConfig({}).templates).toEqual({
      pipIndexUrl: 'https://pypi.org/simple',
      debianMirror: undefined,
      buildTimeoutMs: 1_200_000,
      maxLogBytes: 262_144,
      poolSize: 1,
      buildConcurrency: 2,
      buildTeamConcurrency: 1,
      maxPerTeam: 20,
      maxQueuedPerTeam: 3,
    });
    const c = loadConfig({
      KILN_PIP_INDEX_URL: 'http://127.0.0.1:3141/simple',
      KILN_DEBIAN_MIRROR: 'http://mirror.example/debian',
      KILN_TEMPLATE_BUILD_TIMEOUT_S: '60',
      KILN_TEMPLATE_MAX_LOG_BYTES: '8192',
      KILN_TEMPLATE_POOL_SIZE: '0',
      KILN_TEMPLATE_BUILD_CONCURRENCY: '4',
      KILN_TEMPLATE_BUILD_TEAM_CONCURRENCY: '2',
      KILN_TEMPLATES_MAX_PER_TEAM: '5',
      KILN_TEMPLATE_BUILDS_MAX_QUEUED_PER_TEAM: '1',
    });
    expect(c.templates).toEqual({
      pipIndexUrl: 'http://127.0.0.1:3141/simple',
      debianMirror: 'http://mirror.example/debian',
      buildTimeoutMs: 60_000,
      maxLogBytes: 8192,
      poolSize: 0,
      buildConcurrency: 4,
      buildTeamConcurrency: 2,
      maxPerTeam: 5,
      maxQueuedPerTeam: 1,
    });
    // debootstrap may take a file: mirror; a build container could not read it, so templates keep the base's sources.
    expect(loadConfig({ KILN_DEBIAN_MIRROR: 'file:///srv/debian' }).templates.debianMirror).toBeUndefined();
    expect(problems({ KILN_PIP_INDEX_URL: 'file:///srv/wheels' })[0]).toContain('KILN_PIP_INDEX_URL');
    expect(problems({ KILN_DEBIAN_MIRROR: 'http://a b' })[0]).toContain('KILN_DEBIAN_MIRROR');
    expect(problems({ KILN_TEMPLATE_BUILD_TIMEOUT_S: '1' })[0]).toContain('KILN_TEMPLATE_BUILD_TIMEOUT_S');
    expect(problems({ KILN_TEMPLATE_POOL_SIZE: '9' })[0]).toContain('KILN_TEMPLATE_POOL_SIZE');
  });

  it('has working defaults for an empty environment', () => {
    const c = loadConfig({});
    expect(c.port).toBe(7700);
    expect(c.host).toBe('127.0.0.1');
    expect(c.dataDir).toBe(resolve('./data'));
    expect(c.databaseUrl).toBeUndefined();
    expect(c.rateLimit).toEqual({ perMinute: 600, burst: 120 });
    expect(c.sandboxImage).toBe('kiln-sandbox:latest');
  });

  it('reads every variable it knows', () => {
    const c = loadConfig({
      KILN_PORT: '8123',
      KILN_HOST: '0.0.0.0',
      KILN_DATA_DIR: '/var/lib/kiln',
      DATABASE_URL: 'postgres://u:p@db:5432/kiln',
      KILN_ADMIN_KEY: 'kiln_admin_abcdefghijklmnopqrstuvwxyz',
      KILN_LOG_LEVEL: 'debug',
      KILN_BODY_LIMIT_BYTES: '2048',
      KILN_RATE_LIMIT_PER_MINUTE: '60',
      KILN_RATE_LIMIT_BURST: '10',
      KILN_SANDBOX_IMAGE: 'kiln-sandbox:abc',
      DOCKER_HOST: 'unix:///run/docker.sock',
      KILN_SHUTDOWN_GRACE_MS: '500',
    });
    expect(c).toMatchObject({
      port: 8123,
      host: '0.0.0.0',
      dataDir: '/var/lib/kiln',
      databaseUrl: 'postgres://u:p@db:5432/kiln',
      adminKey: 'kiln_admin_abcdefghijklmnopqrstuvwxyz',
      logLevel: 'debug',
      bodyLimitBytes: 2048,
      rateLimit: { perMinute: 60, burst: 10 },
      sandboxImage: 'kiln-sandbox:abc',
      dockerHost: 'unix:///run/docker.sock',
      shutdownGraceMs: 500,
    });
  });

  it('reports one readable line per wrong value, naming the variable', () => {
    const lines = problems({ KILN_PORT: 'eighty', KILN_LOG_LEVEL: 'loud', KILN_RATE_LIMIT_BURST: '0' });
    expect(lines).toHaveLength(3);
    expect(lines.find((l) => l.startsWith('KILN_PORT:'))).toContain('"eighty"');
    expect(lines.find((l) => l.startsWith('KILN_LOG_LEVEL:'))).toContain('"loud"');
    expect(lines.find((l) => l.startsWith('KILN_RATE_LIMIT_BURST:'))).toBeDefined();
  });

  it('never echoes a secret in an error', () => {
    const lines = problems({ KILN_ADMIN_KEY: 'hunter2-secret', DATABASE_URL: 'mysql://root:topsecret@x/y' });
    expect(lines).toHaveLength(2);
    expect(lines.join('\n')).not.toMatch(/hunter2|topsecret/);
    expect(lines.join('\n')).toContain('value hidden');
  });

  it('reads the self-update settings; the source defaults to the running checkout', () => {
    expect(loadConfig({}).selfUpdate).toEqual({
      sourceDir: fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, ''),
      checkTimeoutMs: 600_000,
      checkTests: ['tests/unit', 'tests/smoke'],
      stopTimeoutMs: 60_000,
      readyTimeoutMs: 60_000,
    });
    const c = loadConfig({
      KILN_SOURCE_DIR: '/srv/kiln',
      KILN_SELF_CHECK_TIMEOUT_S: '120',
      KILN_SELF_CHECK_TESTS: ' tests/smoke  tests/unit/docs.test.ts\n',
      KILN_RESTART_STOP_TIMEOUT_S: '5',
      KILN_RESTART_READY_TIMEOUT_S: '7',
    });
    expect(c.selfUpdate).toEqual({
      sourceDir: '/srv/kiln',
      checkTimeoutMs: 120_000,
      checkTests: ['tests/smoke', 'tests/unit/docs.test.ts'],
      stopTimeoutMs: 5000,
      readyTimeoutMs: 7000,
    });
    expect(
      problems({ KILN_SELF_CHECK_TIMEOUT_S: '1', KILN_RESTART_READY_TIMEOUT_S: 'soon' }).map((l) => l.split(':')[0]),
    ).toEqual(['KILN_SELF_CHECK_TIMEOUT_S', 'KILN_RESTART_READY_TIMEOUT_S']);
    // The test step's arguments: paths inside the checkout, never an option or a way out of it.
    for (const bad of ['--reporter=./evil.js', '/etc', 'tests/../../etc', '..', 'tests/$(id)', ' '])
      expect(problems({ KILN_SELF_CHECK_TESTS: bad }), bad).toHaveLength(1);
    expect(loadConfig({ KILN_SELF_CHECK_TESTS: 'tests/unit/a..b.test.ts tests/.x' }).selfUpdate.checkTests).toEqual([
      'tests/unit/a..b.test.ts',
      'tests/.x',
    ]);
  });

  it('treats empty strings as unset', () => {
    expect(loadConfig({ KILN_PORT: '', DATABASE_URL: '' })).toMatchObject({ port: 7700, databaseUrl: undefined });
  });

  it('reads KILN_SANDBOX_RUNTIMES as a list of runc and gvisor; unset, decided at start-up', () => {
    expect(loadConfig({}).sandbox.runtimes).toBeUndefined();
    expect(loadConfig({ KILN_SANDBOX_RUNTIMES: 'runc' }).sandbox.runtimes).toEqual(['runc']);
    expect(loadConfig({ KILN_SANDBOX_RUNTIMES: ' gvisor , runc' }).sandbox.runtimes).toEqual(['gvisor', 'runc']);
    expect(problems({ KILN_SANDBOX_RUNTIMES: 'runc,kata' }).join()).toMatch(
      /^KILN_SANDBOX_RUNTIMES: each must be one of runc, gvisor/,
    );
    expect(problems({ KILN_SANDBOX_RUNTIMES: 'gvisor,gvisor' }).join()).toMatch(
      /^KILN_SANDBOX_RUNTIMES: lists a runtime twice/,
    );
    expect(problems({ KILN_SANDBOX_RUNTIMES: ',' }).join()).toMatch(/^KILN_SANDBOX_RUNTIMES: /);
  });
});
