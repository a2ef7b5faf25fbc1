import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { Hono } from 'hono';

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
  // The package's directory, found without running its entry point (which loads the 1.4 MB bundle
  // into the server, ~0.2 s of every start, only to say where it is); its files are read at the
  // first request for them.
  const require = createRequire(import.meta.url);
  const dir = dirname(require.resolve('swagger-ui-dist/package.json'));
  let files: Map<string, { body: Buffer<ArrayBuffer>; type: string }> | undefined;
  const read = () => {
    files ??= new Map([
      ...Object.entries(ASSETS).map(([name, type]) => [name, { body: readFileSync(join(dir, name)), type }] as const),
      ['init.js', { body: Buffer.from(INIT), type: 'text/javascript; charset=utf-8' }],
    ]);
    return files;
  };
  return new Hono()
    .get('/docs', (c) => c.html(PAGE))
    .get('/docs/:file', (c) => {
      const f = read().get(c.req.param('file'));
      if (!f) return c.notFound();
      return c.body(f.body, 200, { 'content-type': f.type, 'cache-control': 'public, max-age=86400' });
    });
}
