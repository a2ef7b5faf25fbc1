// The secret scanner's own thread: content about to be committed comes from tenants (code in a
// sandbox, the files API, the agent), so the rules run here, where a slow match stops nothing
// but this thread, and the caller's deadline can end it (see secret-scan.ts).
//
// Plain JavaScript on purpose: Node starts a worker outside tsx's and vitest's loaders.
// A thread of off-thread.ts:
//   in:  { id, files: [{ path, text, name? }] } (name: text is a file's name, scanned with Kiln's patterns only)
//   out: { id, ok: [[{ start, end, type }], …] (one list per file, in order) } | { id, error }
//
// The rules: secretlint's recommended preset (maintained upstream: cloud keys, tokens of the
// common SaaS APIs, connection strings, …) plus Kiln's own patterns below, which win where both
// match the same text (their names are the ones Kiln has always reported).
import { lintSource } from '@secretlint/core';
import { creator as recommended } from '@secretlint/secretlint-rule-preset-recommend';
import { serve } from '../lib/serve-thread.mjs';

const CONFIG = { rules: [{ id: '@secretlint/secretlint-rule-preset-recommend', rule: recommended }] };

// Names of settings whose values are secrets, in assignments of every common shape.
const SECRET_NAME =
  '(?:password|passwd|pwd|secret|secret[_-]?key|client_secret|api[_-]?key|apikey|token|access[_-]?token|auth[_-]?token|refresh[_-]?token|private[_-]?key|_authToken|_auth|_password)';

