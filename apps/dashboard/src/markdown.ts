import DOMPurify from 'dompurify';
import { marked } from 'marked';

/**
 * Elements a rendered workspace file never gets, even where Markdown's HTML would allow them:
 * nothing that runs, styles the page, submits, embeds or frames.
 */
const FORBID_TAGS = [
  'style',
  'form',
  'input',
  'button',
  'textarea',
  'select',
  'iframe',
  'object',
  'embed',
  'svg',
  'math',
];

/** `rel` of a link that leaves the console: no referrer, no handle on this window. */
const EXTERNAL_REL = 'noopener noreferrer nofollow';

/**
 * A workspace path `href` points at from the file at `from` (both relative to the workspace
 * root), or null when it leaves the workspace. `/x` is the workspace's root, not the server's.
 */
export function resolveLink(from: string, href: string): string | null {
  const target = href.split(/[?#]/)[0]!;
  if (!target) return null;
  const parts = target.startsWith('/') ? [] : from.split('/').slice(0, -1);
  for (const seg of target.split('/')) {
    if (seg === '' || seg === '.') continue;
    if (seg === '..') {
      if (parts.length === 0) return null;
      parts.pop();
    } else parts.push(decodeURIComponentSafe(seg));
  }
  return parts.length ? parts.join('/') : null;
}

function decodeURIComponentSafe(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/**
 * A workspace file's Markdown as a sanitised fragment: marked renders it, DOMPurify removes
 * every script, handler, style and unsafe URL; then links to the workspace's own files open in
 * the console (`fileHref`), links with a web or mail scheme open outside it, every other link
 * loses its target, and images other than inline data are replaced by their alt text (the
 * page's policy would refuse to load them anyway).
 */
export function renderMarkdown(text: string, from: string, fileHref: (path: string) => string): DocumentFragment {
  const html = marked.parse(text, { async: false, gfm: true });
  const frag = DOMPurify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    FORBID_TAGS,
    FORBID_ATTR: ['style', 'class', 'id', 'target'],
  });
  for (const a of frag.querySelectorAll('a')) {
    const href = a.getAttribute('href') ?? '';
    a.removeAttribute('href');
    if (/^(https?|mailto):/i.test(href)) {
      a.setAttribute('href', href);
      a.setAttribute('target', '_blank');
      a.setAttribute('rel', EXTERNAL_REL);
    } else if (!/^[a-z][a-z0-9+.-]*:/i.test(href) && !href.startsWith('#') && !href.startsWith('//')) {
      const path = resolveLink(from, href);
      if (path) a.setAttribute('href', fileHref(path));
    }
  }
  for (const img of frag.querySelectorAll('img')) {
    if (/^data:image\/(png|jpeg|gif|webp);/i.test(img.getAttribute('src') ?? '')) continue;
    img.replaceWith(document.createTextNode(img.getAttribute('alt') ?? ''));
  }
  return frag;
}
