import { svg } from './dom.ts';

/** One day's figures of a workspace. */
export interface DayPoint {
  day: string;
  tokens: number;
  runs: number;
}

const W = 168;
const H = 36;

/**
 * A small chart of one workspace's days: a bar per day for its tokens (scaled to its busiest
 * day) and a dot per day for its runs; every day has a tooltip with its figures.
 */
export function dayChart(days: string[], points: Map<string, DayPoint>, label: string): SVGElement {
  const maxTokens = Math.max(1, ...[...points.values()].map((p) => p.tokens));
  const maxRuns = Math.max(1, ...[...points.values()].map((p) => p.runs));
  const step = W / days.length;
  const bars = days.map((day, i) => {
    const p = points.get(day) ?? { day, tokens: 0, runs: 0 };
    const bh = Math.round((p.tokens / maxTokens) * (H - 8));
    const x = i * step;
    return svg(
      'g',
      { class: 'day', 'data-day': day },
      svg('title', {}, `${day}: ${p.tokens} tokens, ${p.runs} run${p.runs === 1 ? '' : 's'}`),
      svg('rect', { class: 'hit', x, y: 0, width: step, height: H }),
      svg('rect', { class: 'tokens', x: x + 1, y: H - bh, width: Math.max(1, step - 2), height: bh }),
      p.runs
        ? svg('circle', {
            class: 'runs',
            cx: x + step / 2,
            cy: H - 4 - Math.round((p.runs / maxRuns) * (H - 10)),
            r: 2,
          })
        : null,
    );
  });
  return svg(
    'svg',
    { class: 'daychart', viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-label': label },
    ...bars,
  );
}
