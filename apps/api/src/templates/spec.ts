import { createHash } from 'node:crypto';
import { z } from '@hono/zod-openapi';

/** Where a template's files land in its image (read-only, like the rest of the root). */
export const TEMPLATE_FILES_DIR = '/opt/kiln/template';

const MAX_APT = 50;
const MAX_PIP = 50;
const MAX_FILES = 16;
const MAX_FILE_BYTES = 64 * 1024;
const MAX_FILES_BYTES = 256 * 1024;

/**
 * A Debian package name as Debian policy (5.6.1) defines it: lower-case letters, digits, `+`,
 * `-` and `.`, at least two characters, starting with a letter or digit. No version, no
 * release, no architecture: nothing apt could read as an option or a file.
 */
const AptName = z
  .string()
  .max(64)
  .regex(/^[a-z0-9][a-z0-9+.-]+$/, 'must be a Debian package name (a-z 0-9 + - ., starting with a letter or digit)');

/** A PEP 503/508 distribution name, optionally pinned with `==` to a public PEP 440 version. No URL, extra, marker or option. */
const PIP_SPEC =
  /^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]{0,98}[A-Za-z0-9])(==[0-9]+(\.[0-9]+){0,5}((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?)?$/;
const PipSpec = z
  .string()
  .max(120)
  .regex(PIP_SPEC, 'must be a Python package name, optionally with ==<version> (no URL, extra, marker or option)');

/** A relative path of at most 4 plain segments (letters, digits, . _ -, not starting with a dot). */
const FILE_PATH = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}(\/[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}){0,3}$/;
const TemplateFile = z
  .object({
    path: z
      .string()
      .max(90)
      .regex(
        FILE_PATH,
        'must be a relative path of plain names (a-z A-Z 0-9 . _ -, at most 4 parts, none starting with a dot)',
      )
      .openapi({ description: `relative to ${TEMPLATE_FILES_DIR}`, example: 'settings/defaults.json' }),
    content: z
      .string()
      .refine((s) => Buffer.byteLength(s) <= MAX_FILE_BYTES, `must be at most ${MAX_FILE_BYTES} bytes`)
      .openapi({ description: `UTF-8 text, at most ${MAX_FILE_BYTES} bytes` }),
  })
  .strict();

/** The fields of a definition; a body adds its own (a name) and is checked with `checkSpec`. */
export const specFields = {
  apt: z
    .array(AptName)
    .max(MAX_APT)
    .default([])
    .openapi({ description: 'Debian packages', example: ['jq'] }),
  pip: z
    .array(PipSpec)
    .max(MAX_PIP)
    .default([])
    .openapi({ description: 'Python packages, installed from wheels only', example: ['tabulate==0.9.0'] }),
  files: z
    .array(TemplateFile)
    .max(MAX_FILES)
    .default([])
    .openapi({ description: `small files baked into the image under ${TEMPLATE_FILES_DIR}` }),
};

/** What the field types cannot say: the files' total size, no path twice or under another, no pip package twice. */
export function checkSpec(
  spec: { pip: string[]; files: { path: string; content: string }[] },
  ctx: z.RefinementCtx,
): void {
  const total = spec.files.reduce((n, f) => n + Buffer.byteLength(f.content), 0);
  if (total > MAX_FILES_BYTES)
    ctx.addIssue({ code: 'custom', path: ['files'], message: `must hold at most ${MAX_FILES_BYTES} bytes in all` });
  const paths = new Set(spec.files.map((f) => f.path));
  if (paths.size < spec.files.length) ctx.addIssue({ code: 'custom', path: ['files'], message: 'has a path twice' });
  for (const p of paths) {
    const parent = [...paths].find((q) => p.startsWith(`${q}/`));
    if (parent) ctx.addIssue({ code: 'custom', path: ['files'], message: `${p} is under ${parent}, which is a file` });
  }
  const names = spec.pip.map((s) => pipName(s));
  if (new Set(names).size < names.length)
    ctx.addIssue({ code: 'custom', path: ['pip'], message: 'names a package twice' });
}

export const TemplateSpec = z.object(specFields).strict().superRefine(checkSpec);
export type TemplateSpec = z.infer<typeof TemplateSpec>;

/** PEP 503 normalisation: `Foo_Bar.baz` and `foo-bar-baz` are one package. */
const pipName = (spec: string) =>
  spec
    .split('==')[0]!
    .replace(/[-_.]+/g, '-')
    .toLowerCase();

/** The same definition written in any order (or with apt names twice) is one image. */
export function canonicalSpec(spec: TemplateSpec): TemplateSpec {
  return {
    apt: [...new Set(spec.apt)].sort(),
    pip: spec.pip.map((s) => (s.includes('==') ? `${pipName(s)}==${s.split('==')[1]}` : pipName(s))).sort(),
    files: [...spec.files].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0)),
  };
}

/** What a template's image is made of besides its definition. */
export interface BuildSources {
  /** The base sandbox image's id (sha256:…). */
  baseImageId: string;
  /**
   * The base image's name (`KILN_SANDBOX_IMAGE`), for a builder whose base has another id (a
   * fleet's host that built its own). Not part of the hash: the id says what the image is made of.
   */
  baseRef?: string;
  pipIndexUrl: string;
  /** The Debian mirror written into the image's apt sources; undefined keeps the base image's. */
  debianMirror?: string;
}

/** The content hash of everything the image is built from: the same inputs are never built twice. */
export function specHash(spec: TemplateSpec, src: BuildSources): string {
  const c = canonicalSpec(spec);
  return createHash('sha256')
    .update(
      JSON.stringify({
        v: 1,
        base: src.baseImageId,
        index: src.pipIndexUrl,
        mirror: src.debianMirror ?? null,
        apt: c.apt,
        pip: c.pip,
        files: c.files.map((f) => [f.path, f.content]),
      }),
    )
    .digest('hex')
    .slice(0, 24);
}

const TEMPLATE_REPO = 'kiln-template';
export const imageTag = (hash: string) => `${TEMPLATE_REPO}:${hash}`;
