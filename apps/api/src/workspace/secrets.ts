/** A secret found in content about to be committed. */
export interface Redaction {
  path: string;
  line: number;
  type: string;
}

const PATTERNS: { type: string; re: RegExp }[] = [
  { type: 'private_key', re: /-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----/g },
  { type: 'aws_access_key', re: /\b(?:AKIA|ASIA)[0-9A-Z]{16}\b/g },
  { type: 'aws_secret_key', re: /(?<=aws_secret_access_key\s*[=:]\s*["']?)[A-Za-z0-9/+=]{40}\b/gi },
  { type: 'github_token', re: /\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b/g },
  { type: 'openai_key', re: /\bsk-(?:proj-|live-)?[A-Za-z0-9_-]{20,}\b/g },
  { type: 'anthropic_key', re: /\bsk-ant-[A-Za-z0-9_-]{20,}\b/g },
  { type: 'stripe_key', re: /\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b/g },
  { type: 'slack_token', re: /\bxox[abposr]-[A-Za-z0-9-]{10,}\b/g },
  { type: 'google_api_key', re: /\bAIza[0-9A-Za-z_-]{35}\b/g },
  { type: 'kiln_key', re: /\bkiln_(?:admin_)?[A-Za-z0-9_-]{32}\b/g },
  { type: 'jwt', re: /\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b/g },
  {
    type: 'password_assignment',
    re: /(?<=\b(?:password|passwd|secret|api_key|apikey|access_token|auth_token)\s*[=:]\s*["'])[^"'\s]{8,}(?=["'])/gi,
  },
];

/** Replaces every secret in `text` with `[REDACTED:type]`, reporting where each one was. */
export function redactSecrets(path: string, text: string): { text: string; redactions: Redaction[] } {
  const redactions: Redaction[] = [];
  let out = text;
  for (const { type, re } of PATTERNS) {
    out = out.replace(re, (match: string, ...args: unknown[]) => {
      const offset = args.find((a) => typeof a === 'number') as number;
      redactions.push({ path, line: out.slice(0, offset).split('\n').length, type });
      return `[REDACTED:${type}]`;
    });
  }
  return { text: out, redactions: redactions.sort((a, b) => a.line - b.line) };
}
