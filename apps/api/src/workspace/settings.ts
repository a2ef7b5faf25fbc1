import { z } from '@hono/zod-openapi';
import { Cron } from 'croner';
import { AllowPattern, MAX_ALLOW } from './egress-allow.ts';
import { ruleProblem } from './rule-pattern.ts';

const validCron = (s: string) => {
  try {
    new Cron(s, { paused: true });
    return true;
  } catch {
    return false;
  }
};

const validTimeZone = (tz: string) => {
  try {
    new Intl.DateTimeFormat('en', { timeZone: tz });
    return true;
  } catch {
    return false;
  }
};

const RulePattern = z
  .string()
  .min(1)
  .max(500)
  .superRefine((match, ctx) => {
    const problem = ruleProblem(match);
    if (problem)
      ctx.addIssue({
        code: 'custom',
        message: `${JSON.stringify(match)} is not a regular expression RE2 accepts (no lookaround or backreferences): ${problem}`,
      });
  });

/** `server.tool`, `server.*` or `*`: which MCP tools a rule is about (no pattern syntax beyond `*`). */
const ToolRulePattern = z
  .string()
  .max(200)
  .regex(
    /^(\*|[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*\.(\*|[A-Za-z0-9_./-]{1,128}))$/,
    'must be server.tool, server.* or * (server: an mcp_servers name)',
  );

/**
 * A rule is about code (`match` only: an RE2 pattern searched for in the code, as always) or about
 * MCP tool calls (`tool`, optionally with `match` searched for in the call's arguments as JSON).
 */
const Rule = z
  .object({
    match: RulePattern.optional().openapi({
      description:
        'an RE2 regular expression searched for in the code (^ and $ match at line boundaries); with `tool`, in the call\u2019s arguments as JSON',
    }),
    tool: ToolRulePattern.optional().openapi({
      description:
        'makes this a rule about MCP tool calls: server.tool, server.* or * (e.g. github.create_issue); without it the rule is about code',
    }),
    behavior: z.enum(['allow', 'ask', 'deny']),
  })
  .strict()
  .refine((r) => r.match !== undefined || r.tool !== undefined, 'a rule needs `match` (code) or `tool` (MCP tools)');

/** The most MCP servers a workspace may name, and the most headers each may send. */
const MAX_MCP_SERVERS = 8;
const MAX_MCP_HEADERS = 16;

/** A server's name: a short identifier, the namespace of its tools (`name.tool`, `name__tool`); never `__` in it. */
const McpServerName = z
  .string()
  .max(24)
  .regex(
    /^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$/,
    'must be a short identifier: lower-case letters and digits, single - or _ between them, starting with a letter (at most 24)',
  );

/** `${secrets.NAME}` in a header value: the workspace secret's value, filled in when a call is made. */
// biome-ignore lint/suspicious/noTemplateCurlyInString: the syntax itself, for messages
const REF = '${secrets.NAME}';
export const SECRET_REF = /\$\{secrets\.([A-Z_][A-Z0-9_]{0,63})\}/g;

const McpHeaderValue = z
  .string()
  .max(2048)
  .refine((v) => !/[\r\n\0]/.test(v), 'must not contain line breaks or NUL')
  .refine((v) => !v.replace(SECRET_REF, '').includes('${'), `may reference secrets only as ${REF} (NAME: A-Z, 0-9, _)`);

const McpServer = z
  .object({
    name: McpServerName,
    url: z
      .string()
      .max(2048)
      .url()
      .regex(/^https?:\/\//i, 'must be an http(s) URL')
      .refine((u) => {
        try {
          const url = new URL(u);
          return !url.username && !url.password;
        } catch {
          return false;
        }
      }, 'must not carry credentials (put them in a header that references a secret)')
      .openapi({
        description:
          'the server\u2019s Streamable HTTP endpoint (public addresses only, unless the operator allows others: KILN_OUTBOUND_ALLOW)',
      }),
    headers: z
      .record(z.string().regex(/^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$/, 'must be an HTTP header name'), McpHeaderValue)
      .refine((h) => Object.keys(h).length <= MAX_MCP_HEADERS, `at most ${MAX_MCP_HEADERS} headers`)
      .refine(
        (h) =>
          Object.entries(h).every(([k, v]) => !/^(proxy-)?authorization$/i.test(k) || v.replace(SECRET_REF, '') !== v),
        `an Authorization header must take its credential from a workspace secret (${REF}): settings are readable by every key of the team`,
      )
      .default({})
      .openapi({
        description: `sent with every request; a value may reference a workspace secret as ${REF}, filled in at call time`,
      }),
  })
  .strict();

const McpServers = z
  .array(McpServer)
  .max(MAX_MCP_SERVERS)
  .refine((a) => new Set(a.map((s) => s.name)).size === a.length, 'server names must be unique')
  .default([])
  .openapi({
    description: `MCP servers (Streamable HTTP) whose tools the agent may call, each call under the approval policy; at most ${MAX_MCP_SERVERS}`,
  });

/** The container runtimes a sandbox can run in (the server offers those in KILN_SANDBOX_RUNTIMES). */
export const SANDBOX_RUNTIMES = ['runc', 'gvisor'] as const;
export type SandboxRuntime = (typeof SANDBOX_RUNTIMES)[number];

/** Bounds of `sandbox.idle_s`; the server's KILN_SANDBOX_MAX_IDLE_S may lower the upper one. */
const MIN_IDLE_S = 60;
const MAX_IDLE_S = 30 * 86_400;
/** Upper bound of `sandbox.paused_ttl_s`; the server's KILN_SANDBOX_MAX_PAUSED_TTL_S may lower it. */
const MAX_PAUSED_TTL_S = 30 * 86_400;

/** Every section, every field required: what a stored workspace always has. */
const sections = {
  model: z.string().min(1).max(200).nullable().openapi({ description: 'null = the server default (KILN_MODEL)' }),
  protocol: z.enum(['xml', 'tools']),
  max_steps: z.number().int().min(1).max(500),
  source_updates: z.boolean().default(false).openapi({
    description:
      'the agent may propose platform source updates (each needs an org admin\u2019s approval); only an org admin changes this (PUT /v1/system/workspaces/{workspace}/source-updates)',
  }),
  approval: z
    .object({
      mode: z.enum(['ask', 'auto', 'deny']),
      rules: z.array(Rule).max(100),
      timeout_s: z
        .number()
        .int()
        .min(10)
        .max(7 * 24 * 3600),
    })
    .strict(),
  sandbox: z
    .object({
      memory_mb: z.number().int().min(64).max(65536),
      cpus: z.number().min(0.1).max(64),
      pids: z.number().int().min(16).max(32768),
      timeout_s: z.number().int().min(1).max(3600),
      disk_mb: z.number().int().min(16).max(65536),
      network: z.enum(['none', 'allowlist']).openapi({
        description:
          'none: no network at all; allowlist: HTTP(S) only through the egress proxy, only to the names in `allow` ' +
          '(refused when the server sets KILN_EGRESS=off)',
      }),
      allow: z
        .array(AllowPattern)
        .max(MAX_ALLOW)
        .refine((a) => new Set(a).size === a.length, 'must not repeat a pattern')
        .default([])
        .openapi({ description: 'with network allowlist: the names code may reach (at most KILN_EGRESS_MAX_ALLOW)' }),
      // Default runc here: workspaces stored before runtimes existed keep it. New workspaces get the
      // server's default (gvisor when it is available) written in when they are created.
      runtime: z
        .enum(SANDBOX_RUNTIMES)
        .default('runc')
        .openapi({
          description:
            'the container runtime of the workspace\u2019s sandboxes: runc (Linux namespaces and seccomp) or gvisor ' +
            '(a user-space kernel between the code and the host); one of the server\u2019s KILN_SANDBOX_RUNTIMES. ' +
            'Unset on create, the server\u2019s default: gvisor when it offers it',
        }),
      idle_s: z
        .number()
        .int()
        .min(MIN_IDLE_S)
        .max(MAX_IDLE_S)
        .nullable()
        .default(null)
        .openapi({
          description:
            'seconds a session\u2019s sandbox may sit idle before it is reclaimed (its variables are lost); ' +
            'null = the server default (KILN_SANDBOX_IDLE_S); at most KILN_SANDBOX_MAX_IDLE_S',
        }),
      paused_ttl_s: z
        .number()
        .int()
        .min(0)
        .max(MAX_PAUSED_TTL_S)
        .nullable()
        .default(null)
        .openapi({
          description:
            'seconds an idle gVisor sandbox stays paused (checkpointed to disk, every variable kept) before it is removed; ' +
            '0 = never paused (removed at idle, as runc sandboxes always are); null = the server default ' +
            '(KILN_SANDBOX_PAUSED_TTL_S); at most KILN_SANDBOX_MAX_PAUSED_TTL_S. Time paused does not count against ' +
            'the sandbox\u2019s hard lifetime (KILN_SANDBOX_MAX_LIFETIME_S)',
        }),
      template: z
        .string()
        .max(64)
        .regex(/^tpl_[0-9a-z]+$/, 'not a template id')
        .nullable()
        .default(null)
        .openapi({
          description:
            'a template of this team (POST /v1/templates) whose image new sandboxes get; it must have been built; null = the base sandbox image',
        }),
      // Defaults here, not only in DEFAULT_SETTINGS: workspaces stored before these existed lack them.
      max_files_per_step: z.number().int().min(1).max(1_000_000).default(1000).openapi({
        description:
          'files one execution may change or delete; over it, nothing of the step is committed (capped by KILN_SANDBOX_MAX_FILES_PER_STEP)',
      }),
      max_bytes_per_step: z
        .number()
        .int()
        .min(1)
        .max(1024 * 1024 * 1024)
        .default(16 * 1024 * 1024)
        .openapi({
          description:
            'bytes one execution may write to the workspace; over it, nothing of the step is committed (capped by KILN_SANDBOX_MAX_BYTES_PER_STEP)',
        }),
    })
    .strict(),
  quota: z
    .object({
      max_files: z
        .number()
        .int()
        .min(1)
        .max(10_000_000)
        .openapi({ description: 'files the working tree may hold (capped by KILN_WORKSPACE_MAX_FILES)' }),
      max_bytes: z
        .number()
        .int()
        .min(1024)
        .max(1024 ** 4)
        .openapi({ description: 'bytes the working tree may hold (capped by KILN_WORKSPACE_MAX_BYTES)' }),
    })
    .strict()
    .default({ max_files: 10_000, max_bytes: 100 * 1024 * 1024 }),
  context: z
    .object({
      max_tokens: z.number().int().min(1000).max(2_000_000),
      max_turns: z.number().int().min(2).max(10_000),
    })
    .strict(),
  mcp_servers: McpServers,
  evolution: z
    .object({
      review_enabled: z.boolean(),
      review_idle_minutes: z
        .number()
        .int()
        .min(1)
        .max(7 * 24 * 60),
      review_min_turns: z.number().int().min(1).max(1000),
      dream_enabled: z.boolean(),
      dream_cron: z.string().min(1).max(100).refine(validCron, 'must be a valid cron expression'),
      timezone: z.string().min(1).max(64).refine(validTimeZone, 'must be an IANA time zone such as Europe/Berlin'),
      memory_max_entries: z.number().int().min(1).max(1000),
      memory_max_bytes: z.number().int().min(256).max(1_048_576),
    })
    .strict(),
};

export const WorkspaceSettings = z.object(sections).strict().openapi('WorkspaceSettings');
export type WorkspaceSettings = z.infer<typeof WorkspaceSettings>;

/** What a client may send on create or update: any subset, one level deep per section. */
/** A section's fields as a patch takes them: each optional and without its default. */
type PatchShape<S extends z.ZodRawShape> = {
  [K in keyof S]: z.ZodOptional<S[K] extends z.ZodDefault<infer I> ? I : S[K]>;
};

/**
 * A section as a patch: every field optional, and none defaulted, so that a patch changes only
 * what it names (`.partial()` keeps defaults, which would reset every defaulted field of the
 * section, e.g. a patch of sandbox.memory_mb setting sandbox.idle_s back to null).
 */
function patchOf<S extends z.ZodRawShape>(section: z.ZodObject<S>) {
  const shape = Object.fromEntries(
    Object.entries(section.shape).map(([k, f]) => [
      k,
      (f instanceof z.ZodDefault ? (f.removeDefault() as z.ZodType) : (f as z.ZodType)).optional(),
    ]),
  ) as unknown as PatchShape<S>;
  return z.object(shape).strict();
}

export const SettingsPatch = z
  .object({
    model: sections.model.optional(),
    protocol: sections.protocol.optional(),
    max_steps: sections.max_steps.optional(),
    approval: sections.approval.partial().optional(),
    sandbox: patchOf(sections.sandbox).optional(),
    quota: sections.quota.removeDefault().partial().optional(),
    context: sections.context.partial().optional(),
    evolution: sections.evolution.partial().optional(),
    mcp_servers: sections.mcp_servers.removeDefault().optional(),
  })
  .strict()
  .openapi('WorkspaceSettingsPatch');
export type SettingsPatch = z.infer<typeof SettingsPatch>;

export const DEFAULT_SETTINGS: WorkspaceSettings = {
  model: null,
  protocol: 'xml',
  max_steps: 30,
  source_updates: false,
  approval: { mode: 'ask', rules: [], timeout_s: 600 },
  sandbox: {
    memory_mb: 512,
    cpus: 1,
    pids: 256,
    timeout_s: 60,
    disk_mb: 256,
    network: 'none',
    runtime: 'runc',
    allow: [],
    idle_s: null,
    paused_ttl_s: null,
    template: null,
    max_files_per_step: 1000,
    max_bytes_per_step: 16 * 1024 * 1024,
  },
  quota: { max_files: 10_000, max_bytes: 100 * 1024 * 1024 },
  context: { max_tokens: 64_000, max_turns: 40 },
  mcp_servers: [],
  evolution: {
    review_enabled: true,
    review_idle_minutes: 10,
    review_min_turns: 6,
    dream_enabled: true,
    dream_cron: '55 23 * * *',
    timezone: 'UTC',
    memory_max_entries: 50,
    memory_max_bytes: 8192,
  },
};

type Section = 'approval' | 'sandbox' | 'quota' | 'context' | 'evolution';
const SECTIONS: Section[] = ['approval', 'sandbox', 'quota', 'context', 'evolution'];

/** Applies a validated patch to full settings; sections merge field by field, `rules` and `mcp_servers` are replaced whole. */
export function applySettingsPatch(base: WorkspaceSettings, patch: SettingsPatch): WorkspaceSettings {
  const next: WorkspaceSettings = structuredClone(base);
  if (patch.model !== undefined) next.model = patch.model;
  if (patch.protocol !== undefined) next.protocol = patch.protocol;
  if (patch.max_steps !== undefined) next.max_steps = patch.max_steps;
  // Replaced whole, like `rules`.
  if (patch.mcp_servers !== undefined) next.mcp_servers = patch.mcp_servers;
  for (const s of SECTIONS) {
    const part = patch[s];
    // A section added after the workspace was stored starts from its defaults.
    if (!part) continue;
    const into = (next as Record<Section, object | undefined>)[s] ?? structuredClone(DEFAULT_SETTINGS[s]);
    (next as Record<Section, object>)[s] = Object.assign(
      into,
      Object.fromEntries(Object.entries(part).filter(([, v]) => v !== undefined)),
    );
  }
  return WorkspaceSettings.parse(next);
}
