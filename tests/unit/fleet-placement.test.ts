import { describe, expect, it } from 'vitest';
import { rankPlacement } from '../../apps/api/src/sandbox/node/fleet.ts';
import type { SandboxLimits } from '../../apps/api/src/sandbox/limits.ts';

const limits = { memoryMb: 512, cpus: 1 } as SandboxLimits;
const member = (name: string, images: string[] = [], memoryMb = 8192) => ({
  name,
  capacity: { memoryMb, cpus: 4 },
  images: new Set(images),
});
const names = (ms: { name: string }[]) => ms.map((m) => m.name);
const TEMPLATE = 'kiln-template:abc';

describe('placement among a fleet’s members', () => {
  it('spreads a team: the member with the fewest of its sandboxes first, then the most room', () => {
    const committed = new Map([
      ['n1', { memoryMb: 512, cpus: 1, team: 1 }],
      ['n2', { memoryMb: 4096, cpus: 2, team: 0 }],
    ]);
    expect(
      names(rankPlacement([member('n1'), member('n2'), member('n3')], committed, { image: 'base', limits })),
    ).toEqual(['n3', 'n2', 'n1']);
  });

  it('leaves out a member without the memory left for the sandbox', () => {
    const committed = new Map([['n1', { memoryMb: 8000, cpus: 1, team: 0 }]]);
    expect(names(rankPlacement([member('n1'), member('n2')], committed, { image: 'base', limits }))).toEqual(['n2']);
  });

  it('puts a member that said it lacks a template’s image after those that have it, whatever the spread says', () => {
    // n3 joined after the build: it has none of the team's sandboxes, yet it cannot start this image.
    const committed = new Map([
      ['n1', { memoryMb: 512, cpus: 1, team: 2 }],
      ['n2', { memoryMb: 512, cpus: 1, team: 1 }],
    ]);
    const fleet = [member('n1', [TEMPLATE]), member('n2', [TEMPLATE]), member('n3')];
    expect(names(rankPlacement(fleet, committed, { image: TEMPLATE, limits }))).toEqual(['n2', 'n1', 'n3']);
    // Once it has it, the spread decides again.
    fleet[2]!.images.add(TEMPLATE);
    expect(names(rankPlacement(fleet, committed, { image: TEMPLATE, limits }))).toEqual(['n3', 'n2', 'n1']);
  });

  it('an image no member lists (the base image, or a template no host has said it has) leaves the order to the spread', () => {
    const committed = new Map([['n1', { memoryMb: 512, cpus: 1, team: 1 }]]);
    const fleet = [member('n1', [TEMPLATE]), member('n2')];
    expect(names(rankPlacement(fleet, committed, { image: 'kiln-sandbox:latest', limits }))).toEqual(['n2', 'n1']);
    expect(names(rankPlacement(fleet, committed, { image: 'kiln-template:other', limits }))).toEqual(['n2', 'n1']);
  });
});
