import { teamOf, writableTeamOf } from '../../http/guards.ts';
import { toPage } from '../../http/pagination.ts';
import { createRouter } from '../../http/router.ts';
import { logTail, type TemplateRow, type TemplateService } from '../../templates/service.ts';
import * as r from './templates.routes.ts';

const view = (t: TemplateRow) => ({
  id: t.id,
  name: t.name,
  apt: t.spec.apt,
  pip: t.spec.pip,
  files: t.spec.files,
  status: t.status,
  image: t.image,
  error: t.error,
  log_tail: logTail(t.log),
  hash: t.specHash,
  created_at: t.createdAt.toISOString(),
  updated_at: t.updatedAt.toISOString(),
  built_at: t.builtAt?.toISOString() ?? null,
});

/** What the audit trail keeps of a template: its definition and state, not its build log. */
const audited = (t: TemplateRow) => {
  const { log_tail: _, ...rest } = view(t);
  return rest;
};

export function templatesRouter(templates: TemplateService) {
  return createRouter()
    .openapi(r.create, async (c) => {
      const { row, cached } = await templates.create(writableTeamOf(c), c.req.valid('json'));
      c.set('audit', {
        action: 'template.create',
        resourceType: 'template',
        resourceId: row.id,
        after: { ...audited(row), cached },
      });
      return c.json(view(row), 201);
    })
    .openapi(r.list, async (c) => {
      const q = c.req.valid('query');
      return c.json(toPage(await templates.list(teamOf(c), q), q, view), 200);
    })
    .openapi(r.get, async (c) => c.json(view(await templates.get(teamOf(c), c.req.valid('param').template)), 200))
    .openapi(r.log, async (c) => {
      const t = await templates.get(teamOf(c), c.req.valid('param').template);
      return c.json({ id: t.id, status: t.status, log: t.log }, 200);
    })
    .openapi(r.update, async (c) => {
      const id = c.req.valid('param').template;
      const { before, after, cached } = await templates.update(writableTeamOf(c), id, c.req.valid('json'));
      c.set('audit', {
        action: 'template.update',
        resourceType: 'template',
        resourceId: id,
        before: audited(before),
        after: { ...audited(after), cached },
      });
      return c.json(view(after), 200);
    })
    .openapi(r.remove, async (c) => {
      const id = c.req.valid('param').template;
      const before = await templates.remove(writableTeamOf(c), id);
      c.set('audit', { action: 'template.delete', resourceType: 'template', resourceId: id, before: audited(before) });
      return c.json({ id, deleted: true as const }, 200);
    });
}
