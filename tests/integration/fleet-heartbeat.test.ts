import { randomBytes } from 'node:crypto';
import { createServer, type Socket } from 'node:net';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { FleetBackend } from '../../apps/api/src/sandbox/node/fleet.ts';
import { issue, makeAuthority } from '../../apps/api/src/sandbox/node/pki.ts';
import { NodeRegistry } from '../../apps/api/src/sandbox/node/registry.ts';
import { type RunningNode, startNode } from '../../apps/api/src/sandbox/node/server.ts';
import { createTestDatabase, type TestDatabase } from '../support/db.ts';

const tag = randomBytes(3).toString('hex');
const HEALTHY = `beat-ok-${tag}`;
const HUNG = `beat-hung-${tag}`;

/**
 * A fleet's heartbeat when one host hangs (accepts connections, never answers: a frozen machine):
 * each of its pings waits the full 5 s, and the other hosts must still be heard every beat. Before
 * each member was heard on its own, a beat waited for the slowest answer, so with `silentMs` below
 * the ping's wait every healthy host went silent between beats and nothing could be placed — what
 * made a template build on a fleet of two see one host (CI, 2026-12-06).
 */
describe('a fleet heartbeat with a hung host', () => {
  let database: TestDatabase;
  let node: RunningNode;
  let fleet: FleetBackend;
  const held: Socket[] = [];
  const hung = createServer((socket) => held.push(socket));
  /** The warnings the fleet logged about the hung host not answering. */
  const silences: unknown[] = [];

  beforeAll(async () => {
    database = await createTestDatabase();
    const ca = await makeAuthority('fleet-heartbeat-test');
    node = await startNode({
      backend: new DockerBackend(connectDocker(process.env.DOCKER_HOST), { node: HEALTHY }),
      credentials: await issue(ca, { role: 'node', name: HEALTHY, hosts: ['127.0.0.1'] }),
      host: '127.0.0.1',
      port: 0,
    });
    await new Promise<void>((resolve) => hung.listen(0, '127.0.0.1', resolve));
    const { port } = hung.address() as { port: number };
    const registry = new NodeRegistry(database.db);
    await registry.add(HEALTHY, node.url);
    await registry.add(HUNG, `https://127.0.0.1:${port}`);
    const log = pino(
      { level: 'warn' },
      {
        write: (line: string) => {
          const entry = JSON.parse(line) as { msg: string; node?: string };
          if (entry.msg === 'sandbox node did not answer' && entry.node === HUNG) silences.push(entry);
        },
      },
    );
    fleet = new FleetBackend({
      db: database.db,
      credentials: await issue(ca, { role: 'api', name: 'replica-beat' }),
      heartbeatMs: 250,
      // Below the hung host's 5 s, so the old heartbeat fails here (15 of ~100 asks refused); high
      // enough that a healthy host slow to answer on a loaded machine (a beat plus 4 s) is still heard.
      silentMs: 4500,
      log,
    });
  });
  afterAll(async () => {
    fleet?.close();
    for (const s of held) s.destroy();
    hung.close();
    await node?.close();
    await database?.drop();
  });

  it('the healthy host is heard every beat while the hung one’s pings wait out their 5 s', async () => {
    await fleet.open();
    // open() heard every member, the hung one too (it did not answer): one silence so far.
    expect(silences).toHaveLength(1);
    // Asked every 100 ms until the hung host has been pinged out twice more (over 10 s), the fleet
    // always has a host that answered within `silentMs`.
    let asked = 0;
    const refused: string[] = [];
    while (silences.length < 3) {
      asked++;
      await fleet.ping().catch((err: Error) => refused.push(err.message));
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(asked).toBeGreaterThan(50);
    expect(refused).toEqual([]);
  }, 60_000);
});
