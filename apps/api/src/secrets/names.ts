import { z } from '@hono/zod-openapi';

/** Shorter values are refused: masking them would garble ordinary output. */
const MIN_VALUE_CHARS = 4;
const MAX_VALUE_CHARS = 4096;
/** How many secrets a workspace may hold (each is a variable of every execution and a masking pattern). */
export const MAX_SECRETS = 100;
/** The UTF-8 size of all of a workspace's values together (they are masked in every execution's output). */
export const MAX_TOTAL_VALUE_BYTES = 64 * 1024;

/**
 * Names that change how the interpreter, the C library, the shell, a numeric library or the
 * runner behaves: a secret must never be a way to reconfigure the sandbox's code path.
 */
const RESERVED = new Set([
  'PATH',
  'HOME',
  'USER',
  'LOGNAME',
  'SHELL',
  'PWD',
  'OLDPWD',
  'TMPDIR',
  'TMP',
  'TEMP',
  'LANG',
  'LANGUAGE',
  'TZ',
  'TERM',
  'TERMINFO',
  'IFS',
  'ENV',
  'CDPATH',
  'PS4',
  'SHELLOPTS',
  'BASHOPTS',
  'GLOBIGNORE',
  'GCONV_PATH',
  'NLSPATH',
  'LOCPATH',
  'HOSTALIASES',
  'RES_OPTIONS',
  'LOCALDOMAIN',
]);
const RESERVED_PREFIXES = [
  'PYTHON',
  'LD_',
  'LC_',
  'KILN_',
  'BASH_',
  'MPL',
  'OPENBLAS_',
  'OMP_',
  'MKL_',
  'MALLOC_',
  'GLIBC_',
  'DYLD_',
];

/** Why a name may not be a secret's, or undefined when it may. */
function reservedReason(name: string): string | undefined {
  if (RESERVED.has(name)) return `${name} is reserved: it changes how the sandbox's interpreter or shell behaves`;
  const prefix = RESERVED_PREFIXES.find((p) => name.startsWith(p));
  if (prefix) return `names starting with ${prefix} are reserved: they change how the sandbox's code runs`;
  return undefined;
}

export const SecretName = z
  .string()
  .regex(
    /^[A-Z_][A-Z0-9_]{0,63}$/,
    'must be an environment variable name: A-Z, 0-9 and _, not starting with a digit, at most 64',
  )
  .superRefine((name, ctx) => {
    const why = reservedReason(name);
    if (why) ctx.addIssue({ code: 'custom', message: why });
  });

export const SecretValue = z
  .string()
  .min(MIN_VALUE_CHARS, `must be at least ${MIN_VALUE_CHARS} characters (shorter values cannot be masked in output)`)
  .max(MAX_VALUE_CHARS, `must be at most ${MAX_VALUE_CHARS} characters`)
  .refine((v) => !v.includes('\0'), 'must not contain a NUL character (an environment variable cannot)');