/** Kiln's own patterns; `group` names the capture holding the secret (the whole match otherwise). */
const PATTERNS = [
  {
    type: 'private_key',
    re: /-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----/g,
  },
  { type: 'aws_access_key', re: /\b(?:AKIA|ASIA)[0-9A-Z]{16}\b/g },
  // aws_secret_access_key = …, AWS_SECRET_ACCESS_KEY: …, "aws_secret_access_key": "…" (JSON),
  // "SecretAccessKey": "…" (what `aws sts` and `aws iam create-access-key` print)
  {
    type: 'aws_secret_key',
    re: /(?:aws_secret_access_key|aws_secret_key|secretaccesskey)["']?\s*[=:]\s*["']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])/gi,
    group: 1,
  },
  { type: 'github_token', re: /\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b/g },
  { type: 'anthropic_key', re: /\bsk-ant-[A-Za-z0-9_-]{20,}/g },
  { type: 'openai_key', re: /\bsk-(?:proj-|live-)?[A-Za-z0-9_-]{20,}/g },
  { type: 'stripe_key', re: /\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b/g },
  { type: 'slack_token', re: /\bxox[abposr]-[A-Za-z0-9-]{10,}/g },
  { type: 'slack_webhook', re: /https:\/\/hooks\.slack\.com\/(?:services|workflows|triggers)\/[A-Za-z0-9/_+-]{20,}/g },
  { type: 'google_api_key', re: /\bAIza[0-9A-Za-z_-]{35}\b/g },
  { type: 'gitlab_token', re: /\bgl(?:pat|dt|rt|ptt|cbt|oas)-[A-Za-z0-9_-]{20,}/g },
  { type: 'npm_token', re: /\bnpm_[A-Za-z0-9]{36}\b/g },
  { type: 'huggingface_token', re: /\bhf_[A-Za-z0-9]{30,}\b/g },
  { type: 'pypi_token', re: /\bpypi-AgE[A-Za-z0-9_-]{50,}/g },
  { type: 'sendgrid_key', re: /\bSG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64}/g },
  { type: 'azure_storage_key', re: /\b(?:AccountKey|SharedAccessKey)=([A-Za-z0-9+/=]{20,})/g, group: 1 },
  { type: 'kiln_key', re: /\bkiln_(?:admin_)?[A-Za-z0-9_-]{32}\b/g },
  { type: 'jwt', re: /\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}/g },
  // Authorization: Bearer …, "Authorization": "Basic …", headers={'Authorization': 'token …'}
  {
    type: 'authorization_header',
    re: /\bAuthorization["']?\s*[:=]\s*["']?(?:Bearer|Basic|Token|Bot)\s+([A-Za-z0-9._~+/=-]{16,})/gi,
    group: 1,
  },
  { type: 'telegram_bot_token', re: /\b\d{8,10}:AA[A-Za-z0-9_-]{33}\b/g },
  { type: 'discord_bot_token', re: /\b[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}\b/g },
  { type: 'twilio_api_key', re: /\bSK[0-9a-fA-F]{32}\b/g },
  { type: 'digitalocean_token', re: /\bdo[opr]_v1_[a-f0-9]{64}\b/g },
  { type: 'mailgun_key', re: /\bkey-[0-9a-f]{32}\b/g },
  { type: 'google_oauth_token', re: /\bya29\.[0-9A-Za-z_-]{20,}/g },
  // ADO.NET / ODBC connection strings: …;Password=…; or Pwd=…
  { type: 'connection_string_password', re: /;[ \t]*(?:Password|Pwd)[ \t]*=[ \t]*([^;'"\s]{4,})/gi, group: 1 },
  // scheme://user:password@host — any scheme (postgres, mysql, redis, amqp, https, …)
  {
    type: 'url_password',
    re: /\b[a-z][a-z0-9+.-]{1,20}:\/\/[^\s:/@"'<>]{1,200}:([^\s@/"'<>]{3,200})@[^\s/"'<>]/gi,
    group: 1,
  },
  // password = "x", password: 'x', "password": "x" (JSON), password: x (YAML), PASSWORD=x (env)
  {
    type: 'password_assignment',
    re: new RegExp(String.raw`["']?\b\w*${SECRET_NAME}\b["']?\s*[=:]\s*["']([^"'\s]{6,})["']`, 'gi'),
    group: 1,
  },
  {
    type: 'password_assignment',
    re: new RegExp(
      String.raw`^[ \t]*(?:export[ \t]+)?[\w.-]*${SECRET_NAME}[\w.-]*[ \t]*[=:][ \t]*([^\s"'#][^\s"'#]{5,})`,
      'gim',
    ),
    group: 1,
  },
];

/** A value that names a secret instead of holding one (a reference, a placeholder), kept as it is. */
const PLACEHOLDER =
  /^(?:\$\{?[\w.]+\}?|<[^>]*>|\[REDACTED:\w+\]|x{3,}|\*{3,}|changeme|example|(?:your|my)[_-]?\w*|none|null|true|false|os\.environ.*|getenv.*)$/i;

// Match indices ('d') give where the secret itself is inside a longer match.
const COMPILED = PATTERNS.map((p) => ({
  ...p,
  re: new RegExp(p.re.source, p.re.flags.includes('d') ? p.re.flags : `${p.re.flags}d`),
}));

function kilnFindings(text) {
  const out = [];
  for (const { type, re, group = 0 } of COMPILED) {
    re.lastIndex = 0;
    for (let m; (m = re.exec(text)); ) {
      if (m[0].length === 0) {
        re.lastIndex++;
        continue;
      }
      const value = m[group];
      if (value === undefined || (group && PLACEHOLDER.test(value))) continue;
      const [start, end] = m.indices[group];
      out.push({ start, end, type });
    }
  }
  return out;
}

// Files that hold credentials by their name: every value in them is a secret, whatever it looks like.
const ENV_FILE = /(?:^|\/)(?:\.env(?:\.[\w.-]+)?|\.envrc)$/i;
const ENV_EXAMPLE = /\.(?:example|sample|template|dist)$/i;
const NETRC = /(?:^|\/)[._]netrc$/i;
const PGPASS = /(?:^|\/)\.pgpass$/i;

/** Each line with its start offset (no regular expression over the content: linear by construction). */
function* lines(text) {
  for (let at = 0; at <= text.length; ) {
    const nl = text.indexOf('\n', at);
    const end = nl < 0 ? text.length : nl;
    yield [at, text.slice(at, end)];
    at = end + 1;
  }
}

function fileFindings(path, text) {
  const out = [];
  const add = (lineStart, line, value, type) => {
    if (!value || PLACEHOLDER.test(value)) return;
    const start = lineStart + line.lastIndexOf(value);
    out.push({ start, end: start + value.length, type });
  };
  if (ENV_FILE.test(path) && !ENV_EXAMPLE.test(path)) {
    for (const [at, line] of lines(text)) {
      const eq = line.indexOf('=');
      if (eq < 1 || line.trimStart().startsWith('#')) continue;
      let value = line.slice(eq + 1).trim();
      const quote = value[0];
      if (quote === '"' || quote === "'")
        value = value.slice(1, value.indexOf(quote, 1) > 0 ? value.indexOf(quote, 1) : undefined);
      else value = value.split(/\s#/)[0].trim();
      add(at, line, value, 'env_file_value');
    }
  } else if (NETRC.test(path)) {
    for (const [at, line] of lines(text)) {
      const words = line.split(/\s+/);
      for (let i = 0; i < words.length - 1; i++)
        if (words[i] === 'password') add(at, line, words[i + 1], 'netrc_password');
    }
  } else if (PGPASS.test(path)) {
    for (const [at, line] of lines(text)) {
      const fields = line.split(/(?<!\\):/);
      if (fields.length === 5 && !line.startsWith('#')) add(at, line, fields[4], 'pgpass_password');
    }
  }
  return out;
}

async function secretlintFindings(path, text) {
  const result = await lintSource({
    source: { filePath: `/workspace/${path}`, content: text, ext: '', contentType: 'text' },
    options: { config: CONFIG },
  });
  return result.messages.map((m) => ({ start: m.range[0], end: m.range[1], type: m.messageId.toLowerCase() }));
}

/** Kiln's findings first; secretlint's where they overlap none of them. Sorted, never overlapping. */
function merge(kiln, lint) {
  const taken = [];
  const overlaps = (f) => taken.some((t) => f.start < t.end && t.start < f.end);
  for (const f of [...kiln.sort((a, b) => a.start - b.start || b.end - a.end), ...lint])
    if (!overlaps(f)) taken.push(f);
  return taken.sort((a, b) => a.start - b.start);
}

serve(async ({ files }) => {
  const findings = [];
  // A file's name (`name`): Kiln's own patterns only, which are what a token saved as a name looks like.
  for (const { path, text, name } of files)
    findings.push(
      name
        ? merge(kilnFindings(text), [])
        : merge([...fileFindings(path, text), ...kilnFindings(text)], await secretlintFindings(path, text)),
    );
  return findings;
});
