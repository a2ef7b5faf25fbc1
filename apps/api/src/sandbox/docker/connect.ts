import Docker from 'dockerode';

/** A dockerode client for DOCKER_HOST (unix:// or tcp://), or the local socket. */
export function connectDocker(dockerHost?: string): Docker {
  if (!dockerHost) return new Docker({ socketPath: '/var/run/docker.sock' });
  const url = new URL(dockerHost);
  if (url.protocol === 'unix:') return new Docker({ socketPath: url.pathname });
  return new Docker({
    host: url.hostname,
    port: Number(url.port || 2375),
    protocol: url.protocol === 'https:' ? 'https' : 'http',
  });
}
