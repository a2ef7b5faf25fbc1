import { requireOrgAdmin } from '../../http/guards.ts';
import { createRouter } from '../../http/router.ts';
import type { FleetBackend } from '../../sandbox/node/fleet.ts';
import type { NodeRegistry } from '../../sandbox/node/registry.ts';
import * as r from './nodes.routes.ts';

/** The sandbox node registry (docs/scaling.md): org admins only; changes are audited. */
export function nodesRouter(registry: NodeRegistry, fleet: FleetBackend | undefined) {
  return createRouter()
    .openapi(r.list, async (c) => {
      requireOrgAdmin(c);
      return c.json({ data: await registry.list() }, 200);
    })
    .openapi(r.add, async (c) => {
      requireOrgAdmin(c);
      const { name, url } = c.req.valid('json');
      const added = await registry.add(name, url);
      // This replica hears from it at once (every replica does at its next heartbeat).
      await fleet?.refresh();
      const after = await registry.get(name);
      c.set('audit', { action: 'system.node.add', resourceType: 'sandbox_node', resourceId: name, after: added });
      return c.json(after, 201);
    })
    .openapi(r.drain, async (c) => {
      requireOrgAdmin(c);
      const { node } = c.req.valid('param');
      const { before, after } = await registry.drain(node);
      await fleet?.refresh();
      c.set('audit', {
        action: 'system.node.drain',
        resourceType: 'sandbox_node',
        resourceId: node,
        before: { state: before.state },
        after: { state: after.state },
      });
      return c.json(after, 200);
    })
    .openapi(r.remove, async (c) => {
      requireOrgAdmin(c);
      const { node } = c.req.valid('param');
      const before = await registry.remove(node);
      await fleet?.refresh();
      c.set('audit', { action: 'system.node.remove', resourceType: 'sandbox_node', resourceId: node, before });
      return c.json(before, 200);
    });
}
