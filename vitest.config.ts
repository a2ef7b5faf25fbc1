import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    pool: 'forks',
    // Two files at once on the 2-core machine (vitest's default there is one): 11 min instead of 18.
    // Every suite owns what it touches (its database, Docker labels, mount root, ports), so
    // files may run side by side; see docs/testing.md.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 180_000,
    reporters: ['default'],
  },
});
