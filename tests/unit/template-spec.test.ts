import { describe, expect, it } from 'vitest';
import { dockerfileOf } from '../../apps/api/src/sandbox/docker/images.ts';
import { canonicalSpec, specHash, TemplateSpec } from '../../apps/api/src/templates/spec.ts';

const sources = { baseImageId: 'sha256:base', pipIndexUrl: 'https://pypi.org/simple' };

describe('template definitions', () => {
  it('hash the same definition written differently to one image, and any input change to another', () => {
    const a = TemplateSpec.parse({ apt: ['jq', 'curl'], pip: ['Foo_Bar==1.0', 'baz'] });
    const b = TemplateSpec.parse({ apt: ['curl', 'jq', 'jq'], pip: ['baz', 'foo-bar==1.0'] });
    expect(canonicalSpec(a)).toEqual(canonicalSpec(b));
    expect(specHash(a, sources)).toBe(specHash(b, sources));
    const h = specHash(a, sources);
    expect(specHash(a, { ...sources, baseImageId: 'sha256:other' })).not.toBe(h);
    expect(specHash(a, { ...sources, pipIndexUrl: 'http://127.0.0.1/simple' })).not.toBe(h);
    expect(specHash(a, { ...sources, debianMirror: 'http://mirror.example/debian' })).not.toBe(h);
    expect(specHash(TemplateSpec.parse({ apt: ['jq'], pip: ['Foo_Bar==1.0', 'baz'] }), sources)).not.toBe(h);
    const withFile = TemplateSpec.parse({ ...a, files: [{ path: 'a.txt', content: 'x' }] });
    expect(specHash(withFile, sources)).not.toBe(h);
  });

  it('accept only plain names and pins', () => {
    const ok = TemplateSpec.safeParse({
      apt: ['g++', 'libc6-dev', 'python3.11'],
      pip: ['numpy==1.26.4', 'a', 'x.y_z'],
    });
    expect(ok.success).toBe(true);
    for (const apt of [['-y'], ['a'], ['jq=1.6'], ['jq:amd64'], ['./local.deb'], ['Jq']])
      expect(TemplateSpec.safeParse({ apt }).success, apt[0]).toBe(false);
    for (const pip of [
      ['-e .'],
      ['a==1.0; os_name=="nt"'],
      ['git+https://x/y'],
      ['a @ https://x'],
      ['a==1.*'],
      ['a=='],
    ])
      expect(TemplateSpec.safeParse({ pip }).success, pip[0]).toBe(false);
  });

  it('make a Dockerfile whose RUN steps are exec form, each package one argv word, wheels only', () => {
    const spec = canonicalSpec(
      TemplateSpec.parse({ apt: ['jq'], pip: ['tabulate==0.9.0'], files: [{ path: 'a', content: 'x' }] }),
    );
    const text = dockerfileOf({
      base: 'sha256:base',
      tag: 'kiln-template:x',
      labels: {},
      ...spec,
      pipIndexUrl: 'https://pypi.org/simple',
      filesDir: '/opt/kiln/template',
      aptDay: '2026-01-01',
    });
    const runs = text.split('\n').filter((l) => l.startsWith('RUN '));
    const argvs = runs.map((l) => JSON.parse(l.slice(4)) as string[]);
    expect(argvs.every((a) => Array.isArray(a))).toBe(true);
    const pip = argvs.find((a) => a.includes('pip'))!;
    expect(pip).toContain('--only-binary=:all:');
    expect(pip.at(-1)).toBe('tabulate==0.9.0');
    expect(argvs.find((a) => a.at(-1) === 'jq')?.slice(0, 2)).toEqual(['apt-get', 'install']);
    // The one shell step is the fixed compiler purge: no tenant input in it.
    const shell = argvs.filter((a) => a[0] === '/bin/sh');
    expect(shell).toHaveLength(1);
    expect(shell[0]!.join(' ')).not.toMatch(/jq|tabulate/);
    expect(argvs.some((a) => a.join(' ').startsWith('find / -xdev -type f -perm /6000'))).toBe(true);
    expect(text).toContain('COPY files/ /opt/kiln/template/');
    expect(text.trimEnd().split('\n').slice(-2)).toEqual(['USER 65534:65534', 'WORKDIR /workspace']);
  });
});
