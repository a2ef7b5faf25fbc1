import Docker from 'dockerode';

/** A dockerode client for DOCKER_HOST (unix:// or tcp://), or the local socket. */
export function connectDocker(dockerHost?: string): Docker {
  if (!dockerHost) return new Docker({ socketPath: '/var/run/docker.sock' });
  const url = new URL(dockerHost);
  if (url.protocol === 'unix:') return new Docker({ socketPath: url.pathname });
  return new Docker({ host: url.hostname, port: Number(url.port || 2375), protocol: url.protocol === 'https:' ? 'https' : 'http' });
}

/** Resolves when the engine answers within `timeoutMs`, rejects with the reason otherwise. */
export async function pingDocker(docker: Docker, timeoutMs = 2000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    await Promise.race([docker.ping(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}
