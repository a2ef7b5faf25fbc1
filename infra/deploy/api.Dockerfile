# The Kiln API as a container (for compose.yaml / your own orchestrator).
# Build from the repository root: docker build -f infra/deploy/api.Dockerfile -t kiln-api .
# It needs a base image from a registry; the sandbox image is built on the Docker host
# with `npm run sandbox:build`, since the API only starts containers from it.

# The ops dashboard is built with vite (a dev dependency), in a stage of its own.
FROM node:20-bookworm-slim AS dashboard
WORKDIR /opt/kiln
COPY package.json package-lock.json ./
COPY apps/api/package.json apps/api/package.json
COPY apps/cli/package.json apps/cli/package.json
RUN npm ci --no-audit --no-fund
COPY apps/dashboard apps/dashboard
RUN npm run dashboard:build

FROM node:20-bookworm-slim
WORKDIR /opt/kiln
COPY package.json package-lock.json ./
COPY apps/api/package.json apps/api/package.json
RUN npm ci --omit=dev --no-audit --no-fund
COPY apps/api apps/api
# The self-update restarter: the API reads it at start-up (and imports its types).
COPY apps/relay apps/relay
COPY --from=dashboard /opt/kiln/apps/dashboard/dist apps/dashboard/dist
ENV KILN_HOST=0.0.0.0 KILN_DATA_DIR=/var/lib/kiln NODE_ENV=production
EXPOSE 7700
CMD ["node", "--import", "tsx", "apps/api/src/main.ts"]
