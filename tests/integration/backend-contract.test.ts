import { connectDocker } from '../../apps/api/src/sandbox/docker/connect.ts';
import { DockerBackend } from '../../apps/api/src/sandbox/docker/backend.ts';
import { ensureSandboxImage } from '../../sandbox-image/build.ts';
import { backendContract } from '../support/backend-contract.ts';

backendContract('Docker', async () => ({
  backend: new DockerBackend(connectDocker(process.env.DOCKER_HOST)),
  image: await ensureSandboxImage(),
}));
