import { describe, expect, it } from 'vitest';
import { scanSecrets, type ScanVerdict } from '../../apps/api/src/workspace/secrets.ts';
import { ticksDuring } from '../support/ticks.ts';

const GITHUB = 'ghp_abcdefghijklmnopqrstuvwxyz0123456789';
const JWT = 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U';
const scanOne = async (path: string, data: string | Buffer, deadlineMs?: number): Promise<ScanVerdict> =>
  (await scanSecrets([{ path, data: typeof data === 'string' ? Buffer.from(data) : data }], deadlineMs))[0]!;
/** The redacted file as text, and where the secrets were (`line:type`). */
async function redacted(path: string, text: string): Promise<{ text: string; found: string[] }> {
  const v = await scanOne(path, text);
  if (v.kind !== 'redacted') throw new Error(`${path} was ${v.kind}, not redacted`);
  expect(v.redactions.every((r) => r.path === path)).toBe(true);
  return { text: v.data.toString(), found: v.redactions.map((r) => `${r.line}:${r.type}`) };
}

describe('what the scanner flags', () => {
  // [type, the line as written, the secret in it]
  const KILN: [string, string, string][] = [
    ['aws_access_key', 'aws_key = AKIAABCDEFGHIJKLMNOP', 'AKIAABCDEFGHIJKLMNOP'],
    [
      'aws_secret_key',
      'aws_secret_access_key = wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY12',
      'wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY12',
    ],
    ['github_token', `git remote set-url origin https://${GITHUB}@github.com/x/y`, GITHUB],
    ['github_token', `GH=github_pat_${'A1b2'.repeat(12)}`, `github_pat_${'A1b2'.repeat(12)}`],
    [
      'anthropic_key',
      'client = Anthropic(api_key=sk-ant-api03-abcdefghijklmnopqrstuvwxyz)',
      'sk-ant-api03-abcdefghijklmnopqrstuvwxyz',
    ],
    ['openai_key', 'OpenAI(api_key=sk-proj-abcdefghijklmnopqrstuvwxyz)', 'sk-proj-abcdefghijklmnopqrstuvwxyz'],
    ['stripe_key', 'stripe.api_key = sk_live_abcdefghijklmnop1234', 'sk_live_abcdefghijklmnop1234'],
    ['slack_token', 'token: xoxb-1234567890-abcdefghij', 'xoxb-1234567890-abcdefghij'],
    ['google_api_key', `maps = AIza${'B'.repeat(35)}`, `AIza${'B'.repeat(35)}`],
    ['kiln_key', `KILN=kiln_${'k'.repeat(32)}`, `kiln_${'k'.repeat(32)}`],
    ['jwt', `Authorization: Bearer ${JWT}`, 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0'],
    ['url_password', 'redis = redis://default:Sup3rS3cretValue@cache.internal:6379/0', 'Sup3rS3cretValue'],
    ['password_assignment', 'db_password = "Hunter2Secret"', 'Hunter2Secret'],
    ['password_assignment', 'export API_KEY=abcdef123456', 'abcdef123456'],
    // Shapes an attack on the scanner found missing (each was committed as it was).
    [
      'aws_secret_key',
      '{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
      'wJalrXUtnFEMI/K7MDENG',
    ],
    ['aws_secret_key', '  "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",', 'wJalrXUtnFEMI/K7MDENG'],
    ['authorization_header', 'curl -H "Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0" x', '9f8e7d6c5b4a3928'],
    [
      'authorization_header',
      "headers = {'Authorization': 'Basic dXNlcjpzdXBlcnNlY3JldHBhc3N3b3Jk'}",
      'dXNlcjpzdXBlcnNl',
    ],
    ['password_assignment', 'token = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"', '9f8e7d6c5b4a3928'],
    ['password_assignment', '{"token": "9f8e7d6c5b4a39281706f5e4d3c2b1a0"}', '9f8e7d6c5b4a3928'],
    ['password_assignment', "SECRET_KEY = 'django-insecure-abcdefghijklmnopqrstuvwxyz01'", 'django-insecure-abc'],
    ['telegram_bot_token', 'bot = Bot("123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1")', 'AAHdqTcvCH1vGWJxfSeof'],
    [
      'discord_bot_token',
      'client.run("MTA1Nzg5NjQ5NjI0MzU2NzYxNg.GhJ2mK.abcdefghijklmnopqrstuvwxyz0123456789AB")',
      'MTA1Nzg5NjQ5NjI0MzU2NzYxNg',
    ],
    ['twilio_api_key', 'sid = SK0123456789abcdef0123456789abcdef', 'SK0123456789abcdef'],
    ['digitalocean_token', `DO = dop_v1_${'a1'.repeat(32)}`, `dop_v1_${'a1'.repeat(8)}`],
    ['mailgun_key', 'mg = key-0123456789abcdef0123456789abcdef', 'key-0123456789abcdef'],
    ['google_oauth_token', `creds.token = ya29.a0AfH6SMB${'a'.repeat(40)}`, 'ya29.a0AfH6SMB'],
    [
      'connection_string_password',
      'conn = Server=tcp:x.database.windows.net;Database=db;User ID=u;Password=Sup3rS3cret!;',
      'Sup3rS3cret!',
    ],
  ];

  it.each(KILN)(
    '%s: the secret goes, the rest of the line and file stays, the line is reported',
    async (type, line, secret) => {
      const { text, found } = await redacted('src/settings.py', `# config\n\n${line}\nprint("done")\n`);
      expect(text).not.toContain(secret);
      expect(text.split('\n')[2]).toContain(`[REDACTED:${type}]`);
      expect(text.startsWith('# config\n\n') && text.endsWith('\nprint("done")\n')).toBe(true);
      expect(found[0]).toBe(`3:${type}`);
    },
  );

  it('a private key block is redacted whole and reported at the line it starts on', async () => {
    const key =
      '-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nQyNTUxOQ\n-----END OPENSSH PRIVATE KEY-----';
    const { text, found } = await redacted('notes.md', `intro\n${key}\noutro\n`);
    expect(text).toBe('intro\n[REDACTED:private_key]\noutro\n');
    expect(found).toEqual(['2:private_key']);
  });

  it('redacts every secret of a line and of a file, in order, each on its own line number', async () => {
    const { text, found } = await redacted('a.txt', `one AKIAABCDEFGHIJKLMNOP two ${GITHUB}\n\n\nthree ${GITHUB}\n`);
    expect(text).toBe('one [REDACTED:aws_access_key] two [REDACTED:github_token]\n\n\nthree [REDACTED:github_token]\n');
    expect(found).toEqual(['1:aws_access_key', '1:github_token', '4:github_token']);
  });

  it('counts lines of a CRLF file right and leaves its line ends as they are', async () => {
    const { text, found } = await redacted('w.ini', `[db]\r\nhost=x\r\npassword = "Hunter2Secret"\r\nport=5432\r\n`);
    expect(text).toBe('[db]\r\nhost=x\r\npassword = "[REDACTED:password_assignment]"\r\nport=5432\r\n');
    expect(found).toEqual(['3:password_assignment']);
  });

  it('keeps every byte of UTF-8 text around a secret, and counts lines after multi-byte characters right', async () => {
    const before = 'Schlüssel für 日本 😀\n\u2028 still line two\n';
    const { text, found } = await redacted('ü/notes.md', `${before}Straße ${GITHUB} ✓\n`);
    expect(Buffer.from(text)).toEqual(Buffer.from(`${before}Straße [REDACTED:github_token] ✓\n`));
    expect(found).toEqual(['3:github_token']);
  });

  it('refuses a binary file that holds a secret, saying what it found; lets one without a secret through', async () => {
    const bin = Buffer.concat([
      Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 0, 0, 13]),
      Buffer.from(`\n\n${GITHUB}`),
      Buffer.from([0, 255]),
    ]);
    const v = await scanOne('img.png', bin);
    expect(v).toMatchObject({ kind: 'refused', redactions: [{ path: 'img.png', line: 3, type: 'github_token' }] });
    expect(v.kind === 'refused' && v.reason).toMatch(/binary file that holds a secret \(github_token\)/);
    expect(await scanOne('clean.bin', Buffer.from([0, 1, 2, 3, 0, 255]))).toEqual({ kind: 'clean' });
  });
});

