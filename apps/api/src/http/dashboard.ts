import { readFile } from 'node:fs/promises';
import { extname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Hono } from 'hono';

/** Where `npm run dashboard:build` writes the ops dashboard. */
export const DASHBOARD_DIST = fileURLToPath(new URL('../../../dashboard/dist', import.meta.url));

const TYPES: Record<string, string> = {
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.woff2': 'font/woff2',
  '.map': 'application/json; charset=utf-8',
};

/** A file name vite writes into assets/: one path segment, no leading dot, nothing to climb with. */
const ASSET_NAME = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$/;

const NOT_BUILT = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Kiln</title></head>
<body><h1>Kiln</h1><p>The ops dashboard is not built. Run <code>npm run dashboard:build</code> and reload this page.</p>
<p>The API answers as usual: <a href="/docs">API reference</a>.</p></body></html>`;

const readOrNull = (path: string) => readFile(path).catch(() => null);

/**
 * The ops dashboard: `/` is its page and `/assets/*` the files vite built. Neither needs a key:
 * the page holds no data and asks the API (with the key the person types) for everything.
 */
export function dashboardRouter(dist = DASHBOARD_DIST) {
  return new Hono()
    .get('/', async (c) => {
      const page = await readOrNull(join(dist, 'index.html'));
      c.header('cache-control', 'no-cache');
      return c.html(page ? page.toString('utf8') : NOT_BUILT);
    })
    .get('/assets/:file', async (c) => {
      const name = c.req.param('file');
      const type = TYPES[extname(name)];
      if (!ASSET_NAME.test(name) || !type) return c.notFound();
      const body = await readOrNull(join(dist, 'assets', name));
      if (!body) return c.notFound();
      // vite puts a content hash in every asset name, so a name never changes meaning.
      return c.body(new Uint8Array(body), 200, {
        'content-type': type,
        'cache-control': 'public, max-age=31536000, immutable',
      });
    });
}
