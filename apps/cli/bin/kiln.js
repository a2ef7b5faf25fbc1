#!/usr/bin/env node
// The `kiln` command. It runs one bundle of the CLI and the SDK (apps/cli/dist/kiln.mjs: about
// 0.1 s to start, against 0.4 s compiling the TypeScript through tsx's loader at every call),
// made with esbuild when it is missing or older than any source. Without esbuild, or when the
// bundle cannot be written, it falls back to tsx.
import { mkdirSync, readdirSync, renameSync, statSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = fileURLToPath(new URL('../../', import.meta.url));
const entry = `${root}cli/src/main.ts`;
const bundle = `${root}cli/dist/kiln.mjs`;

/** The newest modification time of the files under these directories. */
function newest(dirs) {
  let max = 0;
  for (const dir of dirs)
    for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true }))
      if (entry.isFile()) max = Math.max(max, statSync(`${entry.parentPath ?? entry.path}/${entry.name}`).mtimeMs);
  return max;
}

async function fresh() {
  const built = statSync(bundle, { throwIfNoEntry: false })?.mtimeMs ?? 0;
  if (built && built >= newest([`${root}cli/src`, `${root}sdk/src`])) return true;
  try {
    const { buildSync } = await import('esbuild');
    mkdirSync(`${root}cli/dist`, { recursive: true });
    // Written beside and renamed: a `kiln` started at the same moment never runs half a file.
    const tmp = `${bundle}.${process.pid}.tmp`;
    buildSync({
      entryPoints: [entry],
      bundle: true,
      platform: 'node',
      format: 'esm',
      target: 'node20',
      outfile: tmp,
      logLevel: 'silent',
      // The bundle's own require() for any CommonJS dependency.
      banner: {
        js: "import { createRequire as __kilnRequire } from 'node:module'; const require = __kilnRequire(import.meta.url);",
      },
    });
    renameSync(tmp, bundle);
    return true;
  } catch {
    return false;
  }
}

if (await fresh()) {
  await import(pathToFileURL(bundle).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(pathToFileURL(entry).href);
}
