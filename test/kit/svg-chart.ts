/**
 * A line chart as an SVG document, from time series as Prometheus's range queries give them: the
 * picture of a dashboard panel without Grafana (bench/monitoring.ts draws docs/img/*.svg with it).
 * Plain SVG 1.1, no script, no external font: GitHub shows it inline.
 */

export interface Series {
  label: string;
  /** [unix seconds, value] */
  points: Array<[number, number]>;
  /** Dashed (a limit beside its rate). */
  dashed?: boolean;
}

export interface ChartOptions {
  title: string;
  /** Formats a y value for the axis (e.g. bits/s as "10M"). */
  yFormat: (v: number) => string;
  width?: number;
  height?: number;
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'];
const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/** A "nice" step for about `n` ticks over [0, max]. */
function niceStep(max: number, n: number): number {
  const raw = max / n;
  const mag = 10 ** Math.floor(Math.log10(raw));
  return ([1, 2, 2.5, 5, 10].find((m) => m * mag >= raw) ?? 10) * mag;
}

export function lineChart(series: Series[], o: ChartOptions): string {
  const W = o.width ?? 900;
  const H = o.height ?? 360;
  const left = 64;
  const right = 220;
  const top = 36;
  const bottom = 40;
  const pts = series.flatMap((s) => s.points).filter(([, v]) => Number.isFinite(v));
  const t0 = Math.min(...pts.map(([t]) => t));
  const t1 = Math.max(...pts.map(([t]) => t));
  const step = niceStep(Math.max(...pts.map(([, v]) => v), 1) * 1.1, 5);
  const yMax = Math.ceil((Math.max(...pts.map(([, v]) => v), 1) * 1.1) / step) * step;
  const x = (t: number) => left + ((t - t0) / Math.max(t1 - t0, 1)) * (W - left - right);
  const y = (v: number) => top + (1 - v / yMax) * (H - top - bottom);
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="#ffffff"/>`,
    `<text x="${left}" y="22" font-size="15" font-weight="bold">${esc(o.title)}</text>`,
  ];
  for (let v = 0; v <= yMax + step / 2; v += step) {
    out.push(`<line x1="${left}" x2="${W - right}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${left - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" fill="#555">${esc(o.yFormat(v))}</text>`);
  }
  const span = t1 - t0;
  const tStep = niceStep(span, 6);
  for (let s = 0; s <= span + 0.001; s += tStep) {
    out.push(`<text x="${x(t0 + s).toFixed(1)}" y="${H - bottom + 18}" text-anchor="middle" fill="#555">${Math.round(s)} s</text>`);
  }
  out.push(`<line x1="${left}" x2="${W - right}" y1="${y(0)}" y2="${y(0)}" stroke="#888"/>`);
  series.forEach((s, i) => {
    const color = COLORS[Math.floor(i / 2) % COLORS.length] ?? '#000';
    const d = s.points
      .filter(([, v]) => Number.isFinite(v))
      .map(([t, v], k) => `${k === 0 ? 'M' : 'L'}${x(t).toFixed(1)},${y(v).toFixed(1)}`)
      .join(' ');
    out.push(`<path d="${d}" fill="none" stroke="${color}" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 4"' : ''}/>`);
    const ly = top + 8 + i * 18;
    out.push(
      `<line x1="${W - right + 12}" x2="${W - right + 36}" y1="${ly}" y2="${ly}" stroke="${color}" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 4"' : ''}/>`,
    );
    out.push(`<text x="${W - right + 42}" y="${ly + 4}">${esc(s.label)}</text>`);
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