describe('secrets in file names', () => {
  it('a file whose name holds a secret is refused, saying what; an ordinary name is scanned as usual', async () => {
    const name = `data/ghp_${'a'.repeat(36)}.txt`;
    const v = await scanOne(name, 'harmless\n');
    expect(v).toMatchObject({
      kind: 'refused',
      reason: expect.stringContaining('its name holds a secret (github_token)'),
    });
    expect((await scanOne('data/github-notes.txt', 'harmless\n')).kind).toBe('clean');
  });
});

describe('what the scanner leaves alone', () => {
  it('ordinary code and prose, hashes and ids, and settings whose value is a reference or a placeholder', async () => {
    const texts = [
      'def total(xs):\n    return sum(xs)\n',
      'Reset your password from the settings page.\nThe secret of good bread is time.\n',
      'commit 3f786850e387550fdab836ed7e6dc881de23001b\nid = 123e4567-e89b-12d3-a456-426614174000\n',
      'password = os.environ["DB_PASSWORD"]\npassword: ${DB_PASSWORD}\napi_key = "<your-api-key>"\n',
      'password = "changeme"\nsecret: xxxxxxxx\ntoken = "********"\npassword = getenv("PW")\n',
      'password = "abc"\npwd=12345\n',
      'sk-short\nAKIA123\nghp_tooShort\n',
    ];
    for (const text of texts) expect(await scanOne('src/app.py', text), text).toEqual({ kind: 'clean' });
  });

  it('an empty file, and no file at all', async () => {
    expect(await scanOne('empty.txt', '')).toEqual({ kind: 'clean' });
    expect(await scanSecrets([])).toEqual([]);
  });

  it('the values of an example .env, but every value of a real one', async () => {
    expect(await scanOne('.env.example', 'DB_HOST=localhost\nDB_NAME=app\n')).toEqual({ kind: 'clean' });
    const { text, found } = await redacted(
      'deploy/.env.production',
      '# prod\nDB_HOST=db.internal\nEMPTY=\nREF=${OTHER}\n',
    );
    expect(text).toBe('# prod\nDB_HOST=[REDACTED:env_file_value]\nEMPTY=\nREF=${OTHER}\n');
    expect(found).toEqual(['2:env_file_value']);
  });
});

