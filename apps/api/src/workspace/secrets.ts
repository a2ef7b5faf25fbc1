import { DeadlineExceeded, OffThread } from '../lib/off-thread.ts';

/** A secret found in content about to be committed. */
export interface Redaction {
  path: string;
  line: number;
  type: string;
}

/** What may be committed of one file. */
export type ScanVerdict =
  | { kind: 'clean' }
  /** The same file with every secret replaced by `[REDACTED:type]`, in its own encoding. */
  | { kind: 'redacted'; data: Buffer; redactions: Redaction[] }
  /** Not committed at all: a secret in a binary file, a key store, or content that could not be scanned. */
  | { kind: 'refused'; reason: string; redactions: Redaction[] };

/** How long one file may take to scan before it is refused instead (and the scanner restarted). */
const SCAN_DEADLINE_MS = 15_000;

/**
 * Files that hold private keys by their very name (SSH identities, PKCS#12 and Java key stores,
 * password databases): never committed, whatever their content looks like.
 */
const KEY_STORE =
  /(?:^|\/)(?:id_(?:rsa|dsa|ecdsa|ed25519|ecdsa_sk|ed25519_sk)|[^/]+\.(?:p12|pfx|jks|keystore|kdbx|ppk|gpg))$/i;

interface Finding {
  start: number;
  end: number;
  type: string;
}

type Encoding = 'latin1' | 'utf16le' | 'utf16be';

/**
 * How to read a file as text for scanning. Secrets are ASCII, so UTF-8 (and anything that is not
 * UTF-16) is read byte for byte as latin1: offsets are byte offsets and a redacted file is
 * written back with every other byte unchanged. UTF-16 is recognised by its byte-order mark or,
 * without one, by NUL bytes sitting in every other position of ASCII text.
 */
function encodingOf(buf: Buffer): Encoding {
  if (buf[0] === 0xff && buf[1] === 0xfe) return 'utf16le';
  if (buf[0] === 0xfe && buf[1] === 0xff) return 'utf16be';
  const sample = buf.subarray(0, 4096);
  let evenNul = 0;
  let oddNul = 0;
  for (let i = 0; i < sample.length; i++) if (sample[i] === 0) i % 2 ? oddNul++ : evenNul++;
  const half = sample.length / 2;
  if (half >= 2 && oddNul > half * 0.6 && evenNul < half * 0.1) return 'utf16le';
  if (half >= 2 && evenNul > half * 0.6 && oddNul < half * 0.1) return 'utf16be';
  return 'latin1';
}

const swap16 = (b: Buffer) => Buffer.from(b).swap16();
const decode = (buf: Buffer, enc: Encoding) =>
  enc === 'latin1'
    ? buf.toString('latin1')
    : enc === 'utf16le'
      ? buf.toString('utf16le')
      : swap16(buf.subarray(0, buf.length & ~1)).toString('utf16le');
const encode = (text: string, enc: Encoding) =>
  enc === 'latin1'
    ? Buffer.from(text, 'latin1')
    : enc === 'utf16le'
      ? Buffer.from(text, 'utf16le')
      : swap16(Buffer.from(text, 'utf16le'));

/**
 * The secret scanner: the rules (secretlint's recommended preset plus Kiln's own patterns, see
 * secret-scan.worker.mjs) run in a worker thread of their own, each batch under a deadline.
 * Content is the tenants', so a pathological file can cost that thread time, never the API's
 * event loop; past the deadline the thread is replaced and the file refused.
 */
const scanner = new OffThread<{ files: { path: string; text: string; name?: boolean }[] }, Finding[][]>(
  new URL('./secret-scan.worker.mjs', import.meta.url),
  'secret scanner',
);

/**
 * Findings per file. Only a batch's own deadline refuses it: a batch that failed because the
 * thread was replaced under it (another batch's deadline) is sent again, once.
 */
async function find(files: { path: string; text: string; name?: boolean }[], deadlineMs: number): Promise<Finding[][]> {
  try {
    return await scanner.run({ files }, [], deadlineMs);
  } catch (err) {
    if (err instanceof DeadlineExceeded)
      throw new Error(`it could not be scanned for secrets within ${deadlineMs / 1000} s`);
    return scanner.run({ files }, [], deadlineMs).catch((e: Error) => {
      throw e instanceof DeadlineExceeded
        ? new Error(`it could not be scanned for secrets within ${deadlineMs / 1000} s`)
        : e;
    });
  }
}

