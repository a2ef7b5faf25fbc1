import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Hono } from 'hono';
import { getAbsoluteFSPath } from 'swagger-ui-dist';

const ASSETS: Record<string, string> = {
  'swagger-ui.css': 'text/css; charset=utf-8',
  'swagger-ui-bundle.js': 'text/javascript; charset=utf-8',
};

const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Kiln API</title>
<link rel="stylesheet" href="/docs/swagger-ui.css"></head>
<body><div id="ui"></div><script src="/docs/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body></html>`;

/** Started from a file of its own, not inline: the page's Content-Security-Policy allows no inline script. */
const INIT = `SwaggerUIBundle({ url: '/openapi.json', dom_id: '#ui', persistAuthorization: true });\n`;

/** The API reference at /docs, served from the installed swagger-ui-dist (no CDN: works offline). */
export function docsRouter() {
  const dir = getAbsoluteFSPath();
  const files = new Map(
    Object.entries(ASSETS).map(([name, type]) => [name, { body: readFileSync(join(dir, name)), type }]),
  );
  files.set('init.js', { body: Buffer.from(INIT), type: 'text/javascript; charset=utf-8' });
  return new Hono()
    .get('/docs', (c) => c.html(PAGE))
    .get('/docs/:file', (c) => {
      const f = files.get(c.req.param('file'));
      if (!f) return c.notFound();
      return c.body(f.body, 200, { 'content-type': f.type, 'cache-control': 'public, max-age=86400' });
    });
}