describe('key stores by their name', () => {
  it('are refused whatever their content, even empty; a public key or a look-alike name is scanned', async () => {
    const stores = [
      'id_rsa',
      '.ssh/id_ed25519',
      'home/u/.ssh/ID_ECDSA',
      'certs/client.p12',
      'a/b.PFX',
      'app.keystore',
      'vault.kdbx',
      'putty.ppk',
      'backup.gpg',
    ];
    const verdicts = await scanSecrets(stores.map((path) => ({ path, data: Buffer.from('nothing secret\n') })));
    for (const [i, v] of verdicts.entries())
      expect(v, stores[i]).toMatchObject({
        kind: 'refused',
        reason: expect.stringMatching(/private key or key store/),
        redactions: [],
      });
    expect((await scanOne('id_rsa', '')).kind).toBe('refused');
    for (const path of ['id_rsa.pub', 'my_id_rsa', 'notes/id_rsa.md', 'p12.txt'])
      expect(await scanOne(path, 'nothing secret\n'), path).toEqual({ kind: 'clean' });
  });

  it('a batch answers each file in its own place', async () => {
    const verdicts = await scanSecrets([
      { path: 'a.txt', data: Buffer.from('fine\n') },
      { path: 'id_rsa', data: Buffer.from('x') },
      { path: 'b.txt', data: Buffer.from(`t ${GITHUB}\n`) },
      { path: 'c.txt', data: Buffer.alloc(0) },
    ]);
    expect(verdicts.map((v) => v.kind)).toEqual(['clean', 'refused', 'redacted', 'clean']);
    expect(verdicts[2]).toMatchObject({ redactions: [{ path: 'b.txt', line: 1 }] });
  });
});

describe('the cost of hostile content', () => {
  // Each aimed at one pattern: long runs that a pattern starts to match and then fails on.
  const HOSTILE: [string, string][] = [
    ['a scheme with a megabyte of user name', `a://${'b'.repeat(1_000_000)}:`],
    ['a hundred thousand half URLs', 'x://a:'.repeat(100_000)],
    ['a setting name then blank space', `password${' '.repeat(500_000)}=`],
    ['a key block that never ends', `-----BEGIN RSA PRIVATE KEY-----\n${'A'.repeat(1_000_000)}`],
    ['a token header repeated', `eyJ${'a'.repeat(8)}${'.eyJ'.repeat(100_000)}`],
    ['one line of a megabyte', 'z'.repeat(1_000_000)],
  ];

  it.each(HOSTILE)('%s: scanned (not refused) off the event loop', async (_name, text) => {
    const { value, ticks } = await ticksDuring(() => scanOne('hostile.txt', text));
    expect(value.kind).not.toBe('refused');
    expect(ticks).toBeGreaterThan(10);
  });

  it('hundreds of secrets in one file are each redacted', async () => {
    const lines = Array.from({ length: 500 }, (_, i) => `k${i} = AKIA${String(i).padStart(16, 'Q')}`);
    const { text, found } = await redacted('many.txt', `${lines.join('\n')}\n`);
    expect(found).toHaveLength(500);
    expect(found.at(-1)).toBe('500:aws_access_key');
    expect(text).not.toMatch(/AKIA/);
  });

  it('in a batch, only the file that cannot be scanned in time is refused; the others are scanned', async () => {
    const slow = Buffer.from('password = "Hunter2Secret"\n'.repeat(200_000));
    const verdicts = await scanSecrets(
      [
        { path: 'small.txt', data: Buffer.from(`t ${GITHUB}\n`) },
        { path: 'slow.txt', data: slow },
        { path: 'fine.txt', data: Buffer.from('fine\n') },
      ],
      2_000,
    );
    expect(verdicts[0]).toMatchObject({ kind: 'redacted', redactions: [{ type: 'github_token' }] });
    expect(verdicts[1]).toMatchObject({
      kind: 'refused',
      reason: 'it could not be scanned for secrets within 2 s',
      redactions: [],
    });
    expect(verdicts[2]).toEqual({ kind: 'clean' });
  }, 120_000);
});