/**
 * Decides what of each file may be committed: secrets in text (UTF-8, UTF-16 or anything else
 * that is text) are redacted in place; a binary file holding one, a key store by its name, or a
 * file that could not be scanned is refused. The files go to the scanner's thread together (one
 * round trip); when they cannot all be scanned in time, each is tried alone under its own
 * deadline, so only the file that is slow to scan is refused.
 */
export async function scanSecrets(
  files: { path: string; data: Buffer }[],
  deadlineMs = SCAN_DEADLINE_MS,
): Promise<ScanVerdict[]> {
  const verdicts: (ScanVerdict | undefined)[] = files.map((f) =>
    KEY_STORE.test(f.path)
      ? {
          kind: 'refused',
          reason: 'its name marks it as a private key or key store, which is never committed',
          redactions: [],
        }
      : undefined,
  );
  const todo = files.flatMap((f, i) => {
    if (verdicts[i] || f.data.length === 0) return [];
    const enc = encodingOf(f.data);
    return [{ i, path: f.path, data: f.data, enc, text: decode(f.data, enc) }];
  });
  // The names ride in the same round trip (with Kiln's own patterns only): a token saved as a
  // file's name cannot be redacted without renaming the file behind the writer's back, so such a
  // file is refused.
  const names = files.map((f) => ({ path: '', text: f.path, name: true }));
  const contents = todo.map(({ path, text }) => ({ path, text }));
  let found: (Finding[] | Error)[];
  try {
    found = await find([...contents, ...names], deadlineMs);
  } catch (err) {
    found = todo.length === 1 ? [err as Error] : [];
    for (const t of todo.length === 1 ? [] : todo)
      found.push(
        await find([{ path: t.path, text: t.text }], deadlineMs).then(
          (r) => r[0]!,
          (e: Error) => e,
        ),
      );
    // Names scan fast (Kiln's patterns only, no secretlint): under the standard deadline, so a
    // caller's short one ends no second thread under another tenant's scan.
    found.push(
      ...(await find(names, Math.max(deadlineMs, SCAN_DEADLINE_MS)).then(
        (r): (Finding[] | Error)[] => r,
        (e: Error) => names.map(() => e),
      )),
    );
  }
  for (const [i, f] of files.entries()) {
    const named = found[todo.length + i]!;
    if (verdicts[i]) continue;
    if (named instanceof Error) verdicts[i] = { kind: 'refused', reason: `its name: ${named.message}`, redactions: [] };
    else if (named.length) {
      const types = [...new Set(named.map((x) => x.type))];
      verdicts[i] = {
        kind: 'refused',
        reason: `its name holds a secret (${types.join(', ')}): rename the file`,
        redactions: types.map((type) => ({ path: f.path, line: 0, type })),
      };
    }
  }
  for (const [k, t] of todo.entries()) verdicts[t.i] ??= verdictOf(t, found[k]!);
  return verdicts.map((v) => v ?? { kind: 'clean' });
}

function verdictOf(
  file: { path: string; data: Buffer; enc: Encoding; text: string },
  found: Finding[] | Error,
): ScanVerdict {
  const { path, data, enc, text } = file;
  if (found instanceof Error) return { kind: 'refused', reason: found.message, redactions: [] };
  if (found.length === 0) return { kind: 'clean' };
  const lineOf = lineCounter(text);
  const redactions = found.map((f) => ({ path, line: lineOf(f.start), type: f.type }));
  // Binary content cannot be redacted without breaking its format: the whole file stays out.
  if (enc === 'latin1' && data.includes(0)) {
    return {
      kind: 'refused',
      reason: `it is a binary file that holds a secret (${[...new Set(redactions.map((r) => r.type))].join(', ')})`,
      redactions,
    };
  }
  let out = '';
  let at = 0;
  for (const f of found) {
    out += `${text.slice(at, f.start)}[REDACTED:${f.type}]`;
    at = f.end;
  }
  out += text.slice(at);
  // A UTF-16 byte-order mark was decoded as U+FEFF and is encoded back with the rest.
  return { kind: 'redacted', data: encode(out, enc), redactions };
}

/** Line numbers of offsets given in increasing order, counting newlines once. */
function lineCounter(text: string): (offset: number) => number {
  let line = 1;
  let at = 0;
  return (offset) => {
    for (; at < offset; at++) if (text.charCodeAt(at) === 10) line++;
    return line;
  };
}
