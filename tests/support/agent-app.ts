import { afterAll, afterEach, beforeAll, expect } from 'vitest';
import { createTestApp, type TestApp } from './app.ts';
import { startFakeOpenAI, type FakeOpenAI } from './fake-openai.ts';

type TestTeam = Awaited<ReturnType<TestApp['team']>>;

/** What `useAgentApp` gives a suite: each field can be read once the suite's `beforeAll` has run. */
export interface AgentApp {
  /** The scripted model endpoint the app talks to. */
  readonly fake: FakeOpenAI;
  /** The app, its default model `fake-model` on `fake`. */
  readonly t: TestApp;
  /** A team of the name given, with an owner key. */
  readonly team: TestTeam;
}

/** What `createTestApp` takes, but the model: that is always the fake's. */
export type AgentAppOptions = Omit<NonNullable<Parameters<typeof createTestApp>[0]>, 'model'>;

/**
 * Registers the hooks of a suite that talks to the scripted model: before all its tests, the fake
 * endpoint, an app on it and (when `teamName` is given) a team; after each test, that the fake
 * refused no request (a request a real endpoint would refuse fails the test that made it, not only
 * the file when the fake closes); after all, the app then the fake are closed. Hooks the suite
 * registers after this call run after this set-up and before this tear-down.
 */
export function useAgentApp(teamName?: string, opts: AgentAppOptions = {}): AgentApp {
  let fake: FakeOpenAI | undefined;
  let t: TestApp | undefined;
  let team: TestTeam | undefined;
  beforeAll(async () => {
    fake = await startFakeOpenAI();
    t = await createTestApp({ ...opts, model: { baseURL: fake.url, model: 'fake-model' } });
    if (teamName) team = await t.team(teamName);
  });
  afterEach(() => {
    if (fake) expect(fake.refusals.splice(0)).toEqual([]);
  });
  afterAll(async () => {
    await t?.close();
    await fake?.close();
  });
  const ready = <T>(name: string, value: T | undefined): T => {
    if (value !== undefined) return value;
    const hint = name === 'team' && !teamName ? ', and only when useAgentApp was given a team name' : '';
    throw new Error(`useAgentApp: ${name} can be read once the suite's beforeAll has run${hint}`);
  };
  return {
    get fake() {
      return ready('fake', fake);
    },
    get t() {
      return ready('t', t);
    },
    get team() {
      return ready('team', team);
    },
  };
}
