import { lstat, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import pLimit from 'p-limit';
import { DEFAULT_SETTINGS, type WorkspaceSettings } from './settings.ts';

/** What one step may change and what a workspace's working tree may hold. */
export interface Quota {
  filesPerStep: number;
  bytesPerStep: number;
  files: number;
  bytes: number;
}

/** Server-wide maxima that cap every workspace's quota settings. */
export type QuotaMax = Quota;

/** The server defaults of the KILN_*_MAX_* variables (see config.ts). */
export const DEFAULT_QUOTA_MAX: QuotaMax = {
  filesPerStep: 10_000,
  bytesPerStep: 32 * 1024 * 1024,
  files: 50_000,
  bytes: 200 * 1024 * 1024,
};

/**
 * File reads one caller has in flight at once: a step that touched tens of thousands of files
 * must never exhaust the API process's file descriptors.
 */
const READ_CONCURRENCY = 16;

/** A workspace's quota settings capped by the server-wide maxima (stored settings may predate them). */
export function effectiveQuota(settings: Pick<WorkspaceSettings, 'sandbox' | 'quota'>, max: QuotaMax): Quota {
  const s = { ...DEFAULT_SETTINGS.sandbox, ...settings.sandbox };
  const q = { ...DEFAULT_SETTINGS.quota, ...settings.quota };
  return {
    filesPerStep: Math.min(s.max_files_per_step, max.filesPerStep),
    bytesPerStep: Math.min(s.max_bytes_per_step, max.bytesPerStep),
    files: Math.min(q.max_files, max.files),
    bytes: Math.min(q.max_bytes, max.bytes),
  };
}

export class QuotaError extends Error {}

/** One step's changes against the per-step quota: the count includes deletions. */
export function checkStep(q: Quota, step: { files: number; bytes: number; over?: 'files' | 'bytes' }): void {
  if (step.over === 'files' || step.files > q.filesPerStep) {
    const n = step.over === 'files' ? `more than ${q.filesPerStep}` : String(step.files);
    throw new QuotaError(
      `this step changed ${n} files; a step may change at most ${q.filesPerStep} files (sandbox.max_files_per_step)`,
    );
  }
  if (step.over === 'bytes' || step.bytes > q.bytesPerStep) {
    const n = step.over === 'bytes' ? `more than ${q.bytesPerStep}` : String(step.bytes);
    throw new QuotaError(
      `this step wrote ${n} bytes; a step may write at most ${q.bytesPerStep} bytes (sandbox.max_bytes_per_step)`,
    );
  }
}

/** The working tree after a change (`sizes` of the files it writes, null for deletions) against the workspace quota. */
/** Checks a workspace's quota after the given writes; resolves with the bytes it would then hold. */
export async function checkTotal(q: Quota, dir: string, sizes: Map<string, number | null>): Promise<number> {
  const now = await usageOf(dir);
  let bytes = 0;
  for (const [path, size] of sizes) {
    if (size === null) now.delete(path);
    else now.set(path, size);
  }
  for (const size of now.values()) bytes += size;
  if (now.size > q.files)
    throw new QuotaError(`the workspace would hold ${now.size} files; its quota is ${q.files} files (quota.max_files)`);
  if (bytes > q.bytes)
    throw new QuotaError(`the workspace would hold ${bytes} bytes; its quota is ${q.bytes} bytes (quota.max_bytes)`);
  return bytes;
}

/** path -> size of every regular file of a working tree, without .git and Kiln's temporary files. */
async function usageOf(root: string): Promise<Map<string, number>> {
  const sizes = new Map<string, number>();
  const limit = pLimit(READ_CONCURRENCY);
  const walk = async (rel: string): Promise<void> => {
    const entries = await limit(() => readdir(join(root, rel), { withFileTypes: true }));
    await Promise.all(
      entries.map(async (e) => {
        const path = rel ? `${rel}/${e.name}` : e.name;
        if (e.isDirectory()) {
          if (path !== '.git') await walk(path);
        } else if (e.isFile() && !/^\.kiln-.*\.tmp$/.test(e.name)) {
          const st = await limit(() => lstat(join(root, path)).catch(() => null));
          if (st) sizes.set(path, st.size);
        }
      }),
    );
  };
  await walk('');
  return sizes;
}

/**
 * The current content of paths for the sandbox copies (null for deleted ones), read a few at
 * a time. Only a file that is not there is a deletion: any other read error (EMFILE, EISDIR,
 * EACCES) leaves that path out, so a failed read never deletes a file in another sandbox.
 */
export async function readForSandboxes(
  read: (path: string) => Promise<Buffer>,
  paths: string[],
  onError?: (path: string, err: Error) => void,
): Promise<{ path: string; data: Buffer | null }[]> {
  const limit = pLimit(READ_CONCURRENCY);
  const files = await Promise.all(
    paths.map((path) =>
      limit(async () => {
        try {
          return { path, data: await read(path) };
        } catch (err) {
          if ((err as { code?: string }).code === 'ENOENT') return { path, data: null };
          onError?.(path, err as Error);
          return undefined;
        }
      }),
    ),
  );
  return files.filter((f) => f !== undefined);
}
