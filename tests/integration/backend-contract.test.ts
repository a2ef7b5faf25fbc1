import { randomBytes } from 'node:crypto';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { issue, makeAuthority } from '../../apps/api/src/sandbox/node/pki.ts';
import { RemoteBackend } from '../../apps/api/src/sandbox/node/remote.ts';
import { startNode } from '../../apps/api/src/sandbox/node/server.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import { backendContract } from '../support/backend-contract.ts';

backendContract('Docker', async () => ({
  backend: new DockerBackend(connectDocker(process.env.DOCKER_HOST)),
  image: await ensureSandboxImage(),
}));

// The same Docker Engine behind a sandbox node: every call and every runner byte crosses the
// node protocol (HTTP/2, mutual TLS with the installation's CA) on loopback.
backendContract('a sandbox node (Docker behind the node protocol)', async () => {
  const ca = await makeAuthority('contract');
  const node = await startNode({
    // Named, as every node is: it lists (and reaps) only its own containers on the shared engine
    // (named for this file alone: other files' nodes are also called node-a).
    backend: new DockerBackend(connectDocker(process.env.DOCKER_HOST), {
      node: `node-a-${randomBytes(3).toString('hex')}`,
    }),
    credentials: await issue(ca, { role: 'node', name: 'node-a', hosts: ['127.0.0.1'] }),
    host: '127.0.0.1',
    port: 0,
  });
  const backend = new RemoteBackend({
    url: node.url,
    name: 'node-a',
    credentials: await issue(ca, { role: 'api', name: 'replica-1' }),
  });
  return {
    backend,
    image: await ensureSandboxImage(),
    close: async () => {
      backend.close();
      await node.close();
    },
  };
});
